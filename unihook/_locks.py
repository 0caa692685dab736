"""The lock that guards a registry of hooks."""

from __future__ import annotations

import threading
from typing import Callable

from .errors import BackendStateError

__all__ = ["RegistryLock"]


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

    def __enter__(self) -> None:
        if self._owner == threading.get_ident():  # (only this thread sets its own id)
            raise BackendStateError(
                "unihook cannot register a hook while it is registering or removing one on "
                "the same thread: this registration came from code that ran inside that one "
                "(a finalizer the garbage collector ran there, or a hook it called) and would "
                "wait for itself for ever. Register from outside it (after the outer call "
                "returns)."
            )
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
