"""Grad-CAM and guided backpropagation, computed the same way on every backend.

Both run one forward and one backward of `model` (parameter gradients accumulate as in any
backward: clear them before an optimizer step). The maps are numpy arrays.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from unihook import (
    ops,
    register_forward_hook,
    register_full_backward_hook,
    register_full_backward_pre_hook,
    select,
)

from ._scope import Recipe

__all__ = ["GradCAM", "GuidedBackprop"]

Target = Union[None, int, Sequence[int]]


def _score(output: Any, target: Target) -> tuple[Any, np.ndarray]:
    """The sum over the batch of each sample's target logit (argmax when None)."""
    logits = ops.to_numpy(output)
    n, classes = logits.shape
    if target is None:
        chosen = logits.argmax(axis=1)
    elif isinstance(target, int):
        chosen = np.full(n, target)
    else:
        chosen = np.asarray(target)
    mask = np.zeros((n, classes), dtype=logits.dtype)
    mask[np.arange(n), chosen] = 1.0
    return (output * ops.as_tensor(mask, like=output)).sum(), chosen


def _resize_bilinear(maps: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of (N, h, w) maps with half-pixel centres (align_corners=False)."""
    _, h, w = maps.shape

    def axis(out: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(out) + 0.5) * size / out - 0.5, 0, size - 1)
        low = np.floor(pos).astype(int)
        high = np.minimum(low + 1, size - 1)
        return low, high, pos - low

    y0, y1, fy = axis(height, h)
    x0, x1, fx = axis(width, w)
    top = maps[:, y0][:, :, x0] * (1 - fx) + maps[:, y0][:, :, x1] * fx
    bottom = maps[:, y1][:, :, x0] * (1 - fx) + maps[:, y1][:, :, x1] * fx
    return top * (1 - fy)[None, :, None] + bottom * fy[None, :, None]


class GradCAM(Recipe):
    """``GradCAM(model, "layer4")(x, target=None)``: class activation maps (N, H, W) in [0, 1],
    upsampled to the input's size. `target`: None (each sample's top class), a class index, or
    one index per sample. `model` maps NCHW images to (N, classes) logits.
    """

    def __init__(self, model: Any, target_layer: str) -> None:
        super().__init__()
        self.model = model
        (name, layer), *_ = select(model, target_layer) + [(None, None)]
        if name != target_layer:
            raise ValueError(f"`target_layer` must name one module. Received: {target_layer!r}")
        self._activation: Any = None
        self._gradient: Any = None
        self._hooks.add(name, register_forward_hook(layer, self._keep_activation, name=name))
        self._hooks.add(
            name, register_full_backward_pre_hook(layer, self._keep_gradient, name=name)
        )
        self.target_classes: np.ndarray | None = None

    def _keep_activation(self, module: Any, args: Any, output: Any) -> None:
        self._activation = ops.to_numpy(output)

    def _keep_gradient(self, module: Any, grad_output: Any) -> None:
        self._gradient = ops.to_numpy(grad_output[0])

    def __call__(self, x: Any, target: Target = None) -> np.ndarray:
        if not self._hooks:
            raise RuntimeError("this GradCAM was removed: create a new one")
        score, self.target_classes = _score(self.model(x), target)
        score.backward()
        activation, gradient = self._activation, self._gradient
        self._activation = self._gradient = None
        weights = gradient.astype(np.float64).mean(axis=(2, 3))
        cams = np.maximum((weights[:, :, None, None] * activation).sum(axis=1), 0)
        cams = _resize_bilinear(cams, *ops.to_numpy(x).shape[2:])
        low = cams.min(axis=(1, 2), keepdims=True)
        span = cams.max(axis=(1, 2), keepdims=True) - low
        return ((cams - low) / np.where(span > 0, span, 1.0)).astype(np.float32)


class GuidedBackprop(Recipe):
    """``GuidedBackprop(model)(x, target=None)``: guided backpropagation saliency (N, C, H, W):
    the input gradient with every ReLU module's backward clamped to non-negative values
    (Springenberg et al. 2015). ReLUs called as functions are not seen: use ReLU modules.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        for name, module in select(model, lambda n, m: type(m).__name__ == "ReLU"):
            self._hooks.add(name, register_full_backward_hook(module, self._clamp, name=name))

    @staticmethod
    def _clamp(module: Any, grad_input: Any, grad_output: Any) -> Any:
        return tuple(None if g is None else ops.clamp(g, min=0.0) for g in grad_input)

    def __call__(self, x: Any, target: Target = None) -> np.ndarray:
        x = ops.leaf(x)
        score, _ = _score(self.model(x), target)
        score.backward()
        return ops.to_numpy(ops.grad_of(x))
