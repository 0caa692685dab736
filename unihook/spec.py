"""The backend-neutral hook spec: what a backend plugin implements.

A backend is a pluggy plugin registered under the ``unihook`` entry-point group. Its
registration hooks are *firstresult*: each backend returns a :class:`~unihook.Handle` when it
owns the target object and None otherwise, and the first non-None result wins. Ownership is
decided by type, looking the framework up in ``sys.modules`` (an object of a framework that was
never imported cannot exist): a backend never imports its framework to answer.

A backend that owns an object but cannot take the hook (a tensor passed where a module is
expected, a tensor that needs no gradient) raises :class:`~unihook.HookTargetError`.

Hook signatures and return rules are PyTorch's documented ones:

- forward pre-hook ``hook(module, args) -> None | new args`` (a non-tuple is wrapped into a
  1-tuple); with ``with_kwargs``: ``hook(module, args, kwargs) -> None | (args, kwargs)``.
- forward hook ``hook(module, args, output) -> None | new output``; with ``with_kwargs``:
  ``hook(module, args, kwargs, output)``; ``always_call`` runs it even when forward raised.
- tensor hook ``hook(grad) -> None | new grad`` (same shape and dtype).
- full backward pre-hook ``hook(module, grad_output) -> None | new grad_output``.
- full backward hook ``hook(module, grad_input, grad_output) -> None | new grad_input``.

`name` is the module's qualified name when the caller knows it (for error messages), else None.
The hot path never goes through pluggy: a backend installs native hooks, or one thin wrapper, at
registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from .handles import Handle
    from .info import BackendInfo
    from .ops import Ops

hookspec: pluggy.HookspecMarker = pluggy.HookspecMarker("unihook")
hookimpl: pluggy.HookimplMarker = pluggy.HookimplMarker("unihook")

Hook = Callable[..., Any]


@hookspec
def unihook_backend_info() -> BackendInfo:
    """Describe this backend: its name, framework, the framework's installed version (None when
    it is not installed) and, per hook kind, whether it is native, emulated or unsupported.
    Must not import the framework."""
    ...  # a hookspec has no body; `...` tells type checkers so


@hookspec(firstresult=True)
def unihook_backend_of(obj: object) -> str | None:
    """Return this backend's name if `obj` is a module or tensor of its framework, else None;
    stops at first non-None result."""


@hookspec
def unihook_conformance_kit() -> object | None:
    """Return this backend's conformance kit (``unihook.testing.Kit``) when its framework is
    installed, else None. Imports the framework: only the test suites and the benchmarks call
    it."""


@hookspec(firstresult=True)
def unihook_register_forward_pre_hook(
    module: object, hook: Hook, prepend: bool, with_kwargs: bool, name: str | None
) -> Handle | None:
    """Install `hook` to run before `module.forward`; return a Handle if this backend owns
    `module`, else None; stops at first non-None result."""


@hookspec(firstresult=True)
def unihook_register_forward_hook(
    module: object,
    hook: Hook,
    prepend: bool,
    with_kwargs: bool,
    always_call: bool,
    name: str | None,
) -> Handle | None:
    """Install `hook` to run after `module.forward`; return a Handle if this backend owns
    `module`, else None; stops at first non-None result."""


@hookspec(firstresult=True)
def unihook_register_tensor_hook(tensor: object, hook: Hook, name: str | None) -> Handle | None:
    """Install `hook` on the gradient of `tensor`; return a Handle if this backend owns
    `tensor`, else None; stops at first non-None result. A returned value of another shape or
    dtype, or not a tensor, raises HookReturnError; an exception the hook raises surfaces from
    backward with its own type."""


@hookspec(firstresult=True)
def unihook_register_full_backward_pre_hook(
    module: object, hook: Hook, prepend: bool, name: str | None
) -> Handle | None:
    """Install `hook` to run with the module's grad_output once per module call, before the
    gradient flows into the module; return a Handle if this backend owns `module`, else None;
    stops at first non-None result."""


@hookspec(firstresult=True)
def unihook_register_full_backward_hook(
    module: object, hook: Hook, prepend: bool, name: str | None
) -> Handle | None:
    """Install `hook` to run with the module's grad_input and grad_output once per module call,
    after all input gradients exist; return a Handle if this backend owns `module`, else None;
    stops at first non-None result."""


@hookspec
def unihook_register_global_hook(
    kind: str, hook: Hook, with_kwargs: bool, always_call: bool, backend: str | None
) -> Handle | None:
    """Install a process-wide hook for every module of this backend, modules created later
    included, running before each module's own hooks of the same kind; called on every
    backend. Return a Handle, or None when `backend` names another backend.

    `kind` is one of "forward_pre", "forward", "full_backward_pre", "full_backward" (with the
    per-module kinds' signatures and return rules, ``with_kwargs``/``always_call`` as there),
    or "parameter_registration", "buffer_registration", "module_registration":
    ``hook(module, name, value) -> None | replacement``, fired on every registration path.
    If the framework is not imported yet, install when it is: never import it.
    """


@hookspec(firstresult=True)
def unihook_ops(obj: object) -> Ops | None:
    """Return this backend's neutral ops (``unihook.ops.Ops``) if it owns `obj` (a tensor or a
    module), else None; stops at first non-None result. Called once per type: cached."""
