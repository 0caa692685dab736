"""The garbage collector paused across threads: `collector_paused`.

Each pause used to read ``gc.isenabled()``, disable the collector, and enable it on leaving if
it had been enabled. Two threads interleaving (one reads "enabled", disables; the other reads
"disabled"; the first enables and leaves; the second disables) left the collector off for the
rest of the process: an every=2 recipe's places beside another thread registering hooks with
dynamo imported (2 of 4 runs of 5 s; the dev suite then failed 616 tests, 2026-12-05). Now the
pauses are counted: the first one in disables, the last one out enables again, if the
collector was enabled when the first came in.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["collector_paused"]

_lock = threading.RLock()  # (reentrant: a signal handler pausing on a thread inside)
_paused = [0, False]  # the pauses in, whether the collector was enabled when the first came


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection inside, on any thread (a collection another thread's allocation
    starts included), for as long as any thread is inside one."""
    counted = False
    try:
        with _lock:
            first = _paused[0] == 0
            _paused[0] += 1
            counted = True  # (no call since the count: no Ctrl-C lands between)
            if first:
                _paused[1] = True  # (a Ctrl-C before the next line's store: enabled after)
                _paused[1] = gc.isenabled()
                gc.disable()
        yield
    finally:
        # (a Ctrl-C landing in the pause still gets here: helper-90's FINDING 4)
        if counted:
            with _lock:
                _paused[0] -= 1
                if _paused[0] == 0 and _paused[1]:
                    gc.enable()
