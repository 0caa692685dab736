"""A module that calls itself (a recursion), with global backward hooks on and its own backward
hooks registered inside one of its calls: each call fires the hooks it had when it started, as
torch's do, with its own grad_output, called by position or by keyword only (a call passing no
tensor by position passes on the same empty args as its outer call)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import unihook

CASES = [(depth, at) for depth in (1, 2, 3) for at in range(depth + 1)]


def _expected(depth: int, at: int, by_keyword: bool) -> list[tuple[str, float]]:
    """torch's order (measured with its native hooks): the call `d` levels deep has the own
    hooks if it started after their registration (d > depth - at); its grad_output sums to
    2 * 3 ** d. By position, the pre-hooks fire from the outer call in, the full hooks from
    the inner call out (after the input gradients); by keyword only, no input passes through
    the call, so its full hooks fire with its pre-hooks."""
    calls = []
    for d in range(depth + 1):
        grad = 2.0 * 3**d
        own = d > depth - at
        pre = [("G_pre", grad), *([("own_pre", grad)] if own else [])]
        full = [("G", grad), *([("own", grad)] if own else [])]
        calls.append((pre, full))
    if by_keyword:
        return [event for pre, full in calls for event in (*pre, *full)]
    return [e for pre, _ in calls for e in pre] + [e for _, full in reversed(calls) for e in full]


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize(("depth", "at"), CASES, ids=[f"depth{d}-at{a}" for d, a in CASES])
def test_hooks_registered_inside_a_recursive_call_fire_for_the_calls_after_it(
    backend: Any, depth: int, at: int, by_keyword: bool
) -> None:
    log: list[tuple[str, float]] = []
    handles: list[Any] = []

    def hook(tag: str) -> Any:
        def record(module: Any, *grads: Any) -> None:
            log.append((tag, float(backend.numpy(grads[-1][0]).sum())))

        return record

    def forward(self: Any, x: Any = None, level: int = 0) -> Any:
        if level == at:
            handles.append(unihook.register_full_backward_pre_hook(self, hook("own_pre")))
            handles.append(unihook.register_full_backward_hook(self, hook("own")))
        if level == 0:
            return x * 1.0
        inner = self(x=x * 2.0, level=level - 1) if by_keyword else self(x * 2.0, level - 1)
        return inner * 3.0

    on = backend.name
    handles += [
        unihook.register_module_full_backward_pre_hook(hook("G_pre"), backend=on),
        unihook.register_module_full_backward_hook(hook("G"), backend=on),
    ]
    model = backend.module(forward)
    x = backend.tensor([1.0, 1.0], requires_grad=True)
    try:
        out = model(x=x, level=depth) if by_keyword else model(x, depth)
        backend.backward(out.sum())
    finally:
        for handle in handles:
            handle.remove()
    assert log == _expected(depth, at, by_keyword)
    np.testing.assert_allclose(backend.grad(x), [6.0**depth] * 2)
