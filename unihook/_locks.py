"""The lock that guards a registry of hooks, and what undoes a registration cut short.

A Ctrl-C (or any exception raised asynchronously: ``PyThreadState_SetAsyncExc``) lands where
CPython checks for one: a Python function's entry, after a call of anything but a Python
function, a backward jump. Two rules keep unihook consistent wherever it lands:

- the registry lock is taken and let go by C code alone (`RegistryLock.mutex`, a
  ``threading.RLock`` entered by the ``with`` statement itself): no point lies between taking
  it and the protected block, or between the end of the block and letting it go;
- a registration records how to undo each step before making it (`undo_if_unfinished`,
  idempotent removers keyed by ids chosen before the step); the public registration function
  that opened the record (`registering`) runs them if it does not return the handle. A removal
  that is cut short finishes (`unihook.handles.Handle.remove`): removers are idempotent, and a
  second run completes what the first left.

A framework whose compiler hooks every Python call on a thread (torch.compile's dynamo: its frame
callback takes dynamo's compile lock to look at a frame it has not seen) would have a thread
holding a registry lock wait for the compiler's lock, while another thread holding that one
(unihook's global hooks come and go while no frame compiles) waits for the registry lock: a
deadlock. So the backend pauses its compiler on a thread while that holds a registry lock
(`add_compiler_pause`): unihook's own bookkeeping runs as it is written.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

from .errors import BackendStateError

__all__ = [
    "Collecting",
    "RegistryLock",
    "add_compiler_pause",
    "defer_while_locked",
    "held_here",
    "inside_registration",
    "undo",
    "undo_if_unfinished",
]

_locks: list[RegistryLock] = []  # every one (a handful, module-level): see `held_here`
_pauses: list[Callable[[], Callable[[], object] | None]] = []  # see `add_compiler_pause`
# per thread: what resumes the compilers paused at each registry lock it entered (innermost last)
_resumes = threading.local()


def add_compiler_pause(pause: Callable[[], Callable[[], object] | None]) -> None:
    """Have `pause()` run as a thread enters any registry lock, and what it returns (if not
    None) as the thread lets go of it: a backend whose framework compiles Python by hooking
    every call on a thread turns that off there (see this module's docstring). Called by a
    backend when it is loaded; once per pause."""
    if all(pause is not known for known in _pauses):
        _pauses.append(pause)


def _pause(lock: RegistryLock) -> None:
    resumes = [r for r in (pause() for pause in _pauses) if r is not None] if _pauses else []
    # (a Ctrl-C landing before the append leaves the compiler off on this thread until the
    # framework puts it back: dynamo does at the end of the compiled call; the code runs as
    # written meanwhile)
    try:
        _resumes.stack.append((lock, resumes))
    except AttributeError:  # (this thread's first lock)
        _resumes.stack = [(lock, resumes)]


def _resume() -> None:
    stack: list[tuple[RegistryLock, list[Callable[[], object]]]] = getattr(_resumes, "stack", [])
    for resume in reversed(stack.pop()[1] if stack else []):
        resume()


def defer_while_locked(action: Callable[[], None]) -> bool:
    """Whether this thread holds a registry lock: then `action` runs once it lets go of the
    outermost one it holds (a caller that gets True returns at once). For a removal that takes
    a lock of the framework's (torch's global hooks take dynamo's compile lock first), asked
    for by a finalizer the garbage collector ran inside a registration or removal: taken there,
    it would be taken under a registry lock, the order that deadlocks (helper-80's FINDING 4)."""
    stack: list[tuple[RegistryLock, list[Callable[[], object]]]] = getattr(_resumes, "stack", [])
    if not stack or not stack[0][0].held():
        return False
    stack[0][0]._deferred.append(action)
    return True


class RegistryLock:
    """Guards a registry; used as ``with lock, lock.mutex:`` (nothing else takes it).

    `mutex` is a C ``threading.RLock``: the ``with`` statement takes and lets go of it in C,
    where a Ctrl-C cannot land half-way (a lock taken in Python code, a ``__enter__`` written in
    Python, could be left held by one landing after the acquire). This object, entered first,
    holds the Python parts: before the mutex, the refusal of a registration from the thread
    that holds it; after it, the removals deferred meanwhile.

    A change asked for by the thread that holds it (a dropped object's finalizer removing its
    hook, run by the garbage collector inside a registration) waits until it lets go: neither
    a deadlock nor a change in the middle of another. A registration asked for by that thread
    (a finalizer registering a hook) cannot wait for itself: it raises instead of deadlocking."""

    __slots__ = ("mutex", "_entered", "_deferred")

    def __init__(self) -> None:
        self.mutex: threading.RLock = threading.RLock()
        # one item per thread inside (entering or holding): a hint that spares `held_here` its
        # C call, which dynamo cannot trace, while no lock is held (list.append and pop: safe
        # beside other threads)
        self._entered: list[None] = []
        self._deferred: list[Callable[[], None]] = []
        _locks.append(self)

    def __enter__(self) -> None:
        if self.mutex._is_owned():  # type: ignore[attr-defined]
            # a backstop: the registration functions refuse before changing anything
            raise BackendStateError(_INSIDE.format(what="change its hooks"))
        _pause(self)
        self._entered.append(None)

    def __exit__(self, *exc: object) -> None:
        # (the mutex is let go by now) a Ctrl-C landing here leaves the deferred removals to
        # the next exit, and the hint set: `held` then asks the mutex
        try:
            self._entered.pop()
        except IndexError:  # (never: each exit follows its entry's append)
            pass
        finally:
            # (also where a Ctrl-C landed on the pop: the stale entry made a later lock's
            # removal be taken under it, the order that deadlocks: helper-160's FINDING 3)
            _resume()
        if self._deferred and self._draining_above():
            return  # (a deferred removal's own exit: the loop below it runs the rest)
        # One loop per thread and lock: each removal's own exit ran the rest, nested, and
        # hundreds of finalizers' removals deferred at once overflowed the stack
        # (RecursionError, helper-158's FINDING 4). Each removal leaves the list once it ran:
        # a Ctrl-C before or inside it leaves it and the rest to the next exit (taken off
        # first, it was lost: helper-160's FINDING 2; run again then, removals are
        # idempotent); one that raises an error leaves the others to run, its error raised
        # after them (FINDING 1).
        error: Exception | None = None
        while True:
            try:
                remove = self._deferred[0]
            except IndexError:  # (none left: another thread may have run the last)
                break
            try:
                remove()
            except Exception as raised:
                if error is None:
                    error = raised
            _forget(self._deferred, remove)
        if error is not None:
            raise error

    def _draining_above(self) -> bool:
        """Whether an exit of this lock further up this thread's stack runs its deferred
        removals (read from the stack: nothing a Ctrl-C could leave set)."""
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code is _EXIT_CODE and frame.f_locals.get("self") is self:
                return True
            frame = frame.f_back
        return False

    def held(self) -> bool:
        """Whether this thread holds the lock."""
        return bool(self._entered) and self.mutex._is_owned()  # type: ignore[attr-defined]

    def deferred(self, remove: Callable[[], None]) -> bool:
        """Whether this thread holds the lock: then `remove` runs once it lets go (a caller
        that gets True returns at once)."""
        if not self.held():
            return False
        self._deferred.append(remove)
        return True


_EXIT_CODE = RegistryLock.__exit__.__code__


def _forget(deferred: list[Callable[[], None]], remove: Callable[[], None]) -> None:
    """Take `remove` out of `deferred` (one C call: another thread may change the list, or
    have taken it out already)."""
    try:
        deferred.remove(remove)
    except ValueError:
        pass


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
    # (no C call unless some lock is entered: a registration inside a compiled forward stays
    # traceable, where dynamo breaks its graph at RLock._is_owned)
    return any(lock._entered and lock.mutex._is_owned() for lock in _locks)  # type: ignore[attr-defined]


def inside_registration(site: object) -> BackendStateError:
    """The error a registration made where `held_here()` raises."""
    return BackendStateError(f"{site}: " + _INSIDE.format(what="register a hook"))


# The removers of the steps the registration running on this thread made so far (`undo`):
# `registering` is the registration functions' protocol, inlined in each (see there).
registering = threading.local()


class Collecting(list[Callable[[], object]]):
    """The record of a registration of several hooks (``attach``): each registration made
    inside it that returns its handle adds the handle's removal, so that the whole is undone
    if it does not return (a Ctrl-C between a registration's return and the group's record of
    its handle)."""


def undo_if_unfinished(remover: Callable[[], object]) -> None:
    """Record `remover`, which undoes the step about to be made, for the registration running
    on this thread: it runs if that registration does not return its handle (a Ctrl-C landed
    in it, or it raised). Call it before the step: `remover` must do nothing for a step not
    made, finish undoing a step made half-way, and may run twice. Outside a registration
    (a step made at a module call, or when a framework gets imported) it does nothing."""
    steps: list[Callable[[], object]] | None = getattr(registering, "steps", None)
    if steps is not None:
        steps.append(remover)


def undo(steps: list[Callable[[], object]], error: BaseException) -> None:
    """A registration did not return its handle (`error` stops it): undo its `steps`, the
    last first. An undo that fails is noted on `error`, which the caller re-raises as it is
    (a KeyboardInterrupt stays one)."""
    for remover in reversed(steps):
        try:
            remover()
        except Exception as failed:  # noqa: BLE001 (the rest still run; `error` goes on)
            note = getattr(error, "add_note", None)  # (Python 3.11)
            if note is not None:
                note(f"unihook could not undo a step of the registration: {failed!r}")
