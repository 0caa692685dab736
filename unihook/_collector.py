"""The garbage collector paused across threads: `collector_paused`.

Each pause used to read ``gc.isenabled()``, disable the collector, and enable it on leaving if
it had been enabled. Two threads interleaving (one reads "enabled", disables; the other reads
"disabled"; the first enables and leaves; the second disables) left the collector off for the
rest of the process: an every=2 recipe's places beside another thread registering hooks with
dynamo imported (2 of 4 runs of 5 s; the dev suite then failed 616 tests, 2026-12-05). Now the
pauses are counted: the first one in disables, the last one out enables again, if the
collector was enabled when the first came in.

A Ctrl-C must not leave a pause counted (helper-143, 2026-12-05): one landing while leaving
waited for the lock skipped the count's decrement (FINDING 1), and one landing in contextlib's
``__enter__`` / ``__exit__`` around a generator left the generator, still counted, to a
reference cycle only the paused collector frees (FINDING 2). So a pause is an object: leaving
retries until it is counted out, then raises the interrupt; entering, interrupted, leaves
again. CPython runs a signal handler, and switches threads, only at the end of a call or at a
backward jump: each step below that changes the count makes no call before its last
(``gc.disable()``, ``gc.enable()``), and the count passes through 0 only at a leave's last step,
so no handler and no other thread sees it half made. One step cannot be made so: a Python
``__exit__`` may be interrupted before its first line. A pause left counted so is let go by its
finalizer when the ``with`` statement drops it, and, where a cycle (the error kept) holds it, at
its thread's next pause, if a ``with`` statement of a function's own entered it (a frame that
runs on its thread's stack, a generator's excepted): abandoned where that frame no longer runs,
where that same statement comes in again, or where a pause such a statement entered before it
leaves; or when its thread ends. A pause no one holds any more whose finalizer a second Ctrl-C
cut short (CPython drops an error raised in a finalizer) is let go at the next pause on any
thread (each entry holds its pause weakly: helper-147's FINDING 1). Open: a pause entered
through another frame (``ExitStack.enter_context``, a wrapper) whose exit a Ctrl-C cut short,
held by a cycle (the error kept, or ExitStack's own), stays counted: only the collector frees
that cycle (helper-147's real-SIGINT run through ExitStacks: 40 left, the collector off).
unihook's own pauses are ``with`` statements of their functions. (Until the evening of
2026-12-05 every pause was judged by the frame that called its ``__enter__``: one entered by
``ExitStack.enter_context``, a wrapper or by hand in a loop was let go while in, the collector
enabled inside it, and the frames the lock's holder dropped ran finalizers that paused in the
middle: helper-145's and helper-146's FINDINGS 1 and 2.) A fork while another thread pauses
leaves the child's count without that thread's pauses (FINDING 6: the child's collector stayed
off).

A thread's own ``gc.disable()`` / ``gc.enable()`` bracket (torch.distributed.checkpoint's
``_gc_context``, ``timeit``) begun before the first pause came in enables the collector at its
end, while the pauses are in: a walk that must not run with it on (the torch backend's walks
of other threads' stacks) calls `collector_kept_off()` before each step, which disables it
again and has the last pause out enable it (helper-156's FINDING 1); so does every pause that
comes in meanwhile (until 2026-12-06 only the first did: a pause entering after such an end,
the one each walk makes inside its own, left the collector off for good, helper-158's
FINDING 1).

Not kept: a user's ``gc.disable()`` made while a pause is in (the collector is off already,
and the last pause out enables it if it was on when the first came in, or was seen on since:
also where another thread enabled it for a moment meanwhile, helper-158's FINDING 5); a pause
across a greenlet switch (its frame runs off the thread's stack: taken for done by the
thread's next pause). Open: another thread's ``gc.enable()`` between `collector_kept_off()`'s
look and the walk's next read (a thread switch there: helper-158's FINDING 2); the last pause
out enables the collector holding the pauses' lock, and a collection the ``with`` statement's
exit call starts there (its argument tuple, where the free list is empty) runs finalizers
under it.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from itertools import count
from opcode import opmap
from types import FrameType, TracebackType
from typing import Any

__all__ = ["collector_kept_off", "collector_paused"]

# (reentrant: a signal handler or a finalizer pausing on a thread inside; replaced in a forked
# child)
_lock = threading.RLock()
# the pauses in, by key: the thread of each and, for one entered by a ``with`` statement of its
# own, that statement's frame and code (by id: nothing freed under the lock) and offset, else 0s;
# and the pause, weakly
_in: dict[int, tuple[int, int, int, int, weakref.ref[Any]]] = {}
_restore = [False]  # whether the collector was enabled when the first pause came in
_keys = count(1)
# the instruction that calls a ``with`` statement's ``__enter__`` (3.10: SETUP_WITH; none from
# 3.14 on: there the pauses are let go of by their finalizer alone)
_WITH = {opmap[name] for name in ("BEFORE_WITH", "SETUP_WITH") if name in opmap}
_SUSPENDABLE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable and async generator
_thread = threading.local()  # (its value of a thread is freed when that thread ends)


class _Pause:
    """One pause (see the module's docstring); `collector_paused()` makes them."""

    __slots__ = ("_key", "__weakref__")

    def __init__(self) -> None:
        self._key = 0  # (counted while not 0)

    def __enter__(self) -> None:
        if self._key:
            raise RuntimeError("a collector pause is entered once; make one per with statement")
        thread, site = threading.get_ident(), _site(sys._getframe(1))
        if getattr(_thread, "end", None) is None:
            _thread.end = _ThreadEnd(thread)
        key, ref = next(_keys), weakref.ref(self)
        # (made before the lock: an allocation may start a collection, whose finalizers must
        # not run under it, where one waiting for a lock whose holder waits for this one
        # deadlocked: helper-158's FINDING 3)
        entry = (thread, *site, ref)
        try:
            with _lock:
                enabled = gc.isenabled()
                first = not _in  # (from here to the disable: no call)
                _in[key] = entry
                self._key = key
                if first or enabled:
                    # (a pause in keeps it off: on, another thread's own bracket ended since,
                    # and the last pause out enables it: helper-158's FINDING 1)
                    _restore[0] = enabled
                gc.disable()
                if not first:
                    _let_go(_abandoned(key, site))
        except BaseException:
            self._leave(False)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(True)

    def __del__(self) -> None:
        # (one whose __exit__ a Ctrl-C cut short before its first line, and the with statement
        # gone: let go of here; where a cycle holds it, at its thread's next pause; not at the
        # interpreter's end, the module's names cleared)
        if getattr(self, "_key", 0) and _lock is not None:  # (a Ctrl-C in __init__: none)
            self._leave(False)

    def _leave(self, done: bool) -> None:
        """Count this pause out; where its own ``with`` statement is `done`, with it the
        thread's pauses entered by a ``with`` statement after it (abandoned: a statement that
        came in after this one, on this thread's stack, is done before it)."""
        interrupted: BaseException | None = None
        while self._key:
            try:
                with _lock:  # (a Ctrl-C in the wait: tried again)
                    key = self._key
                    if done and key in _in and len(_in) > 1 and _in[key][1]:
                        _let_go(_after(key))
                    if key in _in:  # (from here to the enable: no call)
                        del _in[key]
                        if not _in and _restore[0]:
                            gc.enable()
                    self._key = 0
            except BaseException as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted


def collector_kept_off() -> None:
    """(inside a `collector_paused()`) The collector off again where another thread's own
    ``gc.enable()`` turned it on meanwhile (see the module's docstring); the last pause out
    enables it then. One call where it is off."""
    if gc.isenabled():
        with _lock:
            if _in and gc.isenabled():
                _restore[0] = True
                gc.disable()


def _site(frame: FrameType) -> tuple[int, int, int]:
    """Where `frame` enters a pause: its id, its code's and the offset, if it is a ``with``
    statement of a function's own (a frame that is on its thread's stack while it runs); 0s
    where it is a call (``ExitStack.enter_context``, a wrapper's ``__enter__``, by hand) or a
    generator's or coroutine's (suspended, it runs off the stack)."""
    code, offset = frame.f_code, frame.f_lasti
    if code.co_flags & _SUSPENDABLE or code.co_code[offset] not in _WITH:
        return (0, 0, 0)
    return (id(frame), id(code), offset)


def _abandoned(key: int, coming: tuple[int, int, int]) -> list[int]:
    """(under the lock, the pause `key` coming in at site `coming`) The pauses no one holds any
    more (their finalizer's leave cut short: a second Ctrl-C, helper-147's FINDING 1), and
    this thread's others a ``with`` statement entered that is done: its frame no longer runs
    on the thread, or it is the one coming in again (a loop, or the next time round)."""
    thread = _in[key][0]
    entries = tuple(_in.items())  # (one read: other threads change it)
    dead = [other for other, entry in entries if entry[4]() is None]
    mine = [
        (other, entry[1:4])
        for other, entry in entries
        if entry[0] == thread and entry[1] and other != key
    ]
    if not mine:
        return dead
    running: dict[int, int] = {}
    wanted = {site[0] for _, site in mine}
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and wanted:  # (most are a frame or two up: the walk stops there)
        if id(frame) in wanted:
            wanted.discard(id(frame))
            running[id(frame)] = id(frame.f_code)
        frame = frame.f_back
    return dead + [
        other for other, site in mine if running.get(site[0]) != site[1] or site == coming
    ]


def _after(key: int) -> list[int]:
    """(under the lock) `key`'s thread's pauses a ``with`` statement entered after it."""
    thread = _in[key][0]
    return [
        other
        for other, entry in tuple(_in.items())
        if other > key and entry[0] == thread and entry[1]
    ]


def _let_go(keys: list[int]) -> None:
    """(under the lock, with another pause in: the count stays above 0) Take `keys` out."""
    for key in keys:
        if key in _in:
            del _in[key]


class _ThreadEnd:
    """Lets go of a thread's pauses when it ends (one a cycle holds: helper-145's FINDING 3)."""

    __slots__ = ("_thread",)

    def __init__(self, thread: int) -> None:
        self._thread = thread

    def __del__(self) -> None:
        if _lock is None:  # (the interpreter's end: the module's names cleared)
            return
        with _lock:
            # (a pause it entered through another frame may be held on by another thread: an
            # ExitStack handed on; helper-147's FINDING 2)
            left = [
                key
                for key, entry in tuple(_in.items())
                if entry[0] == self._thread and (entry[1] or entry[4]() is None)
            ]
            if not left:
                return
            *others, last = left
            _let_go(others)
            if last in _in:  # (from here to the enable: no call)
                del _in[last]
                if not _in and _restore[0]:
                    gc.enable()


def collector_paused() -> _Pause:
    """No garbage collection inside (``with collector_paused():``), on any thread (a
    collection another thread's allocation starts included), for as long as any thread is
    inside one; the collector's state when the first came in is back when the last leaves.
    One pause per ``with`` statement (or ``ExitStack.enter_context``, a wrapper's
    ``__enter__``)."""
    return _Pause()


def _before_fork() -> None:
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    """Only the forking thread runs in the child: the other threads' pauses are gone."""
    global _lock
    _lock = threading.RLock()
    me = threading.get_ident()
    gone = [key for key, entry in _in.items() if entry[0] != me]
    for key in gone:
        del _in[key]
    if gone and not _in and _restore[0]:  # (none in before: the user's state, helper-147's F3)
        gc.enable()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
