"""unihook backend for PyTorch: native hooks wherever torch's own semantics are the spec.

Claims an object only when ``torch`` is already in ``sys.modules`` and the object is a
``torch.nn.Module`` or ``torch.Tensor``; torch is never imported here at module level.
"""

from __future__ import annotations

import sys
import warnings
from functools import partial
from typing import Any, Callable

from unihook.backend import (
    Site,
    add_compiler_escape,
    add_compiler_pause,
    check_grad,
    checked_kwargs_pre_hook,
    defer_while_locked,
    global_label,
    imported,
    install_when_imported,
    kwargs_post_hook,
    type_name,
    undo_if_unfinished,
)
from unihook.errors import NoGradError, TargetKindError
from unihook.handles import Handle
from unihook.info import BackendInfo, installed_version, older_than
from unihook.spec import hookimpl

NAME = "torch"
#: The lowest torch the whole suite has passed on: pyproject.toml's ``torch>=`` bound (a test
#: checks that they agree). Older torch gets a warning, not an error: 2.8 passed all but the
#: torch.compile tests and one thread test (README "Supported versions").
MIN_VERSION = "2.13"
_version_checked = False


def _torch() -> Any:
    # (kept once seen: a claim that dynamo traces (a hook made inside a compiled function)
    # reads ``sys.modules`` once less, which dynamo iterates to wrap it: another thread's
    # import meanwhile failed the compiled call, helper-98's FINDING 5, still open)
    if not _seen:
        torch = imported("torch")  # (another thread importing it: not yet, helper-102's F10)
        if torch is None:
            return None
        _seen.append(torch)
    return _seen[0]


_seen: list[Any] = []


def _owns(obj: object) -> bool:
    torch = _torch()
    if torch is None or not isinstance(obj, (torch.nn.Module, torch.Tensor)):
        return False
    if not _version_checked:
        _check_version(str(getattr(torch, "__version__", "")))
    return True


def _outside_compiler(call: Callable[[], Any], doing: str) -> Any:
    """torch.compile: a global hook registered inside a compiled forward is registered outside
    dynamo (see `add_compiler_escape`; dynamo folds `importlib.metadata.version` at trace
    time, and fails on a package that is not installed), and so is a hook removed there, or
    `unihook.backends()` called there."""
    from ._compile import outside_compiler

    return outside_compiler(call, doing)


def _dynamo_tracing() -> bool:
    """Whether dynamo traces now (without torch nothing compiles)."""
    torch = _torch()
    return torch is not None and torch.compiler.is_dynamo_compiling()


def _pause_dynamo() -> Callable[[], object] | None:
    """Dynamo's frame callback off on this thread (while it holds a registry lock, see
    `add_compiler_pause`): on a thread running a compiled call, the callback looks at each
    frame it has not seen (after a reset, every one) under dynamo's compile lock, which a
    global hook coming or going holds while it waits for a registry lock (a deadlock: CI on
    2bc407d, tests/test_attack_h68.py)."""
    if "torch._dynamo" not in sys.modules:
        return None  # (no callback is set before dynamo is imported)
    from torch._C._dynamo.eval_frame import set_eval_frame

    prior = set_eval_frame(None)
    return None if prior is None else partial(set_eval_frame, prior)


add_compiler_escape(_outside_compiler, _dynamo_tracing)
add_compiler_pause(_pause_dynamo)


def _check_version(installed: str) -> None:
    """Warn once, when torch first owns an object, if it is older than MIN_VERSION."""
    global _version_checked
    _version_checked = True
    # a source build may say 0.0.0 or 0+unknown: let it through
    if older_than(installed, MIN_VERSION):
        warnings.warn(
            f"unihook's torch backend expects torch>={MIN_VERSION}, the lowest version its "
            f"tests pass on. Received: torch {installed}. Hooks may fail inside torch "
            f"(torch.compile support needs {MIN_VERSION}): upgrade torch (your CUDA build of "
            f"it, or pip install 'torch>={MIN_VERSION}').",
            RuntimeWarning,
            stacklevel=2,
        )


def _module(obj: object, kind: str, name: str | None) -> Any:
    """`obj` if it is a torch module; None if torch does not own it; raises for a torch
    object that is not a module."""
    if not _owns(obj):
        return None
    if not isinstance(obj, _torch().nn.Module):
        raise Site.of(kind, NAME, obj, name).error(
            TargetKindError, "a torch.nn.Module", type_name(obj)
        )
    return obj


def _watched(kind: str, register: Callable[[], Callable[[], object]]) -> Handle:
    """The handle of a module hook, which `register` puts in (it returns the removal): while
    it lives, dynamo guards on hook dicts (torch.compile: a hook added after compiling
    recompiles). It goes in and out while no other thread is in one of dynamo's live loops
    over a module's hook dicts, where a change failed the compiled call: see
    `_compile.hooks_changeable`. Made inside a compiled function, it is made outside dynamo,
    with a graph break (under fullgraph=True, the error says why), as a global hook is."""
    if _dynamo_tracing():
        return _outside_compiler(partial(_watched, kind, register), "module_registration")
    from ._compile import hooks_changeable, watch_hooks

    with hooks_changeable():
        remove = register()
    release = watch_hooks()

    def remover() -> None:
        with hooks_changeable():
            remove()
        release()

    return Handle(NAME, kind, remover)


@hookimpl
def unihook_backend_info() -> BackendInfo:
    return BackendInfo(
        NAME,
        "torch",
        installed_version("torch"),
        {
            "forward_pre": "native",
            "forward": "native",
            "tensor": "native",
            # torch's own BackwardHook raises on in-place ops after the module (pytorch 61519):
            # unihook runs its own, in-place safe, implementation of the same semantics.
            "full_backward_pre": "emulated",
            "full_backward": "emulated",
            # torch cannot pass kwargs to a global pre-hook: run through a Module wrapper.
            "module_forward_pre": "emulated",
            "module_forward": "native",
            "module_full_backward_pre": "emulated",
            "module_full_backward": "emulated",
            "parameter_registration": "native",
            "buffer_registration": "native",
            "module_registration": "native",
        },
    )


@hookimpl
def unihook_backend_of(obj: object) -> str | None:
    return NAME if _owns(obj) else None


@hookimpl
def unihook_conformance_kit() -> object | None:
    if installed_version("torch") is None:
        return None
    from .testkit import TorchKit

    return TorchKit()


@hookimpl
def unihook_register_forward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, with_kwargs: bool, name: str | None
) -> Handle | None:
    m = _module(module, "forward_pre", name)
    if m is None:
        return None
    if not with_kwargs:
        return _watched(
            "forward_pre", lambda: _insert(m, "forward_pre", hook, prepend=prepend).remove
        )
    # torch raises a bare RuntimeError for a bad (args, kwargs) return: check it ourselves.
    checked = checked_kwargs_pre_hook(hook, Site.of("forward_pre", NAME, m, name))
    return _watched(
        "forward_pre",
        lambda: _insert(m, "forward_pre", checked, prepend=prepend, with_kwargs=True).remove,
    )


@hookimpl
def unihook_register_forward_hook(
    module: object,
    hook: Callable[..., Any],
    prepend: bool,
    with_kwargs: bool,
    always_call: bool,
    name: str | None,
) -> Handle | None:
    m = _module(module, "forward", name)
    if m is None:
        return None
    # Removed mid-call, torch would call it without kwargs (a TypeError): see kwargs_post_hook.
    called = kwargs_post_hook(hook) if with_kwargs else hook
    return _watched(
        "forward",
        lambda: (
            _insert(
                m,
                "forward",
                called,
                prepend=prepend,
                with_kwargs=with_kwargs,
                always_call=always_call,
            ).remove
        ),
    )


# kind -> torch's registration method, the hook dict and the flag tables it fills (torch 2.13's
# `Module.register_forward_pre_hook` and `register_forward_hook`)
_TABLES = {
    "forward_pre": (
        "register_forward_pre_hook",
        "_forward_pre_hooks",
        ("_forward_pre_hooks_with_kwargs",),
    ),
    "forward": (
        "register_forward_hook",
        "_forward_hooks",
        ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
    ),
}
_own_methods: dict[str, Any] = {}  # kind -> torch.nn.Module's registration method


def _insert(
    m: Any,
    kind: str,
    hook: Callable[..., Any],
    *,
    prepend: bool,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> Any:
    """torch's own registration of a forward (pre-)hook, its removal recorded before the hook
    goes in: undone if the registration is cut short (a Ctrl-C, see unihook._locks), which
    torch's method would leave registered with no handle. A module class that has a method of
    its own is left to it."""
    method, hooks, tables = _TABLES[kind]
    own = _own_methods.get(kind)
    if own is None:
        own = _own_methods[kind] = getattr(_torch().nn.Module, method)
    state = m.__dict__
    if getattr(type(m), method) is not own:
        _past_loaded([state.get(table) for table in (hooks, *tables)])
        options = {"always_call": always_call} if kind == "forward" else {}
        return getattr(m, method)(hook, prepend=prepend, with_kwargs=with_kwargs, **options)
    flags = list(zip([state[table] for table in tables], (with_kwargs, always_call)))
    return insert(state[hooks], hook, flags, prepend=prepend)


def _past_loaded(tables: list[Any]) -> None:
    """torch's handle counter past the keys of a module's hook `tables` when it would draw
    one of them: a module loaded from another process's pickle brings that process's ids,
    which this process's counter draws again, and torch's registration then replaces the
    loaded hook silently (unihook.backend.new_key does the same for the dispatchers)."""
    from torch.utils.hooks import RemovableHandle

    from ._backward import reserve_ids

    present = [table for table in tables if table]
    if any(RemovableHandle.next_id in table for table in present):
        reserve_ids(max(k for table in present for k in list(table) if type(k) is int))


def insert(
    hooks: Any, hook: Callable[..., Any], flags: list[tuple[Any, bool]], *, prepend: bool = False
) -> Any:
    """What torch's registration functions do (a ``RemovableHandle`` that also removes the
    key from the flag tables, the hook under its id, True in the tables of the flags set,
    first with `prepend`), the handle's removal recorded first (`undo_if_unfinished`)."""
    from torch.utils.hooks import RemovableHandle

    _past_loaded([hooks, *(table for table, _ in flags)])
    native = RemovableHandle(hooks, extra_dict=[table for table, _ in flags])
    undo_if_unfinished(native.remove)
    hooks[native.id] = hook
    for table, on in flags:
        if on:
            table[native.id] = True
    if prepend:
        hooks.move_to_end(native.id, last=False)
    return native


@hookimpl
def unihook_register_tensor_hook(
    tensor: Any, hook: Callable[..., Any], name: str | None
) -> Handle | None:
    if not _owns(tensor):
        return None
    torch = _torch()
    site = Site.of("tensor", NAME, tensor, name)
    if not isinstance(tensor, torch.Tensor):
        raise site.error(TargetKindError, "a torch.Tensor", type_name(tensor))
    if not tensor.requires_grad:
        raise site.error(
            NoGradError, "a tensor that requires grad", "a tensor with requires_grad=False"
        )
    is_tensor = torch.is_tensor

    def tensor_hook(grad: Any) -> Any:
        # torch checks shape and dtype too, but with bare RuntimeError/TypeError.
        return check_grad(hook(grad), grad, is_tensor, site)

    # (torch's registration makes the handle inside: a removal recorded before finds the
    # hook by what only it is, this registration's function)
    undo_if_unfinished(partial(_drop_tensor_hook, tensor, tensor_hook))
    native = tensor.register_hook(tensor_hook)
    return Handle(NAME, "tensor", native.remove)


def _drop_tensor_hook(tensor: Any, tensor_hook: Callable[..., Any]) -> None:
    hooks = tensor._backward_hooks
    for key in [key for key, value in (hooks or {}).items() if value is tensor_hook]:
        hooks.pop(key, None)


@hookimpl
def unihook_register_full_backward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    m = _module(module, "full_backward_pre", name)
    if m is None:
        return None
    from ._backward import register

    return _watched(
        "full_backward_pre", lambda: register(m, "full_backward_pre", hook, prepend, name).remove
    )


@hookimpl
def unihook_register_full_backward_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    m = _module(module, "full_backward", name)
    if m is None:
        return None
    from ._backward import register

    return _watched(
        "full_backward", lambda: register(m, "full_backward", hook, prepend, name).remove
    )


@hookimpl
def unihook_register_global_hook(
    kind: str,
    hook: Callable[..., Any],
    with_kwargs: bool,
    always_call: bool,
    backend: str | None,
) -> Handle | None:
    if backend not in (None, NAME) or installed_version("torch") is None:
        return None

    def install() -> Callable[[], None]:
        from ._compile import (
            compiled_frames_out,
            compiles_held,
            forget_compiled,
            watch_call_impl,
            watch_hooks,
        )
        from ._global import add

        # torch.compile: no guard sees a global hook come or go (native or unihook's): the
        # compiled frames are dropped once it came (a frame compiled meanwhile too), and it
        # comes and goes while no frame compiles
        release = watch_hooks()
        cancel = watch_call_impl()
        with compiles_held():
            remove = add(kind, hook, with_kwargs, always_call)
        forget_compiled()

        def remover() -> None:
            # (dynamo's lock is never asked for under a registry lock: see unihook._locks)
            if defer_while_locked(remover):
                return
            with compiled_frames_out():
                # (the compiled frames first: a thread that enters one after it finds it
                # dropped and waits for dynamo's lock, held meanwhile, to compile anew)
                forget_compiled()
                remove()
            cancel()
            release()

        return remover

    return Handle(NAME, global_label(kind), install_when_imported("torch", install))


@hookimpl
def unihook_ops(obj: object) -> object | None:
    if not _owns(obj):
        return None
    from ._ops import TorchOps

    return TorchOps()
