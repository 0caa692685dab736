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
- ``Tensor._version`` counts the in-place ops autograd records (``copy_``; ``Tensor.add_``
  and ``mul_`` are not recorded and leave it as it is), but MindSpore bumps it in its
  asynchronous pipeline: it is read after ``_pynative_executor.sync()`` (docs/MINDSPORE.md §10).
  An identity's output (``stop_gradient``) has a counter of its own: forward's in-place ops on
  an input alias are rebased onto the caller's tensor (``_Rebase``), which bumps its counter;
- MindSpore refuses an in-place op on a leaf that requires grad and on a view of one, and on
  the output of a custom function that is its input (the trap above): ``_Guard`` turns the
  latter into the former for a leaf an identity would otherwise alias.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable, Sequence

import mindspore
from mindspore.common._grad_function import _Function
from mindspore.graph.api import _pynative_executor
from mindspore.ops import stop_gradient, zeros

from unihook.backend import (
    Autograd,
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
from ._global import CALL_CODES

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
            filled = list(grads)
            for i in ctx.dead:
                shape, dtype = ctx.shapes[i]
                filled[i] = zeros(shape, dtype) if ctx.materialize else None
            grads = tuple(filled)
        results = ctx.on_backward(grads)
        if results is not grads:
            for result, grad, (shape, dtype) in zip(results, grads, ctx.shapes):
                if grad is None and result is not None:
                    check_grad_like(result, shape, dtype, "mindspore.Tensor", _is_tensor, ctx.site)
        if ctx.dead:
            results = [None if i in ctx.dead else r for i, r in enumerate(results)]
        return (None, None, None, *results)


class _Rebase(_Function):
    """`original` takes `alias`'s history: an in-place node (``mark_dirty``) that moves no data
    (they share memory) and sends the whole gradient to `alias`. On a leaf that requires grad
    MindSpore raises its own "A leaf tensor that need grad is being used in an inplace
    operator", as it does without hooks."""

    @staticmethod
    def forward(ctx: Any, original: Any, alias: Any) -> Any:  # type: ignore[override]
        ctx.mark_dirty(original)
        return original

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return None, grad


class _Guard(_Function):
    """`x` returned as it is: MindSpore refuses every in-place op on it at once, with its own
    RuntimeError ("A view of base is being inplace modified ... custom bprop")."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:  # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return grad


def _memory_key(tensor: Any) -> int | None:
    # the storage: MindSpore refuses an in-place op on a leaf and on any view of it
    if not tensor.size:
        return None  # (an empty tensor has no memory to share)
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, TypeError, AttributeError):  # no device memory yet
        return None


# The callbacks to run at the end of each running backward, by MindSpore's engine id, held
# weakly: a backward that raised runs no final callback and frees its graph (the calls die).
_at_end: dict[int, list[weakref.WeakMethod[Callable[[], None]]]] = {}


def _after_backward(callback: Callable[[], None]) -> None:
    """Run `callback` (a bound method) once the running backward is over."""
    engine = _pynative_executor.get_current_autodiff_engine_id()
    callbacks = _at_end.get(engine)
    if callbacks is None:
        # (a backward that raised: its calls died with its graph; list(): another thread's
        # backward may add its own meanwhile)
        for stale, refs in list(_at_end.items()):
            if not any(r() for r in refs):
                _at_end.pop(stale, None)
        callbacks = _at_end[engine] = []
        # A module-level function: MindSpore does not hold a queued callback alive, and a
        # backward that raises after it was queued segfaulted at a closure (docs/MINDSPORE.md)
        _pynative_executor.queue_backward_final_callback(_backward_ended)
    callbacks.append(weakref.WeakMethod(callback))  # type: ignore[arg-type]


def _backward_ended() -> None:
    for ref in _at_end.pop(_pynative_executor.get_current_autodiff_engine_id(), ()):
        callback = ref()
        if callback is not None:
            callback()


# The input side's aliases of data (`MindSporeAutograd.identity`), by id, held weakly
_data_aliases: dict[int, weakref.ref[Any]] = {}


def _forget_alias(key: int, ref: weakref.ref[Any]) -> None:
    if _data_aliases.get(key) is ref:
        del _data_aliases[key]


def _is_alias_of_data(tensor: Any) -> bool:
    ref = _data_aliases.get(id(tensor))
    return ref is not None and ref() is tensor


def _data_only(tensors: Sequence[Any]) -> bool:
    """Whether `tensors` are data: the differentiated function's arguments (leaves that are no
    Parameter) or an identity's aliases of them."""
    for tensor in tensors:
        if isinstance(tensor, mindspore.Parameter):
            return False
        node = tensor._grad_node
        if node is not None and not node.is_leaf() and not _is_alias_of_data(tensor):
            return False
    return True


class MindSporeAutograd(Autograd):
    backend = NAME
    # a cell's dispatchers stay until its calls in flight are over (unihook._module_backward)
    call_codes = CALL_CODES
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
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        if materialize and _data_only(tensors):
            # the input side's aliases of data are data: the first cell inside a hooked
            # container (or under global hooks) gets them
            for out in outs:
                _data_aliases[id(out)] = weakref.ref(out, partial(_forget_alias, id(out)))
        return outs

    # MindSpore records every argument of a differentiated function as requiring grad, and its
    # backward leaves out the input side of a call whose inputs it does not differentiate
    # (`grad(fn, None, weights)`, the training idiom): the full hooks fire at its end, as
    # torch's for data that needs no grad (a Parameter, or a computed tensor, does: not then)
    after_backward = staticmethod(_after_backward)

    @staticmethod
    def data_only(aliases: Sequence[Any]) -> bool:
        # (`identity` marked the input side's aliases of data)
        return all(_is_alias_of_data(alias) for alias in aliases)

    @staticmethod
    def version(tensor: Any) -> int:
        _pynative_executor.sync()  # the counter moves in the async pipeline (module docstring)
        return int(tensor._version)

    @staticmethod
    def rebase(original: Any, alias: Any) -> Any:
        # (no shape to carry over, unlike torch's: MindSpore 2.10 has no in-place shape change,
        # no squeeze_ / unsqueeze_ / t_)
        _Rebase.apply(original, alias)
        # MindSpore raises its leaf error in the async pipeline: here, as without hooks
        _pynative_executor.sync()
        return original

    @staticmethod
    def same_tensor(a: Any, b: Any) -> bool:
        # `copy_` returns another Python object for the tensor it changed: same memory, same
        # node once the pipeline ran (an identity's alias shares the memory, not the node)
        if a is b:
            return True
        if a is None or b is None:  # (an argument the caller no longer holds)
            return False
        if a.shape != b.shape or a.dtype != b.dtype or _memory_key(a) != _memory_key(b):
            return False
        _pynative_executor.sync()
        node, other = a._grad_node, b._grad_node
        return node is not None and other is not None and node._unique_id() == other._unique_id()

    @staticmethod
    def guard(tensor: Any, error: Callable[[], Exception], site: Site) -> Any:
        # MindSpore's own RuntimeError at the in-place op, where it raises without hooks
        return _Guard.apply(tensor)

    memory_key = staticmethod(_memory_key)

    @staticmethod
    def leaf_of(tensor: Any) -> Any:
        if isinstance(tensor, mindspore.Parameter):
            return tensor
        node = tensor._grad_node
        return tensor if node is not None and node.is_leaf() else None

    @staticmethod
    def refused_like(output: Any, leaf: Any) -> bool:
        key = _memory_key(output)
        return key is not None and key == _memory_key(leaf)

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

    __slots__ = ("_remove",)

    def __init__(self, state: ModuleBackward) -> None:
        from ._global import add_backward_dispatchers

        self._remove = add_backward_dispatchers(state.pre_dispatch, state.post_dispatch)

    def remove(self) -> None:
        self._remove()


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    return add_global_backward_hook(_AUTOGRAD, kind, hook, _GlobalDispatchers)
