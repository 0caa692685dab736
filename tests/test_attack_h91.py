# ruff: noqa: E501  (the child program in INSIDE)
"""helper-91's attack on bbc78bf: `GlobalTable` keeping insertion order (move_to_end, a key
put in again goes last), `WatchedPinned` (backward dispatchers pinned inside
`hooks_changeable`), and module hooks registered inside a compiled function (made outside
dynamo, with a graph break).

    cd /tmp/h91 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h91:/tmp/h91/backends \
        /work/main/.venv/bin/python -m pytest -q tests/test_attack_h91.py

(about 65 s; FINDING 6's test stops at its first failure, usually within 10 s, at most 40 s)

HELD (plain tests below):
- generated sequences (random, 3 seeds x 120) of native / unihook registrations, removals
  (twice), a library's ``d[k] = f``, ``del d[k]``, ``d.pop``, ``d.popitem(last=...)``,
  ``d.clear()``, ``d.update``, ``d.setdefault``, ``move_to_end`` of native AND unihook keys,
  fired on ``register_buffer``: the hooks run in the order torch's own dict gives (unihook's
  registrations made natively as the oracle), and the native hooks left once unihook's went
  are the same, in that order, in torch's original dict;
- ``copy.copy`` / ``copy.deepcopy`` / ``==`` / ``reversed`` / ``repr`` against the oracle;
- a hook popped by a library (``popitem``) and then its unihook handle removed: nothing keeps
  it alive;
- a thread registering / removing unihook and native hooks while another registers buffers:
  no "OrderedDict mutated during iteration", no registration lost, the origin back at the end;
- a registration hook that registers and removes other hooks (unihook's and native) while it
  runs: the running loop reads the hooks there were as it started, the next one all of them;
- module hooks (forward pre / forward with prepend, always_call, with_kwargs; full backward,
  full backward pre; global forward and full backward) registered inside compiled functions
  (in a forward hook, in a module's forward, on the compiled module itself, replaced across
  calls, under no_grad), backend="eager" and "aot_eager" (probes; the test runs aot_eager):
  outputs, input gradients, hook calls and the hook dicts left are eager's;
- hooks registered inside a compiled function and removed outside, and the reverse (a
  removal between two model calls inside one compiled function): eager's outputs, gradients
  and hook calls;
- torch.compile(fullgraph=True) of a function registering a buffer beside a unihook
  registration hook (h89's): runs, the hook called, torch's OrderedDict back after removal;
- ``_thread.interrupt_main`` at random points (150 steps, every one interrupted somewhere) of
  steps registering full backward / backward pre / global full backward hooks, forward +
  backward, a removal: once every handle is removed (twice) nothing fires, no module keeps a
  hook or dispatcher, torch's ``_call_impl`` is back;
- (probes, not tests) one or two threads training a compiled model while the main thread
  registers / removes MODULE backward hooks on it (10 s): no error, no hang (the global hook
  added is FINDING 6); a training step before ``import torch._dynamo`` with two busy threads:
  2-3 ms (FINDING 3 is after the import); Ctrl-C storms with dynamo imported and a busy
  thread (interrupts landing inside `_held_gil`'s 0.1 s): the switch interval and dynamo's
  ``skip_nnmodule_hook_guards`` default back, nothing left; module forward / forward pre hooks
  registered and removed in the same inside / outside mix with backend="eager": eager's.
- (after FINDING 4's fix) frames compiled while dynamo's hook guards were off are still
  dropped at the next switch-on: compiled after a switch on and off, after
  ``torch._dynamo.reset()``, on another thread building its guards across the last hook's
  removal; frames compiled while they were on are kept and see a later hook.

FINDINGS (strict xfails below for those open; each asserts the right behaviour):

1. FIXED (`GlobalTable.__ior__`). (medium, silent wrong behaviour) ``|=`` on the global registration hook dict is not in
   place while unihook has a hook there: `GlobalTable` has ``__or__`` but no ``__ior__``, so
   ``d |= {key: hook}`` rebinds to a new plain OrderedDict. Through an alias (``d =
   module._global_buffer_registration_hooks; d |= {k: f}``) the library's hook is silently
   never registered; on the module attribute itself (``module._global_..._hooks |= {...}``)
   the table is replaced by a copy holding unihook's hook as a native one: after
   ``handle.remove()`` unihook's hook keeps firing on every register_buffer, forever, and the
   original dict never goes back. torch's OrderedDict updates in place. Repro:
   ``h = unihook.register_module_buffer_registration_hook(f, backend="torch");
   tm._global_buffer_registration_hooks |= {10**9: g}; h.remove();
   torch.nn.Module().register_buffer("b", t)`` -> f still called.
2. FIXED (reversible keys and items views, ``__ror__``, ``fromkeys``). (low) the table is not
   a drop-in OrderedDict: ``reversed(d.keys())``,
   ``reversed(d.items())``, ``reversed(d.values())`` (values() is a tuple: fine) raise
   TypeError, ``{} | d`` raises TypeError, ``d.fromkeys`` is missing; all work on torch's
   OrderedDict (and so stop working only while unihook has a global registration hook).
3. FIXED (`_compile._compiled_blind`: nothing compiled while the guards were off, nothing
   dropped: 0.8 ms against 0.9 ms before the import; skipped unless UNIHOOK_SLOW_ATTACKS is
   set: timing-based). (high, latency) with
   ``torch._dynamo`` imported (any program that compiled anything, or
   imported a library that imports dynamo) and ONE other thread running Python (a data
   loader's, a progress bar's), a training step that registers a unihook full backward hook,
   runs forward+backward and removes it takes ~100 ms instead of ~0.5 ms, the same step in
   the same process before the import (200x; two busy threads: 170 ms against 2-3 ms). The first torch hook switches dynamo's hook guards on (`watch_hooks`) and
   calls `forget_compiled`, which sets the switch interval to 0.1 s and ``time.sleep(0)``s
   (`_held_gil`): the busy thread takes the GIL and keeps it for the whole 0.1 s, every step,
   even though nothing was ever compiled. Expected: a step with dynamo imported no slower than
   a few x the same step before the import. (The README mentions ~0.3 s per pair of a GLOBAL
   hook beside a busy thread; this is any module hook, one per step, nothing compiled.)
4. Since 2026-12-02 (9b04a90: a hook change waits for another thread's compile) the served
   model's cycle depends on timing: none in 5 runs (4 idle, 1 a CI's), 13 graphs in the next
   CI run, under load: a non-strict xfail, open. FIXED but for the served model (`_compile._compiled_blind`: frames compiled while the
   guards were on stay: 6 steps -> 2 graphs, 20 steps 0.1 ms each against 45 ms; the served
   model, below, is still open: see its test). (high, performance) a unihook hook registered
   and removed each step on a module that is
   NOT part of a compiled model recompiles that model every step: each first torch hook
   (`watch_hooks` switching dynamo's hook guards on) drops every compiled frame
   (`forget_compiled` -> ``torch._dynamo.reset_code_caches``): 6 steps -> 7 graphs (13 with
   the hook on the model); with inductor each is seconds. The README says only "a hook added
   to a module without hooks then recompiles the frames that saw it". Worse, with the model
   served by another thread (inside a compiled frame, so the frames are invalidated instead of
   reset) each step costs one of dynamo's recompiles: after 8 steps the served model hits
   ``recompile_limit`` and runs eagerly for good ("last reason: unihook: a hook dynamo does
   not guard came or went"). Expected: compiles bounded, frames compiled with the guards on
   kept. Still open for the served model: its frames, compiled blind before the first hook,
   are invalidated at the first switch-on, and the served thread recompiles them after the
   step's removal turned the guards off again, blind again, so each next switch-on
   invalidates them again: a cycle, until a recompile falls wholly inside a step or the limit
   is hit. With a backend slower than a step (the test's, 50 ms a compile, as inductor's
   seconds): 7-8 graphs in 12 steps, mostly the limit; with backend="eager" 2 graphs in 5 of 6
   runs on a quiet machine, 7-10 on a loaded one.
5. FIXED (`GlobalTable._mine`: unihook's key put back stays unihook's). (medium, a removed
   hook keeps firing) a library that takes a key out and puts it back
   (``d[k] = d.pop(k)``, the move-to-end idiom, or switching a hook off and on under its key)
   on unihook's key: `__delitem__` takes it out of ``own``, `__setitem__` then puts it in the
   origin as a native hook, which unihook's ``handle.remove()`` no longer removes: it runs on
   every registration for good (and keeps the hook alive). With torch's dict (the oracle,
   unihook's registration made natively) the handle removes it. Repro:
   ``h = unihook.register_module_buffer_registration_hook(f, backend="torch"); d =
   tm._global_buffer_registration_hooks; (k,) = d; d[k] = d.pop(k); h.remove()`` -> f still
   called on ``register_buffer``. (The generated test below puts back native keys only.)
6. (open; skipped unless UNIHOOK_SLOW_ATTACKS is set: timing-based) (high, crash) two threads training one compiled model (forward + backward) while the main
   thread registers and removes full backward / backward pre hooks on its layers and, every
   third time, a global full backward hook: within seconds (6 of 6 runs, 4-20 s; the test
   tries 40 s) a thread's step raises -- dynamo's guard building ``IndexError: list index out
   of range``, ``SpeculationLogDivergence`` at unihook_torch/_global.py:122/123 (`_call`:
   whether ``type(self)._call_impl is _call_impl``, the wrapper the global hook puts in and
   takes out, differs on dynamo's restart), or unihook's ``BackendStateError`` ("expected
   unihook's forward post-hook dispatcher to have run at the end of the module call ...").
   Module hooks alone, or the global hook alone, or module forward / forward pre hooks with
   the global one, or one serving thread, or the same with the model not compiled: no failure
   in 8-10 s runs. Also fails on the parent 039fb0f (not a regression of WatchedPinned, which
   does not prevent it).
7. (open: `_compiled_blind` does not help) (high, performance) ``torch.compile(model)``
   whose forward registers a unihook forward hook
   on a submodule and removes it (the brief's "registers a hook every call"): outputs right,
   hook dicts left empty, but every call recompiles (each registration is the first torch
   hook: `forget_compiled`): ~1.4 s a call of a 3x4x2 model with backend="eager", 1800 frames
   converted in 30 calls; torch's own ``register_forward_hook`` there: 1 graph, 0.1 ms.
   Each call starts with no hook alive (guards off) and dynamo compiles, blind, ``forward``
   and the frames of unihook's registration up to its graph break (``register_forward_hook``,
   ``call_owner``, ``unihook_register_forward_hook``), which the registration's switch-on
   then has to drop, with everything else: 54 conversions, ~1.0 s a call. Only guards left on
   (or a frame's skipped hook guards known, which dynamo does not keep) would avoid it.
"""

from __future__ import annotations

import copy
import gc
import os
import random
import threading
import weakref
from collections import OrderedDict
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.modules.module as tm  # noqa: E402

import unihook  # noqa: E402

ATTR = "_global_buffer_registration_hooks"
KINDS = ("parameter", "buffer", "module")


@pytest.fixture(autouse=True)
def _clean() -> Any:
    """Each test starts and ends with torch's own dicts, empty."""
    origins = {what: getattr(tm, f"_global_{what}_registration_hooks") for what in KINDS}
    for what, origin in origins.items():
        assert type(origin) is OrderedDict and not origin, what
    yield
    for what, origin in origins.items():
        setattr(tm, f"_global_{what}_registration_hooks", origin)
        origin.clear()


class _Rec:
    def __init__(self, log: list[str], tag: str) -> None:
        self.log, self.tag = log, tag

    def __call__(self, module: Any, name: str, value: Any) -> None:
        self.log.append(self.tag)


_OPS = (
    "native", "unihook", "unihook", "remove", "remove_twice", "rewrite", "reinsert", "move",
    "pop", "popitem", "clear", "update", "setdefault", "fire", "fire",
)  # fmt: skip


def _play(ops: list[tuple[str, int, bool]], *, oracle: bool) -> Any:
    origin = getattr(tm, ATTR)
    log: list[str] = []
    fired: list[Any] = []
    handles: list[tuple[str, Any]] = []
    holder = torch.nn.Module()

    def natives(d: Any) -> list[Any]:
        mine = [h.id for tag, h in handles if tag.startswith("n")]
        return [k for k in d if k in mine or k >= 10**9]

    try:
        for n, (op, i, last) in enumerate(ops):
            d = getattr(tm, ATTR)
            keys = list(d)
            if op == "native" or (op == "unihook" and oracle):
                tag = f"{op[0]}{n}"
                handles.append((tag, tm.register_module_buffer_registration_hook(_Rec(log, tag))))
            elif op == "unihook":
                tag = f"u{n}"
                handles.append(
                    (
                        tag,
                        unihook.register_module_buffer_registration_hook(
                            _Rec(log, tag), backend="torch"
                        ),
                    )
                )
            elif op in ("remove", "remove_twice") and handles:
                _, handle = handles.pop(i % len(handles))
                handle.remove()
                if op == "remove_twice":
                    handle.remove()
            elif op == "rewrite" and keys:
                d[keys[i % len(keys)]] = _Rec(log, f"w{n}")
            elif op == "reinsert" and natives(d):  # (unihook's: FINDING 5)
                k = natives(d)[i % len(natives(d))]
                f = d[k]
                del d[k]
                d[k] = f
            elif op == "move" and keys:
                d.move_to_end(keys[i % len(keys)], last)
            elif op == "pop" and keys:
                d.pop(keys[i % len(keys)])
            elif op == "popitem" and keys:
                d.popitem(last=last)
            elif op == "clear" and i < 2:
                d.clear()
            elif op == "update":
                upd = {10**9 + n: _Rec(log, f"l{n}")}
                if keys:
                    upd[keys[i % len(keys)]] = _Rec(log, f"v{n}")
                d.update(upd)
            elif op == "setdefault":
                k = keys[i % len(keys)] if keys and last else 10**9 + n
                d.setdefault(k, _Rec(log, f"s{n}"))
            elif op == "fire":
                log.clear()
                holder.register_buffer(f"b{n}", torch.ones(1))
                fired.append(list(log))
                view = getattr(tm, ATTR)
                fired.append(
                    (
                        len(view),
                        [k in view for k in keys],
                        list(reversed(view)) == list(reversed(list(view))),
                        copy.copy(view) == view,
                        list(copy.deepcopy(view)) == list(view),
                    )
                )
        for tag, handle in handles:
            if tag.startswith("u"):
                handle.remove()
        assert getattr(tm, ATTR) is origin
        log.clear()
        holder.register_buffer("last", torch.ones(1))
        left = list(log)
    finally:
        for _, handle in handles:
            handle.remove()
        getattr(tm, ATTR).clear()
    return fired, left


@pytest.mark.parametrize("seed", range(3))
def test_held_generated_library_writes_against_torchs_own_dict(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(120):
        ops = [
            (rng.choice(_OPS), rng.randrange(10), rng.random() < 0.5)
            for _ in range(rng.randrange(1, 30))
        ]
        assert _play(ops, oracle=False) == _play(ops, oracle=True), ops


def _fire(log: list[str]) -> list[str]:
    log.clear()
    torch.nn.Module().register_buffer("b", torch.ones(1))
    return list(log)


def test_held_popped_by_a_library_then_removed_is_not_kept_alive() -> None:
    log: list[str] = []
    native = tm.register_module_buffer_registration_hook(_Rec(log, "n"))
    hook = _Rec(log, "u")
    gone = weakref.ref(hook)
    h = unihook.register_module_buffer_registration_hook(hook, backend="torch")
    del hook
    d = getattr(tm, ATTR)
    d.popitem(last=True)  # unihook's (last)
    assert _fire(log) == ["n"]
    h.remove()
    h.remove()
    gc.collect()
    assert gone() is None
    assert type(getattr(tm, ATTR)) is OrderedDict and list(getattr(tm, ATTR)) == [native.id]
    native.remove()


def test_held_threads_register_and_remove_while_buffers_register() -> None:
    """A thread registering / removing unihook's and native hooks, another registering
    buffers: every buffer registration ran the hook that lives throughout, none raised."""
    log: list[str] = []
    keep = unihook.register_module_buffer_registration_hook(_Rec(log, "keep"), backend="torch")
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                a = unihook.register_module_buffer_registration_hook(
                    lambda m, n, v: None, backend="torch"
                )
                b = tm.register_module_buffer_registration_hook(lambda m, n, v: None)
                a.remove()
                b.remove()
                a.remove()
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=churn)
    thread.start()
    holder = torch.nn.Module()
    try:
        for n in range(1500):
            holder.register_buffer(f"b{n}", torch.ones(1))
    finally:
        stop.set()
        thread.join(30)
    assert not errors and not thread.is_alive()
    assert log.count("keep") == 1500
    keep.remove()
    assert type(getattr(tm, ATTR)) is OrderedDict and not getattr(tm, ATTR)


def test_held_a_hook_registering_and_removing_others_while_it_runs() -> None:
    log: list[str] = []
    made: list[Any] = []

    def meddler(module: Any, name: str, value: Any) -> None:
        log.append("m")
        made.append(
            unihook.register_module_buffer_registration_hook(_Rec(log, "x"), backend="torch")
        )
        made.append(tm.register_module_buffer_registration_hook(_Rec(log, "y")))
        if len(made) > 2:
            made.pop(0).remove()

    h = unihook.register_module_buffer_registration_hook(meddler, backend="torch")
    assert _fire(log) == ["m"]  # (the loop reads the hooks there were as it started)
    second = _fire(log)
    assert second[0] == "m" and sorted(second[1:]) == ["x", "y"], second
    h.remove()
    for handle in made:
        handle.remove()
    assert type(getattr(tm, ATTR)) is OrderedDict and not getattr(tm, ATTR)


# --- FINDING 1: ``|=`` is not in place ----------------------------------------------------


def test_finding_1_ior_through_an_alias_loses_the_librarys_hook() -> None:
    log: list[str] = []
    h = unihook.register_module_buffer_registration_hook(_Rec(log, "u"), backend="torch")
    try:
        d = getattr(tm, ATTR)
        d |= {10**9: _Rec(log, "lib")}  # in place on torch's OrderedDict
        assert _fire(log) == ["u", "lib"]
    finally:
        h.remove()


def test_finding_1_ior_on_the_module_attribute_keeps_a_removed_unihook_hook_firing() -> None:
    log: list[str] = []
    origin = getattr(tm, ATTR)
    h = unihook.register_module_buffer_registration_hook(_Rec(log, "u"), backend="torch")
    tm._global_buffer_registration_hooks |= {10**9: _Rec(log, "lib")}
    h.remove()
    assert _fire(log) == ["lib"]  # unihook's hook removed
    assert getattr(tm, ATTR) is origin


# --- FINDING 2: not a drop-in OrderedDict -------------------------------------------------


def test_finding_2_ordereddict_operations_that_fail_on_the_table() -> None:
    log: list[str] = []
    native = tm.register_module_buffer_registration_hook(_Rec(log, "n"))
    h = unihook.register_module_buffer_registration_hook(_Rec(log, "u"), backend="torch")
    try:
        d = getattr(tm, ATTR)
        failed = []
        for name, op in {
            "reversed(d.keys())": lambda: list(reversed(d.keys())),
            "reversed(d.items())": lambda: list(reversed(d.items())),
            "{} | d": lambda: {} | d,
            "d.fromkeys": lambda: d.fromkeys([1]),
        }.items():
            try:
                op()
            except (TypeError, AttributeError):
                failed.append(name)
        assert failed == []
    finally:
        h.remove()
        native.remove()


# --- FINDING 5: a library's switch off / on of unihook's key ------------------------------


def test_finding_5_unihook_key_put_back_by_a_library_outlives_its_handle() -> None:
    """``d[k] = d.pop(k)`` (move to end, or a library switching hooks off and on under their
    keys) on unihook's key: `__delitem__` takes it out of ``own``, `__setitem__` puts it in the
    origin as a native hook, which unihook's ``handle.remove()`` no longer removes: it fires
    on every registration for good. With torch's dict (the oracle) the handle removes it."""
    log: list[str] = []
    h = unihook.register_module_buffer_registration_hook(_Rec(log, "u"), backend="torch")
    d = getattr(tm, ATTR)
    (key,) = list(d)
    d[key] = d.pop(key)
    assert _fire(log) == ["u"]
    h.remove()
    assert _fire(log) == []


# --- FINDING 3: a step beside a busy thread, once dynamo is imported ----------------------

LATENCY = """
import sys, threading, time
import torch, unihook

stop = False


def busy():
    x = 0
    while not stop:
        x += 1


torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
x = torch.randn(4, 8, requires_grad=True)


def step():
    h = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
    m(x).sum().backward()
    h.remove()


def timed():
    for _ in range(2):
        step()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        step()
        runs.append(time.perf_counter() - t0)
    return sorted(runs)[2]


threading.Thread(target=busy, daemon=True).start()  # (a data loader's, a progress bar's)
assert "torch._dynamo" not in sys.modules
before = timed()
import torch._dynamo  # noqa: E402  (a library imports it; nothing compiled)

after = timed()
stop = True
print(repr((before, after)))
"""


@pytest.mark.skipif(
    not os.environ.get("UNIHOOK_SLOW_ATTACKS"),
    reason="FINDING 3 (fixed): timing-based; UNIHOOK_SLOW_ATTACKS=1 runs it",
)
def test_finding_3_a_step_with_a_backward_hook_beside_a_busy_thread_after_dynamo_import() -> None:
    from children import last_value, run_code

    before, after = last_value(run_code(LATENCY, timeout=120, fresh=True))
    assert after < 3 * before + 0.02, (before, after)


# --- FINDING 4: every register/remove recompiles a compiled model -------------------------

RECOMPILES = """
import warnings
warnings.simplefilter("ignore")
import torch, unihook
from torch._dynamo.utils import counters

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
other = torch.nn.Linear(2, 2)  # not in the compiled model
cm = torch.compile(m, backend="eager")
x = torch.randn(4, 8)
cm(x)
for i in range(6):
    h = unihook.register_forward_hook(other, lambda mod, a, o: None)
    cm(x)
    h.remove()
    cm(x)
print(repr(counters["stats"]["unique_graphs"]))
"""


def test_finding_4_a_hook_on_an_unrelated_module_recompiles_the_model_every_step() -> None:
    from children import last_value, run_code

    graphs = last_value(run_code(RECOMPILES, timeout=120))
    assert graphs <= 2, graphs  # (the first compile, one with the hook guards on)


BLIND = """
import sys, threading, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

forgets = []
reset = torch._dynamo.reset_code_caches


def counted():
    forgets.append(sys._getframe(1).f_globals["__name__"])
    reset()


torch._dynamo.reset_code_caches = counted
other = torch.nn.Linear(2, 2)  # in no compiled model
x = torch.linspace(-1, 1, 12).reshape(4, 3)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def with_hook(f, m, at):
    calls = []
    h = unihook.register_forward_hook(m[at], lambda mod, a, o: (calls.append(at), o * 2)[1])
    y = f(x)
    h.remove()
    return [y.tolist(), calls, f(x).tolist()]


def blind_after_a_switch(f, m, compiled):
    # guards switched on and off with nothing compiled, then compiled blind: dropped
    unihook.register_forward_hook(other, lambda *a: None).remove()
    f(x)
    n = len(forgets)
    return with_hook(f, m, 0), len(forgets) - n if compiled else 1


def kept_when_compiled_with_guards(f, m, compiled):
    # compiled while another hook lived (guards on), that one removed: kept, and still sees a
    # hook added later
    keep = unihook.register_forward_hook(other, lambda *a: None)
    f(x)
    keep.remove()
    n = len(forgets)
    return with_hook(f, m, 2), len(forgets) - n if compiled else 0


def after_a_reset(f, m, compiled):
    # dynamo reset, compiled blind as many times as before the last switch off: dropped
    torch._dynamo.reset()
    f(x)
    unihook.register_forward_hook(other, lambda *a: None).remove()
    torch._dynamo.reset()
    f(x)
    return with_hook(f, m, 0)


def compiling_across_the_switch_off(f, m, compiled):
    # another thread compiling while the last hook goes builds its guards after: dropped
    keep = unihook.register_forward_hook(other, lambda *a: None)
    if compiled:
        building.clear()
        thread = threading.Thread(target=f, args=(x,))
        thread.start()
        assert building.wait(60)
    keep.remove()
    if compiled:
        go.set()
        thread.join(60)
    return with_hook(f, m, 2)


building, go = threading.Event(), threading.Event()


def held(guards):
    # dynamo's guard filter, which it calls between making a frame's code and building its
    # guards (which read the setting)
    building.set()
    go.wait(60)
    return [True] * len(guards)


out = {}
for scenario in (blind_after_a_switch, kept_when_compiled_with_guards, after_a_reset, compiling_across_the_switch_off):
    m = model()
    eager = scenario(m, m, False)
    torch._dynamo.reset()
    m = model()
    go.clear()
    options = {"guard_filter_fn": held} if scenario is compiling_across_the_switch_off else None
    got = scenario(torch.compile(m, backend="eager", options=options), m, True)
    out[scenario.__name__] = True if got == eager else (eager, got)
print(repr(out))
"""


def test_held_frames_compiled_while_the_guards_were_off_are_dropped_at_the_switch_on() -> None:
    """FINDING 4's fix keeps the frames compiled while dynamo's hook guards were on, and drops
    the others at the next switch-on: a model compiled blind after a switch on and off, after
    a ``torch._dynamo.reset()`` (as many compiles as before the switch off), or on another
    thread that builds its guards after the last hook went (held in dynamo's guard filter) sees
    a hook added next; one compiled while another hook lived sees a later hook without being
    dropped. Outputs and hook calls are eager's (and the drops counted)."""
    from children import last_value, run_code

    got = last_value(run_code(BLIND, timeout=150))
    assert all(v is True for v in got.values()), got


# --- held: module hooks made inside compiled functions ------------------------------------

INSIDE = """
NAMES = ("in_hook", "prepend_always", "self_in_forward", "bw_kept_across")
BACKENDS = ("aot_eager",)
import warnings, sys
warnings.simplefilter("ignore")
import torch, unihook

def scen(name):
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(3,4), torch.nn.Tanh(), torch.nn.Linear(4,2))
    log=[]
    hs=[]
    if name == "in_hook":
        def fh(m,a,o):
            hs.append(unihook.register_forward_pre_hook(seq[2], lambda mm,aa: (log.append("pre"), (aa[0]*2,))[1]))
            return o
        hs.append(unihook.register_forward_hook(seq[0], fh))
        def fn(x):
            y = seq(x)
            for h in hs[1:]: h.remove()
            del hs[1:]
            return y
    elif name == "prepend_always":
        def fn(x):
            h1 = unihook.register_forward_hook(seq[2], lambda m,a,o: (log.append("a"), o*2)[1])
            h2 = unihook.register_forward_hook(seq[2], lambda m,a,o: (log.append("b"), o+1)[1], prepend=True, always_call=True)
            h3 = unihook.register_forward_pre_hook(seq[2], lambda m,a,k: (log.append("k"), None)[1], with_kwargs=True)
            y = seq(x); h1.remove(); h2.remove(); h3.remove(); return y
    elif name == "no_grad":
        def fn(x):
            with torch.no_grad():
                h = unihook.register_forward_hook(seq[2], lambda m,a,o: (log.append("a"), o*2)[1])
                z = seq(x)
            y = seq(x) + z
            h.remove(); return y
    elif name == "self_in_forward":
        def fn(x):
            h = unihook.register_full_backward_hook(seq, lambda m,gi,go: (log.append(("bw", round(go[0].sum().item(),3))), None)[1])
            hp = unihook.register_forward_pre_hook(seq, lambda m,a: (log.append("selfpre"), None)[1])
            y = seq(x)
            h.remove(); hp.remove(); return y
    elif name == "global_inside":
        def fn(x):
            h = unihook.register_module_forward_hook(lambda m,a,o: (log.append(type(m).__name__), None)[1], backend="torch")
            hb = unihook.register_module_full_backward_hook(lambda m,gi,go: (log.append("gb"+type(m).__name__), None)[1], backend="torch")
            y = seq(x); h.remove(); hb.remove(); return y
    elif name == "bw_kept_across":
        state = {}
        def fn(x):
            if "h" in state: state.pop("h").remove()
            state["h"] = unihook.register_full_backward_hook(seq[0], lambda m,gi,go: (log.append(("g", round(go[0].sum().item(),3))), None)[1])
            return seq(x)
    return fn, seq, log

def run(name, comp):
    fn, seq, log = scen(name)
    f = comp(fn)
    res=[]
    for i in range(3):
        x = (torch.ones(2,3)*(i+1)).requires_grad_(True)
        y = f(x); y.sum().backward()
        res.append((y.detach().round(decimals=4).tolist(), x.grad.round(decimals=4).tolist()))
    hooks = [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(m._backward_pre_hooks)) for m in [seq, *seq]]
    return res, log, hooks

out={}
for name in NAMES:
    e = run(name, lambda f: f)
    for be in BACKENDS:
        try: c = run(name, lambda f: torch.compile(f, backend=be))
        except Exception as err: c = repr(err)[:400]
        out[(name,be)] = True if c==e else (e,c)
print(repr({k[0] + '/' + k[1]: v for k, v in out.items()}))
"""


def test_held_module_hooks_made_inside_compiled_functions_match_eager() -> None:
    """Hooks of each kind registered inside compiled functions (in a forward hook, with
    prepend / always_call / with_kwargs, on the compiled module itself, global ones, a
    backward hook replaced across calls): outputs, input gradients, hook calls and the hook
    dicts left are eager's (aot_eager)."""
    from children import last_value, run_code

    got = last_value(run_code(INSIDE, timeout=150))
    assert all(v is True for v in got.values()), got


SERVING = """
import logging, threading, time
import torch, unihook
from torch._dynamo.utils import counters

hit = []


class Catch(logging.Handler):
    def emit(self, record):
        if "recompile_limit" in record.getMessage():
            hit.append(record.getMessage()[:300])


logging.getLogger("torch._dynamo").addHandler(Catch())
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
other = torch.nn.Linear(2, 2)  # not in the compiled model


def slow(gm, inputs):  # a compile taking longer than a step, as inductor's (seconds)
    time.sleep(0.05)
    return gm.forward


cm = torch.compile(m, backend=slow)
x = torch.randn(4, 8)
cm(x)
stop = False
errors = []


def serve():
    try:
        while not stop:
            cm(x)
    except BaseException as error:
        errors.append(repr(error))


t = threading.Thread(target=serve)
t.start()
time.sleep(0.2)
for i in range(12):
    h = unihook.register_full_backward_hook(other, lambda mod, gi, go: None)
    other(torch.randn(3, 2, requires_grad=True)).sum().backward()
    h.remove()
    time.sleep(0.02)
stop = True
t.join(60)
print(repr((errors, counters["stats"]["unique_graphs"], hit[:1])))
"""


@pytest.mark.xfail(
    strict=False,
    reason="FINDING 4 (open): the served model's recompile cycle, timing-dependent since "
    "2026-12-02: no cycle in 5 runs (idle), 13 graphs in a CI run under load",
)
def test_finding_4_a_model_served_on_another_thread_falls_back_to_eager() -> None:
    """Thread B serves a compiled model; thread A trains something else with a backward hook
    registered and removed each step (on a module B never sees). Each of A's first
    registrations invalidates B's compiled frames (B is inside one), each costing one of
    dynamo's recompiles: after 8 steps B's model hits ``recompile_limit`` and runs eagerly for
    good ("last reason: unihook: a hook dynamo does not guard came or went"). Since the fix,
    only while B's frames were compiled with the guards off: but the first switch-on
    invalidates them (compiled before any hook), B recompiles them after A's removal, blind,
    and so on each step, while its compiles take longer than A's steps (the backend here
    sleeps 50 ms, as inductor's take seconds: 7-8 graphs in 12 steps, mostly the limit)."""
    from children import last_value, run_code

    errors, graphs, hit = last_value(run_code(SERVING, timeout=120))
    assert not errors
    assert not hit and graphs <= 2, (graphs, hit)


# --- FINDING 6: compiled training steps on two threads fail while hooks come and go -------

TWO_SERVERS = """
import threading, time, warnings
warnings.simplefilter("ignore")
import logging
logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
import torch, unihook

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
cm = torch.compile(m, backend="eager")
cm(torch.randn(2, 4))
stop = False
errors = []


def serve():
    try:
        while not stop:
            x = torch.randn(2, 4, requires_grad=True)
            cm(x).sum().backward()
    except BaseException as error:
        errors.append(type(error).__name__ + ": " + str(error)[:400])


threads = [threading.Thread(target=serve) for _ in range(2)]
for t in threads:
    t.start()
t0, k = time.time(), 0
while time.time() - t0 < 40 and not errors:
    a = unihook.register_full_backward_hook(m[0], lambda mod, gi, go: None)
    b = unihook.register_full_backward_pre_hook(m[2], lambda mod, go: None)
    g = None
    if k % 3 == 0:
        g = unihook.register_module_full_backward_hook(lambda mod, gi, go: None, backend="torch")
    time.sleep(0.001)
    a.remove()
    b.remove()
    if g is not None:
        g.remove()
    k += 1
stop = True
for t in threads:
    t.join(60)
print(repr((errors[:1], any(t.is_alive() for t in threads))))
"""


@pytest.mark.skipif(
    not os.environ.get("UNIHOOK_SLOW_ATTACKS"),
    reason="FINDING 6 (open, README): timing-based, up to 40 s; UNIHOOK_SLOW_ATTACKS=1 runs it",
)
@pytest.mark.xfail(strict=True, reason="FINDING 6: compiled steps on threads raise")
def test_finding_6_compiled_training_on_two_threads_while_backward_hooks_come_and_go() -> None:
    """Two threads train one compiled model (forward + backward); the main thread registers
    and removes full backward / backward pre hooks on its layers, and every third time a
    global full backward hook. Within seconds a thread's step raises: dynamo's guard building
    ``IndexError: list index out of range``, ``SpeculationLogDivergence`` at
    unihook_torch/_global.py:122, or unihook's ``BackendStateError`` ("expected unihook's
    forward post-hook dispatcher to have run ..."). Without the global hook (module hooks
    only), or with the global hook alone, no step failed in 10 s runs."""
    from children import last_value, run_code

    errors, hung = last_value(run_code(TWO_SERVERS, timeout=150))
    assert not hung
    assert errors == [], errors


# --- held: Ctrl-C at random points of steps with backward hooks (dynamo imported) ----------

CTRL_C = """
import _thread, threading, time, random, sys, gc
import torch, unihook
import torch._dynamo
rng = random.Random(1)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
fired=[]
handles=[]
ints=0
def step():
    kind = rng.randrange(3)
    if kind == 0:
        handles.append(unihook.register_full_backward_hook(m[0], lambda mod, gi, go: fired.append(1)))
    elif kind == 1:
        handles.append(unihook.register_module_full_backward_hook(lambda mod, gi, go: fired.append(2), backend="torch"))
    else:
        handles.append(unihook.register_full_backward_pre_hook(m[2], lambda mod, go: fired.append(3)))
    m(torch.randn(2, 4, requires_grad=True)).sum().backward()
    handles.pop(rng.randrange(len(handles))).remove()
for i in range(150):
    delay = rng.random() * 0.002
    timer = threading.Timer(delay, _thread.interrupt_main)
    try:
        timer.start()
        try:
            step()
            time.sleep(0.003)
        finally:
            timer.cancel(); timer.join()
    except KeyboardInterrupt:
        ints += 1
for h in handles: h.remove()
for h in handles: h.remove()
fired.clear()
m(torch.randn(2, 4, requires_grad=True)).sum().backward()
left = [(len(mm._forward_pre_hooks), len(mm._forward_hooks), len(mm._backward_hooks), len(mm._backward_pre_hooks)) for mm in [m, *m]]
print(repr((ints, fired, left, type(torch.nn.Module._call_impl).__name__, torch.nn.Module._call_impl.__module__)))
"""


def test_held_ctrl_c_at_random_points_leaves_no_dispatcher_or_hook_behind() -> None:
    """``_thread.interrupt_main`` at random points of steps that register a full backward, a
    full backward pre or a global full backward hook, run forward + backward and remove one
    (WatchedPinned's install / remove inside `hooks_changeable`): once every handle is removed
    (twice), no hook fires, no module keeps a hook, torch's ``_call_impl`` is back."""
    from children import last_value, run_code

    ints, fired, left, _, where = last_value(run_code(CTRL_C, timeout=120))
    assert ints > 50
    assert fired == [] and set(left) == {(0, 0, 0, 0)} and where == "torch.nn.modules.module"


FULLGRAPH_BUFFER = """
import torch, unihook

log = []
h = unihook.register_module_buffer_registration_hook(
    lambda m, n, v: log.append(n), backend="torch"
)
n = torch.nn.Module()


@torch.compile(backend="eager", fullgraph=True)
def f(x):
    n.register_buffer("b", x * 2)
    return x + 1


y = f(torch.ones(2))
h.remove()
import torch.nn.modules.module as tm

print(repr((y.tolist(), log, type(tm._global_buffer_registration_hooks).__name__)))
"""


def test_held_fullgraph_buffer_registration_beside_a_unihook_hook() -> None:
    from children import last_value, run_code

    assert last_value(run_code(FULLGRAPH_BUFFER, timeout=120)) == ([2.0, 2.0], ["b"], "OrderedDict")


# --- FINDING 7: a compiled forward that registers a hook recompiles on every call ----------

FORWARD_REGISTERS = """
import time, warnings
warnings.simplefilter("ignore")
import torch, unihook
from torch._dynamo.utils import counters


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        h = unihook.register_forward_hook(self.b, lambda m, a, o: o * 2)
        y = self.b(torch.tanh(self.a(x)))
        h.remove()
        return y


m = M()
cm = torch.compile(m, backend="eager")
x = torch.ones(2, 3)
times = []
for i in range(5):
    t0 = time.perf_counter()
    y = cm(x)
    times.append(time.perf_counter() - t0)
ok = torch.allclose(y, m.b(torch.tanh(m.a(x))) * 2)
print(repr((ok, counters["stats"]["unique_graphs"], sorted(times)[2], len(m.b._forward_hooks))))
"""


@pytest.mark.xfail(strict=True, reason="FINDING 7: every call recompiles (~1.4 s a call)")
def test_finding_7_a_compiled_forward_registering_a_hook_recompiles_every_call() -> None:
    """``torch.compile(model)`` whose forward registers a unihook forward hook on a submodule
    and removes it: the output is right, but every call recompiles (the registration, the
    first torch hook, drops every compiled frame: 5 calls -> 5 graphs, ~1.4 s a call of a
    3x4x2 model with backend="eager", about 1800 frames converted in 30 calls). torch's own
    ``register_forward_hook`` there: 1 graph, 0.1 ms a call."""
    from children import last_value, run_code

    ok, graphs, median, left = last_value(run_code(FORWARD_REGISTERS, timeout=150))
    assert ok and left == 0
    assert graphs <= 3 and median < 0.05, (graphs, median)


THREE_THREADS = """
import sys, threading
sys.setswitchinterval(1e-6)
import torch, unihook
import torch.nn.modules.module as tm
origin = tm._global_buffer_registration_hooks
keep = unihook.register_module_buffer_registration_hook(lambda m,n,v: None, backend="torch")
hs=[]; errs=[]; calls=[0]
def A():
    try:
        for i in range(3000):
            hs.append(tm.register_module_buffer_registration_hook(lambda m,n,v: None))
            if i % 2: hs.pop(0).remove()
    except BaseException as e: errs.append(("A", repr(e)))
def B():
    try:
        for i in range(1000):
            h = unihook.register_module_buffer_registration_hook(lambda m,n,v: None, backend="torch")
            h.remove()
    except BaseException as e: errs.append(("B", repr(e)))
def C():
    try:
        mod = torch.nn.Module()
        for i in range(1500): mod.register_buffer(f"b{i}", None)
    except BaseException as e: errs.append(("C", repr(e)))
ts=[threading.Thread(target=f) for f in (A,B,C)]
[t.start() for t in ts]; [t.join() for t in ts]
keep.remove()
d = tm._global_buffer_registration_hooks
print(repr((errs[:2], d is origin, list(d) == [h.id for h in hs])))
"""


def test_held_native_churn_beside_a_live_unihook_hook_never_breaks_a_registration() -> None:
    """switch interval 1 us; a unihook hook alive throughout; thread A registers native hooks
    (removing every other), B registers and removes unihook's, C registers buffers: no
    "OrderedDict mutated during iteration" (torch's own dict raises it here without unihook's
    hook: C's loop reads the live dict), torch's dict back with exactly A's hooks, in order."""
    from children import last_value, run_code

    assert last_value(run_code(THREE_THREADS, timeout=120)) == ([], True, True)


IN_AND_OUT = """
import warnings
warnings.simplefilter("ignore")
import torch, unihook
def run(comp, kind):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3,3), torch.nn.Tanh(), torch.nn.Linear(3,1))
    log=[]
    def reg():
        if kind == "fwd": return unihook.register_forward_hook(m[0], lambda mod,a,o: (log.append("f"), o*2)[1])
        if kind == "bw": return unihook.register_full_backward_hook(m[0], lambda mod,gi,go: (log.append("b"), (gi[0]*3,))[1])
        if kind == "bwpre": return unihook.register_full_backward_pre_hook(m[2], lambda mod,go: (log.append("p"), (go[0]*5,))[1])
        if kind == "gbw": return unihook.register_module_full_backward_hook(lambda mod,gi,go: (log.append("g"+type(mod).__name__), None)[1], backend="torch")
    box={}
    def inside_reg(x):
        box["h"] = reg()
        return m(x)
    def inside_rm(x):
        y1 = m(x)
        box["h"].remove()
        y2 = m(x)
        return y1 + 2*y2
    f1, f2, f3 = comp(inside_reg), comp(inside_rm), comp(lambda x: m(x))
    res=[]
    for i in range(2):
        x = torch.ones(2,3).requires_grad_(True)
        y = f1(x); y.sum().backward(); res.append(("a", y.tolist(), x.grad.tolist(), list(log))); log.clear(); x.grad=None
        y = f3(x); y.sum().backward(); res.append(("b", y.tolist(), x.grad.tolist(), list(log))); log.clear(); x.grad=None
        y = f2(x); y.sum().backward(); res.append(("c", y.tolist(), x.grad.tolist(), list(log))); log.clear(); x.grad=None
        y = f3(x); y.sum().backward(); res.append(("d", y.tolist(), x.grad.tolist(), list(log))); log.clear(); x.grad=None
        box["h"] = reg()
        y = f3(x); y.sum().backward(); res.append(("e", y.tolist(), x.grad.tolist(), list(log))); log.clear(); x.grad=None
        box["h"].remove()
    return res
out = {}
for kind in ("bw", "gbw"):
    e = run(lambda f: f, kind)
    for be in ("aot_eager",):
        try: c = run(lambda f: torch.compile(f, backend=be), kind)
        except Exception as err: c = repr(err)[:300]
        out[kind + "/" + be] = c == e
print(repr(out))
"""


def test_held_registered_inside_removed_outside_and_the_reverse() -> None:
    """A full backward hook and a global full backward hook registered inside a compiled
    function and removed outside it, registered outside and removed inside (between two calls
    of the model in the same compiled function), then registered outside around a compiled
    call: outputs, input gradients and hook calls are eager's (aot_eager; probes also ran
    forward and backward pre hooks, and backend="eager")."""
    from children import last_value, run_code

    got = last_value(run_code(IN_AND_OUT, timeout=150))
    assert all(got.values()), got
