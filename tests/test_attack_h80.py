"""helper-80's attack on bb188ce (torch.compile and threads: a thread holding a registry lock
runs with dynamo's frame callback off, `unihook._locks.add_compiler_pause`; `watch_hooks` asks
for dynamo's compile lock after letting go of its registry lock).

Oracles: eager's hook calls and gradients; the thread's dynamo callback read back with
``set_eval_frame`` (set inside a compiled call, None outside); dynamo's compile lock wrapped as
tests/test_compilers.py does (who asks for it holding what); the threads finishing; dynamo's
``unique_graphs`` counter and its recompile-limit warning.

HELD (tests below, and by hand):
- per-module and global registrations and removals made inside a compiled function
  (backend "eager"): dynamo's callback is set again after each (a frame called after one still
  compiles), and stays None on a thread outside any compiled call;
- a model registering a per-module hook in one compiled call and removing it in the next, called
  from a compiled outer module: hook calls, outputs and input gradients equal eager's, with
  "eager" and "aot_eager" (by hand, 4 calls each);
- no registry lock is entered per call in steady state (`_locks._pause` counted over 10
  forward+backward calls of a model with per-module forward / full-backward and global
  forward-pre / full-backward hooks: 0, eager and compiled): a forward costs what it did;
- a finalizer removing a global hook run by the collector while dynamo compiles (one thread):
  the compiled model runs with its hooks as in eager, twice;
- test_compilers' lock-order churn with per-module hooks (full backward, forward pre) on the
  model's own modules next to a global full-backward hook, coming and going on another thread
  while a compiled model runs forward and backward: gradients constant, no thread asks for
  dynamo's lock holding a registry lock.

FINDINGS (all FIXED; each test below checks the fix):
1. FIXED (`_compile._hook_guards`: the entry's default, which every thread reads). (high: a
   hook silently skipped) dynamo's config is per-thread in torch 2.13
   (``torch._dynamo.config`` set on one thread reads as the default on another), and
   `watch_hooks` turns ``skip_nnmodule_hook_guards`` off on the registering thread only. A model
   compiled on a worker thread (its config: the default, True) has no guard on its empty hook
   dicts; a unihook forward hook then registered (on the main thread, which switched already:
   no `forget_compiled`) on a module whose hook dict was empty is never called, on the worker
   and on the main thread (which reuses the worker's cache entry). Repro: `F1` below (hook on
   m[0] registered, model compiled and run on a thread, hook on m[2] registered, model run on a
   thread and on main): observed ['m0'] both times; expected ['m0', 'm2'] as in eager.
2. FIXED (`forget_compiled` takes dynamo's lock before `_holding`; the test's D calls
   `forget_compiled` itself, since FINDING 1's fix left no first registration to switch).
   (high: a deadlock) the rule "no thread asks for dynamo's compile lock while it holds a lock
   of unihook's" misses `_compile._holding`: `forget_compiled` takes `_holding` (`_held_gil`)
   and then dynamo's compile lock, while a thread that holds dynamo's lock (a global
   registration's `compiles_held`, or dynamo compiling a frame) asks for `_holding` when the
   collector runs a finalizer there that removes a global hook (its remover calls
   `forget_compiled`). Repro: `F2` below: thread B registers a global hook; the collector runs
   inside B's `compiles_held` (forced there by a wrapper of the compile lock, as an allocation
   can) and finalizes an object that removes another global hook; thread D meanwhile registers
   its first per-module hook (a fresh thread: FINDING 1's config, so `watch_hooks` calls
   `forget_compiled`): B waits for `_holding` (D), D for the compile lock (B), for ever.
   Observed: both threads alive after 4 s; expected: both finish.
3. FIXED (as FINDING 1). (medium: cost, then eager for good) by FINDING 1's per-thread
   config, the first unihook
   torch hook registered on each new thread (even on a module no compiled model uses) turns the
   guard "on" again and drops every compiled frame (`forget_compiled`): each such thread costs a
   recompile, and with a compiled model running on another thread meanwhile the frames are
   invalidated, which counts towards ``recompile_limit``: after 8 short-lived threads
   registering and removing a hook on an unrelated module the model hits the limit ("last
   reason: unihook: a hook dynamo does not guard came or went") and runs eagerly from then on.
   The same churn from one thread recompiles nothing. Repro: `F3` below; observed: 3
   recompiles for 3 fresh threads and the limit hit; expected: none (as from one thread).
4. FIXED (the remover defers itself to the outermost registry lock's exit:
   `unihook.backend.defer_while_locked`). (high: a deadlock; the rule of bb188ce broken by
   unihook itself) a finalizer that removes a
   global hook, run by the collector on a thread inside a registry-locked section (supported:
   `RegistryLock.deferred`), defers only the inner `remove()`: the torch remover around it
   (backends/unihook_torch/__init__.py `remover`) enters `compiles_held()` first, asking for
   dynamo's compile lock while the thread holds the registry lock (and `forget_compiled` after).
   Repro: `F4` below: thread B registers a per-module full backward hook; inside its
   `_module_backward._lock` section (the mutex wrapped to run the collector there once C holds
   dynamo's lock) a finalizer removes a global hook; thread C registers a global full backward
   hook (`compiles_held`, then `_module_backward._lock`). Observed: both threads hang, and the
   compile lock was asked for by B under a registry lock (the order test_compilers records);
   expected: the removal deferred to the lock's exit, both threads finish.
5. FIXED (a call whose pre-hook did not run, and a forward whose start the recipe did not
   see, are not recorded). (medium: a recipe crashes the user's forward; not
   compile-specific) ActivationStats made
   while a forward of its model is running (from a hook inside that forward, or on another
   thread, the model's root having any hook so that torch reads its forward hooks at the end):
   the root's `_record` fires without its `_started` and raises ``KeyError('')`` out of the
   model's forward. GradientMonitor made the same way: fine. Found churning ActivationStats on
   one thread beside a model running on another (eager: KeyError after ~80 forwards; compiled:
   the same KeyError in dynamo's resume function of `_record`). Repro: `F5` below; observed
   ["KeyError('')", "KeyError('')"]; expected ["ok", "ok"].

Notes (not pinned): churning unihook forward pre-hooks ``with_kwargs=True`` and forward hooks
``always_call=True`` on a compiled model's root from another thread made the runner's compile
fail (IndexError in dynamo's guard building) 3 runs of 3; torch's native hooks churned the same
way failed too (InternalTorchDynamoError KeyError, 1 run of 2): dynamo's own limit, though
unihook holds dynamo's lock for global hooks only. FINDING 2's deadlock did not show in 35 s of
unforced churn (a compiling thread collecting finalizers that remove global hooks beside a
global-hook churner): its window needs the collector at one point. A per-module registration
inside a ``fullgraph=True`` function gets dynamo's "Unsupported context manager: lock", not a
reason of unihook's (as before bb188ce; README promises reasons for global registrations and
removals only).
"""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("torch")

from children import last_value, run_code  # noqa: E402

HELD_INSIDE = r"""
import gc, sys, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook
import unihook._locks as L
from torch._C._dynamo.eval_frame import set_eval_frame
from torch._dynamo import convert_frame

states = []


def probe():
    prior = set_eval_frame(None)
    set_eval_frame(prior)
    states.append(prior is not None and prior is not False)


lin = torch.nn.Linear(2, 2)


def fwd(x):
    probe()
    h = unihook.register_forward_hook(lin, lambda m, a, o: None)
    probe()
    y = lin(x)
    h.remove()
    probe()
    g = unihook.register_module_forward_hook(lambda m, a, o: None, backend="torch")
    probe()
    g.remove()
    probe()
    return y


f = torch.compile(fwd, backend="eager")
f(torch.ones(2))
f(torch.ones(2))
inside = states[:]
states.clear()
probe()
result = {"inside": inside, "outside": states[:]}

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
hs = [
    unihook.register_forward_hook(m[0], lambda mod, a, o: None),
    unihook.register_full_backward_hook(m[2], lambda mod, gi, go: None),
    unihook.register_module_forward_pre_hook(lambda mod, a: None, backend="torch"),
    unihook.register_module_full_backward_hook(lambda mod, gi, go: None, backend="torch"),
]
pauses = [0]
real_pause = L._pause


def counting():
    pauses[0] += 1
    real_pause()


x = torch.linspace(-1, 1, 6).reshape(2, 3)


def run(g, n):
    for _ in range(n):
        xx = x.clone().requires_grad_()
        g(xx).sum().backward()


c = torch.compile(m, backend="eager")
for name, g in (("eager", m), ("compiled", c)):
    run(g, 3)
    L._pause = counting
    run(g, 10)
    L._pause = real_pause
    result[name] = pauses[0]
    pauses[0] = 0

real = convert_frame.compile_lock
armed, fired = [False], []


class Dropper:
    def __init__(self, h):
        self.h, self.me = h, self

    def __del__(self):
        fired.append(1)
        self.h.remove()


class Collecting:
    def __enter__(self):
        r = real.__enter__()
        if armed[0] and sys._getframe(1).f_code.co_name == "_compile":
            armed[0] = False
            gc.collect()
        return r

    def __exit__(self, *e):
        return real.__exit__(*e)

    def __repr__(self):  # (its owner: unihook reads it)
        return repr(real)


for h in hs:
    h.remove()
calls = []
keep = unihook.register_module_forward_hook(
    lambda mod, a, o: calls.append(type(mod).__name__), backend="torch"
)
Dropper(unihook.register_module_forward_pre_hook(lambda mod, a: None, backend="torch"))
gc.disable()
convert_frame.compile_lock = Collecting()
torch._dynamo.reset()
c = torch.compile(m, backend="eager")
armed[0] = True
c(x)
first = list(calls)
calls.clear()
c(x)
convert_frame.compile_lock = real
gc.enable()
result["finalizer"] = [fired, first, calls == first]
print(result)
"""


def test_registry_locks_inside_compiled_calls_and_steady_state_held() -> None:
    got = last_value(run_code(HELD_INSIDE, timeout=120))
    assert got == {
        "inside": [True] * 10,
        "outside": [False],
        "eager": 0,
        "compiled": 0,
        "finalizer": [[1], ["Linear", "ReLU", "Linear", "Sequential", "OptimizedModule"], True],
    }


HELD_CHURN = r"""
import threading, time, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook
from torch._dynamo import convert_frame
from unihook._locks import held_here


class Watched:
    def __init__(self, lock):
        self.lock, self.inverted = lock, []

    def __enter__(self):
        if held_here():
            self.inverted.append(threading.current_thread().name)
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)

    def __repr__(self):  # (its owner: unihook reads it)
        return repr(self.lock)


watched = convert_frame.compile_lock = Watched(convert_frame.compile_lock)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
f = torch.compile(m, backend="eager")
x = torch.linspace(-1, 1, 6).reshape(2, 3)
grads, churns, done = [], [0], threading.Event()


def runner():
    try:
        for _ in range(6):
            xx = x.clone().requires_grad_()
            (f(xx) * torch.tensor([1.0, -2.0])).sum().backward()
            grads.append(tuple(round(v, 5) for v in xx.grad.flatten().tolist()))
    finally:
        done.set()


def churner():
    i = 0
    while not done.is_set():
        i += 1
        mod = m[i % 3]
        hs = [
            unihook.register_full_backward_hook(mod, lambda mod, gi, go: None),
            unihook.register_forward_pre_hook(mod, lambda mod, a: None),
            unihook.register_module_full_backward_hook(lambda mod, gi, go: None, backend="torch"),
        ]
        time.sleep(0.001)
        for h in hs:
            h.remove()
        churns[0] += 1


threads = [threading.Thread(target=runner), threading.Thread(target=churner)]
[t.start() for t in threads]
[t.join(60) for t in threads]
print([len(grads), len(set(grads)), churns[0] > 0, sorted(set(watched.inverted))])
"""


def test_per_module_hooks_churned_beside_a_compiled_model_held() -> None:
    done = run_code(HELD_CHURN, timeout=120)
    assert last_value(done) == [6, 1, True, []], done.stderr[-8000:]


F1 = r"""
import threading, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
f = torch.compile(m, backend="eager")
x = torch.ones(2, 3)
seen = []
h0 = unihook.register_forward_hook(m[0], lambda mod, a, o: seen.append("m0"))


def on_worker(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


on_worker(lambda: f(x))
h2 = unihook.register_forward_hook(m[2], lambda mod, a, o: seen.append("m2"))
seen.clear()
on_worker(lambda: f(x))
worker = list(seen)
seen.clear()
f(x)
print([worker, list(seen)])
"""


def test_hook_added_after_compiling_on_another_thread_is_called() -> None:
    assert last_value(run_code(F1, timeout=120)) == [["m0", "m2"], ["m0", "m2"]]


F2 = r"""
import gc, os, sys, threading, time, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook
from torch._dynamo import convert_frame
from unihook_torch import _compile

d_ready, b_has = threading.Event(), threading.Event()
real = convert_frame.compile_lock
armed = [True]


def callers():
    frame, names = sys._getframe(2), []
    for _ in range(4):
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


class Watched:
    # dynamo's lock; on B, inside `compiles_held`, the collector runs (as any allocation can make
    # it) once D holds `_holding` and asks for this lock
    def __enter__(self):
        me = threading.current_thread().name
        if me == "D" and _compile._holding._is_owned():
            d_ready.set()
        r = real.__enter__()
        if me == "B" and armed[0] and "compiles_held" in callers():
            armed[0] = False
            b_has.set()
            d_ready.wait(1)  # (set where D holds `_holding` and waits for this lock)
            time.sleep(0.2)
            gc.collect()
        return r

    def __exit__(self, *e):
        return real.__exit__(*e)

    def __repr__(self):  # (its owner: unihook reads it)
        return repr(real)


class Dropper:
    def __init__(self, h):
        self.h, self.me = h, self

    def __del__(self):
        self.h.remove()


Dropper(unihook.register_module_forward_pre_hook(lambda m, a: None, backend="torch"))
gc.disable()
convert_frame.compile_lock = Watched()
lin = torch.nn.Linear(1, 1)


def b():
    unihook.register_module_forward_hook(lambda m, a, o: None, backend="torch")


def d():
    b_has.wait(5)
    # what a registration runs when it drops the compiled frames (the first one to switch
    # dynamo's hook guards on, or a global one)
    _compile.forget_compiled()


tb = threading.Thread(target=b, name="B", daemon=True)
td = threading.Thread(target=d, name="D", daemon=True)
td.start()
tb.start()
tb.join(4)
td.join(1)
print([tb.is_alive(), td.is_alive()], flush=True)
os._exit(0)
"""


def test_finalizer_removing_a_global_hook_under_dynamos_lock_does_not_deadlock() -> None:
    try:
        done = run_code(F2, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung")
    assert last_value(done) == [False, False]


F3 = r"""
import logging, threading, time, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook
from torch._dynamo.utils import counters

messages = []


class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())


logging.getLogger("torch._dynamo").addHandler(Keep())
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
other = torch.nn.Linear(1, 1)
keep = unihook.register_forward_hook(m[0], lambda mod, a, o: None)
f = torch.compile(m, backend="eager")
x = torch.ones(2, 3)
f(x)


def graphs():
    return counters["stats"]["unique_graphs"]


def churn():
    unihook.register_forward_hook(other, lambda mod, a, o: None).remove()


def on_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


g0 = graphs()
for _ in range(3):
    churn()
    f(x)
same_thread = graphs() - g0
g0 = graphs()
for _ in range(3):
    on_thread(churn)
    f(x)
fresh_threads = graphs() - g0
done, n = threading.Event(), [0]


def runner():
    while not done.is_set():
        f(x)
        n[0] += 1


r = threading.Thread(target=runner)
r.start()
for _ in range(10):
    on_thread(churn)
    time.sleep(0.05)
done.set()
r.join()
limit = any("recompile_limit" in message for message in messages)
print([same_thread, fresh_threads, limit])
"""


def test_hooks_from_new_threads_on_other_modules_do_not_recompile() -> None:
    assert last_value(run_code(F3, timeout=120)) == [0, 0, False]


F4 = r"""
import gc, os, threading, time, warnings
warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook
import unihook._module_backward as MB
from torch._dynamo import convert_frame
from unihook._locks import held_here

b_in, c_has = threading.Event(), threading.Event()
real = convert_frame.compile_lock
inverted = []
class Watched:
    def __enter__(self):
        if held_here():
            inverted.append(threading.current_thread().name)
        r = real.__enter__()
        if threading.current_thread().name == "C":
            c_has.set()
        return r
    def __exit__(self, *e):
        return real.__exit__(*e)

    def __repr__(self):  # (its owner: unihook reads it)
        return repr(real)

realm = MB._lock.mutex
armed = [True]
class Mutex:
    # the registry's mutex; on B, the collector runs inside (as any allocation can make it)
    # once C holds dynamo's lock
    def __enter__(self):
        r = realm.__enter__()
        if threading.current_thread().name == "B" and armed[0]:
            armed[0] = False
            b_in.set(); c_has.wait(5); time.sleep(0.2)
            gc.collect()
        return r
    def __exit__(self, *e):
        return realm.__exit__(*e)

    def __repr__(self):  # (its owner: unihook reads it)
        return repr(realm)
    def _is_owned(self):
        return realm._is_owned()

class Dropper:
    def __init__(self, h):
        self.h, self.me = h, self
    def __del__(self):
        self.h.remove()

Dropper(unihook.register_module_forward_pre_hook(lambda m, a: None, backend="torch"))
gc.disable()
lin = torch.nn.Linear(1, 1)
unihook.register_forward_hook(lin, lambda m, a, o: None)  # (the guards' switch made on main)
convert_frame.compile_lock = Watched()
MB._lock.mutex = Mutex()
def b():
    unihook.register_full_backward_hook(lin, lambda m, gi, go: None)
def c():
    b_in.wait(5)
    unihook.register_module_full_backward_hook(lambda m, gi, go: None, backend="torch")
tb = threading.Thread(target=b, name="B", daemon=True)
tc = threading.Thread(target=c, name="C", daemon=True)
tb.start(); tc.start(); tb.join(4); tc.join(1)
print([tb.is_alive(), tc.is_alive(), sorted(set(inverted))], flush=True)
os._exit(0)
"""


def test_finalizer_removing_a_global_hook_inside_a_registration_does_not_deadlock() -> None:
    try:
        done = run_code(F4, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung")
    assert last_value(done) == [False, False, []]


F5 = r"""
import threading, warnings

warnings.filterwarnings("ignore")
import torch, unihook
from unihook.recipes.stats import ActivationStats

out = []
for same_thread in (True, False):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    m.register_forward_pre_hook(lambda mod, a: None)  # (the root takes torch's hook path)
    go, made, box = threading.Event(), threading.Event(), []

    def pause(mod, a, o):
        if not go.is_set():
            go.set()
            if same_thread:
                box.append(ActivationStats(m, sync=False))
            else:
                made.wait(5)

    h = m[0].register_forward_hook(pause)
    x = torch.ones(2, 3, requires_grad=True)

    def run():
        try:
            m(x).sum().backward()
            m(x).sum().backward()
            out.append("ok")
        except Exception as e:
            out.append(repr(e))

    if same_thread:
        run()
    else:
        t = threading.Thread(target=run)
        t.start()
        go.wait(5)
        box.append(ActivationStats(m, sync=False))
        made.set()
        t.join(10)
    h.remove()
    box[0].remove()
print(out)
"""


def test_activation_stats_made_during_a_forward_of_its_model() -> None:
    assert last_value(run_code(F5, timeout=60)) == ["ok", "ok"]
