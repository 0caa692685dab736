"""The neutral per-object API: resolve the backend once, at registration, through pluggy."""

from __future__ import annotations

from typing import Any, Callable, Union

from ._describe import Site, type_name
from ._plugins import call_owner, plugin_manager
from .errors import HookArgumentError, NoBackendError, UnsupportedHookError
from .handles import Handle
from .info import BackendInfo

__all__ = [
    "Hook",
    "When",
    "backend_of",
    "backends",
    "register_forward_pre_hook",
    "register_forward_hook",
    "register_forward_post_hook",
    "register_tensor_hook",
    "register_full_backward_pre_hook",
    "register_full_backward_hook",
]

Hook = Callable[..., Any]
When = Union[None, str, Callable[[Any], bool]]
WHEN_VALUES = ("train", "eval")


def backends() -> list[BackendInfo]:
    """Every registered backend: name, framework version (None when not installed), and per
    hook kind whether it is native, emulated or unsupported."""
    return sorted(plugin_manager().hook.unihook_backend_info(), key=lambda info: info.name)


def backend_of(obj: object) -> str:
    """The name of the backend that owns `obj` ("torch", "paddle", ...)."""
    name = plugin_manager().hook.unihook_backend_of(obj=obj)
    if name is None:
        raise _no_backend("backend_of", obj)
    return name


def register_forward_pre_hook(
    module: Any,
    hook: Hook,
    *,
    prepend: bool = False,
    with_kwargs: bool = False,
    when: When = None,
    name: str | None = None,
) -> Handle:
    """Run ``hook(module, args)`` (with_kwargs: ``hook(module, args, kwargs)``) before forward.

    `when` (None, "train", "eval" or ``callable(module) -> bool``) is checked at every call;
    `name` is the module's qualified name, used in error messages.
    """
    return _register(
        "forward_pre",
        module,
        hook=_guarded("forward_pre", module, name, hook, when),
        prepend=prepend,
        with_kwargs=with_kwargs,
        name=name,
    )


def register_forward_hook(
    module: Any,
    hook: Hook,
    *,
    prepend: bool = False,
    with_kwargs: bool = False,
    always_call: bool = False,
    when: When = None,
    name: str | None = None,
) -> Handle:
    """Run ``hook(module, args, output)`` (with_kwargs: ``hook(module, args, kwargs, output)``)
    after forward; a non-None return replaces the output. `always_call` runs it, with
    ``output=None``, also when forward raised."""
    return _register(
        "forward",
        module,
        hook=_guarded("forward", module, name, hook, when),
        prepend=prepend,
        with_kwargs=with_kwargs,
        always_call=always_call,
        name=name,
    )


#: Paddle's name for the same function.
register_forward_post_hook = register_forward_hook


def register_tensor_hook(tensor: Any, hook: Hook, *, name: str | None = None) -> Handle:
    """Run ``hook(grad)`` when the gradient of `tensor` is computed; a returned tensor (same
    shape and dtype) replaces the gradient."""
    return _register("tensor", tensor, hook=_callable("tensor", tensor, name, hook), name=name)


def register_full_backward_pre_hook(
    module: Any, hook: Hook, *, prepend: bool = False, when: When = None, name: str | None = None
) -> Handle:
    """Run ``hook(module, grad_output)`` once per module call when the gradient reaches the
    module's outputs; a returned tuple (same length) replaces grad_output."""
    hook = _guarded("full_backward_pre", module, name, hook, when)
    return _register("full_backward_pre", module, hook=hook, prepend=prepend, name=name)


def register_full_backward_hook(
    module: Any, hook: Hook, *, prepend: bool = False, when: When = None, name: str | None = None
) -> Handle:
    """Run ``hook(module, grad_input, grad_output)`` once per module call after every input
    gradient exists; a returned tuple (one slot per positional argument) replaces grad_input."""
    hook = _guarded("full_backward", module, name, hook, when)
    return _register("full_backward", module, hook=hook, prepend=prepend, name=name)


def _register(kind: str, target: object, **options: Any) -> Handle:
    handle: Handle | None = call_owner(
        f"unihook_register_{kind}_hook",
        target,
        **{"tensor" if kind == "tensor" else "module": target},
        **options,
    )
    if handle is not None:
        return handle
    backend = plugin_manager().hook.unihook_backend_of(obj=target)
    if backend is None:
        raise _no_backend(f"register_{kind}_hook", target)
    raise Site.of(kind, backend, target, options.get("name")).error(
        UnsupportedHookError,
        f"a backend that implements {kind} hooks (see unihook.backends())",
        f"backend {backend!r}, which does not",
    )


def _no_backend(what: str, obj: object) -> NoBackendError:
    installed = [info for info in backends() if info.installed]
    listing = ", ".join(f"{i.name} ({i.framework} {i.version})" for i in installed) or "none"
    return NoBackendError(
        f"{what}: expected a module or tensor of an installed backend ({listing}). "
        f"Received: {type_name(obj)} {_short(obj)}."
    )


def _short(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception as error:  # noqa: BLE001 (the error about the value must not fail)
        text = f"<{type_name(obj)}: repr raised {type_name(error)}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _site(kind: str, target: object, name: str | None) -> Site:
    """Where a hook would sit, for errors raised before a backend took it."""
    backend = plugin_manager().hook.unihook_backend_of(obj=target)
    return Site.of(kind, backend or "none", target, name)


def _callable(kind: str, target: object, name: str | None, hook: Hook) -> Hook:
    if not callable(hook):
        # torch and paddle accept it and raise TypeError at the first call: raise it now
        site = _site(kind, target, name)
        raise HookArgumentError(f"{site}: `hook` must be callable. Received: hook={_short(hook)}.")
    return hook


def _guarded(kind: str, module: object, name: str | None, hook: Hook, when: When) -> Hook:
    """`hook` itself, or a wrapper running it only while `when` holds for the module.

    "train" and "eval" cost one attribute check per call; a callable costs one call.
    """
    _callable(kind, module, name, hook)
    if when is None:
        return hook
    if when == "train":

        def guarded(module: Any, *rest: Any) -> Any:
            return hook(module, *rest) if module.training else None

    elif when == "eval":

        def guarded(module: Any, *rest: Any) -> Any:
            return None if module.training else hook(module, *rest)

    elif callable(when):
        test = when

        def guarded(module: Any, *rest: Any) -> Any:
            return hook(module, *rest) if test(module) else None

    else:
        raise HookArgumentError(
            f"{_site(kind, module, name)}: `when` must be one of {{None, 'train', 'eval'}} or a "
            f"callable(module) -> bool. Received: when={_short(when)}."
        )
    guarded.__wrapped__ = hook  # type: ignore[attr-defined]
    return guarded
