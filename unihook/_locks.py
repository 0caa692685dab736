"""The lock that guards a registry of hooks."""

from __future__ import annotations

import threading
from typing import Callable

from .errors import BackendStateError

__all__ = ["RegistryLock", "held_here", "inside_registration"]

_locks: list[RegistryLock] = []  # every one (a handful, module-level): see `held_here`


class RegistryLock:
    """Guards a registry. A change asked for by the thread that holds it (a dropped object's
    finalizer removing its hook, run by the garbage collector inside a registration) waits
    until it lets go: neither a deadlock nor a change in the middle of another. A
    registration asked for by that thread (a finalizer registering a hook) cannot wait for
    itself: it raises instead of deadlocking."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._deferred: list[Callable[[], None]] = []
        _locks.append(self)

    def __enter__(self) -> None:
        if self._owner == threading.get_ident():  # (only this thread sets its own id)
            # a backstop: the registration functions refuse before changing anything
            raise BackendStateError(_INSIDE.format(what="change its hooks"))
        self._lock.acquire()
        self._owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        deferred, self._deferred = self._deferred, []
        self._owner = None
        self._lock.release()
        for remove in deferred:
            remove()

    def deferred(self, remove: Callable[[], None]) -> bool:
        """Whether this thread holds the lock: then `remove` runs once it lets go (a caller
        that gets True returns at once)."""
        if self._owner != threading.get_ident():
            return False
        self._deferred.append(remove)
        return True


_INSIDE = (
    "unihook cannot {what} while it is registering or removing a hook on the same thread: "
    "this call came from code that ran inside that one (a finalizer the garbage collector "
    "ran there) and would wait for itself for ever. Make it from outside (after the outer "
    "call returns)."
)


def held_here() -> bool:
    """Whether this thread is inside one of unihook's registrations or removals (a finalizer
    the collector ran there): registering then would wait for the lock this thread holds,
    and a refusal halfway would leave a partial registration behind, so the registration
    functions refuse before anything changes (`inside_registration`)."""
    # (no thread id unless some lock is held: a registration inside a compiled forward stays
    # traceable, where dynamo breaks its graph at `get_ident`)
    owners = [lock._owner for lock in _locks if lock._owner is not None]
    return bool(owners) and threading.get_ident() in owners


def inside_registration(site: object) -> BackendStateError:
    """The error a registration made where `held_here()` raises."""
    return BackendStateError(f"{site}: " + _INSIDE.format(what="register a hook"))
