"""Grad-CAM and guided backpropagation, computed the same way on every backend.

Both run one forward and one backward of `model` (parameter gradients accumulate as in any
backward: clear them before an optimizer step). The maps are numpy arrays.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from unihook import (
    HookArgumentError,
    NoGradError,
    ops,
    register_forward_hook,
    register_full_backward_hook,
    register_tensor_hook,
    select,
)

from ._scope import Recipe, Targets, resolve

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
    """``GradCAM(model, model.layer4)(x, target=None)``: class activation maps (N, H, W) in
    [0, 1], upsampled to the input's size. `model` maps NCHW images to (N, classes) logits.

    `target_layers`: a module of `model`, its qualified name (``"layer4"``), or a list of
    either; with several, the map is the mean of their normalised maps, normalised again. A
    layer with a tuple or namedtuple output contributes its first tensor.

    `call`: which call of a layer that runs more than once per forward (torchvision's
    BasicBlock calls one ``relu`` twice) the map uses, as a list index: each call's output is
    paired with the gradient of that same output. The default, -1 (the last call), is
    captum's (its LayerGradCam keeps the last output its forward hook saw);
    pytorch-grad-cam 1.5 uses the first, ``call=0``.

    `target` (per call): None (each sample's top class), a class index, or one per sample.
    """

    def __init__(self, model: Any, target_layers: Targets, *, call: int = -1) -> None:
        if isinstance(call, bool) or not isinstance(call, int):
            raise HookArgumentError(f"`call` must be an int (a list index). Received: {call!r}")
        layers = resolve(model, target_layers, "target_layers")
        super().__init__()
        self.model = model
        self.call = call
        self.layers: list[str] = [name for name, _ in layers]
        # per layer, per call: [the output as returned, the gradient of that output]
        self._calls: list[list[list[Any]]] = [[] for _ in layers]
        for index, (name, layer) in enumerate(layers):
            self._hooks.add(
                name, register_forward_hook(layer, self._keeper(self._calls[index]), name=name)
            )
        self.target_classes: np.ndarray | None = None

    @staticmethod
    def _keeper(calls: list[list[Any]]) -> Any:
        def keep(module: Any, args: Any, output: Any) -> None:
            tensors = ops.tensors_in(output, like=module)
            if not tensors:
                return
            # a copy: an in-place op after the layer (ReLU(inplace=True), `out += x`) would
            # change the output; the tensor hook still gets this value's gradient
            record = [ops.clone(tensors[0]), None]
            calls.append(record)

            def keep_gradient(grad: Any) -> None:
                record[1] = ops.clone(grad)  # paddle accumulates into it later

            try:
                register_tensor_hook(tensors[0], keep_gradient)
            except NoGradError:
                pass  # under no_grad: __call__ reports the missing gradient

        return keep

    def __call__(self, x: Any, target: Target = None) -> np.ndarray:
        if not self._hooks:
            raise RuntimeError("this GradCAM was removed: create a new one")
        for calls in self._calls:
            calls.clear()
        try:
            score, self.target_classes = _score(self.model(x), target)
            score.backward()
            size = ops.to_numpy(x).shape[2:]
            maps = [self._map(name, calls, size) for name, calls in zip(self.layers, self._calls)]
        finally:
            for calls in self._calls:
                calls.clear()
        return _normalise(np.mean(maps, axis=0)) if len(maps) > 1 else maps[0]

    def _map(self, name: str, calls: list[list[Any]], size: tuple[int, ...]) -> np.ndarray:
        if not -len(calls) <= self.call < len(calls):
            raise HookArgumentError(
                f"`call` must index the calls of {name!r}, which ran {len(calls)} time(s) in "
                f"this forward. Received: call={self.call}"
            )
        activation, gradient = calls[self.call]
        if gradient is None:
            raise RuntimeError(
                f"GradCAM: no gradient reached the output of {name!r} (call {self.call}): "
                f"run it with gradients enabled, on a layer the target class depends on"
            )
        weights = ops.to_numpy(gradient).astype(np.float64).mean(axis=(2, 3))
        cams = np.maximum((weights[:, :, None, None] * ops.to_numpy(activation)).sum(axis=1), 0)
        return _normalise(_resize_bilinear(cams, *size))


def _normalise(cams: np.ndarray) -> np.ndarray:
    """Each map min-max scaled to [0, 1] (a constant map to 0)."""
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
