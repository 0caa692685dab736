"""`unihook.backend.RegistryLock`: removals a thread's finalizers ask for while it holds the
lock wait until it lets go, then run."""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

import pytest

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


def test_a_removal_that_raises_leaves_the_others_to_run() -> None:
    """helper-160's FINDING 1: the first deferred removal raising ended the loop, and the rest
    waited for the next exit of the lock (never, where none came)."""
    lock = RegistryLock()
    ran: list[int] = []

    def removal(k: int) -> None:
        with lock, lock.mutex:
            ran.append(k)
            if k == 0:
                raise ValueError("the first removal's own error")

    with pytest.raises(ValueError, match="the first removal's own error"):
        with lock, lock.mutex:
            for k in range(3):
                lock.deferred(lambda k=k: removal(k))
    assert ran == [0, 1, 2]
    assert not lock._deferred


def _line_of(function: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(k for k, line in enumerate(lines) if text in line)


def _interrupted_at(line: int, action: Callable[[], None]) -> None:
    """`action` with a KeyboardInterrupt at `line` of `RegistryLock.__exit__` (the first time)."""
    code = RegistryLock.__exit__.__code__

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is code and event == "line" and frame.f_lineno == line:
            sys.settrace(None)
            raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        with pytest.raises(KeyboardInterrupt):
            action()
    finally:
        sys.settrace(None)


def test_a_ctrl_c_before_a_deferred_removal_runs_leaves_it_for_the_next_exit() -> None:
    """helper-160's FINDING 2: a removal taken off the list and not yet run was lost."""
    lock = RegistryLock()
    ran: list[str] = []

    def defer() -> None:
        with lock, lock.mutex:
            lock.deferred(lambda: ran.append("removed"))

    _interrupted_at(_line_of(RegistryLock.__exit__, "remove()"), defer)
    assert ran == []
    with lock, lock.mutex:
        pass
    assert ran == ["removed"]


def test_a_ctrl_c_on_the_exits_first_line_leaves_no_stale_hold() -> None:
    """helper-160's FINDING 3: the thread's list of held locks kept the lock, and a removal
    a finalizer asked for under another lock later was not deferred (taken under it)."""
    from unihook import _locks

    lock, other = RegistryLock(), RegistryLock()

    def hold() -> None:
        with lock, lock.mutex:
            pass

    _interrupted_at(_line_of(RegistryLock.__exit__, "self._entered.pop()"), hold)
    assert not getattr(_locks._resumes, "stack", [])
    ran: list[str] = []
    with other, other.mutex:
        assert _locks.defer_while_locked(lambda: ran.append("deferred"))
        assert ran == []
    assert ran == ["deferred"]
