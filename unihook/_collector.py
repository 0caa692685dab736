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
reference cycle only the paused collector frees (FINDING 2): the collector off for good either
way. So a pause is an object: leaving retries until it is counted out, then raises the
interrupt; entering, interrupted, leaves again. CPython runs a signal handler, and switches
threads, only at the end of a call or at a backward jump: each step below that changes the
count makes no call before its last (``gc.disable()``, ``gc.enable()``), so no handler and no
other thread sees it half made. One step cannot be made so: a Python ``__exit__`` (and
``__enter__``) may be interrupted before its first line. A pause left counted so is let go
at this thread's next pause: each pause knows the frame and instruction of its ``with``, and
one is abandoned where that frame no longer runs, or where that same ``with`` comes in again
(a loop, or the next time round). A fork while another thread pauses leaves the child's count
without that thread's pauses (FINDING 6: the child's collector stayed off). A pause does not
span a ``yield``: a suspended frame counts as one that no longer runs.

Not kept: a user's ``gc.disable()`` made while a pause is in (the collector is off already,
and the last pause out enables it if it was on when the first came in).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from itertools import count
from types import FrameType, TracebackType

__all__ = ["collector_paused"]

# (reentrant: a signal handler pausing on a thread inside; replaced in a forked child)
_lock = threading.RLock()
# the pauses in, by key: the thread of each, the frame of its ``with`` and where in it
_in: dict[int, tuple[int, FrameType, int]] = {}
_restore = [False]  # whether the collector was enabled when the first pause came in
_keys = count(1)


class _Pause:
    """One pause (see the module's docstring); `collector_paused()` makes them."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key = 0  # (counted while not 0)

    def __enter__(self) -> None:
        caller = sys._getframe(1)
        key, entry = next(_keys), (threading.get_ident(), caller, caller.f_lasti)
        try:
            with _lock:
                enabled = gc.isenabled()
                dropped = _drop_abandoned(entry)
                first = not _in  # (from here to the disable: no call)
                _in[key] = entry
                self._key = key
                if first and not dropped:  # (else the state the abandoned ones left)
                    _restore[0] = enabled
                gc.disable()
        except BaseException:
            self._leave()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        interrupted: BaseException | None = None
        while self._key:
            try:
                with _lock:  # (a Ctrl-C in the wait: tried again)
                    key = self._key  # (from here to the enable: no call)
                    self._key = 0
                    if key in _in:
                        del _in[key]
                    if _in:
                        _drop_abandoned(None)
                    if not _in and _restore[0]:
                        gc.enable()
            except BaseException as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted


def _drop_abandoned(entry: tuple[int, FrameType, int] | None) -> bool:
    """Let go of this thread's pauses whose frame no longer runs, or which `entry` (a pause
    coming in) comes in at again; whether there were any."""
    thread = threading.get_ident()
    mine = [key for key, (owner, _, _) in _in.items() if owner == thread]
    if not mine:
        return False
    gone = {id(_in[key][1]) for key in mine}  # (until found running: most are a frame up)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and gone:
        gone.discard(id(frame))
        frame = frame.f_back
    abandoned = [
        key
        for key in mine
        if id(_in[key][1]) in gone
        or (entry is not None and _in[key][1] is entry[1] and _in[key][2] == entry[2])
    ]
    for key in abandoned:
        _in.pop(key, None)
    return bool(abandoned)


def collector_paused() -> _Pause:
    """No garbage collection inside (``with collector_paused():``), on any thread (a
    collection another thread's allocation starts included), for as long as any thread is
    inside one; the collector's state when the first came in is back when the last leaves.
    Enter it with a ``with`` statement of its own: one entered through a helper frame
    (``ExitStack.enter_context``, a wrapper's ``__enter__``) or by hand in a loop is taken
    for abandoned at the thread's next pause (helper-145's and helper-146's FINDING 1, open)."""
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
    for key in [key for key, (thread, _, _) in _in.items() if thread != me]:
        del _in[key]
    if not _in and _restore[0]:
        gc.enable()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
