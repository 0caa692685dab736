"""helper-74's attack on 41d68e1 + 11758d9: `ops.derived` (unihook/_history.py
`history_reaches`, each backend's `Ops.derived`) and GradientMonitor leaving out a module call
whose outputs were computed one from another (`_one_from_another`); DropHook's forward hook
placed first (`prepend=True`); torch's `forget_compiled` / `_compiled_frame_elsewhere`.

Oracle: torch's native ``register_full_backward_pre_hook`` grad_output norm on a deep copy of
the model (its outputs wrapped at the module boundary), else the numbers the program makes
whatever the weights (the caller's loss `a.sum() + 2 * b.sum()` gives grad_outputs of ones and
twos). The promise under attack: a GradientMonitor entry equals that norm, or the module is
left out with the RuntimeWarning, never a silently wrong number.

Tried (scripts not kept unless pinned below):

- `ops.derived` on torch against what autograd does (an output computed from another by):
  a custom `autograd.Function`, `checkpoint` reentrant and not, `torch.autocast`,
  `torch.func.functional_call`, `torch.vmap`, a complex output (`view_as_complex`), a head on
  `f.detach()` given `requires_grad_()` (not derived: False, right), an in-place op on the
  first output after the second was computed from it (`s = f.sum(); f.add_(1)`; the hook on
  `f` then sits on the in-place node and sees the caller's uses only: False is right), the
  same on a view and on its base: HELD. Outputs in a tuple, dict, namedtuple, dataclass,
  list, nested (`(f, {"p": [s]})`), reversed order: left out with the warning (HELD).
  Paddle: a PyLayer, `recompute` (reentrant and not), a returned parameter: HELD.
- Outputs computed on another thread (FINDING 1: torch's sequence numbers are per thread, and
  the walk prunes by them). MindSpore: the other thread's ops reach no gradient at all there
  (its graph is per thread), nothing to compare.
- A returned tensor made before the call (not an argument), the other output computed from an
  argument computed from it: torch walks down to the earlier output's sequence number and
  leaves the call out; paddle stops at the arguments' nodes (FINDING 2).
- A PINN-style module returning `(u, du/dx)` (`autograd.grad(create_graph=True)` inside the
  forward): derived exactly when the double-backward graph saves `u` (a final Tanh: left out;
  a final Linear: recorded, equal to the native norm): HELD. (On CUDA the engine's device
  threads make those nodes, numbered per thread: FINDING 1's root cause there too; CPU only
  here.) MindSpore: a dict output, `f.add_(1)` after `s` (left out: conservative, warned),
  `f[0] = 0` after `s` (recorded 6.32, the right norm): HELD. Paddle: a dict output, an
  in-place op after `s` (recorded 6.32, right), a head on a worker thread (left out: paddle
  walks without sequence numbers): HELD.
- torch's LSTM / GRU (output and states), MultiheadAttention(need_weights=True) (averaged
  weights, not an input of the output), an Inception-style `(logits, aux)`: recorded with the
  right norm (HELD, pinned). Paddle's LSTM, bidirectional LSTM, GRU, SimpleRNN and
  MultiHeadAttention(need_weights=True): left out with the warning, as documented (HELD).
  MindSpore cost: 12 layers returning `(h, attn)`, 4 ms per walk (its pipeline sync
  included), 2 % of a 2.4 s step.
- A module returning a tensor made earlier in the forward that is not one of its arguments
  (one output): FINDING 4, on every backend (not today's change: the same family as
  the returned input, which `_returns_an_input` only looks for among the arguments).
- Budget: a call of > 16384 nodes (4096 until helper-75's attack) returning two outputs
  computed apart: left out with the warning, never recorded (HELD, pinned).
- Cost: a 12-layer encoder whose layers and attentions return `(h, attn)`, the model `(h,
  pooled, attns)`: 26 walks per step cost 1.9 ms of a 27.7 ms monitored step (7 %, loaded
  machine; the encoder's and the model's walks each cover the whole forward graph, so nesting
  depth multiplies it). Every layer and attention module is left out there, rightly (`h` is
  computed from `attn`): with `output_attentions` a transformer keeps only its Linear /
  LayerNorm norms. Not pinned (timings too noisy here: 2.1x-3.5x before, 1.5x-3.0x after).
- DropHook before / after capture, ActivationStats, GradCAM, GradientMonitor and a native
  torch forward hook: each sees the dropped output (HELD, pinned); a global forward hook
  (`unihook.register_module_forward_hook`) sees the output before the drop (FINDING 3).
- forget_compiled: 3 threads running `torch.compile(backend="eager")` models forward and
  backward, one compiling fresh functions, one registering and removing global forward and
  pre hooks (and checking on its own thread that a registered hook fires in a compiled call
  and a removed one does not), 8 s, 5 runs: no crash, no hang, eager's numbers, no silent
  skip (HELD; one short run pinned). Each registration there waits for the others'
  compiles: ~1 registration per second beside them.

FINDINGS (strict xfails below), by severity:

1. FIXED (a second walk, down to the arguments' nodes). (medium: silently wrong norm) torch:
   an output computed from another on a different thread
   (a head run by a worker thread, a thread pool) is not seen as derived:
   ``f = fc(x); s = on_thread(lambda: (f * 2).sum(1)); return f, s`` after the main thread made
   a few dozen autograd nodes: ``ops.derived([f, s]) is False`` and GradientMonitor records
   22.8 where the native grad_output norm is 6.32. `TorchOps.derived` takes the floor as the
   minimum of the outputs' `_sequence_nr()`, and `history_reaches` prunes nodes below it; torch
   numbers nodes per thread (`at::sequence_number` is thread_local), so the worker's nodes
   (numbered from 0) fall under the main thread's floor. Expected: left out with the warning
   (or recorded as 6.32).
2. FIXED (`GradientMonitor._hooked_before`: `mem` is the earlier layer's hooked output).
   (low: silently wrong norm, backends disagree) paddle: a module returning a tensor made
   before the call that is not an argument (a state another layer set: ``return self.mem,
   self.fc(x)``), called with ``x = mem * 3``: the walk stops at the argument's node, so
   ``ops.derived`` says False and GradientMonitor records 26.1 where the grad_output norm is
   10 (sqrt(20 * 1 + 20 * 4)); torch walks down to `mem`'s sequence number and leaves the call
   out. `PaddleOps.derived` (stops = the arguments' nodes). Expected: left out (or 10).
3. FIXED (the README and the docstring name global hooks). (low: README says otherwise)
   DropHook: README / its docstring say "capture, the recipes
   and the user's hooks see the dropped output"; a global forward hook
   (`unihook.register_module_forward_hook`, documented to run before the module's own hooks)
   sees the output before the drop, different from what the call returns. Expected: the
   dropped output, or the README naming global hooks as the exception.
4. (low: silently wrong norm; pre-existing) a module returning a tensor made before its call
   that is not one of its arguments (`return self.t`, a state another layer set this
   forward; kv / memory caches), while the caller also uses that tensor elsewhere
   (``h = pre(x); inner.t = h; loss = h.sum() + 2 * inner(x).sum()``): GradientMonitor records
   13.42 (the hook on `h` sums both uses) where the native grad_output norm is 8.94, on torch,
   paddle and MindSpore alike, no warning. `_returns_an_input` (unihook/recipes/monitor.py)
   compares the outputs with the call's arguments only. Expected: left out with the warning
   (a returned tensor whose node was made before the call's first op is not the call's own),
   or 8.94.
"""

from __future__ import annotations

import copy
import threading
import warnings
from typing import Any, Callable

import pytest
from children import last_value, run_code

import unihook
from unihook import ops

torch = pytest.importorskip("torch")
nn = torch.nn


def _native_norm(model: Any, inner: str, x: Any, loss: Callable[[Any], Any]) -> float:
    """The oracle: torch's full backward pre-hook on a deep copy, the grad_output norm."""
    ref = copy.deepcopy(model)
    seen: list[float] = []

    def hook(module: Any, grad_output: Any) -> None:
        seen.append(sum(float(g.double().pow(2).sum()) for g in grad_output if g is not None))

    ref.get_submodule(inner).register_full_backward_pre_hook(hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss(ref(x)).backward()
    return sum(seen) ** 0.5


def _monitored(model: Any, x: Any, loss: Callable[[Any], Any], backward: Any = None) -> tuple:
    from unihook.recipes import GradientMonitor

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            out = loss(model(x))
            (backward or (lambda t: t.backward()))(out)
    said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
    return (monitor.history[-1] if monitor.history else {}), said


def _pair_loss(out: Any) -> Any:
    a, b = out
    return a.sum() + 2.0 * b.sum()


def _on_thread(fn: Callable[[], Any]) -> Any:
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()))
    worker.start()
    worker.join()
    return box[0]


class _ThreadHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: Any) -> Any:
        f = self.fc(x)
        return f, _on_thread(lambda: (f * 2.0).sum(1))  # a pooled head on a worker thread


class _Outer(nn.Module):
    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any) -> Any:
        return self.inner(x)


def test_finding1_an_output_computed_on_another_thread_is_seen_as_derived() -> None:
    """FINDING 1, FIXED (2026-12-01): where the walk down to the floor finds no path, torch's
    `derived` walks the call's graph down to the arguments' nodes, without the floor."""
    torch.manual_seed(0)
    model = _Outer(_ThreadHead())
    for _ in range(50):  # the main thread numbers some nodes first, as any program does
        (torch.ones(2, requires_grad=True) * 2.0).sum()
    x = torch.randn(5, 3)
    f, s = model.inner(x)
    found = ops.derived([f, s], [x])
    expected = _native_norm(model, "inner", x, _pair_loss)
    step, said = _monitored(model, x, _pair_loss)
    assert found is not False, found
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(expected, rel=1e-5), (
        step,
        expected,
    )


class _Head(nn.Module):
    """Returns `f` and a second output computed from it through `how`."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.how = how

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        f = self.fc(x)

        def head(t: Any) -> Any:
            return (torch.tanh(t) * 2.0).sum(1)

        if self.how == "function":
            return f, _Twice.apply(f)
        if self.how == "checkpoint":
            return f, checkpoint(head, f, use_reentrant=True)
        if self.how == "checkpoint_nonreentrant":
            return f, checkpoint(head, f, use_reentrant=False)
        if self.how == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return f, head(f).float()
        if self.how == "vmap":
            return f, torch.vmap(lambda r: (torch.tanh(r) * 2.0).sum())(f)
        if self.how == "dict":
            return {"h": f, "pooled": head(f)}
        if self.how == "nested":
            return f, {"p": [head(f)]}
        raise AssertionError(self.how)


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, f: Any) -> Any:
        return (f * 2.0).sum(1)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return g[:, None].expand(5, 4) * 2.0


def _unpack(out: Any) -> tuple:
    if isinstance(out, dict):
        return out["h"], out["pooled"]
    if isinstance(out[1], dict):
        return out[0], out[1]["p"][0]
    return out


@pytest.mark.parametrize(
    "how",
    ["function", "checkpoint", "checkpoint_nonreentrant", "autocast", "vmap", "dict", "nested"],
)
def test_derived_through_functions_checkpoints_and_containers_is_left_out(how: str) -> None:
    """HELD: an output computed from another through a custom Function, a checkpoint (both
    kinds), autocast, vmap, or inside a dict / nested container: left out with the warning."""
    torch.manual_seed(0)
    model = _Outer(_Head(how))
    step, said = _monitored(model, torch.randn(5, 3), lambda out: _pair_loss(_unpack(out)))
    assert "inner" not in step and any("'inner'" in s for s in said), (step, said)
    assert "inner.fc" in step


class _InPlaceAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: Any) -> Any:
        f = self.fc(x)
        s = (f * 2.0).sum(1)
        f.add_(1.0)  # after `s` was computed from it: `f`'s hook sits on the in-place node
        return f, s


def test_an_in_place_op_after_the_second_output_is_recorded_as_the_native_norm() -> None:
    """HELD: `s = f.sum(); f.add_(1); return f, s` is not derived (the gradient at the changed
    `f` is the caller's only): recorded, equal to torch's native grad_output norm."""
    torch.manual_seed(0)
    model = _Outer(_InPlaceAfter())
    x = torch.randn(5, 3)
    expected = _native_norm(model, "inner", x, _pair_loss)
    step, said = _monitored(model, x, _pair_loss)
    assert step["inner"] == pytest.approx(expected, rel=1e-6), (step, expected, said)


class _Long(nn.Module):
    def forward(self, x: Any) -> Any:
        a, b = x * 1.0, x * 2.0
        for _ in range(17000):  # a chain computed apart from `a`, after it: > 16384 nodes
            b = b + 1.0
        return a, b


def test_a_walk_past_the_budget_is_left_out_with_the_warning() -> None:
    """HELD: past its budget (16384 nodes since 2026-12-01: helper-75's FINDING 6) `derived`
    cannot tell (None) and the call is left out, said."""
    model = _Outer(_Long())
    x = torch.randn(3, requires_grad=True)
    a, b = model.inner(x)
    assert ops.derived([a, b], [x]) is None
    step, said = _monitored(model, x, _pair_loss)
    assert "inner" not in step and any("'inner'" in s for s in said), (step, said)


def test_finding2_paddle_a_state_made_before_the_call_reached_through_the_argument() -> None:
    pytest.importorskip("paddle")
    code = """
    import warnings, numpy as np, paddle, paddle.nn as nn
    from unihook import ops
    from unihook.recipes import GradientMonitor
    paddle.seed(0)
    class Inner(nn.Layer):
        def __init__(s):
            super().__init__(); s.fc = nn.Linear(4, 4); s.mem = None
        def forward(s, x):
            return s.mem, s.fc(x)  # a state another layer set: not an argument
    class M(nn.Layer):
        def __init__(s):
            super().__init__(); s.pre = nn.Linear(3, 4); s.inner = Inner()
        def forward(s, x):
            h = s.pre(x)
            s.inner.mem = h
            return s.inner(h * 3.0)
    m = M()
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(5, 3)).astype("float32"))
    h = m.pre(x); m.inner.mem = h; arg = h * 3.0
    a, b = m.inner(arg)
    found = ops.derived([a, b], [arg])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradientMonitor(m) as monitor:
            a, b = m(x)
            (a.sum() + b.sum() * 2.0).backward()
    said = any("'inner'" in str(w.message) for w in caught)
    print(repr((found, monitor.history[-1].get("inner"), said)))
    """
    found, norm, said = last_value(run_code(code, timeout=120))
    # the outputs' grad_outputs: ones (5, 4) and twos (5, 4): sqrt(20 + 80) = 10
    assert (norm is None and said) or norm == pytest.approx(10.0, rel=1e-5), (found, norm)


def test_torch_a_state_made_before_the_call_reached_through_the_argument_is_left_out() -> None:
    """HELD on torch (FINDING 2's program): the walk goes down to `mem`'s sequence number."""

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.mem: Any = None

        def forward(self, x: Any) -> Any:
            return self.mem, self.fc(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(3, 4)
            self.inner = Inner()

        def forward(self, x: Any) -> Any:
            h = self.pre(x)
            self.inner.mem = h
            return self.inner(h * 3.0)

    torch.manual_seed(0)
    step, said = _monitored(Model(), torch.randn(5, 3), _pair_loss)
    assert "inner" not in step and any("'inner'" in s for s in said), (step, said)


# --- DropHook ---------------------------------------------------------------------------


class _Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 64)

    def forward(self, x: Any) -> Any:
        return self.fc(x) * 2.0


def _drop_run(order: str) -> tuple[Any, dict[str, Any]]:
    from unihook import capture
    from unihook.recipes import ActivationStats, DropHook, GradientMonitor

    torch.manual_seed(3)
    model = _Dropped().train()
    x = torch.randn(4, 3)
    seen: dict[str, Any] = {}
    makers: dict[str, Callable[[], Any]] = {
        "capture": lambda: capture(model),
        "stats": lambda: ActivationStats(model),
        "monitor": lambda: GradientMonitor(model),
        "native": lambda: model.fc.register_forward_hook(
            lambda m, a, o: seen.__setitem__("native", o.detach().clone())
        ),
    }
    drop_first = order == "drop_first"
    made: dict[str, Any] = {}
    if drop_first:
        drop = DropHook(model, {"fc": 0.5})
    for name, make in makers.items():
        made[name] = make()
    if not drop_first:
        drop = DropHook(model, {"fc": 0.5})
    try:
        with made["capture"] as cache:
            out = model(x)
            (out * out).sum().backward()
        seen["capture"] = cache["fc"]
        seen["stats"] = made["stats"].history[-1]["fc"]
        seen["monitor"] = made["monitor"].history[-1]["fc"]
    finally:
        drop.remove()
        made["stats"].remove()
        made["monitor"].remove()
        made["native"].remove()
    return out, seen


@pytest.mark.parametrize("order", ["drop_first", "drop_last"])
def test_drop_hook_every_hook_and_recipe_sees_the_dropped_output(order: str) -> None:
    """HELD: capture, ActivationStats, GradientMonitor and a native forward hook, made before
    or after DropHook, all see the dropped output (the one the call returns)."""
    out, seen = _drop_run(order)
    dropped = out.detach() / 2.0
    assert 0 < float((dropped == 0).float().mean()) < 1
    torch.testing.assert_close(seen["capture"], dropped)
    torch.testing.assert_close(seen["native"], dropped)
    assert seen["stats"]["zeros"] == pytest.approx(float((dropped == 0).float().mean()))
    expected = float(torch.linalg.vector_norm(8.0 * dropped.double()))
    assert seen["monitor"] == pytest.approx(expected, rel=1e-5)


def test_finding3_drop_hook_a_global_forward_hook_sees_the_output_before_the_drop() -> None:
    """FINDING 3, FIXED in the README (2026-12-01): global forward hooks run before a module's
    own (torch's order), so before DropHook's: they see the output before the drop, as the
    README and DropHook's docstring now say."""
    from unihook.recipes import DropHook

    torch.manual_seed(3)
    model = _Dropped().train()
    x = torch.randn(4, 3)
    seen: list[Any] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        if module is model.fc:
            seen.append(output.detach().clone())

    handle = unihook.register_module_forward_hook(hook, backend="torch")
    try:
        with DropHook(model, {"fc": 0.5}):
            out = model(x)
    finally:
        handle.remove()
    torch.testing.assert_close(seen[-1], model.fc(x).detach())
    assert not torch.equal(out.detach() / 2.0, seen[-1])


# --- forget_compiled ---------------------------------------------------------------------

_STRESS = """
import threading, time, torch, torch.nn as nn, unihook, warnings
warnings.simplefilter("ignore")
torch.manual_seed(0); torch.set_num_threads(1)
models = [nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)) for _ in range(2)]
compiled = [torch.compile(m, backend="eager") for m in models]
xs = [torch.randn(b, 8) for b in (2, 3, 5)]
want = {(i, j): models[i](x).detach() for i in range(2) for j, x in enumerate(xs)}
stop = time.monotonic() + SECONDS
errors, runs, churns = [], [0], [0]
def runner(i):
    try:
        j = 0
        while time.monotonic() < stop:
            out = compiled[i](xs[j % 3]); out.sum().backward()
            if not torch.allclose(out.detach(), want[(i, j % 3)], atol=1e-6):
                errors.append(("value", i, j)); return
            runs[0] += 1; j += 1
    except BaseException as e:
        errors.append(repr(e)[:300])
def churner():
    try:
        while time.monotonic() < stop:
            me = threading.get_ident(); seen = []
            def hook(m, a, o):
                if threading.get_ident() == me:
                    seen.append(type(m).__name__)
            h = unihook.register_module_forward_hook(hook)
            p = unihook.register_module_forward_pre_hook(lambda m, a: None)
            compiled[churns[0] % 2](xs[0]).sum().backward()
            if not {"Linear", "ReLU", "Sequential"} <= set(seen):
                errors.append(("missed", seen)); return
            h.remove(); p.remove(); n = len(seen)
            compiled[churns[0] % 2](xs[1]).sum().backward()
            if len(seen) != n:
                errors.append(("after", seen)); return
            churns[0] += 1
    except BaseException as e:
        errors.append(repr(e)[:300])
def fresh_compiler():
    try:
        k = 0
        while time.monotonic() < stop:
            f = torch.compile(lambda t, k=k: (t * (k + 1)).relu().sum(), backend="eager")
            f(torch.randn(4, requires_grad=True)).backward(); k += 1
    except BaseException as e:
        errors.append(repr(e)[:300])
ts = [threading.Thread(target=runner, args=(i,)) for i in range(2)]
ts += [threading.Thread(target=churner), threading.Thread(target=fresh_compiler)]
for t in ts: t.start()
for t in ts: t.join()
print(repr((errors[:3], runs[0] > 0, churns[0] > 0)))
"""


def test_forget_compiled_beside_threads_running_and_compiling() -> None:
    """HELD: threads running compiled models, one compiling fresh functions, one registering
    and removing global hooks (each firing in a compiled call on its thread while it lives,
    never after): no crash, no hang, eager's numbers."""
    pytest.importorskip("torch._dynamo")
    done = run_code("SECONDS = 4.0\n" + _STRESS, timeout=150)
    assert last_value(done) == ([], True, True)


def test_derived_is_false_for_single_or_no_grad_outputs() -> None:
    """HELD: one tensor, integer outputs and outputs without grad are not derived."""
    fc = nn.Linear(3, 4)
    x = torch.randn(5, 3)
    f = fc(x)
    assert ops.derived([f], [x]) is False
    assert ops.derived([f, f.argmax(1)], [x]) is False
    with torch.no_grad():
        g = fc(x)
    assert ops.derived([g, g.sum(1)], [x]) is False
    assert ops.derived([], []) is False


class _Cache(nn.Module):
    """Returns a tensor another layer made earlier in the forward (not an argument)."""

    def forward(self, x: Any) -> Any:
        return self.t


class _CacheModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = _Cache()

    def forward(self, x: Any) -> Any:
        h = self.pre(x)
        self.inner.t = h
        return h.sum() + 2.0 * self.inner(x).sum()


def test_finding4_a_module_returning_a_tensor_made_before_the_call() -> None:
    torch.manual_seed(0)
    model = _CacheModel()
    x = torch.randn(5, 3)
    expected = _native_norm(model, "inner", x, lambda out: out)  # sqrt(20 * 4) = 8.94
    step, said = _monitored(model, x, lambda out: out)
    assert expected == pytest.approx(80**0.5)
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(expected), step


class _Rnn(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "mha":
            self.inner: Any = nn.MultiheadAttention(8, 2, batch_first=True)
        elif kind == "inception":
            self.inner = _Inception()
        else:
            self.inner = {"lstm": nn.LSTM, "gru": nn.GRU}[kind](
                8, 6, num_layers=2, batch_first=True
            )

    def forward(self, x: Any) -> Any:
        if self.kind == "mha":
            out, weights = self.inner(x, x, x, need_weights=True)
            return out.sum() + 2.0 * weights.sum(), out.numel() + 4 * weights.numel()
        if self.kind == "inception":
            logits, aux = self.inner(x)
            return logits.sum() + 2.0 * aux.sum(), logits.numel() + 4 * aux.numel()
        out, state = self.inner(x)
        if self.kind == "gru":
            return out.sum() + 2.0 * state.sum(), out.numel() + 4 * state.numel()
        h, c = state
        loss = out.sum() + 2.0 * h.sum() + 3.0 * c.sum()
        return loss, out.numel() + 4 * h.numel() + 9 * c.numel()


class _Inception(nn.Module):
    """torchvision's shape: the logits and an auxiliary head from a middle feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(8, 8))
        self.aux = nn.Linear(8, 3)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Any) -> Any:
        mid = self.stem(x)
        return self.fc(self.body(mid)), self.aux(mid)


@pytest.mark.parametrize("kind", ["lstm", "gru", "mha", "inception"])
def test_real_multi_output_modules_are_recorded_as_their_grad_output(kind: str) -> None:
    """HELD: torch's LSTM / GRU (output and states), MultiheadAttention(need_weights=True)
    (the returned weights are averaged over heads: the output is not computed from them),
    an Inception-style (logits, aux): recorded, the norm over the outputs' grad_outputs
    (the caller's constant factors: sqrt(sum of factor^2 * numel))."""
    from unihook.recipes import GradientMonitor

    torch.manual_seed(0)
    model = _Rnn(kind)
    x = torch.randn(2, 5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            loss, squares = model(x)
            loss.backward()
    said = [str(w.message) for w in caught if "'inner'" in str(w.message)]
    assert not said and monitor.history[-1]["inner"] == pytest.approx(squares**0.5), said
