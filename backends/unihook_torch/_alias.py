"""A module output that is its input returned unchanged (``nn.Identity``, eval-mode Dropout), a
view of it (``nn.Flatten``, ``x[0]``), or another tensor older than the call (an argument given
by keyword or in a list, one the module kept), on torch.

Module backward hooks pass a module's outputs through an identity whose outputs are aliases:
same memory, another tensor, so that the hooks see the gradient of the output alone (in
``body(x) + x`` the second ``x`` is not the body's output), as torch's own hook does. Without
hooks such an output *is* the input (or a view of it): an in-place op on one changes the
other's history too. torch's own hook refuses every in-place op there; unihook keeps them:

- an in-place op through the output (or a view of it) gives the caller's input the output's
  new history, as torch's view machinery would (`_Adopt`), so reading the input afterwards is
  exact, and the two are *synced*: their histories hold each other's changes from then on;
- the input changed in place through anything else (itself, a view of it) while not synced,
  then the output used: the output cannot take that history without bypassing the module's
  backward hooks, so using it raises `InPlaceError` (torch's own hook raises there too);
  synced, the output takes it.

Seeing the in-place ops needs the output to be a `torch.Tensor` subclass with a
``__torch_function__`` (`InputAlias`): only such outputs pay for it (a few us per op on them),
and views taken of them are watched too.
"""

from __future__ import annotations

import sys
import threading
import weakref
from functools import partial
from types import CodeType, FrameType
from typing import Any, Callable, Collection, Sequence

import torch

from unihook.backend import ModuleBackward, Site, held_tensors, walk_tensors
from unihook.errors import InPlaceError

from ._compile import EagerUnderCompile, not_a_compile_root
from ._global import RUN_CODE, TORCH_CALL_CODE

__all__ = ["InputAlias", "adopt", "changed", "mark", "span", "use", "watch", "watch_inputs"]

_Disabled = torch._C.DisableTorchFunctionSubclass
_set_version = torch._C._autograd._unsafe_set_version_counter  # pyright: ignore[reportAttributeAccessIssue]
# the next autograd node's sequence number on this thread: taken when a hooked call starts
mark = torch._C._autograd._get_sequence_nr  # pyright: ignore[reportAttributeAccessIssue]
_STATE = "_unihook_input_alias"


class _Geometry:
    """Where a tensor's values are in its storage."""

    __slots__ = ("size", "stride", "offset")

    def __init__(self, tensor: Any) -> None:
        self.size = tuple(tensor.size())
        self.stride = tuple(tensor.stride())
        self.offset = int(tensor.storage_offset())

    def same(self, other: _Geometry) -> bool:
        return (self.size, self.stride, self.offset) == (other.size, other.stride, other.offset)

    def span(self) -> tuple[int, int]:
        """The first and one past the last storage position it covers."""
        if 0 in self.size:
            return self.offset, self.offset
        last = sum((n - 1) * s for n, s in zip(self.size, self.stride) if s > 0)
        first = sum((n - 1) * s for n, s in zip(self.size, self.stride) if s < 0)
        return self.offset + first, self.offset + last + 1

    def view(self, buffer: Any, start: int) -> Any:
        return buffer.as_strided(self.size, self.stride, self.offset - start)


class _Adopt(torch.autograd.Function):
    """`target` takes `source`'s history where their memory meets: the values there are
    `source`'s (they share storage), elsewhere `target` keeps its own. An in-place node that
    moves no data; its backward splits `target`'s gradient between the two as torch's
    ``CopySlices`` does for a view changed in place."""

    @staticmethod
    def forward(ctx: Any, target: Any, source: Any) -> Any:  # type: ignore[override]
        ctx.target, ctx.source = _Geometry(target), _Geometry(source)
        ctx.same = ctx.target.same(ctx.source)
        ctx.view = target._is_view()
        ctx.mark_dirty(target)
        return target

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        if ctx.same:
            # (a view: torch's CopySlices around this node drops its base's gradient on None)
            return (torch.zeros_like(grad) if ctx.view else None), grad
        target, source = ctx.target, ctx.source
        (t0, t1), (s0, s1) = target.span(), source.span()
        start = min(t0, s0)
        buffer = grad.new_zeros(max(t1, s1) - start)
        target.view(buffer, start).copy_(grad)
        grad_source = source.view(buffer, start).clone()
        source.view(buffer, start).zero_()
        return target.view(buffer, start), grad_source


def span(tensor: Any) -> tuple[int, int]:
    """The storage positions `tensor` covers, first and one past the last."""
    return _Geometry(tensor).span()


def adopt(target: Any, source: Any, shape: bool = False) -> None:
    """`target` takes `source`'s history (see `_Adopt`), and with `shape` its shape (one changed
    in place: `unsqueeze_`, `t_`); tensors saved at the current version stay valid: no value
    changed."""
    version = target._version
    if shape and (target.size() != source.size() or target.stride() != source.stride()):
        target.as_strided_(source.size(), source.stride(), source.storage_offset())
    _Adopt.apply(target, source)
    _set_version((target,), (version,))


class _State:
    """What one watched output stands for: `original`, the tensor the output is without hooks
    (the caller's input, or the input the output is a view of; itself watched when a hooked
    module returned it on: a chain), and whether their histories are synced (see the module
    docstring). Views of the output share it."""

    __slots__ = ("root", "root_fn", "original", "original_fn", "whole", "synced", "site", "kept")

    def __init__(
        self, root: Any, original: Any, whole: bool, site: Site, kept: bool = False
    ) -> None:
        # the output, weakly: it holds this state (a cycle would keep its memory until the
        # collector runs); views of it keep it alive (torch keeps a subclass's Python object
        # as long as its tensor lives)
        self.root = weakref.ref(root)
        self.root_fn = root.grad_fn
        self.original = original
        self.original_fn = original.grad_fn
        self.whole = whole  # the input itself (same shape and place), not a view of it
        self.synced = False
        self.site = site
        # `original` was made in the call and the module keeps it (`_kept`): an outer
        # module returning the output on (a container, torch.compile's wrapper) watches its
        # alias as this output, though the tensor began in its call too
        self.kept = kept

    def refresh(self) -> bool:
        """The output is about to be used: bring it up to date with its input. True when it
        cannot be: the input changed in place before any change of the output (stale)."""
        root, original = self.root(), self.original
        if root is None or not torch.is_grad_enabled():
            # (without grad nothing records a history: it waits for a use with grad)
            return False
        if type(original) is InputAlias and original.__dict__[_STATE].refresh():
            return True  # (a chain: the input is stale itself)
        if root.grad_fn is not self.root_fn:
            # changed where no op of ours saw it: a custom autograd Function that marked it
            # dirty (torch does not pass Function.apply through __torch_function__)
            self.after_inplace()
        fn = original.grad_fn
        if fn is self.original_fn:
            return False
        if not self.synced:
            return True
        adopt(root, original, shape=self.whole)  # (`t_()` on the input: the output is it)
        self.root_fn, self.original_fn = root.grad_fn, fn
        return False

    def outdated(self) -> bool:
        """Whether the input changed in place since the output last took its history (a use
        with grad would bring the output up to date first, or find it stale: `refresh`)."""
        if self.root() is None:
            return False
        original = self.original
        if type(original) is InputAlias and original.__dict__[_STATE].outdated():
            return True
        return original.grad_fn is not self.original_fn

    def stale_error(self) -> InPlaceError:
        return InPlaceError(
            f"{self.site}: without hooks the module's output is a tensor that exists apart "
            "from it (its input returned unchanged or a view of it, a tensor it kept, or "
            "another of its outputs); that tensor was changed in place, not through this "
            "output, and the output was then used. Without hooks the output would carry the "
            "change; unihook's output is an alias whose history cannot take it without leaving "
            "out the module's backward hooks (torch's own backward hook raises here too). Use "
            "the output, not the other tensor, after the call, or pass a copy "
            "(`module(x.clone())`)"
        )

    def after_inplace(self) -> None:
        """The output (or a view of it) was changed in place: so was the input, with the same
        history, as without hooks (and the input's input, along a chain)."""
        original, root = self.original, self.root()
        if root is None:
            return
        if not root.requires_grad:
            # `detach_()`: without hooks the input is detached too (torch cannot detach a
            # view in place: only the input itself)
            if self.whole and not original._is_view():
                original.detach_()
        else:
            adopt(original, root, shape=self.whole)  # (`unsqueeze_()` on the output)
            changed(original)
        self.root_fn, self.original_fn = root.grad_fn, original.grad_fn
        self.synced = True


def use(tensors: Sequence[Any]) -> None:
    """`tensors` go into unihook's identity, a custom autograd Function, which torch does not
    pass through ``__torch_function__``."""
    for t in tensors:
        if type(t) is InputAlias:
            state = t.__dict__[_STATE]
            if state.refresh():
                raise state.stale_error()


def changed(tensor: Any) -> None:
    """`tensor` was changed in place by a custom autograd Function of unihook's (a rebase, an
    `adopt`), which torch does not pass through ``__torch_function__``."""
    if type(tensor) is InputAlias:
        tensor.__dict__[_STATE].after_inplace()


def _records(result: Any) -> bool:
    """Whether `result` of an op carries autograd history."""
    if isinstance(result, torch.Tensor):
        return result.grad_fn is not None
    if type(result) in (tuple, list):
        return any(isinstance(r, torch.Tensor) and r.grad_fn is not None for r in result)
    return False


def _watched(values: Any) -> list[Any]:
    """The watched tensors among `values` and the lists and tuples in it (one level)."""
    found = []
    for v in values:
        if type(v) is InputAlias:
            found.append(v)
        elif type(v) in (list, tuple):
            found += [t for t in v if type(t) is InputAlias]
    return found


class InputAlias(torch.Tensor):
    """A hooked module's output that is its input, or a view of it (see the module docstring).
    A plain tensor to everything but ``type()``: ops on it return plain tensors (views of it
    are watched too), it pickles as a plain tensor."""

    @classmethod
    @partial(not_a_compile_root, callees_too=True)
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return _DISPATCH(func, args, kwargs or {})


def _dispatch(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """An op on watched outputs: brought up to date first, changes carried after."""
    with _Disabled():
        if func in _AS_PLAIN:
            return _as_plain(func, args, kwargs)
        if func in _METADATA:
            return func(*args, **kwargs)
        if getattr(func, "__name__", None) in _PROPERTY and _property(func) not in _VIEWS:
            # a property that gives no view: no history read (torch sets `_backward_hooks` on
            # a view while it holds the lock its `grad_fn` takes); `.data` read in a custom
            # Function's forward (below)
            if _property(func) == "data" and not torch.is_grad_enabled():
                _refuse_in_function(_watched(args))
            return func(*args, **kwargs)
        watched = _watched((*args, *kwargs.values()))
        stale = [w for w in watched if w.__dict__[_STATE].refresh()]
        if watched and not stale and not torch.is_grad_enabled():
            _refuse_in_function(watched)
        # the tensors the op may change in place: self (by position or keyword), `out=`
        first = args[0] if args else kwargs.get("input", kwargs.get("self"))
        targets = _watched((first, kwargs.get("out")))
        fns = [t.grad_fn for t in targets]
        if stale and func in _BACKWARD:
            raise stale[0].__dict__[_STATE].stale_error()
        result = func(*args, **kwargs)
        changed_here = [t for t, fn in zip(targets, fns) if t.grad_fn is not fn]
        if stale and (changed_here or _records(result)):
            # (a use that records no history, `detach()`, a no_grad op, reads none)
            raise stale[0].__dict__[_STATE].stale_error()
        for t in changed_here:
            t.__dict__[_STATE].after_inplace()
        if watched:
            for view in result if type(result) in (tuple, list) else (result,):
                _watch_view(view, watched)
        return result


# A custom autograd Function's `apply` (Python, around the C one): its forward runs without
# grad, and its node takes the histories of the tensors given to `apply` (no
# __torch_function__ sees `apply` itself; `checkpoint(use_reentrant=True)` is one)
_APPLY = torch.autograd.Function.apply.__func__.__code__  # pyright: ignore[reportFunctionMemberAccess]


def _refuse_in_function(watched: Sequence[Any]) -> None:
    """(An op without grad.) In a custom Function's forward, its node took the histories of
    what `apply` was given before any op here could bring them up to date: a watched output
    whose input changed since raises (not under the caller's `no_grad`, which records no
    node, where the forward's `ctx` shows it)."""
    late = [w for w in watched if w.__dict__[_STATE].outdated()]
    if late and _applied_to(late):
        raise late[0].__dict__[_STATE].stale_error()


def _applied_to(tensors: Sequence[Any]) -> bool:
    """Whether this op runs in the forward of a custom Function given one of `tensors` that
    records a node (read from the frames: only for a stale output, rare). Every frame up is
    read: with hooked modules each call adds several (a checkpointed
    `Sequential(Sequential(Linear))` is more than 16 deep), and a Function's forward may apply
    another Function (given the tensor or not) around the op: the inner one, under the outer
    one's no-grad, records none, the outer one took the tensor's history."""
    frame, ctx = sys._getframe(1).f_back, None
    while frame is not None:
        if frame.f_code is _APPLY:
            local = frame.f_locals
            given = (*local.get("args", ()), *(local.get("kwargs") or {}).values())
            if any(arg is t for arg in given for t in tensors) and _records_node(ctx):
                return True
            ctx = None
        else:
            found = _ctx_of(frame)
            ctx = ctx if found is None else found
        frame = frame.f_back
    return False


def _ctx_of(frame: FrameType) -> Any:
    """The `ctx` a Function's forward runs with, if `frame` is one's (its first argument)."""
    code = frame.f_code
    if not code.co_argcount:
        return None
    ctx = frame.f_locals.get(code.co_varnames[0])
    return ctx if isinstance(ctx, torch._C._FunctionBase) else None


def _records_node(ctx: Any) -> bool:
    """Whether the Function whose forward ran with `ctx` (the outermost frame with one below
    its `apply`, through decorators) records a node: not under the caller's `no_grad`, where
    torch collects no edge for it (`next_functions` empty). None (a forward without `ctx`,
    `setup_context`'s style): it cannot be told, so yes."""
    return ctx is None or bool(ctx.next_functions)


def _property(func: Any) -> str | None:
    """The name of the property whose getter or setter `func` is (`Tensor.T.__get__`)."""
    return getattr(getattr(func, "__self__", None), "__name__", None)


# dynamo would trace `_dispatch` into its graph: the checks of histories (`grad_fn`) and the
# rebase, a custom autograd Function marking a tensor dirty, are eager work; while dynamo
# traces, an op on the output breaks the graph and runs here
_DISPATCH = EagerUnderCompile(_dispatch)


def _watch_view(result: Any, watched: Sequence[Any]) -> None:
    """`result`, a view of a watched output, is watched as it."""
    if type(result) is not torch.Tensor or not result._is_view():
        return
    base = result._base
    for w in watched:
        if type(w) is InputAlias:
            state = w.__dict__[_STATE]
            if base is state.root():
                _mark(result, state)
                return


def _as_plain(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """`func` on the output seen as a plain tensor: its pickle (which would hold the class and
    the state), its repr."""
    tensor = args[0]
    state = tensor.__dict__.pop(_STATE)
    tensor.__class__ = torch.Tensor
    try:
        return func(*args, **kwargs)
    finally:
        tensor.__class__ = InputAlias
        tensor.__dict__[_STATE] = state


_AS_PLAIN = {torch.Tensor.__reduce_ex__, torch.Tensor.__repr__, torch.Tensor.__format__}
# reads of metadata: no value, no history
_METADATA = {
    torch.Tensor.dim,
    torch.Tensor.size,
    torch.Tensor.stride,
    torch.Tensor.numel,
    torch.Tensor.storage_offset,
    torch.Tensor.is_contiguous,
    torch.Tensor.element_size,
    torch.Tensor.data_ptr,
    torch.Tensor.untyped_storage,
    torch.Tensor._is_view,
    torch.Tensor.__len__,
}
_PROPERTY = {"__get__", "__set__", "__delete__"}
_VIEWS = {"T", "mT", "H", "mH", "real", "imag"}  # properties that give a view
# what runs a backward from the tensors it is given: a stale output there records its history
_BACKWARD = {
    torch.Tensor.backward,
    torch.autograd.backward,
    torch.autograd.grad,
    torch.Tensor.register_hook,
    torch.Tensor.retain_grad,
}


def _mark(tensor: Any, state: _State) -> None:
    tensor.__class__ = InputAlias
    tensor.__dict__[_STATE] = state


def watch(
    replaced: list[Any],
    aliases: Sequence[Any],
    outputs: Sequence[Any],
    idx: Sequence[int],
    args: Sequence[Any],
    tensor_idx: Sequence[int],
    originals: Sequence[Any],
    site: Site,
    mark: int,
    module: Any,
    returned: Any,
) -> None:
    """Watch, in `replaced` (what the caller gets), the identity's aliases of `outputs[idx]`
    that without hooks would be a tensor someone else may hold: an argument (`args[tensor_idx]`
    as forward got them; `originals`: the caller's tensors for them, None when dead), a view
    of one, a tensor older than the call (autograd sequence number below `mark`: a keyword
    argument, a list's, one the module kept) or a view of one, a tensor another output
    shares memory with (`return y, y`), or one made in the call that `module` keeps
    (`self.kept = y; return y`; `returned`: what forward returned, `outputs` or its one
    tensor). Runs at every call of a hooked module: a new output costs a look at its
    history's sequence number, its version and its reference count."""
    shared = _shared_outputs([outputs[j] for j in idx]) if len(idx) > 1 else ()
    keys = None
    alone, held = returned is not outputs, None
    for n, (j, alias) in enumerate(zip(idx, aliases)):
        if replaced[j] is not alias or type(alias) is not torch.Tensor:
            continue  # (the caller's own tensor back, guarded, or no alias)
        output = outputs[j]
        if _outside_base(output):
            # a view reaching past the tensor it views (`as_strided` over an argument): torch
            # carries an in-place op on it only within that tensor, the rest of the change
            # has no history; refused, as torch's own hook refuses an op on any output
            replaced[j] = guard(alias)
            continue
        original, whole, itself = None, True, False
        for k, i in enumerate(tensor_idx):
            if output is args[i]:
                original, itself = originals[k], True
                break
        else:
            if type(output) is InputAlias or output._is_view():
                if keys is None:
                    keys = _Keys([args[i] for i in tensor_idx], originals)
                original, whole = _stands_for(output, keys, mark)
                if original is None and keys.sharing(output):
                    # memory of an argument that no view of the alias rebuilds (elements of
                    # several, a guarded output of an inner module): an op on it would change
                    # the argument without its history; refused, as by torch's own hook
                    replaced[j] = guard(alias)
                    continue
            elif _older(output, mark):
                original = _caller_tensor(output)
        if original is None and n in shared:
            base = output._base if output._is_view() else None
            original, whole = (output, True) if base is None else (base, False)
        kept = False
        if original is None:
            if type(output) is InputAlias and output.__dict__[_STATE].kept:
                original, whole = output, True  # (a chain: see `_State.kept`)
            elif _COUNTS_MEASURED:
                if held is None:  # (once per call: see `_path_refs`)
                    held = _held(returned, alone, module)
                original, whole = _kept(output, alone, held, module)
            if original is None:
                continue
            kept = True
        if (
            original.dtype != alias.dtype
            or output.is_conj()
            or original.is_conj()
            or output.is_neg() != original.is_neg()
            or (not itself and (original.is_neg() or _reinterpreted(original)))
            or _overlaps_itself(output)
            or _guarded(original)
            or _guarded(output)
        ):
            # A view as another dtype (`.real`, `.imag`, `view_as_real`) or a lazily conjugated
            # or negated one, or of an input that is one (`x.conj()` of a conjugated input is
            # no longer one; `as_strided` over a `.real` counts in the complex storage), or one
            # whose elements overlap (`unfold`): an op on it is not carried to the input (no
            # view of the alias rebuilds the caller's), so it is refused, as torch's own hook
            # refuses an op on any output
            replaced[j] = guard(alias)
            continue
        _mark(alias, _State(alias, original, whole, site, kept))


# Reference counts read in `_kept` when nothing but the call holds a new output. An item of
# the tuple forward returned (`_FREE_ITEM`): the tuple, the core's list of the outputs'
# tensors, `watch`'s and `_kept`'s locals, getrefcount's argument. The tensor forward returned
# alone, or that tuple (`_FREE_RETURNED`): also the frames between the module call and
# `watch`, on the shortest of the paths counted (`_path_refs`). A view's base made in the call
# (`_FREE_BASE`): the local, the argument and torch's own (it keeps a tensor's Python object
# while a C++ reference holds it: a view, a tensor autograd saved; `_cpp_held` tells it). The
# view's storage (`_FREE_STORAGE`): the base, the view, the identity's alias and the storage
# object read (a tensor returned alone: one less). Above these, something holds it: the
# module (`self.kept = y`), a native forward hook's stash, a closure, another view of the base
# (`tests/test_inplace_kept_native.py` and `test_inplace_kept2_native.py` check them).
# Measured on Python 3.11, whose calls move their arguments into the callee's frame (3.10
# copies them, 3.14 borrows some): on another version none is read and a kept output is not
# told (README).
_FREE_ITEM, _FREE_BASE, _FREE_STORAGE = 5, 3, 4
_FREE_RETURNED = {False: 10, True: 11}  # (keyed by: returned alone)
_COUNTS_MEASURED = sys.version_info[:2] == (3, 11)
_storage_uses: Callable[[Any], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def _held(returned: Any, alone: bool, module: Any) -> bool:
    """Whether something besides the call holds `returned`, what forward returned (a tensor
    `alone`, or a tuple, which holds its items): on a path whose frames are counted, by its
    reference count; on another, a count above the fewest frames' sends a look among the
    module's attributes and inside its containers (`held_tensors`) for a tensor sharing
    memory with it. A count torch adds for a C++ reference (a tensor autograd saved, a view)
    is no Python name's: a view of the returned tensor that one keeps (`self.kept = y[1:];
    return y`) shows in the storage's count, and is looked for among the module's
    attributes (a `.grad` holding it is not told)."""
    count = sys.getrefcount(returned) - _FREE_RETURNED[alone]
    if count <= 0 or (alone and returned.layout is not torch.strided):
        return False  # (a sparse tensor has no storage to read, nor views)
    cpp = _cpp_held(returned) if alone else 0
    path = _path_refs(returned)
    if path is not None:
        if count - cpp > path:
            return True
        return bool(
            cpp
            and _storage_uses is not None
            and _storage_uses(returned.untyped_storage()._cdata) > _FREE_STORAGE - 1
            and _keeps_memory_of(module, returned)
        )
    keys = {_storage(t) for t in ((returned,) if alone else returned) if _is_tensor(t)}
    keys.discard(None)
    # (inside the module's containers, not theirs: per call, on these paths only)
    return any(_storage(t) in keys for _, t in held_tensors(module, _is_tensor, 2))


def _kept(output: Any, alone: bool, held: bool, module: Any) -> tuple[Any, bool]:
    """The tensor `output` made in the call is without hooks when something keeps it (`held`:
    what forward returned, `output` `alone` or its tuple; an item of a tuple by its own count),
    or keeps its base for a view, or another view of that base (`self.kept = y; return y[1:]`):
    an in-place op of the caller's on the output must reach it, which reads it later. None when
    nothing does; and whether it is the output itself."""
    if held or (
        not alone and sys.getrefcount(output) - _FREE_ITEM > 0 and _python_held(output, _FREE_ITEM)
    ):
        return output, True
    if output._is_view():
        base = output._base
        if sys.getrefcount(base) > _FREE_BASE:
            return base, False
        if (
            _storage_uses is not None
            and _storage_uses(output.untyped_storage()._cdata) > _FREE_STORAGE
            and _keeps_memory_of(module, output)
        ):
            return base, False  # (another view of the base is kept)
    return None, False


def _keeps_memory_of(module: Any, tensor: Any) -> bool:
    """Whether `module` keeps, among its attributes and inside its containers, a tensor with a
    history sharing `tensor`'s memory (another view of its base; the storage's count alone
    cannot tell it from a view autograd saved, `nn.LSTM`'s, or a detached copy's, which has no
    history to miss)."""
    key = _storage(tensor)
    return key is not None and any(
        t.requires_grad and _storage(t) == key for _, t in held_tensors(module, _is_tensor, 2)
    )


def _cpp_held(tensor: Any) -> int:
    """1 when torch holds `tensor`'s Python object for C++ references to it (a view of it, a
    tensor autograd saved): one count more, whatever their number, which no Python name holds.
    Told by its C++ use count (a view of a view holds the base, not it)."""
    if tensor.layout is not torch.strided:
        return 1  # (taken for torch's, so not watched: nothing of ours reads a sparse output)
    return 1 if tensor._use_count() > 1 else 0


def _python_held(tensor: Any, free: int) -> bool:
    """Whether Python names hold `tensor` beyond `free` (its count in `_kept`'s frame, from
    which this runs: one frame more here)."""
    return sys.getrefcount(tensor) - 1 - free - _cpp_held(tensor) > 0


def watch_inputs(
    args: Sequence[Any],
    tensor_idx: Sequence[int],
    originals: Sequence[Any],
    module: Any,
    site: Site,
    *,
    replaced: bool = False,
    returned: Collection[int] = (),
) -> None:
    """A module that keeps what forward got (`self.inp = h`, `self._cache = [h]`, `self.head =
    h[:2]`, a submodule's `self.sub.kept = h`) keeps unihook's alias of the caller's tensor (or
    a view of it), not the tensor: an in-place op of the caller's on its tensor after the call
    did not reach the kept one's history (a silent wrong gradient; torch's own hook refuses a
    use of it then). The kept alias and its views are watched as an output is: used after
    such an op, `InPlaceError`; changed in place, the caller's tensor takes the change.

    The alias itself is told kept wherever it is held (the module, a submodule, a closure, a
    global) by its reference count: above the frames' (`_FREE_INPUT`) and torch's own for a
    C++ reference (autograd saving it, a view of it: `_cpp_held`). Views of it are looked for
    in the module (`_held_in`): not in a submodule, a closure or a global (README). An alias
    forward returned (`returned`) is watched too: its state costs little here."""
    if not _COUNTS_MEASURED or (
        type(module).__module__.startswith("torch.nn.") and not module._modules
    ):
        return  # (torch's own layers keep no input; its containers call the user's modules)
    for k, i in enumerate(tensor_idx):
        alias, original = args[i], originals[k]
        if original is None or alias is original or type(alias) is not torch.Tensor:
            continue
        extra = sys.getrefcount(alias) - _FREE_INPUT - (_TORCH_HOLDS if replaced else 0)
        # (a weak reference counts none: `self.ref = weakref.ref(h)`, a WeakKeyDictionary)
        weakly = weakref.getweakrefcount(alias) > 0
        if extra <= 0 and not weakly:
            continue  # (nothing holds it, nor a view of it: that is a C++ reference)
        # views of it, or a hooked submodule's output standing for it, are tensors of its
        # memory: looked for only when its storage has more than the caller's and its own
        found = _held_in(module, alias) if _shared_storage(alias) else []
        # held by a Python name: two counts more than the frames' (torch's own for C++
        # references is one at most), or one that is not torch's
        kept = weakly or extra > 1 or any(t is alias for t in found) or not _cpp_held(alias)
        if not kept and not found:
            continue
        # (an outer hooked call's alias: the caller's tensor it stands for, which the caller
        # changes)
        while True:
            caller = _caller_tensor(original)
            if caller is original:
                break
            original = caller
        state = None
        if kept:
            state = _State(alias, original, True, site)
            _mark(alias, state)
        for held in found:
            if type(held) is InputAlias:
                # a hooked submodule's output that stands for this alias (`self.kept =
                # self.inner(h)`, an identity): it stands for the caller's tensor from now on
                inner = held.__dict__[_STATE]
                if inner.original_fn is alias.grad_fn:  # (not outdated: else its use raises)
                    inner.original, inner.original_fn = original, original.grad_fn
            elif held is not alias:  # a view of it, taken before it was watched
                if state is None:
                    state = _State(alias, original, True, site)
                    _mark(alias, state)
                _mark(held, state)


def _held_in(module: Any, alias: Any) -> list[Any]:
    """What `module` holds that is `alias`, a view of it, or a hooked submodule's watched
    output standing for it: among its own attributes (not torch's: its parameters,
    submodules, hook dicts), its buffers, and inside their containers and objects of at most
    `_SMALL` attributes (not a `config` of hundreds: each such call looks), `_DEPTH` deep, at
    most `_READ` values read (`walk_tensors`: a fair share each, no code of theirs run)."""
    own = getattr(module, "__dict__", None)
    if own is None:
        return []
    buffers = own.get("_buffers")
    if len(own) <= len(_MODULE_KEYS) and not buffers:
        return []  # (torch's attributes alone: its submodules are in `_modules`)
    todo = [("", value, 0) for key, value in own.items() if key not in _MODULE_KEYS]
    if buffers:
        todo += [("", value, 0) for value in dict.values(buffers)]
    found = walk_tensors(todo, _is_tensor, _DEPTH, _SMALL, _READ)
    return [t for _, t in found if _is_or_views(t, alias)]


def _is_or_views(value: Any, alias: Any) -> bool:
    kind = type(value)
    if kind is torch.Tensor:
        return value is alias or value._base is alias  # (`_base`: None but for a view)
    return kind is InputAlias and value.__dict__[_STATE].original is alias


def _shared_storage(alias: Any) -> bool:
    """Whether `alias`'s storage has more tensors than it and the caller's (a view of either,
    one autograd saved, a hooked submodule's alias of it): read by its use count, the storage
    object read counting one."""
    if _storage_uses is None:
        return True
    try:
        return _storage_uses(alias.untyped_storage()._cdata) > _FREE_ALIAS_STORAGE
    except (RuntimeError, NotImplementedError):  # (no storage: sparse, meta)
        return False


_FREE_INPUT = 3  # an input's alias in `watch_inputs`: the args, the local, the argument
# and more when torch's own BackwardHook replaced the args forward got (`replaced`: its
# backward hooks, the module's or global, full or pre, registered when the call started)
_TORCH_HOLDS = 2
# its storage's users: the caller's tensor, the alias and the storage object read
_FREE_ALIAS_STORAGE = 3
_MODULE_KEYS = frozenset(vars(torch.nn.Module()))  # (torch's; `_buffers` is read apart)
_SMALL, _DEPTH, _READ = 32, 6, 8192


def _path_refs(returned: Any) -> int | None:
    """How many more references to `returned` than `_FREE_RETURNED` the frames between the
    module call and `_held` hold, on the paths counted; None on another path (torch.compile's,
    a global dispatcher handing the call to a module's own). The paths: torch's hook loop
    (its `_call_impl`'s `inner`, whose `hook_result` may hold it: a forward hook that returned
    it) or unihook's wrapper of `_call_impl` (`_run`), calling the pinned post-dispatcher
    (`EagerUnderCompile`), directly or through `post_dispatch_beside` (one more). (Reading
    `f_locals` gives the frame a dict of its locals: one more reference each, so `_held` runs
    once per call.)"""
    if _in_call(object()) != _MOVED:
        # Calls copy their arguments here (a frame evaluation function of PEP 523's is on:
        # dynamo's frame callback, which runs a compiled function's calls at a graph break):
        # one reference more per frame, so a returned output was taken for kept and came out
        # of the compiled model an InputAlias (helper-114's FINDING 1)
        return None
    caller = sys._getframe(4)  # (this, _held, watch, post_dispatch, its caller)
    extra = 0
    if caller.f_code is _BESIDE:
        caller, extra = caller.f_back, 1
    outer = None if caller is None else caller.f_back
    if caller is None or outer is None or caller.f_code is not _EAGER_CALL:
        return None
    if outer.f_code is _RUN:
        return extra
    if outer.f_code is _INNER:
        return extra + (outer.f_locals.get("hook_result") is returned)
    return None


def _in_call(o: object) -> int:
    return sys.getrefcount(o)


# `_in_call(object())` where calls move their arguments into the callee's frame (Python 3.11's
# own: its local and getrefcount's argument)
_MOVED = 2
_EAGER_CALL = EagerUnderCompile.__call__.__code__
_BESIDE = ModuleBackward.post_dispatch_beside.__code__
_RUN = RUN_CODE
_INNER = next(
    (c for c in TORCH_CALL_CODE.co_consts if isinstance(c, CodeType) and c.co_name == "inner"),
    None,
)
_is_tensor = torch.Tensor.__instancecheck__


class Guard(torch.autograd.Function):
    """`x` returned as it is: torch makes it a view created inside a custom Function, on which
    it refuses every in-place op at once (its BackwardHook's outputs are the same)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:  # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return grad


class _Keys:
    """The call's tensor arguments, by storage (computed once, when an output needs it)."""

    __slots__ = ("inputs", "originals", "_by_storage")

    def __init__(self, inputs: Sequence[Any], originals: Sequence[Any]) -> None:
        self.inputs, self.originals = inputs, originals
        self._by_storage: dict[int, list[int]] | None = None

    def sharing(self, tensor: Any) -> list[int]:
        """The arguments that share `tensor`'s storage."""
        if self._by_storage is None:
            self._by_storage = {}
            for k, arg in enumerate(self.inputs):
                key = _storage(arg) if arg is not None and self.originals[k] is not None else None
                if key is not None:
                    self._by_storage.setdefault(key, []).append(k)
        key = _storage(tensor)
        return [] if key is None else self._by_storage.get(key, [])


def _shared_outputs(outputs: Sequence[Any]) -> set[int]:
    """The outputs that share memory with another output."""
    seen: dict[int, int] = {}
    shared: set[int] = set()
    for n, output in enumerate(outputs):
        key = _storage(output)
        if key is None:
            continue
        if key in seen:
            shared |= {seen[key], n}
        else:
            seen[key] = n
    return shared


def _stands_for(output: Any, keys: _Keys, mark: int) -> tuple[Any, bool]:
    """The tensor `output` is without hooks, a view of an argument or a hooked submodule's
    watched output (an alias of the input, not a view), and whether it is all of it."""
    inputs, originals = keys.inputs, keys.originals
    (o0, o1) = _bytes(output)
    # The arguments holding the output's memory (views of one tensor passed as several
    # arguments share its storage): those reading it as the output does (dtype, lazy
    # conjugation and negation) first, then the smallest; where several tie, the one whose
    # elements are the output's (`m(c.real, c.imag)` cover each other's spans).
    candidates = []
    for k in keys.sharing(output):
        arg = inputs[k]
        first, end, count = _extent(arg)
        size = arg.element_size()
        a0, a1 = first * size, end * size
        # (within its span: all of the output's elements are its own where it has no gaps)
        if a0 <= o0 and o1 <= a1 and (count == end - first or _holds(arg, output)):
            candidates.append((_reads_differently(output, arg), a1 - a0, k))
    if candidates:
        candidates.sort()
        best = [k for rank, size, k in candidates if (rank, size) == candidates[0][:2]]
        found = best[0]
        if len(best) > 1:
            found = next((k for k in best if _holds(inputs[k], output)), found)
        return originals[found], _Geometry(output).same(_Geometry(inputs[found]))
    if _older(output, mark):
        return _caller_tensor(output), True
    if output._is_view() and _older(output._base, mark):
        return _caller_tensor(output._base), False
    return None, False


def _extent(tensor: Any) -> tuple[int, int, int]:
    """`span` (torch's strides are never negative) and the number of elements, without
    `_Geometry`: read at every call of a module returning a view."""
    first = end = tensor.storage_offset()
    count = 1
    for size, stride in zip(tensor.size(), tensor.stride()):
        if not size:
            return first, first, 0
        end += (size - 1) * stride
        count *= size
    return first, end + 1, count


def _guarded(tensor: Any) -> bool:
    """Whether `tensor` is a guarded output, or a view of one, which torch refuses ops on (an
    outer module returning it on would carry them past the guard): a view whose base is an
    alias `guard` took (nothing else holds that alias)."""
    if not tensor._is_view():
        return False
    base = tensor._base
    ref = _guarded_bases.get(id(base))
    return ref is not None and ref() is base


# the aliases `guard` made a guarded view of, by id (see `_guarded`)
_guarded_bases: dict[int, weakref.ref[Any]] = {}


_guarded_lock = threading.RLock()  # (a callback's check-and-delete beside another thread's entry;
# reentrant: the collector may run that callback inside the store below, on this thread)


def _forget_guarded(key: int, ref: weakref.ref[Any]) -> None:
    with _guarded_lock:
        if _guarded_bases.get(key) is ref:
            del _guarded_bases[key]


def guard(alias: Any) -> Any:
    """`alias` returned as a view made inside a custom Function (`Guard`): torch refuses every
    in-place op on it and on its views."""
    key = id(alias)
    ref = weakref.ref(alias, partial(_forget_guarded, key))
    with _guarded_lock:
        _guarded_bases[key] = ref
    return Guard.apply(alias)


def _reinterpreted(tensor: Any) -> bool:
    """Whether `tensor` views memory of another dtype (`.real` of a complex tensor)."""
    base = tensor._base
    return base is not None and base.dtype != tensor.dtype


_internal_overlap = torch._debug_has_internal_overlap  # pyright: ignore[reportPrivateImportUsage]


def _overlaps_itself(tensor: Any) -> bool:
    """Whether two of `tensor`'s elements share memory (`unfold`, `expand`). torch's own check
    says yes (a stride 0), no (contiguous), or cannot tell (any other layout): then strides
    each past the reach of the smaller ones (transposes, slices, diagonals) share none, and
    other layouts (rare) are counted."""
    found = _internal_overlap(tensor)
    if found != 2:
        return bool(found)
    reach = 0
    for stride, size in sorted((st, n) for n, st in zip(tensor.size(), tensor.stride()) if n > 1):
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return False
    g = _Geometry(tensor)
    positions = torch.arange(span(tensor)[1]).as_strided(g.size, g.stride, g.offset)
    return bool(positions.unique().numel() < positions.numel())


def _outside_base(tensor: Any) -> bool:
    """Whether `tensor` is a view covering memory its base does not (`as_strided`; over a base
    with gaps, a diagonal or a column slice: elements it does not hold)."""
    base = tensor._base
    if base is None:
        return False
    (t0, t1, _), (b0, b1, count) = _extent(tensor), _extent(base)
    size, base_size = tensor.element_size(), base.element_size()
    if t0 * size < b0 * base_size or b1 * base_size < t1 * size:
        return True
    return count != b1 - b0 and not _holds(base, tensor)


def _reads_differently(a: Any, b: Any) -> int:
    """How many of dtype, lazy conjugation and lazy negation differ between `a` and `b`."""
    return (a.dtype != b.dtype) + (a.is_conj() != b.is_conj()) + (a.is_neg() != b.is_neg())


def _holds(arg: Any, output: Any) -> bool:
    """Whether every element of `output` is an element of `arg` (same element size: their
    storage positions; rare, on ties only)."""
    if arg.element_size() != output.element_size():
        return False
    end = max(span(arg)[1], span(output)[1])
    positions = torch.arange(end)
    inside = torch.zeros(end, dtype=torch.bool)
    g = _Geometry(arg)
    inside[positions.as_strided(g.size, g.stride, g.offset).reshape(-1)] = True
    g = _Geometry(output)
    return bool(inside[positions.as_strided(g.size, g.stride, g.offset).reshape(-1)].all())


def _bytes(tensor: Any) -> tuple[int, int]:
    """`span` in bytes: a view as another dtype (`.real` of a complex tensor) counts its
    positions in its own elements."""
    first, end, _ = _extent(tensor)
    size = tensor.element_size()
    return first * size, end * size


def _older(tensor: Any, mark: int) -> bool:
    """Whether `tensor`'s history started before the call (this thread's counter), or it is
    a tensor from before the call that forward changed in place."""
    fn = tensor.grad_fn
    if fn is None:
        return False
    version = tensor._version
    return fn._sequence_nr() < mark or (version > 0 and _changed_older(fn, version, mark))


_IN_PLACE_WALK = 8  # the most in-place nodes `_changed_older` walks back


def _changed_older(fn: Any, version: int, mark: int) -> bool:
    """Whether a tensor whose history `fn` began in the call is one from before it that forward
    changed in place (passed by keyword: `x.mul_(2); return x`): its last `version` nodes are
    taken for its in-place ones (an in-place op's first input is the tensor itself), one of
    them reaching a node older than the call. A tensor made in the call and changed under
    no_grad can be taken for one: watched as itself, which costs its ops the watch, never a
    number."""
    for _ in range(min(version, _IN_PLACE_WALK)):
        nexts = fn.next_functions
        if not nexts or nexts[0][0] is None:
            return False
        fn = nexts[0][0]
        if fn._sequence_nr() < mark:
            return True
    return False


def _caller_tensor(tensor: Any) -> Any:
    """`tensor`, or, for an input side's alias an earlier call gave forward (a module that
    kept its input), the caller's tensor it stood for."""
    fn = tensor.grad_fn
    callers = getattr(fn, "callers", None)  # (set on unihook's input-side identity nodes)
    if callers is not None:
        caller = callers[tensor.output_nr]()
        if caller is not None:
            return caller
    return tensor


def _storage(tensor: Any) -> int | None:
    if not tensor.numel():
        return None
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (sparse, meta)
        return None
