# ruff: noqa: E501  (the child programs)
"""helper-98's attack on 19b7542 (`_compile.watch_hooks`'s `_drop_owed`: once a switch-on of
dynamo's hook guards found code compiled blind, every registration drops it until one drop
finishes, and a switch-off while a drop is owed marks None; `_compiled_blind`: a newest code
that died counts as compiled), and the state it builds on (h93's `_compiled_blind`, h96's
attack).

    cd /tmp/h98 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h98:/tmp/h98/backends \
        /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_attack_h98.py

(about 25 s on a quiet machine; UNIHOOK_SLOW_ATTACKS set adds the Ctrl-C sweeps, the
timing test, FINDING 5's race and longer generated runs: ~3.5 min in all)

HELD (plain tests below unless marked probe):
- generated sequences with a second thread (random; in the attack 10 seeds x 40 steps, the
  test runs 1 x 10, 4 x 20 with UNIHOOK_SLOW_ATTACKS): each step the other thread, after a random 0-4 ms, registers / removes
  / registers-and-removes a unihook hook on an unrelated module, compiles a fresh function
  (backend fast or 10 ms slow, holding dynamo's lock), or calls the compiled model, while the
  main thread registers or removes a scaling forward hook on the model, resets dynamo or
  recompiles, then at once calls the compiled model (the other thread still running): every
  call equals eager's (0 of 400 mismatches);
- a registration made inside a compiled forward (kept, or a register/remove pair on an
  unrelated module) while another thread makes its first registration at the same moment
  (a barrier, 0-2 ms apart; 30 + 20 runs): the compiled call's output is eager's, and a hook
  added afterwards on the model is seen (but see FINDING 3: the other thread's registration
  raised once per process, and FINDING 5: the compiled call failed once; the test runs
  behind UNIHOOK_SLOW_ATTACKS for that reason);
- Ctrl-C sweep (a KeyboardInterrupt raised at the entry of each Python function called by a
  registration, in turn: 96 call points, each in a fresh model compiled blind, the
  registration on an unrelated module): 89 of 96 leave the blind model dropped at the next
  registration (the hook on the model seen), the switch interval 5 ms, ``_switched`` False,
  ``_drop_owed`` False, no token left and the guards' default back once every hook is gone.
  At 9ca6b26 (before 19b7542) 30 points failed: 19b7542 fixed those from the end of the
  lock block on (h96's FINDING 2); the 7 still failing are FINDING 2 below. (Sweeping line
  events instead of calls leaks the registry mutex, but at points where CPython never
  delivers a signal: between a ``with`` body's end and its ``__exit__`` call.)
- Ctrl-C sweep over the last hook's removal (the switch-off: 37 call points, the removal
  retried or not), then a model compiled and a hook added: seen, state back (2 x 37);
- random Ctrl-C storm (``_thread.interrupt_main`` 0-3 ms into register/remove pairs over a
  model compiled blind, half the time beside another thread's first registration; 60 + 20
  runs, every one interrupted): a hook added afterwards is seen, state back;
- hooks whose calls register and remove hooks (a forward pre hook and a full backward hook
  adding forward / full backward hooks and removing them, by a plan an eager copy shares),
  over a model compiled blind first, random resets, both nn-module modes (6 seeds x 15
  steps each): outputs, input gradients and hook calls eager's;
- (probe) switch-on/off cycles racing compiles: a thread compiling fresh functions (0-4 ms
  backends) while the main thread registers, removes and pairs hooks on an unrelated module
  at random; then one switch-on and a hook on each function's model (3 x 60 and 23 x
  20 functions): all seen but one (FINDING 4);
- (probe) a Ctrl-C landing in `forget_compiled`'s invalidation between
  ``extra.invalidate(...)`` and ``guards.cache_entry = None`` (another thread inside a
  compiled frame), then the owed drop resetting, the models deleted, ``reset()``: no crash
  (3 runs each nn-module mode), the hook seen;
- (probe, measurement) a register/remove pair with dynamo imported: 28-30 us (9ca6b26:
  27 us) with nothing compiled, 33-38 us (31 us) beside a model compiled with the guards
  on: no regression outside FINDING 1's state;
- (probe) no deadlock: a thread's compile held in its backend (dynamo's lock held) until
  another thread's first registration waits inside its drop, then the backend registers a
  hook itself (the drop owed: it re-enters dynamo's RLock, invalidates instead of
  resetting, being inside the conversion): every thread done, both hooks in, a hook added
  next on the model compiled blind before seen.

FINDINGS (strict xfails below for those open; each asserts the right behaviour):

1. FIXED (`_compiled` takes dynamo's record of the last code, the weak reference its tracker
   keeps, not the code: a drop frees the code, not the record). (high, performance; a
   REGRESSION of 19b7542: 9ca6b26 passes) once anything was compiled
   and then dropped, every register/remove pair drops all compiled code again, as long as
   nothing compiles in between: `forget_compiled` kills every code object, so the switch-off
   mark is ``(n, dead)``, and since 19b7542 a dead newest code counts as "compiled since"
   (`_compiled_blind`), so the next switch-on drops again, and so on. This brings back
   helper-91's FINDING 3: each drop enters `_held_gil` (switch interval 0.1 s), so beside
   one busy Python thread (a progress bar's, a prefetcher's) each pair takes ~100 ms. Repro::

       cm = torch.compile(torch.nn.Linear(3, 3), backend="eager"); cm(x)   # compiled once
       for _ in range(50):   # an eager loop, a monitor hook per step on another module
           unihook.register_forward_hook(lin, lambda *a: None).remove()
       # -> 50 calls of forget_compiled (9ca6b26: 1); beside a busy thread 103 ms a pair
       #    (9ca6b26: 0.08 ms); every compiled model not called in the loop recompiles

   Expected: one drop (a drop that finished leaves nothing blind: e.g. the mark taken at a
   switch-off after a finished drop, with nothing compiled since, is not "dead = compiled",
   or a compile counter the reset does not restart).
2. FIXED (`_drop_owed` set before the switch-on, until the look). (medium, silent skipped
   hook for good; not a regression of 19b7542, whose fix narrowed
   it: 9ca6b26 fails at 30 call points, HEAD at 7; 0c76291 dropped at every switch-on) h96's
   FINDING 2 survives in the window between the switch-on and the assignment of
   `_drop_owed`: a Ctrl-C landing in ``_set_hook_guards_skipped``, ``_hook_guards``,
   ``_compiled_blind``, ``_compiled``, ``_converter`` or ``_alive`` (the entry of any of
   them) undoes the registration while ``_drop_owed`` is still False; the undo's switch-off
   takes a new mark that counts the blind code as seen, and the model compiled before
   unihook's first hook ignores every unihook hook from then on. Repro (the Ctrl-C
   simulated at `_compiled_blind`'s entry)::

       cm = torch.compile(m, backend="eager"); cm(x)    # blind
       unihook.register_forward_hook(other, f)         # Ctrl-C in _compiled_blind
       unihook.register_forward_hook(m[2], double)     # mark says: nothing new
       cm(x)   # -> hook not called, output not doubled

   Expected: eager's (e.g. `release` marks None when the switch-on it undoes had not
   reached `_drop_owed`, or the blindness is read before ``_switched = True``).
3. FIXED (the walks compare codes by id and read ``co_filename`` with getattr). (medium-high,
   crash of a registration; not a regression: 9ca6b26 the same) a thread's
   registration while the main thread's compiled forward is being recompiled with a unihook
   registration inside it (the first torch hook, on one of the model's modules) raises
   ``TypeError: unhashable type: 'dict'`` from `_compile._running_elsewhere`
   (``frame.f_code in codes``, through `hooks_changeable`): a frame object of the other
   thread's stack answers ``f_code`` with a dict, a dangling frame (the main thread was in
   dynamo's ``convert_frame``, FakeTensorMode's ``traceback.extract_stack``). Once per
   process, at the first such compile, 3 of 3 runs and every run of the attack's
   uninstrumented programs; instrumenting the walk hides it. The same walk is in `_converting_anywhere`
   and `_compiled_frame_elsewhere`; a dangling frame read may as well crash the process.
   Repro: ``cm(x)`` blind with ``m.mode = 0``; ``m.mode = 1`` (forward then runs
   ``unihook.register_forward_hook(self.b, ...)``); a thread at a barrier with the main
   thread registers a forward hook on an unrelated module 0.2-1 ms later while the main
   thread calls ``cm(x)`` -> the thread's registration raises TypeError. Expected: the
   registration returns its handle (e.g. the walk tolerates a frame that is not one, or
   reads ``f_code`` only of frames it can trust).
4. (medium, silent skipped hook for good; not a regression of 19b7542: 9ca6b26 the same) a
   frame compiled blind on another thread whose cache entry is installed after the switch-on's
   drop stays blind: dynamo builds the frame's guards (reading the setting: off) and lets go
   of its compile lock in Python (``with compile_lock, ...`` in ``convert_frame``), and only
   then does its C frame callback install the entry. A switch-on waiting for that lock
   (`forget_compiled`) gets the GIL at the eval breaker right after the lock's ``__exit__``
   call, counts the frame's code as compiled (blind: a drop), drops (invalidating, or
   resetting) every entry there is, the new one not yet among them, and clears `_drop_owed`;
   the entry goes in, blind, and the next switch-off's mark counts it as seen: the compiled
   function ignores every unihook hook on its model from then on. Repro (the GIL switch made
   certain by a 0.1 s sleep after ``CatchErrorsWrapper.__call__`` returns, on the compiling
   thread only; a bare ``time.sleep(0)`` there is enough under load)::

       C: cf = torch.compile(lambda t: mC(t) + 1, backend="eager"); cf(x)   # no hook yet
       main, in that window: anchor = unihook.register_forward_hook(other, f)
       C installs its entry; main: unihook.register_forward_hook(mC[2], double); cf(x)
       # -> not doubled, hook not called

   Unpatched: one run of ~25 of a thread compiling 20 fresh functions (0-4 ms backends)
   while the main thread cycles hooks on an unrelated module (switch-ons and -offs at random)
   left one function blind (function 10 of seed 4; not reproduced in 24 more runs).
   Expected: eager's (e.g. a drop made while another thread is still inside
   ``convert_frame`` or dynamo's frame callback stays owed, or the next switch-off marks
   None).
5. (medium, crash of a compiled call; a race, not a regression: the traced path predates
   19b7542) a compiled forward making a unihook registration is traced by dynamo down to
   `unihook_torch._torch` (``sys.modules.get("torch")``, through ``call_owner`` ->
   ``unihook_register_forward_hook`` -> ``_module`` -> ``_owns``), and dynamo wraps
   ``sys.modules``, iterating its keys (``VariableBuilder._wrap``: ``all(is_literal(k) for k
   in value)``): another thread importing a module meanwhile (here the other thread's first
   registration, importing unihook's lazily loaded modules; a data loader's lazy import
   would do) fails the compiled call with ``InternalTorchDynamoError: RuntimeError:
   dictionary changed size during iteration``. Seen once in about 25 runs of the
   ``INSIDE`` program (mode 2: a register/remove pair inside the forward, seed 5); a thread
   churning ``sys.modules`` beside 13 compiles did not reproduce it in the time left, nor
   did the slow test's 12 runs once. Test:
   non-strict xfail behind UNIHOOK_SLOW_ATTACKS (a strict one would fail the runs the race
   misses). Expected: the compiled call runs (e.g. unihook's code that dynamo traces before
   its graph break reads no ``sys.modules``, or breaks the graph first).

Observations (not findings): while a drop is owed every registration on every thread waits
for dynamo's compile lock, so beside a long compile (inductor's seconds) a registration that
was not the switch-on now blocks for the whole compile (before 19b7542 it returned at once,
skipping the hook: h96's FINDING 3); the README says so only through h96's test note.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

SLOW = bool(os.environ.get("UNIHOOK_SLOW_ATTACKS"))

THREADED = """
import random, sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
x = torch.linspace(-1, 1, 12).reshape(4, 3)
O = torch.nn.Linear(2, 2)


def model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def play(seed, steps):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    m, tm = model(), model()
    cm = torch.compile(m, backend="eager", dynamic=rng.choice([None, False]))
    mine, theirs, bad = [], [], []
    for step in range(steps):
        job = rng.choice(["reg", "rem", "pair", "compile", "compile_slow", "call", "none"])
        delay, k = rng.random() * 0.004, rng.random()

        def other():
            time.sleep(delay)
            if job == "reg":
                theirs.append(unihook.register_forward_hook(O, lambda *a: None))
            elif job == "rem" and theirs:
                theirs.pop().remove()
            elif job == "pair":
                unihook.register_forward_pre_hook(O, lambda *a: None).remove()
            elif job.startswith("compile"):
                def backend(gm, inputs):
                    if job == "compile_slow":
                        time.sleep(0.01)  # holding dynamo's lock
                    return gm.forward
                torch.compile(lambda t: tm(t) * k, backend=backend)(x)
            elif job == "call":
                cm(x)

        t = threading.Thread(target=other)
        t.start()
        op = rng.choice(["reg", "reg", "rem", "rem", "none", "reset", "recompile"])
        if op == "reg":
            mine.append(unihook.register_forward_hook(m[rng.choice([0, 2])], lambda mod, a, o: o * 1.5))
        elif op == "rem" and mine:
            mine.pop(rng.randrange(len(mine))).remove()
        elif op == "reset":
            t.join()
            torch._dynamo.reset()
        elif op == "recompile":
            cm = torch.compile(m, backend="eager", dynamic=rng.choice([None, False]))
        want = m(x)
        got = cm(x)  # the other thread may still be registering or compiling
        if not torch.allclose(got, want):
            bad.append((seed, step, op, job))
        t.join()
    for h in mine + theirs:
        h.remove()
    return bad


bad = []
for seed in range(int(sys.argv[1])):
    bad += play(seed, int(sys.argv[2]))
print(repr(bad))
"""


def test_held_generated_two_thread_sequences_match_eager() -> None:
    """Registrations, removals and compiles on a second thread beside the main thread's
    registrations, resets and calls: each compiled call is eager's."""
    from children import last_value, run_code

    seeds, steps = ("4", "20") if SLOW else ("1", "10")
    assert last_value(run_code(THREADED, seeds, steps, timeout=600)) == []


INSIDE = """
import random, sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
x = torch.linspace(-1, 1, 12).reshape(4, 3)
O = torch.nn.Linear(2, 2)
rng = random.Random(int(sys.argv[1]))


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
        self.mode, self.keep = 0, []

    def forward(self, x):
        if self.mode == 1:
            self.keep.append(unihook.register_forward_hook(self.b, lambda m, a, o: o * 2))
        y = self.b(self.a(x).tanh())
        if self.mode == 2:
            unihook.register_forward_hook(O, lambda *a: None).remove()
        return y


def drop(m):
    for h in m.keep:
        h.remove()
    m.keep.clear()


bad = []
for it in range(int(sys.argv[2])):
    torch.manual_seed(it)
    m = M()
    cm = torch.compile(m, backend="eager")
    cm(x)  # blind
    mode = int(sys.argv[3])
    m.mode = mode
    barrier, hs = threading.Barrier(2), []

    def other(d=rng.random() * 0.002):
        barrier.wait()
        time.sleep(d)
        try:
            hs.append(unihook.register_forward_hook(O, lambda *a: None))
        except Exception as exc:
            bad.append((it, "thread", type(exc).__name__))

    t = threading.Thread(target=other)
    t.start()
    barrier.wait()
    got = cm(x)
    t.join(60)
    drop(m)
    want = m(x)  # eager: the same registration inside
    drop(m)
    m.mode = 0
    if not torch.allclose(got, want):
        bad.append((it, "differs"))
    h = unihook.register_forward_hook(m.b, lambda mod, a, o: o * 3)
    if not torch.allclose(cm(x), m(x)):
        bad.append((it, "after"))
    h.remove()
    for h in hs:
        h.remove()
print(repr(bad))
"""


@pytest.mark.skipif(not SLOW, reason="~20 s: set UNIHOOK_SLOW_ATTACKS")
def test_held_a_pair_inside_a_compiled_forward_beside_a_first_registration() -> None:
    """A register/remove pair inside a compiled forward while another thread registers its
    first hook: the compiled call is eager's, a hook added afterwards is seen."""
    from children import last_value, run_code

    assert last_value(run_code(INSIDE, "5", "4", "2", timeout=240)) == []


def test_finding_3_registration_beside_a_compiled_forward_registering_raises_type_error() -> None:
    from children import last_value, run_code

    assert last_value(run_code(INSIDE, "2", "2", "1", timeout=240)) == []


REPEATED_DROPS = """
import threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile

drops = [0]
forget = _compile.forget_compiled


def counted():
    drops[0] += 1
    forget()


_compile.forget_compiled = counted
lin = torch.nn.Linear(2, 2)
x = torch.ones(1, 3)
cm = torch.compile(torch.nn.Linear(3, 3), backend="eager")
cm(x)  # compiled once, before any unihook hook


def pairs(n):
    t = time.perf_counter()
    for _ in range(n):
        unihook.register_forward_hook(lin, lambda *a: None).remove()
    return (time.perf_counter() - t) / n


pairs(20)
alone = drops[0]
timed = None
if __import__("sys").argv[1] == "timed":
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(100))

    thread = threading.Thread(target=busy)
    thread.start()
    timed = pairs(10)
    stop.set()
    thread.join()
print(repr((alone, timed)))
"""


def test_finding_1_every_pair_drops_again_after_the_first_drop() -> None:
    from children import last_value, run_code

    drops, _ = last_value(run_code(REPEATED_DROPS, "count", timeout=240))
    assert drops <= 1, drops


@pytest.mark.skipif(not SLOW, reason="timing-based: set UNIHOOK_SLOW_ATTACKS")
def test_finding_1_a_pair_beside_a_busy_thread_costs_a_switch_interval() -> None:
    from children import last_value, run_code

    _, timed = last_value(run_code(REPEATED_DROPS, "timed", timeout=240))
    assert timed < 0.01, timed


INTERRUPTED_SWITCH_ON = """
import warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile

x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
compiled = torch.compile(m, backend="eager")
plain = compiled(x)  # compiled blind: no unihook hook yet
blind = _compile._compiled_blind


def interrupted(dynamo):  # a Ctrl-C landing at the entry of _compiled_blind
    _compile._compiled_blind = blind
    raise KeyboardInterrupt


_compile._compiled_blind = interrupted
try:
    unihook.register_forward_hook(other, lambda *a: None)
except KeyboardInterrupt:
    pass
calls = []
h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
got = compiled(x)
h.remove()
print(repr((torch.allclose(got, 2 * plain), calls)))
"""


def test_finding_2_interrupt_before_drop_owed_is_set_leaves_the_blind_model() -> None:
    from children import last_value, run_code

    assert last_value(run_code(INTERRUPTED_SWITCH_ON, timeout=240)) == (True, [1])


SWEEP = """
import os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile

x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)


class Inject:  # a KeyboardInterrupt at the entry of the n-th Python function called
    def __init__(self, n):
        self.n, self.seen, self.where = n, 0, None

    def __call__(self, frame, event, arg):
        if event == "call" and self.where is None:
            self.seen += 1
            if self.seen == self.n:
                self.where = frame.f_code.co_name
                raise KeyboardInterrupt
        return None


bad, n = [], int(sys.argv[1])
while True:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    compiled = torch.compile(m, backend="eager")
    plain = compiled(x)  # blind
    inject, first = Inject(n), None
    sys.settrace(inject)
    try:
        first = unihook.register_forward_hook(other, lambda *a: None)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    calls = []
    h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
    got = compiled(x)
    h.remove()
    if first is not None:
        first.remove()
    state = (sys.getswitchinterval(), _compile._switched, _compile._drop_owed,
             len(_compile._watching), _compile._hook_guards_skipped(torch._dynamo))
    if not (torch.allclose(got, 2 * plain) and calls == [1] and state == (0.005, False, False, 0, True)):
        bad.append((n, inject.where))
    if inject.where is None:
        break
    n += 1
print(repr(bad))
"""


@pytest.mark.skipif(not SLOW, reason="a sweep of ~100 compiles (~20 s): set UNIHOOK_SLOW_ATTACKS")
def test_finding_2_ctrl_c_sweep_over_a_first_registration() -> None:
    from children import last_value, run_code

    assert last_value(run_code(SWEEP, "1", timeout=600)) == []


STRADDLING = """
import sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from torch._dynamo import convert_frame

x = torch.ones(4, 3)
O = torch.nn.Linear(2, 2)
torch.manual_seed(0)
mC = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
window, C_ident = threading.Event(), []
original = convert_frame.CatchErrorsWrapper.__call__


def patched(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    # dynamo's lock is let go, the frame's code made and its guards built: a GIL switch here
    # (the eval breaker after the lock's __exit__ call) before the C callback installs the entry
    if threading.get_ident() in C_ident and not window.is_set():
        window.set()
        time.sleep(float(sys.argv[1]))
    return result


convert_frame.CatchErrorsWrapper.__call__ = patched


def f(t):
    return mC(t) + 1


cf = torch.compile(f, backend="eager")
plain = []


def serve():
    C_ident.append(threading.get_ident())
    plain.append(cf(x))


C = threading.Thread(target=serve)
C.start()
assert window.wait(30)
anchor = unihook.register_forward_hook(O, lambda *a: None)  # the switch-on: drops what is blind
C.join(30)
calls = []
h = unihook.register_forward_hook(mC[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
got = cf(x)
h.remove()
anchor.remove()
print(repr((torch.allclose(got, 2 * (plain[0] - 1) + 1), calls)))
"""


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 4: a frame whose compile straddles the switch-on's drop (entry installed after it) stays blind for good",
)
def test_finding_4_a_compile_straddling_the_switch_on_drop_stays_blind() -> None:
    """(The window half a second: at 0.1 s a loaded machine's switch-on, slower, came after the
    entry went in, which it dropped: an XPASS, 1 of 3 runs beside an attacker's load.)"""
    from children import last_value, run_code

    assert last_value(run_code(STRADDLING, "0.5", timeout=240)) == (True, [1])


CTRL_C_STORM = """
import _thread, random, sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
x = torch.ones(4, 3)
O = torch.nn.Linear(2, 2)
rng = random.Random(int(sys.argv[1]))
bad, landed = [], 0
for it in range(int(sys.argv[2])):
    torch.manual_seed(it)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    cm = torch.compile(m, backend="eager")
    plain = cm(x)  # blind
    hs, theirs = [], []
    d = rng.random() * 0.003
    two = rng.random() < 0.5
    go = threading.Barrier(3 if two else 2)
    def ctrl_c():
        go.wait()
        time.sleep(d)
        _thread.interrupt_main()
    def other():
        go.wait()
        theirs.append(unihook.register_forward_hook(O, lambda *a: None))
    t = threading.Thread(target=ctrl_c)
    t2 = threading.Thread(target=other) if two else None
    t.start()
    if t2: t2.start()
    try:
        go.wait()
        for k in range(3):
            h = unihook.register_forward_pre_hook(O, lambda *a: None)
            hs.append(h)
            h.remove()  # (cut short: removed again below)
            hs.remove(h)
        time.sleep(0.01)
        t.join()  # (the interrupt lands in here even when it comes late, under load)
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        landed += 1
    t.join()
    if t2: t2.join()
    for h in hs:
        h.remove()
    calls = []
    h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
    got = cm(x)
    h.remove()
    for h in theirs:
        h.remove()
    state = (sys.getswitchinterval(), _compile._switched, _compile._drop_owed,
             len(_compile._watching), _compile._hook_guards_skipped(torch._dynamo))
    if not (torch.allclose(got, 2 * plain) and calls == [1] and state == (0.005, False, False, 0, True)):
        bad.append((it, d, two, torch.allclose(got, 2 * plain), calls, state))
print(landed, repr(bad))
"""


def test_held_random_ctrl_c_over_register_remove_pairs_beside_a_first_registration() -> None:
    """``_thread.interrupt_main`` 0-3 ms into register/remove pairs, half the time beside
    another thread's first registration, each over a model compiled blind: afterwards a hook
    on the model is seen and unihook's state is back."""
    from children import run_code

    out = run_code(CTRL_C_STORM, "1", "10", timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].endswith(" []"), out.stdout[-500:]


REMOVAL_SWEEP = """
import os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook
from unihook_torch import _compile

x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
RETRY = sys.argv[2] == "retry"


class Inject:
    def __init__(self, n):
        self.n, self.seen, self.where = n, 0, None

    def __call__(self, frame, event, arg):
        if event == "call" and self.where is None:
            self.seen += 1
            if self.seen == self.n:
                self.where = frame.f_code.co_name
                raise KeyboardInterrupt
        return None


bad, n = [], int(sys.argv[1])
while True:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    first = unihook.register_forward_hook(other, lambda *a: None)
    inject = Inject(n)
    sys.settrace(inject)
    try:
        first.remove()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    if RETRY:
        first.remove()
    compiled = torch.compile(m, backend="eager")
    plain = compiled(x)  # blind unless the guards stayed on
    calls = []
    h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
    got = compiled(x)
    h.remove()
    first.remove()
    state = (sys.getswitchinterval(), _compile._switched, _compile._drop_owed,
             len(_compile._watching), _compile._hook_guards_skipped(torch._dynamo))
    if not (torch.allclose(got, 2 * plain) and calls == [1] and state == (0.005, False, False, 0, True)):
        bad.append((n, inject.where, torch.allclose(got, 2 * plain), calls, state))
    if inject.where is None:
        break
    n += 1
print(n, repr(bad))
"""


@pytest.mark.skipif(not SLOW, reason="a sweep of ~40 compiles: set UNIHOOK_SLOW_ATTACKS")
@pytest.mark.parametrize("retry", ["noretry", "retry"])
def test_held_ctrl_c_sweep_over_the_last_removal(retry: str) -> None:
    """A KeyboardInterrupt at each Python call of the last hook's removal (the switch-off),
    the removal retried or not, then a model compiled and a hook added: seen; state back."""
    from children import run_code

    out = run_code(REMOVAL_SWEEP, "1", retry, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].endswith(" []"), out.stdout[-500:]


HOOKS_REGISTERING_HOOKS = """
import random, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
if sys.argv[1] == "specialized":
    torch._dynamo.config.inline_inbuilt_nn_modules = False


def model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def rig(m, plan, log, tag):
    # hooks whose calls register and remove other hooks, by a plan shared by both copies
    live, n = [], [0]

    def act(kind):
        i = n[0]
        n[0] += 1
        a = plan[i % len(plan)]
        if a == "addfwd":
            live.append(unihook.register_forward_hook(m[2], lambda mod, ar, o: (log.append(tag + "f"), o * 1.5)[1]))
        elif a == "addbwd":
            live.append(unihook.register_full_backward_hook(m[0], lambda mod, gi, go: (log.append(tag + "b"), None)[1]))
        elif a == "rem" and live:
            live.pop(0).remove()

    h1 = unihook.register_forward_pre_hook(m[0], lambda mod, ar: (act("pre"), None)[1])
    h2 = unihook.register_full_backward_hook(m[2], lambda mod, gi, go: (act("bwd"), None)[1])
    return [h1, h2], live


def play(seed, steps):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    me = model()
    mc = model()
    mc.load_state_dict(me.state_dict())
    plan = [rng.choice(["addfwd", "addbwd", "rem", "rem", "none"]) for _ in range(17)]
    le, lc = [], []
    cm = torch.compile(mc, backend="eager", dynamic=rng.choice([None, False]))
    cm(torch.ones(2, 3))  # blind first
    he, live_e = rig(me, plan, le, "")
    hc, live_c = rig(mc, plan, lc, "")
    bad = []
    for step in range(steps):
        if rng.random() < 0.1:
            torch._dynamo.reset()
        x = torch.linspace(-1, 1, 12).reshape(4, 3).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        del le[:], lc[:]
        ye = me(x); ye.sum().backward()
        try:
            yc = cm(x2); yc.sum().backward()
        except Exception as e:
            bad.append((seed, step, repr(e)[:200])); break
        if le != lc or not torch.allclose(ye, yc) or not torch.allclose(x.grad, x2.grad):
            bad.append((seed, step, le, lc)); break
    for h in he + hc + live_e + live_c:
        h.remove()
    return bad


out = []
for s in range(int(sys.argv[2])):
    out += play(s, int(sys.argv[3]))
print(repr(out))
"""


@pytest.mark.skipif(not SLOW, reason="~30 s: set UNIHOOK_SLOW_ATTACKS")
@pytest.mark.parametrize("mode", ["inline", "specialized"])
def test_held_hooks_that_register_and_remove_hooks_under_compile(mode: str) -> None:
    """A forward pre hook and a full backward hook whose calls register and remove forward
    and full backward hooks (a plan shared by an eager copy), over a model compiled blind
    first, resets at random: outputs, input gradients and hook calls eager's."""
    from children import last_value, run_code

    assert last_value(run_code(HOOKS_REGISTERING_HOOKS, mode, "6", "15", timeout=600)) == []


@pytest.mark.skipif(not SLOW, reason="a race: up to 12 runs (~1 min): set UNIHOOK_SLOW_ATTACKS")
@pytest.mark.xfail(
    strict=False,  # a race seen in about 1 of 10 runs: strict would fail the runs it misses
    reason="FINDING 5: tracing a registration inside a compiled forward iterates sys.modules while another thread imports",
)
def test_finding_5_a_registration_traced_beside_an_import_fails_the_compiled_call() -> None:
    from children import run_code

    for seed in range(12):
        out = run_code(INSIDE, str(seed), "2", "2", timeout=240)
        assert out.returncode == 0, out.stderr[-1500:]
