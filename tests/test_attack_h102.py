# ruff: noqa: E501  (the child programs)
"""helper-102's attack on a65a144: `unihook._imports.when_imported` on a module that is in
``sys.modules`` but still being imported (`_fire_at_end`: the spec's class swapped for one whose
``__setattr__`` fires the callbacks when the import machinery sets ``spec._initializing =
False``), the new `imported(name)`, and the torch backend's use of it for ``torch._dynamo``.

    cd /tmp/h102 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h102:/tmp/h102/backends \
        /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_attack_h102.py

(about 30 s; every program runs in a fresh interpreter: they change ``sys.modules``,
``sys.meta_path`` or the trace function, and the torch ones need dynamo not yet imported.)
Python 3.11.7: ``importlib._bootstrap._load_unlocked`` sets ``spec._initializing = True``,
puts the module in ``sys.modules``, runs it, moves it to the end of ``sys.modules`` and sets
``spec._initializing = False`` in a ``finally``.

FINDINGS (strict xfails below for those open, each asserting the right behaviour):

1. FIXED (`_fire_names`: every name asked for during the import, under what ``sys.modules``
   holds for it at the end). (medium-low, silent: a callback never runs, unihook's finder stays on ``sys.meta_path``;
   REGRESSION: 8f0cf56 ran it at once) A callback asked for while the module is being imported
   runs only if, at the end, ``sys.modules[spec.name].__spec__ is spec`` and under
   ``spec.name``: `_end_setattr` looks the module up by ``spec.name`` and fires
   ``spec.name``'s callbacks only. Two shapes miss:

   a. a module that replaces itself in ``sys.modules`` (``sys.modules[__name__] = obj``, as
      some lazy-module shims do)::

          # selfrep.py:   import selfrep_helper; sys.modules[__name__] = SimpleNamespace()
          # selfrep_helper.py:   when_imported("selfrep", SEEN.append)
          import selfrep   # -> SEEN == [] for ever, _callbacks == {"selfrep": [...]},
                           #    _FINDER still in sys.meta_path

      The same callback asked for *before* the import (the `_Loader` path) runs.
   b. a module also known under a second name (``sys.modules["alias"] =
      sys.modules[__name__]`` early in a slow import, as compatibility aliases do)::

          thread: import realmod      # realmod aliases itself as "aliasmod", then sleeps
          main:   when_imported("aliasmod", seen.append)   # while it sleeps
          # -> after the import: seen == [], a callback and the finder left behind, although
          #    imported("aliasmod") is the module

2. (medium; needs a Ctrl-C at the wrong moment, then wrong numbers for good; REGRESSION: the
   window is new, 8f0cf56 has no Python code in ``spec._initializing = False``) The setter
   is a Python function: a ``KeyboardInterrupt`` taken at its first instruction (the eval
   breaker's check at its entry; ``sys.settrace`` raising on its "call" event in the tests)
   skips ``object.__setattr__``: the module is imported in full, yet its spec says
   ``_initializing = True`` for good, so `imported(name)` is None for ever, no waiting
   callback ever runs (nor a later one: each is queued), the spec keeps unihook's class, and
   every later ``import name`` takes the slow module-lock path. With torch: a thread
   registers a hook while the main thread imports ``torch._dynamo``; the Ctrl-C lands at the
   import's end; the user imports dynamo again (it works); from then on `watch_hooks` never
   turns dynamo's hook guards on (``imported("torch._dynamo")`` is None), and a hook
   registered after a ``torch.compile`` is skipped silently by the compiled model::

       cm = torch.compile(m, backend="eager"); cm(x)
       unihook.register_forward_hook(m[1], double)   # eager: called, doubled
       cm(x)   # -> not called, not doubled

   (A Ctrl-C a little later, between ``object.__setattr__`` and the restore / the pop in
   `_fire`, leaves the callbacks queued for ever and the swapped class, like the existing
   `_Loader` window between ``exec_module`` and `_fire`: not counted as new.)

3. FIXED (the swapped class pickles and copies as ModuleSpec, `_reduce_as_base`). (low;
   REGRESSION) While a callback waits for a module being imported, the module's spec
   is an instance of ``unihook._imports.ModuleSpec``, a class pickle cannot find:
   ``pickle.dumps(sys.modules[name].__spec__)`` raises ``PicklingError`` ("attribute lookup
   ModuleSpec on unihook._imports failed"); 8f0cf56 pickled it. And a ``copy.copy`` of the
   spec taken meanwhile keeps the swapped class for ever (it never sees
   ``_initializing = False``).

4. FIXED (a spec whose class cannot be swapped: the callback runs at once, as before; an
   entry's attribute raising: not importing). (low, unusual specs and ``sys.modules`` entries; REGRESSION: 8f0cf56 ran the callback)

   a. a spec whose type forbids ``__class__`` assignment (a custom finder returning a
      ``types.SimpleNamespace`` spec, which the import system accepts): `when_imported`
      during that import raises ``TypeError: __class__ assignment only supported for mutable
      types or ModuleType subclasses`` and leaves the callback queued and the finder
      installed (it never runs: the import ends without the setter);
   b. an object in ``sys.modules`` whose ``__getattr__`` raises something other than
      AttributeError for unknown names (ImportError is common in lazy shims): `imported` and
      `when_imported` raise it (``getattr(module, "__spec__", None)``).

   (Also seen, not tested: a spec class with a ``__setattr__`` of its own is bypassed for the
   final ``_initializing = False`` and the class restore: `_end_setattr` calls
   ``object.__setattr__``.)

5. FIXED (`imported` gives the module inside its callbacks, on their thread, either way).
   (low, an inconsistency of the new API) Inside a `when_imported` callback, `imported(name)`
   is the module when the callback was asked for during the import (`_end_setattr` runs
   after ``_initializing = False``), but None when it was asked for before the import (the
   `_Loader` fires inside ``exec_module``, ``_initializing`` still True). A backend whose
   callback registers a hook (the torch backend's `watch_hooks` reads
   ``imported("torch._dynamo")``) behaves differently by when its callback was asked for::

       when_imported("pa", lambda m: seen.append(imported("pa") is m)); import pa  # [False]

6. FIXED (`_end_setattr` fires before the mark: the import returns after its callbacks).
   (medium with torch, a race; not a regression: 8f0cf56 ran such a callback at once, on the half-made
   module; a gap in the fix) The callbacks asked for during an import run *after*
   ``object.__setattr__(spec, "_initializing", False)``: from that moment another thread's
   ``import name`` takes Python's fast path (no module lock) and returns, and `imported(name)`
   gives the module, while the callbacks are still to run or running on the importing
   thread. On the `_Loader` path (asked for before the import) they run inside
   ``exec_module``, ``_initializing`` still True: neither returns before they are done. With
   torch: a thread that compiles as soon as ``import torch._dynamo`` returns may trace before
   `_unpatched_for_dynamo` has run (microseconds with unihook's callbacks alone; as long as
   the callbacks queued before it take, a backend's or a library's)::

       # helper, imported by ow during ow's import (ow then sleeps 0.2 s):
       when_imported("ow", lambda m: time.sleep(0.3)); when_imported("ow", lambda m: FLAG.append(1))
       thread: import ow
       main:   wait until imported("ow"); FLAG == []; import ow; FLAG == []   (both [1] when
               the two were asked for before the import)

   With torch, made wide by a slow callback of another library queued first (the test's
   ``time.sleep(1.0)``), silently wrong for good::

       thread T, as dynamo's import starts: when_imported("torch._dynamo", slow)
                                            unihook.register_module_forward_pre_hook(pre, backend="torch")
       thread C: wait until imported("torch._dynamo"); cm = torch.compile(m, backend="eager"); cm(x)
       # -> pre ran on the OptimizedModule only, never on m, m[0], m[1], m[2] (eager: all four),
       #    at that call and every later one: dynamo took unihook's wrapper for torch's own
       #    ``Module._call_impl`` (its ``unpatched_nn_module_call_impl``) and short-circuits
       #    every inner module to ``forward``

7. PARTLY FIXED (helper-101's FINDING 1: a compile is waited for once, a second at most).
   (medium, a stall; REGRESSION of 8f0cf56, outside this attack's brief: spare time) A module
   hook change (`hooks_changeable`: register or remove) on one thread waits up to `_WAIT`
   (1 s) whenever another thread is anywhere inside ``convert_frame._compile``, which spans
   the whole trace *and the backend's compile* (inductor: seconds to minutes): 10
   register/remove pairs (20 changes) beside a thread whose backend compiles for 20 s
   took 19.98 s (8205360: 0.00 s). A training loop that hooks a layer per step beside a
   serving or warm-up thread compiling a new shape loses a second per step::

       thread C: torch.compile(f, backend=slow)(x)   # slow() sleeps 1.5 s
       main:     for layer in m: unihook.register_forward_hook(layer, h).remove()
       # -> 5 pairs take the rest of the compile (1.2 s; 1 s per change when it is longer)

   (Also seen, old: a global hook registration waits for the whole compile, dynamo's compile
   lock, `compiles_held`: 19.94 s beside the 20 s compile.)

8. (low-medium, a race; NOT a regression: 8f0cf56 and before alike; the gap next to the one
   a65a144 closes) An import on another thread that is past the finders but has not yet put
   the module in ``sys.modules`` (``module_from_spec``: a C extension's whole ``PyInit``
   runs in ``create_module``; for a source module, the ``find_spec`` path scan and
   ``module_from_spec``, a fraction of a millisecond): `when_imported` sees no module and
   queues the callback for unihook's finder, which that import never consults again. The
   import ends, `imported(name)` gives the module, the callback never runs, the finder stays
   on ``sys.meta_path`` for ever. (With torch, a hook registered on a thread in that window of
   ``import torch._dynamo`` leaves `_give_reason` / `_unpatched_for_dynamo` unrun: finding 6's
   consequence, without the slow callback; rare; read from the code, not run)::

       thread: import slowinit      # its loader's create_module sleeps 0.3 s
       main:   when_imported("slowinit", seen.append)    # 0.1 s in
       # -> after the import: seen == [], _callbacks == {"slowinit": [...]}, finder left

9. FIXED (the torch backend's `_ops` looks modules up with `imported`). (medium, a crash;
   NOT a regression, a gap in a65a144's fix of helper-96's FINDING 4: the
   same half-made module, read elsewhere) ``backends/unihook_torch/_ops.py`` still reads
   modules under way with ``sys.modules.get``: `_compiled` (``torch._dynamo.eval_frame`` then
   ``.OptimizedModule``), `_unit_wrapped` (``getattr(found, kind)`` for eval_frame, FSDP and
   checkpoint_wrapper) and `_wrapper_types` (``torch.distributed.fsdp``). A thread calling
   ``unihook.ops.named_modules(m)`` / ``ops.unwrap(m)`` (the recipes' walk, `demo`) while
   another thread imports ``torch._dynamo`` (a first ``torch.compile``) raises::

       AttributeError: partially initialized module 'torch._dynamo.eval_frame' has no
       attribute 'OptimizedModule' (most likely due to a circular import)

   (`imported()` there: no such wrapper can exist before its module's import ends.)

10. FIXED (`_torch()`, paddle's `_paddle()` and MindSpore's `_types()` by `imported`).
   (medium, a crash in mixed-framework processes; NOT a regression, 8f0cf56 alike; the same
    gap) The torch backend's `_dynamo_tracing` (its compiler escape's test, which
    `unihook._plugins.escaped` asks on *every* hook removal of *every* backend, and
    `unihook.backends()`) reads ``_torch()``, that is ``sys.modules.get("torch")``, then
    ``torch.compiler``: while another thread imports torch (3 s) it raises::

        AttributeError: partially initialized module 'torch' has no attribute 'compiler'

    Seen with ``unihook.backends()`` in a loop on a thread (the test), and with a paddle
    layer's forward hook registered and removed in a loop on a thread while the main thread
    imports torch (``handle.remove()`` -> `escaped` -> `_dynamo_tracing`), and with a global
    torch hook registered on a thread as torch's import starts
    (``unihook.register_module_forward_pre_hook(h, backend="torch")``, which
    `install_when_imported("torch", ...)` is there to defer: it raises before it gets
    there, in `outside_compilers`). (By the code, not
    run: `_owns` reads ``torch.nn.Module`` the same way, and the MindSpore backend's `_types`
    ``mindspore.nn.Cell``.)

HELD (pinned below where cheap; else probes run for this attack):
- 40 rounds of a generated slow module (1-200 lines of work plus a sleep) imported by 1-3
  threads while 8 threads ask for a callback at random moments (every fifth cancelled at
  once): every callback not cancelled ran exactly once, after the import, on the module in
  ``sys.modules`` with all its attributes; the spec's class is ``ModuleSpec`` again; no
  callback and no finder left (pinned: 12 rounds).
- a KeyboardInterrupt injected (``sys.settrace``) at every line of `when_imported`,
  `_importing`, `_fire_at_end` and `_ending_class` on the registering side, the caller then
  cancelling (as `install_when_imported` / `watch_hooks` do): after the import the spec's
  class is ``ModuleSpec``, nothing queued, no finder (pinned).
- a failing import then a succeeding one, and a callback asked for inside the module's own
  import (circular: the module imports a helper that asks): runs once at the end; a callback
  that asks for another callback of the same name while running: that one runs at once.
- a callback that raises during the end of an import under way: the import statement raises
  it, the module stays in ``sys.modules`` (imported in full); callbacks queued after it are
  dropped, as on the `_Loader` path (not new).
- specs with ``__slots__`` (a plain class, no ``__dict__``) and ModuleSpec subclasses: the
  swap and the restore work.
- torch (fresh processes): a thread registering a module forward hook, a global
  ``module_full_backward`` hook and a full backward hook (plus register/remove churn of
  forward hooks and global forward pre-hooks) while the main thread imports
  ``torch._dynamo``: no error; at the end ``_give_reason`` and ``_unpatched_for_dynamo``
  ran (``utils`` and ``variables.nn_module`` ``unpatched_nn_module_call_impl`` are torch's
  own), no callback or finder left, the spec's class restored; ``torch.compile`` (eager
  backend) gives eager's output, input gradient and hook calls (the global hook's extra call
  on the OptimizedModule wrapper aside, torch's own); ``fullgraph=True`` raises with
  unihook's FULLGRAPH_REASON; removing the hook registered during the import is seen by the
  compiled model; a model compiled after the import then hooked sees its hook (the next
  registration turns the guards on: the skipped switch during the import heals). A global
  forward pre-hook registered as dynamo's import starts and removed after
  ``torch._dynamo.utils`` was imported, still during the import: ``Module._call_impl`` /
  ``__call__`` restored, dynamo's ``unpatched_nn_module_call_impl`` torch's own.
- no leak: callbacks asked for during an import, run or cancelled, are collected after it.
- ``unihook.backends()`` in a loop on a thread while the main thread imports paddle; a torch
  forward hook and a global torch forward pre-hook registered and removed in a loop on a
  thread while the main thread imports paddle: no error (1400+ rounds).
- (note, not a regression) `imported(name)` on a ``importlib.util.LazyLoader`` module runs
  its code (``getattr(module, "__spec__")``), as any use of it would; a finding-1 callback
  left queued for a name in ``sys.modules`` makes `_Finder` wrap the live spec's loader at an
  ``importlib.reload`` (``importlib.util.find_spec`` returns ``module.__spec__``): old code.
"""

from __future__ import annotations

import pytest

# a temporary folder on sys.path, and `w(name, source)` writing a module there
PRELUDE = """
import importlib, importlib.machinery, os, sys, tempfile, textwrap, threading, time
HERE = tempfile.mkdtemp()
sys.path.insert(0, HERE)
import unihook._imports as I
def w(name, source):
    with open(os.path.join(HERE, name + ".py"), "w") as f:
        f.write(textwrap.dedent(source))
    importlib.invalidate_caches()
"""


def _run(code: str, timeout: float = 60) -> object:
    from children import last_value, run_code

    return last_value(run_code(PRELUDE + code, timeout=timeout, fresh=True))


SELF_REPLACED = """
w("selfrep", '''
import selfrep_helper, sys, types
sys.modules[__name__] = types.SimpleNamespace(REPLACED=True)
''')
w("selfrep_helper", '''
import unihook._imports as I
SEEN = []
I.when_imported("selfrep", SEEN.append)
''')
import selfrep
print(repr((len(sys.modules["selfrep_helper"].SEEN), sorted(I._callbacks), I._FINDER in sys.meta_path)))
"""


def test_callback_runs_for_a_module_that_replaces_itself() -> None:
    assert _run(SELF_REPLACED) == (1, [], False)


ALIASED = """
w("realmod", '''
import sys, time
sys.modules["aliasmod"] = sys.modules[__name__]
time.sleep(0.3)
DONE = True
''')
seen = []
t = threading.Thread(target=importlib.import_module, args=("realmod",))
t.start()
while "aliasmod" not in sys.modules:
    time.sleep(0.001)
I.when_imported("aliasmod", seen.append)
t.join()
print(repr(([getattr(m, "DONE", None) for m in seen], I.imported("aliasmod") is sys.modules["realmod"], sorted(I._callbacks), I._FINDER in sys.meta_path)))
"""


def test_callback_runs_for_a_module_known_by_two_names() -> None:
    assert _run(ALIASED) == ([True], True, [], False)


STUCK = """
w("kk", "import kk_h\\nDONE = True\\n")
w("kk_h", "import unihook._imports as I\\nSEEN = []\\nI.when_imported('kk', SEEN.append)\\n")
def tracer(frame, event, arg):
    if event == "call" and frame.f_code is I._end_setattr.__code__ and frame.f_locals.get("attr") == "_initializing":
        sys.settrace(None)
        raise KeyboardInterrupt  # (where the eval breaker looks first in the setter)
    return None
sys.settrace(tracer)
try:
    import kk
except KeyboardInterrupt:
    pass
sys.settrace(None)
import kk  # again: it is there, imported in full
late = []
I.when_imported("kk", late.append)
print(repr((kk.DONE, I.imported("kk") is kk, len(sys.modules["kk_h"].SEEN), len(late), type(kk.__spec__) is importlib.machinery.ModuleSpec)))
"""


@pytest.mark.xfail(
    strict=True,
    reason="helper-102 FINDING 2: a KeyboardInterrupt at the setter's entry leaves "
    "spec._initializing True for good: imported() None for ever, callbacks never run",
)
def test_ctrl_c_at_the_end_of_an_import_leaves_no_module_importing_for_ever() -> None:
    assert _run(STUCK) == (True, True, 1, 1, True)


STUCK_TORCH = """
import torch, unihook
other = torch.nn.Linear(4, 4)
def worker():
    while "torch._dynamo" not in sys.modules:
        time.sleep(0.0005)
    unihook.register_forward_hook(other, lambda m, a, o: None)  # kept: a hook lives
t = threading.Thread(target=worker)
t.start()
def tracer(frame, event, arg):
    if event == "call" and frame.f_code is I._end_setattr.__code__ and frame.f_locals.get("attr") == "_initializing":
        sys.settrace(None)
        raise KeyboardInterrupt
    return None
sys.settrace(tracer)
try:
    import torch._dynamo
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
sys.settrace(None)
t.join()
import torch._dynamo  # the user tries again: it works
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
x = torch.randn(2, 4)
cm = torch.compile(m, backend="eager")
cm(x)
calls = []
unihook.register_forward_hook(m[1], lambda mod, a, o: calls.append(1) or o * 2)
compiled = cm(x)
n_compiled = len(calls)
eager = m(x)
print(repr((interrupted, n_compiled, bool(torch.allclose(compiled, eager)))))
"""


@pytest.mark.xfail(
    strict=True,
    reason="helper-102 FINDING 2 (torch): after a Ctrl-C at the end of dynamo's import a hook "
    "registered after torch.compile is skipped silently by the compiled model",
)
def test_ctrl_c_at_the_end_of_dynamos_import_skips_no_hook_later() -> None:
    assert _run(STUCK_TORCH, timeout=240) == (True, 1, True)


PICKLED = """
import copy, pickle
w("pk", "import pk_h\\nDONE = True\\n")
w("pk_h", '''
import copy, pickle, sys
import unihook._imports as I
I.when_imported("pk", lambda m: None)
spec = sys.modules["pk"].__spec__
try:
    pickle.dumps(spec)
    PICKLED = True
except Exception:
    PICKLED = False
COPY = copy.copy(spec)
''')
import pk
h = sys.modules["pk_h"]
print(repr((h.PICKLED, type(h.COPY) is importlib.machinery.ModuleSpec, pickle.loads(pickle.dumps(pk.__spec__)).name)))
"""


def test_spec_pickles_while_a_callback_waits() -> None:
    assert _run(PICKLED) == (True, True, "pk")


NAMESPACE_SPEC = """
import types
seen, errors = [], []
class Loader:
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        try:
            I.when_imported("nsspec", seen.append)
        except Exception as error:
            errors.append(type(error).__name__)
class Finder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "nsspec":
            return None
        return types.SimpleNamespace(name=fullname, loader=Loader(), origin=None, submodule_search_locations=None, loader_state=None, cached=None, parent="", has_location=False)
sys.meta_path.insert(0, Finder())
import nsspec
print(repr((errors, len(seen), sorted(I._callbacks), I._FINDER in sys.meta_path)))
"""


def test_when_imported_takes_a_spec_of_a_fixed_class() -> None:
    assert _run(NAMESPACE_SPEC) == ([], 1, [], False)


STRICT_ENTRY = """
class Shim:
    def __getattr__(self, name):
        raise ImportError(f"shim: no {name}")
shim = sys.modules["shim"] = Shim()
out, seen = [], []
for call in (lambda: I.imported("shim") is shim, lambda: I.when_imported("shim", seen.append)):
    try:
        call()
        out.append("ok")
    except Exception as error:
        out.append(type(error).__name__)
print(repr((out, seen == [shim])))
"""


def test_imported_takes_an_entry_raising_on_unknown_attributes() -> None:
    assert _run(STRICT_ENTRY) == (["ok", "ok"], True)


INSIDE_CALLBACK = """
w("pa", "X = 1\\n")
w("pb", "import pb_h\\nX = 1\\n")
w("pb_h", "import unihook._imports as I\\nSEEN = []\\nI.when_imported('pb', lambda m: SEEN.append(I.imported('pb') is m))\\n")
before = []
I.when_imported("pa", lambda m: before.append(I.imported("pa") is m))
import pa, pb
print(repr((before, sys.modules["pb_h"].SEEN)))
"""


def test_imported_inside_a_callback_is_the_module_either_way() -> None:
    assert _run(INSIDE_CALLBACK) == ([True], [True])


RACE = """
w("ow", "import ow_h\\nimport time\\ntime.sleep(0.2)\\nDONE = True\\n")
w("ow_h", '''
import time, unihook._imports as I
FLAG = []
I.when_imported("ow", lambda m: time.sleep(0.3))
I.when_imported("ow", lambda m: FLAG.append(1))
''')
t = threading.Thread(target=importlib.import_module, args=("ow",))
t.start()
while "ow_h" not in sys.modules:
    time.sleep(0.001)
while I.imported("ow") is None:
    time.sleep(0.001)
flag = sys.modules["ow_h"].FLAG
when_imported = list(flag)
importlib.import_module("ow")
when_returned = list(flag)
t.join()
print(repr((when_imported, when_returned)))
"""


def test_no_import_returns_before_the_callbacks_asked_for_during_it_ran() -> None:
    assert _run(RACE) == ([1], [1])


RACE_TORCH = """
import torch, unihook
from unihook.backend import imported, when_imported
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
x = torch.randn(2, 4)
calls, out = [], {}
def pre(mod, args):
    calls.append(type(mod).__name__)
def worker():
    while "torch._dynamo" not in sys.modules:
        time.sleep(0.0005)
    when_imported("torch._dynamo", lambda d: time.sleep(1.0))  # another library's, slow
    unihook.register_module_forward_pre_hook(pre, backend="torch")  # queues _unpatched_for_dynamo
def compiler():
    while imported("torch._dynamo") is None:
        time.sleep(0.0005)
    import torch._dynamo
    out["cm"] = torch.compile(m, backend="eager")
    calls.clear()
    out["cm"](x)
    out["compiled"] = sorted(calls)
threads = [threading.Thread(target=worker), threading.Thread(target=compiler)]
for t in threads:
    t.start()
import torch._dynamo
for t in threads:
    t.join(60)
calls.clear()
out["cm"](x)
later = sorted(calls)
calls.clear()
m(x)
print(repr((out["compiled"], later, sorted(calls))))
"""


def test_a_compile_right_after_dynamos_import_runs_global_hooks_on_inner_modules() -> None:
    eager = ["Linear", "Linear", "ReLU", "Sequential"]
    compiled, later, eager_now = _run(RACE_TORCH, timeout=240)  # type: ignore[misc]
    assert eager_now == eager
    # (the OptimizedModule wrapper's own call is torch's, left out)
    assert [c for c in compiled if c != "OptimizedModule"] == eager
    assert [c for c in later if c != "OptimizedModule"] == eager


STALL = """
import torch, torch._dynamo, unihook
def slow_backend(gm, example_inputs):
    time.sleep(1.5)  # a long backend compile (inductor's take seconds to minutes)
    return gm.forward
other = torch.nn.Linear(4, 4)
started = threading.Event()
def compiler():
    f = torch.compile(lambda a: other(a).relu(), backend=slow_backend)
    started.set()
    f(torch.randn(2, 4))
c = threading.Thread(target=compiler)
c.start()
started.wait()
time.sleep(0.3)
m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
t0 = time.monotonic()
for layer in m:
    unihook.register_forward_hook(layer, lambda *a: None).remove()
took = time.monotonic() - t0
c.join()
print(repr(round(took, 2)))
"""


@pytest.mark.xfail(
    strict=True,
    reason="helper-102 FINDING 7 (8f0cf56): each module hook change on one thread waits up to "
    "1 s while another thread compiles (inside convert_frame._compile)",
)
def test_hook_changes_do_not_stall_a_second_each_beside_a_compile() -> None:
    assert _run(STALL, timeout=240) < 0.5  # type: ignore[operator]


NOT_YET_IN_MODULES = """
import importlib.machinery
class Loader:
    def create_module(self, spec):
        time.sleep(0.3)  # a C extension's init (PyInit_*) runs here, before sys.modules has it
        return None
    def exec_module(self, module):
        module.DONE = True
class Finder:
    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, Loader()) if fullname == "slowinit" else None
sys.meta_path.append(Finder())
t = threading.Thread(target=importlib.import_module, args=("slowinit",))
t.start()
time.sleep(0.1)
seen = []
I.when_imported("slowinit", seen.append)
t.join()
print(repr((I.imported("slowinit") is not None, len(seen), sorted(I._callbacks), I._FINDER in sys.meta_path)))
"""


@pytest.mark.xfail(
    strict=True,
    reason="helper-102 FINDING 8 (old): a callback asked for while another thread's import has "
    "found the module but not yet put it in sys.modules never runs; the finder stays",
)
def test_callback_runs_for_an_import_past_its_finders() -> None:
    assert _run(NOT_YET_IN_MODULES) == (True, 1, [], False)


WALK_DURING_IMPORT = """
import torch
import unihook.ops as ops
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
errors = []
stop = threading.Event()
def walker():
    while not stop.is_set():
        try:
            ops.named_modules(m)
            ops.unwrap(m)
            time.sleep(0.0005)  # (a busy loop made the import take 25 s)
        except Exception as error:
            errors.append(type(error).__name__)
            stop.set()
t = threading.Thread(target=walker)
t.start()
import torch._dynamo
stop.set()
t.join()
print(repr(errors))
"""


def test_walking_modules_during_dynamos_import_on_another_thread() -> None:
    assert _run(WALK_DURING_IMPORT, timeout=240) == []


BACKENDS_DURING_TORCH_IMPORT = """
import unihook
unihook.backends()  # the backends loaded: torch's adds its compiler escape (torch not imported)
errors = []
stop = threading.Event()
def ask():
    while not stop.is_set():
        try:
            unihook.backends()
            time.sleep(0.0005)  # (a busy loop made the import take 25 s)
        except Exception as error:
            errors.append(type(error).__name__)
            stop.set()
t = threading.Thread(target=ask)
t.start()
import torch
stop.set()
t.join()
print(repr(errors))
"""


def test_backends_and_removals_during_torchs_import_on_another_thread() -> None:
    assert _run(BACKENDS_DURING_TORCH_IMPORT, timeout=240) == []


# ---- what held (pinned) ----

THREADS = """
import random
bad = []
for rnd in range(12):
    rng = random.Random(rnd)
    name = f"slow{rnd}"
    body = "\\n".join(f"x{i} = sum(range({rng.randint(0, 3000)}))" for i in range(rng.randint(1, 200)))
    w(name, f"import time\\n{body}\\ntime.sleep({rng.random() * 0.01})\\nDONE = True\\n")
    seen, errors = [], []
    def ask(i):
        time.sleep(rng.random() * 0.01)
        try:
            cancel = I.when_imported(name, lambda m, i=i: seen.append((i, getattr(m, "DONE", False), sys.modules.get(name) is m)))
            if i % 5 == 0:
                cancel()
        except BaseException as error:
            errors.append(repr(error))
    def load():
        time.sleep(rng.random() * 0.005)
        try:
            importlib.import_module(name)
        except BaseException as error:
            errors.append(repr(error))
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=load) for _ in range(rng.randint(1, 3))]
    rng.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    ran = [i for i, _, _ in seen]
    ok = (
        all(done and same for _, done, same in seen) and len(ran) == len(set(ran))
        and {i for i in range(8) if i % 5} <= set(ran)
        and type(sys.modules[name].__spec__) is importlib.machinery.ModuleSpec
        and not I._callbacks and I._FINDER not in sys.meta_path and not errors
    )
    if not ok:
        bad.append((rnd, seen, errors))
print(repr(bad))
"""


def test_held_callbacks_asked_for_by_threads_during_imports_by_threads() -> None:
    assert _run(THREADS) == []


INTERRUPTED_REGISTRATION = """
from functools import partial
out = []
for k in range(60):
    name = f"ki{k}"
    w(name, f"import {name}_h\\nDONE = True\\n")
    w(name + "_h", f'''
import sys
from functools import partial
import unihook._imports as I
SEEN = []
def tracer(frame, event, arg):
    return local if frame.f_code.co_filename == I.__file__ else None
count = [0]
def local(frame, event, arg):
    if event == "line":
        count[0] += 1
        if count[0] == {k} + 1:
            sys.settrace(None)
            raise KeyboardInterrupt
    return local
cancel = partial(I.cancel_when_imported, "{name}", SEEN.append)  # taken before, as callers do
sys.settrace(tracer)
try:
    I.when_imported("{name}", SEEN.append)
    INTERRUPTED = False
except KeyboardInterrupt:
    INTERRUPTED = True
    cancel()
sys.settrace(None)
''')
    importlib.import_module(name)
    h = sys.modules[name + "_h"]
    if not h.INTERRUPTED:
        break
    spec = sys.modules[name].__spec__
    if type(spec) is not importlib.machinery.ModuleSpec or I._callbacks or I._FINDER in sys.meta_path or h.SEEN:
        out.append(k)
print(repr((k > 10, out)))
"""


def test_held_a_ctrl_c_in_a_registration_then_its_cancel_leaves_nothing() -> None:
    assert _run(INTERRUPTED_REGISTRATION) == (True, [])


DURING_DYNAMO = """
import torch, unihook
from unihook.backend import imported
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
n = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
calls = {"fwd": 0, "bw": 0}
during, handles = {}, {}
def fwd(mod, args, out):
    calls["fwd"] += 1
    return out * 2
def bw(mod, gin, gout):
    calls["bw"] += 1
def worker():
    while "torch._dynamo" not in sys.modules:
        time.sleep(0.0005)
    during["before"] = imported("torch._dynamo") is None
    handles["fwd"] = unihook.register_forward_hook(m[0], fwd)
    handles["gbw"] = unihook.register_module_full_backward_hook(lambda mod, gi, go: None, backend="torch")
    handles["bw"] = unihook.register_full_backward_hook(m[2], bw)
    for _ in range(5):
        unihook.register_forward_hook(n[0], fwd).remove()
        unihook.register_module_forward_pre_hook(lambda mod, a: None, backend="torch").remove()
    during["after"] = imported("torch._dynamo") is None
t = threading.Thread(target=worker)
t.start()
import torch._dynamo
t.join(60)
from unihook_torch import _compile, _global
dynamo = sys.modules["torch._dynamo"]
state = (
    during, type(dynamo.__spec__) is importlib.machinery.ModuleSpec, sorted(I._callbacks),
    I._FINDER in sys.meta_path, _compile._reasons_given,
    dynamo.utils.unpatched_nn_module_call_impl is _global.original_call_impl(),
    dynamo.variables.nn_module.unpatched_nn_module_call_impl is _global.original_call_impl(),
)
x = torch.randn(3, 4)
def run(f):
    for k in calls:
        calls[k] = 0
    xx = x.clone().requires_grad_()
    y = f(xx)
    y.sum().backward()
    return y.detach(), xx.grad, dict(calls)
cm = torch.compile(m, backend="eager")
e, c = run(m), run(cm)
same = [bool(torch.allclose(e[0], c[0])), bool(torch.allclose(e[1], c[1])), e[2] == c[2]]
try:
    torch.compile(lambda a: m(a), backend="eager", fullgraph=True)(x)
    reason = False
except Exception as error:
    reason = "unihook runs the dispatchers of module backward hooks" in str(error)
handles["fwd"].remove()
e, c = run(m), run(cm)
same += [bool(torch.allclose(e[0], c[0])), e[2] == c[2]]
cn = torch.compile(n, backend="eager")
cn(x)
unihook.register_forward_hook(n[1], fwd)
calls["fwd"] = 0
cn(x)
print(repr((state, same, reason, calls["fwd"])))
"""


def test_held_torch_hooks_registered_during_dynamos_import_on_a_thread() -> None:
    state, same, reason, later = _run(DURING_DYNAMO, timeout=240)  # type: ignore[misc]
    # (registered while dynamo was being imported; the churn mostly during it too)
    assert state[0]["before"] is True
    assert state[1:] == (True, [], False, True, True, True)
    assert same == [True] * 5 and reason and later == 1
