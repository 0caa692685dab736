"""helper-73's attack on 14d5220 (torch `forget_compiled`: reset unless another thread runs a
compiled frame, under `_held_gil`; torch `change_mark` kept in the grad node's `metadata`) and
922acd4 (GradCAM's keepers placed per call, `_forward_calls` letting a checkpoint's
recomputed calls stand in for forward calls without a gradient; GradientMonitor's argument
marks by id with a weak reference over containers).

Oracles: hand-written Grad-CAM from native hooks (torch `register_forward_hook` + tensor hook,
paddle `register_forward_post_hook` + `register_hook`); the same model without checkpoints;
GradientMonitor against a hand-expanded functional copy of the model with `retain_grad`
(torch's own `register_full_backward_pre_hook` cannot be placed before an in-place ReLU);
native torch global hooks for the threading race.

Tried (scripts not kept unless pinned below):

- GradCAM (torch ~14 runs, paddle 5, MindSpore 1): a layer called twice, call=0/1, without
  checkpoints, inside two non-reentrant checkpoints (HELD), inside two reentrant checkpoints
  (FINDING 1: the two calls' maps are swapped, silently), the same on paddle's `recompute`
  (FINDING 1: a misleading "no gradient reached" error), on MindSpore two recomputed cells
  sharing the layer (FINDING 1: swapped), one call outside and one inside a reentrant
  checkpoint (FINDING 2), a single reentrant checkpoint/recompute (HELD), paddle against a
  hand-written native Grad-CAM (HELD), an exception inside forward (no keeper left: HELD),
  `remove()` then call (raises: HELD), GradCAMPlusPlus on the checkpointed model (same path).
- GradientMonitor (torch ~12 runs, paddle 1): in-place ReLU, a custom autograd Function, an
  in-place op on a view of the argument, nn.Identity (left out with its RuntimeWarning) with
  and without `set_detect_anomaly` (HELD, norms equal to the reference to 1e-5); paddle
  Identity left out (HELD); a dataclass argument with an unset `field(init=False)` (FINDING 3:
  AttributeError from the monitor's pre-hook, the model alone runs); containers sharing
  references: a list holding itself k times costs ~k**6 visits per module call (FINDING 4);
  a dict of 10**5 ints as a keyword argument of 5 module calls: 3.4 s per forward (0.67 s per
  module call, ~6.7 us per entry; without the monitor 0.0 s: reported, not pinned);
  300 trivial modules: 2.1 ms -> 15 ms per forward+backward (~43 us per module: reported).
- forget_compiled (children, ~8 runs): KeyboardInterrupt raised inside the reset (switch
  interval restored: HELD); a thread calling a compiled function in a loop (dynamic=True and
  not) while another registers and removes unihook global hooks 15 times (FINDING 5: the
  removal, made outside dynamo's compile lock, races the other thread's guard building:
  InternalTorchDynamoError KeyError; torch's native global hooks race the same way); a
  pure-Python busy thread beside 5 register+remove pairs: ~300 ms per pair (the `_HOLD`
  interval, paid twice or three times; reported); a hook removed by a finalizer that runs
  inside forget_compiled (FINDING 6: the non-reentrant `_holding` lock hangs the thread).
- forget_compiled's invalidation path: a thread blocked inside a compiled frame (dynamic
  shapes, a disabled function waiting on an Event) while 10 global hooks are registered one
  by one, a compiled function called after each (past recompile_limit): every hook called
  once per module call, none after removal (HELD).
- GradCAM on 4 threads (one shared GradCAM, and one each): wrong maps on every thread
  (FINDING 7); GradCAM of a torch.compile'd model, two inputs (HELD).
- Not reached (deadline): compiled autograd, a thread blocked in guard evaluation, nested
  compiled calls registering hooks on several threads.

FINDINGS (numbered as found; the report ranks them):
1. FIXED on torch, MindSpore and paddle (a recomputed call stands in for the forward call
   whose output it equals; on paddle, 2026-12-01, once its in-backward test held). GradCAM,
   a layer called in two reentrant checkpoints (torch
   `use_reentrant=True`, paddle `recompute`): the recomputations come in backward order (last
   checkpoint first) and are zipped with the forward calls in forward order: torch gives call 0
   the map of call 1 and back, silently; paddle raises "no gradient reached" for call 0.
2. FIXED (as 1). GradCAM, a layer called once outside and once inside a reentrant checkpoint:
   the default call=-1 raises "no gradient reached the output" (the recomputed call has it).
3. FIXED (`getattr(..., None)`). GradientMonitor: a dataclass argument with an unset
   ``field(init=False)``: the monitor's forward pre-hook raises AttributeError; the model runs
   without the monitor.
4. FIXED (a visited set). GradientMonitor `_argument_tensors`: no visited set: a container
   referenced k times from itself (or any DAG of shared containers) is walked ~k**6 times per
   module call (depth 8 less the args/kwargs levels; k=6: 0.3 s per module call, k=10: 10**6
   visits, seconds each).
5. FIXED (a global hook comes and goes under dynamo's compile lock). Removing a unihook
   global hook while another thread compiles: its guards read the hook dict
   after the removal: InternalTorchDynamoError (KeyError) on that thread (torch's native global
   hooks do the same: the removal is not under `convert_frame.compile_lock`).
6. FIXED (an RLock). forget_compiled is not re-entrant: a hook removed from a finalizer running
   inside it (the reset frees objects) hangs the thread forever (`_holding` is a plain Lock).
7. FIXED (a keeper records its own thread's forward calls). GradCAM on threads: each call's
   keepers (forward hooks of the layer) record every thread's calls of it: with 4 threads each
   using its own GradCAM, maps wrong by up to 1.0, silently (a shared one also raises "no
   gradient reached" now and then).

Run: PYTHONPATH=.:backends GLOG_minloglevel=2 .venv/bin/python -m pytest -q
tests/test_attack_h73.py
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from children import last_value, run_code

# --------------------------------------------------------------------------- GradCAM (torch)


def _torch_cam_model(reentrant: Any, mixed: bool = False) -> Any:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c0 = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.L = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4, 5)

        def block(self, t: Any) -> Any:
            return torch.relu(self.L(t))

        def forward(self, x: Any) -> Any:
            h = self.c0(x)
            for k in range(2):
                if reentrant is None or (mixed and k == 0):
                    h = self.block(h)
                else:
                    h = checkpoint(self.block, h, use_reentrant=reentrant)
            return self.fc(h.mean((2, 3)))

    torch.manual_seed(1)
    return Model()


def _torch_native_cam(model: Any, x: Any, target: int) -> list[np.ndarray]:
    """Hand-written Grad-CAM of every call of `model.L` (no checkpoint in `model`)."""
    acts: list[Any] = []
    grads: dict[int, Any] = {}

    def keep(module: Any, args: Any, out: Any) -> None:
        k = len(acts)
        acts.append(out.detach().clone())
        out.register_hook(lambda g: grads.__setitem__(k, g.detach().clone()))

    handle = model.L.register_forward_hook(keep)
    model(x)[:, target].sum().backward()
    handle.remove()
    model.zero_grad()
    maps = []
    for k, act in enumerate(acts):
        a, g = act.numpy().astype(np.float64), grads[k].numpy().astype(np.float64)
        cam = np.maximum((g.mean((2, 3))[:, :, None, None] * a).sum(1), 0)
        low = cam.min((1, 2), keepdims=True)
        span = cam.max((1, 2), keepdims=True) - low
        maps.append((cam - low) / np.where(span > 0, span, 1.0))
    return maps


def _x() -> Any:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize("reentrant", [None, False])
def test_torch_gradcam_two_calls_held(reentrant: Any) -> None:
    """HELD: a layer called twice, without checkpoints and in two non-reentrant checkpoints:
    call=0 / call=1 give the hand-written maps of those calls."""
    from unihook.recipes.cam import GradCAM

    x = _x()
    native = _torch_native_cam(_torch_cam_model(None), x, 1)
    model = _torch_cam_model(reentrant)
    for call in (0, 1):
        np.testing.assert_allclose(
            GradCAM(model, "L", call=call)(x, target=1), native[call], atol=1e-5
        )


def test_torch_gradcam_two_reentrant_checkpoints() -> None:
    """Repro: `h = checkpoint(block, h, use_reentrant=True)` twice with the same layer `L`
    (block = relu(L(t))); ``GradCAM(model, "L", call=0)(x, target=1)`` returns the map of the
    second call (max difference 1.0 from the hand-written one), call=1 (the default -1) that
    of the first. `_forward_calls` zips `again` (recomputations, last checkpoint first) with
    the forward calls."""
    from unihook.recipes.cam import GradCAM

    x = _x()
    native = _torch_native_cam(_torch_cam_model(None), x, 1)
    model = _torch_cam_model(True)
    got = [GradCAM(model, "L", call=call)(x, target=1) for call in (0, 1)]
    for call in (0, 1):
        np.testing.assert_allclose(got[call], native[call], atol=1e-5)


def test_torch_gradcam_layer_outside_and_inside_a_reentrant_checkpoint() -> None:
    """Repro: ``h = block(h); h = checkpoint(block, h, use_reentrant=True)`` with block =
    relu(L(t)); ``GradCAM(model, "L")(x, target=1)`` raises RuntimeError "GradCAM: no gradient
    reached the output of 'L' (call -1)": two forward calls, one recomputation, so
    `_forward_calls` substitutes none."""
    from unihook.recipes.cam import GradCAM

    x = _x()
    native = _torch_native_cam(_torch_cam_model(None), x, 1)
    model = _torch_cam_model(True, mixed=True)
    np.testing.assert_allclose(GradCAM(model, "L")(x, target=1), native[1], atol=1e-5)


def test_torch_gradcam_exception_and_remove_held() -> None:
    """HELD: an exception inside the forward leaves no keeper on the layer; a removed GradCAM
    raises on call; GradCAMPlusPlus runs on a model with non-reentrant checkpoints."""
    torch = pytest.importorskip("torch")
    from unihook.recipes.cam import GradCAM, GradCAMPlusPlus

    model = _torch_cam_model(None)
    x = _x()
    cam = GradCAM(model, "L")

    def boom(module: Any, args: Any) -> None:
        raise ValueError("boom")

    handle = model.fc.register_forward_pre_hook(boom)
    with pytest.raises(ValueError):
        cam(x, target=1)
    handle.remove()
    assert not model.L._forward_hooks
    kept = cam(x, target=1)
    assert not model.L._forward_hooks and kept.shape == (2, 8, 8)
    cam.remove()
    with pytest.raises(RuntimeError):
        cam(x)
    plus = GradCAMPlusPlus(_torch_cam_model(False), "L")(x, target=1)
    assert plus.shape == (2, 8, 8) and np.isfinite(plus).all()
    assert torch.is_grad_enabled()


def _threads_model() -> tuple[Any, list[Any]]:
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c0 = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.L = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4, 5)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.relu(self.L(self.c0(x))).mean((2, 3)))

    torch.manual_seed(1)
    model = Model()
    return model, [torch.randn(2, 3, 8, 8) for _ in range(4)]


def test_torch_gradcam_on_threads() -> None:
    """Repro: 4 threads, each ``cam = GradCAM(model, "L")`` of its own and ``cam(x_k,
    target=k)`` 5 times on one model: the maps differ from the same calls made one at a time
    by up to 1.0 (a keeper is a forward hook of the layer, which every thread's forward runs:
    `kept` gets other threads' calls and call=-1 takes the last). One GradCAM shared by the
    threads also raises "no gradient reached" now and then."""
    import threading

    from unihook.recipes.cam import GradCAM

    model, xs = _threads_model()
    ref = [GradCAM(model, "L")(x, target=k) for k, x in enumerate(xs)]
    worst = [0.0] * 4
    errors: list[str] = []

    def work(k: int) -> None:
        cam = GradCAM(model, "L")
        try:
            for _ in range(5):
                worst[k] = max(worst[k], float(np.abs(cam(xs[k], target=k) - ref[k]).max()))
        except Exception as error:  # noqa: BLE001 (reported by the assertion)
            errors.append(repr(error))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not model.L._forward_hooks
    assert errors == [] and max(worst) < 1e-5, (worst, errors)


def test_torch_gradcam_compiled_held() -> None:
    """HELD: GradCAM of a torch.compile'd model gives the eager maps (twice: recompiles).
    (aot_eager: inductor's code generation, 50 s of `make test` on a fresh machine, is not
    what the hooks see; tests/test_compilers.py runs each hook kind under inductor.)"""
    torch = pytest.importorskip("torch")
    from unihook.recipes.cam import GradCAM

    model, xs = _threads_model()
    ref = [GradCAM(model, "L")(x, target=k) for k, x in enumerate(xs[:2])]
    compiled = torch.compile(model, backend="aot_eager")
    for k in range(2):
        np.testing.assert_allclose(GradCAM(compiled, "L")(xs[k], target=k), ref[k], atol=1e-5)


# --------------------------------------------------------------------------- GradCAM (paddle)


def _paddle_cam(recompute: bool, calls: int) -> tuple[list[Any], list[np.ndarray]]:
    paddle = pytest.importorskip("paddle")
    from paddle.distributed.fleet.utils import recompute as rc

    from unihook.recipes.cam import GradCAM

    class Model(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.c0 = paddle.nn.Conv2D(3, 4, 3, padding=1)
            self.L = paddle.nn.Conv2D(4, 4, 3, padding=1)
            self.fc = paddle.nn.Linear(4, 5)
            self.recompute = False

        def block(self, t: Any) -> Any:
            return paddle.nn.functional.relu(self.L(t))

        def forward(self, x: Any) -> Any:
            h = self.c0(x)
            for _ in range(calls):
                h = rc(self.block, h) if self.recompute else self.block(h)
            return self.fc(h.mean((2, 3)))

    paddle.seed(0)
    model = Model()
    x = paddle.randn([2, 3, 8, 8])
    acts: list[Any] = []
    grads: list[Any] = []

    def keep(layer: Any, args: Any, out: Any) -> None:
        acts.append(out.numpy().astype(np.float64))
        out.register_hook(lambda g: grads.append(g.numpy().astype(np.float64)))

    handle = model.L.register_forward_post_hook(keep)
    model(x)[:, 1].sum().backward()
    handle.remove()
    model.clear_gradients()
    native = []
    for a, g in zip(acts, grads[::-1]):
        cam = np.maximum((g.mean((2, 3))[:, :, None, None] * a).sum(1), 0)
        low = cam.min((1, 2), keepdims=True)
        span = cam.max((1, 2), keepdims=True) - low
        native.append((cam - low) / np.where(span > 0, span, 1.0))
    model.recompute = recompute
    got: list[Any] = []
    for call in range(calls):
        try:
            got.append(GradCAM(model, "L", call=call)(x, target=1))
        except RuntimeError as error:
            got.append(error)
    return got, native


def test_paddle_gradcam_held() -> None:
    """HELD: paddle GradCAM of a layer called twice (no recompute) and of one call inside
    `recompute` equal the hand-written native maps."""
    for recompute, calls in ((False, 2), (True, 1)):
        got, native = _paddle_cam(recompute, calls)
        for call in range(calls):
            np.testing.assert_allclose(got[call], native[call], atol=1e-5)


def test_paddle_gradcam_two_recomputes() -> None:
    """Repro: paddle ``h = recompute(block, h)`` twice with the same layer `L`;
    ``GradCAM(model, "L", call=0)(x, target=1)`` raises RuntimeError "no gradient reached the
    output of 'L' (call 0)" (torch's reentrant checkpoint gives the swapped maps instead).
    FIXED (2026-12-01): paddle's in-backward flag, cleared by the first recomputation's inner
    backward, is no longer the only test (`ops.in_backward` looks for a PyLayer's backward
    on the stack inside recompute's `dygraph.guard()`)."""
    got, native = _paddle_cam(True, 2)
    for call in range(2):
        assert not isinstance(got[call], Exception), got[call]
        np.testing.assert_allclose(got[call], native[call], atol=1e-5)


_MINDSPORE = Path("/work/main/.venv-mindspore/bin/python")

_MS_TWO_RECOMPUTES = """
import mindspore as ms, numpy as np
from mindspore import nn, ops as P
from unihook.recipes.cam import GradCAM
ms.set_seed(0)
class Block(nn.Cell):
    def __init__(s, L):
        super().__init__(); s.L = L
    def construct(s, x):
        return P.relu(s.L(x))
class M(nn.Cell):
    def __init__(s):
        super().__init__()
        s.c0 = nn.Conv2d(3, 4, 3, pad_mode="same"); s.L = nn.Conv2d(4, 4, 3, pad_mode="same")
        s.fc = nn.Dense(4, 5); s.b1 = Block(s.L); s.b2 = Block(s.L)
    def construct(s, x):
        return s.fc(s.b2(s.b1(s.c0(x))).mean((2, 3)))
m = M(); x = ms.Tensor(np.random.RandomState(0).randn(2, 3, 8, 8).astype(np.float32))
ref = [GradCAM(m, "L", call=c)(x, target=1) for c in (0, 1)]
m.b1.recompute(); m.b2.recompute()
got = []
for c in (0, 1):
    try:
        got.append(float(np.abs(GradCAM(m, "L", call=c)(x, target=1) - ref[c]).max()))
    except Exception as e:
        got.append(repr(e)[:200])
print({"apart": float(np.abs(ref[0] - ref[1]).max()), "got": got})
"""


@pytest.mark.skipif(not _MINDSPORE.exists(), reason="no MindSpore venv")
def test_mindspore_gradcam_two_recomputed_cells() -> None:
    """Repro (MindSpore 2.10, PYNATIVE): cells b1, b2 = Block(L) each (relu(L(x))), both
    ``.recompute()``; ``GradCAM(m, "L", call=c)(x, target=1)`` differs from the same model
    without recompute by exactly the distance between its two calls' maps (0.88): swapped."""
    done = last_value(run_code(_MS_TWO_RECOMPUTES, timeout=240, python=str(_MINDSPORE)))
    assert done["apart"] > 0.1
    assert done["got"] == [0.0, 0.0] or max(done["got"]) < 1e-5, done


# ------------------------------------------------------------------------- GradientMonitor


def test_torch_monitor_against_a_functional_copy_held() -> None:
    """HELD: in-place ReLU, a custom Function, an in-place op on a view of the argument,
    nn.Identity (left out, one RuntimeWarning), with and without anomaly mode (its metadata
    beside unihook's mark): norms equal those of a hand-expanded copy with retain_grad."""
    torch = pytest.importorskip("torch")
    from unihook.recipes.monitor import GradientMonitor

    class Triple(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 3

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g * 3

    class Custom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return Triple.apply(x)

    class InplaceView(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            x[:, :1].mul_(2)
            return x

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.r = torch.nn.ReLU(inplace=True)
            self.c = Custom()
            self.v = InplaceView()
            self.i = torch.nn.Identity()
            self.b = torch.nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            h = self.v(self.c(self.r(self.a(x))))
            return self.b(h + self.i(h))

    for anomaly in (False, True):
        torch.manual_seed(0)
        net, x = Net(), torch.randn(3, 4)
        a = net.a(x)
        r = torch.relu(a)
        c = r * 3
        v = torch.cat([c[:, :1] * 2, c[:, 1:]], 1)
        o = net.b(v + v)
        for t in (a, r, c, v, o):
            t.retain_grad()
        o.pow(2).sum().backward()
        ref = {"a": a, "r": r, "c": c, "v": v, "b": o, "": o}
        net.zero_grad()
        with torch.autograd.set_detect_anomaly(anomaly), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            monitor = GradientMonitor(net)
            net(x).pow(2).sum().backward()
            monitor.remove()
        got = monitor.history[-1]
        assert set(got) == set(ref)
        for name, t in ref.items():
            assert got[name] == pytest.approx(float(t.grad.norm()), rel=1e-5)
        said = [str(m.message) for m in w if "GradientMonitor" in str(m.message)]
        assert len(said) == 1 and "'i'" in said[0]


def test_torch_monitor_dataclass_with_an_unset_field() -> None:
    """Repro: ``@dataclass class Batch: x: Tensor; extra: int = field(init=False)``; a model
    whose submodule takes ``Batch(x)`` and uses ``b.x`` runs; with ``GradientMonitor(model)``
    the forward raises AttributeError "'Batch' object has no attribute 'extra'"
    (`_argument_tensors`: ``getattr(value, field.name)``)."""
    torch = pytest.importorskip("torch")
    from unihook.recipes.monitor import GradientMonitor

    @dataclasses.dataclass
    class Batch:
        x: Any
        extra: int = dataclasses.field(init=False)

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, b: Batch) -> Any:
            return self.lin(b.x)

    class Top(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.d = Inner()

        def forward(self, b: Batch) -> Any:
            return self.d(b)

    model = Top()
    model(Batch(torch.randn(2, 3)))  # runs alone
    monitor = GradientMonitor(model)
    try:
        model(Batch(torch.randn(2, 3))).sum().backward()
        assert set(monitor.history[-1]) == {"", "d", "d.lin"}
    finally:
        monitor.remove()


def test_torch_monitor_self_referencing_container_visits(monkeypatch: Any) -> None:
    """Repro: ``cfg = []; cfg.extend([cfg] * 10)``; ``model(x, cfg)`` with GradientMonitor on
    does ~10**6 visits per module call (k=6 already takes 0.3 s per call). Counted here
    with k=4: 5465 visits of one distinct container in one module call."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import monitor as mod

    visits = [0]
    walk = mod._argument_tensors

    def counted(value: Any, depth: int, seen: Any) -> Any:
        visits[0] += 1
        return walk(value, depth, seen)

    monkeypatch.setattr(mod, "_argument_tensors", counted)

    class Twice(torch.nn.Module):
        def forward(self, x: Any, cfg: Any = None) -> Any:
            return x * 2

    model = torch.nn.Sequential()
    model.add_module("t", Twice())
    cfg: list[Any] = []
    cfg.extend([cfg] * 4)
    monitor = mod.GradientMonitor(model.t)
    try:
        model.t(torch.randn(2, requires_grad=True), cfg).sum().backward()
    finally:
        monitor.remove()
    assert visits[0] < 1000, visits[0]


# --------------------------------------------------------------------- forget_compiled (children)

_COMPILED_RUNNER = """
import os, sys, threading, time, torch
import unihook
NATIVE = {native}
lin = torch.nn.Linear(4, 4)
f = torch.compile(lambda x: torch.relu(lin(x)) * 2)
stop = False; errors = []; runs = [0]
def run():
    while not stop:
        try:
            f(torch.randn(2, 4)); runs[0] += 1
        except Exception as e:
            errors.append(type(e).__name__ + ": " + str(e).splitlines()[0][:80]); break
t = threading.Thread(target=run); t.start()
register = (torch.nn.modules.module.register_module_forward_hook if NATIVE
            else unihook.register_module_forward_hook)
for k in range(15):
    h = register(lambda m, a, o: None)
    time.sleep(0.02)
    h.remove()
    if errors: break
stop = True; t.join(60)
print({{"errors": errors, "alive": t.is_alive(), "interval": sys.getswitchinterval()}})
sys.stdout.flush(); os._exit(0)
"""


def test_torch_global_hook_removed_during_another_threads_compile() -> None:
    """Repro: thread B calls ``f = torch.compile(lambda x: relu(lin(x)) * 2)`` in a loop;
    thread A does ``h = unihook.register_module_forward_hook(...); sleep(0.02); h.remove()``:
    B's recompile (guards on the hook dict) raises InternalTorchDynamoError KeyError: <id>
    (the removal in `install`'s remover runs before forget_compiled's lock; torch's own
    ``register_module_forward_hook`` races the same way)."""
    pytest.importorskip("torch")
    done = last_value(run_code(_COMPILED_RUNNER.format(native=False), timeout=150))
    assert done["interval"] == 0.005 and not done["alive"]
    assert done["errors"] == [], done["errors"]


_REENTRANT = """
import os, sys, threading, weakref, torch
import torch._dynamo as dynamo
import unihook
from unihook_torch import _compile
result = {}
# a KeyboardInterrupt inside the reset: the switch interval comes back
reset = dynamo.reset_code_caches
def interrupted():
    raise KeyboardInterrupt
dynamo.reset_code_caches = interrupted
try:
    _compile.forget_compiled()
except KeyboardInterrupt:
    result["interrupted"] = True
dynamo.reset_code_caches = reset
result["interval"] = sys.getswitchinterval()
# a finalizer that removes a global hook, run by the reset (which frees objects)
class Owner: pass
owner = Owner()
held = unihook.register_module_forward_hook(lambda m, a, o: None)
weakref.finalize(owner, held.remove)
box = [owner]; del owner
def reset_and_free():
    reset(); box.clear()
dynamo.reset_code_caches = reset_and_free
done = []
def register():
    unihook.register_module_forward_hook(lambda m, a, o: None); done.append(1)
thread = threading.Thread(target=register, daemon=True); thread.start(); thread.join(5)
result["registered"] = bool(done)
print(result)
sys.stdout.flush(); os._exit(0)
"""


@pytest.fixture(scope="module")
def reentrant_child() -> dict[str, Any]:
    pytest.importorskip("torch")
    return last_value(run_code(_REENTRANT, timeout=120))


def test_torch_forget_compiled_interrupted_held(reentrant_child: dict[str, Any]) -> None:
    """HELD: a KeyboardInterrupt raised by the reset reaches the caller; the switch interval
    is put back (0.005)."""
    assert reentrant_child["interrupted"] and reentrant_child["interval"] == 0.005


def test_torch_forget_compiled_reentered_from_a_finalizer(
    reentrant_child: dict[str, Any],
) -> None:
    """Repro: a global hook whose handle's ``remove`` is a ``weakref.finalize`` callback of an
    object freed during ``dynamo.reset_code_caches`` (here: freed by a wrapper of it); any
    registration then calls forget_compiled -> reset -> finalizer -> remove ->
    forget_compiled, which waits forever on `_holding` (the thread is still alive after
    5 s)."""
    assert reentrant_child["registered"]


_BLOCKED = """
import os, sys, threading, torch
import unihook
lin = torch.nn.Linear(4, 4)
entered = threading.Event(); go = threading.Event()
def wait_here(x):
    entered.set(); go.wait(60); return x
@torch.compile(dynamic=True)
def g(x):
    return torch.relu(lin(torch._dynamo.disable(wait_here)(lin(x))))
@torch.compile(dynamic=True)
def f(x):
    return torch.relu(lin(x)) * 2
f(torch.randn(3, 4)); f(torch.randn(5, 4))
t = threading.Thread(target=lambda: g(torch.randn(2, 4))); t.start(); entered.wait(60)
calls = []; handles = []; extra = []
for k in range(10):
    handles.append(unihook.register_module_forward_hook(lambda m, a, o: calls.append(1)))
    before = len(calls); f(torch.randn(3 + k, 4)); extra.append(len(calls) - before - (k + 1))
go.set(); t.join(60)
for h in handles:
    h.remove()
before = len(calls); f(torch.randn(3, 4))
print({"extra": extra, "after": len(calls) - before, "alive": t.is_alive()})
sys.stdout.flush(); os._exit(0)
"""


def test_torch_registrations_beside_a_thread_blocked_in_a_compiled_frame_held() -> None:
    """HELD: 10 global hooks registered one by one while another thread waits inside a
    compiled frame (the invalidation path, past recompile_limit): each call of a compiled
    function calls every hook once; none after their removal; no crash."""
    pytest.importorskip("torch")
    done = last_value(run_code(_BLOCKED, timeout=150))
    assert done == {"extra": [0] * 10, "after": 0, "alive": False}
