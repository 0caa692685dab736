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
