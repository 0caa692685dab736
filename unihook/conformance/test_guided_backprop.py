"""Guided backpropagation, written once with unihook: a full backward hook on every ReLU module
clamps grad_input at 0 (``(g + abs(g)) / 2``: arithmetic both frameworks' tensors share). The
same small CNN with the same weights gives the same saliency map d(class score)/d(input) on
every backend, and it differs from the plain gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import unihook
from unihook.conformance import kits

RNG = np.random.default_rng(7)
WEIGHTS = {
    "conv1": (RNG.standard_normal((4, 1, 3, 3)) * 0.6, RNG.standard_normal(4) * 0.1),
    "conv2": (RNG.standard_normal((4, 4, 3, 3)) * 0.3, RNG.standard_normal(4) * 0.1),
    "fc": (RNG.standard_normal((3, 4 * 6 * 6)) * 0.1, RNG.standard_normal(3) * 0.1),  # [out, in]
}
IMAGE = RNG.standard_normal((1, 1, 6, 6)).astype("float32")
CLASS = 1


def small_cnn(kit: Any, inplace: bool = False) -> tuple[Any, list[Any]]:
    conv1 = kit.conv2d(1, 4, 3, padding=1)
    conv2 = kit.conv2d(4, 4, 3, padding=1)
    for conv, name in ((conv1, "conv1"), (conv2, "conv2")):
        weight, bias = sorted(kit.parameters(conv), key=lambda p: -len(kit.numpy(p).shape))
        kit.set_value(weight, WEIGHTS[name][0])
        kit.set_value(bias, WEIGHTS[name][1])
    fc = kit.linear(4 * 6 * 6, 3, WEIGHTS["fc"][0], WEIGHTS["fc"][1])
    relus = [kit.relu_module(inplace=inplace), kit.relu_module(inplace=inplace)]

    def forward(self: Any, x: Any) -> Any:
        h = self.relu1(self.conv1(x))
        h = self.relu2(self.conv2(h))
        return self.fc(h.flatten(1))

    children = {"conv1": conv1, "relu1": relus[0], "conv2": conv2, "relu2": relus[1], "fc": fc}
    return kit.module(forward, children), relus


def guided_relu(module: Any, grad_input: Any, grad_output: Any) -> Any:
    return tuple(None if g is None else (g + abs(g)) / 2 for g in grad_input)


def saliency(kit: Any, guided: bool, inplace: bool = False) -> Any:
    model, relus = small_cnn(kit, inplace)
    handles = [unihook.register_full_backward_hook(r, guided_relu) for r in relus] if guided else []
    x = kit.tensor(IMAGE, requires_grad=True)
    out = model(x)
    onehot = np.zeros((1, 3), dtype="float32")
    onehot[0, CLASS] = 1
    kit.backward((out * kit.tensor(onehot)).sum())
    for handle in handles:
        handle.remove()
    return kit.grad(x)


def test_guided_saliency_differs_from_plain_gradient(backend: Any) -> None:
    guided = saliency(backend, guided=True)
    plain = saliency(backend, guided=False)
    assert guided.shape == IMAGE.shape
    assert np.abs(guided - plain).max() > 1e-3
    assert np.abs(guided).max() > 1e-3


def test_guided_saliency_with_inplace_relu(backend: Any) -> None:
    """torchvision models use ReLU(inplace=True), where torch's native full backward hook
    raises: the guided saliency is the same as without in-place ReLUs."""
    np.testing.assert_allclose(
        saliency(backend, guided=True, inplace=True),
        saliency(backend, guided=True),
        rtol=1e-5,
        atol=1e-6,
    )


def test_guided_saliency_is_the_same_on_every_backend() -> None:
    if len(kits()) < 2:
        pytest.skip("needs two installed backends")
    maps = {kit.name: saliency(kit, guided=True) for kit in kits()}
    plains = {kit.name: saliency(kit, guided=False) for kit in kits()}
    first = kits()[0].name
    for name, guided in maps.items():
        assert np.allclose(guided, maps[first], rtol=1e-5, atol=1e-6), name
        assert np.allclose(plains[name], plains[first], rtol=1e-5, atol=1e-6), name
