"""Guided backpropagation against torch's own hooks (the backend-neutral tests are in
unihook/conformance/test_guided_backprop.py)."""

from __future__ import annotations

import numpy as np
import pytest

from unihook.conformance import kit as kit_of
from unihook.conformance import kits
from unihook.conformance.test_guided_backprop import CLASS, IMAGE, guided_relu, saliency, small_cnn


def test_guided_saliency_matches_torch_native_hooks() -> None:
    """The oracle: the same hook registered with torch's own register_full_backward_hook."""
    torch = pytest.importorskip("torch")
    kit = kit_of("torch")
    model, relus = small_cnn(kit)
    for relu in relus:
        relu.register_full_backward_hook(guided_relu)
    x = torch.tensor(IMAGE, requires_grad=True)
    model(x)[0, CLASS].backward()
    expected = x.grad.numpy()
    for k in kits():
        np.testing.assert_allclose(saliency(k, guided=True), expected, rtol=1e-5, atol=1e-6)


def test_maps_under_torch_inference_mode() -> None:
    """GradCAM and GuidedBackprop called inside ``torch.inference_mode()`` on an input made
    there: the maps of a call outside it (helper-125's FINDING 5: torch's bare "element 0 of
    tensors does not require grad", then "Inference tensors cannot be saved for backward")."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import GradCAM, GuidedBackprop

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )
    data = torch.randn(2, 3, 8, 8)
    expected = GradCAM(model, "0")(data), GuidedBackprop(model)(data)
    with torch.inference_mode():
        x = data.clone()
        got = GradCAM(model, "0")(x), GuidedBackprop(model)(x)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
