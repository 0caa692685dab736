"""`racing(bodies, seconds)`: each body called over and over on a thread of its own for
`seconds`, the interpreter switching threads every microsecond (a race a test looks for)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence


def racing(bodies: Sequence[Callable[[], object]], seconds: float) -> None:
    stop = threading.Event()

    def loop(body: Callable[[], object]) -> None:
        while not stop.is_set():
            body()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=loop, args=(body,)) for body in bodies]
    try:
        for thread in threads:
            thread.start()
        time.sleep(seconds)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
