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
7. a second backward through a PyLayer node that ``Tensor.backward`` already ran segfaults
   (retain_graph=True or not, ``paddle.grad`` too): each node is recorded as spent when it runs
   under ``Tensor.backward``, and the autograd guard raises BackendStateError before a backward
   reaches it again (``_Node``);
8. the dispatchers stay last among the forward hooks (``move_last``);
and one trap not listed there: paddle accumulates gradients in place into the first tensor a node received
   (``GradTensorHolder``): a gradient handed to a hook would change under the hook's feet after
   it ran, so what goes back to paddle after the hooks saw it is a copy.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Sequence

import paddle
from paddle.autograd import PyLayer

from unihook._describe import Site
from unihook._module_backward import Dispatchers, register_backward_hook
from unihook.errors import BackendStateError
from unihook.handles import Handle

from . import NAME
from . import _autograd_guard as guard
from ._forward import add_hook, move_last, remove_hook

Grads = Sequence[Any]


class _Node:
    """One identity PyLayer node, for trap 7. Registered as a gradient hook on the node (so it
    lives exactly as long as the node) and held by its context."""

    __slots__ = ("site", "ptr", "spent", "__weakref__")

    def __init__(self, site: Site) -> None:
        self.site = site
        self.ptr = 0
        self.spent = False

    def ran(self) -> None:
        """The node's backward ran: under Tensor.backward paddle now frees its context."""
        if not self.spent and guard.in_tensor_backward():
            self.spent = True
            # (the error factory must not hold `self`: the record lives until `self` dies)
            guard.spend(self.ptr, self, partial(_spent_error, self.site))

    def __call__(self, grad: Any) -> None:
        # The guard's graph walk catches a spent node before paddle runs; this is the backstop.
        if self.spent:
            error = _spent_error(self.site)
            guard.stash(error)
            raise error
        return None


def _spent_error(site: Site) -> BackendStateError:
    return site.error(  # type: ignore[return-value]
        BackendStateError,
        f"one Tensor.backward per forward through a hooked module: paddle {paddle.__version__} "
        "frees a PyLayer's context after Tensor.backward, even with retain_graph=True, and "
        "segfaults on the next pass reaching it",
        "another backward or paddle.grad through a module call that Tensor.backward already "
        "ran through. Run the forward again, or use paddle.grad(..., retain_graph=True) for "
        "repeated passes over one graph",
    )


class _Identity(PyLayer):
    @staticmethod
    def forward(ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, node: _Node, *xs: Any) -> Any:  # type: ignore[override]
        ctx.on_backward = on_backward
        ctx.node = node
        ctx.differentiable = [not x.stop_gradient for x in xs]
        ctx.shapes = [(x.shape, x.dtype) for x in xs]
        ctx.set_materialize_grads(materialize)
        outs = tuple(x.view(x.shape) for x in xs)
        ctx.mark_non_differentiable(*[o for x, o in zip(xs, outs) if x.stop_gradient])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        ctx.node.ran()
        try:
            results = ctx.on_backward(grads)
        except BaseException as error:
            guard.stash(error)
            raise
        # Paddle accumulates a later gradient for the same tensor in place into the first one
        # it received: a gradient a hook saw (and may keep, as torch allows) goes back as a copy.
        exposed = results is not grads
        out = []
        for result, differentiable, (shape, dtype) in zip(results, ctx.differentiable, ctx.shapes):
            if not differentiable:
                out.append(None)
            elif result is None:
                out.append(paddle.zeros(shape, dtype))
            else:
                out.append(result.clone() if exposed else result)
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
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
    ) -> Sequence[Any]:
        node = _Node(site)
        outs = _Identity.apply(on_backward, materialize, node, *tensors)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        # Some input needs grad (the caller checks), so some output is differentiable.
        first = next(o for o in outs if not o.stop_gradient)
        node.ptr = first.grad_fn.node_ptr()
        first._register_grad_hook(node)
        guard.hold(node)  # the guard must outlive the node: it protects it from trap 7
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
