"""The neutral per-object API: resolve the backend once, at registration, through pluggy."""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any, Callable, Literal, overload

from ._describe import Site, type_name
from ._locks import Collecting, held_here, inside_registration, registering, undo
from ._plugins import (
    DISABLE_ENV,
    call_owner,
    disabled_backends,
    outside_compilers,
    plugin_manager,
)
from ._prepended import forget_prepended, keys_of, note_prepended
from .errors import HookArgumentError, NoBackendError, UnsupportedHookError
from .handles import Handle
from .hooktypes import (
    BackwardHook,
    BackwardPreHook,
    ForwardHook,
    ForwardHookWithKwargs,
    ForwardPreHook,
    ForwardPreHookWithKwargs,
    TensorHook,
    When,
)
from .info import BackendInfo
from .kinds import KIND_INFO, HookKind

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

#: A hook of any kind, as the backends receive it (the public functions take the Protocols).
Hook = Callable[..., Any]


def backends() -> list[BackendInfo]:
    """Every registered backend: name, framework version (None when not installed), and per
    hook kind whether it is native, emulated or unsupported (every kind is unsupported when
    the framework is not installed)."""
    # (called inside a compiled function: the installed packages are read outside it)
    return outside_compilers("backends", _backends)


def _backends() -> list[BackendInfo]:
    infos: list[BackendInfo] = plugin_manager().hook.unihook_backend_info()
    # A backend declares its kinds whether or not its framework is there: without the
    # framework it runs none of them.
    infos = [i if i.installed else i._replace(kinds=MappingProxyType({})) for i in infos]
    return sorted(infos, key=lambda info: info.name)


def backend_of(obj: object) -> str:
    """The name of the backend that owns `obj` ("torch", "paddle", ...)."""
    name: str | None = plugin_manager().hook.unihook_backend_of(obj=obj)
    if name is None:
        raise _no_backend("backend_of", obj)
    return name


# The overloads tie the hook's signature to `with_kwargs`, so a type checker flags a hook of
# the wrong arity (a `with_kwargs` known only at run time needs a hook that fits both).
@overload
def register_forward_pre_hook(
    module: Any,
    hook: ForwardPreHook,
    *,
    prepend: bool = ...,
    with_kwargs: Literal[False] = ...,
    when: When = ...,
    name: str | None = ...,
) -> Handle: ...
@overload
def register_forward_pre_hook(
    module: Any,
    hook: ForwardPreHookWithKwargs,
    *,
    prepend: bool = ...,
    with_kwargs: Literal[True],
    when: When = ...,
    name: str | None = ...,
) -> Handle: ...
def register_forward_pre_hook(
    module: Any,
    hook: ForwardPreHook | ForwardPreHookWithKwargs,
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


@overload
def register_forward_hook(
    module: Any,
    hook: ForwardHook,
    *,
    prepend: bool = ...,
    with_kwargs: Literal[False] = ...,
    always_call: bool = ...,
    when: When = ...,
    name: str | None = ...,
) -> Handle: ...
@overload
def register_forward_hook(
    module: Any,
    hook: ForwardHookWithKwargs,
    *,
    prepend: bool = ...,
    with_kwargs: Literal[True],
    always_call: bool = ...,
    when: When = ...,
    name: str | None = ...,
) -> Handle: ...
def register_forward_hook(
    module: Any,
    hook: ForwardHook | ForwardHookWithKwargs,
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


def register_tensor_hook(tensor: Any, hook: TensorHook, *, name: str | None = None) -> Handle:
    """Run ``hook(grad)`` when the gradient of `tensor` is computed; a returned tensor (same
    shape and dtype) replaces the gradient."""
    return _register("tensor", tensor, hook=_callable("tensor", tensor, name, hook), name=name)


def register_full_backward_pre_hook(
    module: Any,
    hook: BackwardPreHook,
    *,
    prepend: bool = False,
    when: When = None,
    name: str | None = None,
) -> Handle:
    """Run ``hook(module, grad_output)`` once per module call when the gradient reaches the
    module's outputs; a returned tuple (same length) replaces grad_output."""
    guarded = _guarded("full_backward_pre", module, name, hook, when)
    return _register("full_backward_pre", module, hook=guarded, prepend=prepend, name=name)


def register_full_backward_hook(
    module: Any,
    hook: BackwardHook,
    *,
    prepend: bool = False,
    when: When = None,
    name: str | None = None,
) -> Handle:
    """Run ``hook(module, grad_input, grad_output)`` once per module call after every input
    gradient exists; a returned tuple (one slot per positional argument) replaces grad_input."""
    guarded = _guarded("full_backward", module, name, hook, when)
    return _register("full_backward", module, hook=guarded, prepend=prepend, name=name)


def _register(kind: HookKind, target: object, **options: Any) -> Handle:
    flag = not_a_flag(options)
    if flag:
        raise HookArgumentError(f"{_site(kind, target, options.get('name'))}: {flag}")
    if held_here():  # (a finalizer run inside a registration: refused before any change)
        backend = plugin_manager().hook.unihook_backend_of(obj=target) or "none"
        raise inside_registration(Site.of(kind, backend, target, options.get("name")))
    # The backend records how to undo each step before making it: undone unless the handle
    # is returned (a Ctrl-C anywhere before the return; the public function returns what this
    # one returns, with no point between where a Ctrl-C can land). See unihook._locks.
    steps: list[Callable[[], object]] = []
    outer = getattr(registering, "steps", None)
    # (a forward hook going first: which key it got, for the recipes' places; see _prepended)
    at = _AT.get(kind) if options.get("prepend") else None
    try:
        before = None if at is None else keys_of(target, at)
        registering.steps = steps
        handle: Handle | None = call_owner(
            f"unihook_register_{kind}_hook",
            target,
            **{KIND_INFO[kind].target: target},  # the hookspec's "module" or "tensor" argument
            **options,
        )
        if handle is None:
            raise _not_taken(kind, target, options.get("name"))
        if before is not None and at is not None:
            noted: list[Any] = []
            forget = functools.partial(forget_prepended, noted)
            steps.append(forget)  # (before the notes: a Ctrl-C in between leaves none)
            note_prepended(target, at, before, noted, options.get("hook"))
            if noted:  # removing the hook forgets them
                handle = Handle(handle.backend, handle.kind, _then(handle.remove, forget))
        registering.steps = outer
        if isinstance(outer, Collecting):  # (undone with attach's, if that one is)
            outer.append(handle.remove)
        return handle
    except BaseException as error:
        registering.steps = outer
        undo(steps, error)
        raise


def _then(remove: Callable[[], object], forget: Callable[[], object]) -> Callable[[], None]:
    def remover() -> None:  # (both idempotent: a second run after a Ctrl-C finishes it)
        remove()
        forget()

    return remover


# the forward hook dicts' index in `unihook.ops.forward_hook_dicts` by kind
_AT = {"forward_pre": 0, "forward": 1}


def _not_taken(kind: HookKind, target: object, name: str | None) -> Exception:
    """No backend took the hook: the error saying why."""
    backend = plugin_manager().hook.unihook_backend_of(obj=target)
    if backend is None:
        return _no_backend(f"register_{kind}_hook", target)
    return Site.of(kind, backend, target, name).error(
        UnsupportedHookError,
        f"a backend that implements {kind} hooks (see unihook.backends())",
        f"backend {backend!r}, which does not",
    )


def _no_backend(what: str, obj: object) -> NoBackendError:
    infos = backends()
    installed = [info for info in infos if info.installed]
    listing = ", ".join(f"{i.name} ({i.framework} {i.version})" for i in installed) or "none"
    return NoBackendError(
        f"{what}: expected a module or tensor of an installed backend ({listing}). "
        f"Received: {type_name(obj)} {_short(obj)}.{_no_backend_hint(infos)}"
    )


def _no_backend_hint(infos: list[BackendInfo]) -> str:
    """What to do about a missing backend (`infos`: unihook.backends()): the backends
    UNIHOOK_DISABLE leaves out, and how to install a framework when none is."""
    hint = ""
    disabled = disabled_backends()
    if disabled:
        hint += f" Disabled by {DISABLE_ENV}={','.join(disabled)}: unset it to use them."
    missing = [info.framework for info in infos if not info.installed]
    if missing and not any(info.installed for info in infos):
        hint += (
            f" No framework is installed ({', '.join(missing)}): pip install 'unihook[torch]', "
            "'unihook[paddle]' or 'unihook[mindspore]', or your own build of the framework "
            "(e.g. a CUDA one)."
        )
    return hint


def _short(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception as error:  # noqa: BLE001 (the error about the value must not fail)
        text = f"<{type_name(obj)}: repr raised {type_name(error)}>"
    return text if len(text) <= 60 else text[:57] + "..."


def not_a_flag(options: dict[str, Any]) -> str:
    """What is wrong with the first of `options`' flags (prepend, with_kwargs, always_call)
    that is neither a bool nor 0 or 1, or "". torch takes any value, by its truth: a
    ``prepend="no"`` went first, a ``with_kwargs="no"`` called the hook with the kwargs."""
    for key in _FLAGS:
        value = options.get(key, False)
        if not (isinstance(value, bool) or (type(value) is int and value in (0, 1))):
            return f"`{key}` must be a bool. Received: {key}={_short(value)}."
    return ""


_FLAGS = ("prepend", "with_kwargs", "always_call")


def _site(kind: str, target: object, name: str | None) -> Site:
    """Where a hook would sit, for errors raised before a backend took it."""
    backend = plugin_manager().hook.unihook_backend_of(obj=target)
    return Site.of(kind, backend or "none", target, name)


def _callable(kind: str, target: object, name: str | None, hook: object) -> Hook:
    if not callable(hook):
        # torch and paddle accept it and raise TypeError at the first call: raise it now
        site = _site(kind, target, name)
        raise HookArgumentError(f"{site}: `hook` must be callable. Received: hook={_short(hook)}.")
    return hook


def _guarded(kind: str, module: object, name: str | None, hook: object, when: When) -> Hook:
    """`hook` itself, or a wrapper running it only while `when` holds for the module.

    "train" and "eval" cost one attribute check per call; a callable costs one call. The
    wrapper is a partial of a module-level function: a module carrying it pickles
    (``torch.save(model)``) where `hook` does (a closure did not).
    """
    checked = _callable(kind, module, name, hook)
    if when is None:
        return checked
    if when == "train":
        guarded = functools.partial(_in_training, checked)
    elif when == "eval":
        guarded = functools.partial(_in_evaluation, checked)
    elif callable(when):
        guarded = functools.partial(_while, when, checked)
    else:
        raise HookArgumentError(
            f"{_site(kind, module, name)}: `when` must be one of {{None, 'train', 'eval'}} or a "
            f"callable(module) -> bool. Received: when={_short(when)}."
        )
    guarded.__wrapped__ = checked  # type: ignore[attr-defined]
    return guarded


def _in_training(hook: Hook, module: Any, *rest: Any) -> Any:
    return hook(module, *rest) if module.training else None


def _in_evaluation(hook: Hook, module: Any, *rest: Any) -> Any:
    return None if module.training else hook(module, *rest)


def _while(test: Callable[[Any], bool], hook: Hook, module: Any, *rest: Any) -> Any:
    return hook(module, *rest) if test(module) else None
