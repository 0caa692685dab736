"""Hooks on many modules at once: attach by name pattern, as a group that always goes away.

A hook attached by pattern learns the qualified name of the module it runs on if it takes a
keyword parameter ``name``: ``def hook(module, args, output, *, name): ...``. The name is bound
once, at attach time (``functools.partial``, no Python frame per call).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Literal, Sequence, Union, cast, overload

from . import api
from ._describe import type_name
from ._locks import Collecting, registering, undo
from .errors import HookArgumentError
from .handles import Handle, Removable
from .hooktypes import (
    BackwardHook,
    BackwardPreHook,
    ForwardHook,
    ForwardHookWithKwargs,
    ForwardPreHook,
    ForwardPreHookWithKwargs,
    ModuleKind,
    NamedBackwardHook,
    NamedBackwardPreHook,
    NamedForwardHook,
    NamedForwardHookWithKwargs,
    NamedForwardPreHook,
    NamedForwardPreHookWithKwargs,
    When,
)
from .kinds import KIND_INFO
from .ops import named_modules, part

__all__ = ["HookGroup", "attach", "select", "KINDS"]

Where = Union[None, str, Sequence[str], Sequence[tuple[str, Any]], Callable[[str, Any], bool]]

#: The default of attach's options: an option not given is not passed on.
_UNSET: Any = object()

#: attach's kinds, and the per-module function each uses.
KINDS: dict[ModuleKind, Callable[..., Handle]] = {
    "forward_pre": api.register_forward_pre_hook,
    "forward": api.register_forward_hook,
    "full_backward_pre": api.register_full_backward_pre_hook,
    "full_backward": api.register_full_backward_hook,
}


class HookGroup(Removable):
    """Handles of hooks placed together: `remove()` (idempotent), `with group:`, `len(group)`,
    `group.names` (the qualified names hooked, in model order)."""

    def __init__(self) -> None:
        self._handles: list[Handle] = []
        #: The qualified names hooked, in model order.
        self.names: list[str] = []

    def add(self, name: str, handle: Handle) -> None:
        self._handles.append(handle)
        self.names.append(name)

    def extend(self, other: HookGroup) -> None:
        self._handles.extend(other._handles)
        self.names.extend(other.names)

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        try:
            for handle in reversed(handles):
                handle.remove()
        except BaseException:
            # cut short (a Ctrl-C): the rest go too (a handle's removal is idempotent)
            for handle in reversed(handles):
                handle.remove()
            raise

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[Handle]:
        return iter(list(self._handles))

    def __repr__(self) -> str:
        return f"<unihook.HookGroup {len(self)} hooks>"


def select(model: Any, where: Where = None) -> list[tuple[str, Any]]:
    """The (qualified name, module) pairs of `model` that `where` selects, model included.

    `where`: None (all), a glob on qualified names ("layer3.*.conv*"; the model itself is ""),
    a list of globs, ``callable(name, module) -> bool``, or (name, module) pairs, as this
    returns them (taken as they are: the modules under those names, also one the model no
    longer holds). A glob that matches nothing raises ValueError listing the nearest names.
    """
    return _select(model, where, "select")


def _label(what: str, model: Any) -> str:
    """`forward hooks by attach on ResNet [backend torch]`: errors name the call and model."""
    return f"{what} on {type_name(model)} [backend {api.backend_of(model)}]"


def _select(model: Any, where: Where, what: str) -> list[tuple[str, Any]]:
    if _are_pairs(where):
        return list(cast(Sequence[tuple[str, Any]], where))
    modules = named_modules(model)
    if where is None:
        return modules
    if callable(where):
        # a part's wrapper (torch.compile of a submodule...) stands for the part, which is not
        # listed: the predicate is asked of both (`isinstance(m, nn.Linear)`, or the wrapper's
        # type)
        def chosen(name: str, module: Any) -> bool:
            inner = part(module)
            return where(name, module) or (inner is not module and where(name, inner))

        return [(n, m) for n, m in modules if chosen(n, m)]
    from fnmatch import fnmatchcase  # lazily: it imports re

    given = [where] if isinstance(where, str) else list(where)
    patterns = [p for p in given if isinstance(p, str)]
    if len(patterns) != len(given):
        raise HookArgumentError(
            f"{_label(what, model)}: `where` must be one of {{None, a glob string, a list of "
            f"globs, callable(name, module) -> bool, (name, module) pairs}}. Received: "
            f"where={api._short(where)}."
        )
    names = [n for n, _ in modules]
    for pattern in patterns:
        if not any(fnmatchcase(n, pattern) for n in names):
            import difflib

            near = difflib.get_close_matches(pattern, names, n=5, cutoff=0.4) or names[:5]
            raise HookArgumentError(
                f"{_label(what, model)}: `where` must match a module's qualified name. "
                f"Received: pattern {pattern!r}, which matches no module. Nearest names: "
                f"{', '.join(repr(n) for n in near)}"
            )
    return [(n, m) for n, m in modules if any(fnmatchcase(n, p) for p in patterns)]


def _are_pairs(where: Where) -> bool:
    """Whether `where` is (name, module) pairs, as `select` gives them."""
    return (
        isinstance(where, (list, tuple))
        and bool(where)
        and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in where)
    )


# The overloads tie the hook's signature to `kind` (and to `with_kwargs`), and list the options
# each kind takes (unihook.kinds.KIND_INFO), so a type checker flags a hook of the wrong arity
# and a misspelled or inapplicable option. A hook may also take the module's qualified name
# as a keyword parameter `name` (the Named* Protocols).
@overload
def attach(
    model: Any,
    hook: ForwardHook | NamedForwardHook,
    *,
    kind: Literal["forward"] = ...,
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
    with_kwargs: Literal[False] = ...,
    always_call: bool = ...,
) -> HookGroup: ...
@overload
def attach(
    model: Any,
    hook: ForwardHookWithKwargs | NamedForwardHookWithKwargs,
    *,
    kind: Literal["forward"] = ...,
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
    with_kwargs: Literal[True],
    always_call: bool = ...,
) -> HookGroup: ...
@overload
def attach(
    model: Any,
    hook: ForwardPreHook | NamedForwardPreHook,
    *,
    kind: Literal["forward_pre"],
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
    with_kwargs: Literal[False] = ...,
) -> HookGroup: ...
@overload
def attach(
    model: Any,
    hook: ForwardPreHookWithKwargs | NamedForwardPreHookWithKwargs,
    *,
    kind: Literal["forward_pre"],
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
    with_kwargs: Literal[True],
) -> HookGroup: ...
@overload
def attach(
    model: Any,
    hook: BackwardPreHook | NamedBackwardPreHook,
    *,
    kind: Literal["full_backward_pre"],
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
) -> HookGroup: ...
@overload
def attach(
    model: Any,
    hook: BackwardHook | NamedBackwardHook,
    *,
    kind: Literal["full_backward"],
    where: Where = ...,
    when: When = ...,
    prepend: bool = ...,
) -> HookGroup: ...
def attach(
    model: Any,
    hook: Callable[..., Any],
    *,
    kind: ModuleKind = "forward",
    where: Where = None,
    when: When = None,
    prepend: bool = _UNSET,
    with_kwargs: bool = _UNSET,
    always_call: bool = _UNSET,
    **unknown: Any,
) -> HookGroup:
    """Register `hook` of `kind` on every module of `model` that `where` selects.

    `kind`: "forward_pre", "forward", "full_backward_pre" or "full_backward"; `when`: None,
    "train", "eval" or ``callable(module) -> bool``, checked at every call; `prepend`,
    `with_kwargs`, `always_call`: as the per-module function of that kind takes them (forward:
    all three; forward_pre: prepend and with_kwargs; the backward kinds: prepend).
    """
    # Only the options given reach the per-module function; an option the kind does not take,
    # or an unknown keyword, is a HookArgumentError naming the kind (at run time as before the
    # options were spelled out; a type checker flags both at the call).
    given = {"prepend": prepend, "with_kwargs": with_kwargs, "always_call": always_call}
    options = {k: v for k, v in given.items() if v is not _UNSET}
    options.update(unknown)
    what = f"{kind} hooks by attach"
    if kind not in KINDS:
        allowed = ", ".join(map(repr, KINDS))
        raise HookArgumentError(
            f"{_label(what, model)}: `kind` must be one of {{{allowed}}}. "
            f"Received: kind={api._short(kind)}."
        )
    allowed_options = KIND_INFO[kind].options
    unknown_names = set(options) - allowed_options
    if unknown_names:
        raise HookArgumentError(
            f"{_label(what, model)}: options for kind={kind!r} must be among "
            f"{sorted(allowed_options)}. Received: {sorted(unknown_names)}."
        )
    register = KINDS[kind]
    wants_name = _takes_name(hook)
    group = HookGroup()
    # Each registration records its removal here (unihook._locks): undone, the registrations
    # made so far with their handles, which a Ctrl-C could leave outside the group.
    steps = Collecting()
    outer = getattr(registering, "steps", None)
    try:
        registering.steps = steps
        for name, module in _select(model, where, what):
            bound = functools.partial(hook, name=name) if wants_name else hook
            group.add(name, register(module, bound, when=when, name=name, **options))
        registering.steps = outer
        return group
    except BaseException as error:
        registering.steps = outer
        undo(steps, error)
        group.remove()
        raise


def _takes_name(hook: Callable[..., Any]) -> bool:
    import inspect  # lazily: slow to import, needed only at attach time

    try:
        parameters = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return False
    param = parameters.get("name")
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
