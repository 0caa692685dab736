"""unihook's exception tree.

Every error names the hook kind, the target (qualified name where known, else its type), the
backend, what was expected and what was received. Each also derives from the builtin type that
torch and paddle raise for the same misuse, so code written for either framework still catches it.
"""

from __future__ import annotations

__all__ = [
    "UnihookError",
    "NoBackendError",
    "HookArgumentError",
    "HookTargetError",
    "TargetKindError",
    "NoGradError",
    "HookReturnError",
    "HookReturnTypeError",
    "UnsupportedHookError",
    "TracedHookError",
    "ScriptedHookError",
    "BackendStateError",
    "StaleCaptureError",
    "InPlaceError",
    "DispatchersOnlyError",
]


class UnihookError(Exception):
    """Base class of every error unihook raises itself."""


class NoBackendError(UnihookError, TypeError):
    """No installed backend owns the object (not a module or tensor of a known framework)."""


class HookArgumentError(UnihookError, TypeError, ValueError):
    """An argument of a register function is invalid: a hook that is not callable, an unknown
    `when`, `kind`, `backend`, `where` or option (TypeError or ValueError, as numpy's AxisError)."""


class HookTargetError(UnihookError, TypeError):
    """A backend owns the object, but it cannot take this hook."""


class TargetKindError(HookTargetError, AttributeError):
    """A module hook on a tensor, or a tensor hook on a module (the frameworks: AttributeError)."""


class NoGradError(HookTargetError, RuntimeError):
    """A tensor hook on a tensor that needs no gradient (the frameworks: RuntimeError)."""


class HookReturnError(UnihookError, RuntimeError):
    """A hook returned a value its kind forbids: wrong length, shape or dtype (as torch)."""


class HookReturnTypeError(HookReturnError, TypeError):
    """A hook returned a value of the wrong type: not a tensor, not a tuple (torch: TypeError)."""


class UnsupportedHookError(UnihookError, NotImplementedError):
    """The backend that owns the object does not implement this hook kind."""


class TracedHookError(UnsupportedHookError, ValueError):
    """A module with backward hooks called while a tracer records a graph that runs no Python
    hook (``torch.jit.trace``; torch: ValueError for a module's own backward hooks)."""


class ScriptedHookError(UnsupportedHookError, RuntimeError):
    """A module with unihook hooks compiled by a compiler that runs no Python hook
    (``torch.jit.script``; torch: RuntimeError for a hook it cannot script)."""


class BackendStateError(UnihookError, RuntimeError):
    """The framework is in a state in which the hook cannot run safely (it would crash)."""


class StaleCaptureError(UnihookError, RuntimeError):
    """A captured tensor was modified in place after capture recorded it (see `capture`)."""


class InPlaceError(UnihookError, RuntimeError, ValueError):
    """An in-place op went through a hooked module's alias where unihook cannot give the history
    it has without hooks: a leaf that requires grad changed through the module's output that
    returned it (paddle's error for it: ValueError; torch refuses the op itself at once), two
    arguments sharing memory (`m(x, x)`), one changed in forward; torch: an input the module
    returned unchanged, changed in place before its output was used."""


class DispatchersOnlyError(UnihookError, KeyError):
    """Another's code removing unihook's backward-hook dispatcher from a module's forward hook
    dict (`pop`, `del`, `popitem`): it stays while unihook's backward hooks of the module do."""
