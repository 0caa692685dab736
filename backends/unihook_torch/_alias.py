"""A module output that is its input returned unchanged (``nn.Identity``, eval-mode Dropout) or
a view of it (``nn.Flatten``, ``x[0]``), on torch.

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
``__torch_function__`` (`InputAlias`): only such outputs pay for it (about 3 us per op on them),
and views taken of them are watched too.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import torch

from unihook.backend import Site
from unihook.errors import InPlaceError

__all__ = ["InputAlias", "adopt", "changed", "span", "use", "watch"]

_Disabled = torch._C.DisableTorchFunctionSubclass
_set_version = torch._C._autograd._unsafe_set_version_counter  # pyright: ignore[reportAttributeAccessIssue]
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


def adopt(target: Any, source: Any) -> None:
    """`target` takes `source`'s history (see `_Adopt`); tensors saved at the current version
    stay valid: no value changed."""
    version = target._version
    _Adopt.apply(target, source)
    _set_version((target,), (version,))


class _State:
    """What one watched output stands for: `original`, the caller's input (or the tensor the
    output is a view of), and whether their histories are synced (see the module docstring).
    Views of the output share it."""

    __slots__ = ("root", "original", "original_fn", "whole", "synced", "site")

    def __init__(self, root: Any, original: Any, whole: bool, site: Site) -> None:
        # the output, weakly: it holds this state (a cycle would keep its memory until the
        # collector runs); views of it keep it alive (torch keeps a subclass's Python object
        # as long as its tensor lives)
        self.root = weakref.ref(root)
        self.original = original
        self.original_fn = original.grad_fn
        self.whole = whole  # the input itself, not a view of it
        self.synced = False
        self.site = site

    def refresh(self) -> bool:
        """The output is about to be used: the input changed in place meanwhile? Synced, the
        output takes that history; else True: the output is stale (`stale_error`)."""
        original = self.original
        fn = original.grad_fn
        if fn is self.original_fn:
            return False
        if not self.synced:
            return True
        root = self.root()
        if root is not None:
            adopt(root, original)
        self.original_fn = fn
        return False

    def stale_error(self) -> InPlaceError:
        return InPlaceError(
            f"{self.site}: the module returned its input unchanged (or a view of it), that "
            "input was then changed in place, and the module's output was used after that. "
            "Without hooks the output is the input and carries the change; unihook's output is "
            "an alias of it whose history cannot take the change without leaving out the "
            "module's backward hooks (torch's own backward hook raises here too). Use the "
            "output, not the input, after the call, or pass a copy (`module(x.clone())`)"
        )

    def after_inplace(self) -> None:
        """The output (or a view of it) was changed in place: so was the input, with the same
        history, as without hooks."""
        original, root = self.original, self.root()
        if root is None:
            return
        if self.whole and (original.size() != root.size() or original.stride() != root.stride()):
            # a shape the op changed in place (`unsqueeze_`): the input is the output
            original.as_strided_(root.size(), root.stride(), root.storage_offset())
        adopt(original, root)
        self.original_fn = original.grad_fn
        self.synced = True


def use(tensors: Sequence[Any]) -> None:
    """`tensors` go into unihook's identity, a custom autograd Function, which torch does not
    pass through ``__torch_function__``."""
    for t in tensors:
        if type(t) is InputAlias:
            state = t.__dict__[_STATE]
            if state.refresh():
                raise state.stale_error()


def _records(result: Any) -> bool:
    """Whether `result` of an op carries autograd history."""
    if isinstance(result, torch.Tensor):
        return result.grad_fn is not None
    if type(result) in (tuple, list):
        return any(isinstance(r, torch.Tensor) and r.grad_fn is not None for r in result)
    return False


def changed(tensor: Any) -> None:
    """`tensor` was changed in place by a custom autograd Function (unihook's rebase)."""
    if type(tensor) is InputAlias:
        tensor.__dict__[_STATE].after_inplace()


def _watched(args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    found = [a for a in args if type(a) is InputAlias]
    for a in args:
        if type(a) in (list, tuple):
            found += [t for t in a if type(t) is InputAlias]
    if kwargs:
        found += [v for v in kwargs.values() if type(v) is InputAlias]
    return found


class InputAlias(torch.Tensor):
    """A hooked module's output that is its input, or a view of it (see the module docstring).
    A plain tensor to everything but ``type()``: ops on it return plain tensors (views of it
    are watched too), it pickles as a plain tensor."""

    @classmethod
    # dynamo would trace this into its graph: the checks of histories (`grad_fn`) and the
    # rebase, a custom autograd Function marking a tensor dirty, are eager work; an op on the
    # output breaks the graph and runs here instead (torch's lazy disable: no dynamo import)
    @torch._disable_dynamo  # pyright: ignore[reportPrivateImportUsage]
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        with _Disabled():
            if func in _AS_PLAIN:
                return _as_plain(func, args, kwargs)
            if getattr(func, "__name__", None) == "__get__":
                return func(*args, **kwargs)  # a property (`.shape`, `.grad_fn`): no value read
            watched = _watched(args, kwargs)
            states = [w.__dict__[_STATE] for w in watched]
            stale = [state for state in states if state.refresh()]
            fns = [w.grad_fn for w in watched]
            result = func(*args, **kwargs)
            if stale and _records(result):
                # (a use that records no history, `detach()`, a no_grad op, reads no history)
                raise stale[0].stale_error()
            for w, state, fn in zip(watched, states, fns):
                if w.grad_fn is not fn:
                    state.after_inplace()
            if type(result) is torch.Tensor and result._is_view():
                for state in states:
                    if result._base is state.root():
                        _mark(result, state)
                        break
            return result


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


def _mark(tensor: Any, state: _State) -> None:
    tensor.__class__ = InputAlias
    tensor.__dict__[_STATE] = state


def watch(
    alias: Any, output: Any, inputs: Sequence[Any], originals: Sequence[Any], site: Site
) -> Any:
    """What the caller gets for `alias`, the identity's alias of a module's `output`: watched
    when `output` is one of `inputs` (what forward got) or a view of one, `originals` being
    the caller's tensors for them (None when dead)."""
    if type(alias) is not torch.Tensor:
        return alias
    # (a hooked submodule's watched output, returned on: an alias of the input, not a view)
    shared = type(output) is InputAlias or output._is_view()
    for k, arg in enumerate(inputs):
        original = originals[k]
        if original is None or arg is None:
            continue
        if output is arg:
            whole = True
        elif shared and _same_memory(output, arg):
            whole = _Geometry(output).same(_Geometry(arg))
        else:
            continue
        if original.dtype != alias.dtype:
            return alias  # (a view as another dtype: nothing differentiable moves through it)
        state = _State(alias, original, whole, site)
        _mark(alias, state)
        return alias
    return alias


def _same_memory(a: Any, b: Any) -> bool:
    if not (a.numel() and b.numel()):
        return False
    try:
        return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (sparse, meta)
        return False
