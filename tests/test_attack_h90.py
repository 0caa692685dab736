"""helper-90's attack on 048ef2c: torch module hooks registered and removed inside
`hooks_changeable` (dynamo's compile lock, `_held_gil`, a wait while another thread is in
dynamo's live loop over a module's hook dicts, ``nn_module_get_all_hooks``).

FINDINGS (failing tests):

1. a finalizer the collector runs on thread B inside dynamo's loop (its frame callback) removes
   a module hook while thread A registers one: A holds dynamo's compile lock and waits for B to
   leave the loop, B's removal waits for the compile lock: deadlock.
2. the same finalizer with no other thread: the removal goes through at once (nothing waits for
   a loop on the removing thread itself) and the compiled call raises KeyError.
3. a Ctrl-C landing in contextlib's ``__enter__`` of `hooks_changeable` once the generator
   yielded (after ``next(gen)`` returns): the ``with`` never got its ``__exit__``; while the
   KeyboardInterrupt's traceback lives (the REPL's ``sys.last_traceback``, a notebook) dynamo's
   compile lock stays held (no other thread compiles or registers a module hook) and the switch
   interval stays 0.1 s.
4. a Ctrl-C landing in `_current_frames` right after ``gc.disable()`` (before its ``try``): the
   garbage collector stays off for the process. Now reached by every module hook registration
   and removal once dynamo is imported (and per retry of the wait).
7. a removed module backward hook's dispatchers leave the module's HookDict when the last call
   in flight ends (`ModuleBackward._ended` -> `retire` -> unpin), on that call's thread, outside
   `hooks_changeable` and dynamo's lock: dynamo tracing on another thread reads the HookDict
   live (``utils.get_items_from_dict``: ``OrderedDict.keys(obj)``, past HookDict's snapshot
   ``keys``/``__iter__``) and the compiled call raises InternalTorchDynamoError "OrderedDict
   mutated during iteration". FIXED (`WatchedPinned`: pinned and unpinned inside
   `hooks_changeable`).
6. (low, not new in 048ef2c) a module hook registration inside a fullgraph=True compiled
   function fails with dynamo's "Unsupported context manager ... RLock", no unihook reason.
   FIXED (made outside dynamo, with unihook's reason: `ESCAPE_REASONS["module_registration"]`).
5. with dynamo imported, a module hook registration or removal beside one thread running pure
   Python takes ~100 ms (`_held_gil`'s ``time.sleep(0)`` hands the GIL to that thread, which
   then keeps it for the raised 0.1 s switch interval): 20 hooks take ~4 s to register.

Held (passing tests): a Ctrl-C (interrupt_main) landing in the wait for a thread in dynamo's
loop leaves nothing held, the interval restored, no hook; hooks registered and removed on another
thread after compiling fire / stop firing (four kinds); churn of the four module hook kinds on
a thread beside compiled calls with a
1e-5 s switch interval (no error, interval restored); hooks registered and removed from a forward
hook and from a backward hook of a compiled model fire as in eager; a registration inside a
compiled function (no fullgraph); no lock left held and the switch interval restored after
registrations.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from children import last_value, run_code

pytest.importorskip("torch")


def _run(code: str, *args: str, timeout: float = 60) -> object:
    """What the child printed last (a literal); a hang (its faulthandler exits it) fails."""
    try:
        done = run_code(code, *args, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung past {timeout} s")
    assert "Timeout (" not in done.stderr, "hung:\n" + done.stderr[-4000:]
    return last_value(done)


_LOOP_FINALIZER = r"""
import inspect, sys, threading, time, gc, faulthandler
import torch, torch._dynamo, unihook
from torch._dynamo import utils

faulthandler.dump_traceback_later(6, exit=True)
TWO = sys.argv[1] == "two"
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
kept = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
victim = unihook.register_forward_pre_hook(m[0], lambda mod, a: None)


class Owner:  # an object whose death removes its hook (weakref.finalize, __del__)
    def __del__(self):
        victim.remove()


f = torch.compile(m, backend="eager")
inside = threading.Event()
looping = inspect.unwrap(utils.nn_module_get_all_hooks).__code__  # (unihook marks its runs)


def pause(frame, event, arg):
    local = frame.f_locals
    if (
        event == "line"
        and local.get("mod") is m[0]
        and local.get("hook_dict_name") == "_forward_pre_hooks"
        and "hook_name" in local
        and not inside.is_set()
    ):
        inside.set()
        if TWO:
            time.sleep(0.3)  # A holds dynamo's lock now, waiting for this thread to leave
        owner = Owner()
        owner.cycle = owner
        del owner
        gc.collect()  # the collection an allocation in dynamo's loop would start
    return pause


def trace(frame, event, arg):
    return pause if frame.f_code is looping else None


registered = []


def other():
    inside.wait(10)
    registered.append(unihook.register_forward_pre_hook(m[2], lambda mod, a: None))


thread = threading.Thread(target=other, daemon=True)
if TWO:
    thread.start()
errors = []
sys.settrace(trace)
try:
    f(torch.ones(2, 3)).sum().backward()
except Exception as error:
    errors.append(f"{type(error).__name__}: {error}")
sys.settrace(None)
if TWO:
    thread.join(5)
print([inside.is_set(), errors, len(registered) if TWO else 1])
"""


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 1's deadlock is gone; the finalizer's removal inside dynamo's loop on its "
    "own thread still fails the call (FINDING 2): open",
)
def test_finalizer_removal_in_dynamos_hook_loop_beside_a_registration_deadlocks() -> None:
    """FINDING 1."""
    assert _run(_LOOP_FINALIZER, "two", timeout=60) == [True, [], 1]


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 2: open (a finalizer removing a hook on the thread in dynamo's loop; "
    "torch's own handle does the same)",
)
def test_finalizer_removal_in_dynamos_hook_loop_fails_the_compiled_call() -> None:
    """FINDING 2."""
    out = _run(_LOOP_FINALIZER, "one", timeout=60)
    assert out == [True, [], 1]


_ENTER_INTERRUPTED = r"""
import sys, threading, gc, contextlib
import torch, torch._dynamo, unihook
from torch._dynamo import convert_frame
from unihook_torch import _compile

m = torch.nn.Linear(2, 2)
before = sys.getswitchinterval()
enter = contextlib._GeneratorContextManager.__enter__.__code__
changeable = _compile.hooks_changeable.__wrapped__.__code__


def local(frame, event, arg):
    # after `next(self.gen)` returned: where a Ctrl-C lands after a call of a builtin
    if event == "return" and frame.f_locals["self"].gen.gi_code is changeable:
        sys.settrace(None)
        raise KeyboardInterrupt
    return local


def trace(frame, event, arg):
    return local if frame.f_code is enter else None


kept = None
sys.settrace(trace)
try:
    unihook.register_forward_hook(m, lambda *a: None)
except KeyboardInterrupt as error:
    kept = error  # as the REPL keeps it (sys.last_traceback)
sys.settrace(None)
got = []


def other():
    got.append(convert_frame.compile_lock.acquire(timeout=1.0))
    if got[-1]:
        convert_frame.compile_lock.release()


thread = threading.Thread(target=other)
thread.start()
thread.join()
print([kept is not None, got, sys.getswitchinterval() == before])
"""


def test_ctrl_c_after_hooks_changeable_enters_leaves_compile_lock_and_interval() -> None:
    """FINDING 3."""
    out = _run(_ENTER_INTERRUPTED)
    assert out == [True, [True], True]


_GC_INTERRUPTED = r"""
import sys, gc, inspect
import torch, torch._dynamo, unihook
from unihook_torch import _compile

m = torch.nn.Linear(2, 2)
lines, start = inspect.getsourcelines(_compile._current_frames)
try_line = start + next(
    i for i, line in enumerate(lines) if line.strip() == "return sys._current_frames()"
)
code = _compile._current_frames.__code__


def local(frame, event, arg):
    # right after gc.disable() returned (a builtin's call: a Ctrl-C lands there)
    if event == "line" and frame.f_lineno == try_line:
        sys.settrace(None)
        raise KeyboardInterrupt
    return local


def trace(frame, event, arg):
    return local if frame.f_code is code else None


sys.settrace(trace)
try:
    unihook.register_forward_hook(m, lambda *a: None)
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
sys.settrace(None)
print([interrupted, gc.isenabled()])
"""


def test_ctrl_c_in_current_frames_leaves_the_collector_off() -> None:
    """FINDING 4."""
    out = _run(_GC_INTERRUPTED)
    assert out == [True, True]


_BUSY = r"""
import sys, threading, time
import torch, torch._dynamo, unihook

modules = [torch.nn.Linear(2, 2) for _ in range(10)]
unihook.register_forward_hook(torch.nn.Linear(2, 2), lambda *a: None)  # (first-use costs)
stop = False


def busy():  # a thread running pure Python (a parser, a progress computation)
    x = 0
    while not stop:
        x += 1


thread = threading.Thread(target=busy)
thread.start()
time.sleep(0.05)
start = time.perf_counter()
handles = [unihook.register_forward_hook(m, lambda *a: None) for m in modules]
for handle in handles:
    handle.remove()
per_hook = (time.perf_counter() - start) / 20
stop = True
thread.join()
print([round(per_hook * 1000, 1)])
"""


def test_registration_beside_a_busy_python_thread_does_not_stall() -> None:
    """FINDING 5: about 100 ms per registration or removal (~0.5 ms without dynamo)."""
    out = _run(_BUSY)
    (ms,) = out
    assert ms < 30, f"{ms} ms per module hook registration or removal"


_CHURN = r"""
import sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from torch._dynamo import convert_frame
from unihook_torch import _compile

sys.setswitchinterval(1e-5)
INTERVAL = sys.getswitchinterval()
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
kept = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
f = torch.compile(m, backend="eager")
stop, errors, counts = False, [], [0, 0]
kinds = [
    lambda mod: unihook.register_forward_pre_hook(mod, lambda *a: None),
    lambda mod: unihook.register_forward_hook(mod, lambda *a: None),
    lambda mod: unihook.register_full_backward_hook(mod, lambda *a: None),
    lambda mod: unihook.register_full_backward_pre_hook(mod, lambda *a: None),
]


def churn():
    i = 0
    while not stop:
        try:
            kinds[i % 4](m[i % 3]).remove()
            counts[0] += 1
        except Exception as error:
            errors.append(repr(error)[:200])
        i += 1


thread = threading.Thread(target=churn)
thread.start()
start = time.time()
while time.time() - start < 2:
    try:
        f(torch.ones(2, 3, requires_grad=True)).sum().backward()
        counts[1] += 1
    except Exception as error:
        errors.append(repr(error)[:200])
    if counts[1] % 20 == 0:
        torch._dynamo.reset()
stop = True
thread.join()
free = convert_frame.compile_lock.acquire(blocking=False)
holding = _compile._holding.acquire(blocking=False)
same = sys.getswitchinterval() == INTERVAL
# (both went on: each churn recompiles the next call, a few a second under CI's load)
print([errors[:3], counts[0] > 20 and counts[1] > 0 or counts, same, free, holding])
"""


def test_churn_beside_compiled_calls_held() -> None:
    out = _run(_CHURN, timeout=90)
    assert out == [
        [],
        True,
        True,
        True,
        True,
    ]


_FROM_HOOKS = r"""
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

CASE = sys.argv[1]
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
seen, handles = [], []


def outer(*args):
    seen.append("outer")
    if CASE == "remove":
        if handles:
            handles.pop().remove()
    else:
        handles.append(unihook.register_forward_hook(m[2], lambda *a: seen.append("inner")))


if CASE == "backward":
    unihook.register_full_backward_hook(m[0], outer)
else:
    unihook.register_forward_hook(m[0], outer)
if CASE == "remove":
    handles.append(unihook.register_forward_hook(m[2], lambda *a: seen.append("inner")))
f = torch.compile(m, backend="eager")
calls = []
for _ in range(3):
    f(torch.ones(2, 3, requires_grad=True)).sum().backward()
    calls.append(list(seen))
    seen.clear()
print(calls)
"""


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "forward",
            [["outer", "inner"], ["outer", "inner", "inner"], ["outer", "inner", "inner", "inner"]],
        ),
        ("backward", [["outer"], ["inner", "outer"], ["inner", "inner", "outer"]]),
    ],
)
def test_hooks_changed_from_hooks_of_a_compiled_model_held(
    case: str, expected: list[list[str]]
) -> None:
    out = _run(_FROM_HOOKS, case, timeout=90)
    assert out == expected


_IN_COMPILED = r"""
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
seen = []


def fn(x):
    handle = unihook.register_forward_hook(m[2], lambda mod, a, o: seen.append("h"))
    y = m(x)
    handle.remove()
    return y


f = torch.compile(fn, backend="eager")
calls = []
for _ in range(2):
    f(torch.ones(2, 3))
    calls.append(list(seen))
    seen.clear()
print([calls, len(m[2]._forward_hooks), sys.getswitchinterval()])
"""


def test_registration_inside_a_compiled_function_held() -> None:
    out = _run(_IN_COMPILED, timeout=90)
    assert out == [
        [["h"], ["h"]],
        0,
        0.005,
    ]


_FULLGRAPH = r"""
import sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
unihook.register_forward_hook(m[1], lambda *a: None).remove()  # (unihook loaded)


def fn(x):
    handle = unihook.register_forward_hook(m[2], lambda *a: None)
    y = m(x)
    handle.remove()
    return y


try:
    torch.compile(fn, backend="eager", fullgraph=True)(torch.ones(2, 3))
    print(repr("compiled"))
except Exception as error:
    print(repr(str(error).split("from user code:")[0]))
"""


def test_module_registration_under_fullgraph_says_why() -> None:
    """FINDING 6 (low; before 048ef2c it failed too, with "setattr() on unsupported type"):
    fullgraph=True gets dynamo's "Unsupported context manager ... RLock" (hooks_changeable's
    compile lock), not a reason of unihook's as a global registration or a removal does.
    FIXED: a module hook made while dynamo traces is made outside it (the torch backend's
    `_watched`), with ESCAPE_REASONS["module_registration"]."""
    said = _run(_FULLGRAPH, timeout=90)
    assert said == "compiled" or "unihook" in said, said


_RETIRED_WHILE_TRACING = r"""
import sys, threading, time, faulthandler, warnings
warnings.simplefilter("ignore")
faulthandler.dump_traceback_later(30, exit=True)
import torch, torch._dynamo, unihook
from torch._dynamo import utils
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
c_in, c_go, c_done, inside = (threading.Event() for _ in range(4))
bw = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
def gate(mod, a, o):
    if threading.current_thread().name == "C":
        c_in.set(); c_go.wait(10)
unihook.register_forward_hook(m[0], gate)
f = torch.compile(m, backend="eager")
def C():
    m[0](torch.ones(2, 3, requires_grad=True)).sum().backward()
    c_done.set()
tc = threading.Thread(target=C, name="C", daemon=True); tc.start()
c_in.wait(10)
bw.remove()   # C's call in flight: the dispatchers stay pinned until it ends
pre = m[0]._forward_pre_hooks
keys_before = list(pre)
code = utils.get_items_from_dict.__code__
def pause(frame, event, arg):
    if event == "line" and frame.f_back.f_locals.get("obj") is pre and not inside.is_set():
        inside.set(); c_go.set(); c_done.wait(0.5); time.sleep(0.2)  # (< _WAIT)
    return pause
def trace(frame, event, arg):
    back = frame.f_back
    if frame.f_code.co_name == "<listcomp>" and back is not None and back.f_code is code:
        return pause
    return None
sys.settrace(trace)
try:
    f(torch.ones(2, 3)).sum().backward(); r = "ok"
except Exception as e:
    r = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
sys.settrace(None)
c_go.set(); tc.join(5)
print([inside.is_set(), keys_before, list(pre), r])
"""


def test_dispatchers_retired_at_a_calls_end_while_dynamo_traces() -> None:
    """FINDING 7: dispatchers unpinned at a call's end changed the hook dict outside
    hooks_changeable. FIXED: the torch backend's `WatchedPinned` pins and unpins them inside
    it. The tracing thread waits for C for less than `_WAIT` (1 s, the most a change waits):
    C's change then waits for it to leave the loop (it waited 5 s at first, past that cap)."""
    got = _run(_RETIRED_WHILE_TRACING, timeout=90)
    assert got[0] and got[3] == "ok", got


_OTHER_THREAD = r"""
import sys, threading, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
f = torch.compile(m, backend="eager")
x = torch.ones(2, 3, requires_grad=True)
seen = []
out = []
def on_thread(fn):
    r = []; t = threading.Thread(target=lambda: r.append(fn())); t.start(); t.join(); return r[0]
kinds = {
 "pre": lambda: unihook.register_forward_pre_hook(m[2], lambda *a: seen.append("pre")),
 "fwd": lambda: unihook.register_forward_hook(m[2], lambda *a: seen.append("fwd")),
 "bw": lambda: unihook.register_full_backward_hook(m[2], lambda *a: seen.append("bw")),
 "bwpre": lambda: unihook.register_full_backward_pre_hook(m[2], lambda *a: seen.append("bwpre")),
}
f(x).sum().backward()
for name, reg in kinds.items():
    h = on_thread(reg)
    seen.clear(); f(x).sum().backward(); a = list(seen)
    on_thread(h.remove)
    seen.clear(); f(x).sum().backward(); b = list(seen)
    out.append((name, a, b))
print(out)
"""


def test_hooks_changed_on_another_thread_after_compiling_held() -> None:
    assert _run(_OTHER_THREAD, timeout=90) == [
        ("pre", ["pre"], []),
        ("fwd", ["fwd"], []),
        ("bw", ["bw"], []),
        ("bwpre", ["bwpre"], []),
    ]


_INTERRUPTED_WAIT = r"""
import inspect, sys, threading, time, _thread, faulthandler, warnings
warnings.simplefilter("ignore")
faulthandler.dump_traceback_later(20, exit=True)
import torch, torch._dynamo, unihook
from torch._dynamo import utils, convert_frame
from unihook_torch import _compile
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
kept = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
f = torch.compile(m, backend="eager")
inside, release = threading.Event(), threading.Event()
looping = inspect.unwrap(utils.nn_module_get_all_hooks).__code__  # (unihook marks its runs)
def pause(frame, event, arg):
    local = frame.f_locals
    if event == "line" and local.get("mod") is m[0] and "hook_name" in local \
            and not inside.is_set():
        inside.set(); release.wait(10)
    return pause
def trace(frame, event, arg):
    return pause if frame.f_code is looping else None
errs = []
def B():
    sys.settrace(trace)
    try: f(torch.ones(2, 3)).sum().backward()
    except Exception as e: errs.append(repr(e))
    sys.settrace(None)
before = sys.getswitchinterval()
tb = threading.Thread(target=B); tb.start()
inside.wait(10)
threading.Timer(0.3, _thread.interrupt_main).start()
n0 = len(m[0]._forward_hooks)
try:
    unihook.register_forward_hook(m[0], lambda *a: None)
    r = "registered"
except KeyboardInterrupt:
    r = "interrupted"
state = [r, sys.getswitchinterval() == before, len(m[0]._forward_hooks) == n0]
free = convert_frame.compile_lock.acquire(blocking=False)
if free: convert_frame.compile_lock.release()
release.set(); tb.join()
got = []
t = threading.Thread(target=lambda: got.append(convert_frame.compile_lock.acquire(timeout=1)))
t.start(); t.join()
print(state + [got, errs])
"""


def test_ctrl_c_in_the_wait_for_dynamos_loop_held() -> None:
    assert _run(_INTERRUPTED_WAIT, timeout=90) == ["interrupted", True, True, [True], []]


def test_threads_waiting_for_dynamos_loops_share_their_first_seen_times() -> None:
    # Two threads changing hooks read and change `_first_seen` together: a loop over it while
    # the other popped a key failed a registration beside compiled calls ("dictionary changed
    # size during iteration", CI on 59b67ae, this file's churn test).
    from unihook_torch import _compile

    errors: list[str] = []

    def wait(base: int) -> None:
        try:
            for i in range(30000):
                _compile._waited_for({base + i % 50, base + (i * 7) % 50}, _compile._first_seen)
        except Exception as error:
            errors.append(repr(error))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=wait, args=(k * 1000,)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
        _compile._first_seen.clear()
    assert errors == []
