"""helper-76's attack on edef0ac: GradientMonitor leaving out a module that returns a tensor
made before its call that is not one of its arguments (torch: `ops.history_mark`, the
thread's next autograd sequence number read in `_before`; `ops.made_before`, an output's
`grad_fn._sequence_nr()` below it, checked in `_record`).

Oracle: torch's native ``register_full_backward_pre_hook`` on a deep copy of the model, the
square root of the sum of squares of its grad_output. The promise: a module's entry equals
that norm (rel 1e-5), or the module is absent from the step with the RuntimeWarning naming
it; never a silently wrong number.

HELD (pinned below):

- A hypothesis property over a state made before the call on the same thread (an outer
  module sets ``inner.mem = h``; uses of `h` before and / or after the call, or none): the
  inner module returning it plainly, in a tuple beside a new tensor, through a container
  (``nn.Sequential(inner)``: container and child), a view (``mem[1:]``, ``mem.t()``), a
  clone, ``x + mem``, a state changed in place under ``no_grad`` (left out), a buffer
  (``register_buffer``), the view's base read before the call: every module's entry is the
  native norm, or it is left out with the warning. A returned view of a state is a new node
  and its gradient is the view's own: recorded, equal to the native norm (right).
- Ordinary models lose no module to the new check (the same entries as with
  `made_before` patched out): a small CNN with residual blocks and in-place ReLUs, a 2-layer
  LSTM, MultiheadAttention, a 2-layer TransformerEncoder, nn.Transformer, a recursive module
  (calling itself), `checkpoint` reentrant and not, ``every=2`` over four steps, a whole
  model run on a worker thread of a pool (after the main thread made 500 nodes).
- Errors in the user's forward: vmap, forward AD (dual tensors), a jagged nested tensor, a
  sparse output, inference mode, `torch.func.grad` / `jacrev` / `vmap(grad)`, a meta model,
  ``torch.compile(fullgraph=True)``: the same outcome with and without the new check (the
  errors there, "Cannot access data pointer", `.item()` on meta, dynamo's
  ``_current_graph_task_id`` graph break, are older than edef0ac; `history_mark` returns
  None while dynamo traces).
- Cost (measured, not pinned: the machine is shared): a monitored SGD step of a 29-module
  CNN (6 conv/BN/ReLU blocks, 8x3x16x16, one intra-op thread), 12 interleaved rounds of 40
  steps with and without `history_mark` / `made_before` (patched to return None): median
  7.47 ms without, 7.52 ms with, per-round ratio median 1.005 (0.85-1.04); the pair of calls
  costs 0.84 us per module call (24 us per step here).
- Documented, not findings: a returned autograd leaf (a parameter; a state made under
  ``no_grad`` then ``requires_grad_()``) is not told (README: its gradient is the
  parameter's); a module whose call returns a node another thread made (a container
  handing its child to a pool thread) is left out (README); a module called twice, one call
  left out, keeps the other call's norm (README: "such a call is left out").

FINDINGS (strict xfails below), by severity:

1. FIXED where the state is an output an earlier monitored call returned (as in both repros:
   `GradientMonitor._hooked_before`). (medium: silently wrong norm) sequence numbers are per
   thread, so a state made on one
   thread and returned by a call on another is compared with the other thread's counter:
   (a) ``h = pre(x); inner.mem = h; o = pool.submit(inner, x).result();
   loss = h.sum() + 2 * o.sum() + 3 * h.sum()`` after the main thread made a few hundred
   nodes: the fresh worker's mark is below `h`'s number, recorded 26.83 where the native
   grad_output norm is 8.94 (sqrt(20 * 4)); (b) ``h = busy_pool.submit(pre, x).result()``
   (a worker that made more nodes earlier than the main thread), `inner` called on the main
   thread: recorded 26.83 there too, native 8.94. No warning. README only names the other
   direction (a node another thread made during the call, numbered lower: left out).
   Expected: left out with the warning (or 8.94).
2. FIXED (the earlier call goes too: `_unhook_earlier`). (medium: wrong norm recorded beside
   a warning saying it is not) a memoising module:
   ``if self.cache is None: self.cache = self.fc(x); return self.cache`` called twice in a
   forward (``a = inner(x); b = inner(x); loss = a.sum() + 2 * b.sum()``): the second call
   is left out (made before), but the first call's hook on the same tensor receives both
   calls' gradients: entry 13.42 (3 x sqrt(20)) where the native norm over the two calls is
   10.0 (sqrt(20 + 80)) and the first call's own grad_output is 4.47; the warning says "its
   grad_output norm is not recorded". The same root (a returned tensor reached by another
   route) shows without the new check: ``self.kept = self.fc(x); return self.kept`` and the
   caller also using ``inner.kept``: 13.42 vs 4.47, silently (older than edef0ac; noted, not
   pinned separately). Expected: `inner` absent from the step (or 10.0).
3. FIXED where the module keeps the state itself (`self.mem`, as here: `monitor._kept`, since
   helper-77's FINDINGS 1 and 2); open for a state kept in a list or on another object.
   (medium: silently wrong norm) a state changed in place inside the call and returned:
   ``self.mem.add_(1); return self.mem`` (or ``self.mem[0] = 0.0``), the caller also using
   `h` after the call (``2 * inner(x).sum() + 3 * h.sum()``): the in-place op gives `mem` a
   node made during the call, so `made_before` is False: recorded 22.36 (5 x sqrt(20)) where
   the native grad_output norm is 8.94. Native hooks are defined here (the state is not an
   argument, so no BackwardHookFunction view is modified in place). Expected: left out (the
   returned tensor is the state object made before the call) or 8.94.
4. FIXED where the module keeps the view itself (as 3); open elsewhere. (low-medium: silently
   wrong norm) a view of a state made before the call whose base was
   changed in place before the call: ``v = h[:2]; h.mul_(2); inner.mem = v``, inner returning
   `v`, the caller also using `v` after the call: `v.grad_fn` is stale and torch regenerates
   it lazily at its first read, which is `made_before`'s own read inside `_record`, so the
   node is numbered during the call: recorded 14.14 where the native norm is 5.66. The same
   model with ``v.grad_fn`` read once before the call is left out with the warning (held).
   Expected: left out (or 5.66).
5. FIXED where the state is an output an earlier monitored call returned (as in the repro).
   (low: README claim) under ``torch.compile(model, backend="eager")`` (also "aot_eager")
   the hooks are traced, `history_mark` is None and the call returning the state is recorded:
   13.42 where the native norm is 8.94, no warning; README says such a module "is left out on
   torch with the warning" and names only paddle and MindSpore as recording the sum (while
   `ops.derived` under compile leaves the call out). Expected: left out, or README naming
   compiled models.
6. FIXED (the message names another thread). (low: a false message; the leave-out itself is
   documented) a container handing its child to a pool thread (``return pool.submit(self.body,
   x).result()``, the main thread's counter ahead): left out, as README says, but the warning
   says "'off' returned a tensor made before the call that is not one of its arguments (a state
   kept from earlier)": the tensor was made during the call, on another thread; the user is sent
   looking for a state that does not exist. Expected: a message naming the other possibility (a
   node another thread made during the call).
7. (low: silently wrong norm; older than edef0ac, found by the model sweep) a PINN-style
   double backward (``u = net(x); du = autograd.grad(u.sum(), x, create_graph=True)[0];
   loss = du.pow(2).sum()``, ``net = Sequential(Linear(1, 8), Tanh(), Linear(8, 1))``): the
   Tanh's backward saves its output, so the loss's gradient reaches that tensor also through
   the double-backward graph, which the hook on it sums and torch's module hook (on the
   output's alias) does not: 'net.1' recorded 1.4535 where the native norm is 1.2721 (Sigmoid
   1.22546 vs 1.22532; ReLU and Softplus, which save their input, agree). Expected: the
   native norm, or left out (an output saved by its own call's backward), or README naming
   it.
"""

from __future__ import annotations

import concurrent.futures
import copy
import warnings
from typing import Any, Callable

import pytest
from children import last_value, run_code

from unihook import ops

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
nn = torch.nn

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from monitor_oracle import broken, monitored, native_norms  # noqa: E402

from unihook.recipes import GradientMonitor  # noqa: E402

Loss = Callable[[Any], Any]


def _native_norms(model: Any, names: list[str], x: Any, loss: Loss) -> dict[str, float]:
    return native_norms(model, names, x, lambda _, out: loss(out))


def _monitored(model: Any, x: Any, loss: Loss, **kwargs: Any) -> tuple[dict[str, float], list]:
    return monitored(model, x, lambda _, out: loss(out), **kwargs)


def _holds(model: Any, names: list[str], x: Any, loss: Loss = lambda out: out) -> list[str]:
    """The promise for each of `names`: the broken ones, described."""
    return broken(model, names, x, lambda _, out: loss(out))


def _busy(nodes: int) -> None:
    """Autograd nodes made on this thread: its sequence counter moves on."""
    a = torch.randn(3, requires_grad=True)
    for _ in range(nodes):
        a = a * 1.0


# ---------------------------------------------------------------------- HELD: the property


class _Inner(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.mem: Any = None
        if how == "buffer":
            self.register_buffer("kept", None)

    def forward(self, x: Any) -> Any:
        mem, how = self.mem, self.how
        if how in ("plain", "touched"):
            return mem
        if how == "buffer":
            self.kept = mem
            return self.kept
        if how == "tuple":
            return x * 2.0, mem
        if how == "view":
            return mem[1:]
        if how == "t":
            return mem.t()
        if how == "clone":
            return mem.clone()
        if how == "plus":
            return x[:, :1] + mem
        if how == "nograd_inplace":
            with torch.no_grad():
                mem.mul_(2.0)
            return mem
        raise AssertionError(how)


class _Outer(nn.Module):
    def __init__(self, how: str, wrap: bool, before: float, after: float) -> None:
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = nn.Sequential(_Inner(how)) if wrap else _Inner(how)
        self.before, self.after = before, after

    def forward(self, x: Any) -> Any:
        h = self.pre(x) * 1.0
        core = self.inner[0] if isinstance(self.inner, nn.Sequential) else self.inner
        core.mem = h
        loss = (h * self.before).sum()
        out = self.inner(x)
        outs = out if isinstance(out, tuple) else (out,)
        for k, o in enumerate(outs):
            loss = loss + (k + 2.0) * o.sum()
        return loss + self.after * h.sum()


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.sampled_from(
        ["plain", "touched", "buffer", "tuple", "view", "t", "clone", "plus", "nograd_inplace"]
    ),
    st.booleans(),
    st.sampled_from([0.0, 0.5]),
    st.sampled_from([0.0, 3.0]),
)
def test_held_a_state_made_before_the_call_on_the_same_thread(
    how: str, wrap: bool, before: float, after: float
) -> None:
    torch.manual_seed(0)
    model = _Outer(how, wrap, before, after)
    names = ["inner", "inner.0"] if wrap else ["inner"]
    broken = _holds(model, names, torch.randn(5, 3))
    assert not broken, (how, wrap, before, after, broken)


def test_held_a_returned_state_is_left_out_and_a_view_of_it_recorded() -> None:
    """The two ends of the property, pinned by value: `return self.mem` is left out with the
    new warning; `return self.mem[1:]` is recorded as the native norm."""
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    step, said = _monitored(_Outer("plain", False, 0.0, 3.0), x, lambda out: out)
    assert "inner" not in step and any("made before the call" in s for s in said), said
    model = _Outer("view", False, 0.0, 3.0)
    want = _native_norms(model, ["inner"], x, lambda out: out)["inner"]
    step, _ = _monitored(model, x, lambda out: out)
    assert step["inner"] == pytest.approx(want, rel=1e-6) == pytest.approx(8.0)


# ------------------------------------------------------- HELD: no data lost on ordinary models


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Any) -> Any:
        return self.relu(self.bn(self.conv(x)) + x)


class _Recursive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Any, depth: int = 2) -> Any:
        return self.lin(x) if depth == 0 else self(torch.tanh(self.lin(x)), depth - 1)


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.reentrant = reentrant

    def forward(self, x: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.body, x, use_reentrant=self.reentrant).pow(2).sum()


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: Any) -> Any:
        out, weights = self.mha(x, x, x)
        return out.pow(2).sum() + weights.sum()


class _Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)

    def forward(self, x: Any) -> Any:
        return self.t(x, x).pow(2).sum()


def _ordinary(kind: str) -> tuple[Any, Any, Loss]:
    torch.manual_seed(0)
    square: Loss = lambda out: out.pow(2).sum()  # noqa: E731
    if kind == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), _Block(), _Block(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(4, 3),
        )  # fmt: skip
        return model, torch.randn(2, 3, 8, 8), square
    if kind == "lstm":
        lstm = nn.LSTM(8, 6, 2, batch_first=True)
        return lstm, torch.randn(2, 5, 8), lambda out: out[0].pow(2).sum() + out[1][0].sum()
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return (
            nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            torch.randn(2, 5, 8),
            square,
        )
    if kind == "mha":
        return _Attention(), torch.randn(2, 5, 8), lambda out: out
    if kind == "transformer":
        return _Transformer(), torch.randn(2, 5, 8), lambda out: out
    if kind == "recursive":
        return _Recursive(), torch.randn(3, 8), square
    return _Checkpointed(kind == "reentrant"), torch.randn(3, 8, requires_grad=True), lambda o: o


def _without_the_check() -> Any:
    """A context: `made_before` patched to "cannot tell" (the monitor before edef0ac)."""
    from unittest import mock

    return mock.patch.object(ops, "made_before", lambda tensors, mark: None)


@pytest.mark.parametrize(
    "kind",
    ["cnn", "lstm", "encoder", "mha", "transformer", "recursive", "reentrant", "nonreentrant"],
)
def test_held_ordinary_models_lose_no_module(kind: str) -> None:
    model, x, loss = _ordinary(kind)
    step, said = _monitored(model, x, loss)
    with _without_the_check():
        before, _ = _monitored(model, x, loss)
    assert set(step) == set(before) and len(step) > 0, (set(before) - set(step), said)
    assert not [s for s in said if "made before the call" in s], said


def test_held_every_two_and_a_model_on_a_worker_thread() -> None:
    model, x, loss = _ordinary("cnn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model, every=2)
        for _ in range(4):
            loss(model(x)).backward()
        monitor.remove()
        _busy(500)  # the main thread's counter ahead of the worker's
        with GradientMonitor(model) as threaded:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                out = pool.submit(model, x).result()
            loss(out).backward()
    assert [len(entry) for entry in monitor.history] == [13, 13]
    assert len(threaded.history[-1]) == 13
    assert not [w for w in caught if "made before the call" in str(w.message)]


# ------------------------------------------------------------ HELD: no new error, bounded cost


def _outcome(fn: Callable[[Any], Any]) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with GradientMonitor(model) as monitor:
                fn(model)
        return f"ok {len(monitor.history)}"
    except Exception as error:  # the outcome compared, whatever it is
        return f"{type(error).__name__}: {str(error)[:80]}"


def _transforms() -> dict[str, Callable[[Any], Any]]:
    from torch.func import functional_call, grad, jacrev, vmap

    x = torch.randn(5, 3)

    def dual(model: Any) -> Any:
        import torch.autograd.forward_ad as fwad

        with fwad.dual_level():
            model(fwad.make_dual(x, torch.ones_like(x))).sum().backward()

    def nested(model: Any) -> Any:
        t = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
        model(t).values().sum().backward()

    def inference(model: Any) -> Any:
        with torch.inference_mode():
            return model(x)

    def meta(model: Any) -> Any:
        with GradientMonitor(m := copy.deepcopy(model).to("meta")):
            m(torch.randn(5, 3, device="meta")).sum().backward()

    return {
        "vmap": lambda m: vmap(m)(x).sum().backward(),
        "grad": lambda m: grad(lambda p: functional_call(m, p, (x,)).sum())(
            dict(m.named_parameters())
        ),
        "jacrev": lambda m: jacrev(m)(x[0]),
        "vmap_grad": lambda m: vmap(grad(lambda xi: m(xi).sum()))(x),
        "dual": dual,
        "nested": nested,
        "inference": inference,
        "meta": meta,
    }


@pytest.mark.parametrize(
    "kind", ["vmap", "grad", "jacrev", "vmap_grad", "dual", "nested", "inference", "meta"]
)
def test_held_transforms_end_as_they_did_before_the_change(kind: str) -> None:
    fn = _transforms()[kind]
    now = _outcome(fn)
    with _without_the_check():
        before = _outcome(fn)
    assert now == before, (now, before)


# ------------------------------------------------------------------------------- FINDINGS


class _State(nn.Module):
    def __init__(self, how: str = "plain") -> None:
        super().__init__()
        self.how = how
        self.mem: Any = None

    def forward(self, x: Any) -> Any:
        if self.how == "add_":
            self.mem.add_(1.0)
        elif self.how == "setitem":
            self.mem[0] = 0.0
        return self.mem


# the pools `_Threaded` runs on (not its attributes: the oracle deep-copies the model)
_POOLS: dict[str, Any] = {}


class _Threaded(nn.Module):
    """`h = pre(x)` (on `_POOLS["pre"]` if set); `inner` returns it (run on
    `_POOLS["inner"]` if set)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = _State()

    def forward(self, x: Any) -> Any:
        pool_pre, pool_inner = _POOLS.get("pre"), _POOLS.get("inner")
        h = self.pre(x) if pool_pre is None else pool_pre.submit(self.pre, x).result()
        self.inner.mem = h
        out = self.inner(x) if pool_inner is None else pool_inner.submit(self.inner, x).result()
        return h.sum() + 2.0 * out.sum() + 3.0 * h.sum()


def test_finding1a_the_call_on_a_fresh_worker_thread() -> None:
    torch.manual_seed(0)
    _busy(500)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        _POOLS["inner"] = pool
        try:
            model = _Threaded()
            want = _native_norms(model, ["inner"], torch.randn(5, 3), lambda out: out)["inner"]
            step, said = _monitored(model, torch.randn(5, 3), lambda out: out)
        finally:
            _POOLS.clear()
    assert want == pytest.approx(80**0.5)
    # got: 26.83 (6 x sqrt(20): every use of `h`), no warning
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(want), step


def test_finding1b_the_state_made_on_a_busy_worker_thread() -> None:
    torch.manual_seed(0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # the worker's counter past the main thread's
        pool.submit(_busy, torch._C._autograd._get_sequence_nr() + 3000).result()
        _POOLS["pre"] = pool
        try:
            model = _Threaded()
            want = _native_norms(model, ["inner"], torch.randn(5, 3), lambda out: out)["inner"]
            step, said = _monitored(model, torch.randn(5, 3), lambda out: out)
        finally:
            _POOLS.clear()
    assert want == pytest.approx(80**0.5)
    # got: 26.83, no warning
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(want), step


class _Memo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.cache: Any = None

    def forward(self, x: Any) -> Any:
        if self.cache is None:
            self.cache = self.fc(x)
        return self.cache


class _Memoising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Memo()

    def forward(self, x: Any) -> Any:
        self.inner.cache = None
        a = self.inner(x)
        b = self.inner(x)
        return a.sum() + 2.0 * b.sum()


def test_finding2_a_memoising_module_called_twice() -> None:
    torch.manual_seed(0)
    model = _Memoising()
    x = torch.randn(5, 3)
    want = _native_norms(model, ["inner"], x, lambda out: out)["inner"]
    assert want == pytest.approx(10.0)
    step, said = _monitored(model, x, lambda out: out)
    assert any("'inner'" in s and "not recorded" in s for s in said), said
    # got: 13.42 (3 x sqrt(20)) beside "its grad_output norm is not recorded"
    assert "inner" not in step or step["inner"] == pytest.approx(want), step


class _InPlace(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = _State(how)

    def forward(self, x: Any) -> Any:
        h = self.pre(x) * 1.0
        self.inner.mem = h
        return 2.0 * self.inner(x).sum() + 3.0 * h.sum()


@pytest.mark.parametrize("how", ["add_", "setitem"])
def test_finding3_a_state_changed_in_place_and_returned(how: str) -> None:
    torch.manual_seed(0)
    model = _InPlace(how)
    x = torch.randn(5, 3)
    want = _native_norms(model, ["inner"], x, lambda out: out)["inner"]
    assert want == pytest.approx(80**0.5)
    step, said = _monitored(model, x, lambda out: out)
    # got: 22.36 (5 x sqrt(20)), no warning
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(want), step


class _StaleView(nn.Module):
    def __init__(self, touch: bool) -> None:
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = _State()
        self.touch = touch

    def forward(self, x: Any) -> Any:
        h = self.pre(x) * 1.0
        v = h[:2]
        h.mul_(2.0)  # `v.grad_fn` is stale: regenerated at its next read
        if self.touch:
            assert v.grad_fn is not None
        self.inner.mem = v
        return 2.0 * self.inner(x).sum() + 3.0 * v.sum()


def test_held_a_stale_view_read_before_the_call_is_left_out() -> None:
    torch.manual_seed(0)
    step, said = _monitored(_StaleView(True), torch.randn(5, 3), lambda out: out)
    assert "inner" not in step and any("made before the call" in s for s in said), said


def test_finding4_a_view_whose_base_changed_in_place_before_the_call() -> None:
    torch.manual_seed(0)
    model = _StaleView(False)
    x = torch.randn(5, 3)
    want = _native_norms(model, ["inner"], x, lambda out: out)["inner"]
    assert want == pytest.approx(32**0.5)
    step, said = _monitored(model, x, lambda out: out)
    # got: 14.14 (5 x sqrt(8)), no warning
    assert ("inner" not in step and said) or step["inner"] == pytest.approx(want), step


_COMPILED = """
import copy, warnings
import torch
from torch import nn
from unihook.recipes import GradientMonitor

class State(nn.Module):
    mem = None
    def forward(self, x):
        return self.mem

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(3, 4)
        self.inner = State()
    def forward(self, x):
        h = self.pre(x)
        self.inner.mem = h
        return h.sum() + 2.0 * self.inner(x).sum()

torch.manual_seed(0)
model = Model()
x = torch.randn(5, 3)
ref = copy.deepcopy(model)
seen = []
ref.inner.register_full_backward_pre_hook(lambda m, g: seen.append(float(g[0].pow(2).sum())))
ref(x).backward()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", RuntimeWarning)
    with GradientMonitor(model) as monitor:
        torch.compile(model, backend=BACKEND)(x).backward()
said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
print(repr((sum(seen) ** 0.5, monitor.history[-1].get("inner"), said)))
"""


def test_finding5_a_compiled_model_returning_a_state() -> None:
    done = run_code(_COMPILED.replace("BACKEND", '"eager"'), timeout=120)
    want, got, said = last_value(done)
    assert want == pytest.approx(80**0.5)
    # got: 13.42, no warning (README: "left out on torch with the warning")
    assert (got is None and said) or got == pytest.approx(want), (got, said)


_OFF_POOL: dict[str, Any] = {}


class _Offloading(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.Tanh())

    def forward(self, x: Any) -> Any:
        return _OFF_POOL["pool"].submit(self.body, x).result()


class _Offloaded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.off = _Offloading()
        self.head = nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        return self.head(self.off(x)).pow(2).sum()


def test_finding6_a_child_run_on_a_pool_thread_is_said_to_be_a_state() -> None:
    torch.manual_seed(0)
    _busy(500)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        _OFF_POOL["pool"] = pool
        try:
            step, said = _monitored(_Offloaded(), torch.randn(5, 3), lambda out: out)
        finally:
            _OFF_POOL.clear()
    ours = [s for s in said if "'off'" in s]
    assert "off" not in step and ours and "off.body" in step, (step, said)  # (README)
    # got: "...returned a tensor made before the call that is not one of its arguments (a state
    # kept from earlier)..."
    assert "made before the call" not in ours[0] or "thread" in ours[0], ours


class _Pinn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: Any) -> Any:
        x = x * 1.0
        u = self.net(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
        return du.pow(2).sum()


@pytest.mark.xfail(strict=True, reason="FINDING 7: an output its own backward saved (double bw)")
def test_finding7_a_tanh_under_double_backward() -> None:
    torch.manual_seed(0)
    model = _Pinn()
    x = torch.randn(5, 1, requires_grad=True)
    want = _native_norms(model, ["net.1"], x, lambda out: out)["net.1"]
    step, said = _monitored(model, x, lambda out: out)
    assert "net.0" in step and "net.2" in step, step
    # got: 1.4535 where the native norm is 1.2721, no warning
    assert ("net.1" not in step and said) or step["net.1"] == pytest.approx(want, rel=1e-5), (
        step,
        want,
    )
