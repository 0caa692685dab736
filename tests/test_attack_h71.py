"""helper-71's attack on 5ed021b (`_compile.forget_compiled`: with other threads alive a global
hook coming or going invalidates every dynamo cache entry, `ExtraState.invalidate`, instead of
`reset_code_caches`), 38fc57a (torch `change_mark` holds the sequence numbers of
``grad_fn.next_functions``; GradientMonitor tells a returned input from one changed in place)
and 0376648..21b6fd4 (fullgraph=True: unihook's reasons; `Handle.remove` through the compiler
escapes, `escape(call, doing)`).

Oracles: the same model uncompiled with the same hook (calls, output, input gradient); torch's
native ``register_full_backward_pre_hook`` grad_output norm for GradientMonitor (an out-of-place
twin of the in-place module); torch's native hooks for a self-removing hook under compile;
README (Compilers, Threads) for the recompile limit; the code at 371f2e3 for costs.

Generated cases (scripts not kept):
- threads x compile (~40 compiled runs): a model compiled on worker thread A, a global hook
  registered on thread B, joined, run on a new thread at the compiled shape and another, removed
  on B, run again, an idle thread alive throughout; kinds forward / forward-pre / full backward /
  full backward-pre / forward with_kwargs / forward always_call x `torch.compile` static,
  `dynamic=True`, `m.compile()` in place, backend eager (18), aot_eager (8, 4 kinds), inductor
  (forward, backward): every one eager's calls, output and gradients, and no call after removal.
- the invalidation racing a compile (5 + 5 runs, default and 1 us switch interval): a backend
  that lets thread B register a global forward hook while dynamo holds its compile lock for a
  recompile (new shape) on A, then the same shape run again: the hook always seen.
- churn (4 x 1500 calls + 3 x 300): A runs a `dynamic=True` compiled model at 3 batch sizes with
  `recompile_limit` raised to 1e5 (so its guards, python lambdas for the symbolic shapes, keep
  being evaluated), B registers and removes a global forward hook every ms, 1 us switch
  interval: no crash, 3 distinct outputs.
- a compiled frame running on a thread started with ``_thread.start_new_thread`` (not counted
  by ``threading.active_count()``) while the main thread churns global hooks: FINDING 1.
- recompile limit: regional compilation (4 and 10 blocks of one class, `torch.compile(block)`
  each or `block.compile()`), 1 to 4 register/remove cycles, with and without an idle thread:
  FINDING 3; past the limit the hooks are still right and dynamo's warning names unihook
  ("last reason: ... unihook: a hook dynamo does not guard came or went ...").
- GradientMonitor, a tensor built over 1, 2, 3 fresh threads and changed in place by a module on
  another fresh thread (FINDING 2 from 2 on); in-place under no_grad (left out, as its autograd
  history is the input's), ``x.view(-1).mul_`` (recorded), a ``ctx.mark_dirty`` Function
  (recorded; torch's native full_backward_pre hooks fail on it, so no oracle).
- fullgraph / removal (34 runs): `Handle.remove` of a per-module and of a global handle,
  a global registration, `unihook.backends()` inside a compiled function, fullgraph True/False,
  with the torch and paddle backends loaded in both orders (paddle's escape outermost or
  innermost): unihook's reason under fullgraph, no error without; a forward hook removing itself
  in a compiled forward (unihook's and torch's own, fullgraph True/False) at 371f2e3 and now:
  unihook's calls equal torch's (7 over 3 calls, trace-time calls included), fullgraph an error
  for both.
- cost (371f2e3 vs now, best of 3 x 20000): `Handle.remove` of a module forward hook 2.26 ->
  3.2 us (torch only), 2.25 -> 5.3 us (paddle imported); of a tensor hook 0.84 -> 2.35 us and
  0.93 -> 5.0 us; ActivationStats(every=2) on 20 Linear layers, one forward 890 -> 950 us
  (its hooks are removed each forward). FINDING 4.

- helper-68's TORCH_HELD matrix (tests/test_attack_h68.py: global hooks registered and removed
  inside a compiled forward, hooks raising there, a root pre-hook beside a global backward hook
  removed inside, nested compiled calls; 8 groups x eager / compiled) rerun with an idle thread
  alive, so every registration and removal takes the invalidation path: all eager's numbers
  (not pinned here: 25 s). Leaks: 3 models compiled (eager, aot_eager), a global hook
  registered and removed with a thread alive, deleted: the model and its weights collected.

- deadlock hunt (2 x 200 steps, eager / aot_eager): A runs forward + backward at 4 batch
  sizes (a recompile each while the limit allows: raised to 1e5), B churns a global full
  backward hook, a per-module full backward pre-hook and a per-module forward hook (the
  `watch_hooks` switch, which calls `forget_compiled` under unihook's lock and then takes
  dynamo's compile lock), 10 us switch interval: no deadlock, 4 distinct gradients.

FINDINGS (by severity):
1. crash (high): `forget_compiled` decides "no other thread" by ``threading.active_count() ==
   1``, which does not count threads started by ``_thread.start_new_thread`` (or by C code that
   never touched ``threading``): `reset_code_caches()` beside such a thread running a compiled
   frame kills the process (SIGSEGV, 5 of 5 runs), helper-68's FINDING 6 again.
5, 6. hard error, regression from 371f2e3 (medium-high): with any other thread alive (tqdm's
   monitor, a DataLoader's pin-memory thread), each invalidation leaves entries that count
   towards ``recompile_limit``: a ``fullgraph=True`` model raises ``FailOnRecompileLimitHit``
   after 4 register/remove cycles of a global forward hook (5), or 8 of a per-module hook on a
   module it never calls (6: the first unihook torch hook after the last one went drops every
   compiled frame, `watch_hooks`); without fullgraph the model runs eagerly for good.
   Single-threaded and at 371f2e3: no error.
3. performance cliff, README wrong (medium): a deleted guard manager has no id-matched
   objects, so every invalidated entry counts against every frame of the code object: with
   regional compilation (4 blocks of one class) two register/remove cycles of a global hook
   make dynamo run every block eagerly for the rest of the process; README says each
   registration/removal uses one of a frame's 8 compiles.
2. silent skip, misleading warning (medium): GradientMonitor leaves out a module that changed
   its input in place when the tensor was built over two fresh threads (the edges' sequence
   numbers match too: the mark is one level deeper, the collision moves one thread further).
4. cost (low): `Handle.remove` runs every backend's compiler escape: with paddle imported a
   tensor hook's removal is ~3.5x its `_remove` (5 us against 0.93 at 371f2e3); recipes with
   `every=N` remove their hooks every forward.

Not findings: a live global full backward hook (unihook's or torch's own
``register_module_full_backward_hook``) with ``torch.compile(m)`` and compiled autograd
(``compiled_autograd._enable``): dynamo's AssertionError "UnspecializedNNModuleVariable
(Sequential) is already tracked for mutation", torch's own hook too. Nested compiled functions
(a compiled function calling another, a graph break between) with a global forward / pre /
backward hook registered and removed on another thread: eager's calls and gradients (held).

HELD: pinned below (threads x compile matrix subset, the race with the compile lock, the churn,
fullgraph reasons with both backends loaded, a self-removing hook under compile as torch's
own, the recompile limit's warning and correctness past it, GradientMonitor's held cases).

Every case runs in a child process (`children.run_code`).
"""

from __future__ import annotations

from typing import Any

import pytest
from children import last_value, run_code

PRELUDE = r"""
import logging, sys, threading, time, warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook

logging.getLogger("torch._dynamo").setLevel(logging.ERROR)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def on_thread(fn):
    box = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start(), t.join()
    return box[0]
"""


def _child(code: str, timeout: float = 240) -> Any:
    pytest.importorskip("torch")
    return last_value(run_code(PRELUDE + code, timeout=timeout))


# -- FINDING 1: a thread threading does not count ----------------------------------------------

RAW_THREAD = r"""
import _thread

m = net()
f = torch.compile(m, backend="eager")
x = torch.linspace(-1, 1, 6).reshape(2, 3)
f(x)
grads, done = [], _thread.allocate_lock()
done.acquire()


def runner():
    try:
        for _ in range(30):
            xx = x.clone().requires_grad_()
            (f(xx) * torch.tensor([1.0, -2.0])).sum().backward()
            grads.append(tuple(round(v, 5) for v in xx.grad.flatten().tolist()))
    finally:
        done.release()


_thread.start_new_thread(runner, ())
alive = threading.active_count()
churns = 0
while not done.acquire(False):
    hs = [
        unihook.register_module_full_backward_hook(lambda mod, gi, go: None, backend="torch"),
        unihook.register_module_forward_pre_hook(lambda mod, a: None, backend="torch"),
    ]
    time.sleep(0.001)
    for h in hs:
        h.remove()
    churns += 1
print([alive, len(grads), len(set(grads)), churns > 0])
"""


def test_churn_beside_a_compiled_frame_on_a_thread_threading_does_not_count() -> None:
    """FINDING 1 (crash, high), FIXED: `forget_compiled` looks at every thread's frames
    (`sys._current_frames`) for a compiled one. Repro: ``f = torch.compile(m,
    backend="eager")``, ``f(x)``;
    ``_thread.start_new_thread(runner, ())`` where runner does 30 ``f(xx).sum().backward()``
    (``threading.active_count()`` stays 1: `_thread` threads are not in threading's table);
    the main thread meanwhile registers a global full backward hook and forward pre-hook,
    sleeps 1 ms, removes both, until runner ends. Observed: SIGSEGV (139) in 4 of 4 runs,
    faulthandler: main thread in ``torch._dynamo.reset_code_caches`` <- `forget_compiled`
    (backends/unihook_torch/_compile.py: ``if threading.active_count() == 1``). The same
    with ``threading.Thread``: exit 0 (5ed021b's fix). Expected: no crash, 30 equal
    gradients (e.g. count threads by ``len(sys._current_frames())``, or always invalidate)."""
    done = run_code(PRELUDE + RAW_THREAD, timeout=180)
    assert done.returncode == 0, done.returncode
    assert last_value(done)[1:] == [30, 1, True]


# -- FINDING 2: GradientMonitor, a tensor built over two threads --------------------------------

MONITOR_THREADS = r"""
from unihook.recipes import GradientMonitor


class Inplace(torch.nn.Module):
    def __init__(self, twin):
        super().__init__()
        self.twin = twin  # (the oracle's: out of place, which native hooks take)

    def forward(self, x):
        return x * 2 if self.twin else x.mul_(2)


class Two(torch.nn.Module):
    def __init__(self, twin):
        super().__init__()
        torch.manual_seed(0)
        self.inner = Inplace(twin)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, h):
        return self.out(self.inner(h))


def case(native_hooks, hops):
    # each op the first autograd op of a fresh thread: MulBackward0, sequence number 0
    h = on_thread(lambda: torch.ones(2, 3, requires_grad=True) * 1.5)
    for _ in range(hops):
        h = on_thread(lambda h=h: h * 1.5)
    m, res = Two(native_hooks), {}

    def run():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            if native_hooks:
                names = {mod: n for n, mod in m.named_modules()}
                for mod in m.modules():
                    mod.register_full_backward_pre_hook(
                        lambda mod, go: res.__setitem__(
                            names[mod], round(float(go[0].double().norm()), 5)
                        )
                    )
                m(h).sum().backward()
                return 0
            with GradientMonitor(m) as g:
                m(h).sum().backward()
        res.update({k: round(v, 5) for k, v in g.history[-1].items()})
        res["warned"] = [str(i.message)[:40] for i in w if "GradientMonitor" in str(i.message)]
        return 0

    on_thread(run)
    return res


print({hops: [case(False, hops), case(True, hops)] for hops in (0, 1)})
"""


@pytest.fixture(scope="module")
def monitor_threads() -> Any:
    return _child(MONITOR_THREADS)


def test_monitor_in_place_on_another_thread_one_hop_held(monitor_threads: Any) -> None:
    """HELD (helper-68's FINDING 2, fixed by 38fc57a): the tensor made on one fresh thread,
    changed in place by the module on another: recorded with the native norm, no warning."""
    mon, native = monitor_threads[0]
    assert mon["warned"] == []
    assert mon.get("inner") == native["inner"] == 0.76745


def test_monitor_in_place_on_a_tensor_built_over_two_threads(monitor_threads: Any) -> None:
    """FINDING 2 (silent skip, misleading warning, medium), FIXED: torch's `change_mark` is a
    number kept in the grad node's own `metadata`. Repro: fresh thread T1 makes
    ``a = torch.ones(2, 3, requires_grad=True) * 1.5`` (MulBackward0, sequence number 0, edge
    to AccumulateGrad); fresh thread T2 makes ``h = a * 1.5`` (MulBackward0, number 0, edges
    (0, None)); fresh thread T3 runs ``with GradientMonitor(m): m(h).sum().backward()`` with
    ``m.inner`` returning ``x.mul_(2)`` (MulBackward0, number 0 on T3's counter, edges: the old
    node's number, 0, and None). `change_mark` before and after: ``(0, MulBackward0, (0,
    None))`` both. Observed: 'inner' missing from the history, RuntimeWarning "module 'inner'
    returned its input unchanged" (also with 2 hops). With one thread fewer (h made on T1,
    helper-68's case): recorded, 0.76745. 38fc57a's comment ("the in-place node leads to the
    old one, which cannot lead to itself") misses that the old one may lead to a node of the
    same number made on yet another thread. Expected: 'inner' recorded with torch's native
    grad_output norm of the out-of-place twin (0.76745), no warning (e.g. compare the old
    node's identity held weakly, or the tensor's version counter beside the mark)."""
    mon, native = monitor_threads[1]
    assert mon["warned"] == []
    assert mon.get("inner") == native["inner"]


# -- FINDING 3: the recompile limit under regional compilation ----------------------------------

REGIONAL = r"""
from torch._dynamo.utils import counters

hits = []


class Catch(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "recompile_limit" in msg:
            hits.append("unihook" in msg)


log = logging.getLogger("torch._dynamo.convert_frame")
log.setLevel(logging.WARNING)
log.addHandler(Catch())
log.propagate = False


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.l(x))


def case(thread):
    torch._dynamo.reset()
    counters.clear()
    hits.clear()
    torch.manual_seed(0)
    blocks = [torch.compile(Block(), backend="eager") for _ in range(4)]
    idle = threading.Event()
    if thread:
        threading.Thread(target=idle.wait).start()
    x = torch.randn(2, 4)

    def fwd():
        y = x
        for b in blocks:
            y = b(y)
        return y

    fwd()
    for _ in range(3):  # 6 registrations and removals: fewer than the 8 compiles
        h = unihook.register_module_forward_hook(lambda m, a, o: None, backend="torch")
        fwd()
        h.remove()
        fwd()
    calls = []
    h = unihook.register_module_forward_hook(
        lambda m, a, o: calls.append(type(m).__name__), backend="torch"
    )
    y = fwd()
    seen = calls.count("Block"), calls.count("Linear")
    h.remove()
    z = x
    for b in blocks:
        z = torch.relu(b._orig_mod.l(z))
    right = torch.equal(y, z)
    idle.set()
    return [len(hits), all(hits), right, seen]


print([case(False), case(True)])
"""


@pytest.fixture(scope="module")
def regional() -> Any:
    return _child(REGIONAL)


def test_recompile_limit_past_it_hooks_right_and_unihook_named_held(regional: Any) -> None:
    """HELD: past the limit (thread alive) the hooks still run as in eager (4 Block, 4 Linear
    calls, the right output) and dynamo's warning names unihook as the last reason;
    single-threaded, no limit hit."""
    alone, threaded = regional
    assert alone == [0, True, True, (4, 4)]
    assert threaded[1:] == [True, True, (4, 4)]


def test_regional_compilation_keeps_compiling_after_a_few_global_hooks(regional: Any) -> None:
    """FINDING 3 (performance cliff, README wrong, medium), FIXED: the caches are reset unless
    another thread runs a compiled frame. Repro: 4 ``Block`` modules (one
    class: ``relu(Linear(4, 4)(x))``), each ``torch.compile(block, backend="eager")`` (regional
    compilation), run in a chain; an idle ``threading.Thread`` alive; 3 times: register a
    global forward hook, run, remove it, run. Observed: dynamo's "hit config.recompile_limit
    (8)" at the second cycle, and every block runs eagerly from then on, for the process
    (`RUN_ONLY`). A deleted guard manager (`DeletedGuardManagerWrapper`) has no id-matched
    objects, so dynamo's `compute_cache_size` counts each invalidated entry against every
    block sharing ``Block.forward``'s code: one registration with N blocks (or N shapes) uses
    N compiles. The same without the idle thread (`reset_code_caches`): no limit hit, 24 frames
    compiled. README (Compilers): "each registration and removal of a global hook then uses one
    of a frame's 8 compiles". Expected: 6 registrations/removals do not reach the limit
    (e.g. drop invalidated entries from the count, or reset under the compile lock once no
    compiled frame runs), or README saying N compiles per registration."""
    _, threaded = regional
    assert threaded[0] == 0


LIMITS = r"""
def cycles(n, register):
    # a fullgraph=True model; n times: a hook registered, a call, removed, a call
    torch._dynamo.reset()
    f = torch.compile(net(), backend="eager", fullgraph=True)
    x = torch.ones(2, 3)
    f(x)
    res = []
    try:
        for _ in range(n):
            h = register()
            f(x)
            h.remove()
            f(x)
            res.append("ok")
    except Exception as e:
        res.append(type(e).__name__ + ": " + str(e)[:60])
    return res


other = torch.nn.Linear(2, 2)  # never compiled, never called
glob = lambda: unihook.register_module_forward_hook(lambda mod, a, o: None, backend="torch")
own = lambda: unihook.register_forward_hook(other, lambda mod, a, o: None)
out = {"alone": [cycles(6, glob), cycles(8, own)]}
idle = threading.Event()
threading.Thread(target=idle.wait).start()
out["thread"] = [cycles(6, glob), cycles(8, own)]
idle.set()
print(out)
"""


@pytest.fixture(scope="module")
def limits() -> Any:
    return _child(LIMITS)


def test_fullgraph_model_takes_hook_cycles_single_threaded_held(limits: Any) -> None:
    """HELD: with no other thread (`reset_code_caches`), 6 cycles of a global forward hook and
    8 of a per-module hook on another module beside a fullgraph=True model: no error."""
    assert limits["alone"] == [["ok"] * 6, ["ok"] * 8]


def test_fullgraph_model_beside_a_thread_takes_global_forward_hooks(limits: Any) -> None:
    """FINDING 5 (error, medium-high; FINDING 3's cause), FIXED as FINDING 3. Repro:
    ``f = torch.compile(m, backend="eager", fullgraph=True)``, ``f(x)``; any other thread
    alive (an idle ``threading.Thread``: tqdm's monitor, a DataLoader's pin-memory thread); 6 times:
    ``h = unihook.register_module_forward_hook(g, backend="torch")``, ``f(x)``,
    ``h.remove()``, ``f(x)`` (forward hooks, which fullgraph takes). Observed: the 4th cycle
    raises ``FailOnRecompileLimitHit: Hard failure due to fullgraph=True`` (each invalidation
    leaves an entry that counts towards ``recompile_limit``, 8; dynamo's fullgraph turns the
    eager fallback into an error). The same without the thread (`reset_code_caches`): 6 ok.
    README (Compilers) says past the limit "it runs the frame eagerly (with its warning)".
    Expected: 6 ok, as single-threaded."""
    assert limits["thread"][0] == ["ok"] * 6


def test_fullgraph_model_beside_a_thread_and_hooks_on_another_module(limits: Any) -> None:
    """FINDING 6 (error, regression from 371f2e3, medium-high), FIXED as FINDING 3. Repro:
    ``f = torch.compile(m, backend="eager", fullgraph=True)``, ``f(x)``; an idle
    ``threading.Thread`` alive; 8 times:
    ``h = unihook.register_forward_hook(other, g)`` on a Linear that is never compiled nor
    called, ``f(x)``, ``h.remove()``, ``f(x)``. Observed: the 8th cycle raises
    ``FailOnRecompileLimitHit: Hard failure due to fullgraph=True`` (with the hook on ``m[0]``
    instead: the 4th). The first unihook torch hook after the last one went turns dynamo's
    hook guards on (`watch_hooks`), which drops every compiled frame (`forget_compiled`):
    with a thread alive each drop leaves invalidated entries counting towards the limit.
    Without fullgraph the model then runs eagerly for good. At 371f2e3 (`reset_code_caches`)
    and with no other thread: 8 ok. A recipe (`with ActivationStats(...)`) used now and then
    beside a compiled model is this pattern. Expected: 8 ok."""
    assert limits["thread"][1] == ["ok"] * 8


# -- FINDING 4: Handle.remove's cost -------------------------------------------------------------

REMOVE_ESCAPES = r"""
import paddle  # (imported: its escape is loaded)
from unihook import _plugins

unihook.backends()
asked, ran = [], []
_plugins._escapes[:] = [
    (
        lambda call, doing, escape=escape: (ran.append(doing), escape(call, doing))[1],
        lambda tracing=tracing: (asked.append(1), tracing())[1],
    )
    for escape, tracing in _plugins._escapes
]
t = torch.ones(2, requires_grad=True)
unihook.register_tensor_hook(t, lambda g: None).remove()
print([len(_plugins._escapes), len(asked), ran])
"""


def test_handle_remove_runs_no_escape_outside_compilers() -> None:
    """FINDING 4 (cost, low), FIXED: each escape comes with its compiler's cheap "tracing now"
    test (`add_compiler_escape(escape, tracing)`), and a removal outside any compiler runs
    none (2.57 us against 0.72 for the removal itself, best of 3 x 20000 tensor-hook handles
    with paddle imported, before; `benchmarks/` has the per-call figures). Repro of the cost:
    torch and paddle imported, ``unihook.backends()``; 20000 ``unihook.register_tensor_hook(t,
    g)`` handles removed with ``h.remove()`` against ``h._remove()``; a module forward hook's
    2.25 -> 5.3 us; ActivationStats(every=2) on 20 Linear layers, which removes its hooks each
    forward: 890 -> 950 us per forward. Here: torch's and paddle's escapes loaded, a removal
    outside a compiler asks both whether they trace and runs neither (inside a compiled
    function: `tests/test_compilers.py`, fullgraph's errors)."""
    pytest.importorskip("paddle")
    n, asked, ran = _child(REMOVE_ESCAPES)
    assert n == asked == 2
    assert ran == []


# -- HELD: threads x compile ---------------------------------------------------------------------

THREAD_MATRIX = r"""
def step(f, calls, n=2):
    x = torch.linspace(-1, 1, n * 3).reshape(n, 3).requires_grad_()
    calls.clear()
    y = f(x)
    (y * torch.tensor([1.0, -2.0])).sum().backward()
    return (
        [c for c in calls if "Optimized" not in c and "GraphModule" not in c],
        round(float(y.sum()), 5),
        [round(v, 5) for v in x.grad.flatten().tolist()],
    )


def reg(kind, calls):
    name = lambda tag, m: calls.append(tag + type(m).__name__)
    if kind == "fwd_kw":
        return unihook.register_module_forward_hook(
            lambda m, a, k, o: name("K:", m), backend="torch", with_kwargs=True
        )
    if kind == "fwd_always":
        return unihook.register_module_forward_hook(
            lambda m, a, o: name("A:", m), backend="torch", always_call=True
        )
    if kind == "pre":
        return unihook.register_module_forward_pre_hook(lambda m, a: name("P:", m))
    if kind == "bw":
        return unihook.register_module_full_backward_hook(
            lambda m, gi, go: name("B:", m), backend="torch"
        )
    return unihook.register_module_full_backward_pre_hook(lambda m, go: name("Q:", m))


idle = threading.Event()
threading.Thread(target=idle.wait, daemon=True).start()
out = []
for kind, backend, mode in CASES:
    calls = []
    h = reg(kind, calls)
    oracle_on, oracle_3 = step(net(), calls), step(net(), calls, 3)
    h.remove()
    oracle_off = step(net(), calls)
    torch._dynamo.reset()
    m = net()
    if mode == "in_place":
        m.compile(backend=backend)
        f = m
    else:
        f = torch.compile(m, backend=backend, dynamic=mode == "dynamic")
    on_thread(lambda: step(f, calls))  # compiled on thread A
    hs = []
    on_thread(lambda: hs.append(reg(kind, calls)))  # registered on B
    on, on3 = on_thread(lambda: step(f, calls)), on_thread(lambda: step(f, calls, 3))
    on_thread(lambda: hs[0].remove())
    off = on_thread(lambda: step(f, calls))
    out.append([on == oracle_on, on3 == oracle_3, off == oracle_off, len(on[0]) > 0])
print(out)
"""

THREAD_CASES = [
    ("bw", "eager", "compile"),
    ("bwpre", "eager", "in_place"),
    ("fwd_kw", "eager", "dynamic"),
    ("fwd_always", "aot_eager", "compile"),
    ("pre", "aot_eager", "dynamic"),
]


def test_global_hook_registered_and_removed_on_another_thread_held() -> None:
    """HELD (5ed021b): a model compiled on thread A; a global hook registered on thread B,
    joined; run on a new thread (compiled shape and a new one): eager's calls, output and
    gradients; removed on B: no call, eager's numbers (an idle thread alive throughout, so
    the invalidation path runs). 5 of the 28 cases tried."""
    got = _child(f"CASES = {THREAD_CASES!r}\n" + THREAD_MATRIX)
    assert got == [[True, True, True, True]] * len(THREAD_CASES)


# -- HELD: an invalidation waiting on dynamo's compile lock --------------------------------------

COMPILE_LOCK_RACE = r"""
sys.setswitchinterval(1e-6)
m = net()
go, calls, gate, seen = threading.Event(), [], [False], []


def backend(gm, example):
    if gate[0]:  # (A holds dynamo's compile lock here, the graph traced without the hook)
        gate[0] = False
        go.set()
        time.sleep(0.05)  # B registers meanwhile, then waits for the lock to invalidate
    return gm.forward


for _ in range(4):
    torch._dynamo.reset()
    f = torch.compile(m, backend=backend)
    go.clear()
    f(torch.randn(2, 3))
    gate[0] = True
    hs = []

    def b():
        go.wait()
        hs.append(unihook.register_module_forward_hook(
            lambda mod, a, o: calls.append(type(mod).__name__), backend="torch"
        ))

    t = threading.Thread(target=b)
    t.start()
    f(torch.randn(5, 3))  # a recompile (new shape) during which B registers
    t.join()
    calls.clear()
    f(torch.randn(5, 3))
    seen.append(len([c for c in calls if c in ("Linear", "ReLU")]))
    hs[0].remove()
print(seen)
"""


def test_registration_during_a_compile_on_another_thread_is_seen_held() -> None:
    """HELD: B registers a global forward hook while A's recompile holds dynamo's compile lock
    (the graph traced before the hook came); after it, the same shape sees the hook (3 calls)
    every time: the entry is installed before B's invalidation gets the GIL (1 us switch
    interval too)."""
    assert _child(COMPILE_LOCK_RACE) == [3, 3, 3, 3]


CHURN_DYNAMIC = r"""
sys.setswitchinterval(1e-6)
torch._dynamo.config.recompile_limit = 100000
torch._dynamo.config.accumulated_recompile_limit = 100000
f = torch.compile(net(), backend="eager", dynamic=True)
done, outs, churns = threading.Event(), [], [0]


def a():
    try:
        for i in range(150):
            outs.append(round(float(f(torch.ones(2 + i % 3, 3)).sum()), 4))
    finally:
        done.set()


def b():
    while not done.is_set():
        h = unihook.register_module_forward_hook(lambda mod, a, o: None, backend="torch")
        time.sleep(0.0005)
        h.remove()
        churns[0] += 1
        time.sleep(0.0005)


ts = [threading.Thread(target=a), threading.Thread(target=b)]
[t.start() for t in ts]
[t.join() for t in ts]
print([len(outs), len(set(outs)), churns[0] > 0])
"""


def test_churn_beside_dynamic_shape_guards_held() -> None:
    """HELD: a `dynamic=True` compiled model at 3 batch sizes on A (python shape guards, the
    limit raised so they keep running), B churning a global forward hook every ms, 1 us switch
    interval: exit 0, 150 outputs, 3 distinct."""
    done = run_code(PRELUDE + CHURN_DYNAMIC, timeout=180)
    assert done.returncode == 0, done.returncode
    assert last_value(done) == [150, 3, True]


# -- HELD: fullgraph, removals, both backends' escapes -------------------------------------------

FULLGRAPH_BOTH = r"""
import paddle

if ORDER == "torch first":
    import unihook_torch, unihook_paddle
else:
    import unihook_paddle, unihook_torch


def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as e:
        return str(e)


m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
out = []
for fullgraph in (True, False):
    for what in ("remove_mod", "remove_glob", "register", "backends"):
        torch._dynamo.reset()
        hs = [
            unihook.register_forward_hook(m[0], lambda *a: None),
            unihook.register_module_forward_hook(lambda *a: None),
        ]

        def fn(x):
            if what == "remove_mod":
                hs[0].remove()
            elif what == "remove_glob":
                hs[1].remove()
            elif what == "register":
                hs.append(unihook.register_module_forward_pre_hook(lambda *a: None))
            else:
                unihook.backends()
            return m(x)

        got = attempt(lambda: torch.compile(fn, backend="eager", fullgraph=fullgraph)(
            torch.ones(2, 3)))
        key = {"remove_mod": "unihook removes a hook", "remove_glob": "unihook removes a hook",
               "register": "unihook registers a global", "backends": "unihook.backends() reads"}
        out.append(key[what] in got if fullgraph else got)
        for h in hs:
            h.remove()
print(out)
"""


@pytest.mark.parametrize("order", ["torch first"])  # (paddle first held too)
def test_fullgraph_reasons_with_paddle_escape_loaded_held(order: str) -> None:
    """HELD (0376648): with the paddle backend loaded too (its escape innermost or outermost
    of `escaped`'s chain), a removal (per-module, global), a registration and
    ``unihook.backends()`` inside a compiled function: under fullgraph unihook's reason for
    each; without, no error."""
    pytest.importorskip("paddle")
    got = _child(f"ORDER = {order!r}\n" + FULLGRAPH_BOTH)
    assert got == [True] * 4 + ["ok"] * 4


SELF_REMOVING = r"""
def attempt(fn):
    try:
        return round(fn(), 4)
    except Exception as e:
        return type(e).__name__


m = net()[:2]
res = []
for fullgraph in (True, False):
    for native in (False, True):
        torch._dynamo.reset()
        calls, hs = [], []

        def hook(mod, a, o):
            calls.append(1)
            hs[0].remove()

        hs.append(m[0].register_forward_hook(hook) if native else
                  unihook.register_forward_hook(m[0], hook))
        f = torch.compile(m, backend="eager", fullgraph=fullgraph)
        res.append(([attempt(lambda: float(f(torch.ones(2, 3)).sum())) for _ in range(3)],
                    len(calls)))
print(res)
"""


def test_self_removing_hook_under_compile_as_torch_own_held() -> None:
    """HELD: a forward hook removing itself inside a compiled forward: unihook's calls and
    outputs equal torch's own hook's (without fullgraph; the trace-time calls included), and
    fullgraph=True is an error for both (dynamo's ``Unsupported``), as at 371f2e3."""
    unihook_fg, torch_fg, unihook_plain, torch_plain = _child(SELF_REMOVING)
    assert unihook_plain == torch_plain
    assert unihook_fg[0] == torch_fg[0] == ["Unsupported"] * 3
