"""helper-62's attack on 4e26d34: hooks under `torch.compile` and `paddle.jit.to_static`
(README, Compilers): each hook kind must give eager's calls, outputs and gradients, or a clear
unihook error naming the compiler; never a silent skip or a wrong gradient.

What tests/test_compilers.py does not reach:

- paddle SOT *compiling*. SOT falls back to dygraph for a frame whose graph has fewer than
  `MIN_GRAPH_SIZE` (paddle's env var, default 10) ops: test_compilers.py's 3-layer model runs
  in dygraph, so its SOT matrix never sees a compiled frame (with `MIN_GRAPH_SIZE=0` its
  hooks, which break SOT's graph, still pass but for the backward kinds: FINDING 5,
  `MIN_GRAPH_SIZE=0 pytest tests/test_compilers.py -k "paddle and sot"`, 4 of 18 fail). A
  7-layer Sequential of Linear/Tanh (>= 10 ops) is compiled at paddle's defaults: there
  global hooks whose body does not break SOT's graph are left out for every sub-layer, and
  every per-module kind registered after the first static call is never run (FINDINGS 1-3),
  so the recipes placed on a converted model see only the model itself, or nothing (FINDING
  4); a hook given as a `functools.partial` crashes SOT's guard (FINDING 8). With
  `MIN_GRAPH_SIZE=0` (set in the child) the recipes and a per-module hook registered by a
  hook crashed in SOT's translation of pluggy and of unihook's registration (FINDINGS 9, 10;
  helper-70).
- torch: a forward pre-hook on the compiled module itself beside a global backward hook, and a
  global hook registered from inside a compiled forward (FINDINGS 6, 7).

Each FINDING is a strict xfail asserting the correct behaviour; HELD tests pin what held.
Every case runs in a child process (`children.run_code`): dynamo's and SOT's caches stay out of
the test process, and a framework crash fails one test.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from children import last_value, run_code

PADDLE_HOOKS = r"""
import warnings

warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook
from unihook.recipes import ActivationStats, DropHook, GradCAM


def net():
    # 7 sublayers: SOT's graph has >= MIN_GRAPH_SIZE (10) ops, so SOT compiles it instead of
    # falling back to dygraph (the 3-layer model of test_compilers.py falls back)
    paddle.seed(0)
    return paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else paddle.nn.Tanh() for i in range(7)]
    )


x0 = np.arange(6, dtype="float32").reshape(2, 3) / 6


def run(static, register, before):
    m = net()
    f = paddle.jit.to_static(m) if static else m
    calls = []
    h = register(m, calls) if before else None
    x = paddle.to_tensor(x0, stop_gradient=False)
    f(x).sum().backward()
    if not before:
        h = register(m, calls)
    x.clear_gradient()
    calls.clear()
    y = f(x)
    y.sum().backward()
    h.remove()
    return [len(calls), round(float(y.sum()), 4), round(float(x.grad.sum()), 4)]


def global_fwd(m, calls):
    def hook(layer, args, out):
        calls.append(1)  # no graph break in the hook
        return out * 2 if isinstance(layer, paddle.nn.Linear) else None

    return unihook.register_module_forward_hook(hook, backend="paddle")


def module_fwd(m, calls):
    return unihook.register_forward_hook(m[2], lambda l, a, o: (calls.append(1), o * 2)[1])


def module_bw(m, calls):
    return unihook.register_full_backward_hook(
        m[2], lambda l, gi, go: (calls.append(1), (gi[0] * 2,))[1]
    )


out = {}
for name, reg, before in [
    ("global_before", global_fwd, True),
    ("module_after", module_fwd, False),
    ("backward_after", module_bw, False),
    ("module_before", module_fwd, True),
]:
    out[name] = [run(False, reg, before), run(True, reg, before)]

print(out)
"""

PADDLE_RECIPE = r"""
import sys, warnings

warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook
from unihook.recipes import ActivationStats, DropHook, GradCAM

which, static = WHICH, STATIC
paddle.seed(0)
m = paddle.nn.Sequential(
    paddle.nn.Conv2D(3, 4, 3, padding=1),
    paddle.nn.ReLU(),
    paddle.nn.Conv2D(4, 5, 3, padding=1),
    paddle.nn.ReLU(),
    paddle.nn.AdaptiveAvgPool2D(1),
    paddle.nn.Flatten(),
    paddle.nn.Linear(5, 3),
)
f = paddle.jit.to_static(m) if static else m
x = paddle.to_tensor(np.random.RandomState(1).randn(2, 3, 6, 6).astype("float32"))
f(x)  # the model runs (and SOT converts it) before the recipe comes
try:
    if which == "stats":
        with ActivationStats(f) as stats:
            f(x)
            f(x * 2)
        out = [
            (r["name"], r["calls"], round(r["mean"], 5), round(r["std"], 5)) for r in stats.rows()
        ]
    elif which == "gradcam":
        out = np.round(GradCAM(f, m[2])(x), 4).tolist()
    elif which == "drophook":
        m.train()
        plain = f(x).numpy()
        with DropHook(f, {"1": 0.5}):
            dropped = f(x).numpy()
        after = f(x).numpy()
        # dropped: the output changes under the recipe, and is the plain one again after it
        out = [not bool(np.allclose(dropped, plain)), bool(np.allclose(after, plain))]
except Exception as e:
    out = type(e).__name__ + ": " + str(e)[:200]
print(repr(out))
"""

PADDLE_MIN_GRAPH_SIZE_0 = r"""
import os

os.environ["MIN_GRAPH_SIZE"] = "0"  # SOT compiles every frame
import warnings

warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook


def run(static):
    paddle.seed(0)
    m = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 2))
    f = paddle.jit.to_static(m) if static else m
    calls = []
    h = unihook.register_full_backward_hook(
        m[0], lambda l, gi, go: (calls.append(1), (gi[0] * 2,))[1]
    )
    x = paddle.to_tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], stop_gradient=False)
    try:
        f(x).sum().backward()
        return [len(calls), [round(float(v), 5) for v in x.grad.numpy().ravel()]]
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:200]
    finally:
        h.remove()


print([run(False), run(True)])
"""

PADDLE_PARTIAL_HOOK = r"""
import functools, warnings

warnings.filterwarnings("ignore")
import paddle, unihook


class Recorder:
    def __init__(self):
        self.calls = 0

    def hook(self, layer, args, out, name=None):
        self.calls += 1


def run(static, native):
    paddle.seed(0)
    m = paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else paddle.nn.Tanh() for i in range(7)]
    )
    f = paddle.jit.to_static(m) if static else m
    rec = Recorder()
    hook = functools.partial(rec.hook, name="2")
    h = (
        m[2].register_forward_post_hook(hook)
        if native
        else unihook.register_forward_hook(m[2], hook)
    )
    try:
        for _ in range(2):
            f(paddle.ones([2, 3]))
        return rec.calls
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:300]
    finally:
        h.remove()


print([run(False, False), run(True, False), run(True, True)])
"""

TORCH_CRASHES = r"""
import warnings

warnings.filterwarnings("ignore")
import torch, torch._dynamo, unihook


def attempt(fn):
    try:
        return fn()
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:120]


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def root_pre_and_global_backward(compiled):
    torch._dynamo.reset()
    m, calls = net(), []
    hs = [
        unihook.register_full_backward_hook(m, lambda mod, gi, go: calls.append("root")),
        unihook.register_module_full_backward_hook(
            lambda mod, gi, go: calls.append(type(mod).__name__), backend="torch"
        ),
    ]
    try:
        f = torch.compile(m, backend="eager") if compiled else m
        x = torch.ones(2, 3, requires_grad=True)
        f(x).sum().backward()
        return [c for c in calls if c != "OptimizedModule"], [
            round(v, 5) for v in x.grad.flatten().tolist()
        ]
    finally:
        for h in hs:
            h.remove()


def global_registered_inside(compiled):
    torch._dynamo.reset()
    m, calls, hs = net(), [], []

    def later(mod, args, out):
        if not hs:
            hs.append(
                unihook.register_module_forward_hook(
                    lambda mod, a, o: calls.append(type(mod).__name__), backend="torch"
                )
            )

    first = unihook.register_forward_hook(m[0], later)
    try:
        f = torch.compile(m, backend="eager") if compiled else m
        f(torch.ones(2, 3))
        return [c for c in calls if c != "OptimizedModule"]
    finally:
        first.remove()
        for h in hs:
            h.remove()


out = {}
for name, fn in [
    ("root_pre_and_global_backward", root_pre_and_global_backward),
    ("global_registered_inside", global_registered_inside),
]:
    out[name] = [attempt(lambda: fn(False)), attempt(lambda: fn(True))]
print(out)
"""

TORCH_HELD = r"""
import warnings

warnings.filterwarnings("ignore")
import numpy as np, torch, torch._dynamo, unihook
from unihook.recipes import ActivationStats, GradientMonitor


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def register(kind, m, calls):
    # each hook changes what it may change: a removed hook left in the compiled code shows
    if kind == "forward_pre":
        return unihook.register_forward_pre_hook(
            m[2], lambda mod, a: (calls.append(kind), (a[0] * 1.5,))[1]
        )
    if kind == "forward":
        return unihook.register_forward_hook(
            m[2], lambda mod, a, o: (calls.append(kind), o * 0.5 + 0.25)[1], with_kwargs=False
        )
    if kind == "full_backward_pre":
        return unihook.register_full_backward_pre_hook(
            m[2], lambda mod, go: (calls.append(kind), (go[0] * 2,))[1]
        )
    if kind == "full_backward":
        return unihook.register_full_backward_hook(
            m[2], lambda mod, gi, go: (calls.append(kind), (gi[0] * -0.5,))[1]
        )
    if kind == "module_forward":

        def hook(mod, a, o):
            if isinstance(mod, torch.nn.Linear):
                calls.append(kind)
                return o * 2

        return unihook.register_module_forward_hook(hook, backend="torch")
    if kind == "module_full_backward_pre":

        def hook(mod, go):
            if isinstance(mod, torch.nn.ReLU):
                calls.append(kind)
                return (go[0] * 3,)

        return unihook.register_module_full_backward_pre_hook(hook, backend="torch")


def scenario(kind, compiled):
    # a call, the hook registered, two calls (the second recompiled for a new batch size),
    # the hook removed, two calls: hook calls, outputs and input gradients of each call
    torch._dynamo.reset()
    m, calls, rows = net(), [], []
    f = torch.compile(m, backend="eager") if compiled else m

    def step(n):
        x = torch.linspace(-1, 1, n * 3).reshape(n, 3).requires_grad_()
        calls.clear()
        y = f(x)
        (y * torch.tensor([1.0, -2.0])).sum().backward()
        rows.append(
            (
                len(calls),
                round(float(y.sum()), 5),
                [round(v, 5) for v in x.grad.flatten().tolist()],
            )
        )

    step(2)
    h = register(kind, m, calls)
    step(2)
    step(3)
    h.remove()
    step(2)
    step(3)
    return rows


KINDS = [
    "forward_pre",
    "forward",
    "full_backward_pre",
    "full_backward",
    "module_forward",
    "module_full_backward_pre",
]
out = {kind: [scenario(kind, False), scenario(kind, True)] for kind in KINDS}


def recipes(compiled):
    torch._dynamo.reset()
    m = net()
    f = torch.compile(m, backend="eager") if compiled else m
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    f(x)
    with ActivationStats(f) as stats, GradientMonitor(f) as grads:
        for i in range(2):
            (f(x * (i + 1)) * torch.tensor([1.0, -2.0])).sum().backward()
    return (
        [
            {k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}
            for r in stats.rows()
        ],
        [{k: round(v, 5) for k, v in h.items()} for h in grads.history],
    )


out["recipes"] = [recipes(False), recipes(True)]
print(out)
"""


@functools.cache
def _child(code: str) -> Any:
    return last_value(run_code(code, timeout=240))


def _paddle() -> dict[str, Any]:
    pytest.importorskip("paddle")
    return _child(PADDLE_HOOKS)


def _recipe(which: str, static: bool, every_frame: bool = False) -> Any:
    """`every_frame`: with `MIN_GRAPH_SIZE=0` (SOT compiles every frame), set in the child."""
    pytest.importorskip("paddle")
    code = PADDLE_RECIPE.replace("WHICH", repr(which)).replace("STATIC", str(static))
    if every_frame:
        code = 'import os\n\nos.environ["MIN_GRAPH_SIZE"] = "0"\n' + code
    return _child(code)


def _torch(code: str) -> dict[str, Any]:
    pytest.importorskip("torch")
    return _child(code)


# -- paddle.jit.to_static, SOT compiling the frame ------------------------------------------------


def test_paddle_sot_global_forward_hook_reaches_every_layer() -> None:
    """FINDING 1 (silent skip, silent wrong output and gradient). Repro: the 7-layer Sequential
    (Linear(3, 3), Tanh, ... x4 Linear), `unihook.register_module_forward_hook(hook,
    backend="paddle")` where `hook` records the call and doubles each Linear's output (nothing
    in it breaks SOT's graph), registered before the first call of `paddle.jit.to_static(m)`.
    Eager: 8 calls, y.sum() -0.0455, x.grad.sum() 7.2348. SOT: 1 call (the model itself, whose
    `__call__` runs in dygraph), y.sum() 0.0416, x.grad.sum() 1.268 -- the numbers without the
    hook. The global wrapper skips every call while SOT simulates or builds a subgraph ("the
    real ones follow in dygraph"), which holds only when the hook breaks the graph; here no
    real call follows. The same with module_forward_pre / module_full_backward(_pre)
    (fuzz: every global kind, before or after the first call)."""
    eager, sot = _paddle()["global_before"]
    assert eager == [8, -0.0455, 7.2348]
    assert sot == eager


def test_paddle_sot_forward_hook_registered_after_the_first_call() -> None:
    """FINDING 2 (silent skip). Repro: the 7-layer Sequential, `f = paddle.jit.to_static(m)`,
    `f(x)` once, then `unihook.register_forward_hook(m[2], hook)` with `hook` returning
    `out * 2`. Eager: 1 call, y.sum() 0.0319, x.grad.sum() 2.1432. SOT: 0 calls, 0.0416,
    1.268 on every later call: SOT's compiled frame has no guard on the sub-layer's hooks
    (paddle's own `register_forward_post_hook` is skipped the same way), and unihook drops the
    built code only for full_graph=True. Registered before the first call it works
    (HELD below)."""
    eager, sot = _paddle()["module_after"]
    assert eager == [1, 0.0319, 2.1432]
    assert sot == eager


def test_paddle_sot_backward_hook_registered_after_the_first_call() -> None:
    """FINDING 3 (silent skip, silent wrong gradient). As FINDING 2 with
    `register_full_backward_hook(m[2], hook)` doubling grad_input: eager 1 call,
    x.grad.sum() 2.5359; SOT 0 calls, 1.268 (the plain gradient). full_backward_pre and tensor
    hooks (from a forward hook) the same."""
    eager, sot = _paddle()["backward_after"]
    assert eager == [1, 0.0416, 2.5359]
    assert sot == eager


def test_paddle_sot_forward_hook_registered_before_the_first_call_held() -> None:
    """HELD: registered before SOT's first call, a per-module hook is traced into the compiled
    frame: eager's call and numbers."""
    eager, sot = _paddle()["module_before"]
    assert eager == [1, 0.0319, 2.1432]
    assert sot == eager


def test_paddle_sot_activation_stats_sees_every_layer() -> None:
    """FINDING 4a (silent skip; FINDING 2 through a recipe). Repro: a 7-layer conv net,
    `f = paddle.jit.to_static(m)`, `f(x)`, then `with ActivationStats(f) as s: f(x); f(2 * x)`.
    Eager: rows for '', '0' ... '6'. SOT: one row, '' (the model's own `__call__`). The same
    with GradientMonitor (history {'': 5.2915} only) and `unihook.capture(f, grads=True)`
    (only key '')."""
    eager, sot = _recipe("stats", False), _recipe("stats", True)
    assert [row[0] for row in eager] == ["", "0", "1", "2", "3", "4", "5", "6"]
    assert sot == eager


def test_paddle_sot_gradcam() -> None:
    """FINDING 4b (wrong error). The conv net as in 4a, `GradCAM(f, m[2])(x)`: eager gives the
    maps; SOT raises HookArgumentError "`call` must index the calls of '2', which ran 0
    time(s) in this forward" -- the layer ran, its hook did not (FINDING 2)."""
    eager, sot = _recipe("gradcam", False), _recipe("gradcam", True)
    assert isinstance(eager, list)
    assert sot == eager


def test_paddle_sot_drophook() -> None:
    """FINDING 4c (silent skip). The conv net as in 4a, `with DropHook(f, {"1": 0.5}): f(x)` in
    train mode: eager's output changes under the recipe and is the plain one after it; under
    SOT the output is the plain one (seen [False, True]): no dropout at all (FINDING 2). With
    a unihook forward hook also registered on m[2] after the first call, SOT raises instead:
    paddle.jit.sot InnerError (HasNoAttributeError: ObjectVariable(<HookCaller
    'unihook_ops'>) ...), SOT simulating unihook's ops dispatch through pluggy."""
    eager, sot = _recipe("drophook", False), _recipe("drophook", True)
    assert eager == [True, True]
    assert sot == eager


def test_paddle_sot_compiled_full_backward_hook() -> None:
    """FINDING 5 (crash), FIXED: a graph break runs the hooked layer's call in dygraph, but SOT
    still translates each frame that call makes; `EagerUnderSOT` now runs the dispatcher with
    SOT's frame evaluation off (tests/test_compilers.py's "sot_compiled" mode runs the backward
    kinds so). Repro: test_compilers.py's model (Linear(3, 4), ReLU, Linear(4, 2)),
    `MIN_GRAPH_SIZE=0` (SOT compiles the frame instead of falling back to dygraph),
    `register_full_backward_hook(m[0], hook)` doubling grad_input, before the first call of
    `paddle.jit.to_static(m)`. Eager: 1 call, x.grad [-0.84058, -0.64246, -1.85308, ...].
    SOT: paddle.jit.sot InnerError "In simulate execution: ... _module_backward.py,
    _watch_inputs ... _kept_inputs.py kept_inputs ... NotImplementedError": the post
    dispatcher, meant to run outside SOT (EagerUnderSOT), is simulated."""
    eager, sot = _child(PADDLE_MIN_GRAPH_SIZE_0)
    assert eager[0] == 1
    assert sot == eager


def test_paddle_sot_partial_hook_registered_before_the_first_call() -> None:
    """FINDING 8 (crash). Repro: the 7-layer Sequential; `unihook.register_forward_hook(m[2],
    functools.partial(recorder.hook, name="2"))` before the first call of
    `paddle.jit.to_static(m)`: paddle.jit.sot InnerError "In simulate execution: File
    unihook/_pinned.py, line 211 ... snap = self._snap = (version, self._copy()) ... File
    "<string>" ... SyntaxError": SOT simulates unihook's hook table (`_pinned`) and writes a
    guard holding the partial's repr (`functools.partial(<bound method ...>, name='2')`), which
    is no Python. Eager: 2 calls; paddle's own `register_forward_post_hook` with the same
    partial under SOT: 2 calls. ActivationStats and GradientMonitor placed before the first
    static call crash the same way (their hooks are such partials: `ActivationStats._started`,
    name='0')."""
    eager, sot, native = _child(PADDLE_PARTIAL_HOOK)
    assert eager == native == 2
    assert sot == eager


@pytest.mark.parametrize("which", ["stats", "gradcam", "drophook"])
def test_paddle_sot_compiling_every_frame_recipes(which: str) -> None:
    """FINDING 9 (crash; helper-70), FIXED. FINDINGS 4a-4c's program with `MIN_GRAPH_SIZE=0`
    (set in the child): ActivationStats, GradCAM and DropHook raised paddle.jit.sot InnerError
    "In simulate execution: File .../pluggy/_caller.py ... HookCaller 'unihook_ops' ... has
    no attribute _inner_hookexec". The hooked layer's call runs in dygraph after its guard's
    graph break, but SOT translates each frame it makes, the recipe's hook too (with
    MIN_GRAPH_SIZE=0 it compiles them): its first `unihook.ops` call on a layer type
    (ActivationStats' `ops.in_backward(module)`) or on paddle's tensor type (GradCAM's
    `ops.clone`, DropHook's `ops.dropout`) looks the backend up through pluggy (once per type),
    and SOT translated pluggy's frames. Fixed: SOT skips the frames of unihook's files (the
    core, the recipes, the paddle backend) and pluggy's, as it skips paddle's."""
    eager, sot = _recipe(which, False), _recipe(which, True, every_frame=True)
    assert isinstance(eager, list)
    assert sot == eager


PADDLE_REGISTER_INSIDE = r"""
import os

os.environ["MIN_GRAPH_SIZE"] = "0"  # SOT compiles every frame
import warnings

warnings.filterwarnings("ignore")
import paddle, unihook


def net():
    paddle.seed(0)
    return paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else paddle.nn.Tanh() for i in range(7)]
    )


def register(kind, m, calls):
    if kind == "module":
        return unihook.register_forward_hook(m[4], lambda l, a, o: (calls.append("m4"), o * 2)[1])
    return unihook.register_module_forward_hook(
        lambda l, a, o: calls.append(type(l).__name__), backend="paddle"
    )


class Net(paddle.nn.Layer):
    def __init__(self, kind, calls, handles):
        super().__init__()
        self.body, self.kind, self.calls, self.handles = net(), kind, calls, handles

    def forward(self, x):
        if not self.handles:  # registered by the converted function itself, on its first call
            self.handles.append(register(self.kind, self.body, self.calls))
        return self.body(x) * 2


def run(static, kind, where):
    calls, handles = [], []
    if where == "hook":  # registered by a hook of m[0] on its first call
        m = net()

        def later(layer, args, out):
            if not handles:
                handles.append(register(kind, m, calls))

        first = unihook.register_forward_hook(m[0], later)
    else:
        m = Net(kind, calls, handles)
    f = paddle.jit.to_static(m) if static else m
    try:
        for _ in range(2):
            x = paddle.ones([2, 3])
            x.stop_gradient = False
            y = f(x)
            y.sum().backward()
        return [calls, round(float(y.sum()), 4), round(float(x.grad.sum()), 4)]
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:300]
    finally:
        for h in handles + ([first] if where == "hook" else []):
            h.remove()


print(
    {
        (kind, where): [run(False, kind, where), run(True, kind, where)]
        for kind in ["module", "global"]
        for where in ["hook", "forward"]
    }
)
"""


@pytest.mark.parametrize("kind", ["module", "global"])
@pytest.mark.parametrize("where", ["hook", "forward"])
def test_paddle_sot_compiling_every_frame_registration_inside(kind: str, where: str) -> None:
    """FINDING 10 (crash; helper-70), FIXED: ("module", "hook"); the other three HELD.
    Repro: `MIN_GRAPH_SIZE=0`, the 7-layer Sequential; `unihook.register_forward_hook(m[4],
    hook)` made by a unihook forward hook of m[0] on its first call, then two calls of
    `paddle.jit.to_static(m)`: paddle.jit.sot InnerError "In simulate execution: File
    .../unihook_paddle/_static.py ... in $resume_...@retranslate ... if cache.cache:": SOT
    translated the registration's frames, which run in dygraph after m[0]'s graph break (the
    registration drops the code SOT translated, `retranslate`), and crashed on a guard of its
    own. Fixed as FINDING 9: SOT skips unihook's frames. Held: the registration made by the
    converted function itself (`where="forward"`, on its first call), and a global hook
    registered either way (through the paddle backend's escape, `add_compiler_escape`: SOT's
    frame evaluation off for the registration)."""
    eager, sot = _child(PADDLE_REGISTER_INSIDE)[(kind, where)]
    assert isinstance(eager, list) and eager[0]
    assert sot == eager


# -- torch.compile --------------------------------------------------------------------------------


def test_torch_root_backward_hook_beside_a_global_backward_hook() -> None:
    """FINDING 6 (crash), FIXED. Repro: `m = Sequential(Linear(3, 4), ReLU(), Linear(4, 2))`,
    `unihook.register_full_backward_hook(m, hook)` (on the compiled module itself) and
    `unihook.register_module_full_backward_hook(g, backend="torch")`, then
    `torch.compile(m, backend="eager")(x).sum().backward()`: AssertionError
    "UnspecializedNNModuleVariable(Sequential) is already tracked for mutation" from dynamo.
    Eager: calls Linear, ReLU, Linear, Sequential, root. Any forward pre-hook on the compiled
    module does it (unihook's forward_pre, with_kwargs or not, full_backward_pre, and torch's
    own `m.register_forward_pre_hook`), with a unihook global full_backward or
    full_backward_pre hook, registered before or after the first compiled call, dynamic or
    not; torch's own global backward hook instead does not crash. On a sub-module it works.
    Fixed: for a module whose own pre-hooks hold the global dispatchers, unihook's wrapper of
    ``Module._call_impl`` asked in the traced code whether the call is inside the module's
    own marked call (`ModuleBackward.inside`); the module marked there is the OptimizedModule,
    which dynamo unwraps to the module it already tracks. It now asks outside dynamo (a graph
    break, only while dynamo traces such a module)."""
    eager, compiled = _torch(TORCH_CRASHES)["root_pre_and_global_backward"]
    assert isinstance(eager, tuple)
    assert compiled == eager


def test_torch_global_hook_registered_inside_a_compiled_forward() -> None:
    """FINDING 7 (crash, misleading error), FIXED. Repro: a unihook forward hook on m[0] that
    registers `unihook.register_module_forward_hook(g, backend="torch")` on its first call;
    `torch.compile(m, backend="eager")(x)`: InternalTorchDynamoError "PackageNotFoundError: No
    package metadata was found for mindspore": dynamo traces the registration into
    `unihook.backends()` and the MindSpore backend's `importlib.metadata.version`. Eager: g
    sees ReLU and Linear. With torch's own forward hook doing the registration, or a
    per-module hook registered there, it works. Fixed: a global hook's registration (and
    `unihook.backends()`) runs through each backend's escape from its compiler
    (`unihook.backend.add_compiler_escape`): the torch backend's runs it outside dynamo while
    dynamo traces (a graph break; under fullgraph=True dynamo's error gives unihook's
    reason)."""
    eager, compiled = _torch(TORCH_CRASHES)["global_registered_inside"]
    assert eager == ["ReLU", "Linear"]
    assert compiled == eager


@pytest.mark.parametrize(
    "kind",
    [
        "forward_pre",
        "forward",
        "full_backward_pre",
        "full_backward",
        "module_forward",
        "module_full_backward_pre",
    ],
)
def test_torch_hook_added_then_removed_around_compiled_calls_held(kind: str) -> None:
    """HELD: a hook that changes the output or the gradient, registered after the first
    compiled call, run at two batch sizes (a recompile), then removed: the compiled model runs
    it exactly while it lives and gives eager's outputs and gradients before, during and after
    (no stale compiled code keeps a removed hook, none misses a new one)."""
    eager, compiled = _torch(TORCH_HELD)[kind]
    assert eager[0][0] == eager[3][0] == eager[4][0] == 0 and eager[1][0] > 0
    assert compiled == eager


def test_torch_recipes_on_a_compiled_model_held() -> None:
    """HELD: ActivationStats and GradientMonitor given the OptimizedModule (placed after its
    first compiled call) report eager's rows and norms, under the inner model's names."""
    eager, compiled = _torch(TORCH_HELD)["recipes"]
    assert [row["name"] for row in eager[0]] == ["", "0", "1", "2"]
    assert compiled == eager
