"""One thread at a time in MindSpore's native state (docs/MINDSPORE.md §10).

MindSpore 2.10 PyNative is not thread-safe: forwards on two threads at once give wrong outputs
or crash, concurrent grads lose their "top cell", and reading a Parameter or registering a
tensor hook while another thread's backward runs segfaults. `exclusive` is a re-entrant lock
that one thread may hold across calls (the kit's tape holds it from a leaf's creation to its
backward); the backend takes it around its native tensor-hook calls.
"""

from __future__ import annotations

import threading
import time

__all__ = ["exclusive"]

WAIT = 120.0  # seconds before a waiter gives up on a living owner (a deadlock, reported)


class _Exclusive:
    def __init__(self) -> None:
        # entered as `self._lock`, a C lock the `with` statement takes and lets go of itself:
        # a Ctrl-C landing in Condition's Python __enter__ left it held (every thread waited)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._owner: int | None = None
        self._count = 0

    def held(self) -> bool:
        return self._owner == threading.get_ident()

    def acquire(self) -> None:
        me = threading.get_ident()
        deadline = time.monotonic() + WAIT
        with self._lock:
            while self._owner not in (None, me):
                if self._owner not in {t.ident for t in threading.enumerate()}:
                    # its owner ended inside a recording window (never reached its backward)
                    self._owner, self._count = None, 0
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"unihook (mindspore): thread {me} waited {WAIT:.0f} s for thread "
                        f"{self._owner}, which holds MindSpore (it recorded a graph and has not "
                        "run its backward): MindSpore 2.10 runs one thread at a time"
                    )
                self._cond.wait(0.05)
            self._owner = me
            self._count += 1

    def release(self) -> None:
        with self._lock:
            if self._owner != threading.get_ident():
                return  # taken over (the owner was gone): nothing of ours to give back
            self._count -= 1
            if not self._count:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


exclusive = _Exclusive()
