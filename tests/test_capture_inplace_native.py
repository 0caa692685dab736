"""capture() beside a framework's own modes, compilers and structures (the backend-neutral
tests are in unihook/conformance/test_capture_inplace.py)."""

from __future__ import annotations

import collections
from typing import Any

import pytest

import unihook
from unihook.conformance import kit as kit_of
from unihook.conformance.test_capture_inplace import identity


def test_inference_mode_copies() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))
    for _ in range(2):
        with torch.inference_mode(), unihook.capture(model) as cache:
            model(torch.tensor([[1.0, -2.0]]))
            model(torch.tensor([[-1.0, 2.0]]))
        expected = [model[0](torch.tensor(x)).detach() for x in ([[1.0, -2.0]], [[-1.0, 2.0]])]
        assert all(torch.equal(a, b) for a, b in zip(cache.calls("0"), expected))


def test_torch_compile_copies() -> None:
    """Traced tensors' version counters say nothing about the compiled run: capture copies
    (with inductor, learning from them raised StaleCaptureError on the second capture)."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))
    compiled = torch.compile(model, backend="inductor")
    x = torch.tensor([[1.0, -2.0], [-1.0, 2.0]])
    expected = model[0](x).detach()
    for _ in range(3):
        with unihook.capture(model) as cache:
            compiled(x)
        assert torch.allclose(cache["0"], expected)


def test_torch_return_types() -> None:
    torch = pytest.importorskip("torch")

    class Max(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.max(x, 1)

    model = torch.nn.Sequential(Max())
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    for reuse in (False, True):
        with unihook.capture(model, reuse=reuse, grads=True) as cache:
            out = model[0](x)
            out.values.add_(1.0)  # modify the returned values in place
        assert type(cache["0"]) is torch.return_types.max
        assert cache["0"].values.tolist() == [1.0, 3.0] and cache["0"].indices.tolist() == [0, 1]


def test_paddle_structures_map_structure_cannot_rebuild() -> None:
    paddle = pytest.importorskip("paddle")
    h = paddle.ones([1])
    model = paddle.nn.Sequential(identity(kit_of("paddle")))
    for value in (collections.defaultdict(list, a=h), {1: h, "b": h}):
        with unihook.capture(model) as cache:
            with pytest.raises(unihook.HookTargetError, match="map_structure cannot rebuild"):
                model(value)
        assert "0" not in cache
