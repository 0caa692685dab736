"""`unihook.backend.RegistryLock`: removals a thread's finalizers ask for while it holds the
lock wait until it lets go, then run."""

from __future__ import annotations

import sys

from unihook.backend import RegistryLock


def test_many_deferred_removals_run_one_after_another() -> None:
    """helper-158's FINDING 4: each deferred removal takes the lock again, and its own exit ran
    the rest, nested: hundreds of finalizers' removals at once (handles dropped in cycles)
    overflowed the stack with RecursionError."""
    lock = RegistryLock()
    ran: list[int] = []

    def removal(k: int) -> None:
        with lock, lock.mutex:
            ran.append(k)

    n = sys.getrecursionlimit() + 100
    with lock, lock.mutex:
        for k in range(n):
            assert lock.deferred(lambda k=k: removal(k))
        assert ran == []
    assert ran == list(range(n))
    assert not lock.deferred(lambda: None)  # (let go: nothing waits now)


def test_a_removal_deferred_by_a_deferred_removal_runs_too() -> None:
    lock = RegistryLock()
    ran: list[str] = []

    def inner() -> None:
        with lock, lock.mutex:
            ran.append("inner")

    def outer() -> None:
        with lock, lock.mutex:
            ran.append("outer")
            assert lock.deferred(inner)  # (a finalizer the collector ran in it)

    with lock, lock.mutex:
        assert lock.deferred(outer)
    assert ran == ["outer", "inner"]
