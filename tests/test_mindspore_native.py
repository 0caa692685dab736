"""MindSpore's own API with unihook hooks: what the conformance kit's imperative tape cannot
express (`unihook.testing.creates_graph`), tested the framework's way. Runs in `make test`'s
MindSpore venv; skipped where MindSpore is not installed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import unihook  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


def _dense() -> Any:
    lin = ms.nn.Dense(2, 1)
    lin.weight.set_data(ms.Tensor(np.array([[1.0, 2.0]], np.float32)))
    lin.bias.set_data(ms.Tensor(np.zeros(1, np.float32)))
    return lin


def test_double_backward_by_nested_grad_fires_once_per_pass() -> None:
    """torch's `test_double_backward_fires_once_per_pass` (conformance), the MindSpore way:
    `grad(grad(f))`. The inner backward fires the hooks once, the second pass through the first
    backward once more; the values are torch's (2 y W, then 2 W (W . 1))."""
    lin = _dense()
    calls: list[tuple[str, Any]] = []
    handles = [
        unihook.register_full_backward_pre_hook(
            lin, lambda m, go: calls.append(("pre", go[0].asnumpy().tolist()))
        ),
        unihook.register_full_backward_hook(
            lin, lambda m, gi, go: calls.append(("full", gi[0].asnumpy().tolist()))
        ),
    ]
    x = ms.Tensor(np.array([[1.0, 1.0]], np.float32))
    try:
        first = ms.grad(lambda t: (lin(t) ** 2).sum())
        np.testing.assert_allclose(first(x).asnumpy(), [[6.0, 12.0]])
        assert calls == [("pre", [[6.0]]), ("full", [[6.0, 12.0]])]
        calls.clear()
        second = ms.grad(lambda t: first(t).sum())(x)
        np.testing.assert_allclose(second.asnumpy(), [[6.0, 12.0]])
        assert [kind for kind, _ in calls] == ["pre", "full", "pre", "full"]
    finally:
        for handle in handles:
            handle.remove()
    calls.clear()
    ms.grad(lambda t: (lin(t) ** 2).sum())(x)
    assert calls == []  # removed: no residue


def test_tensor_hook_under_nested_grad_sees_each_pass() -> None:
    """A tensor hook doubling the gradient of ``u = x * 1`` in ``grad(grad(u * u))``: it runs in
    both passes with torch's gradients (torch: create_graph, then a second autograd.grad)."""
    torch = pytest.importorskip("torch")
    seen: list[float] = []

    def f(t: Any) -> Any:
        u = t * 1
        unihook.register_tensor_hook(u, lambda g: (seen.append(float(g.asnumpy())), g * 2)[1])
        return u * u

    first = ms.grad(f)
    got = float(ms.grad(lambda t: first(t))(ms.Tensor(np.array(3.0, np.float32))).asnumpy())

    want: list[float] = []
    x = torch.tensor(3.0, requires_grad=True)
    u = x * 1
    unihook.register_tensor_hook(u, lambda g: (want.append(float(g.detach())), g * 2)[1])
    (gx,) = torch.autograd.grad(u * u, [x], create_graph=True)
    (gg,) = torch.autograd.grad(gx, [x])
    assert (got, seen) == (float(gg), want) == (8.0, [6.0, 4.0])


@pytest.mark.parametrize(
    "register",
    [
        lambda cell, x: unihook.register_forward_hook(cell, lambda *a: None),
        lambda cell, x: unihook.register_full_backward_hook(cell, lambda *a: None),
        lambda cell, x: unihook.register_tensor_hook(x, lambda g: None),
    ],
    ids=["forward", "full_backward", "tensor"],
)
def test_graph_mode_is_refused_at_registration(register: Any) -> None:
    """GRAPH_MODE compiles cells and skips Python hooks silently (or fails in MindSpore's graph
    parser): a clear error naming PyNative mode instead."""
    cell, x = _dense(), ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="x")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(unihook.BackendStateError, match="PYNATIVE_MODE.*GRAPH_MODE"):
            register(cell, x)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    register(cell, x).remove()  # (PyNative again: accepted)
