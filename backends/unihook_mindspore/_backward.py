"""Module backward hooks for MindSpore with torch's semantics: the shared emulation of
``unihook._module_backward`` over one custom autograd function (``_Function``, MindSpore's
port of ``torch.autograd.Function``, PyNative only).

MindSpore 2.10's own ``Cell.register_backward_hook`` gives the same numbers as torch on plain
models but not torch's contract (docs/MINDSPORE.md §4): grad_input has no slot for a non-tensor
argument, an argument the caller does not differentiate gets its real gradient (torch: zeros),
hooks fire for a gradient with respect to the parameters only and for dict outputs (torch: never),
and a wrong return raises a bare TypeError. The emulation gives torch's contract.

MindSpore quirks handled here:
- every tensor recorded under a grad session has ``_requires_grad`` True (MindSpore has no
  per-tensor requires_grad outside a session; Parameters always have it);
- an in-place op on a ``_Function`` output that is its input, a ``view`` or a ``reshape`` of
  it raises "A view of base is being inplace modified ... custom bprop" (a conv followed by an
  in-place ReLU): the output is ``ops.stop_gradient(x)``, which shares memory and is no view
  (torch's BackwardHook has the same trap; unihook's torch identity returns ``detach()``);
- there is no in-place version counter (``Tensor._version`` stays 0 after ``add_``): forward's
  in-place ops on an input alias are not rebased onto the caller's tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mindspore
from mindspore.common._grad_function import _Function
from mindspore.graph.api import _pynative_executor
from mindspore.ops import stop_gradient, zeros

from unihook.backend import (
    Dispatchers,
    ModuleBackward,
    Site,
    add_global_backward_hook,
    check_grad_like,
    register_backward_hook,
)
from unihook.handles import Handle

from . import NAME
from ._forward import add_dispatchers

Grads = Sequence[Any]
Tensor = mindspore.Tensor


def _is_tensor(obj: object) -> bool:
    return isinstance(obj, Tensor)


class _Identity(_Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, site: Site, *xs: Any
    ) -> Any:
        ctx.on_backward = on_backward
        ctx.site = site._replace(kind="full_backward" if materialize else "full_backward_pre")
        ctx.shapes = [(tuple(x.shape), x.dtype) for x in xs]
        ctx.set_materialize_grads(materialize)
        ctx.materialize = materialize  # (the native flag is write-only)
        # MindSpore sends a gradient to an input that needs none (a plain tensor recorded in a
        # grad session); torch's identity marks it non-differentiable: zeros, or None
        ctx.dead = [i for i, x in enumerate(xs) if not x._requires_grad]
        # shares memory and is no view: in-place ops after the module work (module docstring)
        return tuple(stop_gradient(x) for x in xs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        if ctx.dead:
            grads = list(grads)
            for i in ctx.dead:
                shape, dtype = ctx.shapes[i]
                grads[i] = zeros(shape, dtype) if ctx.materialize else None
            grads = tuple(grads)
        results = ctx.on_backward(grads)
        if results is not grads:
            for result, grad, (shape, dtype) in zip(results, grads, ctx.shapes):
                if grad is None and result is not None:
                    check_grad_like(result, shape, dtype, "mindspore.Tensor", _is_tensor, ctx.site)
        if ctx.dead:
            results = [None if i in ctx.dead else r for i, r in enumerate(results)]
        return (None, None, None, *results)


class MindSporeAutograd:
    backend = NAME
    # not measured yet: a module's dispatchers leave with its last hook, calls in flight or not
    call_codes: frozenset[Any] = frozenset()
    is_tensor = staticmethod(_is_tensor)

    @staticmethod
    def grad_enabled() -> bool:
        # outside a grad session nothing is recorded: no backward can reach a hook
        return bool(_pynative_executor.enable_grad() and _pynative_executor.requires_grad())

    @staticmethod
    def requires_grad(tensor: Any) -> bool:
        return bool(tensor._requires_grad)

    @staticmethod
    def identity(
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
        held_until: object = None,  # unused (the node copies no gradient)
    ) -> Sequence[Any]:
        outs = _Identity.apply(on_backward, materialize, site, *tensors)
        return outs if isinstance(outs, (tuple, list)) else (outs,)

    @staticmethod
    def version(tensor: Any) -> int:
        return 0  # no in-place version counter in MindSpore 2.10 (see the module docstring)

    @staticmethod
    def rebase(original: Any, alias: Any) -> Any:
        return original  # never called: versions never change

    @staticmethod
    def add_dispatchers(cell: Any, pre: Any, post: Any) -> Dispatchers:
        return add_dispatchers(cell, pre, post)


_AUTOGRAD = MindSporeAutograd()


def register(
    cell: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    return register_backward_hook(_AUTOGRAD, cell, kind, hook, prepend, name)


class _GlobalDispatchers:
    """The global backward dispatchers: the last forward hooks of every cell (``_global``)."""

    __slots__ = ("remove",)

    def __init__(self, state: ModuleBackward) -> None:
        from ._global import add_backward_dispatchers

        self.remove = add_backward_dispatchers(state.pre_dispatch, state.post_dispatch)


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    return add_global_backward_hook(_AUTOGRAD, kind, hook, _GlobalDispatchers)
