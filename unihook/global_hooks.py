"""Process-wide hooks: every module of a backend, and registration hooks.

``backend=None`` installs a hook in every installed backend (a framework that is not imported
yet gets it when it is); ``backend="paddle"`` in one. The handle removes it everywhere.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, overload

from ._describe import Site
from ._locks import Collecting, held_here, inside_registration, registering, undo
from ._plugins import outside_compilers, plugin_manager
from .api import _backends, _no_backend_hint, _short, not_a_flag
from .errors import HookArgumentError, NoBackendError, UnsupportedHookError
from .handles import Handle
from .hooktypes import (
    BackwardHook,
    BackwardPreHook,
    ForwardHook,
    ForwardHookWithKwargs,
    ForwardPreHook,
    ForwardPreHookWithKwargs,
    RegistrationHook,
)
from .info import BackendInfo
from .kinds import GlobalKind, global_label

__all__ = [
    "register_module_forward_pre_hook",
    "register_module_forward_hook",
    "register_module_full_backward_pre_hook",
    "register_module_full_backward_hook",
    "register_module_parameter_registration_hook",
    "register_module_buffer_registration_hook",
    "register_module_module_registration_hook",
]


# As in api: the overloads tie the hook's signature to `with_kwargs`.
@overload
def register_module_forward_pre_hook(
    hook: ForwardPreHook, *, backend: str | None = ..., with_kwargs: Literal[False] = ...
) -> Handle: ...
@overload
def register_module_forward_pre_hook(
    hook: ForwardPreHookWithKwargs, *, backend: str | None = ..., with_kwargs: Literal[True]
) -> Handle: ...
def register_module_forward_pre_hook(
    hook: ForwardPreHook | ForwardPreHookWithKwargs,
    *,
    backend: str | None = None,
    with_kwargs: bool = False,
) -> Handle:
    """``hook(module, args)`` before every module's forward, before the module's own pre-hooks."""
    return _register("forward_pre", hook, backend, with_kwargs=with_kwargs)


@overload
def register_module_forward_hook(
    hook: ForwardHook,
    *,
    backend: str | None = ...,
    with_kwargs: Literal[False] = ...,
    always_call: bool = ...,
) -> Handle: ...
@overload
def register_module_forward_hook(
    hook: ForwardHookWithKwargs,
    *,
    backend: str | None = ...,
    with_kwargs: Literal[True],
    always_call: bool = ...,
) -> Handle: ...
def register_module_forward_hook(
    hook: ForwardHook | ForwardHookWithKwargs,
    *,
    backend: str | None = None,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> Handle:
    """``hook(module, args, output)`` after every module's forward, before its own hooks."""
    return _register("forward", hook, backend, with_kwargs=with_kwargs, always_call=always_call)


def register_module_full_backward_pre_hook(
    hook: BackwardPreHook, *, backend: str | None = None
) -> Handle:
    """``hook(module, grad_output)`` for every module call, before the module's own."""
    return _register("full_backward_pre", hook, backend)


def register_module_full_backward_hook(hook: BackwardHook, *, backend: str | None = None) -> Handle:
    """``hook(module, grad_input, grad_output)`` for every module call, before the module's own."""
    return _register("full_backward", hook, backend)


def register_module_parameter_registration_hook(
    hook: RegistrationHook, *, backend: str | None = None
) -> Handle:
    """``hook(module, name, param) -> None | replacement`` on every parameter registration."""
    return _register("parameter_registration", hook, backend)


def register_module_buffer_registration_hook(
    hook: RegistrationHook, *, backend: str | None = None
) -> Handle:
    """``hook(module, name, buffer) -> None | replacement`` on every buffer registration (on
    paddle, assigning a plain tensor attribute registers a non-persistable buffer)."""
    return _register("buffer_registration", hook, backend)


def register_module_module_registration_hook(
    hook: RegistrationHook, *, backend: str | None = None
) -> Handle:
    """``hook(module, name, submodule) -> None | replacement`` on every submodule registration."""
    return _register("module_registration", hook, backend)


def _register(
    kind: GlobalKind,
    hook: object,
    backend: str | None,
    *,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> Handle:
    # (the installed packages read outside a compiler tracing this: part of the registration)
    infos = outside_compilers("registration", _backends)
    installed = [info.name for info in infos if info.installed]
    site = Site(global_label(kind), backend or ",".join(installed) or "none", "every module")
    if not callable(hook):
        raise HookArgumentError(f"{site}: `hook` must be callable. Received: hook={_short(hook)}.")
    flag = not_a_flag({"with_kwargs": with_kwargs, "always_call": always_call})
    if flag:
        raise HookArgumentError(f"{site}: {flag}")
    if held_here():  # (a finalizer run inside a registration: refused before any change)
        raise inside_registration(site)
    if backend is not None and backend not in installed:
        raise HookArgumentError(
            f"{site}: `backend` must be one of {{None, {', '.join(map(repr, installed))}}}. "
            f"Received: backend={_short(backend)}."
        )
    # As in unihook.api._register: undone unless the handle is returned.
    steps: list[Callable[[], object]] = []
    outer = getattr(registering, "steps", None)
    try:
        registering.steps = steps
        # (made inside a compiled function, it runs outside the compiler: add_compiler_escape)
        handle = outside_compilers(
            "registration", _in_backends, kind, hook, backend, with_kwargs, always_call, site, infos
        )
        registering.steps = outer
        if isinstance(outer, Collecting):  # (undone with attach's, if that one is)
            outer.append(handle.remove)
        return handle
    except BaseException as error:
        registering.steps = outer
        undo(steps, error)
        raise


def _in_backends(
    kind: GlobalKind,
    hook: object,
    backend: str | None,
    with_kwargs: bool,
    always_call: bool,
    site: Site,
    infos: list[BackendInfo],
) -> Handle:
    """The hook registered in `backend`, or every installed one (`infos`: unihook.backends())."""
    installed = [info.name for info in infos if info.installed]
    results = plugin_manager().hook.unihook_register_global_hook(
        kind=kind, hook=hook, with_kwargs=with_kwargs, always_call=always_call, backend=backend
    )
    handles: list[Handle] = [h for h in results if h is not None]
    if backend is not None and not handles:
        raise site.error(
            UnsupportedHookError,
            f"a backend that implements global {kind} hooks (see unihook.backends())",
            f"backend {backend!r}, which does not",
        )
    if not handles:
        # a handle that never fires would hide it: say why nothing takes the hook
        if not installed:
            raise NoBackendError(
                f"{site}: expected an installed backend to take the hook. Received: none "
                f"installed.{_no_backend_hint(infos)}"
            )
        raise site.error(
            UnsupportedHookError,
            f"a backend that implements global {kind} hooks (see unihook.backends())",
            f"installed backends {', '.join(map(repr, installed))}, none of which does",
        )
    handles.sort(key=lambda h: h.backend)

    def remove() -> Any:
        for handle in handles:
            handle.remove()

    return Handle(",".join(h.backend for h in handles), global_label(kind), remove)
