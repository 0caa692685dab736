"""helper-97's attack on f946fe9: GradientMonitor after 592a761 and 8cc1f5f (no readers rule,
`_ids_within` by type, the per-call look `_keeps` at the first level only, the warning for a
module running with gradients in a forward begun without them).

Oracle: `tests/monitor_oracle.py` (torch's native ``register_full_backward_pre_hook`` on a
deep copy; the norm over a module's calls; paddle against a torch twin with the same
weights, as helper-94 and helper-95 did). The promise: a module's entry equals that norm
(rel 1e-5), or the module is absent from the step AND a RuntimeWarning containing
"GradientMonitor" names it; never a silently wrong number, no crash, no leak; ordinary
models lose nothing. "REGRESSION" means 0c76291 (a worktree of it) gave the native norm or
left the module out with the warning, and f946fe9 does not.

HELD (pinned below unless said):

- Generated keepers (`_Net`: 2-4 blocks, each a keeper child storing its output as an
  attribute, in a list, tuple, dict, OrderedDict, namedtuple, or a non-persistent buffer;
  some blocks with a Tanh after it; the model reading random kept outputs with random weights
  and dropping half of them (``= None``) before its forward ends, the loss reading those left):
  with keepers of at most 32 ``__dict__`` entries and no ``where=``: 0 of 150 seeds broken
  (0c76291: 75 of 150 with every feature on; 8 seeds pinned). With ``where=`` in 30%: 1 of
  150 (FINDING 2). With more ``__dict__`` entries: FINDING 1. With the output kept one level
  deeper (``{"a": [y]}``) and dropped: 15 of 150 broken, README's documented limit (the
  per-call look is at the first level; not pinned).
- paddle, the same generator on a twin (attribute, list, tuple, dict, OrderedDict keepers;
  no ``where=``), against torch's native norms: 0 of 60 seeds broken (3 pinned).
- The limits at their edges: a kept output last in a list of 256 items (per call) and in the
  last of 32 lists of a dict attribute held to the end (the end walk): left out, warned; a
  keeper of exactly 32 ``__dict__`` entries dropping ``self.out = [y]``: left out, warned;
  a keeper of 58 ``__dict__`` entries storing a plain attribute (its id is at the first
  level): left out, warned.
- Leaks: 30 generated models (keepers, ``every`` 1 or 2, random ``where=``, a forward whose
  output is kept without a backward, a forward raising from a user's hook) are freed with
  their monitors after ``remove()``, also while the user still holds an output (4 pinned).
- The earlier attacks' generators at f946fe9 (by hand): helper-95's `_generated` with
  captures on the module or the model, and with captures on another module (its FINDINGS 1
  and 2): 0 of 300 seeds each; helper-94's `_mixed`: 0 of 200; its `_chain` with drops
  (its FINDING 1): 0 of 100. No regression of the last attacks' held cases.
- A removed monitor kept for its history keeps the model alive (`_model`, and now
  `_holders`, every module): as ActivationStats and 0c76291 (not pinned, not a finding).
- ``every`` 2 or 3 over six steps with a ``no_grad`` forward before each, generated keepers,
  random ``where=`` in 40%: each entry native or warned, 59 of 60 seeds (seed 36: FINDING 2;
  by hand).
- The whole model under ``torch.utils.checkpoint``, reentrant and not, a ``no_grad``
  forward of it between each forward and its backward, ``every`` 1 and 2, six steps of
  different inputs: the entries of the recorded steps, each native (by hand; a PART under a
  reentrant checkpoint: FINDING 8).
- Ordinary models lose nothing but the documented (p=0 dropouts, never-called containers):
  a 2-layer TransformerEncoder, LSTM + GRU + Linear, Conv/BN/ReLU/pool/Linear (pinned); a
  TransformerDecoder over an Embedding (by hand).
- Three threads x 40 steps on generated models, ``every`` 1 or 2: no error from the
  monitor (the models' own shared ``self.out`` races between threads); but see FINDING 6.
- A forward begun under ``no_grad`` training two heads under ``enable_grad`` (one a
  Sequential), three steps: no entry, each of the four modules named once (by hand).
- Re-entrant models and exceptions: nothing new beyond FINDING 1 (which reopens helper-94's
  FINDING 3, nested forward, for keepers over 32 entries: pinned) and FINDING 6.

FINDINGS (strict xfails below for those open), by severity: medium-high 1; medium 2, 6;
medium-low 5, 7; low-medium 4, 8; low 3.

1. FIXED (`_ids_within`'s ``top``: the 32 bound below the attributes only; the attributes
   from `ops.attribute_values`, without the framework's own tables). (medium-high: silently
   wrong norm; REGRESSION; torch, paddle and MindSpore) the per-call look
   `_keeps` calls ``_ids_within(values, 1, held)``, and `_ids_within` returns before looking
   into any container when ``deeper < _DEEPER and len(values) > _NESTED``: the top level (the
   module's ``__dict__`` values) is taken for a nested container, so a module with more than
   32 ``__dict__`` entries has no item of its dict, list or tuple attributes looked at per
   call (0c76291 looked at them whatever the count). A torch module has 17 entries before
   any of the user's (nn.LSTM 30, nn.MultiheadAttention 28), so the kept attribute and 15
   others (config ints: ``self.num_heads``, ``self.head_dim``...) are enough; a paddle Layer
   has 21 and files a tensor attribute among its buffers (a dict), so on paddle a layer with
   12 attributes keeping ``self.out = y`` is not seen per call; a MindSpore Cell has 60
   entries before any of the user's, so on MindSpore no container attribute is ever looked
   into per call. Everything only the per-call look catches (helper-94's FINDINGS 1 to 4:
   an output kept and dropped before the forward ends, a nested forward, another thread's
   forward) records the sum again. ``K.forward: y = fc(x) * 1.0;
   self.out = [y]; return y`` with 16 ``cfg{i}`` ints; parent ``h = self.a(x); out =
   self.b(tanh(h)) + 3 * self.a.out[0]; self.a.out = None``: 'a' 56.59 where native is 8.16,
   no warning (0c76291: left out, warned); ``register_buffer("out", y, persistent=False)``
   the same; paddle ``self.out = y`` with 12 attributes: 'a' 36.36 where native is 6.78,
   no warning (11 attributes: left out, warned); MindSpore ``self.out = [y]`` with no
   attribute of the user's: 'a' 77.50 where native is 7.11, no warning (0c76291: left out,
   warned; pinned through `run_in_mindspore`). The nested forward (``self.outs[depth] =
   y``, the model calling itself after the keeper): history[0] holds 'k' 16.36 where native
   is 5.01 (the warning names 'k' for another reason; 14 attributes: left out of both
   entries). Generated (`_Net`, keepers with 0-30 extra attributes, no ``where=``): 18 of
   150 seeds broken, 3 pinned. Expected: the first level looked at whatever the number of
   attributes (the 32 bound is for the second level: e.g. ``_ids_within(values, 1, held)``
   with the bound tested only below the top, or a separate ``_NESTED`` check for
   ``deeper < _DEEPER`` calls made from inside the walk).
2. (a) FIXED 2026-12-07 (the modules inside a monitored one that ``where=`` leaves out are
   looked in as its call ends); (b) OPEN.
   (medium: silently wrong norm; not a regression) the per-call look only runs for a
   monitored call and only in the returning module's own attributes: an output kept on
   another module and dropped before the forward ends is summed. (a) ``where=`` leaving the
   keeper out: a block returning its child's output (``return self.k(x)``), the child
   keeping it (``self.out = y``), the model reading ``self.blk.k.out`` then setting it to
   None, ``where=["blk", "head"]``: 'blk' 29.31 where native is 4.01, no warning (every
   module monitored: left out, warned). (b) a module keeping its output on its child
   (``self.fc.last = y``, also read and dropped by the parent): 'k' 36.36 where native is
   6.78, no warning (held to the end: left out, warned, where 0c76291 recorded 26.64 vs
   1.29). Generated: seed 101 of `_Net` with ``where=``. README lists a user's hook doing
   this (helper-95's FINDING 5) and an unmonitored inner reader (its FINDING 8), not these.
   Expected: left out (note the kept output in the step from every module's call, monitored
   or not, e.g. a light forward hook on the unmonitored modules, or look in the children of
   the returning module), or README saying so.
3. FIXED for deques, sets and frozensets (looked in as lists); a UserList stays (README).
   (low: silently wrong norm; not a regression; README names "a dict, list or tuple
   attribute") an output kept in a ``collections.deque`` attribute (a memory bank, a
   sliding window: ``self.mem = deque([y], maxlen=4)``), a set or frozenset, read by the
   loss: 'k' 11.34 where native is 1.12 (set 9.22 vs 1.10), no warning; a
   ``collections.UserList`` the same. Expected: deques and sets looked into as lists (the
   walk by type takes them as cheaply), or README's "Left" list naming them.
4. OPEN again (a budget of 256 ids a call fixed it, and hid an output kept behind a few
   lists of numbers: helper-100's FINDING 2; back to `_BUDGET`). (low-medium: slowdown; not a
   regression, helper-95's FINDING 11 fixed for the second
   level only) the per-call look still walks every first-level container of up to 256
   items: a cell holding 15 lists of 256 ints (no tensor), unrolled 200 times with
   ``where=["cell"]``: 77.6 ms a step where the same cell without lists takes 17.0 ms (no
   monitor 5.6 ms; 0c76291 65.8 ms); with 16 lists the step takes 32.4 ms, since the look
   gives up (FINDING 1). Pinned by the ids walked (~780,000 a forward; 4,670 without the
   lists). Expected: a call's cost independent of containers holding no output (e.g.
   remember containers seen without a tensor by id and length, or look only at containers
   holding tensors).
5. (medium-low: silently wrong norm; not a regression; README names a view or a copy kept,
   not this) a user's forward hook computing a loss term from the module's output (an
   activation penalty, a feature-distillation term: ``aux.append(o.pow(2).mean())``, the loss
   adding ``5 * sum(aux)``): forward hooks get the raw output, before torch wraps it for
   the module's backward hook, so torch's grad_output leaves that term out and the output's
   tensor hook sums it in. ``Sequential(Linear, Tanh, Linear, Tanh, Linear)``, the hook on
   '0' and '2', registered after the monitor: '0' 2.31 where native is 1.22, '2' 1.95 vs
   1.39, no warning; before the monitor the same; paddle the same (pinned). Expected:
   native (a tensor hook on an alias the monitor returns from a forward hook run after the
   user's, as torch's BackwardHookFunction does), or left out where a forward hook of the
   user's runs on the module, or README saying so.
6. FIXED (`Recipe._count` counts a forward that ended while another of the model runs when
   the last ends; `_enter` keeps them per thread by stack depth, a dead thread's dropped).
   (medium: silently wrong norms, and later calls added to a past entry; not a regression)
   with ``every`` > 1 the counter `_count` removes the hooks at the end of each forward of
   the model, also while another forward of it is still running (one nested in it, or on
   another thread): the running forward's later calls are not hooked, its `_kept`, `_after`
   and `_forget` do not run, so `_running` stays above 0 for good (a thread that ended
   leaves its `_running_on` entry), and a submodule called on its own afterwards (GradCAM,
   a probe) is recorded into the last step. helper-94's FINDING 7 model (``h =
   self.k(x); if depth: h = self(tanh(h), depth - 1); return self.a(h)``), ``every=2``:
   '' and 'a' 0.868 where ``every=1`` records 2.080 (the native norm over the step's
   entries), no warning; then ``model.a(x)`` and its backward change history[-1]['a'] to
   4.86. A thread's forward
   paused inside while the main thread runs a whole forward and backward, ``every=2``:
   `_running` stays 1 after the thread ended, and ``model.a(x)`` on its own changes
   history[-1]['a'] from 2.74 to 5.51. Expected: the hooks removed only once no forward
   of the model runs (or the running forwards' calls kept hooked), `_running` back to 0.
   paddle the same (pinned: '' 4.08 where ``every=1`` gives 4.91, `_running` stays 1).
7. FIXED (`_left_out` drops what the step recorded of the module). (medium-low: wrong norm
   beside a warning; not a regression, 0c76291 recorded the sum
   silently) a module left out by the end walk (`_kept`) after gradients already reached its
   output during the forward (a backward inside it: forces as ``-autograd.grad(energy, pos,
   create_graph=True)``, PINN residuals) keeps the norm those gradients made: `_left_out`
   adds the name to `_Step.left`, which only stops later gradients. A capture hook registered
   after the monitor (``k.register_forward_hook(lambda m, i, o: setattr(m, "feat", o))``),
   the energy reading ``self.k.feat``: 'k' 3.86 where native is 1.48, beside the warning
   that it is not recorded (hook registered before the monitor: left out per call, fine).
   Any keep the per-call look misses (FINDING 1, 2; helper-95's FINDINGS 1, 5) does it.
   Expected: absent (drop the module's norm and squares from the step as it is left out).
8. FIXED (`_new_step`: a forward without gradients leaves `_placed_ahead` alone).
   (low-medium: a past entry changed, with another step's gradients; not a regression)
   ``every`` > 1 and a reentrant ``torch.utils.checkpoint`` in the model: README says the
   checkpointed part is left out of the logged steps (`_placed_ahead` keeps an off-step's
   recomputation out). A ``no_grad`` forward of the same model between an off-step's forward
   and its backward (pseudo-labels, FixMatch / mean-teacher style: ``out = model(x); with
   no_grad: model(x_weak); loss(out).backward()``) runs `_new_step`, which sets
   `_placed_ahead` to False, so the off-step's recomputation is recorded into the last
   logged step: history[0] gains 'blk' 2.23, 'blk.0', 'blk.1' with step 1's gradients, no
   warning (without the no_grad forward: left out, as documented); paddle's ``recompute``
   the same (pinned). Expected: `_placed_ahead` left alone by a forward that does not start
   a step.

Not covered for lack of time: MindSpore beyond FINDING 1, distributed merges,
torch.compile, threads beyond FINDING 6 and reading the code (h94's FINDING 4 pattern goes
through the per-call look: FINDING 1 applies).
"""

from __future__ import annotations

import collections
import gc
import os
import random
import threading
import warnings
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import (  # noqa: E402
    MINDSPORE_DENSES,
    broken,
    names,
    native_norms,
    native_run,
    run_in_mindspore,
    said,
    square,
)

from unihook.recipes import GradientMonitor  # noqa: E402

_names, _said, _square = names, said, square  # (local variables are named `said`)

# ------------------------------------------------------------------ the generator

_NT = collections.namedtuple("_NT", "h c")
_MODES = ("none", "attr", "list", "tuple", "dict", "odict", "buffer", "namedtuple")


class _Keeper(nn.Module):
    """A Linear's output times one, kept by `mode` (with `extra` plain int attributes)."""

    def __init__(self, mode: str, extra: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mode = mode
        for i in range(extra):
            setattr(self, f"cfg{i}", i)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        mode = self.mode
        if mode == "attr":
            self.out = y
        elif mode == "list":
            self.out = [y]
        elif mode == "tuple":
            self.out = (y, 1)
        elif mode == "dict":
            self.out = {"y": y}
        elif mode == "odict":
            self.out = collections.OrderedDict(y=y)
        elif mode == "nested":
            self.out = {"a": [y]}
        elif mode == "namedtuple":
            self.out = _NT(y, None)
        elif mode == "buffer":
            self.register_buffer("out", y, persistent=False)
        return y

    def take(self) -> Any:
        out, mode = self.out, self.mode
        if mode in ("attr", "buffer"):
            return out
        if mode in ("list", "tuple"):
            return out[0]
        if mode in ("dict", "odict"):
            return out["y"]
        if mode == "nested":
            return out["a"][0]
        return out.h

    def drop(self) -> None:
        if self.mode == "buffer":
            self._buffers["out"] = None
        else:
            self.out = None


class _Block(nn.Module):
    def __init__(self, rng: random.Random, modes: tuple[str, ...], extra: bool) -> None:
        super().__init__()
        mode = rng.choice(modes)
        count = rng.choice([0, 0, rng.randint(0, 30)]) if extra else 0
        self.k = _Keeper(mode, count)
        self.act = nn.Tanh() if rng.random() < 0.4 else None

    def forward(self, x: Any) -> Any:
        y = self.k(x)
        return self.act(y) if self.act is not None else y


class _Net(nn.Module):
    """Blocks of keepers; the forward reads some kept outputs and drops half of those."""

    def __init__(self, rng: random.Random, modes: tuple[str, ...], extra: bool) -> None:
        super().__init__()
        n = rng.randint(2, 4)
        self.blocks = nn.ModuleList(_Block(rng, modes, extra) for _ in range(n))
        self.read = [rng.random() < 0.6 for _ in range(n)]
        self.dropped = [rng.random() < 0.5 for _ in range(n)]
        self.w = [rng.random() * 3 for _ in range(n)]

    def forward(self, x: Any) -> Any:
        h, extra = x, 0
        for block, read, dropped, w in zip(self.blocks, self.read, self.dropped, self.w):
            h = block(h)
            if block.k.mode != "none" and read:
                extra = extra + w * block.k.take().sum()
                if dropped:
                    block.k.drop()
        return h + 0.1 * extra


def _net_loss(model: Any, out: Any) -> Any:
    total = (out * out).sum()
    for block in model.blocks:
        if block.k.mode != "none" and getattr(block.k, "out", None) is not None:
            total = total + (block.k.take() ** 2).sum()
    return total


def _generated(seed: int, *, extra: bool = False, where: bool = False) -> list[str]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    net = _Net(rng, _MODES, extra)
    names = _names(net)
    kwargs: dict[str, Any] = {}
    if rng.random() < 0.3 and where:
        names = kwargs["where"] = rng.sample(names, rng.randint(1, len(names)))
    return broken(net, names, torch.randn(3, 4), _net_loss, **kwargs)


# ------------------------------------------------------------------ held


@pytest.mark.parametrize("seed", [0, 5, 17, 42, 77, 99, 123, 149])
def test_held_generated_keepers(seed: int) -> None:
    # 0 of 150 seeds broken by hand (0c76291: 75 of 150 with every feature on)
    assert _generated(seed) == []


@pytest.mark.parametrize("seed", [3, 29, 60])
def test_held_generated_keepers_with_where(seed: int) -> None:
    # 1 of 150 broken by hand (seed 101: FINDING 2)
    assert _generated(seed, where=True) == []


class _Reader(nn.Module):
    """`k`'s output, kept by `k` (as `keep` does), read by the loss through `take`."""

    def __init__(self, k: nn.Module) -> None:
        super().__init__()
        self.k = k
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.b(torch.tanh(self.k(x)))


class _Store(nn.Module):
    def __init__(self, keep: Any, extra: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.keep = keep
        for i in range(extra):
            setattr(self, f"cfg{i}", i)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.keep(self, y)
        return y


def _at_the_end_of_256(module: Any, y: Any) -> None:
    module.table = [*range(255), y]


def _in_the_last_of_32(module: Any, y: Any) -> None:
    module.groups = {f"g{i}": [i] for i in range(31)}
    module.groups["last"] = [0, y]


@pytest.mark.parametrize(
    "keep, get",
    [
        (_at_the_end_of_256, lambda k: k.table[-1]),
        (_in_the_last_of_32, lambda k: k.groups["last"][1]),
    ],
)
def test_held_limits_at_their_edges(keep: Any, get: Any) -> None:
    torch.manual_seed(0)
    model = _Reader(_Store(keep))

    def loss(model: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (get(model.k) ** 2).sum()

    assert broken(model, _names(model), torch.randn(3, 4), loss) == []


class _Keeps(nn.Module):
    """Keeps its output (`how`: an attribute, a list, a non-persistent buffer) beside `extra`
    int attributes; `take` reads it and drops it."""

    def __init__(self, how: str, extra: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.how = how
        for i in range(extra):
            setattr(self, f"cfg{i}", i)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        if self.how == "attr":
            self.out = y
        elif self.how == "list":
            self.out = [y]
        else:
            self.register_buffer("out", y, persistent=False)
        return y

    def take(self) -> Any:
        out = self.out
        if self.how == "buffer":
            self._buffers["out"] = None
        else:
            self.out = None
        return out[0] if isinstance(out, list) else out


class _Clean(nn.Module):
    """helper-94's FINDING 1: the keeper's output read by the forward, then dropped."""

    def __init__(self, how: str, extra: int) -> None:
        super().__init__()
        self.a = _Keeps(how, extra)
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.a(x)
        return self.b(torch.tanh(h)) + 3 * self.a.take()


@pytest.mark.parametrize("how, extra", [("list", 13), ("buffer", 14), ("attr", 40), ("list", 0)])
def test_held_kept_and_dropped_per_call(how: str, extra: int) -> None:
    torch.manual_seed(0)
    model = _Clean(how, extra)
    if extra in (13, 14):
        probe = _Clean(how, extra)
        probe(torch.randn(3, 4))
        assert len(probe.a.__dict__) == 32  # the edge, as the look runs (`out` set)
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


def _leak_run(seed: int) -> tuple[Any, Any]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    net = _Net(rng, _MODES, True)
    where = None if rng.random() < 0.5 else _names(net)[::2]
    monitor = GradientMonitor(net, every=rng.choice([1, 2]), where=where)
    x = torch.randn(3, 4)
    kept = []
    for i in range(3):
        out = net(x)
        if i == 1:
            kept.append(out)  # a forward without its backward, its output alive
        else:
            (out * out).sum().backward()
    net.blocks[0].k.fc.register_forward_hook(lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        net(x)
    monitor.remove()
    refs = weakref.ref(monitor), weakref.ref(net)
    del monitor, net
    if seed % 2:
        del out, kept
    gc.collect()
    return refs


@pytest.mark.parametrize("seed", [0, 1, 6, 7])
def test_held_no_leak_after_remove(seed: int) -> None:
    # 0 of 30 seeds by hand
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor, net = _leak_run(seed)
    assert monitor() is None and net() is None


# ------------------------------------------------------------------ FINDING 1


@pytest.mark.parametrize("how", ["list", "buffer"])
def test_finding1_keeper_with_many_attributes(how: str) -> None:
    torch.manual_seed(0)
    model = _Clean(how, 16)
    # list: 'a' 56.59 where native is 8.16, no warning (0c76291: left out, warned)
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


@pytest.mark.parametrize("seed", [1, 11, 13])
def test_finding1_generated(seed: int) -> None:
    # 18 of 150 seeds broken by hand (keepers with 0-30 extra attributes, no where=)
    assert _generated(seed, extra=True) == []


class _Deep(nn.Module):
    def __init__(self, extra: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.outs: dict[int, Any] = {}
        for i in range(extra):
            setattr(self, f"cfg{i}", i)

    def forward(self, x: Any, depth: int) -> Any:
        y = self.fc(x) * 1.0
        self.outs[depth] = y
        return y


class _Recursive(nn.Module):
    """helper-94's FINDING 3: the model calls itself after the keeper's call."""

    def __init__(self, extra: int) -> None:
        super().__init__()
        self.k = _Deep(extra)

    def forward(self, x: Any, depth: int = 1) -> Any:
        h = self.k(x, depth)
        if depth:
            h = self(torch.tanh(h), depth - 1)
        return h


def _recursive(extra: int) -> tuple[dict[str, float], list[dict[str, float]], list[str]]:
    x = torch.randn(3, 4)

    def run(model: Any) -> None:
        out = model(x)
        kept = sum((v**2).sum() for v in model.k.outs.values())
        ((out * out).sum() + 3 * kept).backward()

    torch.manual_seed(0)
    model = _Recursive(extra)
    native = native_run(model, ["", "k"], run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            run(model)
    return native, [dict(entry) for entry in monitor.history], _said(caught)


def test_held_nested_forward_keeper() -> None:
    native, entries, said = _recursive(14)
    assert all("k" not in entry for entry in entries) and any("'k'" in s for s in said)


def test_finding1_nested_forward_keeper_with_many_attributes() -> None:
    native, entries, said = _recursive(20)
    # history[0]: 'k' 16.36 where native is 5.01 (a warning names 'k' for another reason)
    assert all("k" not in entry for entry in entries)


def _paddle_clean(extra: int) -> tuple[dict[str, float], dict[str, float], list[str]]:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PKeeps(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = pnn.Linear(4, 4)
            for i in range(extra):
                setattr(self, f"cfg{i}", i)

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = y  # (paddle files it among the layer's buffers: a dict)
            return y

    class PClean(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = PKeeps()
            self.b = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            out = self.b(paddle.tanh(h)) + 3 * self.a.out
            self.a.out = None
            return out

    torch.manual_seed(0)
    model, x = _Clean("attr", 0), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _square)
    twin = PClean()
    for t, p in ((model.a.fc, twin.a.fc), (model.b, twin.b)):
        p.weight.set_value(t.weight.detach().numpy().T.copy())
        p.bias.set_value(t.bias.detach().numpy().copy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            out = twin(paddle.to_tensor(x.numpy()))
            (out * out).sum().backward()
    return native, dict(monitor.history[-1]), _said(caught)


def _promise_kept(native: dict[str, float], step: dict[str, float], said: list[str]) -> bool:
    for name, want in native.items():
        if name in step:
            if step[name] != pytest.approx(want, rel=1e-4):
                return False
        elif not any(repr(name) in s for s in said):
            return False
    return True


def test_held_paddle_keeper_with_11_attributes() -> None:
    native, step, said = _paddle_clean(11)
    assert "a" not in step and _promise_kept(native, step, said)


def test_finding1_paddle_keeper_with_12_attributes() -> None:
    native, step, said = _paddle_clean(12)
    # 'a' 36.36 where native is 6.78, no warning
    assert _promise_kept(native, step, said)


# ------------------------------------------------------------------ FINDING 2


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.out = y
        return y


class _Blk(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Inner()

    def forward(self, x: Any) -> Any:
        return self.k(x)


class _Hidden(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blk = _Blk()
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.blk(x)
        out = self.head(torch.tanh(h)) + 3 * self.blk.k.out
        self.blk.k.out = None
        return out


def test_held_hidden_keeper_every_module_monitored() -> None:
    torch.manual_seed(0)
    model = _Hidden()
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


def test_finding2_where_leaves_the_keeper_out() -> None:
    """(passes since 2026-12-07: the modules inside a hooked one that `where` leaves out are
    looked in as its call ends, `_left_out_below`)"""
    torch.manual_seed(0)
    model = _Hidden()
    where = ["blk", "head"]
    # 'blk' 29.31 where native is 4.01, no warning (0c76291 the same)
    assert broken(model, where, torch.randn(3, 4), _square, where=where) == []


class _OnChild(nn.Module):
    """Keeps its output on its child."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.fc.last = y
        return y


class _OnChildDropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _OnChild()
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.k(x)
        out = self.b(torch.tanh(h)) + 3 * self.k.fc.last
        self.k.fc.last = None
        return out


def test_held_output_kept_on_a_child_to_the_end() -> None:
    torch.manual_seed(0)
    model = _Reader(_OnChild())

    def loss(model: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (model.k.fc.last**2).sum()

    # (0c76291: 'k' 26.64 where native is 1.29)
    assert broken(model, _names(model), torch.randn(3, 4), loss) == []


@pytest.mark.xfail(strict=True, reason="FINDING 2: kept on a child, dropped before the end")
def test_finding2_output_kept_on_a_child_and_dropped() -> None:
    torch.manual_seed(0)
    model = _OnChildDropped()
    # 'k' 36.36 where native is 6.78, no warning (0c76291 the same)
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


def test_finding2_generated() -> None:
    assert _generated(101, where=True) == []


# ------------------------------------------------------------------ FINDING 3


def _deque(module: Any, y: Any) -> None:
    module.mem = collections.deque([y], maxlen=4)


def _set(module: Any, y: Any) -> None:
    module.mem = {y}


def _frozenset(module: Any, y: Any) -> None:
    module.mem = frozenset([y])


def _userlist(module: Any, y: Any) -> None:
    module.mem = collections.UserList([y])


@pytest.mark.parametrize(
    "keep",
    [
        _deque,
        _set,
        _frozenset,
        _userlist,  # (a plain object holding a list: seen since 2026-12-07)
    ],
)
def test_finding3_kept_in_a_deque_or_set(keep: Any) -> None:
    torch.manual_seed(0)
    model = _Reader(_Store(keep))

    def loss(model: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (next(iter(model.k.mem)) ** 2).sum()

    # deque: 'k' 11.34 where native is 1.12, no warning (0c76291 the same)
    assert broken(model, _names(model), torch.randn(3, 4), loss) == []


# ------------------------------------------------------------------ FINDING 4


class _ListsCell(nn.Module):
    """An RNN-style cell holding `lists` lists of 256 ints (no tensor)."""

    def __init__(self, lists: int) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        for i in range(lists):
            setattr(self, f"t{i}", list(range(256)))

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.fc(x))


class _Unrolled(nn.Module):
    def __init__(self, lists: int, steps: int = 200) -> None:
        super().__init__()
        self.cell = _ListsCell(lists)
        self.steps = steps

    def forward(self, x: Any) -> Any:
        for _ in range(self.steps):
            x = self.cell(x)
        return x


def test_finding4_per_call_walk_of_first_level_containers(monkeypatch: Any) -> None:
    """A list of numbers only is passed at once (since 2026-12-07: d73074b)."""
    import unihook.recipes.monitor as monitor_module

    counted = [0]
    original = monitor_module._objects_within

    def counting(values: list[Any], deeper: int, ids: list[int], *args: Any, **kw: Any) -> None:
        before = len(ids)  # (the ids a look gathers, its nested calls' too)
        original(values, deeper, ids, *args, **kw)
        if args[1:2] != (False,):  # (a look, not a nested call: counted once)
            counted[0] += len(ids) - before

    monkeypatch.setattr(monitor_module, "_objects_within", counting)
    model = _Unrolled(15)
    with GradientMonitor(model, where=["cell"]):
        counted[0] = 0
        model(torch.randn(2, 8)).sum().backward()
    # ~780,000 ids a forward: 200 calls x 15 x 256 (77.6 ms a step where the cell without the
    # lists takes 17.0 ms; 0c76291 65.8 ms)
    assert counted[0] < 50_000, counted


@pytest.mark.skipif(not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing")
@pytest.mark.xfail(strict=True, reason="FINDING 4: the per-call look walks flat lists (timed)")
def test_finding4_timed() -> None:
    import math
    import time

    def step_time(lists: int) -> float:
        torch.manual_seed(0)
        model, x = _Unrolled(lists), torch.randn(2, 8)
        best = math.inf
        with GradientMonitor(model, where=["cell"]):
            for _ in range(5):
                start = time.perf_counter()
                model(x).sum().backward()
                best = min(best, time.perf_counter() - start)
        return best

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain, lists = step_time(0), step_time(15)
    finally:
        torch.set_num_threads(threads)
    # by hand: 17.0 ms without the lists, 77.6 ms with 15 (16 lists: 32.4 ms, FINDING 1);
    # 2026-12-07, lists of numbers passed at once: 64.7 ms (141.6 on c802303)
    assert lists < 1.5 * plain, (lists, plain)


# ------------------------------------------------------------------ FINDING 5


def _aux_hooks(aux: list[Any]) -> Any:
    def prepare(model: Any) -> Any:
        hook = lambda m, i, o: aux.append(o.pow(2).mean())  # noqa: E731
        handles = [model[0].register_forward_hook(hook), model[2].register_forward_hook(hook)]
        return lambda: [handle.remove() for handle in handles]

    return prepare


@pytest.mark.xfail(strict=True, reason="FINDING 5: a user's hook computing a loss term")
@pytest.mark.parametrize("first", [False, True])
def test_finding5_hook_computes_an_auxiliary_loss_from_the_output(first: bool) -> None:
    aux: list[Any] = []

    def loss(model: Any, out: Any) -> Any:
        total = (out * out).sum() + 5 * sum(aux)
        aux.clear()
        return total

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    # after the monitor: '0' 2.31 where native is 1.22, '2' 1.95 vs 1.39, no warning
    # (0c76291 the same)
    assert broken(model, _names(model), torch.randn(3, 4), loss, _aux_hooks(aux), first) == []


# ------------------------------------------------------------------ ordinary models


class _Rnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 8, 2, batch_first=True)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        out, _ = self.gru(out)
        return self.fc(out)


def _cube(model: Any, out: Any) -> Any:
    return (out[..., 0] ** 3).sum()


@pytest.mark.parametrize("which", ["encoder", "rnn", "cnn"])
def test_held_ordinary_models(which: str) -> None:
    torch.manual_seed(0)
    if which == "encoder":
        # (p=0 dropouts return their input: left out, warned, documented)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        model: Any = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        x = torch.randn(2, 5, 16)
    elif which == "rnn":
        model, x = _Rnn(), torch.randn(2, 5, 8)
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 2),
        )
        x = torch.randn(2, 3, 8, 8)
    names = [name for name, m in model.named_modules() if not isinstance(m, nn.ModuleList)]
    names = [name for name in names if not name.endswith("out_proj")]  # (never called)
    assert broken(model, names, x, _cube) == []


# ------------------------------------------------------------------ FINDING 6


class _SelfCalling(nn.Module):
    """helper-94's FINDING 7 model: calls itself after `k` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(4, 4)
        self.a = nn.Linear(4, 4)

    def forward(self, x: Any, depth: int = 1) -> Any:
        h = self.k(x)
        if depth:
            h = self(torch.tanh(h), depth - 1)
        return self.a(h)


def _self_calling(every: int) -> tuple[list[dict[str, float]], Any]:
    torch.manual_seed(0)
    model, x = _SelfCalling(), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = GradientMonitor(model, every=every)
        for _ in range(3):
            (model(x) ** 2).sum().backward()
        entries = [dict(entry) for entry in monitor.history]
        (model.a(x) ** 2).sum().backward()  # a submodule on its own, after the steps
    monitor.remove()
    return entries, monitor


def test_held_self_calling_model_every_1() -> None:
    entries, monitor = _self_calling(1)
    # (split in two entries a step: helper-94's FINDING 7, open; the root's and 'a''s norms
    # over both calls are in the second)
    assert len(entries) == 6 and monitor._running == 0
    assert [dict(e) for e in monitor.history] == entries


def test_finding6_self_calling_model_every_2() -> None:
    reference, _ = _self_calling(1)
    entries, monitor = _self_calling(2)
    # '' and 'a' 0.868 where every=1 (and native, over its entries) gives 2.080, no warning
    assert [set(e) for e in entries] == [set(e) for e in reference]
    assert all(
        e[name] == pytest.approx(r[name], rel=1e-5)
        for e, r in zip(entries, reference)
        for name in e
    )


def test_finding6_self_calling_model_leaves_a_running_forward() -> None:
    entries, monitor = _self_calling(2)
    # `_running` stays 1: model.a called alone afterwards changed history[-1]['a'] 0.87 -> 4.86
    assert monitor._running == 0
    assert [dict(e) for e in monitor.history] == entries


class _Gate(nn.Module):
    """A Linear whose call on a thread other than the main one waits for `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.release: Any = None
        self.reached: Any = None

    def forward(self, x: Any) -> Any:
        y = self.fc(x)
        if self.release is not None and threading.current_thread() is not threading.main_thread():
            self.reached.set()
            self.release.wait(5)
        return y


class _Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = _Gate()
        self.a = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.a(torch.tanh(self.g(x)))


def _threads(every: int) -> tuple[list[dict[str, float]], list[dict[str, float]], int]:
    torch.manual_seed(0)
    model, x = _Gated(), torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = GradientMonitor(model, every=every)
        model.g.release, model.g.reached = threading.Event(), threading.Event()
        thread = threading.Thread(target=lambda: (model(x) ** 2).sum().backward())
        thread.start()
        model.g.reached.wait(5)
        (model(x) ** 2).sum().backward()  # the main thread's forward ends meanwhile
        model.g.release.set()
        thread.join()
        model.g.release = None
        for _ in range(every):
            (model(x) ** 2).sum().backward()
        before = [dict(entry) for entry in monitor.history]
        (model.a(x) ** 2).sum().backward()  # a submodule on its own
    monitor.remove()
    return before, [dict(entry) for entry in monitor.history], monitor._running


def test_held_threads_every_1() -> None:
    before, after, running = _threads(1)
    assert before == after and running == 0


def test_finding6_threads_every_2() -> None:
    before, after, running = _threads(2)
    # `_running` stays 1 (the finished thread's forward): history[-1]['a'] 2.74 -> 5.51
    assert before == after and running == 0


def _paddle_self_calling(every: int) -> tuple[list[dict[str, float]], list[dict[str, float]], int]:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PSelfCalling(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.k = pnn.Linear(4, 4)
            self.a = pnn.Linear(4, 4)

        def forward(self, x: Any, depth: int = 1) -> Any:
            h = self.k(x)
            if depth:
                h = self(paddle.tanh(h), depth - 1)
            return self.a(h)

    paddle.seed(0)
    model, x = PSelfCalling(), paddle.randn([3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = GradientMonitor(model, every=every)
        for _ in range(3):
            (model(x) ** 2).sum().backward()
        before = [dict(entry) for entry in monitor.history]
        (model.a(x) ** 2).sum().backward()
    monitor.remove()
    return before, [dict(entry) for entry in monitor.history], monitor._running


def test_finding6_paddle_self_calling_model_every_2() -> None:
    reference, _, _ = _paddle_self_calling(1)
    before, after, running = _paddle_self_calling(2)
    # '' and 'a' 4.08 where every=1 gives 4.91; `_running` stays 1, model.a alone changes
    # history[-1]
    assert running == 0 and before == after
    assert before[-1][""] == pytest.approx(reference[-1][""], rel=1e-5)


@pytest.mark.parametrize("seed", [0, 7, 21])
def test_held_every_n_generated(seed: int) -> None:
    # each entry native or warned: 59 of 60 seeds by hand (seed 36: FINDING 2)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    net = _Net(rng, _MODES, False)
    names, x = _names(net), torch.randn(3, 4)
    every = rng.choice([2, 3])
    where = None if rng.random() < 0.6 else rng.sample(names, rng.randint(1, len(names)))
    native = native_norms(net, where or names, x, _net_loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(net, every=every, where=where) as monitor:
            for _ in range(6):
                with torch.no_grad():
                    net(x)
                _net_loss(net, net(x)).backward()
    said = _said(caught)
    assert len(monitor.history) == 6 // every
    for entry in monitor.history:
        assert _promise_kept(native, dict(entry), said)


# ------------------------------------------------------------------ FINDING 7


class _Potential(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 8)

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.fc(x))


class _Forces(nn.Module):
    """Forces as -dE/dpos inside the forward (create_graph), the energy reading a capture."""

    def __init__(self) -> None:
        super().__init__()
        self.k = _Potential()
        self.head = nn.Linear(8, 1)

    def forward(self, pos: Any) -> Any:
        pos = pos if pos.requires_grad else pos.requires_grad_(True)
        energy = self.head(self.k(pos)).sum() + 0.5 * (self.k.feat**2).sum()
        return -torch.autograd.grad(energy, pos, create_graph=True)[0]


def _capture_feat(model: Any) -> Any:
    return model.k.register_forward_hook(lambda m, i, o: setattr(m, "feat", o)).remove


def test_held_forces_capture_hook_before_the_monitor() -> None:
    torch.manual_seed(0)
    model = _Forces()
    assert broken(model, _names(model), torch.randn(5, 3), _square, _capture_feat, True) == []


def test_finding7_backward_inside_the_forward_before_the_end_walk() -> None:
    torch.manual_seed(0)
    model = _Forces()
    # 'k' 3.86 where native is 1.48, beside the warning that it is left out (0c76291: the
    # sum, no warning)
    assert broken(model, _names(model), torch.randn(5, 3), _square, _capture_feat) == []


@pytest.mark.xfail(strict=True, reason="FINDING 5: paddle, a user's hook computing a loss term")
def test_finding5_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn
    aux: list[Any] = []

    def loss(model: Any, out: Any) -> Any:
        total = (out * out).sum() + 5 * sum(aux)
        aux.clear()
        return total

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    native = native_norms(model, _names(model), x, loss, _aux_hooks(aux))
    twin = pnn.Sequential(
        pnn.Linear(4, 4), pnn.Tanh(), pnn.Linear(4, 4), pnn.Tanh(), pnn.Linear(4, 4)
    )
    for i in (0, 2, 4):
        twin[i].weight.set_value(model[i].weight.detach().numpy().T.copy())
        twin[i].bias.set_value(model[i].bias.detach().numpy().copy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            for i in (0, 2):
                twin[i].register_forward_post_hook(lambda m, i, o: aux.append(o.pow(2).mean()))
            out = twin(paddle.to_tensor(x.numpy()))
            loss(twin, out).backward()
    # '0' 2.31 where native is 1.22, '2' 1.95 vs 1.39, no warning
    assert _promise_kept(native, dict(monitor.history[-1]), _said(caught))


# ---- MindSpore (FINDING 1: a Cell has 60 ``__dict__`` entries before any of the user's)

_MS_SCRIPT = (
    MINDSPORE_DENSES
    + r"""


class Keeps(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = dense(0)

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


def test_finding1_mindspore_list_attribute() -> None:
    run = run_in_mindspore(_MS_SCRIPT)
    w, b = [torch.tensor(a) for a in run["w"]], [torch.tensor(a) for a in run["b"]]
    twin = _Clean("list", 0)
    with torch.no_grad():
        for layer, i in ((twin.a.fc, 0), (twin.b, 1)):
            layer.weight.copy_(w[i])
            layer.bias.copy_(b[i])
    native = native_norms(twin, _names(twin), torch.tensor(run["x"]), _square)
    step, said = run["step"], run["said"]
    assert run["entries"] > 32
    # the twin is the same model: the root's norm agrees with torch's
    assert step[""] == pytest.approx(native[""], rel=1e-4)
    # 'a' 77.50 (equal to 'a.fc', which sums both uses) where native is 7.11, no warning
    assert _promise_kept(native, step, said)


# ------------------------------------------------------------------ paddle, generated (held)

_PADDLE_MODES = ("none", "attr", "list", "tuple", "dict", "odict")


def _paddle_twin_of(net: Any) -> Any:
    """`net` (a `_Net`) on paddle, its weights copied."""
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PKeeper(pnn.Layer):
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.fc = pnn.Linear(4, 4)
            self.mode = mode

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            mode = self.mode
            if mode == "attr":
                self.out = y
            elif mode == "list":
                self.out = [y]
            elif mode == "tuple":
                self.out = (y, 1)
            elif mode == "dict":
                self.out = {"y": y}
            elif mode == "odict":
                self.out = collections.OrderedDict(y=y)
            return y

        def take(self) -> Any:
            out, mode = self.out, self.mode
            if mode == "attr":
                return out
            return out[0] if mode in ("list", "tuple") else out["y"]

        def drop(self) -> None:
            self.out = None

    class PBlock(pnn.Layer):
        def __init__(self, block: Any) -> None:
            super().__init__()
            self.k = PKeeper(block.k.mode)
            self.act = pnn.Tanh() if block.act is not None else None

        def forward(self, x: Any) -> Any:
            y = self.k(x)
            return self.act(y) if self.act is not None else y

    class PNet(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = pnn.LayerList([PBlock(block) for block in net.blocks])
            self.read, self.dropped, self.w = net.read, net.dropped, net.w

        forward = _Net.forward

    twin = PNet()
    for block, other in zip(net.blocks, twin.blocks):
        other.k.fc.weight.set_value(block.k.fc.weight.detach().numpy().T.copy())
        other.k.fc.bias.set_value(block.k.fc.bias.detach().numpy().copy())
    return twin


@pytest.mark.parametrize("seed", [2, 19, 41])
def test_held_paddle_generated_keepers(seed: int) -> None:
    # 0 of 60 seeds broken by hand (keepers of at most 32 entries, no where=)
    paddle = pytest.importorskip("paddle")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    net, x = _Net(rng, _PADDLE_MODES, False), torch.randn(3, 4)
    native = native_norms(net, _names(net), x, _net_loss)
    twin = _paddle_twin_of(net)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            _net_loss(twin, twin(paddle.to_tensor(x.numpy()))).backward()
    assert _promise_kept(native, dict(monitor.history[-1]), _said(caught))


# ------------------------------------------------------------------ FINDING 8


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.blk = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.blk, self.a(x), use_reentrant=True))


def _pseudo_labels(evaluate: bool) -> list[list[dict[str, float]]]:
    """every=2; each step: a forward, (a no_grad forward of the same model: pseudo-labels),
    its backward. The entries after each step."""
    torch.manual_seed(0)
    model = _Checkpointed()
    xs = [torch.randn(3, 4), 3 * torch.randn(3, 4)]
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GradientMonitor(model, every=2) as monitor:
            for x in xs:
                out = model(x)
                if evaluate:
                    with torch.no_grad():
                        model(x)
                (out**2).sum().backward()
                seen.append([dict(entry) for entry in monitor.history])
    return seen


def test_held_reentrant_checkpoint_every_2() -> None:
    # (documented: the part under a reentrant checkpoint is left out of logged steps)
    seen = _pseudo_labels(False)
    assert seen[0] == seen[1] and "blk" not in seen[0][0]


def test_finding8_no_grad_forward_between_an_off_step_and_its_backward() -> None:
    seen = _pseudo_labels(True)
    # entry 0 got 'blk', 'blk.0', 'blk.1' from step 1's backward (step 1's gradients)
    assert seen[0] == seen[1]
    assert seen == _pseudo_labels(False)


def test_finding8_paddle_recompute() -> None:
    paddle = pytest.importorskip("paddle")
    from paddle.distributed.fleet.utils import recompute

    pnn = paddle.nn

    class PCheckpointed(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = pnn.Linear(4, 4)
            self.blk = pnn.Sequential(pnn.Linear(4, 4), pnn.Tanh())
            self.head = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.head(recompute(self.blk, self.a(x)))

    paddle.seed(0)
    model = PCheckpointed()
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GradientMonitor(model, every=2) as monitor:
            for x in (paddle.randn([3, 4]), 3 * paddle.randn([3, 4])):
                out = model(x)
                with paddle.no_grad():
                    model(x)
                (out**2).sum().backward()
                seen.append([dict(entry) for entry in monitor.history])
    # entry 0 gets 'blk' 3.84, 'blk.0', 'blk.1' from step 1's backward
    assert seen[0] == seen[1]
