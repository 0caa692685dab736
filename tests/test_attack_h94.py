"""helper-94's attack on e6e1153: GradientMonitor looking for kept outputs once the model's
forward ends, in every module of the model (`GradientMonitor._kept`, `_held`, `_Step.shared`),
and the previous session's `_Step.left` / `_inner_output` / `_kept_earlier`.

Oracle: `tests/monitor_oracle.py` (torch's native ``register_full_backward_pre_hook`` on a
deep copy; the norm over a module's calls). The promise: a module's entry equals that norm
(rel 1e-5), or the module is absent from the step AND a RuntimeWarning containing
"GradientMonitor" names it; never a silently wrong number; ordinary models lose nothing.
"REGRESSION" below means 0c76291 (the commit before e6e1153, checked in a worktree of it)
gave the native norm or left the module out with the warning, and e6e1153 does not.

HELD (pinned below unless said):

- A mixed generator (`_mixed`): blocks that keep their output in a dict attribute, keep
  their child's output (``self.h = self.child(x)``), call a child twice, put an nn.Identity
  after it, add a residual, feed an auxiliary module with it; capture hooks of the user's
  (on the module or in a dict on the model, before or after the monitor); the loss reading
  every kept tensor with random weights: 0 of 80 seeds broken (50 of 80 at 0c76291: the
  fixes of helper-92's FINDINGS 1-3 hold), 6 seeds pinned.
- A caller stashing outputs and popping them later (U-Net skips on a list attribute of the
  model, ``self.stack.append(h) ... + self.stack.pop()``): the caller keeps what torch hands
  it, every module native, no warning.
- A keeper called twice, the first call's kept output read between the calls and then
  overwritten by the second call (``Over``): `_Step.left` drops the module and its container
  for the whole forward (native or warned).
- Generated chains of keepers (attribute / list, 2-5 blocks, random reads of the kept tensors
  by the model and the loss) where nothing is dropped before the forward ends: native or
  warned (8 seeds below, 40 by hand).
- ``retain_graph=True`` and a second backward of the same forward, and siamese (two forwards,
  one backward) with random keepers read by the loss: summed over entries, every module
  present in all entries equals the native norm, every one absent is warned (20 seeds by hand,
  4 below).
- ``every=2`` over six steps with a keeper read by the loss, torch and paddle: the keeper and
  its container left out with the warning on every recorded step, after the hooks were put
  back (their order on the model changes: `_count` then `_kept`).
- ``torch.utils.checkpoint`` of a part holding a keeper, reentrant and not, keeper on or off:
  native or warned (4 combinations).
- No false leave-out on: a ResNet-style block (in-place ReLU, ``out += identity``, BatchNorm,
  a call counter and ``self.last_shape`` on the block), a weight-tied LM (embedding and head
  sharing a weight, also held in a plain list attribute ``self.params_list``; only the p=0
  dropouts are left out, documented), LSTM + GRU + MultiheadAttention + LayerNorm (the
  LSTM's nested states unused: see FINDING 10).
- `_Step.consumed` stays bounded (40 ids) over 3000 no_grad evaluation forwards after a
  training step, and over 3000 calls of a submodule on its own.
- Leaks: the monitor's own structures hold tensors weakly (`kept`, `hooked`, `consumed`):
  after an exception in the forward the next step runs as usual. (But see FINDING 11.)
- paddle: a ResNet-style block (``out += x``), LSTM, GRU, a 2-layer TransformerEncoder,
  MultiHeadAttention, LayerNorm, Embedding: nothing left out but the documented LSTM / GRU
  (by hand, as at 0c76291).
- ``torch.compile(model, backend="eager")`` with a keeper held to the end: left out with
  the warning, the others native, two steps (by hand). A tuple output reordered by its
  container, the child keeping one element: native or warned (8 combinations by hand; a
  LIST output has no native hook at all, torch warns: not counted).
- Forces computed inside the forward (``autograd.grad(energy, pos, create_graph=True)``) in
  a training step: native (pinned; but see FINDING 12 for evaluations).
- No quadratic cost in the hooked outputs: `_held`'s ``keys & set(ids)`` per module; full
  ``where`` on N chained Linears: N=6000 304 ms per forward vs 295 ms at 0c76291 (no monitor
  60-86 ms); a cell unrolled 2000 times beside 200 modules: 44 ms vs 58 ms at 0c76291.
- Cost (measured by hand, best of 5, 1 torch thread, load ~2 from another helper): the end
  walk costs ~4 us per module per forward whatever `where=` selects (README says so):
  ``nn.Sequential`` of N Linear+Tanh pairs, ``where=["0"]``, per forward: N=200 1818 us
  (0c76291: 998, no monitor 914), N=1000 10.1 ms (7.2, 4.9), N=3000 40.2 ms (26.5, 22.0); a
  12-layer TransformerEncoder (125 modules) training step with ``where=["2"]``: 9.5 ms vs
  8.7 ms at 0c76291 (no monitor 6.7-9.0 ms). Not pinned as a finding (documented); see 6.

FINDINGS (strict xfails below), numbered as found; by severity: HIGH 1; medium 2, 3, 12, 13;
medium-low 4, 5; low-medium 6, 7, 8, 11; low 9, 10.

1. FIXED (`monitor._keeps`: the per-call look in the module's own attributes is back, beside
   the end walk). (HIGH: silently wrong norm; REGRESSION; torch, paddle and MindSpore) an output a
   module keeps
   during the forward but that is no longer held when the forward ends: read by a later part of
   the forward and then dropped (``self.a.out = None`` after use, a list the model drains, a
   shared ``ctx["prev"]`` the next block overwrites; a forward hook on the model registered
   BEFORE the monitor that moves captures off the model: the same sum, also at 0c76291).
   `_kept` only sees what is held at the end. Minimal
   (``_Clean``): ``K.forward: y = fc(x) * 1.0; self.out = y; return y``; parent ``h = self.a(x);
   out = self.b(tanh(h)) + 3 * self.a.out; self.a.out = None``, loss ``(out * out).sum()``: 'a'
   recorded 36.36 where native is 6.78, no warning (paddle: 36.36 vs 6.78; MindSpore, pinned:
   'a' 77.50 vs native 7.11, equal to 'a.fc' which sums both uses, where 0c76291 left 'a' out).
   One keeper shared by two containers (``A = Seq(k); B = Seq(k)``; the first call's output
   read, then overwritten by the second call): 'A' 21.32 where native is 2.58, no warning for
   'A'. Generated chains (`_chain`): 28 of 40 seeds broken at e6e1153, 0 of 40 at 0c76291 (its
   per-call look saw the keeper holding its output when the call ended). Expected: left out
   (e.g. keep the per-call look in the keeper's own ``__dict__`` beside the end walk) or native.
2. FIXED (the per-call look; `_kept` is an always_call hook). (medium: silently wrong norm;
   REGRESSION) a forward ended by an exception: `_kept` is no
   `always_call` hook, so nothing is looked for. The early-exit feature probe (a forward
   hook on a layer stores its output and raises ``Stop``; the user catches it and
   backpropagates a loss over the stored output and a keeper's ``self.out``): the keeper '1'
   records 10.12 where native is 1.13, no warning (0c76291: left out, warned). Also a
   KeyboardInterrupt. paddle the same (by hand: '1' 20.41, equal to '1.fc', no warning;
   left out at 0c76291). Expected: left out (look also when the forward raised).
3. FIXED (the per-call look). (medium: silently wrong norm beside a warning; REGRESSION) a model
   calling itself after
   a keeper's call (``h = self.k(x, depth); if depth: h = self(tanh(h), depth - 1)``, the
   keeper storing ``self.outs[depth] = y``): the nested forward starts a new `_Step`, so the
   outer forward's outputs hooked before it are in a step `_kept` never looks at (it reads
   `self._step` at each end): the first history entry holds 'k' 16.25 (the sum of its uses)
   where native is 3.66 over both calls, beside a warning naming 'k' for the other entry;
   0c76291 left 'k' out of both entries. Expected: 'k' absent from every entry (or native).
4. FIXED (the per-call look). (medium-low: silently wrong norm; REGRESSION; threads) a forward on
   thread A (keeper
   ``self.out = y`` read by the loss) while thread B runs a whole forward of the same model
   that does not call the keeper: at A's end `self._step` is B's step, so A's keeper is not
   found: 'k' 12.87 where native is 1.73, no warning (0c76291: left out, warned). README
   allows entries to mix across threads, but says "each call's numbers are its own".
   Expected: left out.
5. FIXED (`_Step.readers`: a monitored holder that got the tensor as an argument leaves out
   only the modules around its call). (medium-low: modules lost that torch records;
   REGRESSION; torch and paddle) a module
   holding one of its ARGUMENTS (``self.inp = x``; a K-FAC / Shampoo-style forward pre-hook
   ``setattr(m, "a_in", args[0])``; a down-block keeping its skip input) makes the module
   that produced that argument "kept": left out with the warning, though the holder keeps
   what torch hands the caller (the alias), so torch's hook counts those reads and equals
   the tensor hook's sum. ``Sequential(Linear, Tanh, SaveIn(Linear), Linear)``: 'Tanh' (1)
   lost; with the pre-hook on every Linear, '1' and '2' lost (0c76291: all recorded,
   native). Expected: a tensor a holder got as an argument of its own call (`_Step.consumed`
   knows them) does not make its producer kept. Related, documented in README as deliberate
   (not pinned): a caller keeping what its child returned (``self.skips.append(x)`` in a
   U-Net's forward, read by the decoder, left on ``self`` to the next forward) now loses the
   whole encoder (6 of 10 modules of a small U-Net, warned), which 0c76291 recorded at the
   native norms.
6. FIXED (the second level only in containers of at most `_NESTED` = 32 items, at most
   about `_BUDGET` = 4096 objects a module). (low-medium: slowdown; REGRESSION) `_LOOKED` = 256
   bounds each container, not the walk:
   an attribute holding 256 lists of 256 items (a lookup table, an adjacency list, a dict of
   dicts) is 65,536 ids a forward. 4 modules with ``self.table = [[i] * 256 for i in
   range(256)]`` and ``self.d`` = 256 dicts of 256 items: 32.5 ms per forward (29.7 ms with
   ``where=["0"]``) where 0c76291 took 0.22 ms (0.06) and no monitor 0.03 ms; with 16 rows:
   1.9 ms vs 0.18 ms. Pinned without timing: ids collected per forward. Expected: a bound on
   the items looked at per module (or skip containers holding no tensor).
7. (low-medium: wrong numbers; not a regression) a model calling itself AFTER one of its
   modules ran (no keeper at all): the nested forward starts a new step, so one forward and
   one backward give two history entries, each with part of the calls: ``h = self.k(x); if
   depth: h = self(tanh(h), depth - 1); return self.a(h)``: history[-1] has 'k' 0.440 where
   native (both calls) is 0.503, history[-2] 'k' 0.243. (helper-78 noted the same split for
   a model called from a submodule's hook and did not pin it; its recursion tests call
   ``self(h)`` before any module.) Expected: one entry, native norms.
8. FIXED (tuple and list subclasses, by their base types' methods). (low-medium: silently
   wrong norm; not a regression; README says "a dict, list or tuple
   attribute") a namedtuple attribute (``self.state = State(h=y, c=c)``; PackedSequence is
   one): `_objects_within` looks in ``type(value) in (list, tuple)`` only: '1' 8.26 where native
   is 1.84, no warning. (A UserDict, deque, set or SimpleNamespace attribute: the same, which
   README's "another object" covers; `_argument_tensors` walks all of them.)
9. FIXED (`_kept` walks the model's modules as they are at each forward's end). (low:
   silently wrong norm; not a regression) a module set into the model after the
   monitor was made (``model[1][0] = K()``, a head replaced): it is not hooked and not in
   `_holders` (a snapshot), so its container '1' records 13.58 where native is 2.02, no
   warning. Expected: left out (walk the model's modules at the end, or warn that the model
   changed).
10. (low: a number that is not torch's; not a regression) torch's native hook wraps only the
   TOP-level tensors of a tuple output, so an LSTM's grad_output is its ``out``'s alone; the
   monitor hooks ``(h_n, c_n)`` too (`tensors_of` flattens): with the states in the loss
   ('lstm' of ``out, (hn, cn) = self.lstm(x)``, loss uses ``hn``): 4.98 vs native 4.45, no
   warning (2.78 vs 1.65 in another draw). Expected: match torch, or README saying the
   monitor's norm covers nested outputs.
11. FIXED (`_gradient_of`: the hook holds the monitor weakly). (low-medium: leak; not a
   regression) a module keeping its output (``self.out = y``,
   GradCAM-style activations) after ``monitor.remove(); del monitor, model``: the kept
   tensor's gradient hook (a ``functools.partial`` of the bound ``_gradient``) holds the
   monitor, which holds the model, and torch does not traverse tensor hooks, so the cycle is
   never collected: the model and its buffers (4 MB in the test) stay alive. Expected: after
   ``remove()`` no hook holds the monitor (a weak reference in the partial).
12. FIXED (a forward of the model begun without gradients records nothing). (medium:
   silently changes an entry already in `history`; not a regression) an
   evaluation under ``no_grad`` of a model that computes gradients inside its forward under
   ``enable_grad`` (forces as -dE/dpos: interatomic potentials): `_new_step` starts no step
   (grad is off at the model's pre-hook), but the calls inside run with grad, are hooked on
   the LAST TRAINING step, and the inner ``autograd.grad`` adds their gradients to its
   entry: after one training step and three evaluation forwards, 'b' 3.16 -> 5.00, 'a'
   1.57 -> 2.56 (paddle, by hand, with ``paddle.grad``: 'b' 3.16 -> 5.00, 'a' 3.63 ->
   5.95). (The training step itself, with ``create_graph=True``, equals native.)
   Expected: that entry unchanged (a step of its own, or nothing recorded).
13. FIXED (`_keep_hooked` reads copies). (medium: crash; not a regression, 0c76291 the
   same) one model run on two threads with
   grad enabled (forwards only suffice): `_new_step` on one thread iterates the running
   step's ``hooked`` (`_keep_hooked`: ``for key, ... in step.hooked.items()``, and the
   pruning comprehension over ``_earlier``) while the other thread's `_record` adds to it:
   ``RuntimeError: dictionary changed size during iteration`` out of the model's call, in
   0.1-2 s with 300 Linears (5 of 5 runs; 3 threads x 150 training steps of a 90-module
   model: 1 crash per run). README: "one model may run on several threads", and for the
   recipes "forwards running at once on several threads are not told apart", not that they
   raise. Expected: no exception (iterate over a copy, ``list(step.hooked.items())``).

MindSpore: FINDINGS 1 and 5 pinned through ``ms.grad`` in a subprocess (the MindSpore venv;
both XPASS against 0c76291). Not covered for lack of time: distributed merges,
torch.compile, MindSpore beyond those two.
"""

from __future__ import annotations

import collections
import gc
import math
import os
import random
import threading
import time
import types
import warnings
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import (  # noqa: E402
    MINDSPORE_DENSES,
    broken,
    monitored,
    names,
    native_norms,
    native_run,
    run_in_mindspore,
    said,
    square,
)

import unihook.recipes.monitor as monitor_module  # noqa: E402
from unihook.recipes import GradientMonitor  # noqa: E402

_names, _said, _square = names, said, square  # (local variables are named `said`)

_native_run = native_run


class _K(nn.Module):
    """A Linear whose output (times 1.0: a tensor of its own) it keeps as ``self.out``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out: Any = None

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.out = y
        return y


# ------------------------------------------------------------------ held


class _Stash(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e1, self.e2 = nn.Linear(4, 4), nn.Linear(4, 4)
        self.d1, self.d2 = nn.Linear(4, 4), nn.Linear(4, 4)
        self.stack: list[Any] = []

    def forward(self, x: Any) -> Any:
        h = self.e1(x)
        self.stack.append(h)
        h2 = self.e2(torch.tanh(h))
        self.stack.append(h2)
        g = self.d1(torch.tanh(h2)) + self.stack.pop()
        return self.d2(g) + self.stack.pop()


class _Over(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.A = nn.Sequential(_K())
        self.B = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.A(x)
        aux = self.A[0].out
        return self.A(torch.tanh(self.B(h))) + 2 * aux


def test_held_caller_stash_is_native() -> None:
    torch.manual_seed(0)
    model, x = _Stash(), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _square)
    step, said = monitored(model, x, _square)
    assert said == [] and set(step) == set(native)
    assert all(step[n] == pytest.approx(native[n], rel=1e-5) for n in native)


def test_held_keeper_called_twice_overwritten() -> None:
    torch.manual_seed(0)
    model = _Over()
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


# ---- generated chains of keepers (FINDING 1 drops the kept tensors before the end)


class _Blk(nn.Module):
    def __init__(self, how: str, ctx: dict[str, Any]) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.how = how
        self.ctx = ctx
        self.out: Any = None
        self.mem: list[Any] = []

    def forward(self, x: Any) -> Any:
        y = torch.tanh(self.fc(x)) * 1.0
        if self.how == "attr":
            self.out = y
        elif self.how == "shared":  # (the next such block overwrites it)
            self.ctx["prev"] = y
        elif self.how == "list":
            self.mem.append(y)
        return y

    def kept(self) -> Any:
        if self.how == "attr":
            return self.out
        if self.how == "shared":
            return self.ctx.get("prev")
        if self.how == "list":
            return self.mem[-1] if self.mem else None
        return None

    def forget(self) -> None:
        if self.how == "attr":
            self.out = None
        elif self.how == "shared":
            self.ctx.pop("prev", None)
        elif self.how == "list":
            self.mem.clear()


class _Chain(nn.Module):
    def __init__(self, rng: random.Random, hows: tuple[str, ...], drops: tuple[str, ...]):
        super().__init__()
        self.ctx: dict[str, Any] = {}
        n = rng.randint(2, 5)
        self.blocks = nn.ModuleList(_Blk(rng.choice(hows), self.ctx) for _ in range(n))
        self.reads = [rng.random() < 0.6 for _ in range(n)]
        self.drops = [rng.choice(drops) for _ in range(n)]

    def forward(self, x: Any) -> Any:
        aux: Any = 0.0
        later = []
        for block, read, drop in zip(self.blocks, self.reads, self.drops):
            x = block(x)
            kept = block.kept()
            if read and kept is not None:
                aux = aux + (kept * kept).sum()
            if drop == "drop":
                block.forget()
            elif drop == "drop_later":
                later.append(block)
        for block in later:
            block.forget()
        return 2.0 * x.sum() + aux


def _chain(seed: int, hows: tuple[str, ...], drops: tuple[str, ...]) -> Any:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    return _Chain(rng, hows, drops)


def _out_only(model: Any, out: Any) -> Any:
    return out


@pytest.mark.parametrize("seed", range(8))
def test_held_generated_keepers_kept_to_the_end(seed: int) -> None:
    model = _chain(seed, ("attr", "list", "none"), ("none",))
    assert broken(model, _names(model), torch.randn(3, 4), _out_only) == []


class _Keep(nn.Module):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out: Any = None
        self.keep = keep

    def forward(self, x: Any) -> Any:
        y = torch.tanh(self.fc(x)) * 1.0
        if self.keep:
            self.out = y
        return y


def _kept_of(model: Any) -> list[Any]:
    return [m.out for m in model.modules() if isinstance(m, _Keep) and m.out is not None]


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_held_retain_graph_and_siamese(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    blocks = []
    for _ in range(3):
        keep = _Keep(rng.random() < 0.3)
        blocks.append(keep if rng.random() < 0.6 else nn.Sequential(keep, nn.Tanh()))
    model = nn.Sequential(*blocks)
    names = _names(model)
    xs = [torch.randn(2, 4) for _ in range(2)]
    mode = rng.choice(["retain", "siamese"])

    def run(m: Any) -> None:
        if mode == "retain":
            o = m(xs[0])
            loss = (o**2).sum() + sum(3 * (k**2).sum() for k in _kept_of(m))
            loss.backward(retain_graph=True)
            (2 * loss).backward()
        else:
            a = m(xs[0])
            ka = _kept_of(m)
            b = m(xs[1])
            kb = _kept_of(m)
            (((a - b) ** 2).sum() + sum((t**2).sum() for t in ka + kb)).backward()

    native = _native_run(model, names, run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            run(model)
    said = _said(caught)
    entries = list(monitor.history)
    for name in names:
        if name in native and any(name not in e for e in entries):
            assert any(repr(name) in s for s in said), name
        if entries and all(name in e for e in entries):
            total = math.sqrt(sum(e[name] ** 2 for e in entries))
            assert total == pytest.approx(native[name], rel=1e-5), name


def test_held_every_two_with_a_keeper_torch_and_paddle() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(_K()), nn.Tanh())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model, every=2)
        for _ in range(6):
            out = model(torch.randn(2, 4))
            ((out * out).sum() + 3 * (model[1][0].out ** 2).sum()).backward()
            assert set(monitor.history[-1]) == {"", "2", "1.0.fc", "0"}
        monitor.remove()
    assert len(monitor.history) == 3
    assert {"'1'", "'1.0'"} <= {s.split()[2] for s in _said(caught)}
    paddle = pytest.importorskip("paddle")

    class PK(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = y
            return y

    pm = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Sequential(PK()), paddle.nn.Tanh())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = GradientMonitor(pm, every=2)
        for _ in range(6):
            out = pm(paddle.randn([2, 4]))
            ((out * out).sum() + 3 * (pm[1][0].out ** 2).sum()).backward()
            assert set(monitor.history[-1]) == {"", "2", "1.0.fc", "0"}
        monitor.remove()


class _CK(nn.Module):
    def __init__(self, reentrant: bool, keep: bool) -> None:
        super().__init__()
        self.inner = nn.Sequential(_Keep(keep), nn.Linear(4, 4))
        self.reentrant = reentrant

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_held_checkpoint_with_a_keeper(reentrant: bool, keep: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _CK(reentrant, keep), nn.Linear(4, 4))

    def loss(m: Any, out: Any) -> Any:
        kept = m[1].inner[0].out
        return (out * out).sum() + (3 * (kept**2).sum() if keep else 0.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's reentrant checkpoint warnings)
        assert broken(model, _names(model), torch.randn(3, 4), loss) == []


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.calls = 0
        self.last_shape: Any = None
        self.native = False  # (torch's native hooks refuse the in-place ops)

    def forward(self, x: Any) -> Any:
        self.calls += 1
        self.last_shape = x.shape
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        if self.native:
            out = out + x
        else:
            out += x
        return self.relu(out)


class _Res(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.layer = nn.Sequential(_Block(4), _Block(4))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        h = self.pool(self.layer(self.relu(self.stem(x))))
        return self.fc(torch.flatten(h, 1))


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight
        self.params_list = [self.emb.weight, self.head.weight]

    def forward(self, t: Any) -> Any:
        return self.head(self.enc(self.emb(t)))


class _RNN(nn.Module):
    def __init__(self, states: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 5, num_layers=2, batch_first=True)
        self.gru = nn.GRU(5, 5, batch_first=True)
        self.mha = nn.MultiheadAttention(5, 1, batch_first=True)
        self.ln = nn.LayerNorm(5)
        self.out = nn.Linear(5, 2)
        self.states = states

    def forward(self, x: Any) -> Any:
        h, (hn, _) = self.lstm(x)
        g, gn = self.gru(h)
        a, _ = self.mha(g, g, g)
        total = self.out(self.ln(a + g)).pow(2).sum() + gn.pow(2).sum()
        return total + hn.sum() * 0.5 if self.states else total


def _not_inplace(ref: Any) -> None:
    for m in ref.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
        if isinstance(m, _Block):
            m.native = True


def _real_case(make: Any, x: Any) -> list[str]:
    torch.manual_seed(0)
    model = make()
    names = _names(model)
    native = native_norms(model, names, x, _real_loss, _not_inplace)
    step, said = monitored(model, x, _real_loss)
    found = []
    for name in names:
        if name in step:
            if step[name] != pytest.approx(native.get(name, -1.0), rel=1e-5):
                found.append(f"{name}: {step[name]:.4f} vs {native.get(name)}")
        elif name in native and not (".dropout" in name and any(repr(name) in s for s in said)):
            found.append(f"{name}: lost")  # (only the p=0 dropouts may go: nn.Identity-like)
    return found


def _fixed(*shape: int) -> Any:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _real_loss(model: Any, out: Any) -> Any:
    return out if out.dim() == 0 else (out.float() ** 2).sum()


def test_held_real_models_lose_nothing() -> None:
    assert _real_case(_Res, _fixed(2, 3, 6, 6)) == []
    assert (
        _real_case(
            _TiedLM, torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
        )
        == []
    )
    assert _real_case(lambda: _RNN(False), _fixed(2, 3, 4)) == []


def test_held_consumed_stays_bounded_under_evaluation() -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(10)])
    with GradientMonitor(model) as monitor:
        model(torch.randn(2, 8)).sum().backward()
        with torch.no_grad():
            for i in range(600):
                model(torch.randn(i % 7 + 1, 8))
        for i in range(600):
            model[0](torch.randn(i % 7 + 1, 8))
        assert len(monitor._step.consumed) < 200


def test_held_exception_in_forward_then_a_step() -> None:
    torch.manual_seed(0)

    class Boom(_K):
        boom = False

        def forward(self, x: Any) -> Any:
            y = super().forward(x)
            if self.boom:
                raise ValueError("boom")
            return y

    model = nn.Sequential(nn.Linear(4, 4), Boom(), nn.Tanh())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            model[1].boom = True
            with pytest.raises(ValueError):
                model(torch.randn(2, 4))
            model[1].boom = False
            out = model(torch.randn(2, 4))
            ((out * out).sum() + 3 * (model[1].out ** 2).sum()).backward()
    assert set(monitor.history[-1]) == {"", "2", "1.fc", "0"}


# ------------------------------------------------------------------ FINDING 1


class _Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _K()
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.a(x)
        out = self.b(torch.tanh(h)) + 3 * self.a.out
        self.a.out = None  # (cleaned up once read)
        return out


def test_finding1_kept_read_then_dropped_torch() -> None:
    torch.manual_seed(0)
    model = _Clean()
    # 'a': recorded 36.36, native 6.78
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


def test_finding1_generated_chains_dropping_kept_outputs() -> None:
    found = {}
    for seed in range(10):  # (at 0c76291: none of 40 seeds broken; here 28 of 40)
        model = _chain(seed, ("attr", "shared", "list", "none"), ("none", "drop", "drop_later"))
        bad = broken(model, _names(model), torch.randn(3, 4), _out_only)
        if bad:
            found[seed] = bad
    assert found == {}


class _SharedKeeper(nn.Module):
    """One keeper in two containers (a weight-shared block in two branches)."""

    def __init__(self) -> None:
        super().__init__()
        k = _K()
        self.A = nn.Sequential(k)
        self.B = nn.Sequential(k)
        self.mid = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.A(x)
        aux = self.A[0].out  # the first call's kept output, overwritten by the second call
        return self.B(torch.tanh(self.mid(h))) + 2 * aux


def test_finding1_shared_keeper_in_two_containers() -> None:
    torch.manual_seed(0)
    model = _SharedKeeper()
    # 'A': recorded 21.32, native 2.58 ('A.0' and 'B' left out, warned)
    assert broken(model, _names(model), torch.randn(3, 4), _square) == []


def _paddle_clean() -> tuple[Any, Any, dict[str, float]]:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PK(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = pnn.Linear(4, 4)
            self.out = None

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            self.out = y
            return y

    class PClean(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = PK()
            self.b = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            out = self.b(paddle.tanh(h)) + 3 * self.a.out
            self.a.out = None
            return out

    torch.manual_seed(0)
    model, x = _Clean(), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _square)
    twin = PClean()
    for t, p in ((model.a.fc, twin.a.fc), (model.b, twin.b)):
        p.weight.set_value(t.weight.detach().numpy().T.copy())
        p.bias.set_value(t.bias.detach().numpy().copy())
    return twin, paddle.to_tensor(x.numpy()), native


def test_finding1_kept_read_then_dropped_paddle() -> None:
    twin, x, native = _paddle_clean()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            out = twin(x)
            (out * out).sum().backward()
    step, said = monitor.history[-1], _said(caught)
    # 'a': recorded 36.36, native 6.78
    if "a" in step:
        assert step["a"] == pytest.approx(native["a"], rel=1e-4)
    else:
        assert any("'a'" in s for s in said)


# ------------------------------------------------------------------ FINDING 2


class _Stop(Exception):
    pass


def test_finding2_early_exit_by_exception() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _K(), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    names = _names(model)

    def probe(m: Any) -> None:
        box = {}

        def hook(module: Any, args: Any, output: Any) -> None:
            box["f"] = output
            raise _Stop

        handle = m[3].register_forward_hook(hook)
        try:
            m(x)
        except _Stop:
            pass
        handle.remove()
        ((box["f"] ** 2).sum() + 3 * (m[1].out ** 2).sum()).backward()

    native = _native_run(model, names, probe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            probe(model)
    step = monitor.history[-1]
    # '1': recorded 10.12, native 1.13, no warning
    if "1" in step:
        assert step["1"] == pytest.approx(native["1"], rel=1e-5)
    else:
        assert any("'1'" in s for s in _said(caught))


# ------------------------------------------------------------------ FINDINGS 3 and 7


class _KTag(nn.Module):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.outs: dict[int, Any] = {}
        self.keep = keep

    def forward(self, x: Any, tag: int = 0) -> Any:
        y = self.fc(x) * 1.0
        if self.keep:
            self.outs[tag] = y
        return y


class _Rec(nn.Module):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.k = _KTag(keep)

    def forward(self, x: Any, depth: int = 1) -> Any:
        h = self.k(x, depth)
        if depth:
            h = self(torch.tanh(h), depth - 1)
        return self.a(h)


def _rec_loss(model: Any, out: Any) -> Any:
    return (out * out).sum() + 3 * sum((v * v).sum() for v in model.k.outs.values())


def test_finding3_keeper_before_a_recursive_call() -> None:
    torch.manual_seed(0)
    model, x = _Rec(True), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _rec_loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            _rec_loss(model, model(x)).backward()
    # history[0]['k'] 16.25 (its uses summed), native over both calls 3.66
    for entry in monitor.history:
        if "k" in entry:
            assert entry["k"] == pytest.approx(native["k"], rel=1e-5)


@pytest.mark.xfail(strict=True, reason="FINDING 7: a recursive forward is split in two entries")
def test_finding7_recursion_after_a_module_call_splits_the_step() -> None:
    torch.manual_seed(0)
    model, x = _Rec(False), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _square)
    step, said = monitored(model, x, _square)
    # history[-1]['k'] 0.440, native 0.503 (history[-2]['k'] 0.243); two entries
    assert said == [] and set(step) == set(native)
    for name in native:
        assert step[name] == pytest.approx(native[name], rel=1e-5), name


# ------------------------------------------------------------------ FINDING 4


def test_finding4_keeper_on_a_thread_while_another_forward_runs() -> None:
    gate, go = threading.Event(), threading.Event()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = _K()
            self.b = nn.Linear(4, 4)

        def forward(self, x: Any, wait: bool = False, skip: bool = False) -> Any:
            if skip:
                return self.b(x)
            h = self.k(x)
            if wait:
                gate.set()
                go.wait(20)
            return self.b(torch.tanh(h))

    torch.manual_seed(0)
    model = Net()
    xa, xb = torch.randn(3, 4), torch.randn(3, 4)

    def loss(m: Any, out: Any) -> Any:
        return (out**2).sum() + 3 * (m.k.out**2).sum()

    native = native_norms(model, _names(model), xa, loss)
    result = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model)
        thread = threading.Thread(target=lambda: result.update(a=model(xa, wait=True)))
        thread.start()
        assert gate.wait(20)
        model(xb, skip=True)  # a whole forward meanwhile
        go.set()
        thread.join(20)
        before = len(monitor.history)
        loss(model, result["a"]).backward()
        monitor.remove()
    entries = list(monitor.history)[before:]
    said = _said(caught)
    # 'k' 12.87 where native is 1.73, no warning
    for entry in entries:
        if "k" in entry:
            assert entry["k"] == pytest.approx(native["k"], rel=1e-5)
        else:
            assert any("'k'" in s for s in said)


# ------------------------------------------------------------------ FINDING 5


class _SaveIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        self.inp = x
        return self.fc(x)


@pytest.mark.xfail(
    strict=True,
    reason="known limit (README): a module keeping its argument leaves out its maker, warned "
    "(helper-95's FINDING 1: a hook keeping the maker's raw output there looks the same)",
)
def test_finding5_module_holding_its_input() -> None:
    torch.manual_seed(0)
    model, x = (
        nn.Sequential(nn.Linear(4, 4), nn.Tanh(), _SaveIn(), nn.Linear(4, 4)),
        torch.randn(3, 4),
    )
    native = native_norms(model, _names(model), x, _square)
    step, said = monitored(model, x, _square)
    # '1' (the Tanh whose output _SaveIn holds) left out with the warning
    assert said == [] and set(step) == set(native)


@pytest.mark.xfail(
    strict=True,
    reason="known limit (README): a module keeping its argument leaves out its maker, warned "
    "(helper-95's FINDING 1: a hook keeping the maker's raw output there looks the same)",
)
def test_finding5_kfac_input_capture_pre_hooks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(3, 4)

    def capture(root: Any) -> Any:
        handles = [
            m.register_forward_pre_hook(lambda m, args: setattr(m, "a_in", args[0]))
            for m in root
            if isinstance(m, nn.Linear)
        ]
        return lambda: [h.remove() for h in handles]

    native = native_norms(model, _names(model), x, _square, capture)
    step, said = monitored(model, x, _square, capture)
    # '1' and '2' left out with the warning (0c76291: recorded, native)
    assert said == [] and set(step) == set(native)
    assert all(step[n] == pytest.approx(native[n], rel=1e-5) for n in native)


@pytest.mark.xfail(
    strict=True,
    reason="known limit (README): a module keeping its argument leaves out its maker, warned "
    "(helper-95's FINDING 1: a hook keeping the maker's raw output there looks the same)",
)
def test_finding5_module_holding_its_input_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class SaveIn(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            self.inp = x
            return self.fc(x)

    paddle.seed(0)
    model = pnn.Sequential(pnn.Linear(4, 4), pnn.Tanh(), SaveIn(), pnn.Linear(4, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            out = model(paddle.randn([3, 4]))
            (out * out).sum().backward()
    assert _said(caught) == []
    assert set(monitor.history[-1]) == {"", "0", "1", "2", "2.fc", "3"}


# ------------------------------------------------------------------ FINDING 6


class _Table(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.table = [[i] * 256 for i in range(rows)]  # (each container <= 256 items)
        self.d = {str(i): {str(j): j for j in range(256)} for i in range(rows)}

    def forward(self, x: Any) -> Any:
        return self.fc(x)


def _ids_per_forward(model: Any, where: Any, monkeypatch: Any) -> int:
    counted = [0]
    original = monitor_module._objects_within

    def counting(values: list[Any], deeper: int, ids: list[int], *args: Any, **kw: Any) -> None:
        before = len(ids)  # (the ids a look gathers, its nested calls' too)
        original(values, deeper, ids, *args, **kw)
        if args[1:2] != (False,):  # (a look, not a nested call: counted once)
            counted[0] += len(ids) - before

    monkeypatch.setattr(monitor_module, "_objects_within", counting)
    with GradientMonitor(model, where=where):
        counted[0] = 0
        model(torch.randn(1, 2))
    return counted[0]


def test_finding6_nested_small_containers_walked_every_forward(monkeypatch: Any) -> None:
    model = nn.Sequential(*[_Table(256) for _ in range(4)])
    # ~525,000 ids a forward (32 ms; 0c76291: 0.2 ms), also with where=["0"]
    assert _ids_per_forward(model, ["0"], monkeypatch) < 20_000


@pytest.mark.skipif(not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing")
def test_finding6_timed() -> None:
    """Per forward, best of 5 (measured: 32.5 ms vs 0.03 ms without the monitor)."""
    model = nn.Sequential(*[_Table(256) for _ in range(4)])
    x = torch.randn(1, 2)

    def per_forward() -> float:
        best = math.inf
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(10):
                model(x)
            best = min(best, (time.perf_counter() - start) / 10)
        return best

    bare = per_forward()
    with GradientMonitor(model, where=["0"]):
        watched = per_forward()
    print(f"FINDING 6: {watched * 1e6:.0f} us vs {bare * 1e6:.0f} us per forward")
    if watched > bare + 2e-3:
        pytest.xfail(f"FINDING 6: {watched * 1e3:.1f} ms vs {bare * 1e3:.2f} ms")


@pytest.mark.skipif(not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing")
def test_held_cost_per_module_with_a_narrow_where() -> None:
    """The end walk: ~4 us a module a forward (README); measured 1818 vs 914 us (N=200)."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2, 2), nn.Tanh()) for _ in range(100)])
    x = torch.randn(1, 2)

    def per_forward() -> float:
        best = math.inf
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(50):
                model(x)
            best = min(best, (time.perf_counter() - start) / 50)
        return best

    bare = per_forward()
    with GradientMonitor(model, where=["0"]):
        watched = per_forward()
    per_module = (watched - bare) / 201
    print(f"end walk: {per_module * 1e6:.1f} us per module per forward")
    assert per_module < 20e-6


# ------------------------------------------------------------------ FINDING 8


_State = collections.namedtuple("_State", "h c")


class _KState(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.how = how
        self.state: Any = None

    def forward(self, x: Any) -> Any:
        y = torch.tanh(self.fc(x)) * 1.0
        if self.how == "tuple":
            self.state = (y, y * 0)
        elif self.how == "namedtuple":
            self.state = _State(y, y * 0)
        else:  # (another object: README's "Left")
            self.state = types.SimpleNamespace(h=y)
        return y


def _state_loss(model: Any, out: Any) -> Any:
    state = model[1].state
    kept = state.h if not isinstance(state, tuple) or hasattr(state, "_fields") else state[0]
    return (out * out).sum() + 3 * (kept * kept).sum()


def test_held_tuple_state_attribute() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _KState("tuple"), nn.Linear(4, 4))
    assert broken(model, _names(model), torch.randn(3, 4), _state_loss) == []


def test_finding8_namedtuple_state_attribute() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _KState("namedtuple"), nn.Linear(4, 4))
    # '1': recorded 8.26, native 1.84
    assert broken(model, _names(model), torch.randn(3, 4), _state_loss) == []


# ------------------------------------------------------------------ FINDING 9


def test_finding9_module_set_in_after_the_monitor() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)), nn.Tanh())
    x = torch.randn(3, 4)

    def loss(m: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (m[1][0].out ** 2).sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model)
        model[1][0] = _K()  # a head replaced
        native = native_norms(model, _names(model), x, loss)
        loss(model, model(x)).backward()
        monitor.remove()
    step = monitor.history[-1]
    # '1': recorded 13.58, native 2.02, no warning
    if "1" in step:
        assert step["1"] == pytest.approx(native["1"], rel=1e-5)
    else:
        assert any("'1'" in s for s in _said(caught))


def test_finding9_paddle_module_set_in_after_the_monitor() -> None:
    """The same in paddle: the keeper's container is left out, warned (no native oracle)."""
    paddle = pytest.importorskip("paddle")

    class K(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)
            self.out: Any = None

        def forward(self, x: Any) -> Any:
            self.out = self.fc(x) * 1.0
            return self.out

    paddle.seed(0)
    lin = paddle.nn.Linear
    model = paddle.nn.Sequential(lin(4, 4), paddle.nn.Sequential(lin(4, 4)), paddle.nn.Tanh())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model)
        model[1][0] = K()
        out = model(paddle.randn([3, 4]))
        ((out * out).sum() + 3 * (model[1][0].out ** 2).sum()).backward()
        monitor.remove()
    assert "1" not in monitor.history[-1]
    assert any("'1'" in s for s in _said(caught))


# ------------------------------------------------------------------ FINDING 10


@pytest.mark.xfail(strict=True, reason="FINDING 10: nested tuple outputs torch's hook leaves out")
def test_finding10_lstm_states_in_the_loss() -> None:
    # 'lstm': recorded 4.98, native 4.45 (torch's hook: the top-level `out` only)
    assert _real_case(lambda: _RNN(True), _fixed(2, 3, 4)) == []


# ------------------------------------------------------------------ FINDING 11


def test_finding11_model_and_monitor_leak_after_remove() -> None:
    model = nn.Sequential(nn.Linear(4, 4), _K(), nn.Tanh())
    model.register_buffer("big", torch.zeros(1000, 1000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        monitor = GradientMonitor(model)
        out = model(torch.randn(2, 4))
        (out.sum() + model[1].out.sum()).backward()
        monitor.remove()
    refs = weakref.ref(model), weakref.ref(monitor)
    del out, model, monitor
    gc.collect()
    assert [r() for r in refs] == [None, None]


# ------------------------------------------------------------------ FINDING 12


class _Forces(nn.Module):
    """An energy model computing forces as -dE/dpos inside its forward (interatomic
    potentials), under ``enable_grad`` so that it runs in an evaluation under no_grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, pos: Any) -> Any:
        with torch.enable_grad():
            if not pos.requires_grad:
                pos = pos.detach().requires_grad_(True)
            energy = self.b(torch.tanh(self.a(pos))).sum()
            forces = -torch.autograd.grad(energy, pos, create_graph=self.training)[0]
        return energy, forces


def _force_loss(model: Any, out: Any) -> Any:
    return out[0] + (out[1] ** 2).sum()


def test_held_forces_in_the_forward_train_step_is_native() -> None:
    torch.manual_seed(0)
    model = _Forces()
    assert broken(model, ["", "a", "b"], torch.randn(5, 3), _force_loss) == []


def test_finding12_evaluation_with_inner_grad_changes_the_last_entry() -> None:
    torch.manual_seed(0)
    model = _Forces()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            _force_loss(model, model(torch.randn(5, 3))).backward()
            recorded = dict(monitor.history[-1])
            model.eval()
            with torch.no_grad():
                for _ in range(3):
                    model(torch.randn(5, 3))
    # 'b' 3.16 -> 5.00, 'a' 1.57 -> 2.56 after three evaluation forwards
    assert len(monitor.history) == 1 and dict(monitor.history[0]) == recorded


# ------------------------------------------------------------------ MindSpore (FINDINGS 1, 5)

_MS_SCRIPT = (
    MINDSPORE_DENSES
    + r"""


class K(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = dense(0)
        self.out = None

    def construct(self, t):
        y = self.fc(t) * 1.0
        self.out = y
        return y


class Clean(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = K()
        self.b = dense(1)

    def construct(self, t):
        h = self.a(t)
        out = self.b(ms.ops.tanh(h)) + 3 * self.a.out
        self.a.out = None
        return out


class SaveIn(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = dense(1)

    def construct(self, t):
        self.inp = t
        return self.fc(t)


found = {}
for case in ("clean", "savein"):
    net = Clean() if case == "clean" else ms.nn.SequentialCell([dense(0), ms.nn.Tanh(), SaveIn()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradientMonitor(net) as monitor:
            ms.grad(lambda t: (net(t) ** 2).sum())(x)
    said = [str(c.message) for c in caught if "GradientMonitor" in str(c.message)]
    found[case] = [dict(monitor.history[-1]), said]
json.dump({"found": found, "w": [a.tolist() for a in w], "b": [a.tolist() for a in b],
           "x": x.asnumpy().tolist()}, sys.stdout)
"""
)


def _mindspore_run() -> dict[str, Any]:
    return run_in_mindspore(_MS_SCRIPT)


def test_finding1_and_known_limit_5_mindspore() -> None:
    run = _mindspore_run()
    w, b = [torch.tensor(a) for a in run["w"]], [torch.tensor(a) for a in run["b"]]
    torch_model = _Clean()
    with torch.no_grad():
        for layer, i in ((torch_model.a.fc, 0), (torch_model.b, 1)):
            layer.weight.copy_(w[i])
            layer.bias.copy_(b[i])
    native = native_norms(torch_model, ["", "a", "a.fc"], torch.tensor(run["x"]), _square)
    step, said = run["found"]["clean"]
    # the twin is the same model: the root's and a.fc's norms agree with torch's
    assert step[""] == pytest.approx(native[""], rel=1e-4)
    assert step["a.fc"] == pytest.approx(native["a.fc"], rel=1e-4)
    # 'a': recorded 77.50 (= 'a.fc', both uses), no warning; native 7.11
    assert ("a" not in step and any("'a'" in s for s in said)) or step["a"] == pytest.approx(
        native["a"], rel=1e-4
    )
    step, said = run["found"]["savein"]
    # '1' (the Tanh whose output SaveIn holds) left out with the warning: a known limit
    assert set(step) == {"", "0", "2", "2.fc"} and any("'1'" in s for s in said)


# ------------------------------------------------------------------ held: mixed generator


class _Node(nn.Module):
    """A block doing one of several things with its child: a plain Linear, a keeper (a dict
    attribute), a parent keeping its child's output, a child called twice, an nn.Identity
    after the child, a residual, an auxiliary module fed with the child's output."""

    KINDS = ("lin", "keep", "parentkeep", "twice", "identity_after", "residual", "aux")

    def __init__(self, rng: random.Random, depth: int) -> None:
        super().__init__()
        self.kind = rng.choice(self.KINDS if depth < 2 else ("lin", "keep"))
        self.fc = nn.Linear(4, 4)
        if self.kind in self.KINDS[2:]:
            self.child = _Node(rng, depth + 1)
        if self.kind == "identity_after":
            self.idn = nn.Identity()
        if self.kind == "aux":
            self.other = nn.Linear(4, 4)
        self.store: dict[str, Any] = {}

    def forward(self, x: Any) -> Any:
        kind = self.kind
        if kind == "lin":
            return torch.tanh(self.fc(x))
        if kind == "keep":
            y = torch.tanh(self.fc(x)) * 1.0
            self.store["y"] = y
            return y
        if kind == "parentkeep":
            self.h = self.child(x)
            return self.fc(self.h)
        if kind == "twice":
            return self.child(torch.tanh(self.child(x)))
        if kind == "identity_after":
            return self.idn(self.child(self.fc(x)))
        if kind == "residual":
            return x + self.child(x)
        h = self.child(x)
        self.aux_v = self.other(h)
        return h


def _mixed(seed: int) -> tuple[Any, list[str], Any, Any, Any, bool]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(*[_Node(rng, 0) for _ in range(rng.randint(2, 4))])
    weights = [rng.choice([0.0, 1.0, 3.0]) for _ in range(40)]
    names = _names(model)
    hooks = [(n, rng.choice(["mod", "root"])) for n in names[1:] if rng.random() < 0.2]
    first = rng.random() < 0.5

    def prepare(root: Any) -> Any:
        root.caps = {}
        handles = []
        for name, where in hooks:

            def hook(m: Any, i: Any, o: Any, name: str = name, where: str = where) -> None:
                if where == "mod":
                    m.cap = o
                else:
                    root.caps[name] = o

            handles.append(root.get_submodule(name).register_forward_hook(hook))
        return lambda: [h.remove() for h in handles]

    def loss(root: Any, out: Any) -> Any:
        total = 2.0 * (out * out).sum()
        reads = []
        for m in root.modules():
            if isinstance(m, _Node):
                reads += [m.store["y"]] if "y" in m.store else []
                reads += [m.h] if m.kind == "parentkeep" and hasattr(m, "h") else []
                reads += [m.aux_v] if m.kind == "aux" and hasattr(m, "aux_v") else []
        reads += list(getattr(root, "caps", {}).values())
        reads += [m.cap for m in root.modules() if "cap" in vars(m)]
        for weight, read in zip(weights, reads):
            if weight:
                total = total + weight * (read * read).sum()
        return total

    return model, names, torch.randn(3, 4), loss, prepare, first


@pytest.mark.parametrize("seed", [64, 66, 68, 72, 77, 79])
def test_held_mixed_keepers_captures_parents_identities(seed: int) -> None:
    """0 of 80 seeds broken at e6e1153 (50 of 80 at 0c76291: these six among them)."""
    model, names, x, loss, prepare, first = _mixed(seed)
    assert broken(model, names, x, loss, prepare, first=first) == []


# ------------------------------------------------------------------ FINDING 13


def test_finding13_forwards_on_two_threads_raise() -> None:
    import sys

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(300)])
    errors: list[str] = []
    stop = threading.Event()
    start = time.monotonic()

    def work() -> None:
        x = torch.randn(1, 2)
        while not stop.is_set() and time.monotonic() - start < 5:
            try:
                model(x)
            except RuntimeError as error:  # (the monitor's, from its forward pre-hook)
                errors.append(str(error))
                stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with GradientMonitor(model):
            threads = [threading.Thread(target=work) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        sys.setswitchinterval(interval)
    # "dictionary changed size during iteration" within 0.1-2 s (5 runs of 5)
    assert errors == []
