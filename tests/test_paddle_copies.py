"""Paddle: gradients a module backward hook saw never change afterwards, with fewer copies.

Paddle changes gradients in place after a node returned them (an input buffer adds a later
gradient into the first one, a leaf's .grad accumulates, some grad kernels write over an
incoming gradient nothing else references), where torch never changes a gradient something
still references. unihook's identity nodes therefore hand paddle a copy of what a hook saw,
unless the running backward's graph shows nothing can change it (`_autograd_guard.passes_on`).
These tests attack that decision: generated models mixing fan-out, views of gradients (reshape,
flatten, transpose), in-place grad kernels (relu), parameters and leaves; hooks on random
modules keep the gradients they saw, views and detached aliases of them; after two backwards
(the leaves accumulate) every kept value is what the hook saw, and the gradients are those of
the model without hooks.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
hypothesis = pytest.importorskip("hypothesis")
warnings.filterwarnings("ignore", message="No ccache found")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from paddle.autograd import PyLayer  # noqa: E402
from unihook_paddle import _autograd_guard, _backward  # noqa: E402
from unihook_paddle._backward import FRESH, REUSES, VIEWS  # noqa: E402

import unihook  # noqa: E402

nn = paddle.nn
F = nn.functional
D = 4


@pytest.fixture(autouse=True)
def check_every_size() -> Any:
    """The models here are small: decide for gradients of every size, in every backward
    (unihook copies small ones without looking, `_CHECK_FROM`, and walks a graph only when
    the last backward's copies would have cost more, `_VALUES_PER_NODE`)."""
    saved = _backward._CHECK_FROM, _autograd_guard._VALUES_PER_NODE
    _backward._CHECK_FROM, _autograd_guard._VALUES_PER_NODE = 0, 0
    yield
    _backward._CHECK_FROM, _autograd_guard._VALUES_PER_NODE = saved


class Fn(nn.Layer):
    """A layer running `fn`, with optional sublayers."""

    def __init__(self, fn: Callable[..., Any], **children: nn.Layer) -> None:
        super().__init__()
        self.fn = fn
        for name, child in children.items():
            setattr(self, name, child)

    def forward(self, x: Any) -> Any:
        return self.fn(self, x)


def leaf_block(kind: str) -> nn.Layer:
    if kind == "linear":
        return nn.Linear(D, D)
    if kind == "linear_nobias":
        return nn.Linear(D, D, bias_attr=False)
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()
    if kind == "identity":
        return nn.Identity()
    if kind == "flatten":  # (a 2-d input: a no-op reshape, whose grad is a view)
        return nn.Flatten()
    if kind == "reshape":
        return Fn(lambda self, x: x.reshape([-1, D]))
    if kind == "transpose":
        return Fn(lambda self, x: x.transpose([1, 0]).transpose([1, 0]))
    if kind == "scale":
        return Fn(lambda self, x: x * 2.0)
    if kind == "twice":  # a tensor used twice inside: an input buffer adds into a gradient
        return Fn(lambda self, x: (lambda y: y + y * 3.0)(x * 1.0))
    if kind == "aux":  # the returned tensor also reaches the loss another way (its node: 2 edges)
        return Fn(lambda self, x: _aux(x * 1.5))
    if kind == "relu_view":  # the last node passes a view of its gradient to an in-place kernel
        return Fn(lambda self, x: F.relu(x * 1.0 - 0.1).view([-1, D]))
    if kind == "retained":  # user code can zero its output's .grad in place afterwards
        return Fn(lambda self, x: _retained(F.relu(x * 1.0 - 0.1)))
    if kind == "view_hooked":  # a tensor hook hands relu's kernel a view of the gradient
        return Fn(lambda self, x: _view_hooked(F.relu(x * 1.0 - 0.1)))
    raise AssertionError(kind)


RETAINED: list[Any] = []  # tensors whose .grad is zeroed in place after each backward


def _retained(y: Any) -> Any:
    y.retain_grads()
    RETAINED.append(y)
    return y


def _view_hooked(y: Any) -> Any:
    if not y.stop_gradient:  # (paddle refuses a hook on a tensor needing no grad)
        y.register_hook(lambda g: g.view(g.shape))
    return y


AUX: list[Any] = []  # what "aux" blocks add to the loss, per forward


def _aux(y: Any) -> Any:
    AUX.append(F.relu(F.relu(y) * 1.0).sum() * 0.1)
    return y


LEAVES = [
    "linear",
    "linear_nobias",
    "relu",
    "gelu",
    "identity",
    "flatten",
    "reshape",
    "transpose",
    "scale",
    "twice",
    "aux",
    "relu_view",
    "retained",
    "view_hooked",
]


def build(spec: Any) -> nn.Layer:
    if isinstance(spec, str):
        return leaf_block(spec)
    kind, children = spec
    layers = [build(c) for c in children]
    if kind == "seq":
        return nn.Sequential(*layers)
    body = nn.Sequential(*layers)
    if kind == "residual":  # the input used twice: by the body and by the add
        return Fn(lambda self, x: self.body(x) + x, body=body)
    if kind == "fanout":  # the body's output reaches the loss twice
        return Fn(lambda self, x: (lambda y: y * 2.0 + F.relu(y))(self.body(x)), body=body)
    if kind == "retain_child":  # the child's output (unihook's alias) has its .grad retained
        return Fn(lambda self, x: _retained(self.body(x)), body=body)
    if kind == "late_residual":  # the input's other use is far from the loss: the body's
        # gradient for it arrives first, and is the one paddle's input buffer adds into
        return Fn(lambda self, x: self.body(x) + F.relu(F.relu(x * 1.0) * 1.0) * 1.0, body=body)
    raise AssertionError(kind)


specs = st.recursive(
    st.sampled_from(LEAVES),
    lambda inner: st.tuples(
        st.sampled_from(["seq", "residual", "fanout", "late_residual", "retain_child"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=8,
)

KEEPS = ["object", "detach", "view", "reshape", "slice"]


def keep(g: Any, how: str) -> Any:
    if how == "object":
        return g
    if how == "detach":
        return g.detach()
    if how == "view":
        return g.view(g.shape)
    if how == "reshape":
        return g.reshape([-1])
    return g[:]


class Keeper:
    """Hooks that keep what they saw, as a tensor and as a snapshot of its values."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, Any, np.ndarray]] = []

    def add(self, where: str, grads: Any, how: str) -> None:
        for g in grads:
            if g is not None:
                self.kept.append((where, keep(g, how), g.numpy().copy()))

    def check(self) -> None:
        for where, tensor, seen in self.kept:
            np.testing.assert_array_equal(
                tensor.numpy().reshape(seen.shape), seen, err_msg=f"kept at {where}"
            )


def run(
    model: nn.Layer, x0: np.ndarray, w: np.ndarray, grad_api: bool, input_kind: str
) -> list[np.ndarray]:
    """Two forward + backward passes (the leaves accumulate); the gradients. `input_kind`:
    the input is a leaf, made from one, or needs no grad (the first hooked layers then have
    no input side, and the guard holds their grad_output, see `guard.UNTIL_END`)."""
    model.clear_gradients()
    x = paddle.to_tensor(x0)
    x.stop_gradient = input_kind == "no_grad"
    params = [p for p in model.parameters() if not p.stop_gradient]
    wrt = params if x.stop_gradient else [x, *params]
    out: list[np.ndarray] = []
    for step in range(2):
        AUX.clear()
        y = model(x if input_kind != "made" else x * 1.0)
        loss = ((y * paddle.to_tensor(w)).sum() + sum(AUX, paddle.zeros([]))) * (step + 1.0)
        if loss.stop_gradient:
            return out  # (nothing in the model needs grad)
        if grad_api:
            grads = paddle.grad([loss], wrt, allow_unused=True)
            out += [np.zeros(1) if g is None else g.numpy() for g in grads]
        else:
            loss.backward()
        for t in RETAINED:
            # (paddle zeroes it in place; not the input itself, which `identity` returns
            # without hooks, and an alias of with backward hooks, as torch's)
            if t.grad is not None and not t.is_leaf:
                t.clear_gradient()
        RETAINED.clear()
    if not grad_api:
        out = [np.zeros(1) if p.grad is None else p.grad.numpy() for p in wrt]
    return out


def hook_all(model: nn.Layer, chosen: list[tuple[int, str, str]], keeper: Keeper) -> list[Any]:
    layers = [layer for _, layer in model.named_sublayers(include_self=True)]
    handles = []
    for index, kind, how in chosen:
        layer = layers[index % len(layers)]
        where = f"{type(layer).__name__}#{index % len(layers)}"
        if kind in ("pre", "both"):

            def pre(m: Any, grad_output: Any, where: str = where, how: str = how) -> None:
                keeper.add(where + " grad_output (pre)", grad_output, how)

            handles.append(unihook.register_full_backward_pre_hook(layer, pre))
        if kind in ("full", "both"):

            def full(
                m: Any, grad_input: Any, grad_output: Any, where: str = where, how: str = how
            ) -> None:
                keeper.add(where + " grad_input", grad_input, how)
                keeper.add(where + " grad_output", grad_output, how)

            handles.append(unihook.register_full_backward_hook(layer, full))
    return handles


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec=specs,
    chosen=st.lists(
        st.tuples(
            st.integers(0, 63), st.sampled_from(["pre", "full", "both"]), st.sampled_from(KEEPS)
        ),
        min_size=1,
        max_size=8,
    ),
    grad_api=st.booleans(),
    input_kind=st.sampled_from(["leaf", "made", "no_grad"]),
    seed=st.integers(0, 2**16),
)
def test_kept_gradients_never_change(
    spec: Any, chosen: list[tuple[int, str, str]], grad_api: bool, input_kind: str, seed: int
) -> None:
    paddle.seed(seed)
    model = build(("seq", [spec]))
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((2, D)).astype("float32")
    w = rng.standard_normal((2, D)).astype("float32")
    want = run(model, x0, w, grad_api, input_kind)
    keeper = Keeper()
    handles = hook_all(model, chosen, keeper)
    try:
        got = run(model, x0, w, grad_api, input_kind)
    finally:
        for h in handles:
            h.remove()
    keeper.check()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"model {spec}")


def test_a_chain_of_hooked_layers_passes_gradients_on_uncopied(monkeypatch: Any) -> None:
    """Whether a gradient a hook saw goes on as a copy is decided per node: along a chain of
    hooked layers whose nodes write new memory, none is copied; what goes to the leaf (which
    accumulates it) is, and so is a Flatten's grad_output (its node passes a view of it on)."""
    copied: list[tuple[int, ...]] = []
    original = paddle.Tensor.clone

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        copied.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    def hooked(*layers: nn.Layer) -> nn.Layer:
        model = nn.Sequential(*layers)
        for layer in model.sublayers(include_self=True):
            unihook.register_full_backward_hook(layer, lambda *a: None)
        return model

    x = paddle.ones([2, D])
    x.stop_gradient = False
    chain = hooked(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 3))
    flat = hooked(nn.Linear(D, D), nn.Flatten(), nn.ReLU())
    monkeypatch.setattr(paddle.Tensor, "clone", counting)
    chain(x).sum().backward()
    assert copied == [(2, D)]  # the Sequential's grad_input, for x.grad
    copied.clear()
    flat(x).sum().backward()
    assert sorted(copied) == [(2, D)] * 2  # x.grad's, and the Flatten's grad_output


def _keep_all(kept: list[tuple[str, Any, np.ndarray]]) -> tuple[Any, Any]:
    def pre(m: Any, grad_output: Any) -> None:
        for g in grad_output:
            kept.append(("pre", g, g.numpy().copy()))
            kept.append(("pre view", g.view(g.shape), g.numpy().copy()))

    def full(m: Any, grad_input: Any, grad_output: Any) -> None:
        for what, grads in (("grad_input", grad_input), ("grad_output", grad_output)):
            for g in grads:
                if g is not None:
                    kept.append((what, g.reshape([-1]), g.numpy().reshape([-1]).copy()))

    return pre, full


def _unchanged(kept: list[tuple[str, Any, np.ndarray]]) -> None:
    assert kept
    for what, tensor, seen in kept:
        np.testing.assert_array_equal(tensor.numpy(), seen, err_msg=what)


def test_a_view_node_below_the_output_side_gets_a_copy() -> None:
    """A layer whose last node passes a view of grad_output to relu's grad kernel: the kernel
    may write over that view (nothing holds it, whatever holds grad_output), so the
    grad_output the pre-hook kept must go on as a copy."""
    m = Fn(lambda self, x: F.relu(x * 1.0 - 0.1).view([-1, D]))
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    unihook.register_full_backward_pre_hook(m, pre)
    unihook.register_full_backward_hook(m, full)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, D)).astype("float32"))
    x.stop_gradient = False
    (m(x * 1.0) * paddle.rand([2, D])).sum().backward()
    _unchanged(kept)


def test_an_identity_node_given_a_gradient_uncopied_keeps_it_safe() -> None:
    """An identity node that passed a gradient on uncopied because the next node is another
    identity node obliges that one to keep it safe, also when its own hooks do not fire: here
    the outer layer's output is not used, its full hooks do not fire, and the leaf it passes
    the inner layer's grad_input to accumulates it in place at the second backward."""
    inner = Fn(lambda self, x: x * 2.0)
    aux: list[Any] = []
    outer = Fn(lambda self, x: (aux.append(self.inner(x).sum()), x * 0.0)[1], inner=inner)
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    unihook.register_full_backward_hook(inner, full)
    unihook.register_full_backward_hook(outer, lambda *a: None)
    x = paddle.ones([2, D])
    x.stop_gradient = False
    for _ in range(2):
        aux.clear()
        outer(x)
        aux[0].backward()
    _unchanged(kept)
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, D), 4.0))


def test_a_tensor_hook_returning_a_view_does_not_reach_what_hooks_saw() -> None:
    """A tensor hook inside the layer returns a view of its gradient: relu's grad kernel may
    write over that view, so grad_output goes on as a copy."""
    m = Fn(lambda self, x: _view_hooked(F.relu(x)))
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    unihook.register_full_backward_pre_hook(m, pre)
    unihook.register_full_backward_hook(m, full)
    x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]])
    x.stop_gradient = False
    (m(x) * paddle.to_tensor([[10.0, 20.0, 30.0, 40.0]])).sum().backward()
    _unchanged(kept)
    np.testing.assert_array_equal(x.grad.numpy(), [[0.0, 20.0, 0.0, 40.0]])


def test_a_retained_grad_zeroed_in_place_does_not_reach_what_hooks_saw() -> None:
    """paddle's retained .grad of a non-leaf is the gradient itself (torch's is a copy); user
    code zeroing it in place (`clear_gradient()`) must not change what a hook saw, on either
    side of the retained tensor."""
    a = Fn(lambda self, x: _retained(F.relu(x)))
    b = nn.Linear(2, 2)
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    for layer in (a, b):
        unihook.register_full_backward_pre_hook(layer, pre)
        unihook.register_full_backward_hook(layer, full)
    x = paddle.to_tensor([[1.0, 2.0]])
    x.stop_gradient = False
    y = a(x)
    y.retain_grads()
    b(y).sum().backward()
    y.clear_gradient()
    for t in RETAINED:
        t.clear_gradient()
    RETAINED.clear()
    _unchanged(kept)


def test_small_gradients_are_copied_without_looking(monkeypatch: Any) -> None:
    """Below `_CHECK_FROM` values a copy costs less than the check: a chain of small layers is
    copied throughout, a chain of large ones is not."""
    _backward._CHECK_FROM = 1 << 16
    _autograd_guard._history[:] = [0, 0]
    copied: list[tuple[int, ...]] = []
    original = paddle.Tensor.clone

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        copied.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    for width, copies in ((4, 6), (1 << 16, 1)):
        model = nn.Sequential(nn.ReLU(), nn.ReLU())
        for layer in model.sublayers(include_self=True):
            unihook.register_full_backward_hook(layer, lambda *a: None)
        x = paddle.ones([1, width])
        x.stop_gradient = False
        monkeypatch.setattr(paddle.Tensor, "clone", counting)
        model(x).sum().backward()
        monkeypatch.undo()
        assert len(copied) == copies, (width, copied)  # large: only x.grad's
        copied.clear()


def test_a_graph_is_walked_only_when_the_last_copies_cost_more(monkeypatch: Any) -> None:
    """The walk (about 4 us a node) is made in a backward when the values asked about in the
    previous one would have cost more to copy (0.7 ns a value): a deep stack of small layers
    behind one large one is copied without a walk from its second backward on; a stack of
    large ones is walked every time."""
    _backward._CHECK_FROM = 1 << 16
    _autograd_guard._VALUES_PER_NODE = 6000
    _autograd_guard._history[:] = [0, 0]
    # (the marks of nodes user code can see that an earlier test's graph, still alive, left:
    # each makes every backward walk its graph to look below them, `receives_seen`)
    monkeypatch.setattr(_autograd_guard, "_seen", set())
    walks = []
    graph = _autograd_guard._Graph

    def counting(roots: Any) -> Any:
        walks.append(1)
        return graph(roots)

    monkeypatch.setattr(_autograd_guard, "_Graph", counting)
    for layers, walked in (
        ([nn.ReLU(), nn.Linear(1 << 16, 4), *(nn.ReLU() for _ in range(100))], 1),
        ([nn.ReLU() for _ in range(40)], 3),
    ):
        model = nn.Sequential(*layers)
        for layer in model.sublayers():
            unihook.register_full_backward_hook(layer, lambda *a: None)
        x = paddle.ones([1, 1 << 16])
        x.stop_gradient = False
        _autograd_guard._history[:] = [0, 0]
        walks.clear()
        for _ in range(3):
            model(x).sum().backward()
        assert len(walks) == walked, len(layers)


def test_a_cnn_at_the_default_thresholds(monkeypatch: Any) -> None:
    """The defaults (`_CHECK_FROM`, `_VALUES_PER_NODE`) on a small CNN whose activations are
    large enough to be asked about: hooks on every layer keep what they saw (tensors and
    views), a retained output's .grad is zeroed after each backward, over three backwards;
    kept values and gradients are those of the model without hooks, and fewer gradients are
    copied than hooks saw."""
    _backward._CHECK_FROM = 1 << 16
    _autograd_guard._VALUES_PER_NODE = 6000
    _autograd_guard._history[:] = [0, 0]
    paddle.seed(1)
    layers: list[nn.Layer] = []
    for c_in, c_out in ((3, 16), (16, 16)):
        layers += [nn.Conv2D(c_in, c_out, 3, padding=1), nn.BatchNorm2D(c_out), nn.ReLU()]
    model = nn.Sequential(*layers, nn.MaxPool2D(2), nn.Flatten(), nn.Linear(16 * 32 * 32, 10))
    x0 = np.random.default_rng(1).standard_normal((8, 3, 64, 64)).astype("float32")

    def run() -> list[np.ndarray]:
        model.clear_gradients()
        x = paddle.to_tensor(x0)
        x.stop_gradient = False
        for _ in range(3):
            out = model(x)
            out.retain_grads()
            (out * paddle.arange(10, dtype="float32")).sum().backward()
            out.clear_gradient()
        return [x.grad.numpy()] + [
            p.grad.numpy() for p in model.parameters() if not p.stop_gradient
        ]

    want = run()
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    for layer in model.sublayers(include_self=True):
        unihook.register_full_backward_pre_hook(layer, pre)
        unihook.register_full_backward_hook(layer, full)
    copied: list[int] = []
    original = paddle.Tensor.clone

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        copied.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(paddle.Tensor, "clone", counting)
    got = run()
    monkeypatch.undo()
    _unchanged(kept)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    exposed = 3 * 2 * len(model.sublayers(include_self=True))  # (each side's hooks saw some)
    assert 0 < len(copied) < exposed / 2, (len(copied), exposed)


def test_one_mark_a_node_whatever_is_registered_and_removed() -> None:
    """Registering and removing a tensor hook again and again on one tensor while an identity
    node lives leaves one mark on its node (each used to add one: the backward slowed)."""
    lin = nn.Linear(D, D)
    unihook.register_full_backward_hook(lin, lambda *a: None)
    x = paddle.ones([2, D])
    x.stop_gradient = False
    t = x * 2.0
    out = lin(t)  # (an identity node lives)
    before = len(_autograd_guard._marks)
    for _ in range(200):
        t.register_hook(lambda g: None).remove()
    assert len(_autograd_guard._marks) == before + 1
    out.sum().backward()


def test_marks_coming_and_going_on_another_thread_during_backward() -> None:
    """One thread creates and drops marked tensors (20,000 marks alive) while this one runs
    backwards that look at the marks (a retained output): the marks are read consistently."""
    import threading
    import time

    model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(2)))
    for layer in model:
        unihook.register_full_backward_hook(layer, lambda *a: None)
    x = paddle.randn([256, 256])
    x.stop_gradient = False
    alive = model(x)  # (an identity node lives: registrations mark)
    base = paddle.ones([4])
    base.stop_gradient = False
    held = []
    for _ in range(20000):
        t = base * 1.0
        t.register_hook(lambda g: None)
        held.append(t)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            t = base * 1.0
            t.register_hook(lambda g: None)
            held.append(t)
            held.pop(0)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=churn)
    thread.start()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            y = model(x)
            y.retain_grads()
            (y * 1.0).sum().backward()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    del alive


class _Holding(PyLayer):
    """An identity whose backward keeps the gradient it passes on referenced (as unihook's
    output side does until the call's full hooks ran) and records it."""

    seen: list[Any] = []

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:  # type: ignore[override]
        return x.view(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        _Holding.seen[:] = [grad, grad.numpy().copy()]
        return grad


def _tensor(*shape: int) -> Any:
    t = paddle.rand(list(shape)) + 0.5
    t.stop_gradient = False
    return t


# One op per name of FRESH (several where paddle might take a shortcut), on an input of shape:
_bn = nn.BatchNorm2D(2)
_bn_eval = nn.BatchNorm2D(2)
_bn_eval.eval()
FRESH_CASES: list[tuple[str, tuple[int, ...], Callable[[Any], Any]]] = [
    ("AddGradNode", (3, 4), lambda t: t + paddle.rand([3, 4])),
    ("AddGradNode", (3, 4), lambda t: t + paddle.zeros([4])),
    ("AddGradNode", (3, 4), lambda t: t + t),
    ("AddGradNode", (1, 2, 4, 4), nn.Conv2D(2, 2, 3, padding=1)),
    ("AddGradNode", (3, 4), nn.Linear(4, 4)),
    ("BatchNormGradNode", (2, 2, 4, 4), _bn),
    ("BatchNormGradNode", (2, 2, 4, 4), _bn_eval),
    ("ConcatGradNode", (3, 4), lambda t: paddle.concat([t, t * 2])),
    ("ConcatGradNode", (3, 4), lambda t: paddle.concat([t])),
    ("Conv2dGradNodeFinal", (1, 2, 4, 4), nn.Conv2D(2, 2, 3, padding=1, bias_attr=False)),
    ("Conv2dGradNodeFinal", (1, 2, 4, 4), nn.Conv2D(2, 2, 1, bias_attr=False)),
    (
        "DepthwiseConv2dGradNode",
        (1, 2, 4, 4),
        nn.Conv2D(2, 2, 3, padding=1, groups=2, bias_attr=False),
    ),
    ("DivideGradNode", (3, 4), lambda t: t / (paddle.rand([3, 4]) + 1)),
    ("DropoutGradNode", (3, 4), lambda t: F.dropout(t, 0.5, training=True)),
    ("DropoutGradNode", (3, 4), lambda t: F.dropout(t, 0.5, training=False)),
    ("ExpGradNode", (3, 4), paddle.exp),
    ("GeluGradNode", (3, 4), F.gelu),
    ("HardswishGradNode", (3, 4), F.hardswish),
    ("LayerNormGradNode", (3, 4), nn.LayerNorm(4)),
    ("LeakyReluGradNode", (3, 4), F.leaky_relu),
    ("MatmulGradNode", (3, 4), lambda t: paddle.matmul(t, paddle.eye(4))),
    ("MatmulGradNode", (3, 4), nn.Linear(4, 4, bias_attr=False)),
    ("MeanGradNode", (3, 4), lambda t: t.mean(-1)),
    ("MeanGradNode", (3, 1), lambda t: t.mean(-1)),
    ("MultiplyGradNode", (3, 4), lambda t: t * paddle.ones([3, 4])),
    ("MultiplyGradNode", (3, 4), lambda t: t * t),
    ("Pool2dGradNode", (1, 2, 4, 4), lambda t: F.max_pool2d(t, 2)),
    ("Pool2dGradNode", (1, 2, 4, 4), lambda t: F.max_pool2d(t, 1)),
    ("Pool2dGradNode", (1, 2, 4, 4), lambda t: F.avg_pool2d(t, 1)),
    ("Pool2dGradNode", (1, 2, 4, 4), lambda t: F.adaptive_avg_pool2d(t, 4)),
    ("Relu6GradNode", (3, 4), F.relu6),
    ("ReluGradNode", (3, 4), F.relu),
    ("ReluGradNode", (3, 4), lambda t: F.relu(t - 10)),
    ("ScaleGradNode", (3, 4), lambda t: t * 2.0),
    ("ScaleGradNode", (3, 4), lambda t: t * 1.0),
    ("ScaleGradNode", (3, 4), lambda t: paddle.scale(t, 1.0, 0.0)),
    ("ScaleGradNode", (3, 4), lambda t: t + 0),
    ("SigmoidGradNode", (3, 4), F.sigmoid),
    ("SiluGradNode", (3, 4), F.silu),
    ("SoftmaxGradNode", (3, 4), lambda t: F.softmax(t, -1)),
    ("SoftmaxGradNode", (3, 1), lambda t: F.softmax(t, -1)),
    ("SubtractGradNode", (3, 4), lambda t: t - paddle.rand([3, 4])),
    ("SumGradNode", (3, 4), lambda t: t.sum(-1)),
    ("SumGradNode", (3, 1), lambda t: t.sum(-1)),
    ("TanhGradNode", (3, 4), paddle.tanh),
]


def test_every_fresh_node_has_cases() -> None:
    assert {name for name, _, _ in FRESH_CASES} == set(FRESH)


@pytest.mark.parametrize(
    "name,shape,op", FRESH_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FRESH_CASES)]
)
def test_fresh_nodes_return_new_memory(name: str, shape: tuple[int, ...], op: Any) -> None:
    """The premise of FRESH on the installed paddle: with its incoming gradient referenced, the
    node leaves it unchanged and returns no gradient sharing its memory."""
    t = _tensor(*shape)
    h = t * 1.0  # (its gradient: what the node returned for its input)
    got: list[Any] = []
    h.register_hook(lambda g: got.append(g))
    out = op(h)
    assert out.grad_fn.name() == name
    params = list(op.parameters()) if isinstance(op, nn.Layer) else []
    (_Holding.apply(out) * paddle.rand(out.shape)).sum().backward()
    grad, values = _Holding.seen
    np.testing.assert_array_equal(grad.numpy(), values)
    returned = got + [p.grad for p in params if p.grad is not None]
    assert returned
    assert not any(r._is_shared_buffer_with(grad) for r in returned)


class _ViewOfHeld(_Holding):
    """`_Holding` passing an unreferenced view of the gradient it keeps referenced (as a view
    node below a retained tensor does) on."""

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        _Holding.seen[:] = [grad, None]
        return grad.view(grad.shape)


def test_reusing_nodes_write_over_a_view() -> None:
    """The premise of REUSES on the installed paddle: given an unreferenced view of a gradient
    user code holds, the nodes in it may return that memory (some of their cases do), the other
    nodes of FRESH never do (so the reach of a retained .grad stops there)."""
    shares: dict[str, list[bool]] = {}
    for name, shape, op in FRESH_CASES:
        h = _tensor(*shape) * 1.0
        got: list[Any] = []
        h.register_hook(lambda g: got.append(g))
        out = op(h)
        params = list(op.parameters()) if isinstance(op, nn.Layer) else []
        (_ViewOfHeld.apply(out) * paddle.rand(out.shape)).sum().backward()
        held = _Holding.seen[0]
        returned = got + [p.grad for p in params if p.grad is not None]
        shares.setdefault(name, []).append(any(r._is_shared_buffer_with(held) for r in returned))
    assert {name for name, found in shares.items() if any(found)} == set(REUSES)


def test_a_retained_grad_behind_a_view_and_a_reusing_node_does_not_reach_what_hooks_saw() -> None:
    """A retained output of a Flatten (a view node) over a Sigmoid (whose kernel writes over the
    unreferenced view of the retained .grad it gets): the grad_input the hooks of the layer
    around kept shared the .grad's memory, which clear_gradient() then zeroed (an attack)."""
    retained: list[Any] = []

    class Retain(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Sigmoid(), nn.Flatten())

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            y.retain_grads()
            retained.append(y)
            return y

    inner = Retain()
    model = nn.Sequential(inner)
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    unihook.register_full_backward_pre_hook(model, lambda m, go: None)
    unihook.register_full_backward_hook(inner, full)
    x = paddle.to_tensor(np.linspace(-1, 1, 90000, dtype="float32").reshape(300, 300))
    x.stop_gradient = False
    for _ in range(2):
        retained.clear()
        (model(x * 1.0) * 3.0).sum().backward()
        retained[0].clear_gradient()
        _unchanged(kept)


def test_views_write_nothing() -> None:
    """The premise of VIEWS: the node passes a view of its gradient on, unchanged."""
    assert VIEWS == {"ViewShapeGradNode"}
    h = _tensor(3, 4) * 1.0
    out = h.view([3, 4])
    assert out.grad_fn.name() == "ViewShapeGradNode"
    got: list[Any] = []
    h.register_hook(lambda g: got.append(g))
    (_Holding.apply(out) * 3.0).sum().backward()
    grad, values = _Holding.seen
    np.testing.assert_array_equal(grad.numpy(), values)
    np.testing.assert_array_equal(got[0].numpy(), values)


@pytest.mark.parametrize("how", ["retained", "view_hook"])
@pytest.mark.parametrize("kind", ["pre", "full", "global_pre", "global_full"])
def test_a_module_returning_a_tensor_made_before_the_hooks(how: str, kind: str) -> None:
    """The module's input needs no grad and it returns a tensor made (and retained, or given a
    tensor hook returning a view) before any unihook hook existed, so its node carries no mark:
    the grad_output the hooks kept must not change when `.grad` is zeroed in place or a grad
    kernel writes over the view. (An attack found both when an output side without an input
    side passed its gradients on uncopied, held until the backward ended: 696 of 1,584 cases.)"""
    a = paddle.randn([30, 30])
    a.stop_gradient = False
    t = F.relu(a * 1.0)
    if how == "retained":
        t.retain_grads()
    else:
        t.register_hook(lambda g: g.view(g.shape))

    class Returns(nn.Layer):
        def forward(self, x: Any) -> Any:
            return t

    model = Returns()
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    register = {
        "pre": lambda: unihook.register_full_backward_pre_hook(model, pre),
        "full": lambda: unihook.register_full_backward_hook(model, full),
        "global_pre": lambda: unihook.register_module_full_backward_pre_hook(pre),
        "global_full": lambda: unihook.register_module_full_backward_hook(full),
    }[kind]
    handle = register()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (full hooks: no input requires grad)
            (model(paddle.ones([2])) * paddle.randn([30, 30])).sum().backward()
    finally:
        handle.remove()
    if how == "retained":
        t.clear_gradient()
    _unchanged(kept)


def test_a_first_layer_without_input_side_keeps_what_its_hooks_saw() -> None:
    """The input needs no grad (as a CNN's images): the first Conv2D has no input side to hold
    the grad_output its hooks saw; what they kept (tensors and views) never changes, and the
    gradients are those without hooks, over three backwards, at the default thresholds."""
    _backward._CHECK_FROM = 1 << 16
    _autograd_guard._VALUES_PER_NODE = 6000
    _autograd_guard._history[:] = [0, 0]
    paddle.seed(2)
    model = nn.Sequential(nn.Conv2D(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2D(16, 4, 3))
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((8, 3, 64, 64)), "float32")

    def run() -> list[np.ndarray]:
        model.clear_gradients()
        for step in range(3):
            (model(x) * (step + 1.0)).sum().backward()
        return [p.grad.numpy() for p in model.parameters()]

    want = run()
    kept: list[tuple[str, Any, np.ndarray]] = []
    pre, full = _keep_all(kept)
    unihook.register_full_backward_pre_hook(model[0], pre)
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        unihook.register_full_backward_hook(model[0], full)
        got = run()
    _unchanged(kept)
    assert len(kept) == 3 * 3  # per backward: the pre-hook's tensor and view, the full hook's
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_redirected_output_hook_outside_a_guarded_backward_is_not_dropped() -> None:
    """A hook on a one-output identity's output records what it leaves for the node's
    backward in the running backward's state (paddle ignores it, SEMANTICS trap 5). Run where
    no backward runs under the guard, there is nowhere to record it: an error naming the
    module, not a dropped result."""
    from unihook_paddle._backward import _Node

    import unihook
    from unihook.backend import Site

    node = _Node(Site("full_backward", "paddle", "Linear"), 0)
    hook = node.redirect(lambda g: g * 2)
    with pytest.raises(unihook.BackendStateError, match="full_backward hook on Linear"):
        hook(paddle.ones([2]))
