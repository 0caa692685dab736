"""A backward that raised on paddle keeps nothing of the model alive.

paddle 3.3.1 never frees a PyLayer whose backward raised (docs/SEMANTICS.md §4.12), nor the
graph around it, and unihook's identity nodes held their module calls' state: a hook that
raised in a module backward (the user's own exception, an `InPlaceError`) kept the whole model
alive for the rest of the process (found 2026-12-07). After a Tensor.backward without
retain_graph, no pass can go through that graph again (the nodes that ran freed their
tensors): the nodes it reached let go of their calls. paddle.grad, which runs copies of the
nodes and may be retried, is unchanged.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

import unihook  # noqa: E402
from unihook.errors import InPlaceError  # noqa: E402


class _Keeps(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)

    def forward(self, h: Any) -> Any:
        self.kept = h
        return self.fc(h) * 2


def _run(raise_in_hook: bool, retain: bool = False) -> weakref.ref[Any]:
    x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]], stop_gradient=False)
    model = _Keeps()

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        if raise_in_hook:
            raise KeyError("the user's own")

    unihook.register_full_backward_hook(model, hook)
    h = x * 1
    out = model(h)
    if not raise_in_hook:
        paddle.nn.functional.relu_(h)  # (the kept input changed: InPlaceError)
    loss = out.sum() + (model.kept * 1).sum()
    with pytest.raises(KeyError if raise_in_hook else InPlaceError):
        loss.backward(retain_graph=retain)
    return weakref.ref(model)


@pytest.mark.parametrize("raise_in_hook", [True, False], ids=["users_error", "inplace_error"])
def test_a_backward_that_raised_keeps_no_model_alive(raise_in_hook: bool) -> None:
    ref = _run(raise_in_hook)
    gc.collect()
    assert ref() is None


def test_paddle_grad_retried_after_a_hook_raised_runs_the_hooks_again() -> None:
    """paddle.grad runs copies of the nodes: unchanged, a retry with retain_graph runs the
    hooks again and gives the gradient."""
    x = paddle.to_tensor([[1.0, 2.0, 3.0, 4.0]], stop_gradient=False)
    model = paddle.nn.Linear(4, 4)
    calls: list[int] = []

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise KeyError("once")

    unihook.register_full_backward_hook(model, hook)
    loss = model(x * 1).sum()
    with pytest.raises(KeyError):
        paddle.grad(loss, x, retain_graph=True)
    (grad,) = paddle.grad(loss, x, retain_graph=True)
    assert calls == [0, 1]
    expected = model.weight.sum(axis=1).numpy()
    assert grad.numpy()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("hooked", ["own", "global"])
def test_another_loss_through_calls_that_did_not_run_still_backpropagates(hooked: str) -> None:
    """Two losses share `a`'s call; the first one's backward raises in a hook of `b`, above
    `a`: `a`'s nodes never ran, and the second loss goes through them with `a`'s hook and
    paddle's gradient (a first version let go of every node the raising backward reached:
    BackendStateError, helper-183's FINDING 1)."""
    paddle.seed(0)
    a, b = paddle.nn.Linear(3, 3), paddle.nn.Linear(3, 3)

    def raises(module: Any, grad_input: Any, grad_output: Any) -> None:
        raise KeyError("b")

    seen: list[Any] = []

    def record(module: Any, grad_input: Any, grad_output: Any) -> None:
        if module is a:
            seen.append(grad_output[0].numpy().copy())

    handles = [unihook.register_full_backward_hook(b, raises)]
    if hooked == "own":
        handles.append(unihook.register_full_backward_hook(a, record))
    else:
        handles.append(unihook.register_module_full_backward_hook(record))
    x = paddle.to_tensor([[1.0, 2.0, 3.0]], stop_gradient=False)
    h = a(x)
    first, second = b(h).sum(), (h * 2).sum()
    with pytest.raises(KeyError):
        first.backward()
    second.backward()
    assert len(seen) == 1 and seen[0].tolist() == [[2.0, 2.0, 2.0]]
    expected = (2 * a.weight.sum(axis=1)).numpy()
    assert x.grad.numpy()[0] == pytest.approx(expected, rel=1e-6)
    for handle in handles:
        handle.remove()
