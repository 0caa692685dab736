# ruff: noqa: E501  (the child program)
"""helper-100's attack on f946fe9..2fd1ffb: GradientMonitor's look for kept outputs (`_ids_within`
with ``top``, the `_kinds` type cache, `_CALL_BUDGET`, deques and sets, `_left_out` dropping
recorded norms, `ops.attribute_values`), `every=N` counting in `Recipe` (`_enter`, `_count`,
`_owed`, `_running_elsewhere`) and torch.compile's tracker record (`_compiled`).

    cd /tmp/h100 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h100:/tmp/h100/backends \
        /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_attack_h100.py

(about 20 s; UNIHOOK_SLOW_ATTACKS set adds `every` under torch.compile and runs the
generators and the compile sequences longer: ~2 min)

Oracle: `tests/monitor_oracle.py` (torch's native full backward pre-hooks on a deep copy): an
entry equals the native norm or the module is absent and a RuntimeWarning names it. For
`every=N`: f946fe9 run on the same program (recorded forwards 0, N, 2N...). "REGRESSION"
means a worktree of f946fe9 gives the right behaviour and 2fd1ffb does not.

HELD (pinned below unless said):

- Generated kept-and-dropped outputs (`_budget_case`: 0-12 config lists of 1-60 floats on a
  keeper, ``self.out = [y]`` at a random place among them, read and dropped by the parent)
  whose lists hold at most 256 ids in all: native or left out and warned (the 90 of 100
  seeds below the budget; pinned 3). See FINDING 2 for the rest.
- Where each framework puts a tensor, by hand: MindSpore keeps a tensor, list and tuple
  attribute in ``__dict__`` (its ``_params`` holds Parameters only, ParameterTuple in
  ``__dict__``); paddle files a tensor attribute in ``_buffers`` (kept); torch's
  ``register_buffer`` goes to ``_buffers`` (kept), ``nn.ParameterDict`` wraps a plain
  tensor into a new Parameter (no output left there). No table left out by
  `attribute_values` holds a kept output in these (not pinned beyond torch's buffer).
- `every=2` with ``torch.compile(model, backend="eager")``: 6 steps, 3 recorded, nothing
  left running (pinned behind UNIHOOK_SLOW_ATTACKS: dynamo's first compile, ~40 s here); a forward raising a ValueError, then forwards from a deeper stack,
  torch and paddle: recorded 0, 2, 4, 6 as f946fe9 (pinned on paddle).
- torch.compile sequences (random: calls, dynamic shapes, hooks registered/removed on the
  model or its children, register/remove pairs on an unrelated module, 10-pair loops,
  ``torch._dynamo.reset()``, ``torch.compiler.reset()``; dynamic None/True/False): 11 seeds
  x 25 steps, every compiled call equals eager's, no 10-pair loop dropped more than once
  (`forget_compiled` counted); pinned 1 seed (4 with UNIHOOK_SLOW_ATTACKS).
- `every` 2 and 3 against ``every=1`` (`_every_case`: 1-3 Linear+Tanh blocks and a head,
  the first block under a non-reentrant checkpoint in half, 12 steps each a forward and
  backward, a ``no_grad`` forward or a forward raising ValueError inside, random inputs
  some requiring grad): history equals ``every=1``'s entries 0, N, 2N... exactly, 0 of 40
  seeds x 2 (pinned 4, 40 with UNIHOOK_SLOW_ATTACKS). A reentrant checkpoint leaves the
  part out of the logged steps (README), nested self-calls split entries (helper-94's
  FINDING 7): not compared.
- helper-98's Ctrl-C sweeps at HEAD (a KeyboardInterrupt at each of the registration's 96
  call points over a model compiled blind; the last removal's 37, retried or not): all
  pass (``UNIHOOK_SLOW_ATTACKS=1 pytest tests/test_attack_h98.py -k sweep``, 48 s; not
  pinned here).
- Liveness: a forward paused on a ``threading.Thread`` while the main thread runs a whole
  step (helper-97's FINDING 6 harness), ``every=2``: history untouched by a lone submodule
  call, `_running` 0 (pinned; a ``_thread`` thread: FINDING 7).

FINDINGS (a strict xfail below for 5; 6's test passes; each asserting the right behaviour),
by severity:
medium 1, 2;
low-medium 3, 4, 5; low 6, 7.

1. FIXED (`_enter` keeps the place and code of the frame calling it; `_running_now` drops
   an entry whose frame is no longer there). (medium: `every=N` stuck, whole history
   wrong; REGRESSION; torch and paddle,
   GradientMonitor and ActivationStats) a KeyboardInterrupt (any BaseException: SystemExit)
   inside a forward of the model runs no ``always_call`` hook, so `_enter`'s entry for it
   stays in `_inside`. `_enter` drops only entries at the new forward's depth or deeper; a
   later forward from a deeper stack (the interrupted ``model(x)`` typed at a notebook's top
   level, then ``train(model)`` calling it from inside functions) keeps the stale entry, so
   every `_count` finds a forward "running" on this live thread and only adds to `_owed`:
   the hooks are never placed or removed again. Interrupted in an off forward: nothing is
   recorded any more (GradientMonitor ``every=2``, forward 0 recorded, forward 1
   interrupted, 6 forwards from 5 frames deeper: history 1, f946fe9 4; `_owed` 6); in a
   recorded one: every forward is recorded (``every=3``, 9 forwards: history 9, f946fe9 3;
   ActivationStats the same). Paddle the same (history 1 vs 4). It lasts until a forward
   starts at the interrupted depth or above; then `_owed` advances all at once. Expected:
   a stale entry cannot hold the count (e.g. `_enter` drops entries whose frame is no longer
   on the stack: keep the frame (or a weakref to it / its id with the code) and check it
   with ``sys._getframe`` ancestry; or count a forward whose `_enter` has no matching exit
   before the next `_enter` at any depth when no frame of the model's forward is on the
   stack).
2. FIXED (the per-call look's budget back to `_BUDGET`: helper-97's FINDING 4 open again).
   (medium: silently wrong norm; REGRESSION, though README now says the per-call look
   "stops after about 256 objects": the objects counted are any, tensors or not) the
   per-call look `_keeps` stops at
   `_CALL_BUDGET` (256) ids, counting the ids of every first-level container before the
   one that keeps the output (the cut added for helper-97's FINDING 4), so a module with a
   few config lists (256 numbers in all) ahead of ``self.out = [y]`` no longer sees its
   kept-and-dropped output: ten lists of 30 floats, then ``self.out = [y]``, the parent
   reading ``self.a.out[0]`` then setting it to None: 'a' 36.36 where native is 6.78, no
   warning (f946fe9: left out, warned). Generated (`_budget_case`, 31 ``__dict__`` entries
   at most so f946fe9's 32 bound does not apply): 10 of 100 seeds broken, f946fe9 0 of
   100. paddle the same (ten lists of 30 floats: 'a' 74.00 recorded, no warning; f946fe9
   and no lists: left out, warned; pinned); MindSpore the same (helper-97's `_MS_SCRIPT`
   with ten lists: 'a' 77.50 where native is 7.11, no warning; without the lists: left
   out, warned; pinned; f946fe9 there missed every container: helper-97's FINDING 1). Expected: the cut independent of containers holding no tensor (the budget counted
   on tensors, or containers without tensors remembered by id and length, or looked at
   after those holding a tensor), or README saying a module's first 256 ids only.
3. FIXED (`_kinds` keyed by the type's id, with a weak reference to it). (low-medium: the
   user's forward raises; REGRESSION) `_kinds` is a dict keyed by the type
   of each attribute value, so the type's metaclass ``__hash__``/``__eq__`` run: a
   metaclass defining ``__eq__`` without ``__hash__`` makes its classes unhashable, and an
   attribute of such a class raises ``TypeError: unhashable type: 'Meta'`` from the
   monitor's hook at every forward; a metaclass whose ``__eq__`` takes its classes for
   equal hands a list subclass's kind to another class, and ``list.__len__`` raises
   ``TypeError: descriptor '__len__' requires a 'list' object``. f946fe9 (``issubclass``)
   records both. Expected: recorded (key by ``id(cls)`` with the class kept, or fall back
   to ``issubclass`` when the lookup raises / check ``kind`` against ``cls.__mro__``).
4. FIXED (as 3). (low-medium: leak; REGRESSION) `_kinds` keeps a strong reference to up to
   4096 types of
   attribute values for the life of the process, with everything they reference: a class
   made per instance (``class Memo(dict)`` defined in ``__init__`` whose ``__missing__``
   reads ``self``; a ``collections.namedtuple`` or ``type(...)`` made per model; the types
   of container items are cached too) keeps its module (weights included) alive after
   ``monitor.remove()`` and ``del model`` (f946fe9: freed). Expected: a
   ``weakref.WeakKeyDictionary`` (or a cache on the class itself), nothing kept after
   remove.
5. (low-medium: `every=N` gives no saving, N times the history and sink writes; the count
   is a REGRESSION, though f946fe9's 4 entries were partly hooked: helper-97's FINDING 6)
   `_count` defers every count while any forward of the model runs on any thread, so
   forwards on two threads that always overlap (a serving pool under load: each thread
   starts its next forward before the other's ends) are never counted until both stop,
   and the hooks placed for forward 0 stay for all of them: ActivationStats ``every=3``,
   two threads alternating 12 overlapping ``no_grad`` forwards (events, deterministic):
   12 entries (f946fe9: 4), all 12 counted at once when the last ends. Expected: 0, N, 2N... of
   the forwards recorded (e.g. the forward's number taken at `_enter` deciding whether it
   is recorded, only the hook removal deferred while a recorded forward runs).
6. FIXED (sets are looked in after every other container). (low: silently wrong norm;
   REGRESSION within README's documented "about 4096 objects a module", now spent on sets
   too) sets and deques are looked in now (helper-97's FINDING 3), so their
   items count toward `_held`'s `_BUDGET` too: a keeper with 17 sets of 250 ints (stop
   words, vocabularies, seen ids) ahead of ``self.out = [y]`` kept to the end and read by
   the loss: 'a' 12.87 where native is 1.73, no warning (f946fe9: left out, warned; with
   lists instead of sets both record 12.87, the documented bound). Expected: as
   FINDING 2 (the bound spent on containers that may hold a tensor), or README's bound
   naming sets and deques.
7. FIXED (`_running_now` reads every thread's stack, `sys._current_frames()`). (low:
   helper-97's FINDING 6 back for threads `threading` does not know; not a
   regression, f946fe9 did this on every thread) `_running_elsewhere` takes a thread for
   dead unless ``threading.enumerate()`` lists it, and drops its running forward: a thread
   started by ``_thread.start_new_thread`` or by C code (a native thread pool calling back
   into Python, a Qt QThread) that never called ``threading.current_thread()`` is never
   listed. h97's gated model (the thread's forward paused inside while the main thread
   runs a forward and backward), ``every=2``, the thread from ``_thread``: the step
   records a lone 'g.fc' entry, `_running` stays 1, ``model.a(x)`` alone then changes
   history[-1] (a ``threading.Thread``: held). Expected: liveness from
   ``sys._current_frames()`` (every thread state), or the thread's own entry kept until
   its `_count`.

Not covered for lack of time: distributed `sync` with `_left_out`, MindSpore `every`,
threads with stale entries after an ident is reused (a thread dying by SystemExit
mid-forward, its ident taken by a new thread: FINDING 1 on that thread), the `_owed`
counter's ``+=`` from two threads at once.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
import warnings
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import MINDSPORE_DENSES, native_norms  # noqa: E402

from unihook.recipes import ActivationStats, GradientMonitor  # noqa: E402

SLOW = bool(os.environ.get("UNIHOOK_SLOW_ATTACKS"))


# ---------------------------------------------------------------- FINDING 1: Ctrl-C mid-forward


class _Interruptible(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.boom: Any = None

    def forward(self, x: Any) -> Any:
        h = self.a(x)
        if self.boom is not None:
            exc, self.boom = self.boom, None
            raise exc
        return self.b(torch.tanh(h))


def _deeper(fn: Any, n: int) -> Any:
    return _deeper(fn, n - 1) if n else fn()


def _interrupted(recipe: Any, every: int, first_recorded: bool, exc: Any) -> tuple[int, int]:
    torch.manual_seed(0)
    model, x = _Interruptible(), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = recipe(model, every=every)
        if not first_recorded:
            (model(x) ** 2).sum().backward()  # forward 0, recorded
        model.boom = exc
        try:
            model(x)  # interrupted at this depth
        except BaseException:  # noqa: BLE001
            pass
        for _ in range(9 if first_recorded else 6):
            _deeper(lambda: (model(x) ** 2).sum().backward(), 5)
        n = len(rec.history)
        rec.remove()
    return n, (3 if first_recorded else 4)


def test_held_forward_raising_an_exception_then_deeper_forwards() -> None:
    got, want = _interrupted(GradientMonitor, 2, False, ValueError("x"))
    assert got == want


def test_finding1_interrupted_off_forward_records_nothing_more() -> None:
    got, want = _interrupted(GradientMonitor, 2, False, KeyboardInterrupt())
    assert got == want  # 1 (f946fe9: 4)


@pytest.mark.parametrize("recipe", [GradientMonitor, ActivationStats])
def test_finding1_interrupted_recorded_forward_records_every_forward(recipe: Any) -> None:
    got, want = _interrupted(recipe, 3, True, KeyboardInterrupt())
    assert got == want  # 9 (f946fe9: 3)


def test_finding1_system_exit() -> None:
    got, want = _interrupted(GradientMonitor, 2, False, SystemExit())
    assert got == want


def _paddle_interrupted(exc: Any) -> int:
    paddle = pytest.importorskip("paddle")

    class M(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = paddle.nn.Linear(4, 4)
            self.b = paddle.nn.Linear(4, 4)
            self.boom: Any = None

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            if self.boom is not None:
                e, self.boom = self.boom, None
                raise e
            return self.b(paddle.tanh(h))

    paddle.seed(0)
    model, x = M(), paddle.randn([3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = GradientMonitor(model, every=2)
        (model(x) ** 2).sum().backward()
        model.boom = exc
        try:
            model(x)
        except BaseException:  # noqa: BLE001
            pass
        for _ in range(6):
            _deeper(lambda: (model(x) ** 2).sum().backward(), 5)
        n = len(mon.history)
        mon.remove()
    return n


def test_held_paddle_forward_raising_an_exception() -> None:
    assert _paddle_interrupted(ValueError("x")) == 4


def test_finding1_paddle_keyboard_interrupt() -> None:
    assert _paddle_interrupted(KeyboardInterrupt()) == 4  # 1


EVERY_UNDER_COMPILE = """
import warnings
warnings.simplefilter("ignore")
import torch
from unihook.recipes import GradientMonitor
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
x = torch.randn(3, 4)
mon = GradientMonitor(model, every=2)
compiled = torch.compile(model, backend="eager")
for _ in range(6):
    (compiled(x) ** 2).sum().backward()
print(repr((len(mon.history), mon._forwards, dict(mon._inside), sum(map(len, mon._inside.values())))))
"""


@pytest.mark.skipif(not SLOW, reason="~40 s (dynamo's first compile): set UNIHOOK_SLOW_ATTACKS")
def test_held_every_2_under_torch_compile() -> None:
    from children import last_value, run_code

    assert last_value(run_code(EVERY_UNDER_COMPILE, timeout=300)) == (3, 6, {}, 0)


class _Gate(nn.Module):
    """A Linear whose call waits, on a thread given a slot, until the slot's release."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.waits: dict[int, Any] = {}

    def forward(self, x: Any) -> Any:
        y = self.fc(x)
        slot = self.waits.get(threading.get_ident())
        if slot is not None:
            slot[0].set()
            slot[1].wait(5)
        return y


def test_finding5_always_overlapping_forwards_on_two_threads() -> None:
    # (fixed 2026-12-07: each forward takes a recorded one due as it begins, `_tickets`)
    torch.manual_seed(0)
    model, x = nn.Sequential(_Gate(), nn.Tanh(), nn.Linear(4, 4)), torch.randn(2, 4)
    n = 12
    slots = [(threading.Event(), threading.Event()) for _ in range(n)]

    def worker(k: int) -> None:
        for i in range(k, n, 2):
            model[0].waits[threading.get_ident()] = slots[i]
            with torch.no_grad():
                model(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = ActivationStats(model, every=3)
        threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
        threads[0].start()
        slots[0][0].wait(5)
        threads[1].start()
        slots[1][0].wait(5)
        for i in range(n):
            slots[i][1].set()  # forward i ends while the other thread's i + 1 runs
            if i + 2 < n:
                slots[i + 2][0].wait(5)  # and its thread has begun i + 2
        for thread in threads:
            thread.join(10)
        recorded = len(stats.history)
        stats.remove()
    assert recorded == 4  # 12 (f946fe9: 4; 05b8b95: 12)


class _Paused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Linear(4, 4)
        self.a = nn.Linear(4, 4)
        self.release: Any = None
        self.reached: Any = None

    def forward(self, x: Any) -> Any:
        h = self.g(x)
        if self.release is not None and threading.get_ident() != threading.main_thread().ident:
            self.reached.set()
            self.release.wait(5)
        return self.a(torch.tanh(h))


def _paused_thread(start: Any) -> tuple[bool, int]:
    torch.manual_seed(0)
    model, x = _Paused(), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = GradientMonitor(model, every=2)
        model.release, model.reached, done = threading.Event(), threading.Event(), threading.Event()

        def work() -> None:
            try:
                (model(x) ** 2).sum().backward()
            finally:
                done.set()

        start(work)
        model.reached.wait(5)
        (model(x) ** 2).sum().backward()  # the main thread's forward ends meanwhile
        model.release.set()
        done.wait(5)
        model.release = None
        for _ in range(2):
            (model(x) ** 2).sum().backward()
        before = [dict(entry) for entry in mon.history]
        (model.a(x) ** 2).sum().backward()  # a submodule on its own
        mon.remove()
    return before == [dict(entry) for entry in mon.history], mon._running


def test_held_paused_forward_on_a_threading_thread() -> None:
    assert _paused_thread(lambda fn: threading.Thread(target=fn).start()) == (True, 0)


def test_finding7_paused_forward_on_a_raw_thread() -> None:
    import _thread

    # (False, 1): history[-1] changed by the lone call, `_running` stays 1
    assert _paused_thread(lambda fn: _thread.start_new_thread(fn, ())) == (True, 0)


class _EveryNet(nn.Module):
    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(rng.randint(1, 3))]
        )
        self.head = nn.Linear(4, 4)
        self.mode = "plain"
        self.ck = rng.random() < 0.5

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        for i, block in enumerate(self.blocks):
            if self.ck and i == 0 and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.mode == "raise":
            raise ValueError("boom")
        return self.head(x)


def _every_case(seed: int, every: int) -> list[dict[str, float]]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = _EveryNet(rng)
    xs = [torch.randn(2, 4, requires_grad=rng.random() < 0.3) for _ in range(12)]
    steps = [rng.choice(["plain", "plain", "nograd", "raise"]) for _ in range(12)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = GradientMonitor(model, every=every)
        for step, x in zip(steps, xs):
            model.mode = "raise" if step == "raise" else "plain"
            if step == "nograd":
                with torch.no_grad():
                    model(x)
            elif step == "raise":
                with pytest.raises(ValueError):
                    model(x)
            else:
                (model(x) ** 2).sum().backward()
        mon.remove()
    return [dict(entry) for entry in mon.history]


@pytest.mark.parametrize("seed", range(40) if SLOW else [0, 13, 21, 27])
def test_held_every_against_every_1(seed: int) -> None:
    reference = _every_case(seed, 1)
    for every in (2, 3):
        got, want = _every_case(seed, every), reference[::every]
        assert [set(e) for e in got] == [set(e) for e in want]
        assert all(g[k] == pytest.approx(w[k], rel=1e-5) for g, w in zip(got, want) for k in w)


# ---------------------------------------------------------------- FINDING 2: the call budget


def _budget_case(seed: int) -> tuple[bool, int]:
    """A keeper with config lists and ``self.out = [y]`` among them, the parent reading and
    dropping it: (native or left out and warned, the lists' items in all)."""
    rng = random.Random(seed)
    lists = [rng.randint(1, 60) for _ in range(rng.randint(0, 12))]
    pos = rng.randint(0, len(lists))
    return _keeper_with_lists(lists, pos, seed)


def _keeper_with_lists(lists: list[int], pos: int, seed: int) -> tuple[bool, int]:
    class K(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            for i, n in enumerate(lists):
                if i == pos:
                    self.out = None
                setattr(self, f"cfg{i}", [float(j) for j in range(n)])
            if pos == len(lists):
                self.out = None

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = [y]
            return y

    class P(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = K()
            self.b = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            out = self.b(torch.tanh(h)) + 3 * self.a.out[0]
            self.a.out = None
            return out

    torch.manual_seed(seed)
    model, x = P(), torch.randn(3, 4)

    def loss(_: Any, o: Any) -> Any:
        return (o**2).sum()

    native = native_norms(model, ["a"], x, loss)["a"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = GradientMonitor(model)
        loss(model, model(x)).backward()
    entry = dict(mon.history[-1])
    mon.remove()
    warned = any("GradientMonitor" in str(w.message) and "'a'" in str(w.message) for w in caught)
    if "a" not in entry:
        return warned, sum(lists)
    return abs(entry["a"] - native) <= 1e-5 * native, sum(lists)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_budget_generated_below_the_budget(seed: int) -> None:
    ok, items = _budget_case(seed)
    assert items < 240 and ok


def test_finding2_ten_config_lists_before_the_kept_output() -> None:
    ok, _ = _keeper_with_lists([30] * 10, 10, 0)
    assert ok  # 'a' 36.36 where native is 6.78, no warning (f946fe9: left out, warned)


def test_finding2_paddle_ten_config_lists() -> None:
    paddle = pytest.importorskip("paddle")

    class K(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)
            for i in range(10):
                setattr(self, f"cfg{i}", [float(j) for j in range(30)])
            self.out = None

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = [y]
            return y

    class P(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = K()
            self.b = paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            out = self.b(paddle.tanh(h)) + 3 * self.a.out[0]
            self.a.out = None
            return out

    paddle.seed(0)
    model, x = P(), paddle.randn([3, 4])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = GradientMonitor(model)
        (model(x) ** 2).sum().backward()
    entry = dict(mon.history[-1])
    mon.remove()
    # 'a' 74.00, no warning (without the lists, and f946fe9: left out, warned)
    assert "a" not in entry and any("'a'" in str(w.message) for w in caught)


_MS_TEN_LISTS = (
    MINDSPORE_DENSES
    + r"""


class Keeps(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = dense(0)
        for i in range(10):
            setattr(self, f"cfg{i}", [float(j) for j in range(30)])

    def construct(self, v):
        y = self.fc(v) * 1.0
        self.out = [y]
        return y


class Clean(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = Keeps()
        self.b = dense(1)

    def construct(self, v):
        h = self.a(v)
        out = self.b(ms.ops.tanh(h)) + 3 * self.a.out[0]
        self.a.out = None
        return out


net = Clean()


def loss(v):
    out = net(v)
    return (out * out).sum()


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with GradientMonitor(net) as monitor:
        ms.grad(loss)(x)
said = [str(c.message) for c in caught if "GradientMonitor" in str(c.message)]
json.dump({"step": dict(monitor.history[-1]) if monitor.history else {}, "said": said,
           "w": [a.tolist() for a in w], "b": [a.tolist() for a in b],
           "x": x.asnumpy().tolist(), "entries": len(net.a.__dict__)}, sys.stdout)
"""
)


def test_finding2_mindspore_ten_config_lists() -> None:
    from monitor_oracle import run_in_mindspore

    run = run_in_mindspore(_MS_TEN_LISTS)
    # 'a' 77.50 recorded (native 7.11), no warning; without the lists: left out, warned
    assert "a" not in run["step"] and any("'a'" in said for said in run["said"])


def test_finding2_generated() -> None:
    seeds = range(100) if SLOW else [5, 6, 17, 24, 50]
    broken = [seed for seed in seeds if not _budget_case(seed)[0]]
    assert not broken, broken  # HEAD: 10 of 100 (5 6 17 23 24 33 50 53 68 86); f946fe9 0


def test_finding6_sets_ahead_of_an_output_kept_to_the_end() -> None:
    class K(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            for i in range(17):
                setattr(self, f"s{i}", set(range(i * 1000, i * 1000 + 250)))
            self.out = None

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = [y]
            return y

    class P(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = K()
            self.b = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.b(torch.tanh(self.a(x)))

    def loss(model: Any, o: Any) -> Any:
        return (o**2).sum() + 3 * (model.a.out[0] ** 2).sum()

    torch.manual_seed(0)
    model, x = P(), torch.randn(3, 4)
    native = native_norms(model, ["a"], x, loss)["a"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = GradientMonitor(model)
        loss(model, model(x)).backward()
    entry = dict(mon.history[-1])
    mon.remove()
    warned = any("'a'" in str(w.message) for w in caught)
    # 'a' 12.87 where native is 1.73, no warning (f946fe9: left out, warned)
    assert ("a" not in entry and warned) or entry["a"] == pytest.approx(native, rel=1e-5)


# ---------------------------------------------------------------- FINDINGS 3, 4: `_kinds`


def _with_attributes(*values: Any) -> dict[str, float]:
    class K(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            for i, v in enumerate(values):
                setattr(self, f"v{i}", v)

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    model = nn.Sequential(K(), nn.Linear(4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = GradientMonitor(model)
        try:
            (model(torch.randn(2, 4)) ** 2).sum().backward()
            return dict(mon.history[-1])
        finally:
            mon.remove()


def test_finding3_attribute_of_an_unhashable_class() -> None:
    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            return cls is other

    class Config(metaclass=Meta):
        pass

    assert "0" in _with_attributes(Config())  # TypeError: unhashable type: 'Meta'


def test_finding3_classes_equal_by_their_metaclass() -> None:
    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            return isinstance(other, Meta)

        def __hash__(cls) -> int:
            return 1

    class Sizes(list, metaclass=Meta):  # type: ignore[misc]
        pass

    class Config(metaclass=Meta):
        pass

    # TypeError: descriptor '__len__' requires a 'list' object but received a 'Config'
    assert "0" in _with_attributes(Sizes([1, 2]), Config())


def test_finding4_a_class_made_per_instance_keeps_its_module() -> None:
    class K(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

            class Memo(dict):
                def __missing__(memo, key: int) -> int:  # noqa: N805
                    return self.fc.weight.shape[key]

            self.memo = Memo()

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    def run() -> Any:
        model = nn.Sequential(K(), nn.Linear(4, 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mon = GradientMonitor(model)
            (model(torch.randn(2, 4)) ** 2).sum().backward()
            mon.remove()
        return weakref.ref(model[0])

    ref = run()
    gc.collect()
    assert ref() is None  # alive (f946fe9: freed)


# ---------------------------------------------------------------- torch.compile (held)

SEQUENCES = """
import random, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile
drops = [0]
forget = _compile.forget_compiled
def counted():
    drops[0] += 1
    forget()
_compile.forget_compiled = counted
bad = []
for seed in map(int, sys.argv[1:]):
    rng = random.Random(seed); torch.manual_seed(seed); torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
    other = torch.nn.Linear(2, 2)
    cm = torch.compile(model, backend="eager", dynamic=rng.choice([None, True, False]))
    handles = []
    for step in range(25):
        op = rng.choice(["call", "call", "reg", "rem", "pair", "pairs", "reset", "creset", "shape"])
        if op == "reg":
            k = rng.choice([2.0, 3.0, -1.0])
            target = rng.choice([model, model[0], model[2]])
            handles.append(unihook.register_forward_hook(target, lambda m, a, o, k=k: o * k))
        elif op == "rem" and handles:
            handles.pop(rng.randrange(len(handles))).remove()
        elif op == "pair":
            unihook.register_forward_hook(other, lambda *a: None).remove()
        elif op == "pairs":
            before = drops[0]
            for _ in range(10):
                unihook.register_forward_hook(other, lambda *a: None).remove()
            if drops[0] - before > 1:
                bad.append(("pairs dropped", seed, step, drops[0] - before))
        elif op == "reset":
            torch._dynamo.reset()
        elif op == "creset":
            torch.compiler.reset()
        if op in ("call", "shape", "reg", "rem", "reset", "creset"):
            x = torch.randn(rng.choice([1, 2, 5]) if op == "shape" else 2, 3)
            with torch.no_grad():
                got, want = cm(x), model(x)
            if not torch.allclose(got, want, atol=1e-6):
                bad.append(("mismatch", seed, step, op))
    for h in handles:
        h.remove()
print(repr(bad))
"""


def test_held_compile_sequences() -> None:
    from children import last_value, run_code

    seeds = ["1", "2", "3", "4"] if SLOW else ["3"]
    assert last_value(run_code(SEQUENCES, *seeds, timeout=300)) == []


if __name__ == "__main__":  # the generator's count: python tests/test_attack_h100.py 100
    n = int(sys.argv[1])
    print(sum(not _budget_case(seed)[0] for seed in range(n)), "of", n)
