"""Structured outputs through module backward hooks: torch's own structured types (the
backend-neutral cases are in unihook/conformance/test_structured_backward.py)."""

from __future__ import annotations

from typing import Any

import pytest

from unihook.conformance.test_structured_backward import KINDS, _register


def test_torch_return_types_keep_their_type() -> None:
    torch = pytest.importorskip("torch")
    m = torch.nn.Module()
    m.forward = lambda x: torch.max(x, 1)  # type: ignore[method-assign]
    for kind in KINDS:
        seen: list[Any] = []
        handle = _register(kind, m, seen)
        x = torch.tensor([[1.0, 3.0], [4.0, 2.0]], requires_grad=True)
        out = m(x)
        assert type(out) is torch.return_types.max
        out.values.sum().backward()
        handle.remove()
        assert x.grad.tolist() == [[0.0, 1.0], [1.0, 0.0]]
        assert len(seen) == 1 and seen[0][1] is None
