"""helper-64's attack on 0eac8c9 (GradientMonitor: a module returning its input gets a module
backward pre-hook), 2f7d780 (paddle SOT: hooked layers break SOT's graph, hook changes drop
SOT's code) and 7445fa5 (MindSpore ops).

Oracles: torch's native ``register_full_backward_hook`` grad_output norms on a copy of the
model, numpy on the known weights (``x -> h = fc1(x) -> head(h + fc2(norm(h)))``, norm's
grad_output ``ones @ W_head @ W2``), eager paddle for SOT, torch twins for MindSpore.

Each FINDING is ``xfail(strict=True)``: it asserts the right behaviour and fails on 2f7d780.
HELD tests pin what the attack tried that held. The paddle and MindSpore cases run in child
processes (``children.run_code``; MindSpore ones need the MindSpore venv, where they import
MindSpore first).

What was tried (scripts not kept), GradientMonitor on torch against native full backward
hooks: nn.Identity / eval Dropout / Dropout(p=0) / Flatten of a flat input / ``x.contiguous()``
/ Sequential(Identity) / a module returning its input only every other call / called twice per
forward / ``every=2`` / checkpoint (reentrant and not) / a no_grad forward between forward and
backward / two forwards and one backward of their sum / ``torch.autograd.grad`` / remove()
between forward and backward then a new monitor / an unused branch / in-place ReLU / Identity
followed by an in-place ReLU or ``mul_`` (native hooks crash there; unihook's do not): all
held but FINDINGS 1-4 (the twice-called module's first step reports its second call only, as
documented: "its first call is left out"). SOT (7-layer Linear/Tanh, compiled): forward,
forward-pre (replacing args, two stacked), full backward pre (scaling), global forward and
global full backward hooks, each registered after the first static call then removed;
``to_static`` of a function calling a hooked layer twice: eager's numbers each time, and
plain numbers back after removal; FINDING 5 is a crash. MindSpore: tensor hooks around
setitem (twice), 20 hooks with half removed after a write, a hook removed after a write,
copy_, register/remove/register after a write: torch's gradients (a hook registered before
``copy_`` never fires where torch's sees zeros, as the assign case already pinned); no
leak of the tensor; ActivationStats and GradientMonitor of a container writing its child's
output in place: torch's numbers; FINDING 6.

FINDINGS by severity: 0 / 0b / 0c (silent: under GradientMonitor a model whose Identity's
input or output is written in place after the call trains on other gradients on paddle, and
computes another loss on MindSpore, from the second step: the monitor's own module backward
pre-hook, 0eac8c9); 1, 2, 3, 4 (silent wrong or missing norms); 7 (torch: the same models
raise InPlaceError under the monitor); 5 (SOT crash, regression of 2f7d780); 6 (MindSpore:
a spurious warning and a missing first norm). Also tried and held, not pinned: SOT with a
thread calling the converted model while the main thread registers and removes hooks 40
times (plain numbers, no error); a hooked Linear beside super()-calling Tanh layers, global
hooks and ActivationStats / GradientMonitor on such a model under SOT (no crash: only the
hooked layer calling super() crashes). Not unihook's: a ``to_static`` layer nested in a
converted model crashes SOT (KeyError 'self') with or without unihook; MindSpore's
``y.mul_(3.0)`` under ``ms.grad`` is not recorded, with or without hooks.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import warnings
from typing import Any

import pytest
from children import last_value, run_code

# -- helpers: the pre-norm model on any framework's kit, in a child ------------------------------

KIT_PRE_NORM = r"""
import sys, warnings
warnings.filterwarnings("ignore")
FW = "FRAMEWORK"
if FW == "mindspore":
    import mindspore  # (before paddle)
import numpy as np
from unihook.conformance import installed_kits
from unihook.recipes import GradientMonitor

kit = [k for k in installed_kits() if k.name == FW][0]
rng = np.random.default_rng(7)
W = {}


def linear(n_in, n_out):
    w = W[f"W{len(W)}"] = rng.normal(size=(n_out, n_in)).astype(np.float32)
    return kit.linear(n_in, n_out, weight=w, bias=np.zeros(n_out, np.float32))


children = {
    "fc1": linear(3, 4), "norm": kit.module(lambda self, h: h), "fc2": linear(4, 4),
    "head": linear(4, 2),
}


def forward(self, x):
    h = self.fc1(x)
    return self.head(h + self.fc2(self.norm(h)))


model = kit.module(forward, children)
x = np.random.default_rng(8).normal(size=(5, 3)).astype(np.float32)
want = float(np.linalg.norm(np.ones((5, 2)) @ W["W2"].astype(np.float64) @ W["W1"]))
out = {}
for name, scenario in SCENARIOS.items():
    with GradientMonitor(model) as mon:
        for _ in range(2):  # (the first call is left out)
            kit.backward(model(kit.tensor(x)).sum())
        exec(scenario)
    got = [dict(step).get("norm") for step in list(mon.history)[2:]]
    out[name] = {"want": want, "got": got, "steps": len(mon.history)}
print(out)
"""

# two forwards, then the first's backward, then the second's (its loss has zero gradient)
SWAP = """l1 = model(kit.tensor(x)).sum(); l2 = (model(kit.tensor(3 * x)) * 0).sum()
kit.backward(l1); kit.backward(l2)"""
# a forward with gradients on that is never backwarded, between a forward and its backward
BETWEEN = """l1 = model(kit.tensor(x)).sum(); model(kit.tensor(3 * x)); kit.backward(l1)"""


def _needs(module: str) -> None:
    """Skips unless `module` is installed, without importing it here (a child does: MindSpore
    must come before paddle and torch in a process)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


@functools.cache
def _kit_run(framework: str) -> dict[str, Any]:
    scenarios = {"swap": SWAP, "between": BETWEEN}
    if framework == "mindspore":
        del scenarios["swap"]  # (not run: one backward per forward in the kit's tape)
    code = KIT_PRE_NORM.replace("FRAMEWORK", framework)
    code = code.replace("SCENARIOS", repr(scenarios))
    return last_value(run_code(code, timeout=120))


def _kit(framework: str, scenario: str) -> dict[str, Any]:
    _needs(framework)
    return _kit_run(framework)[scenario]


def _torch_model(norm: Any, kind: str = "plain") -> Any:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class PreNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc1, self.norm, self.fc2 = nn.Linear(3, 4), norm, nn.Linear(4, 4)
            self.head = nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            h = self.fc1(x)
            if kind == "kwarg":
                z = self.norm(input=h)
            elif kind == "list":
                z = self.norm([h])
            else:
                z = self.norm(h)
            if kind == "twin":  # (what an in-place norm computes: h is z)
                return self.head(z + self.fc2(z))
            return self.head(h + self.fc2(z))

    return PreNorm()


def _native_norm(model: Any, x: Any, name: str = "norm") -> float:
    """torch's own full backward hook on a copy: the grad_output norm of `name`."""
    m = copy.deepcopy(model)
    total = [0.0]

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        total[0] += sum(float((g.double() ** 2).sum()) for g in grad_output if g is not None)

    dict(m.named_modules())[name].register_full_backward_hook(hook)
    m(x).sum().backward()
    return math.sqrt(total[0])


# -- GradientMonitor: the LIFO of waiting calls ----------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 1 (answered by d4d65aa: the Identity is left out, README): no norm to compare",
)
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_two_forwards_backwarded_in_their_order(framework: str) -> None:
    """FINDING 1 (silent wrong number, torch and paddle; the recipe is framework-neutral).
    Repro: pre-norm model, 2 warm-up steps, then ``l1 = m(x).sum(); l2 = (m(3x) * 0).sum();
    l1.backward(); l2.backward()``. l1's backward pops the LIFO's latest entry (l2's call) and
    l2's pops l1's: history[2]['norm'] = 0.0 (l2's zero gradient), history[3]['norm'] =
    12.7021 (l1's); want 12.7021 then 0.0. Every other module's tensor hook carries its own
    step and is right. On torch with random losses the two steps' norms are exactly swapped
    (0.6534 / 0.3847 for native 0.3847 / 0.6534)."""
    done = _kit(framework, "swap")
    assert done["got"] == pytest.approx([done["want"], 0.0], rel=1e-5), done


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 2 (answered by d4d65aa: the Identity is left out, README): no norm to compare",
)
@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_unbackwarded_forward_between_forward_and_backward(framework: str) -> None:
    """FINDING 2 (silent wrong history, torch, paddle and MindSpore). Repro:
    ``l1 = m(x).sum(); m(3x)`` (gradients on, e.g. a metric or a teacher pass, never
    backwarded) ``; l1.backward()``:
    the backward pops the second forward's entry, so l1's step has no 'norm' and the history
    gets an extra step {'norm': 12.7021} for the forward that was never backwarded:
    got [None, 12.7021] (3 + 1 steps); want [12.7021] (3 steps, native hooks' count)."""
    done = _kit(framework, "between")
    assert done["got"] == pytest.approx([done["want"]], rel=1e-5), done
    assert done["steps"] == 3, done


@pytest.mark.xfail(
    strict=True,
    reason="FINDING 4 (answered by d4d65aa: the Identity is left out, README): no norm to compare",
)
def test_double_backward_retain_graph_counts_both() -> None:
    """FINDING 4 (silent, inconsistent within a step). Repro: torch pre-norm model, 2 warm-up
    steps, ``l = m(x).sum(); l.backward(retain_graph=True); l.backward()``: every module's
    norm is over both backwards (head 3.1623 -> 4.4721 = sqrt(2) x) but 'norm' stays 0.8923
    (the first backward popped the only waiting entry; the second finds none): want 1.2619."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import GradientMonitor

    model = _torch_model(torch.nn.Identity())
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            for _ in range(2):
                model(x).sum().backward()
            loss = model(x).sum()
            loss.backward(retain_graph=True)
            loss.backward()
    single = dict(monitor.history[1])
    last = dict(monitor.history[-1])
    assert last["head"] == pytest.approx(single["head"] * math.sqrt(2), rel=1e-5)
    assert last["norm"] == pytest.approx(single["norm"] * math.sqrt(2), rel=1e-5), last


# -- GradientMonitor: what `_returns_an_input` misses ----------------------------------------------


@pytest.mark.parametrize("kind", ["kwarg", "list"])
def test_input_returned_from_a_keyword_or_a_list(kind: str) -> None:
    """FINDING 3 (silent wrong number, no warning: the bug 0eac8c9 fixed, through another
    door), FIXED: `_before` takes keyword arguments too and marks the tensors of both and of
    containers by id; the module is then left out with the RuntimeWarning, as for a
    positional return (the documented behaviour), or would be recorded with native's norm.
    Before, `_before` read positional arguments only and `_returns_an_input` compared the
    output with them by identity: ``self.norm(input=h)`` with ``forward(self, input): return
    input``, or ``self.norm([h])`` returning ``xs[0]``, keep the tensor hook, whose gradient
    sums every use of h: norm 2.4306 (= fc1's) for native 0.9692 (kwarg); 1.9823 for native
    0.6836 (list)."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import GradientMonitor

    class KwIdentity(torch.nn.Module):
        def forward(self, input: Any) -> Any:
            return input

    class First(torch.nn.Module):
        def forward(self, xs: Any) -> Any:
            return xs[0]

    model = _torch_model(KwIdentity() if kind == "kwarg" else First(), kind)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    want = _native_norm(model, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            for _ in range(3):
                model(x).sum().backward()
    got = dict(monitor.history[-1]).get("norm")
    if got is None:  # left out, said
        assert any("returned its input unchanged" in str(w.message) for w in caught)
    else:
        assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("which", ["identity", "dropout_eval", "flatten", "nested"])
def test_returned_input_left_out_with_a_warning_held(which: str) -> None:
    """Positional returns (Identity, eval Dropout, Flatten of a flat tensor, a
    Sequential(Identity)): left out of every step, said once (since d4d65aa, which answered
    FINDINGS 0, 0b, 0c and 7: no module backward hook of the monitor's own); the other
    modules' norms are the native hooks'."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    norm = {
        "identity": nn.Identity(),
        "dropout_eval": nn.Dropout(0.5).eval(),
        "flatten": nn.Flatten(),
        "nested": nn.Sequential(nn.Identity()),
    }[which]
    from unihook.recipes import GradientMonitor

    model = _torch_model(norm)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    want = _native_norm(model, x, "fc2")
    with pytest.warns(RuntimeWarning, match="returned its input unchanged"):
        with GradientMonitor(model) as monitor:
            for _ in range(3):
                model(x).sum().backward()
    assert len(monitor.history) == 3
    for step in monitor.history:
        assert "norm" not in step and not any(k.startswith("norm.") for k in step)
        assert dict(step)["fc2"] == pytest.approx(want, rel=1e-5)


def test_inplace_relu_keeps_exact_norms_without_warning_held() -> None:
    """HELD: an in-place ReLU (torch): no RuntimeWarning, its grad_output norm every step
    (native hooks crash on it: the oracle is a twin computing ``z = relu(h); head(z +
    fc2(z))`` out of place)."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import GradientMonitor

    model = _torch_model(torch.nn.ReLU(inplace=True))
    plain = _torch_model(torch.nn.ReLU(), "twin")  # same weights, not in place
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    want = _native_norm(plain, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            for _ in range(2):
                model(x).sum().backward()
    assert [dict(s)["norm"] for s in monitor.history] == pytest.approx([want, want], rel=1e-5)


# -- paddle to_static SOT ------------------------------------------------------------------------

SOT_SUPER = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook


class Tanh(paddle.nn.Tanh):  # a subclass calling its parent's forward
    def forward(self, x):
        return super().forward(x)


def net():
    paddle.seed(0)
    return paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else Tanh() for i in range(7)]
    )


x0 = np.arange(6, dtype="float32").reshape(2, 3) / 6


def go(f):
    x = paddle.to_tensor(x0, stop_gradient=False)
    y = f(x)
    y.sum().backward()
    return [round(float(y.sum()), 5), round(float(x.grad.abs().sum()), 5)]


out = {}
for static in (False, True):
    m = net()
    f = paddle.jit.to_static(m) if static else m
    first = go(f)
    h = unihook.register_forward_hook(m[1], lambda l, a, o: o * 2)
    try:
        hooked = go(f)
    except Exception as e:
        hooked = type(e).__name__ + ": " + str(e).strip().splitlines()[-1][:120]
    h.remove()
    out[static] = [first, hooked, go(f)]
print(out)
"""


def test_sot_hooked_layer_calling_super_forward() -> None:
    """FINDING 5 (crash, regression of 2f7d780; 7445fa5 gives eager's numbers). Repro: the
    7-layer Linear/Tanh Sequential whose Tanh is ``class Tanh(nn.Tanh): def forward(self, x):
    return super().forward(x)``, converted with ``paddle.jit.to_static``; a unihook forward
    hook on m[1] (before or after the first static call): the next call raises
    ``InnerError: In simulate execution: ... AttributeError: 'ForceBreakCallableVariable'
    object has no attribute 'value'`` (at ``super().forward(x)``). A paddle native
    ``register_forward_post_hook`` on the same layer runs fine: `_BreakAt` makes SOT wrap
    the layer as a ForceBreakCallableVariable, whose ``super()`` SOT cannot resolve. Eager:
    [0.0319, 5.15629]."""
    _needs("paddle")
    out = last_value(run_code(SOT_SUPER, timeout=180))
    assert out[True] == out[False], out


SOT_CHANGES = r"""
import warnings
warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook


def net():
    paddle.seed(0)
    return paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else paddle.nn.Tanh() for i in range(7)]
    )


x0 = np.arange(6, dtype="float32").reshape(2, 3) / 6


def go(f):
    x = paddle.to_tensor(x0, stop_gradient=False)
    y = f(x)
    y.sum().backward()
    return [round(float(y.sum()), 5), round(float(x.grad.abs().sum()), 5)]


res = {}
for static in (False, True):
    m = net()
    f = paddle.jit.to_static(m) if static else m
    r = [go(f)]
    seen = []
    h = unihook.register_module_forward_hook(lambda l, a, o: seen.append(1))
    r.append(go(f)); h.remove(); n = len(seen); r.append(go(f)); r += [n, len(seen) - n]
    h = unihook.register_module_forward_hook(
        lambda l, a, o: o * 2 if isinstance(l, paddle.nn.Tanh) else None)
    r.append(go(f)); h.remove(); r.append(go(f))
    h = unihook.register_full_backward_pre_hook(m[3], lambda l, g: tuple(t * 3 for t in g))
    r.append(go(f)); h.remove(); r.append(go(f))
    h = unihook.register_forward_pre_hook(m[4], lambda l, a: (a[0] * 0.5,))
    h2 = unihook.register_forward_pre_hook(m[4], lambda l, a: (a[0] * 0.5,))
    r.append(go(f)); h.remove(); r.append(go(f)); h2.remove(); r.append(go(f))
    m2 = net()
    g = (lambda x: m2(x) + m2(x * 2))
    g = paddle.jit.to_static(g) if static else g
    r.append(go(g)); h = unihook.register_forward_hook(m2[2], lambda l, a, o: o + 1)
    r.append(go(g)); h.remove(); r.append(go(g))
    res[static] = r
print(res)
"""


def test_sot_hooks_come_and_go_held() -> None:
    """HELD: on a compiled frame, hooks registered after the first static call (global
    forward, global forward changing outputs, backward pre scaling, two stacked forward pre
    hooks, a forward hook on a layer a converted function calls twice) give eager's numbers,
    and plain numbers once removed (the global hook sees no call after its removal)."""
    _needs("paddle")
    res = last_value(run_code(SOT_CHANGES, timeout=240))
    assert res[True] == res[False], res
    assert res[True][4] == 0 and res[True][0] == res[True][2] == res[True][6]


# -- MindSpore ----------------------------------------------------------------------------------

MS_INPLACE_CELL = r"""
import warnings
import mindspore
from mindspore.graph.api import _pynative_executor
import numpy as np
from unihook.conformance import installed_kits
from unihook.recipes import GradientMonitor

kit = [k for k in installed_kits() if k.name == "mindspore"][0]
rng = np.random.default_rng(7)
W = {}


def linear(n_in, n_out):
    w = W[f"W{len(W)}"] = rng.normal(size=(n_out, n_in)).astype(np.float32)
    return kit.linear(n_in, n_out, weight=w, bias=np.zeros(n_out, np.float32))


def zero_first(self, h):  # changes its input in place, returns it
    h[:, 0] = 0.0
    _pynative_executor.sync()
    return h


children = {"fc1": linear(3, 4), "norm": kit.module(zero_first), "fc2": linear(4, 4),
            "head": linear(4, 2)}


def forward(self, x):
    h = self.fc1(x)
    return self.head(self.fc2(self.norm(h)) * 2 + 0)


model = kit.module(forward, children)
x = np.random.default_rng(8).normal(size=(5, 3)).astype(np.float32)
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    with GradientMonitor(model) as mon:
        for _ in range(2):
            kit.backward(model(kit.tensor(x)).sum())
print({"norms": [dict(s).get("norm") for s in mon.history],
       "warned": [str(r.message)[:60] for r in rec if issubclass(r.category, RuntimeWarning)]})
"""


def test_mindspore_inplace_cell_keeps_its_first_norm() -> None:
    """FINDING 6 (a missing number and a spurious warning, MindSpore only). A cell changing
    its input in place and returning it (``h[:, 0] = 0; return h``): torch and paddle keep
    the tensor hook (versions moved): norms [25.4042, 25.4042], no warning. MindSpore's
    `object_version` is None since 0eac8c9, which `_returns_an_input` takes for unchanged:
    RuntimeWarning "module 'norm' returned its input", norms [None, 25.4042] (the first step
    left out). Also the brief's "an in-place module must not warn"."""
    _needs("mindspore")
    out = last_value(run_code(MS_INPLACE_CELL, timeout=120))
    assert out["warned"] == [] and out["norms"][0] is not None, out
    assert out["norms"][0] == pytest.approx(out["norms"][1], rel=1e-6), out


MS_TENSOR_HOOKS = r"""
import warnings, gc, weakref
FW = "FRAMEWORK"
if FW == "ms":
    import mindspore as ms
else:
    import torch
import numpy as np
import unihook

value = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
scripts = {
    "set-set": [("reg", "a"), ("set", 0), ("reg", "b"), ("set", 1), ("reg", "c"), ("rm", "b")],
    "many": [("reg", str(i)) for i in range(20)] + [("set", 0)]
    + [("rm", str(i)) for i in range(0, 20, 2)] + [("reg", "z")],
    "rm-after-write": [("reg", "a"), ("reg", "a2"), ("set", 0), ("rm", "a"), ("reg", "b"),
                       ("rm", "a2")],
    "set-reg-rm-reg": [("set", 0), ("reg", "a"), ("rm", "a"), ("reg", "b")],
}
out = {}
for key, script in scripts.items():
    seen = {}

    def keep(name):
        def hook(g):
            seen.setdefault(name, []).append((g.asnumpy() if FW == "ms" else g.numpy()).tolist())
        return hook

    def f(x):
        y = x * 2
        handles = {}
        for op in script:
            if op[0] == "reg":
                handles[op[1]] = unihook.register_tensor_hook(y, keep(op[1]))
            elif op[0] == "rm":
                handles[op[1]].remove()
            else:
                y[:, op[1]] = 5.0
        return (y * y).sum()

    if FW == "ms":
        seen["x"] = ms.grad(f)(ms.Tensor(value)).asnumpy().tolist()
    else:
        x = torch.tensor(value, requires_grad=True)
        f(x).backward()
        seen["x"] = x.grad.tolist()
    out[key] = seen
if FW == "ms":
    ref = {}

    def f(x):
        y = x * 2
        unihook.register_tensor_hook(y, lambda g: None)
        y[:, 0] = 5.0
        unihook.register_tensor_hook(y, lambda g: None)
        ref["y"] = weakref.ref(y)
        return (y * y).sum()

    ms.grad(f)(ms.Tensor(value))
    gc.collect()
    out["alive"] = ref["y"]() is not None
print(out)
"""


def test_mindspore_tensor_hooks_around_writes_held() -> None:
    """HELD: hooks registered before / between / after setitems, removed before or after a
    write, 20 hooks half removed after a write: each sees its own history's gradient, as
    torch's (the same program on torch); the tensor is freed after the backward."""
    _needs("mindspore")
    _needs("torch")
    got = last_value(run_code(MS_TENSOR_HOOKS.replace("FRAMEWORK", "ms"), timeout=120))
    want = last_value(run_code(MS_TENSOR_HOOKS.replace("FRAMEWORK", "torch"), timeout=120))
    assert got.pop("alive") is False
    assert got == want


def test_monitor_does_not_break_a_model_changing_the_input_in_place() -> None:
    """FINDING 7 (crash the recipe brings: a model that trains without the monitor raises from
    its second step with it). Repro: ``skip = self.skip(x)`` (nn.Identity) then ``x =
    self.act(x)`` (nn.ReLU(inplace=True)) and ``self.fc(x) + skip``. Step 0 is fine (the
    Identity is found returning its input and left out); from step 1 the module backward
    pre-hook GradientMonitor put on the Identity makes its output an alias, and the in-place
    ReLU on its input raises ``InPlaceError: full_backward_pre hook on Identity [backend
    torch]: ... that tensor was changed in place, not through this output`` (the hook the
    user never registered; torch's native hook raises there too). A passive recipe must not
    change whether the model runs: want three steps, the same outputs and gradients as
    without the monitor (the Identity's norm may be left out)."""
    torch = pytest.importorskip("torch")
    from unihook.recipes import GradientMonitor

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.skip, self.act, self.fc = nn.Identity(), nn.ReLU(inplace=True), nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            skip = self.skip(x)
            x = self.act(x)
            return self.fc(x) + skip

    def run(monitored: bool) -> list[Any]:
        model = nn.Sequential(nn.Linear(3, 4), Block())
        torch.manual_seed(1)
        model[0].reset_parameters()
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(2))
        grads = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            monitor = GradientMonitor(model) if monitored else None
            try:
                for _ in range(3):
                    model.zero_grad()
                    model(x).sum().backward()
                    grads.append([p.grad.clone() for p in model.parameters()])
            finally:
                if monitor is not None:
                    monitor.remove()
        return grads

    want = run(False)
    got = run(True)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert all(torch.allclose(a, b) for a, b in zip(g, w))


PADDLE_INPLACE_AFTER_IDENTITY = r"""
import warnings
warnings.simplefilter("ignore")
import paddle, paddle.nn as nn
import unihook
from unihook.recipes import GradientMonitor


class Block(nn.Layer):
    def __init__(self):
        super().__init__()
        self.skip, self.fc = nn.Identity(), nn.Linear(4, 4)

    def forward(self, x):
        skip = self.skip(x)
        x = paddle.nn.functional.relu_(x)
        return self.fc(x) + skip


paddle.seed(0)
m = nn.Sequential(nn.Linear(3, 4), Block())
x = paddle.randn([5, 3])


def step():
    m.clear_gradients()
    out = m(x)
    out.sum().backward()
    return [round(float(out.sum()), 5), round(float(m[0].weight.grad.abs().sum()), 5)]


plain = [step() for _ in range(3)]
monitor = GradientMonitor(m)
monitored = [step() for _ in range(3)]
monitor.remove()
h = unihook.register_full_backward_pre_hook(m[1].skip, lambda mod, g: None)
hooked = step()
h.remove()
print({"plain": plain, "monitored": monitored, "hooked": hooked})
"""


def test_paddle_monitor_keeps_the_model_gradients() -> None:
    """FINDING 0 (SILENT WRONG TRAINING GRADIENTS, paddle; regression of 0eac8c9: at 0eac8c9^
    the monitored run gives plain's numbers). Repro: ``skip = self.skip(x)`` (nn.Identity),
    ``x = F.relu_(x)``, ``self.fc(x) + skip``. Plain: |grad W0|_1 = 17.44179 each step; under
    GradientMonitor: 17.44179, then 21.10634, 21.10634 (same outputs, 6.22747): from step 1
    the module backward pre-hook the monitor puts on the Identity changes the gradients the
    optimizer gets. The root is paddle's backend: any unihook full_backward(_pre) hook on that
    Identity gives 21.10634 silently, where torch's backend raises InPlaceError (FINDING 7)
    and torch's native hook raises too; 0eac8c9 makes the monitor place it unasked."""
    _needs("paddle")
    out = last_value(run_code(PADDLE_INPLACE_AFTER_IDENTITY, timeout=120))
    assert out["monitored"] == out["plain"], out


MS_INPLACE_AFTER_IDENTITY = r"""
import warnings
warnings.simplefilter("ignore")
import mindspore as ms
from mindspore import nn
from mindspore.graph.api import _pynative_executor
import numpy as np
from unihook.recipes import GradientMonitor


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.skip, self.fc = nn.Identity(), nn.Dense(4, 4)

    def construct(self, x):
        skip = self.skip(x)
        x[:, 0] = 0.0
        _pynative_executor.sync()
        return self.fc(x) + skip


ms.set_seed(0)
m = nn.SequentialCell(nn.Dense(3, 4), Block())
x = ms.Tensor(np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32))
grad = ms.value_and_grad(lambda x: m(x).sum(), None, m.trainable_params())


def step():
    value, grads = grad(x)
    return [round(float(value), 5), round(float(np.abs(grads[0].asnumpy()).sum()), 5)]


plain = [step() for _ in range(3)]
monitor = GradientMonitor(m)
monitored = [step() for _ in range(3)]
monitor.remove()
print({"plain": plain, "monitored": monitored})
"""


def test_mindspore_monitor_keeps_the_model_outputs_and_gradients() -> None:
    """FINDING 0b (SILENT WRONG LOSS AND TRAINING GRADIENTS, MindSpore; regression of 0eac8c9:
    at 0eac8c9^ the monitored run gives plain's numbers). Repro: ``skip = self.skip(x)``
    (nn.Identity), ``x[:, 0] = 0.0``, ``self.fc(x) + skip``, ``ms.value_and_grad``. Plain:
    loss 0.12649, |grad W0|_1 29.87446 each step; under GradientMonitor: step 0 the same,
    then loss -2.67065, grad 36.72785: from step 1 the module backward pre-hook the monitor
    puts on the Identity hands ``skip`` a tensor apart from ``x``, so the in-place write no
    longer reaches it (torch's backend raises InPlaceError there, FINDING 7)."""
    _needs("mindspore")
    out = last_value(run_code(MS_INPLACE_AFTER_IDENTITY, timeout=120))
    assert out["monitored"] == out["plain"], out


OUTPUT_WRITTEN_AFTER_IDENTITY = r"""
import warnings, sys; warnings.simplefilter("ignore")
FW = "FRAMEWORK"
if FW == "ms":
    import mindspore as ms
    from mindspore import nn
    from mindspore.graph.api import _pynative_executor
    import numpy as np
    class P(nn.Cell):
        def __init__(s):
            super().__init__()
            s.fc1, s.id, s.fc2 = nn.Dense(3, 4), nn.Identity(), nn.Dense(4, 2)
        def construct(s, x):
            h = s.fc1(x); y = s.id(h); y[:, 1] = 3.0; _pynative_executor.sync()
            return s.fc2(y) + h.sum()
    ms.set_seed(0); m = P()
    x = ms.Tensor(np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32))
    gf = ms.value_and_grad(lambda x: m(x).sum(), None, m.trainable_params())
    def step():
        v, g = gf(x); return [round(float(v), 5), round(float(np.abs(g[0].asnumpy()).sum()), 5)]
else:
    import paddle, paddle.nn as nn
    class P(nn.Layer):
        def __init__(s):
            super().__init__()
            s.fc1, s.id, s.fc2 = nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2)
        def forward(s, x):
            h = s.fc1(x); y = s.id(h); y.scale_(2.0); return s.fc2(y) + h.sum()
    paddle.seed(0); m = P(); x = paddle.randn([5, 3])
    def step():
        m.clear_gradients(); o = m(x); o.sum().backward()
        return [round(float(o.sum()), 5), round(float(m.fc1.weight.grad.abs().sum()), 5)]
from unihook.recipes import GradientMonitor
r = {"plain": [step() for _ in range(3)]}
g = GradientMonitor(m)
try: r["mon"] = [step() for _ in range(3)]
except Exception as e: r["mon"] = type(e).__name__ + str(e)[:120]
g.remove()
print((FW, r))
"""


@pytest.mark.parametrize("framework", ["paddle", "mindspore"])
def test_monitor_keeps_numbers_when_the_identity_output_is_written(framework: str) -> None:
    """FINDING 0c (SILENT, same root as 0/0b, the other direction: the Identity's *output*
    written in place, its input read after). Repro: ``h = fc1(x); y = self.id(h); y.scale_(2)``
    (paddle; MindSpore ``y[:, 1] = 3``) ``; fc2(y) + h.sum()``. Plain paddle: loss 2.51226,
    |grad W1|_1 454.81573; monitored from step 1: 2.51226, 223.6501. Plain MindSpore: loss
    111.83102, grad 218.44669; monitored: -15.23083, 286.98053. torch (an alias): held."""
    _needs(framework)
    fw = "ms" if framework == "mindspore" else "paddle"
    out = last_value(run_code(OUTPUT_WRITTEN_AFTER_IDENTITY.replace("FRAMEWORK", fw), timeout=120))
    assert out[1]["mon"] == out[1]["plain"], out


SOT_NO_BREAKS_LEFT = r"""
import warnings; warnings.filterwarnings("ignore")
import numpy as np, paddle, unihook
from unihook_paddle import _static
hits = []
# the graph breaks unihook makes: a hooked layer's hook table (its guard raises SOT's break,
# whose error paddle makes as it is, not simulated) and, while global hooks live, every layer
# SOT then simulates (`_every_layer`)
from paddle.jit.sot.utils.exceptions import BreakGraphError
made, every = BreakGraphError.__init__, _static._every_layer
def counted_break(self, reason=None):
    if str(reason) == _static._BREAK_REASON:
        hits.append("own")
    made(self, reason)
def counted_every(cls):
    hits.append(cls.__name__)
    return every(cls)
BreakGraphError.__init__, _static._every_layer = counted_break, counted_every
def net():
    paddle.seed(0)
    return paddle.nn.Sequential(
        *[paddle.nn.Linear(3, 3) if i % 2 == 0 else paddle.nn.Tanh() for i in range(7)]
    )
x0 = np.arange(6, dtype="float32").reshape(2, 3) / 6
m = net(); f = paddle.jit.to_static(m)
def go():
    x = paddle.to_tensor(x0, stop_gradient=False); y = f(x); y.sum().backward()
go(); r = {"plain_hits": len(hits)}
h = unihook.register_forward_hook(m[2], lambda l, a, o: None); go(); h.remove()
r["hooked_hits"] = len(hits)
h = unihook.register_module_forward_hook(lambda l, a, o: None); go(); h.remove()
r["global_hits"] = len(hits)
from unihook.recipes import ActivationStats, GradientMonitor
with ActivationStats(m): go()
with GradientMonitor(m): go()
r["recipes_hits"] = len(hits)
hits.clear(); go(); go(); r["after_all_removed"] = len(hits)
keys = ("_forward_pre_hooks", "_forward_post_hooks")
r["dicts"] = sorted({type(l.__dict__.get(k)).__name__ for l in [m, *m] for k in keys})
from paddle.jit.sot.opcode_translator.executor.variables import callable as sot_layers
r["paddle_check_back"] = getattr(sot_layers, _static._SUPPORT_CHECK) is _static._supported_check
print(r)
"""


def test_sot_breaks_no_graph_once_hooks_are_gone_held() -> None:
    """HELD: unihook breaks SOT's graph nowhere while it is imported with no hook, and
    nowhere again once a per-layer hook, a global hook and ActivationStats / GradientMonitor
    came and went (SOT's code retranslated; the layers' hook dicts plain OrderedDicts again,
    paddle's own layer check back)."""
    _needs("paddle")
    out = last_value(run_code(SOT_NO_BREAKS_LEFT, timeout=120))
    assert out["plain_hits"] == 0 and out["global_hits"] > out["hooked_hits"], out
    assert out["after_all_removed"] == 0 and out["dicts"] == ["OrderedDict"], out
    assert out["paddle_check_back"], out
