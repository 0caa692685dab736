"""Module backward hooks for paddle 3.3.1, which has none: the shared emulation of
``unihook._module_backward`` over one ``PyLayer`` identity.

Each paddle trap is handled where it bites (numbers from ../shared/SEMANTICS.md §4):
1. a PyLayer forward may not return its input nor ``detach()`` ("can't use inplace strategy"):
   return ``view(shape)``, which shares memory;
2. inputs with stop_gradient=True: their outputs are marked non-differentiable and backward
   returns None at their positions;
3. returning None for a differentiable input segfaults the next grad node: zeros instead;
5. a user ``register_hook`` on a PyLayer output has its return value ignored: one more
   ``view`` after the PyLayer;
6. an exception inside PyLayer.backward surfaces as OSError: stashed for the autograd guard;
8. the dispatchers stay last among the forward hooks (``move_last``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import paddle
from paddle.autograd import PyLayer

from unihook._module_backward import Dispatchers, register_backward_hook
from unihook.handles import Handle

from . import NAME
from . import _autograd_guard as guard
from ._forward import add_hook, move_last, remove_hook

Grads = Sequence[Any]


class _Identity(PyLayer):
    @staticmethod
    def forward(ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, *xs: Any) -> Any:  # type: ignore[override]
        ctx.on_backward = on_backward
        ctx.differentiable = [not x.stop_gradient for x in xs]
        ctx.shapes = [(x.shape, x.dtype) for x in xs]
        ctx.set_materialize_grads(materialize)
        outs = tuple(x.view(x.shape) for x in xs)
        ctx.mark_non_differentiable(*[o for x, o in zip(xs, outs) if x.stop_gradient])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        try:
            results = ctx.on_backward(grads)
        except BaseException as error:
            guard.stash(error)
            raise
        out = []
        for result, differentiable, (shape, dtype) in zip(results, ctx.differentiable, ctx.shapes):
            if not differentiable:
                out.append(None)
            elif result is None:
                out.append(paddle.zeros(shape, dtype))
            else:
                out.append(result)
        return tuple(out)


class _PaddleDispatchers:
    __slots__ = ("layer_ref", "pre_id", "post_id")

    def __init__(self, layer: Any, pre: Any, post: Any) -> None:
        self.layer_ref = weakref.ref(layer)
        self.pre_id = add_hook(layer, pre, pre=True)
        self.post_id = add_hook(layer, post, pre=False, always_call=True)

    def move_last(self) -> None:
        layer = self.layer_ref()
        if layer is not None:
            move_last(layer, self.pre_id, pre=True)
            move_last(layer, self.post_id, pre=False)

    def remove(self) -> None:
        layer = self.layer_ref()
        if layer is not None:
            remove_hook(layer, self.pre_id, pre=True)
            remove_hook(layer, self.post_id, pre=False)


class PaddleAutograd:
    backend = NAME
    is_tensor = staticmethod(paddle.is_tensor)

    @staticmethod
    def grad_enabled() -> bool:
        return bool(paddle.is_grad_enabled())

    @staticmethod
    def requires_grad(tensor: Any) -> bool:
        return not tensor.stop_gradient

    @staticmethod
    def identity(
        tensors: Sequence[Any], on_backward: Callable[[Grads], Grads], materialize: bool
    ) -> Sequence[Any]:
        outs = _Identity.apply(on_backward, materialize, *tensors)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        return [o.view(o.shape) for o in outs]

    @staticmethod
    def add_dispatchers(layer: Any, pre: Any, post: Any) -> Dispatchers:
        dispatchers = _PaddleDispatchers(layer, pre, post)
        guard.hold(pre)
        return dispatchers


_AUTOGRAD = PaddleAutograd()


def register(
    layer: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    return register_backward_hook(_AUTOGRAD, layer, kind, hook, prepend, name)
