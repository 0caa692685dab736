# ruff: noqa: E501  (the child programs)
"""helper-96's attack on the h93 merge (276b1b8..9946a8a, 813621d): `_compile.watch_hooks`
drops compiled code at unihook's first torch hook (the switch-on of dynamo's hook guards) only
if dynamo compiled something while the guards were off (`_compiled_blind`: dynamo's
``convert_frame.output_codes.seen`` count and a weak reference to its last code, against the
mark `_switch_off` took; None when a thread was inside convert_frame then).

    cd /tmp/h96 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h96:/tmp/h96/backends \
        /work/main/.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_attack_h96.py

(about 32 s; 45 s with UNIHOOK_SLOW_ATTACKS set, which runs the timing test too)

HELD (plain tests below unless marked probe):
- generated sequences (random; in the attack 40 seeds x 60 steps of forward / forward pre /
  full backward hooks, then 25 seeds x 50 steps in each of dynamo's two nn-module modes,
  ``inline_inbuilt_nn_modules`` True and False, adding full backward pre, forward
  with_kwargs, global forward and tensor hooks; 20 more seeds with tensor hooks): compile a
  model A, a model B and a plain function calling both (``dynamic`` None / False / True,
  ``fullgraph`` sometimes), register and remove hooks on their layers and on an unrelated
  module, ``torch._dynamo.reset()`` and ``torch.compiler.reset()`` at random points, calls
  with other batch sizes (recompiles, dynamic shapes): every call's output, input gradient
  and hook calls are eager's (0 mismatches; a global hook's call on the OptimizedModule
  wrapper itself is torch's own and left out of the comparison). A recompile of an existing
  frame adds a code object to ``output_codes.seen`` (a new one per compile: the count never
  misses one; dynamo's Tracker never removes an entry, it only clears them at reset);
- a thread compiling a fresh function (over a fresh model) while the main thread removes
  the last hook at a random moment (sleep 0..30 ms), 3 x 40 runs: a hook added next on the
  fresh model is always seen by the compiled function (`_converting_anywhere`'s mark None);
- (probe) ``TORCH_CACHING_PRECOMPILE=1`` with inductor: a frame loaded from dynamo's disk
  cache in a second process (``dynamo_cache_hit``) still counts in ``output_codes.seen`` and
  sees a hook added after (no blind frame loaded past the count);
- (probe, not unihook's) ``torch.compile(fn, fullgraph=True).aot_compile(...)``: the AOT
  function ignores a hook added later, unihook's and torch's own alike, also when compiled
  while another unihook hook kept the guards on (torch checks no guard there);
- (probe) compiled autograd (``compiled_autograd._enable``, aot_eager) with a tensor hook
  on a weight and a full backward hook added after the first compiled step: gradients and
  hook calls eager's;
- (probe) one or two threads serving the compiled model while the main thread registers a
  doubling forward hook for 50 ms, 20 times: every call started while it was registered
  (10322) doubled (two threads hit ``recompile_limit``: helper-91's open FINDING 4);
- (probe, measurement; the timing test below with UNIHOOK_SLOW_ATTACKS) a register/remove
  pair on one Linear: 26 us with dynamo imported (69 us before the import: the first
  registration's warm-up is in both), against 128 us at 0c76291 (the old switch-on always
  called `forget_compiled`). With 50 idle threads 50 frames deep 0.61 ms (0c76291: 0.98 ms);
  200 threads 200 deep 8.8 ms. `_converting_anywhere` itself (once per last removal): 0.13
  ms at 50x50, 1.9 ms at 200x200; most of the rest is `hooks_changeable`'s older walk of
  every thread's stack (`_running_elsewhere`), twice a pair. No regression.
- regressions: tests/test_compilers.py, test_attack_h91/h90/h80/h73/h71/h68.py with
  UNIHOOK_SLOW_ATTACKS=1 on 156f05d: 262 passed, 6 xfailed, 1 failed once under load (this
  attack's programs running beside it): h90's ``test_churn_beside_compiled_calls_held``,
  ``KeyError(1803)`` (dynamo's guard building reading a hook dict by key while the churn
  thread removed a hook: the narrow race `hooks_changeable`'s docstring admits; a hook is
  kept alive throughout there, so h93's code never runs); 4 of 4 passes alone.

FINDINGS (strict xfails below for those open; each asserts the right behaviour):

1. FIXED (`_compiled_blind`: a newest code that died tells nothing). (medium, silent skipped
   hook; a regression of h93: 0c76291 passes) `_compiled_blind` takes "as many codes as at the
   mark, and
   the last one the same" for "nothing compiled since", but when both last codes are dead the
   comparison is ``None is None``: after a ``torch._dynamo.reset()`` (or
   ``torch.compiler.reset()``, which restarts the count) a model compiled blind survives the
   switch-on whenever the count is back where it was at the mark and the newest code has
   died. Dead newest codes are common at the mark: every `forget_compiled` kills all codes,
   so a hook registered and removed with nothing compiled meanwhile marks ``(n, dead)``; after
   the reset the newest code dies with ``torch._dynamo.export(fn)(x)`` of a plain function
   (its ``remove_from_cache``), or with a compile that fails after dynamo made its code (its
   guard building raised: a ``guard_filter_fn`` that raises, as in the test). Repro::

       torch._dynamo.export(lambda x: g(x) + 1)(x)        # twice: 2 codes, both die
       torch._dynamo.export(lambda x: g(x) + 1)(x)
       unihook.register_forward_hook(other, f).remove()   # mark (2, dead)
       torch._dynamo.reset()
       cm = torch.compile(m, backend="eager"); cm(x)      # blind
       torch._dynamo.export(lambda x: g(x) + 1)(x)        # 2 codes again, the newest dead
       unihook.register_forward_hook(m[2], double)        # not dropped
       cm(x)   # -> hook not called, output not doubled (eager: called, doubled)

   Expected: the hook runs under the compiled model as in eager (a dead newest code at the
   mark and now can't tell "the same" from "another one that died": e.g. take it as blind, or
   count compiles in a counter the reset does not restart).

2. FIXED (`_drop_owed`: a switch-off marks None while a drop is owed). (medium, silent
   skipped hook; a regression of h93: 0c76291 passes) a registration cut
   short after its switch-on found blind frames and before `forget_compiled` dropped them
   (a Ctrl-C landing there, e.g. in `_held_gil` or in dynamo's reset, or any error out of
   `forget_compiled`; one landing while it waits for a thread compiling is safe: that
   switch-off marks None) is undone (`undo_if_unfinished` -> ``release``),
   and that undo's switch-off takes a new mark which counts the blind frames as already seen:
   the next registration finds "nothing compiled since" and drops nothing, so a model
   compiled before unihook's first hook ignores every unihook hook added to it from then on
   (until some other drop). Repro (the Ctrl-C simulated as the first thing in
   `forget_compiled`)::

       cm = torch.compile(m, backend="eager"); cm(x)       # blind: no unihook hook yet
       unihook.register_forward_hook(other, f)            # Ctrl-C in its forget_compiled
       unihook.register_forward_hook(m[2], double)        # mark says: nothing new
       cm(x)   # -> hook not called, output not doubled

   Expected: eager's (the drop the undone switch-on owed is still owed: e.g. the undo's
   switch-off keeps the old mark, or marks None).
3. FIXED (`_drop_owed`: every registration drops while one is owed). (medium-high, transient
   silent skipped hook; not a regression: 0c76291 the same) a registration
   made while another thread's first registration is still between its switch-on and the
   end of its `forget_compiled` (waiting for dynamo's compile lock, held for the whole of a
   third thread's compile: seconds with inductor) returns at once (the guards are already on:
   no check, no drop), and the blind frames are still there: a call of the compiled model
   right after that registration returned skips the hook (output not doubled, hook not
   called); once the other registration's drop ran, the hook is seen. Repro: ``cm(x)`` blind;
   thread C compiles another function with a backend taking 1.5 s; thread A registers a
   hook on an unrelated module (blocks in `forget_compiled` on the compile lock); the main
   thread registers a doubling forward hook on ``m[2]`` (returns in microseconds) and calls
   ``cm(x)`` -> not doubled, no call. Expected: a registration that returned is seen by the
   next call on its thread (e.g. a registration waits for a drop another one owes).
   No third thread is needed: two threads registering their first hooks at the same moment
   (a barrier; the main thread's on the model, the other's on an unrelated module), then the
   main thread calling the model: 41 of 100 calls skip the hook (0c76291: 42 of 100).
4. FIXED (`unihook._imports`: a callback asked for during an import under way runs as it
   ends; `imported`). (medium, crash; not a regression: 0c76291 the same) a unihook torch hook registered on
   one thread while another thread imports ``torch._dynamo`` (its first ``torch.compile``
   call, or a library importing it: about 2 s) raises ``AttributeError: partially
   initialized module 'torch._dynamo' has no attribute 'disable'``: `watch_hooks` calls
   ``when_imported("torch._dynamo", _give_reason)``, which runs the callback at once when
   the name is in ``sys.modules``, finished or not (`unihook._imports.when_imported`; the
   same at the end of `_compile`'s own import). A thread registering and removing a forward
   hook in a loop across the main thread's ``import torch._dynamo``: ~870 pairs fine, then
   every registration raises until the import is done (5 of 5 runs). Expected: no error (the
   callback waits for the import to finish, as `_converter` does for convert_frame).
5. (low, crash under a documented torch mode; a limit of the design, 0c76291 the same) under
   ``torch.compiler.set_stance("fail_on_recompile")`` (how a server asserts it never
   recompiles), unihook's first hook on ANY module, one in no compiled model too, makes the
   next call of a model compiled before it raise ``RuntimeError: Detected recompile when
   torch.compile stance is 'fail_on_recompile'``: the model was compiled while the guards
   were off, so the switch-on drops it. torch's own hook on that module changes nothing.
   Repro: ``cm = torch.compile(m); cm(x)``; ``with set_stance("fail_on_recompile"):
   unihook.register_forward_hook(other, f); cm(x)`` -> raises. Expected: as with torch's
   own hook, no error (at least not for a module the compiled model does not hold; README
   says nothing of it either).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

SEQUENCES = """
import os, random, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 100000
KINDS = ("fwd", "pre", "bwd", "bpre", "fwdk", "glob", "tens")
OPS = ("compileA", "compileB", "compileF", "reg", "reg", "rem", "rem", "reset", "creset",
       "call", "call", "call", "shape")


def model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def register(kind, mod, log, tag):
    if kind == "fwd":
        return unihook.register_forward_hook(mod, lambda m, a, o: (log.append(tag), o * 2)[1])
    if kind == "pre":
        return unihook.register_forward_pre_hook(mod, lambda m, a: (log.append(tag), (a[0] +
   1,))[1])
    if kind == "bwd":
        return unihook.register_full_backward_hook(mod, lambda m, gi, go: (log.append(tag),
   None)[1])
    if kind == "bpre":
        return unihook.register_full_backward_pre_hook(mod, lambda m, go: (log.append(tag), (go[0]
   * 3,))[1])
    if kind == "fwdk":
        return unihook.register_forward_hook(mod, lambda m, a, k, o: (log.append(tag), o - 1)[1],
   with_kwargs=True)
    if kind == "tens":
        return unihook.register_tensor_hook(mod.weight, lambda g: (log.append(tag), g * 2)[1])
    return unihook.register_module_forward_hook(lambda m, a, o: (log.append(tag +
   type(m).__name__), None)[1], backend="torch")


def play(seed, steps):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ms = {"A": model(), "B": model(), "O": torch.nn.Linear(3, 3)}
    comp, live, log, trace = {}, [], [], []

    def plain(x):  # a plain function calling modules
        return ms["A"](x) + ms["B"](x)

    try:
        for step in range(steps):
            op = rng.choice(OPS)
            trace.append(op)
            if op.startswith("compile"):
                k = op[-1]
                dyn, full = rng.choice([None, False, True]), rng.random() < 0.3
                fn = plain if k == "F" else ms[k]
                comp[k] = (torch.compile(fn, backend="eager", dynamic=dyn, fullgraph=full), fn)
                trace[-1] += f"({dyn},{full})"
            elif op == "reg":
                k = rng.choice("ABO")
                mod = ms[k] if k == "O" else ms[k][rng.choice([0, 2])]
                kind = rng.choice(KINDS)
                tag = f"{kind}{k}#{step}"
                live.append(register(kind, mod, log, tag))
                trace[-1] += tag
            elif op == "rem" and live:
                live.pop(rng.randrange(len(live))).remove()
            elif op == "reset":
                torch._dynamo.reset()
            elif op == "creset":
                torch.compiler.reset()
            elif op in ("call", "shape") and comp:
                compiled, eager = comp[rng.choice(sorted(comp))]
                n = 4 if op == "call" else rng.choice([1, 2, 5, 7])
                x = torch.linspace(-1, 1, n * 3).reshape(n, 3).requires_grad_()
                x2 = x.detach().clone().requires_grad_()
                del log[:]
                ye = eager(x)
                ye.sum().backward()
                le = list(log)
                del log[:]
                try:
                    yc = compiled(x2)
                    yc.sum().backward()
                except Exception as exc:  # fullgraph=True beside a backward hook: its error
                    if "fullgraph" in str(exc) or "Unsupported" in type(exc).__name__:
                        continue
                    return ("raised", seed, step, repr(exc)[:300], trace)
                lc = [t for t in log if not t.endswith("OptimizedModule")]
                if le != lc or not torch.allclose(ye, yc) or not torch.allclose(x.grad, x2.grad):
                    return ("differs", seed, step, le, lc, trace)
    finally:
        for h in live:
            h.remove()
    return None


if sys.argv[1] == "specialized":
    torch._dynamo.config.inline_inbuilt_nn_modules = False
bad = [r for r in (play(seed, int(sys.argv[3])) for seed in range(int(sys.argv[2]))) if r]
print(repr(bad))
"""


@pytest.mark.parametrize(("mode", "seeds"), [("inlined", 8), ("specialized", 4)])
def test_held_generated_sequences_match_eager(mode: str, seeds: int) -> None:
    """Random compiles, hooks of every kind coming and going on compiled and unrelated
    modules, dynamo resets and recompiles: each call is eager's (outputs, input gradients,
    hook calls)."""
    from children import last_value, run_code

    assert last_value(run_code(SEQUENCES, mode, str(seeds), "40", timeout=240)) == []


THREAD = """
import random, sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
rng = random.Random(int(sys.argv[1]))
bad = []
for it in range(int(sys.argv[2])):
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))

    def make(m=m):
        def f(x):
            return m(x) * 1.0
        return f

    f = torch.compile(make(), backend="eager")
    keep = unihook.register_forward_hook(other, lambda *a: None) if rng.random() < 0.7 else None
    thread = threading.Thread(target=f, args=(x,))
    thread.start()
    time.sleep(rng.random() * 0.03)
    if keep is not None:
        keep.remove()  # the last hook goes while the thread compiles (or before, or after)
    else:
        unihook.register_forward_hook(other, lambda *a: None).remove()
    thread.join(60)
    want = m(x) * 2
    calls = []
    h = unihook.register_forward_hook(m[2], lambda mod, a, out: (calls.append(1), out * 2)[1])
    got = f(x)
    h.remove()
    if not torch.allclose(got, want) or calls != [1]:
        bad.append(it)
print(repr(bad))
"""


def test_held_a_thread_compiling_across_the_last_removal_is_dropped_at_the_next_hook() -> None:
    """A thread compiles a fresh function while the main thread removes unihook's last hook
    at a random moment: a hook added next on the function's model is seen."""
    from children import last_value, run_code

    assert last_value(run_code(THREAD, "1", "20", timeout=240)) == []


DEAD_NEWEST = """
import gc, sys, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
g = torch.nn.Linear(3, 3)


def export():  # its compiled code dies at once (torch._dynamo.export's remove_from_cache)
    torch._dynamo.export(lambda x: g(x) + 1)(x)


def boom(guards):
    raise RuntimeError("a guard filter that fails")


def failing_compile():  # dynamo makes its code, then its guard building raises
    try:
        torch.compile(lambda x: x.sin() + 1, backend="eager", options={"guard_filter_fn": boom})(x)
    except Exception:
        pass
    gc.collect()


out = {}
for name, newest_dies in (("export", export), ("failed_compile", failing_compile)):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    newest_dies()
    newest_dies()
    unihook.register_forward_hook(other, lambda *a: None).remove()  # the mark: (2, dead)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="eager")
    plain = compiled(x)  # compiled blind: no unihook hook alive
    newest_dies()  # 2 codes again, the newest dead
    calls = []
    h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
    got = compiled(x)
    h.remove()
    out[name] = (torch.allclose(got, 2 * plain), calls)
print(repr(out))
"""


def test_finding_1_blind_model_kept_when_the_newest_code_died_after_a_reset() -> None:
    from children import last_value, run_code

    got = last_value(run_code(DEAD_NEWEST, timeout=240))
    assert got == {"export": (True, [1]), "failed_compile": (True, [1])}, got


CHURN = """
import sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

lin = torch.nn.Linear(2, 2)


def churn(n):
    t = time.perf_counter()
    for _ in range(n):
        unihook.register_forward_hook(lin, lambda *a: None).remove()
    return (time.perf_counter() - t) / n


stop = threading.Event()


def idle(depth):
    if depth:
        return idle(depth - 1)
    stop.wait()


churn(200)
alone = churn(2000)
threads = [threading.Thread(target=idle, args=(50,)) for _ in range(50)]
for t in threads:
    t.start()
crowded = churn(500)
stop.set()
for t in threads:
    t.join()
print(repr((alone, crowded)))
"""


@pytest.mark.skipif(
    not os.environ.get("UNIHOOK_SLOW_ATTACKS"), reason="timing-based: set UNIHOOK_SLOW_ATTACKS"
)
def test_held_register_remove_pair_beside_50_idle_threads_costs_under_3_ms() -> None:
    """A register/remove pair with dynamo imported: ~26 us alone, ~0.6 ms beside 50 idle
    threads 50 frames deep (the stack walks of every thread), against ~1 ms at 0c76291."""
    from children import last_value, run_code

    alone, crowded = last_value(run_code(CHURN, timeout=240))
    assert alone < 0.0005 and crowded < 0.003, (alone, crowded)


INTERRUPTED = """
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
forget = _compile.forget_compiled


def interrupted():  # a Ctrl-C landing as the switch-on is about to drop the blind frames
    _compile.forget_compiled = forget
    raise KeyboardInterrupt


_compile.forget_compiled = interrupted
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


def test_finding_2_a_registration_interrupted_before_its_drop_leaves_the_blind_model_for_good() -> (
    None
):
    from children import last_value, run_code

    assert last_value(run_code(INTERRUPTED, timeout=240)) == (True, [1])


OWED = """
import sys, threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
compiled = torch.compile(m, backend="eager")
plain = compiled(x)  # compiled blind
in_backend, go = threading.Event(), threading.Event()


def slow(gm, inputs):  # a third thread's long compile (inductor's seconds), holding dynamo's lock
    in_backend.set()
    go.wait(60)
    return gm.forward


compiling = threading.Thread(target=torch.compile(lambda x: x.cos() + 1, backend=slow), args=(x,))
compiling.start()
assert in_backend.wait(60)
first = threading.Thread(target=lambda: unihook.register_forward_hook(other, lambda *a: None))
first.start()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # until the first registration waits inside its drop
    frame = sys._current_frames().get(first.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    if "forget_compiled" in names:
        break
    time.sleep(0.01)
# (the registration below drops too, so it waits for dynamo's lock: the long compile ends soon)
threading.Timer(2.0, go.set).start()
calls = []
h = unihook.register_forward_hook(m[2], lambda mod, a, o: (calls.append(1), o * 2)[1])
got = compiled(x)  # after this thread's registration returned
go.set()
first.join(60)
compiling.join(60)
h.remove()
print(repr((torch.allclose(got, 2 * plain), calls)))
"""


def test_finding_3_a_registration_beside_another_threads_pending_drop_is_skipped() -> None:
    from children import last_value, run_code

    assert last_value(run_code(OWED, timeout=240)) == (True, [1])


IMPORTING = """
import sys, threading, time, traceback, warnings
warnings.simplefilter("ignore")
import torch, unihook

assert "torch._dynamo" not in sys.modules
lin = torch.nn.Linear(2, 2)
errors, stop, kept = [], threading.Event(), []


def churn():
    while not stop.is_set() and len(errors) < 3:
        try:
            unihook.register_forward_hook(lin, lambda *a: None).remove()
            if not kept and "torch._dynamo" in sys.modules:
                # one made during the import and kept: its reasons wait for the import's end
                kept.append(unihook.register_forward_hook(lin, lambda *a: None))
        except Exception as exc:
            errors.append(traceback.format_exception_only(exc)[-1].strip()[:200])


thread = threading.Thread(target=churn)
thread.start()
time.sleep(0.05)
import torch._dynamo  # another thread's first torch.compile would do this

stop.set()
thread.join(60)
from unihook_torch import _compile

print(repr([errors, len(kept), _compile._reasons_given]))
"""


def test_finding_4_a_registration_while_another_thread_imports_dynamo_raises() -> None:
    from children import last_value, run_code

    assert last_value(run_code(IMPORTING, timeout=240, fresh=True)) == [[], 1, True]


STANCE = """
import warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
other = torch.nn.Linear(2, 2)  # in no compiled model
x = torch.ones(4, 3)
compiled = torch.compile(m, backend="eager")
compiled(x)
out = {}
with torch.compiler.set_stance("fail_on_recompile"):
    for name, register in (
        ("torch", other.register_forward_hook),
        ("unihook", lambda hook: unihook.register_forward_hook(other, hook)),
    ):
        h = register(lambda *a: None)
        try:
            compiled(x)
            out[name] = "ok"
        except Exception as exc:
            out[name] = repr(exc)[:120]
        h.remove()
print(repr(out))
"""


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 5: under fail_on_recompile a unihook hook on an unrelated module breaks a compiled model",
)
def test_finding_5_fail_on_recompile_model_breaks_at_a_hook_on_an_unrelated_module() -> None:
    from children import last_value, run_code

    assert last_value(run_code(STANCE, timeout=240)) == {"torch": "ok", "unihook": "ok"}


TWO = """
import threading, time, warnings
warnings.simplefilter("ignore")
import torch, torch._dynamo, unihook

torch._dynamo.config.recompile_limit = 1000
torch._dynamo.config.accumulated_recompile_limit = 100000
x = torch.ones(4, 3)
other = torch.nn.Linear(2, 2)
missed = 0
for i in range(40):
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    compiled = torch.compile(m, backend="eager")
    plain = compiled(x)  # compiled blind
    barrier, handles = threading.Barrier(2), []

    def first():
        barrier.wait()
        handles.append(unihook.register_forward_hook(other, lambda *a: None))

    thread = threading.Thread(target=first)
    thread.start()
    barrier.wait()
    time.sleep(0.00005 * (i % 10))
    h = unihook.register_forward_hook(m[2], lambda mod, a, o: o * 2)
    missed += not torch.allclose(compiled(x), 2 * plain)
    thread.join(60)
    h.remove()
    handles[0].remove()
print(repr(missed))
"""


def test_finding_3_two_threads_registering_at_once_the_next_call_skips_the_hook() -> None:
    from children import last_value, run_code

    assert last_value(run_code(TWO, timeout=240)) == 0
