"""Module backward hooks for torch, in-place safe.

torch's native BackwardHook returns its inputs from a custom Function, so its outputs are views
created in a custom Function and an in-place op on them (``ReLU(inplace=True)`` after a conv)
raises (pytorch issue 61519). This identity returns ``detach()``-ed aliases instead: same
storage, no copy, not views, so in-place ops that follow work and give the gradients of the
same model without in-place ops. The hook semantics are the shared ones of
``unihook._module_backward``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from unihook._describe import Site
from unihook._module_backward import (
    Dispatchers,
    add_global_backward_hook,
    register_backward_hook,
)
from unihook.handles import Handle

from . import NAME

Grads = Sequence[Any]


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, *xs: Any
    ) -> Any:
        ctx.on_backward = on_backward
        ctx.set_materialize_grads(materialize)
        outs = tuple(x.detach() for x in xs)
        ctx.mark_non_differentiable(*[o for x, o in zip(xs, outs) if not x.requires_grad])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        return (None, None, *ctx.on_backward(grads))


class _TorchDispatchers:
    __slots__ = ("pre", "post")

    def __init__(self, pre: Any, post: Any) -> None:
        self.pre = pre
        self.post = post

    def move_last(self) -> None:
        for handle in (self.pre, self.post):
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                hooks.move_to_end(handle.id)

    def remove(self) -> None:
        self.pre.remove()
        self.post.remove()


class TorchAutograd:
    backend = NAME
    is_tensor = staticmethod(torch.is_tensor)
    grad_enabled = staticmethod(torch.is_grad_enabled)

    @staticmethod
    def requires_grad(tensor: Any) -> bool:
        return bool(tensor.requires_grad)

    @staticmethod
    def identity(
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
    ) -> Sequence[Any]:
        return _Identity.apply(on_backward, materialize, *tensors)

    @staticmethod
    def add_dispatchers(module: Any, pre: Any, post: Any) -> Dispatchers:
        return _TorchDispatchers(
            module.register_forward_pre_hook(pre),
            module.register_forward_hook(post, always_call=True),
        )


_AUTOGRAD = TorchAutograd()


def register(
    module: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    return register_backward_hook(_AUTOGRAD, module, kind, hook, prepend, name)


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    from ._global import _BackwardDispatch

    return add_global_backward_hook(_AUTOGRAD, kind, hook, _BackwardDispatch)
