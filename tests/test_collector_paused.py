"""`collector_paused` across threads: each pause read ``gc.isenabled()``, disabled, and enabled
on leaving if it had been enabled; two threads interleaving left the collector off for good
(an every=2 recipe's places beside a thread registering hooks with dynamo imported: 2 of 4
runs; the dev suite then failed 616 tests, 2026-12-05)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import pytest
from racing import racing

import unihook
from unihook import _collector
from unihook.backend import collector_paused
from unihook.recipes import ActivationStats


def _pause() -> None:
    with collector_paused():
        pass


def test_pauses_on_threads_leave_the_collector_on() -> None:
    assert gc.isenabled()
    try:
        racing([_pause] * 3, 1.0)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            with collector_paused():
                pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_places_beside_a_thread_registering_hooks_leave_the_collector_on() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._dynamo")
    torch.compile(lambda t: t * 2, backend="eager")(torch.ones(2))  # (dynamo's thread walks)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(4, 8)
    stats = ActivationStats(model, every=2)
    try:
        racing(
            [
                lambda: model(x),
                lambda: unihook.register_forward_hook(
                    model[0], lambda m, a, o: None, prepend=True
                ).remove(),
            ],
            3,
        )
    finally:
        stats.remove()
    enabled = gc.isenabled()
    gc.enable()
    assert enabled


# Interrupts (helper-143, 2026-12-05): a pause left counted left the collector off for good.
# Each scenario runs in a child process (SIGINTs sent to it), which prints the collector's
# state, the pauses still counted, and a count of what it checks.

INTERRUPTED_LEAVING = r"""
import gc, os, signal, threading, time
from unihook import _collector
from unihook.backend import collector_paused

hold, release = threading.Event(), threading.Event()

def other():
    with _collector._lock:  # (another thread's pause coming in or going out meanwhile)
        hold.set()
        release.wait(2)

thread = threading.Thread(target=other)
caught = 0
try:
    with collector_paused():
        thread.start()
        hold.wait()
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        threading.Timer(0.6, release.set).start()
except KeyboardInterrupt:
    caught += 1
thread.join()
print((gc.isenabled(), len(_collector._in), caught))
"""


def test_a_ctrl_c_while_leaving_waits_for_the_lock_still_leaves() -> None:
    """FINDING 1: the Ctrl-C landed in the wait for the lock, before the count went down."""
    from children import last_value, run_code

    assert last_value(run_code(INTERRUPTED_LEAVING, timeout=60)) == (True, 0, 1)


HAMMERED = r"""
import gc, os, signal, sys, threading, time
from unihook import _collector
from unihook.backend import collector_paused

user_off = sys.argv[1] == "off"
if user_off:
    gc.disable()
armed = [True]

def handler(sig, frame):
    if armed[0]:
        raise KeyboardInterrupt

signal.signal(signal.SIGINT, handler)
end = time.monotonic() + 3

def kicker():
    while time.monotonic() < end:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.0003)

def pausing():
    while time.monotonic() < end:
        with collector_paused():
            pass

def attempt():
    error = None
    try:
        pausing()
    except KeyboardInterrupt as caught:
        error = caught  # (kept: the frame, the error and its traceback make a cycle)
    return error is not None

others = [threading.Thread(target=pausing) for _ in range(2)]
kick = threading.Thread(target=kicker)
interrupts = wrong = 0
try:
    for thread in [*others, kick]:
        thread.start()
except KeyboardInterrupt:
    pass
while kick.is_alive():
    try:
        interrupts += attempt()
        if user_off and gc.isenabled():
            wrong += 1  # (on while the user had it off; off is fine: another thread pauses)
    except KeyboardInterrupt:
        pass
armed[0] = False
for thread in [*others, kick]:
    thread.join()
with collector_paused():  # (lets go of one this thread abandoned)
    pass
print((gc.isenabled() != user_off, len(_collector._in), wrong, interrupts > 10))
"""


@pytest.mark.parametrize("user", ["on", "off"])
def test_ctrl_c_anywhere_in_pauses_on_threads_leaves_the_collector_as_it_was(user: str) -> None:
    """FINDINGS 1, 2 and 4: Ctrl-Cs landing anywhere in pauses (contextlib's ``__enter__`` /
    ``__exit__`` around a generator left it counted, held by a cycle only the collector frees;
    one after ``gc.isenabled()`` returned, before its value was kept, enabled it for a user who
    had it off)."""
    from children import last_value, run_code

    assert last_value(run_code(HAMMERED, user, timeout=120)) == (True, 0, 0, True)


# (a child script's lines: a fork whose child reports its collector's state on the pipe)
FORK_REPORTING = r"""
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, b"1" if gc.isenabled() else b"0")
    os._exit(0)
os.waitpid(pid, 0)
"""

FORKED = (
    r"""
import gc, os, threading
from unihook.backend import collector_paused

inside, done = threading.Event(), threading.Event()

def paused():
    with collector_paused():
        inside.set()
        done.wait()

thread = threading.Thread(target=paused)
thread.start()
inside.wait()
"""
    + FORK_REPORTING
    + r"""
child = os.read(read, 1) == b"1"
done.set()
thread.join()
print((child, gc.isenabled()))
"""
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_while_another_thread_pauses_leaves_the_childs_collector_on() -> None:
    """FINDING 6 (multiprocessing's fork, DataLoader workers): the child has no such thread."""
    from children import last_value, run_code

    assert last_value(run_code(FORKED, timeout=60)) == (True, True)


# Helper frames (helper-145's and helper-146's FINDING 1, 2026-12-05): each pause was judged by
# the frame that called its ``__enter__``; one entered through another frame was let go at the
# thread's next pause while still in, and the collector enabled inside it.


class _Wrapper:
    def __init__(self) -> None:
        self._pause = collector_paused()

    def __enter__(self) -> None:
        self._pause.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._pause.__exit__(None, None, None)


@contextlib.contextmanager
def _around() -> Iterator[None]:
    with collector_paused():
        yield


def _by_hand() -> contextlib.AbstractContextManager[None]:
    pauses = [collector_paused() for _ in range(3)]
    for pause in pauses:  # (one line enters them all)
        pause.__enter__()
    stack = contextlib.ExitStack()
    for pause in pauses:
        stack.push(pause.__exit__)
    return stack


ENTERED = {
    "exit_stack": lambda: _entered_by(contextlib.ExitStack()),
    "wrapper": _Wrapper,
    "contextmanager": _around,
    "by_hand_in_a_loop": _by_hand,
}


def _entered_by(stack: contextlib.ExitStack) -> contextlib.ExitStack:
    stack.enter_context(collector_paused())
    return stack


@pytest.mark.parametrize("how", list(ENTERED))
def test_a_pause_entered_through_another_frame_stays_in(how: str) -> None:
    assert gc.isenabled()
    try:
        with ENTERED[how]():
            _pause()  # (the thread's next pause: it judged the other one abandoned)
            _pause()
            inside = gc.isenabled()
        assert (inside, gc.isenabled(), len(_collector._in)) == (False, True, 0)
    finally:
        gc.enable()


def test_a_pause_is_entered_once() -> None:
    pause = collector_paused()
    with pause:
        with pytest.raises(RuntimeError, match="entered once"):
            pause.__enter__()
        assert not gc.isenabled()
    assert gc.isenabled()


# A Ctrl-C before the first line of a pause's ``__exit__`` (simulated by a trace function at
# its call): the pause is let go when the with statement drops it, and where the error kept
# makes a cycle that holds it, at the thread's next pause, or when its outer pause leaves, or
# when its thread ends. A finalizer that pauses, run by the letting go, must not record "off"
# as the state to restore (helper-146's FINDING 2).
CUT_SHORT = r"""
import gc, sys, threading
from unihook import _collector
from unihook.backend import collector_paused

scenario = sys.argv[1]
kept = []

class Pausing:
    def __del__(self):
        with collector_paused():
            pass

def tracer(frame, event, arg):
    if frame.f_code is _collector._Pause.__exit__.__code__ and event == "call":
        raise KeyboardInterrupt
    return None

def cut_short():
    local = Pausing()
    sys.settrace(tracer)
    try:
        with collector_paused():
            pass
    finally:
        sys.settrace(None)

def caught(keep):
    try:
        cut_short()
    except KeyboardInterrupt as error:
        if keep:
            kept.append(error)  # (error -> traceback -> frames -> ... : freed by the collector)
            here = error  # (this frame in the cycle too)

def outer():
    with collector_paused():
        caught(True)
        return gc.isenabled()

counted = len(_collector._in)
if scenario == "dropped":
    caught(False)
elif scenario == "kept":
    caught(True)
    counted = len(_collector._in)
    with collector_paused():
        pass
elif scenario == "kept_in_an_outer_pause":
    assert not outer()
elif scenario == "kept_on_a_thread_that_ends":
    thread = threading.Thread(target=caught, args=(True,))
    thread.start()
    thread.join()
print((counted, gc.isenabled(), len(_collector._in)))
"""


@pytest.mark.parametrize(
    "scenario",
    ["dropped", "kept", "kept_in_an_outer_pause", "kept_on_a_thread_that_ends"],
)
def test_a_pause_whose_exit_a_ctrl_c_cut_short_is_let_go(scenario: str) -> None:
    from children import last_value, run_code

    counted, enabled, left = last_value(run_code(CUT_SHORT, scenario, timeout=60))
    assert (enabled, left) == (True, 0)
    if scenario == "kept":
        assert counted == 1  # (held by the cycle until the next pause: what the test tests)


AT_THE_END = r"""
import sys, threading
from unihook.backend import collector_paused

with collector_paused():  # (this thread's end-of-thread note made)
    pass
held = collector_paused()
held.__enter__()  # (in at the interpreter's end)
thread = threading.Thread(target=lambda: collector_paused().__enter__())
thread.start()
thread.join()
threading._kept = sys.modules["unihook._collector"]  # (alive until its names are cleared)
print("done")
"""


def test_pauses_in_at_the_interpreters_end_say_nothing() -> None:
    """A thread's end-of-thread note freed as the interpreter ends, the module's names cleared
    (after each pytest run of the repo's tests, 2026-12-05), raised ("'NoneType' object does
    not support the context manager protocol"); so could a pause in then."""
    from children import run_code

    done = run_code(AT_THE_END, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr.strip()) == (0, "done", "")


# helper-147's attack of the pauses (2026-12-05)
HANDED_ON = r"""
import contextlib, gc, threading
from unihook.backend import collector_paused

box = {}

def worker():
    stack = contextlib.ExitStack()
    stack.enter_context(collector_paused())
    box["stack"] = stack

thread = threading.Thread(target=worker)
thread.start()
thread.join()
inside = gc.isenabled()
with box["stack"]:
    pass
print((inside, gc.isenabled()))
"""

FORK_WITH_NONE_IN = (
    r"""
import gc, os
from unihook.backend import collector_paused

with collector_paused():
    pass
gc.disable()
"""
    + FORK_REPORTING
    + r"""
print(os.read(read, 1) == b"1")
"""
)

FINALIZER_CUT_SHORT = r"""
import gc, sys
from unihook import _collector
from unihook.backend import collector_paused

left = ["__exit__", "__del__"]

class Wrapper:
    def __enter__(self):
        self.pause = collector_paused()
        self.pause.__enter__()
    def __exit__(self, *exc):
        self.pause.__exit__(None, None, None)

def tracer(frame, event, arg):
    code = frame.f_code
    ours = code.co_filename == _collector.__file__
    if event == "call" and left and ours and code.co_name == left[0]:
        left.pop(0)  # (the first in the pause's exit, the second in its finalizer)
        raise KeyboardInterrupt
    return None

sys.settrace(tracer)
try:
    with Wrapper():
        pass
except KeyboardInterrupt:
    sys.settrace(tracer)  # (CPython unset it: set again, for the finalizer's)
sys.settrace(None)
counted = len(_collector._in)
with collector_paused():  # (the thread's next pause lets go of the one no one holds)
    pass
print((left, counted, gc.isenabled(), len(_collector._in)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (HANDED_ON, (False, True)),  # FINDING 2: its thread's end let it go while in
        (FORK_WITH_NONE_IN, False),  # FINDING 3: the child enabled what the user disabled
    ],
    ids=["a_pause_handed_to_another_thread", "a_fork_with_no_pause_in"],
)
def test_pauses_outlive_their_thread_and_forks_keep_the_users_state(
    script: str, expected: object
) -> None:
    from children import last_value, run_code

    assert last_value(run_code(script, timeout=60)) == expected


def test_a_pause_whose_finalizer_a_second_ctrl_c_cut_short_is_let_go() -> None:
    """FINDING 1: the pause's finalizer, its only way out, cut short at its first line (the
    second Ctrl-C, dropped as "ignored in __del__") left it counted for good."""
    from children import last_value, run_code

    assert last_value(run_code(FINALIZER_CUT_SHORT, timeout=60)) == ([], 1, True, 0)


def test_kept_off_turns_it_off_again_and_the_last_pause_out_on() -> None:
    """`collector_kept_off()`: a thread's own ``gc.enable()`` inside a pause (its bracket
    began before the pause came in: the pause took the collector for off)."""
    from unihook.backend import collector_kept_off

    gc.disable()
    try:
        with collector_paused():
            gc.enable()  # (that thread's bracket ends)
            collector_kept_off()
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        collector_kept_off()  # (outside a pause: nothing)
        assert not gc.isenabled()
        gc.enable()
        collector_kept_off()
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_coming_in_after_a_threads_bracket_ended_inside_leaves_it_on() -> None:
    """helper-158's FINDING 1: a thread's own bracket (begun before the first pause came in)
    ends inside it, then another pause comes in (each walk of other threads' stacks makes one
    inside its own): it took the collector for off and the last pause out left it off."""
    gc.disable()  # (that thread's bracket begins)
    try:
        with collector_paused():
            gc.enable()  # (and ends)
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        gc.enable()


FINALIZER_UNDER_THE_LOCK = r"""
import faulthandler, gc, sys, threading, time
from unihook import _collector
from unihook.backend import collector_paused

faulthandler.dump_traceback_later(60, exit=True)
held = threading.Lock()  # (a registry lock: the other thread pauses while it holds it)
go, waiting, fired = threading.Event(), threading.Event(), []

def other():
    with held:
        go.wait()
        waiting.set()
        with collector_paused():
            pass

class Finalized:
    def __init__(self):
        self.me = self
    def __del__(self):
        if _collector._lock._is_owned() and not fired:
            fired.append(sys._getframe(1).f_code.co_name)
            go.set(); waiting.wait(); time.sleep(0.2)
            with held:  # (a finalizer's hook removal waiting for that registry lock)
                pass
        elif not fired:
            Finalized()

threading.Thread(target=other, daemon=True).start()
Finalized()
gc.set_threshold(1)
for i in range(100000):
    with collector_paused():
        pass
    if fired:
        break
gc.set_threshold(700)
print(fired)
"""


def test_no_collection_runs_finalizers_under_the_pauses_lock() -> None:
    """helper-158's FINDING 3: a pause coming in with the collector on made its entry under
    the pauses' lock, and a collection that allocation started ran a finalizer there; one
    waiting for a lock whose holder waited for the pauses' lock deadlocked both threads
    (here every time, a collection every allocation)."""
    from children import last_value, run_code

    assert last_value(run_code(FINALIZER_UNDER_THE_LOCK, timeout=120)) == []
