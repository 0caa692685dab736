"""Module backward hooks for torch, in-place safe.

torch's native BackwardHook returns its inputs from a custom Function, so its outputs are views
created in a custom Function and an in-place op on them (``ReLU(inplace=True)`` after a conv)
raises (pytorch issue 61519). This identity returns ``detach()``-ed aliases instead: same
storage, no copy, not views, so in-place ops that follow work and give the gradients of the
same model without in-place ops. The hook semantics are the shared ones of
``unihook._module_backward``.
"""

from __future__ import annotations

import threading
import weakref
from operator import attrgetter
from typing import Any, Callable, Sequence

import torch
from torch.utils.hooks import RemovableHandle

from unihook.backend import (
    Autograd,
    Dispatchers,
    Site,
    add_global_backward_hook,
    check_grad_like,
    register_backward_hook,
    undo_if_unfinished,
)
from unihook.handles import Handle

from . import NAME
from ._alias import InputAlias, changed, guard, mark, span, use, watch, watch_inputs
from ._compile import EagerUnderCompile, WatchedPinned, outside_dynamo
from ._native_backward import CALL_CODES, Absorption, copy_natives, natives, pending, rank

Grads = Sequence[Any]


_NONE_KEPT: dict[int, Any] = {}  # (shared, never changed)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, site: Site, *xs: Any
    ) -> Any:
        ctx.on_backward = on_backward
        # (the output side, materialize=False, carries the pre-hooks' values: see _check_slots)
        ctx.site, ctx.input_side = site, materialize
        if materialize:  # the input side: a module may keep what forward got (see _alias)
            ctx.callers = tuple(map(weakref.ref, xs))
        else:
            ctx.set_materialize_grads(False)
        # the outputs' metadata is read in backward from the node's own record (only where a
        # hook turned a gradient to or from None); that record leaves a non-differentiable
        # output's out
        if len(xs) == 1:  # (most calls: no comprehension)
            outs: tuple[Any, ...] = (xs[0].detach(),)
            constant: Sequence[int] = () if xs[0].requires_grad else (0,)
        else:
            outs = tuple(x.detach() for x in xs)
            constant = [i for i, x in enumerate(xs) if not x.requires_grad]
        if constant:
            ctx.kept = {i: (tuple(xs[i].shape), xs[i].dtype, xs[i].device) for i in constant}
            ctx.mark_non_differentiable(*(outs[i] for i in constant))
        else:
            ctx.kept = _NONE_KEPT
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        results = ctx.on_backward(grads)
        # (only a slot a hook turned to or from None needs the checks and zeros below)
        if results is not grads and _none_moved(results, grads):
            metas = _metas(ctx)
            _check_slots(results, grads, ctx, metas)
            if not ctx.input_side:
                # torch's BackwardHook node materializes what its pre-hooks return: a gradient
                # a pre-hook replaced with None sends zeros on (the hooks still see the None)
                results = [
                    torch.zeros(shape, dtype=dtype, device=device)
                    if r is None and g is not None
                    else r
                    for r, g, (shape, dtype, device) in zip(results, grads, metas)
                ]
        return (None, None, None, *results)


Meta = tuple[tuple[int, ...], Any, Any]


def _none_moved(results: Grads, grads: Grads) -> bool:
    """Whether a hook turned a gradient to or from None (a loop: runs at every backward)."""
    for r, g in zip(results, grads):
        if (r is None) is not (g is None):
            return True
    return False


def _metas(ctx: Any) -> list[Meta]:
    """Each output's shape, dtype and device, as forward returned it: the node's own record
    (`_input_metadata`, private, in torch since 2.1), but for the non-differentiable outputs,
    which it leaves out."""
    kept = ctx.kept
    return [
        kept.get(i) or (tuple(m.shape), m.dtype, m.device)
        for i, m in enumerate(ctx._input_metadata)
    ]


def _check_slots(results: Grads, grads: Grads, ctx: Any, metas: list[Meta]) -> None:
    """A hook's value for a slot whose gradient was None (an unused output) is checked only
    here: torch would cast a wrong dtype silently and raise RuntimeError for a float."""
    site = ctx.site._replace(kind="full_backward" if ctx.input_side else "full_backward_pre")
    for result, grad, (shape, dtype, _) in zip(results, grads, metas):
        if grad is None and result is not None:
            check_grad_like(result, shape, dtype, "torch.Tensor", torch.is_tensor, site)


# the largest span of storage `_share_elements` looks at element by element (9 bytes each)
_EXACT_SPAN = 1 << 22


def _share_elements(a: Any, b: Any, start: int, end: int) -> bool:
    """Whether two tensors over one storage, whose spans `[start, end)` meet, share an element:
    interleaved views (`x[:, ::2]`, `x[:, 1::2]`) do not. Looked at only when forward changed
    one of several arguments in place; beyond `_EXACT_SPAN`, or between dtypes of different
    sizes, taken as shared (an error, never a silent miss)."""
    if end - start > _EXACT_SPAN or a.element_size() != b.element_size():
        return True
    with torch.no_grad():
        positions = torch.arange(end - start)
        taken = torch.zeros(end - start, dtype=torch.bool)
        taken[positions.as_strided(a.size(), a.stride(), a.storage_offset() - start)] = True
        found = taken[positions.as_strided(b.size(), b.stride(), b.storage_offset() - start)]
        return bool(found.any())


class _Rebase(torch.autograd.Function):
    """`original` takes `alias`'s history: an in-place node that moves no data (they share
    storage) and sends the whole gradient to `alias`."""

    @staticmethod
    def forward(ctx: Any, original: Any, alias: Any) -> Any:  # type: ignore[override]
        _reshape_like(original, alias)
        ctx.view = original._is_view()
        ctx.mark_dirty(original)
        return original

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        # `original` a view: torch wraps this node in a CopySlices of its base, which drops
        # the base's whole gradient (the rest of the base too) when this one is None
        return (torch.zeros_like(grad) if ctx.view else None), grad


_Disabled = torch._C.DisableTorchFunctionSubclass
_IDENTITY_NODE = _Identity._backward_cls  # pyright: ignore[reportAttributeAccessIssue]
_set_version = torch._C._autograd._unsafe_set_version_counter  # pyright: ignore[reportAttributeAccessIssue]


# torch's `Function.apply` is Python around its C `apply`: for a Function without
# `setup_context`, outside functorch's transforms, it only unwraps functorch's dead wrappers
# first. The same without its frames: about 3 us less per identity (two per hooked call).
_c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Identity)
_functorch_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead  # pyright: ignore[reportAttributeAccessIssue]


def _apply(
    on_backward: Callable[[Grads], Grads], materialize: bool, site: Site, tensors: Sequence[Any]
) -> Any:
    if _functorch_active():
        return _Identity.apply(on_backward, materialize, site, *tensors)
    return _c_apply(on_backward, materialize, site, *map(_unwrap_if_dead, tensors))


def _reshape_like(original: Any, alias: Any) -> None:
    """Forward changed the alias's shape in place (`squeeze_`, `t_`): so does `original`."""
    if original.size() != alias.size() or original.stride() != alias.stride():
        original.as_strided_(alias.size(), alias.stride(), alias.storage_offset())


_ID_LOCK = threading.Lock()


def ids_drawn() -> int:
    """The framework's hook id counter: the next id (``unihook._pinned``)."""
    drawn: int = RemovableHandle.next_id
    return drawn


def reserve_ids(top: int) -> None:
    """torch's handle counter past `top` (a loaded module's hook keys: ``unihook._pinned``)."""
    with _ID_LOCK:
        RemovableHandle.next_id = max(RemovableHandle.next_id, top + 1)


# torch 2.13's with_kwargs flag tables of a module's forward hook dicts
KWARGS_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs")


class _TorchDispatchers:
    """Where the dispatchers live: pinned last in the module's own hook dicts
    (``unihook._pinned``), so a native hook registered after them, even one replacing args or
    the output, runs before them, as torch's BackwardHook runs after every forward hook."""

    iterates_live = False  # (`_call_impl` copies the dicts' items first)
    ids_drawn = staticmethod(ids_drawn)
    reserve_ids = staticmethod(reserve_ids)

    @staticmethod
    def recreated(owner: Any, attr: str) -> bool:
        return False  # (torch creates a module's hook dicts in __init__)

    @staticmethod
    def get(module: Any, attr: str) -> Any:
        return module.__dict__[attr]

    @staticmethod
    def put(module: Any, attr: str, hooks: Any) -> None:
        object.__setattr__(module, attr, hooks)

    @staticmethod
    def new_id() -> int:
        # torch's own counter: ids never collide with natively registered hooks. Locked: the
        # global dispatchers are pinned under another registry lock than a module's own, and a
        # thread switch between the read and the write gave both the same id (one hook lost).
        with _ID_LOCK:
            key: int = RemovableHandle.next_id
            RemovableHandle.next_id += 1
        return key


class TorchAutograd(Autograd):
    backend = NAME
    own_modules = "torch.nn."  # (see Autograd: their forward reads no user tensor)
    # torch's (`Module._call_impl` may be unihook's wrapper by now: that one calls torch's) and
    # the wrapper, whose global dispatchers may have taken a call before torch's code runs
    call_codes = CALL_CODES
    # C callables, no Python frame: each runs a few times per hooked call (torch.is_tensor is
    # a Python function around the same isinstance)
    is_tensor = staticmethod(torch.Tensor.__instancecheck__)
    grad_enabled = staticmethod(torch.is_grad_enabled)
    requires_grad = staticmethod(attrgetter("requires_grad"))
    version = staticmethod(attrgetter("_version"))
    recording = staticmethod(torch._C._is_tracing)  # torch.jit.trace (see Autograd)

    @staticmethod
    def identity(
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
        held_until: object = None,  # unused: torch never changes a gradient still referenced
    ) -> Sequence[Any]:
        for t in tensors:
            if type(t) is InputAlias:
                # (one whose input changed since: custom Functions skip __torch_function__)
                use(tensors)
                with _Disabled():  # (its reads of shapes and dtypes: plain)
                    return _apply(on_backward, materialize, site, tensors)
        return _apply(on_backward, materialize, site, tensors)

    @staticmethod
    def guard(tensor: Any, error: Callable[[], Exception], site: Site) -> Any:
        # torch's own RuntimeError at the in-place op, where it raises without hooks
        return guard(tensor)

    @staticmethod
    def memory_key(tensor: Any) -> int | None:
        # the storage: torch refuses an in-place op on a leaf and on any view of it
        if not tensor.numel():
            return None  # (every empty tensor's storage is at 0)
        try:
            return int(tensor.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # no storage (sparse, meta, functorch)
            return None

    @staticmethod
    def leaf_of(tensor: Any) -> Any:
        if tensor.is_leaf:
            return tensor
        base = tensor._base  # a view's: torch refuses in-place ops on views of a leaf too
        return base if base is not None and base.is_leaf else None

    @staticmethod
    def refused_like(output: Any, leaf: Any) -> bool:
        key = TorchAutograd.memory_key(output)
        return key is not None and key == TorchAutograd.memory_key(leaf)

    @staticmethod
    def rebase(original: Any, alias: Any, site: Site) -> Any:
        # A leaf that requires grad raises torch's own "a leaf Variable that requires grad
        # is being used in an in-place operation" here, as it would have without hooks.
        version = original._version
        if alias.requires_grad:
            _Rebase.apply(original, alias)
        else:  # same storage, same version counter (detach): only a new shape to carry
            _reshape_like(original, alias)
        # the data did not change: tensors saved before (at this version) stay valid
        _set_version((original,), (version,))
        changed(original)  # (an `InputAlias`: its input takes the change too)
        return original

    watch = staticmethod(watch)
    watch_inputs = staticmethod(watch_inputs)
    mark = staticmethod(mark)
    # torch's own module backward hooks run among unihook's (see ._native_backward)
    rank = staticmethod(rank)
    natives = staticmethod(natives)
    pending = staticmethod(pending)
    copy_natives = staticmethod(copy_natives)

    @staticmethod
    def moved(alias: Any, original: Any) -> bool:
        fn = alias.grad_fn
        if fn is not None and type(fn) is not _IDENTITY_NODE:
            return True
        return original.size() != alias.size() or original.stride() != alias.stride()

    @staticmethod
    def overlaps(a: Any, b: Any) -> bool:
        if a is b:
            return True
        key = TorchAutograd.memory_key(a)
        if key is None or key != TorchAutograd.memory_key(b):
            return False
        (a0, a1), (b0, b1) = span(a), span(b)
        if not (a0 < b1 and b0 < a1):
            return False
        return _share_elements(a, b, min(a0, b0), max(a1, b1))

    @staticmethod
    def add_dispatchers(module: Any, pre: Any, post: Any) -> Dispatchers:
        # torch.compile: the dispatchers run outside dynamo (see ._compile)
        pre, post = EagerUnderCompile(pre), EagerUnderCompile(post)
        hooks = (("_forward_pre_hooks", pre), ("_forward_hooks", post))
        always = "_forward_hooks_always_called"
        return WatchedPinned.install(
            module, hooks, always, _TorchDispatchers.new_id, _TorchDispatchers, flags=KWARGS_FLAGS
        )


_AUTOGRAD = TorchAutograd()


def register(
    module: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    # torch's own backward hooks of the module run among unihook's while it has one
    # (absorbed after unihook's hook is in, given back before it leaves: torch leaves its
    # hooks out of a call only where unihook's dispatchers are there to run them)
    handle = register_backward_hook(_AUTOGRAD, module, kind, hook, prepend, name)
    absorption = Absorption(module)
    undo_if_unfinished(absorption.release)
    absorption.take()

    def remove() -> None:  # (idempotent, as both)
        absorption.release()
        handle.remove()

    # torch.compile: removed inside a compiled forward, the removal runs outside dynamo (it
    # reads the threads' frames)
    return Handle(handle.backend, handle.kind, outside_dynamo(remove))


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    from ._global import _BackwardDispatch

    return outside_dynamo(add_global_backward_hook(_AUTOGRAD, kind, hook, _BackwardDispatch))
