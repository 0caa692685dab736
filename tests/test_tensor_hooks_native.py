"""Tensor gradient hooks on cases a framework's own API builds (the backend-neutral ones are in
unihook/conformance/test_tensor_hooks.py)."""

from __future__ import annotations

from typing import Any

import pytest

import unihook


def test_unused_output_of_a_node_with_several() -> None:
    """torch calls the hooks of an output of a multi-output node that nothing used with None
    (GRU's `h`, MultiheadAttention's weights): the hook gets None, as torch's own; replacing it
    raises as torch does (paddle hands zeros there instead)."""
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 6, requires_grad=True)
    seen: list[Any] = []
    a, b = x.split(3, dim=1)
    unihook.register_tensor_hook(b, seen.append)
    a.sum().backward()
    assert seen == [None]
    a, b = x.split(3, dim=1)
    unihook.register_tensor_hook(b, lambda g: torch.ones(4, 3))
    with pytest.raises(unihook.HookReturnError, match="the gradient is None"):
        a.sum().backward()
