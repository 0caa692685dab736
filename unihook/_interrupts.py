"""Ctrl-C held back while unihook changes a registry, then delivered.

A KeyboardInterrupt lands wherever Python checks for signals, including the few bytecodes
between taking a lock and recording its owner, or between letting go of it and clearing the
owner: a lock left held there made every later registration wait for ever. While unihook
holds a registry lock, SIGINT's handler (main thread only: no other thread gets one) only
records the signal; the recorded one goes to the previous handler once the lock is free. A
second Ctrl-C meanwhile raises at once (the user insists: a registration that hangs can
still be left).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["Held", "hold", "deliver"]


class Held:
    """The SIGINT handler while a registry lock is held: records the signal."""

    __slots__ = ("caught", "previous")

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.caught: tuple[int, Any] | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.caught is not None:
            raise KeyboardInterrupt
        self.caught = (signum, frame)


def hold() -> Held | None:
    """Hold SIGINT back (on the main thread; elsewhere, or where Python does not own the
    handler, None: nothing to hold)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # installed outside Python: not ours to swap
        return None
    held = Held(previous)
    try:
        signal.signal(signal.SIGINT, held)
    except ValueError:  # not the main interpreter
        return None
    return held


def deliver(held: Held | None) -> None:
    """Put the previous handler back and give it the signal held meanwhile, if any."""
    if held is None:
        return
    signal.signal(signal.SIGINT, held.previous)
    if held.caught is None:
        return
    if callable(held.previous):  # Python's default raises KeyboardInterrupt; a nested hold records
        held.previous(*held.caught)
    elif held.previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)
