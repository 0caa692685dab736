"""helper-95's attack on 156f05d: GradientMonitor's look for kept outputs after this
morning's changes (`monitor._keeps` per call, `_kept` at the end of the forward in every
module, `_Step.readers` / `_encloses`, `_Step.shared`, the no-gradient flag of `_running_on`,
the weak monitor in `_gradient_of`, `_keep_hooked`'s copies).

Oracle: `tests/monitor_oracle.py` (torch's native ``register_full_backward_pre_hook`` on a
deep copy; the norm over a module's calls). The promise: a module's entry equals that norm
(rel 1e-5), or the module is absent from the step AND a RuntimeWarning containing
"GradientMonitor" names it; never a silently wrong number; ordinary models lose nothing.
"REGRESSION" means 0c76291 (a worktree of it, /tmp/oldmain) gave the native norm or left the
module out with the warning, and 156f05d does not.

HELD (pinned below unless said):

- Generated chains (`_Net`: 2-5 blocks, some called twice on their own output, residuals,
  blocks keeping their output) with random captures of the user's registered after the
  monitor: a forward PRE-hook keeping its module's argument (K-FAC), a forward hook keeping
  the output on its own module or on the model; random ``where=`` in 40%; the loss reading
  every capture with random weights: 0 of 200 seeds broken (8 pinned; 5 of those 8 broken at
  0c76291). With captures on ANOTHER module: FINDINGS 1 and 2.
- Generated parents keeping a block's output on another module in their own code (the alias
  torch hands them), blocks keeping their input (``self.inp = x``) or their output in a dict
  attribute, a shared block, blocks called twice, residuals, random ``where=``: 0 of 200
  seeds broken (0c76291: 23 of 200), but 550 of 2366 native entries lost (warned; 176 at
  0c76291): the documented parent-keeps-child-output leave-out and FINDINGS 3, 4 (by hand).
- K-FAC pre-hooks on every Linear, every module monitored: native, no warning.
- The whole model under ``torch.utils.checkpoint``, reentrant (the first forward under
  no_grad, the recomputation in backward with grad) and not: one entry, native.
- A block returning its layer's output after an auxiliary layer inside read it, every
  module monitored: native or warned (`_inner_output`; with ``where=`` the blocks only:
  FINDING 8).
- A pre-norm ViT (3 TransformerEncoderLayers) with K-FAC pre-hooks on every Linear and
  capture hooks on every LayerNorm read by the loss: nothing broken; lost only the p=0
  dropouts (documented) and the captured norms (rightly: the captures are raw); by hand.
- Three threads x 60 training steps (and no_grad forwards) of a 40-block model with keepers
  and K-FAC pre-hooks: no exception (by hand, one run).
- Where 156f05d loses more than 0c76291 in the second generator without parent stashes
  (359 vs 159 of 2422 native entries; 60 seeds compared): a parent's dict state holding its
  child's output (README's documented leave-out) and FINDING 4, nothing else.
- ``every=2`` over six steps with no_grad evaluation forwards before and after each, a
  keeper read by the loss and K-FAC pre-hooks: three entries, each the native norms of its
  step, keeper and container warned (by hand).
- A model calling itself under ``no_grad`` inside its training forward (a mean teacher on
  the same weights), also under a non-reentrant ``checkpoint`` of the whole model, ``every``
  1 and 2: one entry per recorded step, native (by hand).
- A reader keeping what it got through a keyword argument, a list or a dict argument
  (``self.r(x=h)``, ``self.r(items=[h])``, ``self.r(d={"h": h})``): native (by hand).
- ``del monitor`` without ``remove()``, a backward pending: the model's hooks keep the
  monitor, that backward and later ones are recorded (by hand).
- Memory: a user keeping every step's loss tensor (not ``.item()``) keeps each step's graph
  nodes and, through the root output's hook, its `_Step`: +57 KB RSS a step over the 168 KB
  without the monitor (0c76291: +50 KB), 6-layer TransformerEncoder; not a finding.
- Odd attribute values do not crash the forward: a dict / list subclass whose ``values``,
  ``__iter__``, ``__len__`` raise (the base types' methods are used), a list holding itself,
  a 100,000-item tuple, ``__torch_function__`` tensor subclasses (alone, in a list). (An
  object whose ``__class__`` raises: FINDING 6.)
- `_encloses` by dotted prefix: a K-FAC holder 'layer10' of what 'layer1' made leaves
  'layer1' recorded, native, no warning.
- Gradient accumulation (three forward+backward, or three forwards and one backward): one
  entry per forward, as documented (by hand).
- Cost (1 torch thread, best of 7 x 10 steps, load ~1.5 from another helper; by hand, see
  the slow test): `_keeps` 3.5 us a call on a Linear, 4.5 on a TransformerEncoderLayer, 5.1
  on a MultiheadAttention; the end walk 3.9 us a module (0.47 ms for a 12-layer
  TransformerEncoder's 122 modules). A training step of a small CNN (6 x Conv/BN/ReLU, pool,
  Linear; batch 8 x 3 x 16 x 16): no monitor 7.4-8.0 ms, 156f05d 9.8-10.9 ms, 0c76291
  8.2-9.7 ms; a 12-layer TransformerEncoder (d=64, 4 x 16 tokens): no monitor 5.7-7.1 ms,
  156f05d 10.4-12.0 ms, 0c76291 9.8-11.4 ms: about +0.6-1 ms a step over 0c76291 (noisy),
  the monitor itself +70-85% on the transformer. Not pinned as a finding.

FINDINGS (strict xfails below), numbered as found; by severity: medium-high 1; medium 2, 5,
8; medium-low 3, 6, 9; low-medium 4, 11; low 7, 10.

1. FIXED (the readers rule is gone: every call hooked on an output a module holds at the end
   of the forward is left out). (medium-high: silently wrong norm; torch, paddle AND
   MindSpore; a regression of
   `_Step.readers` (7966f56) against e6e1153, which left the producer out; 0c76291 wrong
   too) a user's hook capturing a layer's RAW output (forward hooks run before torch wraps
   the output for the module's backward hook) on the module that then CONSUMES it: the
   readers rule takes the holder for one keeping the alias torch handed it and records the
   producer. ``h = self.a(x); return self.r(h)``, ``a.register_forward_hook(lambda m, i, o:
   setattr(model.r, "feat", o))``, loss ``(out * out).sum() + 3 * (model.r.feat ** 2).sum()``:
   'a' recorded 13.71 where native is 2.66, no warning (paddle 12.87 vs 1.73; MindSpore
   26.54 vs 2.26). A neck reading hook-captured backbone features (``neck.feats``) and called
   on the last one is this. Generated (`_generated` with captures on another module): 6 of
   300 seeds broken (with FINDING 2). Expected: the producer left out (a holder that got the
   tensor proves nothing about which object it holds when a hook of the producer's stored
   it; e.g. apply the readers rule only where no forward hook of the user's ran on the
   producer, or only to arguments kept by the reader's own call).
2. FIXED (as 1: no readers). (medium: silently wrong norm; torch and paddle, MindSpore left
   it out; a regression of
   7966f56 against e6e1153, as FINDING 1; 0c76291 wrong too) `_Step.readers`
   (and `consumed`) are keyed by ``id`` with no weak reference: a dead argument's id goes to
   a later output, and a module that never got that output counts as its reader.
   ``return self.b(self.t(self.a(x))) * 1.0`` (Tanh saves its result only, so a's output
   dies after t's call and b's output takes its id), a hook keeping b's output on ``t``:
   'b' recorded 10.97 where native is 2.74, no warning (paddle the same). Expected: 'b' left
   out (store a weak reference with the reader names and check it, as `hooked` does).
5. (medium: silently wrong norm; not a regression; README says the per-call look sees "an
   output kept, read by a later part of the forward and dropped before its end") a capture
   hook registered AFTER the monitor keeps a layer's output on the layer, the model's forward
   reads it and clears it (timm's FeatureHookNet clears its captures after reading; keeping
   them on the module is what README advises): the per-call look ran before the user's hook
   and the end walk finds nothing: 'body.0' 1.35 where native is 0.33, no warning (paddle
   the same; the hook registered before the monitor: left out, warned). Expected: left out
   (look again after the module's other forward hooks, e.g. an always_call hook registered
   last at each call), or README listing it among what is left.
8. (medium: silently wrong norm; not a regression) ``where=`` selecting blocks and not their
   layers (``where=lambda n, m: isinstance(m, Block)``): a block returning its first layer's
   output after an auxiliary layer inside it read it (``h = self.pre(x); self.aux =
   self.inner(h); return h``) is recorded with the inner use and the aux loss summed in:
   `_inner_output` only knows calls the monitor hooked (`_before`, `hooked` follow `where`):
   'b' 4.83 where native is 1.94, no warning. Expected: left out (track arguments and
   outputs of every module, or treat an unmonitored child's output returned by a block as
   unknown).
3. KNOWN LIMIT since FINDING 1's fix (README): every holder of an argument leaves out its
   maker, warned. (medium-low: modules lost that torch records, warned; REGRESSION) FINDING 5 of
   helper-94
   (a holder of its argument) fixed only for monitored holders: `_Step.readers` holds
   monitored modules only, so with ``where=`` leaving the holders out (K-FAC pre-hooks on
   every Linear, the monitor on the activations or the blocks) every producer of a Linear's
   input is left out: ``Sequential(Linear, Tanh, Linear, Tanh, Linear)``, ``where=["1",
   "3"]``: both left out (0c76291: both native). Expected: recorded (readers from every
   module's calls).
6. FIXED (`_ids_within` tests ``type(value)``). (medium-low: crash; REGRESSION) `_ids_within`
   calls ``isinstance`` on every attribute
   value and item: an object whose ``__class__`` raises (werkzeug's LocalProxy outside a
   request, a lazy proxy whose factory fails; ``isinstance`` reads ``__class__``, which a
   proxy forwards, possibly evaluating a lazy object) inside a dict or list attribute makes
   every forward raise: ``model[0].context = {"request": proxy}`` -> RuntimeError out of
   ``model(x)`` (0c76291 ran: it compared ``type(value)``). Expected: no exception (test
   ``type(value)`` against the container types, or ``issubclass(type(value), ...)``).
9. FIXED for ``grad`` and ``vjp`` (the torch backend's `sum_squares` reduces functorch's
   wrapper with torch ops); for ``vmap(grad(...))`` since 2026-12-03 (it reads the values
   under functorch's wrappers: tests/test_vmap.py checks the norms). (medium-low: crash)
   ``torch.func.grad`` (MAML, per-sample gradients
   with ``vmap(grad(...))``, ``functional_call``) over a monitored model: the tensor hook
   receives functorch's GradTrackingTensor and `ops.sum_squares` raises "Cannot access data
   pointer of Tensor that doesn't have storage" out of the transform (torch's own module
   backward hooks refuse torch.func too, but the monitor uses tensor hooks to avoid such
   limits). Expected: no exception (the step recorded, or left out with a warning).
4. KNOWN LIMIT since FINDING 1's fix, as 3. (low-medium: a module lost that torch records,
   warned; REGRESSION) a cell applied to its
   own output whose call keeps its argument (a K-FAC pre-hook on an RNN-style cell,
   ``self.k(self.k(x))``): the holder is a reader, and `_encloses("k", "k")` leaves out the
   producer 'k' itself, whose first call made the tensor its second call got (0c76291:
   native). Expected: only modules around the READING call go (by call, not by name).
7. FIXED (a RuntimeWarning names the module, once). (low: silently absent; documented in
   README; a consequence of helper-94's FINDING 12 fix,
   0c76291 recorded it where no step came before) a model called under ``no_grad`` that
   trains a head under ``enable_grad`` (a frozen body): the head's gradient comes, torch's
   hook sees it, the monitor records nothing and says nothing (paddle the same). Expected:
   the head recorded in an entry of its own, or a warning naming it.
10. FIXED 2026-12-04 (`unihook.ops.slot_values`, read by every backend's `attribute_values`).
   (low: silently wrong norm; not a regression; README: "an attribute") an output kept in a
   ``__slots__`` attribute of the module (``__slots__ = ("out",)``; ``self.out = y``) is in
   no ``__dict__``: 'k' 12.87 where native is 1.73, no warning. Expected: left out (read the
   slots of the module's class too), or README saying ``__dict__`` only.
11. FIXED (the per-call look at the first level only; the end walk looks deeper once).
   (low-medium: slowdown; REGRESSION) the per-call look (`_keeps`) walks the module's
   nested containers at EVERY call, up to the ~4096-object budget: an RNN-style cell holding
   a lookup table (``self.table = [list(range(256)) for _ in range(32)]``, no tensor in it),
   unrolled 200 times a forward: 49.6 ms a training step where 0c76291 took 13.8 ms (no
   monitor 4.2 ms; the same cell without the table 15.8 ms); ``where=["cell"]`` 42.0 ms vs
   9.1 ms; 32 x 32: 28.1 vs 14.4 ms; 8 x 64: 20.1 vs 14.1 ms (0c76291 does not depend on the
   table). About 170 us a call (h94's FINDING 6 bounded the walk per module, not per call).
   Pinned by the ids walked (~830,000 a forward). Expected: a call's cost independent of
   containers holding no output (e.g. the per-call look at the first level only, the deeper
   levels once at the end; or remember containers seen without tensors by id and length).

Not covered for lack of time: distributed merges, torch.compile, threads beyond one run and
reading the code (`_held`'s ``keys & set(ids)`` is one C-level pass under the GIL), MindSpore
beyond FINDINGS 1 and 2.
"""

from __future__ import annotations

import math
import os
import random
import warnings
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

from unihook.recipes import GradientMonitor  # noqa: E402

_names, _said, _square = names, said, square  # (local variables are named `said`)

_native_run = native_run


def _monitor_run(model: Any, run: Any, **kwargs: Any) -> tuple[list[dict[str, float]], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model, **kwargs) as monitor:
            run(model)
    return [dict(entry) for entry in monitor.history], _said(caught)


# ------------------------------------------------------------------ held


class _Blk(nn.Module):
    """A Linear (and a Tanh), keeping its output as ``self.mine`` when `keep`."""

    def __init__(self, tanh: bool, keep: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.Tanh() if tanh else None
        self.keep = keep

    def forward(self, x: Any) -> Any:
        y = self.fc(x)
        if self.act is not None:
            y = self.act(y)
        if self.keep:
            self.mine = y
        return y


class _Net(nn.Module):
    """A chain of `_Blk`, some called twice on their own output, some with a residual."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        n = rng.randint(2, 5)
        self.blocks = nn.ModuleList(_Blk(rng.random() < 0.5, rng.random() < 0.2) for _ in range(n))
        self.twice = [rng.random() < 0.3 for _ in range(n)]
        self.res = [rng.random() < 0.3 for _ in range(n)]

    def forward(self, x: Any) -> Any:
        h = x
        for block, twice, res in zip(self.blocks, self.twice, self.res):
            y = block(block(h)) if twice else block(h)
            h = y + h if res else y
        return h


_KINDS = ("pre_self", "fwd_self", "fwd_model", "fwd_other")


def _generated(seed: int, kinds: tuple[str, ...]) -> list[str]:
    """A random `_Net` with random captures of the user's (a forward pre-hook keeping its
    module's argument, K-FAC style; a forward hook keeping the output on its module, on the
    model, or on ANOTHER module), registered after the monitor; a loss reading every capture
    with random weights; a random `where=` in 40%."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    net = _Net(rng)
    modules = [name for name in _names(net) if name]
    plan = []
    for i in range(rng.randint(1, 4)):
        plan.append((rng.choice(kinds), rng.choice(modules), rng.choice(modules), f"k{i}"))
    weights = [rng.random() * 3 for _ in plan]
    reads = [rng.random() < 0.7 for _ in net.blocks]

    def holder_of(model: Any, kind: str, on: str, other: str) -> Any:
        if kind == "fwd_model":
            return model
        return model.get_submodule(other if kind == "fwd_other" else on)

    def prepare(model: Any) -> Any:
        handles = []
        for kind, on, other, attr in plan:
            module, holder = model.get_submodule(on), holder_of(model, kind, on, other)
            if kind == "pre_self":
                hook = lambda m, a, attr=attr: setattr(m, attr, a[0])  # noqa: E731
                handles.append(module.register_forward_pre_hook(hook))
            else:
                hook = lambda m, a, o, attr=attr, h=holder: setattr(h, attr, o)  # noqa: E731
                handles.append(module.register_forward_hook(hook))
        return lambda: [handle.remove() for handle in handles]

    def loss(model: Any, out: Any) -> Any:
        total = (out * out).sum()
        for (kind, on, other, attr), weight in zip(plan, weights):
            kept = getattr(holder_of(model, kind, on, other), attr, None)
            if isinstance(kept, torch.Tensor) and kept.requires_grad:
                total = total + weight * (kept * kept).sum()
        for block, read in zip(model.blocks, reads):
            if block.keep and read:
                total = total + (block.mine**2).sum()
        return total

    names = _names(net)
    kwargs: dict[str, Any] = {}
    if rng.random() < 0.4:
        names = kwargs["where"] = rng.sample(names, rng.randint(1, len(names)))
    return broken(net, names, torch.randn(3, 4), loss, prepare, **kwargs)


@pytest.mark.parametrize("seed", [0, 3, 7, 11, 16, 23, 42, 99])
def test_held_generated_captures_on_their_own_module_or_the_model(seed: int) -> None:
    # 0 of 200 seeds broken by hand (captures on another module: FINDINGS 1 and 2)
    assert _generated(seed, _KINDS[:3]) == []


def test_held_kfac_pre_hooks_on_every_linear_are_native() -> None:
    # (since helper-95's FINDING 1 fix the Tanh whose output a Linear's pre-hook keeps is left
    # out, warned: `test_known_limit_kfac_pre_hooks_leave_out_the_makers`)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    assert broken(model, _names(model), torch.randn(3, 4), _square, _kfac) == []


@pytest.mark.xfail(
    strict=True,
    reason="known limit (README): a module keeping its argument leaves out its maker, warned "
    "(a hook keeping the maker's raw output there looks the same: FINDING 1)",
)
def test_known_limit_kfac_pre_hooks_leave_out_the_makers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    step, said = monitored(model, torch.randn(3, 4), _square, _kfac)
    assert said == [] and set(step) == set(_names(model))


@pytest.mark.parametrize("reentrant", [True, False])
def test_held_whole_model_checkpointed(reentrant: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(3, 4, requires_grad=True)

    def run(model: Any) -> None:
        (checkpoint(model, x, use_reentrant=reentrant) ** 2).sum().backward()

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    native = _native_run(model, _names(model), run)
    entries, said = _monitor_run(model, run)
    assert said == [] and len(entries) == 1 and set(entries[0]) == set(native)
    assert all(entries[0][n] == pytest.approx(native[n], rel=1e-5) for n in native)


class _Sub(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class _RaisingDict(dict):  # type: ignore[type-arg]
    def values(self) -> Any:
        raise RuntimeError("values")

    def __iter__(self) -> Any:
        raise RuntimeError("iter")

    def __len__(self) -> int:
        raise RuntimeError("len")


class _RaisingList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("iter")

    def __len__(self) -> int:
        raise RuntimeError("len")


def _weird_values() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return [
        _RaisingDict(a=1),
        _RaisingList([1, 2]),
        looped,
        tuple(range(10**5)),
        torch.randn(3).as_subclass(_Sub),
        [torch.randn(3).as_subclass(_Sub)],
        {"a": {"b": [looped]}},
    ]


def test_held_weird_attribute_values_do_not_crash() -> None:
    for value in _weird_values():
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        model[0].weird = value
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with GradientMonitor(model) as monitor:
                model(torch.randn(2, 4)).sum().backward()
        assert set(monitor.history[-1]) == {"", "0", "1"}


class _Prefix(nn.Module):
    """'layer1' makes what 'layer10' gets (and keeps: a K-FAC pre-hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.layer10 = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.layer10(self.layer1(x))


def test_held_dotted_prefixes() -> None:
    torch.manual_seed(0)
    model = _Prefix()
    assert broken(model, _names(model), torch.randn(3, 4), _square, _kfac) == []


# ------------------------------------------------------------------ FINDING 1


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.r = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.r(self.a(x))


def _on_consumer(model: Any) -> Any:
    # the user's capture: a's raw output, kept on the module that consumes it
    return model.a.register_forward_hook(lambda m, i, o: setattr(model.r, "feat", o)).remove


def _pair_loss(model: Any, out: Any) -> Any:
    return (out * out).sum() + 3 * (model.r.feat**2).sum()


def test_finding1_hook_keeps_the_raw_output_on_its_reader() -> None:
    torch.manual_seed(0)
    model = _Pair()
    # 'a': recorded 13.71, native 2.66, no warning
    assert broken(model, _names(model), torch.randn(3, 4), _pair_loss, _on_consumer) == []


@pytest.mark.parametrize("seed", [39, 111, 130, 187, 200, 279])
def test_finding1_generated_captures_on_another_module(seed: int) -> None:
    # 6 of 300 seeds broken with captures on another module (FINDINGS 1 and 2); 130's
    # number is below native (the sum of two gradients may be shorter)
    assert _generated(seed, _KINDS) == []


def _paddle_twin(pnn: Any, torch_model: Any) -> Any:
    class PTriple(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = pnn.Linear(4, 4)
            self.t = pnn.Tanh()
            self.b = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.b(self.t(self.a(x))) * 1.0

    twin = PTriple()
    for name in ("a", "b"):
        t, p = getattr(torch_model, name), getattr(twin, name)
        p.weight.set_value(t.weight.detach().numpy().T.copy())
        p.bias.set_value(t.bias.detach().numpy().copy())
    return twin


def _paddle_capture(producer: str, holder: str) -> tuple[dict[str, float], dict[str, float], Any]:
    """`_Triple` and its paddle twin with a capture of `producer`'s output on `holder`, the
    loss reading it: torch's native norms, paddle's monitored entry, its warnings."""
    paddle = pytest.importorskip("paddle")

    def prepare(model: Any) -> Any:
        hook = lambda m, i, o: setattr(getattr(model, holder), "feat", o)  # noqa: E731
        return getattr(model, producer).register_forward_hook(hook).remove

    def loss(model: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (getattr(model, holder).feat ** 2).sum()

    torch.manual_seed(0)
    model, x = _Triple(), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, loss, prepare)
    twin = _paddle_twin(paddle.nn, model)
    hook = lambda m, i, o: setattr(getattr(twin, holder), "feat", o)  # noqa: E731
    getattr(twin, producer).register_forward_post_hook(hook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            out = twin(paddle.to_tensor(x.numpy()))
            loss(twin, out).backward()
    return native, dict(monitor.history[-1]), _said(caught)


def test_finding1_paddle() -> None:
    native, step, said = _paddle_capture("a", "t")
    # 'a': recorded 12.87, native 1.73, no warning
    assert step.get("a", native["a"]) == pytest.approx(native["a"], rel=1e-4)
    assert "a" in step or any("'a'" in s for s in said)


# ------------------------------------------------------------------ FINDING 2


class _Triple(nn.Module):
    """a's output feeds a Tanh, which saves its result only: a's output dies after t's call,
    and b's output gets its id."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.t = nn.Tanh()
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.b(self.t(self.a(x))) * 1.0


def _b_on_t(model: Any) -> Any:
    return model.b.register_forward_hook(lambda m, i, o: setattr(model.t, "feat", o)).remove


def _triple_loss(model: Any, out: Any) -> Any:
    return (out * out).sum() + 3 * (model.t.feat**2).sum()


def test_finding2_the_holder_never_got_the_tensor() -> None:
    # (the holder 't' is in `_Step.readers` of b's output: a's dead output had its id)
    torch.manual_seed(0)
    model = _Triple()
    x = torch.randn(3, 4)
    ids = []
    model.a.register_forward_hook(lambda m, i, o: ids.append(id(o)))
    model.b.register_forward_hook(lambda m, i, o: ids.append(id(o)))
    model(x)
    assert ids[0] == ids[1]


def test_finding2_reader_by_a_reused_id() -> None:
    torch.manual_seed(0)
    model = _Triple()
    # 'b': recorded 10.97, native 2.74, no warning
    assert broken(model, _names(model), torch.randn(3, 4), _triple_loss, _b_on_t) == []


def test_finding2_paddle() -> None:
    native, step, said = _paddle_capture("b", "t")
    # 'b': recorded 10.97, native 2.74, no warning
    assert step.get("b", native["b"]) == pytest.approx(native["b"], rel=1e-4)
    assert "b" in step or any("'b'" in s for s in said)


# ---- MindSpore (FINDING 1; FINDING 2 did not reproduce there: 'b' left out, warned)

_MS_SCRIPT = (
    MINDSPORE_DENSES
    + r"""


class Triple(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = dense(0)
        self.t = ms.nn.Tanh()
        self.b = dense(1)

    def construct(self, v):
        return self.b(self.t(self.a(v))) * 1.0


found = {}
for producer, holder in (("a", "t"), ("b", "t")):
    net = Triple()
    def hook(cell, inputs, output, net=net, holder=holder):
        setattr(getattr(net, holder), "feat", output)
    getattr(net, producer).register_forward_hook(hook)
    def loss(v, net=net, holder=holder):
        out = net(v)
        return (out * out).sum() + 3 * (getattr(net, holder).feat ** 2).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradientMonitor(net) as monitor:
            ms.grad(loss)(x)
    said = [str(c.message) for c in caught if "GradientMonitor" in str(c.message)]
    found[producer] = [dict(monitor.history[-1]) if monitor.history else {}, said]
json.dump({"found": found, "w": [a.tolist() for a in w], "b": [a.tolist() for a in b],
           "x": x.asnumpy().tolist()}, sys.stdout)
"""
)


def _mindspore_run() -> dict[str, Any]:
    return run_in_mindspore(_MS_SCRIPT)


def test_finding1_mindspore() -> None:
    run = _mindspore_run()
    w, b = [torch.tensor(a) for a in run["w"]], [torch.tensor(a) for a in run["b"]]
    twin = _Triple()
    with torch.no_grad():
        for layer, i in ((twin.a, 0), (twin.b, 1)):
            layer.weight.copy_(w[i])
            layer.bias.copy_(b[i])

    def prepare(model: Any) -> Any:
        return model.a.register_forward_hook(lambda m, i, o: setattr(model.t, "feat", o)).remove

    native = native_norms(twin, _names(twin), torch.tensor(run["x"]), _triple_loss, prepare)
    step, said = run["found"]["a"]
    # the twin is the same model: the root's norm agrees with torch's
    assert step[""] == pytest.approx(native[""], rel=1e-4)
    # 'a': recorded 26.54, native 2.26, no warning
    assert ("a" not in step and any("'a'" in s for s in said)) or step["a"] == pytest.approx(
        native["a"], rel=1e-4
    )


# ------------------------------------------------------------------ FINDING 3


def _kfac(model: Any) -> Any:
    """K-FAC style: every Linear keeps its argument (``m.a_in = args[0]``)."""
    handles = [
        m.register_forward_pre_hook(lambda m, a: setattr(m, "a_in", a[0]))
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]
    return lambda: [h.remove() for h in handles]


@pytest.mark.xfail(strict=True, reason="FINDING 3 (known limit, README): K-FAC holders")
def test_finding3_kfac_holders_not_monitored() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    # '1' and '3' both left out (warned); 0c76291: both native
    step, said = monitored(model, torch.randn(3, 4), _square, _kfac, where=["1", "3"])
    assert said == [] and set(step) == {"1", "3"}


# ------------------------------------------------------------------ FINDING 4


class _Twice(nn.Module):
    """A cell applied to its own output."""

    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.k(self.k(x))


def _kfac_k(model: Any) -> Any:
    return model.k.register_forward_pre_hook(lambda m, a: setattr(m, "a_in", a[0])).remove


@pytest.mark.xfail(strict=True, reason="FINDING 4 (known limit, README): own output read")
def test_finding4_cell_keeping_its_input_applied_to_its_output() -> None:
    torch.manual_seed(0)
    model = _Twice()
    # 'k' left out (warned); 0c76291: native
    step, said = monitored(model, torch.randn(3, 4), _square, _kfac_k)
    assert said == [] and set(step) == {"", "k"}


# ------------------------------------------------------------------ FINDING 5


class _FeatureHookNet(nn.Module):
    """A capture hook keeps body[0]'s output on body[0]; the forward reads it, then clears
    it (timm's FeatureHookNet clears its captures after reading them)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(8, 4)

    def forward(self, x: Any) -> Any:
        out = self.body(x)
        feat = self.body[0].feat
        self.body[0].feat = None
        return self.head(torch.cat([out, feat], 1))


def _capture_on_itself(model: Any) -> Any:
    return model.body[0].register_forward_hook(lambda m, i, o: setattr(m, "feat", o)).remove


@pytest.mark.xfail(strict=True, reason="FINDING 5: a hook's capture read and cleared")
def test_finding5_capture_read_and_cleared_inside_the_forward() -> None:
    torch.manual_seed(0)
    model = _FeatureHookNet()
    # 'body.0': recorded 1.35, native 0.33, no warning (registered before the monitor: warned)
    assert broken(model, _names(model), torch.randn(3, 4), _square, _capture_on_itself) == []


@pytest.mark.xfail(strict=True, reason="FINDING 5: paddle, a hook's capture read and cleared")
def test_finding5_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PFeatureHookNet(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.body = pnn.Sequential(pnn.Linear(4, 4), pnn.Tanh(), pnn.Linear(4, 4), pnn.Tanh())
            self.head = pnn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            out = self.body(x)
            feat = self.body[0].feat
            self.body[0].feat = None
            return self.head(paddle.concat([out, feat], 1))

    torch.manual_seed(0)
    model, x = _FeatureHookNet(), torch.randn(3, 4)
    native = native_norms(model, _names(model), x, _square, _capture_on_itself)
    twin = PFeatureHookNet()
    pairs = ((model.body[0], twin.body[0]), (model.body[2], twin.body[2]), (model.head, twin.head))
    for t, p in pairs:
        p.weight.set_value(t.weight.detach().numpy().T.copy())
        p.bias.set_value(t.bias.detach().numpy().copy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(twin) as monitor:
            twin.body[0].register_forward_post_hook(lambda m, i, o: setattr(m, "feat", o))
            out = twin(paddle.to_tensor(x.numpy()))
            (out * out).sum().backward()
    step, said = dict(monitor.history[-1]), _said(caught)
    # 'body.0': recorded 1.347, native 0.328, no warning
    assert step.get("body.0", native["body.0"]) == pytest.approx(native["body.0"], rel=1e-4)
    assert "body.0" in step or any("'body.0'" in s for s in said)


# ------------------------------------------------------------------ FINDING 6


class _Proxy:
    """A lazy proxy (werkzeug's LocalProxy outside a request, Django's SimpleLazyObject
    before setup): its ``__class__`` raises."""

    @property
    def __class__(self) -> Any:  # type: ignore[override]
        raise RuntimeError("working outside of application context")


def test_finding6_proxy_in_a_container_attribute() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    model[0].context = {"request": _Proxy()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GradientMonitor(model) as monitor:
            model(torch.randn(2, 4)).sum().backward()  # RuntimeError (0c76291: ran)
    assert set(monitor.history[-1]) == {"", "0", "1"}


# ------------------------------------------------------------------ FINDING 7


class _Frozen(nn.Module):
    """Called under no_grad, trains its head under enable_grad (a frozen body)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        f = self.body(x)
        with torch.enable_grad():
            return self.head(f)


def test_finding7_gradients_enabled_inside_a_no_grad_forward() -> None:
    x = torch.randn(3, 4)

    def run(model: Any) -> None:
        with torch.no_grad():
            out = model(x)
        (out**2).sum().backward()

    torch.manual_seed(1)
    model = _Frozen()
    native = _native_run(model, ["", "head"], run)
    entries, said = _monitor_run(model, run)
    assert "head" in native  # torch's hook saw the head's grad_output
    # nothing recorded, no warning
    assert (entries and entries[-1].get("head") == pytest.approx(native["head"])) or any(
        "'head'" in s for s in said
    )


# ------------------------------------------------------------------ FINDING 8


class _AuxBlock(nn.Module):
    """Returns `pre`'s output after `inner` read it (an auxiliary head inside the block)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.inner = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.pre(x)
        self.aux = self.inner(h)
        return h


class _AuxNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = _AuxBlock()
        self.out = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.out(self.b(x))


def _aux_loss(model: Any, out: Any) -> Any:
    return (out * out).sum() + 2 * (model.b.aux**2).sum()


def test_held_aux_block_with_every_module_monitored() -> None:
    torch.manual_seed(0)
    model = _AuxNet()
    assert broken(model, _names(model), torch.randn(3, 4), _aux_loss) == []


# (FINDING 8: passes since 2026-12-07: what calls inside a call keep is looked at)
def test_finding8_block_returning_an_inner_output_where_leaves_out_the_child() -> None:
    torch.manual_seed(0)
    model = _AuxNet()
    where = ["b", "out"]  # (the blocks, not their layers)
    # 'b': recorded 4.83, native 1.94, no warning (0c76291 the same)
    assert broken(model, where, torch.randn(3, 4), _aux_loss, where=where) == []


def test_finding7_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    pnn = paddle.nn

    class PFrozen(pnn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.body = pnn.Linear(4, 4)
            self.head = pnn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            f = self.body(x)
            with paddle.enable_grad():
                return self.head(f)

    model = PFrozen()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            with paddle.no_grad():
                out = model(paddle.randn([3, 4]))
            (out**2).sum().backward()
    assert model.head.weight.grad is not None  # the head was trained
    # nothing recorded, no warning
    assert (monitor.history and "head" in monitor.history[-1]) or any(
        "'head'" in s for s in _said(caught)
    )


# ------------------------------------------------------------------ FINDING 9


def test_finding9_torch_func_grad() -> None:
    from torch.func import functional_call, grad

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 4)

    def loss(p: Any, x: Any) -> Any:
        return functional_call(model, p, (x,)).pow(2).sum()

    expected = grad(loss)(params, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GradientMonitor(model) as monitor:
            # RuntimeError: Cannot access data pointer of Tensor that doesn't have storage
            # (`ops.sum_squares` on functorch's GradTrackingTensor; 0c76291 the same)
            got = grad(loss)(params, x)
            transformed = dict(monitor.history[-1])
            model(x).pow(2).sum().backward()  # the same step in eager
            eager = dict(monitor.history[-1])
    assert all(torch.allclose(got[k], expected[k]) for k in expected)
    assert transformed.keys() == eager.keys() and all(
        transformed[k] == pytest.approx(eager[k], rel=1e-6) for k in eager
    ), (transformed, eager)


def test_finding9_vmap_over_torch_func_grad() -> None:
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 4)

    def loss(p: Any, x: Any) -> Any:
        return functional_call(model, p, (x.unsqueeze(0),)).pow(2).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))
    expected = per_sample(params, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with GradientMonitor(model):
            got = per_sample(params, x)  # RuntimeError: vmap: ... calling .item()
    assert all(torch.allclose(got[k], expected[k]) for k in expected)


# ------------------------------------------------------------------ cost (held, by hand)


def _step_time(model: Any, x: Any, monitor: bool) -> float:
    import time

    watch = GradientMonitor(model) if monitor else None
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(5):
            model(x).pow(2).mean().backward()
        best = min(best, (time.perf_counter() - start) / 5)
    if watch is not None:
        watch.remove()
    return best


@pytest.mark.skipif(not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing")
def test_held_cost_transformer_step() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    x = torch.randn(4, 16, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bare = _step_time(model, x, False)
            watched = _step_time(model, x, True)
    finally:
        torch.set_num_threads(threads)
    # by hand: 5.7-7.1 ms bare, 10.4-12.0 ms watched (0c76291: 9.8-11.4 ms)
    assert watched < 3 * bare, (watched, bare)


# ------------------------------------------------------------------ FINDING 10


class _SlotKeeper(nn.Module):
    """Keeps its output in a slot (``__slots__``): an attribute, not in ``__dict__``."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.out = y
        return y


class _SlotNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _SlotKeeper()
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.b(torch.tanh(self.k(x)))


def test_finding10_output_kept_in_a_slot() -> None:
    torch.manual_seed(0)
    model = _SlotNet()

    def loss(model: Any, out: Any) -> Any:
        return (out * out).sum() + 3 * (model.k.out**2).sum()

    # 'k': recorded 12.87, native 1.73, no warning
    assert broken(model, _names(model), torch.randn(3, 4), loss) == []


# ------------------------------------------------------------------ FINDING 11


class _TableCell(nn.Module):
    """An RNN-style cell holding a lookup table (`rows` lists of `size` ints, no tensor)."""

    def __init__(self, rows: int, size: int) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.table = [list(range(size)) for _ in range(rows)]

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.fc(x))


class _Unrolled(nn.Module):
    def __init__(self, rows: int, size: int, steps: int = 200) -> None:
        super().__init__()
        self.cell = _TableCell(rows, size)
        self.steps = steps

    def forward(self, x: Any) -> Any:
        for _ in range(self.steps):
            x = self.cell(x)
        return x


def test_finding11_per_call_walk_of_unrelated_containers(monkeypatch: Any) -> None:
    import unihook.recipes.monitor as monitor_module

    counted = [0]
    original = monitor_module._objects_within

    def counting(values: list[Any], deeper: int, ids: list[int], *args: Any, **kw: Any) -> None:
        before = len(ids)  # (the ids a look gathers, its nested calls' too)
        original(values, deeper, ids, *args, **kw)
        if args[1:2] != (False,):  # (a look, not a nested call: counted once)
            counted[0] += len(ids) - before

    monkeypatch.setattr(monitor_module, "_objects_within", counting)
    model = _Unrolled(32, 256)
    with GradientMonitor(model, where=["cell"]):
        counted[0] = 0
        model(torch.randn(2, 8)).sum().backward()
    # ~830,000 ids a forward: 200 calls x the ~4,100 the budget allows (49.6 ms a step where
    # 0c76291 took 13.8 ms, no monitor 4.2 ms)
    assert counted[0] < 50_000


@pytest.mark.skipif(not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing")
def test_finding11_timed() -> None:
    import time

    def step_time(rows: int, size: int) -> float:
        torch.manual_seed(0)
        model, x = _Unrolled(rows, size), torch.randn(2, 8)
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
        plain, table = step_time(0, 0), step_time(32, 256)
    finally:
        torch.set_num_threads(threads)
    # by hand: 11.6 ms without the table, 42.0 ms with it (0c76291: 8.8 and 9.1 ms)
    assert table < 1.5 * plain, (table, plain)
