"""unihook's exception tree.

Every error names the hook kind, the target (qualified name where known, else its type), the
backend, what was expected and what was received.
"""

from __future__ import annotations

__all__ = [
    "UnihookError",
    "NoBackendError",
    "HookTargetError",
    "HookReturnError",
    "UnsupportedHookError",
    "BackendStateError",
    "StaleCaptureError",
]


class UnihookError(Exception):
    """Base class of every error unihook raises itself."""


class NoBackendError(UnihookError, TypeError):
    """No installed backend owns the object (not a module or tensor of a known framework)."""


class HookTargetError(UnihookError, TypeError):
    """A backend owns the object, but it cannot take this hook (a tensor where a module is
    expected, a tensor that needs no gradient, ...)."""


class HookReturnError(UnihookError, RuntimeError):
    """A hook returned a value that the spec forbids for its kind."""


class UnsupportedHookError(UnihookError, NotImplementedError):
    """The backend that owns the object does not implement this hook kind."""


class BackendStateError(UnihookError, RuntimeError):
    """The framework is in a state in which the hook cannot run safely (it would crash)."""


class StaleCaptureError(UnihookError, RuntimeError):
    """A captured tensor was modified in place after capture recorded it (see `capture`)."""
