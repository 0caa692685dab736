"""helper-107's attack on 3557950 (torch: a hook change waits for another thread's compile,
read from dynamo's compile lock owner and the top 4 frames of each other thread,
`_reading_elsewhere` / `_near_tops`) and 4d2ac88 (recipes: a forward's end read from
``gc.is_tracked(frame)``, `hook_caller(module, frame)` / `ops.call_frame`, `remove()` and
deep copies letting go of forwards under way, `Recipe.__getstate__`).

    GLOG_minloglevel=2 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_attack_h107.py

(Merged 2026-12-03. FINDINGS 2 and 3 fixed 2026-12-04 (`_watch_hook_loop`,
`compiled_frames_out`). FINDING 1: the original is no longer touched (a deep copy's recipe
gets no handle, and its builder is the copy's); the copy's own recipe with ``every`` > 1
records the copy's forwards ``every`` picks (2026-12-04, `tests/test_recipe_copies_every.py`).
FINDING 4 fixed: unihook's with_kwargs wrappers are partials, which a deep copy copies with
the hook. FINDING 5 fixed 2026-12-03
(`ops.forward_raised`).)

FINDINGS (each a failing test below when found):

1. A deep copy of a model carrying a recipe with ``every`` > 1 places the hooks of the
   copy's recorded forwards on the ORIGINAL model (the copied recipe's ``_build`` is the
   original's closure: ``copy.deepcopy`` keeps functions as they are): the original records a
   forward ``every`` should skip, the copy misses the one it should record. With
   ``torch.optim.swa_utils.AveragedModel(m)`` used each step (an EMA evaluated with
   gradients), the original's every=2 history has 5 entries for 5 steps (oracle 3).
2. `_near_tops` reads 4 top frames: a trace function (a debugger: bdb's ``trace_dispatch`` ->
   ``dispatch_line`` -> ``user_line``) one frame deeper than the test's own hides dynamo's
   ``nn_module_get_all_hooks`` loop, and a hook removed on another thread meanwhile fails the
   compiled call with ``KeyError``.

3. A global forward hook (``register_module_forward_hook``) removed on one thread while
   another thread calls a ``torch.compile(backend="eager")`` model in a loop: the compiled
   call on that thread fails with ``KeyError: 0`` (raised at the entry of dynamo's
   ``external_utils.inner``: a guard reads the global hook dict by the key the removal took
   out; a global pre-hook: ``IndexError: tuple index out of range``). 3 runs of 3, at the
   first removal (the model compiled before the churn); the parent of 3557950 the same
   (not a regression). Likely cause (backends/unihook_torch/__init__.py, the global hook's
   ``remover``): ``with compiles_held(): remove()`` then ``forget_compiled()``: in between,
   the compiled frames' guards, which another thread evaluates at each call outside dynamo's
   compile lock, still index the hook dict by the removed key (the comment there says "no
   guard sees a global hook come or go": on torch 2.13 one does). A module's own forward
   hook churned the same way held (15 + 4
   changes); its pre-hook raised ``StopIteration`` (dynamo's ``dict_keys_getitem``) in 1
   run of 3 (not pinned: flaky, maybe the long-compile case below).

4. A deep copy of a model carrying an ``every=1`` ActivationStats or GradientMonitor (taken
   between steps): the copy's recipe (the one its copied hooks call) records NOTHING over
   the copy's next 3 forward + backward steps (history 1 -> 1). The copied partials call the
   copy, but the root's keyword pre-hook is unihook's closure
   ``checked_kwargs_pre_hook.<locals>.kwargs_pre_hook`` (deepcopy keeps functions), which
   calls the ORIGINAL recipe's ``_open``: the copy never opens a forward (its `_close` drops
   each step as "started before this recipe") and the original's ``_opened`` goes 0 -> 1
   per copy forward. README (DDP section): "the copy's recipes merge too". Paddle the same
   (every=1: copy history 1 -> 1; every=2: the original records the copy's turn, FINDING 1);
   MindSpore ActivationStats the same (copy history 1 -> 1 after 3 forwards; probe).

5. ``ActivationStats(m, every=2)`` (GradientMonitor the same) on ``torch.compile(m,
   backend="eager")`` where a user's unihook forward hook on ``m[1]`` raises ValueError in
   the 2nd of 6 forwards (the caller catches it): compiled, the failed forward counts
   towards ``every`` (``_forwards`` 6; eager 5, "the forward raised: not a forward"), so
   the compiled run records x0, x2, x4 where eager records x0, x3, x5: different numbers.
   The parent of 4d2ac88 the same (not a regression).

NOT PINNED (looks documented): the same churn with a module's own hook on ``m[0]`` beside
an ``aot_eager`` loop failed 4 fresh runs (a hook registered mid first compile missed by the
next calls; its removal then ``StopIteration`` in dynamo's ``dict_keys_getitem``) and passed
4 later ones, with warm caches: a first compile past ``_WAIT`` (1 s) on this loaded machine,
which README says "gets the changes, as with torch's own hooks".

HELD (passing tests kept below, and probes not kept):
- ``remove()`` called from inside a user's forward hook mid-forward (ActivationStats,
  GradientMonitor x every 1, 2: 4 runs): no error, no hook left, a new recipe on the model
  then records what the same recipe on a fresh model does (kept: test_held_remove_...).
- 4 threads x 25 no_grad forwards on one model with ActivationStats (every=1): rows()
  (calls, mean, std, min, max per module) equal a single-threaded run (kept:
  test_held_threads_...); every=3 counted 100 of 100 forwards (no stuck entry).
- 3 threads x 60 forward+backward steps with GradientMonitor + ActivationStats (every=2),
  then ``remove()`` from the main thread while 3 more threads run: ``_forwards`` 180 / 180,
  no entry left in ``_inside``, 0 hooks left after remove.
- recipes' recorded frames (`hook_caller`) under torch.compile (eager, aot_eager), reentrant
  and non-reentrant checkpoint: running inside the call, ended after (12 + 4 frames), and
  checkpointed ActivationStats every=2 equal to the unchecked run (2 kinds).
- MindSpore ActivationStats every=2 records forwards 0, 2, 4 of every=1's numbers.
- 3 threads x 15 no_grad calls of one ``torch.compile(backend="eager")`` model with
  ActivationStats: rows equal a single-threaded eager run, no error.
- ``dynamo.convert_frame.compile_lock`` is C's RLock on torch 2.13: `_OWNER` parses it.
- GradientMonitor / ActivationStats with every=2 under ``torch.compile(backend="eager")``:
  the same history lengths and numbers as eager (5 forwards, 2 recipes).
- copy.deepcopy of a model with every=1 recipes, then stepping only the copy: the original's
  history unchanged and its hooks untouched (2 recipes; but see FINDING 4).
- GradientMonitor every=2 with a reentrant checkpoint left the checkpointed part out of the
  logged steps: README documents it (not a finding).
- the test_compile_registration_threads shape (trace function, its own 4 frames): register
  and remove both wait (2 runs); a registration from a deeper trace function also gave the
  compiled call the old hooks and the next call the new one (1 run).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from children import last_value, run_code

SLOW = pytest.mark.skipif(
    not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="~6 s each (compiles): UNIHOOK_SLOW_ATTACKS"
)

torch = pytest.importorskip("torch")


DEEPCOPY_EVERY = r"""
import copy, sys
import torch, torch.nn as nn
from unihook.recipes import ActivationStats, GradientMonitor

cls = {"stats": ActivationStats, "grad": GradientMonitor}[sys.argv[1]]
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
x = torch.randn(3, 4)
r = cls(m, every=2)
m(x).sum().backward()  # forward 0: recorded
m2 = copy.deepcopy(m)
import gc  # (the copy's recipe: nothing else refers to it but the copy's hooks)
r2 = next(o for o in gc.get_objects() if isinstance(o, cls) and o._model is m2)
assert r2 is not r
for _ in range(3):  # the copy's forwards 1, 2, 3: 2 recorded
    m2(x).sum().backward()
placed_on_original = len(m[0]._forward_hooks)
m(x).sum().backward()  # the original's forward 1: not recorded
print([len(r.history), len(r2.history), placed_on_original])
"""


@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_1_deepcopy_with_every_places_hooks_on_the_original(kind: str) -> None:
    """Repro: ``m`` with ``ActivationStats(m, every=2)`` (or GradientMonitor), one forward,
    ``m2 = copy.deepcopy(m)`` (AveragedModel, an EMA copy, "keep the best model"), three
    forwards on ``m2``, then one on ``m``. Expected: the original recorded forward 0 only
    (history 1), the copy has that one plus its own forward 2 (history 2), no hooks of the
    copy's on ``m``. Observed: ``[2, 1, 1+]``: when the copy's counter reaches a recorded
    forward, `_advance` calls ``_placed(self._build)``, whose ``_build`` is the ORIGINAL
    recipe's closure (``copy.deepcopy`` returns functions unchanged; `__getstate__` copies
    ``__dict__`` as is), so the hooks go on ``m`` and record into the original recipe: the
    original records a forward ``every`` skips (and at the wrong step), the copy silently
    records nothing. Silent wrong histories in both models."""
    got = last_value(run_code(DEEPCOPY_EVERY, kind, timeout=120))
    # (fixed 2026-12-03: the copy gets no builder and no handle; its own forwards `every`
    # would record go unrecorded, below)
    assert got[0] == 1 and got[2] == 0, got


@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_1_the_copys_recipe_with_every_records_its_forwards(kind: str) -> None:
    """The rest of FINDING 1 (fixed 2026-12-04: the copy's builder is the copy's, and the hooks
    copied with the model run for one forward only; generated runs in
    `tests/test_recipe_copies_every.py`): the copy records its forward 2."""
    assert last_value(run_code(DEEPCOPY_EVERY, kind, timeout=120))[1] == 2


TRACED_LOOP = r"""
import inspect, sys, threading
import torch, torch._dynamo, unihook
from torch._dynamo import utils

m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
kept = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
removed = unihook.register_forward_pre_hook(m[0], lambda mod, a: seen.append("removed"))
f = torch.compile(m, backend="eager")
seen, inside, changed = [], threading.Event(), threading.Event()
looping = inspect.unwrap(utils.nn_module_get_all_hooks).__code__  # (unihook marks its runs)


def user_line(frame):  # (a debugger stopping here: bdb's dispatch_line -> user_line)
    changed.wait(0.3)  # (the removal waits for this loop to end: the wait times out)


def dispatch_line(frame):
    return user_line(frame)


def pause(frame, event, arg):
    local = frame.f_locals
    if (
        event == "line"
        and local.get("mod") is m[0]
        and local.get("hook_dict_name") == "_forward_pre_hooks"
        and "hook_name" in local
        and not inside.is_set()
    ):
        inside.set()
        dispatch_line(frame)
    return pause


def trace(frame, event, arg):
    return pause if frame.f_code is looping else None


def other():
    inside.wait(30)
    removed.remove()
    changed.set()


thread = threading.Thread(target=other)
thread.start()
sys.settrace(trace)
errors = []
try:
    f(torch.ones(2, 3)).sum().backward()
except Exception as error:
    errors.append(f"{type(error).__name__}: {error}")
sys.settrace(None)
thread.join()
first = list(seen)
seen.clear()
f(torch.ones(2, 3)).sum().backward()
print([inside.is_set(), errors, first, list(seen)])
"""


def test_finding_2_a_debuggers_frames_hide_dynamos_hook_loop() -> None:
    """Repro: tests/test_compile_registration_threads.py's ``remove`` case with the trace
    function stopping two calls deeper (as bdb's ``trace_dispatch`` -> ``dispatch_line`` ->
    ``user_line`` does; pdb, IDE debuggers and coverage's Python tracer go deeper still).
    Expected (as with the test's shallow trace function): the removal waits for dynamo's loop
    over ``m[0]``'s forward pre-hooks, the compiled call runs and calls the old hook, the next
    call none: ``[True, [], ['removed'], []]``. Observed: ``errors == ['KeyError: 2']``:
    `_near_tops` reads only 4 frames of the other thread (Condition.wait, Event.wait,
    user_line, dispatch_line), never the loop's, so the removal does not wait and the
    compiled call fails. (A GC finalizer cannot land mid-iteration there: the loop allocates
    no tracked object inside it; a trace function is needed.) README says the loop is found
    "under a trace function's frames" (its `_NEAR` comment: "its call and a wait inside
    it"): a trace function that calls one helper already hides it. Fixed 2026-12-04: the
    loop's runs mark their thread while unihook has a torch hook (`_watch_hook_loop`)."""
    got = last_value(run_code(TRACED_LOOP, timeout=120))
    assert got == [True, [], ["removed"], []]


GLOBAL_CHURN = r"""
import sys, threading, time, torch, torch.nn as nn, unihook
torch.set_num_threads(1)
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
f = torch.compile(m, backend=sys.argv[2])
REGISTER = {
    "global": unihook.register_module_forward_hook,
    "gpre": unihook.register_module_forward_pre_hook,
    "gbwd": unihook.register_module_full_backward_hook,
    "gbwdpre": unihook.register_module_full_backward_pre_hook,
}[sys.argv[1]]
stay = []
if sys.argv[3] == "stay":  # a hook registered before, which stays: it must keep its own calls
    REGISTER(lambda *a: stay.append(1))
f(torch.randn(3, 4, requires_grad=True)).sum().backward()
started, done, stop, errs, per_call = [0], [0], threading.Event(), [], set()

def runner():
    try:
        while not stop.is_set():
            started[0] += 1
            s0 = len(stay)
            f(torch.randn(3, 4, requires_grad=True)).sum().backward()
            per_call.add(len(stay) - s0)
            done[0] += 1
    except Exception as e:
        errs.append(repr(e))

def calls(k):
    s, t0 = started[0], time.time()
    while done[0] < s + 1 + k:
        # (each removal drops the compiled frames: the next calls recompile, which took over
        # 30 s on a loaded machine, CI101: a liveness bound, not what is tested)
        if time.time() - t0 > 90 or errs:
            return False
        time.sleep(0.001)
    return True

t = threading.Thread(target=runner)
t.start()
bad = []
for i in range(4):
    cnt = []
    h = REGISTER(lambda *a, cnt=cnt: cnt.append(1))
    if not calls(2) or len(cnt) < 2:
        bad.append(("missed", i, len(cnt)))
        break
    h.remove()
    s = started[0]  # (a call in flight keeps the backward hooks its forward saw, as torch's)
    while done[0] < s and not errs:
        time.sleep(0.001)
    c = len(cnt)
    if not calls(2) or len(cnt) != c:
        bad.append(("after removal", i, len(cnt) - c))
        break
stop.set()
t.join(30)
print([bad, errs, t.is_alive(), sorted(per_call)])
"""


@pytest.mark.parametrize(
    ("kind", "compiler", "stay"),
    [
        ("global", "eager", "none"),
        ("global", "eager", "stay"),
        ("gpre", "eager", "stay"),
        pytest.param("gpre", "eager", "none", marks=SLOW),
        pytest.param("gbwd", "eager", "stay", marks=SLOW),
        pytest.param("gbwdpre", "eager", "stay", marks=SLOW),
        pytest.param("global", "aot_eager", "stay", marks=SLOW),
        pytest.param("gpre", "inductor", "stay", marks=SLOW),
    ],
)
def test_finding_3_global_hook_removed_beside_a_compiled_loop(
    kind: str, compiler: str, stay: str
) -> None:
    """Repro: thread A calls ``torch.compile(model, backend=...)`` in a loop (forward and
    backward); the main thread registers a global hook (forward, forward pre, full backward
    or backward pre) with unihook, waits for two whole calls of A, removes it, waits for the
    call in flight to end and two more, 4 times; with ``stay``, another global hook of the
    kind was registered before and stays. Expected: no error, the hook called after its
    registration and not after its removal, the staying hook 5 times in every call (the
    model compiled before; as single-threaded). Observed before the fix (helper-107
    FINDING 3): A's next compiled call raised ``KeyError: 0`` (forward hook) or
    ``IndexError: tuple index out of range`` (pre-hook), 3 runs of 3. A compiled frame
    that traced the hook in replays its side effects after the graph, reaching the hook by
    its key / index: a removal while A was inside one took it away (and a hook moved into
    its place would have taken its side effects). Fixed: a global hook's removal waits until
    no other thread is in a compiled frame (`compiled_frames_out`, at most 1 s)."""
    got = last_value(run_code(GLOBAL_CHURN, kind, compiler, stay, timeout=600))
    assert got == [[], [], False, [5 if stay == "stay" else 0]]


DEEPCOPY_EVERY_1 = r"""
import copy, sys
import torch, torch.nn as nn
from unihook.recipes import ActivationStats, GradientMonitor

cls = {"stats": ActivationStats, "grad": GradientMonitor}[sys.argv[1]]
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
r = cls(m)
m(torch.randn(3, 4)).sum().backward()
m2 = copy.deepcopy(m)
owners = {
    getattr(getattr(v, "func", v), "__self__", None)
    for s in m2.modules()
    for v in s._forward_hooks.values()
}
copies = [o for o in owners if isinstance(o, cls) and o is not r]
for _ in range(3):
    m2(torch.randn(3, 4)).sum().backward()
print([len(copies), [len(c.history) for c in copies], len(r.history)])
"""


@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_4_a_deep_copys_recipe_records_nothing(kind: str) -> None:
    """Repro: ``r = ActivationStats(m)`` (or GradientMonitor; every=1), one step, ``m2 =
    copy.deepcopy(m)`` (AveragedModel, an EMA or "best model" copy), three forward +
    backward steps of ``m2``. Expected: one copied recipe (the owner of ``m2``'s copied
    hooks) with the inherited entry plus 3 (history 4), the original's untouched (1).
    Observed: ``[1, [1], 1]``: the copy records nothing. Silent: no error, an empty history
    on the copy (and the original's pre-hook runs for the copy's forwards)."""
    got = last_value(run_code(DEEPCOPY_EVERY_1, kind, timeout=120))
    assert got == [1, [4], 1]


RAISED_UNDER_COMPILE = r"""
import sys, torch, torch.nn as nn, unihook
from unihook.recipes import ActivationStats, GradientMonitor


def run(cls, compiled):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    r = cls(m, every=2)
    n = [0]

    def boom(mod, a, o):
        n[0] += 1
        if n[0] == 2:
            raise ValueError("x")

    unihook.register_forward_hook(m[1], boom)
    f = torch.compile(m, backend="eager") if compiled else m
    torch.manual_seed(1)
    for x in [torch.randn(3, 4) for _ in range(6)]:
        try:
            f(x).sum().backward()
        except ValueError:
            pass
    pick = (lambda e: e["mean"]) if cls is ActivationStats else float
    values = [round(float(pick(e["2"])), 5) for e in r.history]
    return [r._forwards, values]


cls = {"stats": ActivationStats, "grad": GradientMonitor}[sys.argv[1]]
print([run(cls, False), run(cls, True)])
"""


@pytest.mark.skipif(
    not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="~20 s (a compile): UNIHOOK_SLOW_ATTACKS"
)
@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_5_a_forward_that_raised_counts_towards_every_under_compile(kind: str) -> None:
    """Repro: ``ActivationStats(m, every=2)``, a unihook forward hook on ``m[1]`` raising
    ValueError in the 2nd forward (caught by the caller), 6 forwards + backwards, eager vs
    ``torch.compile(m, backend="eager")``. Expected (README: under torch.compile every kind
    gives eager's numbers): the same ``_forwards`` and recorded means. Observed: eager 5
    forwards counted (the raised one is not a forward: `_count`), compiled 6, so the
    compiled run records other steps (x0, x2, x4 instead of x0, x3, x5): silently
    different history. GradientMonitor: the same. (Passes since 2026-12-03: the torch backend
    tells a raised forward by the frame calling the ``always_call`` hook, `_call_impl`'s own;
    eagerly checked by the next test.)"""
    eager, compiled = last_value(run_code(RAISED_UNDER_COMPILE, kind, timeout=150))
    assert eager[0] == 5 and len(eager[1]) == 3, eager  # (x0, x3, x5: the raised one is not)
    assert compiled == eager


def test_finding_5_torch_tells_a_raised_forward_by_the_frame_calling_its_hooks() -> None:
    """What the fix of FINDING 5 reads of torch (eagerly, in a second): ``Module._call_impl``
    calls an ``always_call`` forward hook from its own frame only after the forward raised,
    from its ``inner`` otherwise, also for a forward returning None inside an ``except``."""
    import sys

    import unihook

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.how = "plain"

        def forward(self, x: Any) -> Any:
            if self.how == "raise":
                raise ValueError("x")
            return None if self.how == "none" else x * 2

    net = Net()
    seen: list[bool] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        seen.append(unihook.ops.forward_raised(module, sys._getframe(1)))

    handle = net.register_forward_hook(hook, always_call=True)
    try:
        for net.how in ("plain", "none", "raise"):
            try:
                try:
                    raise KeyError("handled by the caller")
                except KeyError:
                    net(torch.ones(2))
            except ValueError:
                pass
    finally:
        handle.remove()
    assert seen == [False, False, True]


PADDLE_DEEPCOPY = r"""
import copy, sys
import paddle, paddle.nn as nn
from unihook.recipes import ActivationStats, GradientMonitor

cls = {"stats": ActivationStats, "grad": GradientMonitor}[sys.argv[1]]
paddle.seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
r = cls(m)
m(paddle.randn([3, 4])).sum().backward()
m2 = copy.deepcopy(m)
owners = set()
for s in m2.sublayers(include_self=True):
    for v in s._forward_post_hooks.values():
        owners.add(getattr(getattr(v, "func", v), "__self__", None))
copies = [o for o in owners if isinstance(o, cls) and o is not r]
for _ in range(3):
    m2(paddle.randn([3, 4])).sum().backward()
print([len(copies), [len(c.history) for c in copies], len(r.history)])
"""


@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_4_paddle_a_deep_copys_recipe_records_nothing(kind: str) -> None:
    """FINDING 4 on paddle: ``copy.deepcopy`` of a ``paddle.nn.Sequential`` carrying an
    every=1 recipe, 3 steps of the copy. Expected ``[1, [4], 1]``; observed: the copy's
    recipe history stays 1."""
    pytest.importorskip("paddle")
    got = last_value(run_code(PADDLE_DEEPCOPY, kind, timeout=120))
    assert got == [1, [4], 1]


REMOVE_IN_HOOK = r"""
import sys, torch, torch.nn as nn, unihook
from unihook.recipes import ActivationStats, GradientMonitor


def nh(m):
    return sum(
        len(s._forward_hooks) + len(s._forward_pre_hooks) + len(s._backward_hooks)
        for s in m.modules()
    )


def mk():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


torch.manual_seed(1)
xs = [torch.randn(3, 4) for _ in range(6)]
out = []
for cls in (ActivationStats, GradientMonitor):
    for every in (1, 2):
        m = mk()
        r = cls(m, every=every)
        n = [0]

        def h(mod, a, o):
            n[0] += 1
            if n[0] == 2:
                r.remove()

        hh = unihook.register_forward_hook(m[1], h)
        for x in xs[:3]:
            m(x).sum().backward()
        hh.remove()
        left = nh(m)
        r2 = cls(m, every=every)
        for x in xs[3:]:
            m(x).sum().backward()
        o = mk()
        ro = cls(o, every=every)
        for x in xs[3:]:
            o(x).sum().backward()
        out.append([left, str(r2.history) == str(ro.history)])
print(out)
"""


def test_held_remove_from_inside_a_hook_mid_forward() -> None:
    """HELD: ``remove()`` from a user's forward hook in the 2nd forward: no hook left, and a
    new recipe on the model records as one on a fresh model (2 recipes x every 1, 2)."""
    got = last_value(run_code(REMOVE_IN_HOOK, timeout=150))
    assert got == [[0, True]] * 4


THREADS_STATS = r"""
import threading, torch, torch.nn as nn
from unihook.recipes import ActivationStats

torch.set_num_threads(1)


def mk():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def rows(r):
    return {
        d["name"]: (d["calls"], round(d["mean"], 6), round(d["std"], 6), d["min"], d["max"])
        for d in r.rows()
    }


torch.manual_seed(1)
xs = [[torch.randn(3, 4) for _ in range(25)] for _ in range(4)]
o = mk()
ro = ActivationStats(o, max_history=None)
for ch in xs:
    for x in ch:
        o(x)
m = mk()
r = ActivationStats(m, max_history=None)


def work(ch):
    for x in ch:
        with torch.no_grad():
            m(x)


ts = [threading.Thread(target=work, args=(ch,)) for ch in xs]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(rows(r) == rows(ro))
"""


def test_held_threads_activation_stats_rows_match_one_thread() -> None:
    """HELD: 4 threads x 25 forwards on one model: ActivationStats' rows equal a single
    thread's over the same inputs."""
    assert last_value(run_code(THREADS_STATS, timeout=150)) is True


AVERAGED = r"""
import sys, torch, torch.nn as nn
from torch.optim.swa_utils import AveragedModel
from unihook.recipes import ActivationStats, GradientMonitor

cls = {"stats": ActivationStats, "grad": GradientMonitor}[sys.argv[1]]


def mk():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


torch.manual_seed(1)
xs = [torch.randn(3, 4) for _ in range(5)]
o = mk()
ro = cls(o, every=2)
for x in xs:
    o(x).sum().backward()
m = mk()
r = cls(m, every=2)
avg = None
for x in xs:
    m(x).sum().backward()
    if avg is None:
        avg = AveragedModel(m)
    avg.update_parameters(m)
    avg(x * 2).sum().backward()
print([len(r.history), len(ro.history), str(r.history) == str(ro.history)])
"""


@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_finding_1_averaged_model_changes_the_originals_history(kind: str) -> None:
    """FINDING 1 through torch's own ``AveragedModel`` (a deep copy): ``cls(m, every=2)``,
    5 training steps, each followed by ``avg.update_parameters(m)`` and a forward + backward
    of ``avg``. Expected: ``m``'s history as without the averaged model (3 entries, the same
    numbers). Observed: 5 entries: the copy's recipe places its recorded forward's hooks on
    ``m``, so ``m`` records forwards ``every`` skips."""
    got = last_value(run_code(AVERAGED, kind, timeout=150))
    assert got == [3, 3, True]
