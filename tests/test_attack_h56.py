"""helper-56's attack on issue 11 (kept and returned inputs) on paddle and MindSpore,
2026-11-30: BaseException landing inside unihook's backward guard, a module keeping its input,
an enclosing hooked layer (the global hook) in front of a returned input, a MindSpore cell
keeping its input whose forward raised. Each test fails on 1f25aaf. Every program runs in a
child process (a hang or a crash must not take the suite with it). Oracle: the framework
without hooks. The MindSpore test runs under the MindSpore venv's Python (there `pytest
tests/test_attack_h56.py` runs it; elsewhere it skips)."""

from __future__ import annotations

import subprocess

import pytest
from children import run_code


def _child(code: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("paddle")
    return run_code(code, timeout=timeout)


_KEEP = """
import gc, sys, threading, weakref, faulthandler
import numpy as np, paddle, unihook
import paddle.nn.functional as F
from unihook_paddle import _autograd_guard as guard

class Keep(paddle.nn.Layer):
    def forward(self, h):
        self.kept = h
        return h * 2

def step(m):
    x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
    (m(x * 1) * 3).sum().backward()
    return x.grad.numpy().tolist()

def interrupt_once(should):
    # a Ctrl-C (SIGINT's KeyboardInterrupt) delivered where `should(frame, event)` says:
    # Python runs a signal handler at such points (a function's entry, after a C call)
    fired = []
    def local(frame, event, arg):
        if not fired and should(frame, event):
            fired.append(1)
            raise KeyboardInterrupt
        return local
    def tracer(frame, event, arg):
        if not fired and should(frame, event):
            fired.append(1)
            raise KeyboardInterrupt
        return local
    return tracer, fired
"""


def test_paddle_ctrl_c_at_the_release_of_the_backward_lock_does_not_hang() -> None:
    # 1f25aaf: a KeyboardInterrupt landing as `with _graph:` in `_beside_others` released the
    # lock (Condition.__exit__ entered, its lock not yet released: a SIGINT is handled at
    # that function's entry) left `_graph`'s Lock held: the very same backward then blocked
    # forever in its `finally` (`with _graph:` again, same thread, non-reentrant Lock), and
    # so would every later backward of every thread. Found by interrupting at each of the
    # ~1,200 line events of unihook's code in a hooked forward+backward: at n=901 the run
    # hung. Without hooks paddle's backward just raises KeyboardInterrupt. Now the lock is
    # taken and released by the lock's own (C) methods; here a Ctrl-C lands at the entry of
    # each Python function the guard's `_beside_others` calls, in turn.
    got = _child(
        _KEEP
        + """
faulthandler.dump_traceback_later(60, exit=True)
m = Keep(); unihook.register_full_backward_hook(m, lambda *a: None)
def inside(frame):
    while frame is not None:
        if frame.f_code is guard._beside_others.__code__:
            return True
        frame = frame.f_back
    return False
n, interrupted = 0, 0
while True:
    seen = [0]
    def at_nth(frame, event, n=n):
        # where a SIGINT is handled in Python code: a function's entry (its handler runs
        # there, and after a C call returns, where a lock's own `__exit__` has released it)
        if event == "call" and inside(frame):
            seen[0] += 1
            return seen[0] == n + 1
        return False
    tracer, fired = interrupt_once(at_nth)
    x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
    loss = (m(x * 1) * 3).sum()
    sys.settrace(tracer)
    try:
        loss.backward()
    except KeyboardInterrupt:
        interrupted += 1
    finally:
        sys.settrace(None)
    assert not guard._graph_lock.locked(), n
    if not fired:
        break
    n += 1
print("interrupted", interrupted, "of", n)
print("second", step(m))
""",
        timeout=120,
    )
    assert got.returncode == 0, got.stdout + got.stderr[-3000:]
    assert "interrupted 0" not in got.stdout, got.stdout
    assert "second [6.0, 6.0, 6.0, 6.0]" in got.stdout, got.stdout


def test_paddle_ctrl_c_entering_a_backward_leaves_no_state_behind() -> None:
    # 1f25aaf: `_guarded` sets this thread's state (roots, depth += 1) before its `try`; a
    # KeyboardInterrupt landing at `_enter`'s entry (or on any line from `state.roots = ...`
    # to the `try`) skips the `finally`: depth stays 1 for good (every later outermost
    # backward on the thread runs at depth 2: `_enter`, `_leave` and `_heal` never run for
    # it again, so it is never in `_active`, which the deferral of removals reads) and
    # `state.roots` keeps the interrupted loss, its graph and the hooked module alive
    # forever (each later backward saves and restores it). Without hooks the module is
    # freed.
    got = _child(
        _KEEP
        + """
m = Keep(); hd = unihook.register_full_backward_hook(m, lambda *a: None)
x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
loss = (m(x * 1) * 3).sum()
def at_enter(frame, event):
    return event == "call" and frame.f_code is guard._enter.__code__
tracer, fired = interrupt_once(at_enter)
sys.settrace(tracer)
try:
    loss.backward()
except KeyboardInterrupt:
    print("interrupted")
finally:
    sys.settrace(None)
print("second", step(m))
print("depth after:", guard._state.depth)
hd.remove(); del hd, x, loss
m.kept = None  # (the cycle of a kept alias apart: see the next test)
wm = weakref.ref(m); del m; gc.collect()
print("module freed:", wm() is None)
"""
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert "interrupted" in got.stdout, got.stdout
    assert "second [6.0, 6.0, 6.0, 6.0]" in got.stdout, got.stdout
    assert "depth after: 0" in got.stdout, got.stdout
    assert "module freed: True" in got.stdout, got.stdout


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a Ctrl-C landing between paddle's grad_fn read and the return of the reference "
        "paddle leaks there keeps that graph (two steps Python cannot make one): README"
    ),
)
def test_paddle_ctrl_c_inside_the_grad_node_read_leaks_nothing() -> None:
    # 1f25aaf: `grad_node` reads `tensor.grad_fn` (paddle 3.3.1 leaks a reference per read)
    # and gives the reference back afterwards; a KeyboardInterrupt landing between the two
    # (a SIGINT is handled right after the getattr's C call returns) leaves the extra
    # reference: the node, the graph behind it and the hooked module are never freed.
    got = _child(
        _KEEP
        + """
m = Keep(); hd = unihook.register_full_backward_hook(m, lambda *a: None)
step(m)  # (the leak measured once)
code = guard.grad_node.__code__
lines = open(code.co_filename).read().splitlines()
after_read = next(
    i for i in range(code.co_firstlineno, code.co_firstlineno + 40)
    if lines[i - 1].strip().startswith("if node is not None and _grad_fn_leak")
)
def in_post_dispatch(frame):
    while frame is not None:
        if frame.f_code.co_name == "post_dispatch":
            return True
        frame = frame.f_back
    return False
def after_getattr(frame, event):
    # the read of the output identity's node, in the call's post-dispatcher
    return (event == "line" and frame.f_code is code and frame.f_lineno == after_read
            and in_post_dispatch(frame))
x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
tracer, fired = interrupt_once(after_getattr)
sys.settrace(tracer)
try:
    loss = (m(x * 1) * 3).sum()
    loss.backward()
except KeyboardInterrupt:
    print("interrupted")
finally:
    sys.settrace(None)
print("second", step(m))
hd.remove(); del hd, x
loss = None
m.kept = None  # (the cycle of a kept alias apart: see the next test)
wm = weakref.ref(m); del m; gc.collect()
print("module freed:", wm() is None)
"""
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert "interrupted" in got.stdout, got.stdout
    assert "second [6.0, 6.0, 6.0, 6.0]" in got.stdout, got.stdout
    assert "module freed: True" in got.stdout, got.stdout


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a cycle through paddle's C++ graph (the kept alias's node holds the call, the call "
        "the module), as torch's own full backward hook has: README 'On paddle'"
    ),
)
@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("store", ["attr", "list", "dict"])
def test_paddle_module_keeping_its_input_is_freed_after_del(store: str, backward: bool) -> None:
    # 1f25aaf: a module that keeps the alias forward got (`self.kept = h`, `[h]`, `{0: h}`),
    # called once with a unihook full backward hook (no in-place op anywhere, with or without
    # a backward), the hook removed and the module deleted: never freed. The kept alias's
    # grad node (paddle's C++) holds the input identity's Python context, whose
    # `on_input_grads` holds the `_Call`, which holds the module: a cycle through C++ that
    # the collector cannot see (`del m.kept` frees it). Without hooks, and on MindSpore with
    # hooks, the module is freed. (torch's own full backward hook has the same cycle; README
    # documents it for torch's kept outputs, nothing for paddle's kept inputs.)
    got = _child(
        f"""
import gc, weakref
import numpy as np, paddle, unihook
class Keep(paddle.nn.Layer):
    def __init__(self):
        super().__init__(); self.box = {{}}
    def forward(self, h):
        if {store!r} == "attr": self.kept = h
        elif {store!r} == "list": self.lst = [h]
        else: self.box[0] = h
        return h * 2
def run(hooked):
    m = Keep()
    hd = unihook.register_full_backward_hook(m, lambda *a: None) if hooked else None
    x = paddle.to_tensor(np.ones((4,), "float32"), stop_gradient=False)
    loss = (m(x * 1) * 3).sum()
    if {backward!r}: loss.backward()
    if hd is not None: hd.remove()
    del hd, x, loss
    wm = weakref.ref(m); del m; gc.collect()
    return wm() is None
print("freed", run(False), run(True))
"""
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert "freed True True" in got.stdout, got.stdout


@pytest.mark.parametrize("kind", ["global", "identity_and_model"])
def test_paddle_identity_then_inplace_activation_under_an_enclosing_hooked_layer(
    kind: str,
) -> None:
    # 1f25aaf: silent wrong gradient. A model routes its stem's output through an
    # `nn.Identity` (a placeholder layer), applies an in-place activation to the stem's
    # output, reads the Identity's output, and returns (logits, features): the caller holds
    # both. With a hook on the Identity alone: `InPlaceError` (the README's check). With the
    # global full backward hook (or a hook on the model too), the model's own output identity
    # hands the caller aliases and the original tensors die with forward, so the Identity's
    # check sees "caller's tensor gone" and lets the backward through: stem.weight.grad
    # misses the ReLU mask (row 0 [-0.1, 0, 0, 0.1] for paddle's [0.2283, 0, 0, 0.9216]).
    got = _child(
        f"""
import numpy as np, paddle, unihook
import paddle.nn.functional as F
class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.stem = paddle.nn.Linear(4, 4)
        self.ident = paddle.nn.Identity()
        self.head = paddle.nn.Linear(4, 2)
    def forward(self, x):
        h = self.stem(x)
        o = self.ident(h)
        F.relu_(h)
        return self.head(o), h
def run(kind):
    paddle.seed(0); net = Net()
    hs = []
    if kind == "global":
        hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
    elif kind == "identity_and_model":
        hs.append(unihook.register_full_backward_hook(net.ident, lambda *a: None))
        hs.append(unihook.register_full_backward_hook(net, lambda *a: None))
    elif kind == "identity":
        hs.append(unihook.register_full_backward_hook(net.ident, lambda *a: None))
    x = paddle.to_tensor([[1.0, -2.0, 3.0, 0.5], [-1.0, 0.5, 0.25, 2.0]], stop_gradient=False)
    logits, feat = net(x)
    try:
        (logits.sum() + (feat * 0.1).sum()).backward()
        return np.round(net.stem.weight.grad.numpy(), 4).tolist()
    except unihook.InPlaceError:
        return "InPlaceError"
    finally:
        for h in hs: h.remove()
print(repr((run("none"), run("identity"), run({kind!r}))))
"""
    )
    assert got.returncode == 0, got.stderr[-3000:]
    native, identity_only, hooked = eval(got.stdout.strip().splitlines()[-1])
    assert identity_only == "InPlaceError"
    assert hooked in (native, "InPlaceError"), (hooked, native)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "after a grad whose function raised, MindSpore keeps the contexts of later passes "
        "(its recording state), and the last call's input identity holds the cell"
    ),
)
def test_mindspore_cell_keeping_its_input_freed_after_a_forward_that_raised() -> None:
    # 1f25aaf: a cell that keeps its input (`self.kept = h`) under a unihook full backward
    # hook, whose forward raised once (a RuntimeError, or a KeyboardInterrupt: the same),
    # then three normal `mindspore.grad` calls, the hook removed, the cell deleted: never
    # freed. Without hooks it is; with hooks and a cell that keeps nothing it is; so is the
    # keeping cell whose forward never raised. (docs/MINDSPORE.md's limit (d) says a raising
    # forward's graph lives "until the next hooked call or backward pass": here it outlives
    # both.)
    pytest.importorskip("mindspore")
    code = """
import gc, weakref
import numpy as np, mindspore, unihook
from mindspore import nn, Tensor
mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
def run(hooked):
    state = {"raise": True}
    class Keep(nn.Cell):
        def construct(self, h):
            self.kept = h
            if state["raise"]:
                state["raise"] = False
                raise RuntimeError("boom")
            return h * 2
    m = Keep()
    hd = unihook.register_full_backward_hook(m, lambda *a: None) if hooked else None
    X = Tensor(np.ones(4, "float32"))
    try:
        mindspore.grad(lambda x: m(x * 1.5).sum())(X)
    except RuntimeError:
        pass
    for _ in range(3):
        g = mindspore.grad(lambda x: m(x * 1.5).sum())(X)
    assert np.allclose(g.asnumpy(), 3.0)
    if hd is not None:
        hd.remove()
    hd = g = None
    wm = weakref.ref(m); del m; gc.collect()
    return wm() is None
print("freed", run(False), run(True))
"""
    got = run_code(code)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "freed True True" in got.stdout, got.stdout


_TUPLE = pytest.mark.xfail(
    strict=True,
    reason="a hook keeping the args tuple itself is not told (the alias's own count does "
    "not move): README 'On paddle'",
)


@pytest.mark.parametrize(
    ("layer", "store", "via"),
    [
        ("Tanh", "item", "native"),
        ("Sigmoid", "item", "unihook"),
        ("Dropout", "list", "native"),
        pytest.param("Flatten", "tuple", "unihook", marks=_TUPLE),
        pytest.param("Scale", "tuple", "native", marks=_TUPLE),
        pytest.param("Scale", "tuple", "unihook", marks=_TUPLE),
    ],
)
@pytest.mark.parametrize("kind", ["full", "global"])
def test_paddle_forward_hook_caching_the_input_then_callers_inplace_op(
    layer: str, store: str, via: str, kind: str
) -> None:
    # 1f25aaf: silent wrong gradient. A forward hook (paddle's own post hook or unihook's
    # forward hook: a feature cache) keeps the layer's input: `inp[0]`, or the `inp` tuple
    # itself. With a unihook backward hook on the layer (or the global one) that is the alias
    # the layer got; the caller then changes its own tensor in place (`h.scale_(2)`) and
    # the loss reads the cached tensor: its values have the change, its history does not.
    # Not told: `kept_inputs` skips paddle's own layers altogether (`own_modules`: "their
    # forward keeps no input", but a hook on them does), and counts the alias's references,
    # which a cached args tuple does not raise. Without hooks the cached tensor is the
    # caller's: x.grad [-16.5, 33, -49.5, 72.75] (Dropout, eval), with them [-7.5, 15, -22.5,
    # 36.75]. Expected: paddle's numbers or InPlaceError.
    got = _child(
        f"""
import numpy as np, paddle, unihook
class Scale(paddle.nn.Layer):
    def forward(self, h):
        return h * 2
W = paddle.to_tensor([1.0, -2.0, 3.0, 0.5])
def run(hooked):
    make = {{"Scale": Scale, "Sigmoid": paddle.nn.Sigmoid, "Tanh": paddle.nn.Tanh,
             "Flatten": lambda: paddle.nn.Flatten(0), "Dropout": lambda: paddle.nn.Dropout(0.5)}}
    m = make[{layer!r}](); m.eval()
    cache = []
    def keep(layer, inp, out):
        cache.append(inp if {store!r} == "tuple" else inp[0] if {store!r} == "item" else list(inp))
    hs = [m.register_forward_post_hook(keep) if {via!r} == "native"
          else unihook.register_forward_hook(m, keep)]
    if hooked and {kind!r} == "full":
        hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
    elif hooked:
        hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
    x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
    try:
        h = x * 1.5
        o = m(h)
        h.scale_(2.0)
        c = cache[0] if {store!r} == "item" else cache[0][0]
        ((o * W).sum() + (c * c).sum()).backward()
        return np.round(x.grad.numpy(), 4).tolist()
    except unihook.InPlaceError:
        return "InPlaceError"
    finally:
        for hd in hs: hd.remove()
print(repr((run(False), run(True))))
"""
    )
    assert got.returncode == 0, got.stderr[-3000:]
    native, hooked = eval(got.stdout.strip().splitlines()[-1])
    assert hooked in (native, "InPlaceError"), (hooked, native)


_NESTED = """
import numpy as np, paddle, unihook
class Inner(paddle.nn.Layer):
    def forward(self, h):
        self.kept = h
        return h * 2
class Outer(paddle.nn.Layer):
    def __init__(self, ret):
        super().__init__(); self.inner = Inner(); self.ret = ret
    def forward(self, h):
        y = self.inner(h) + 1
        return (y, h) if self.ret else y
W = paddle.to_tensor([1.0, -2.0, 3.0, 0.5])
def run(kind, ret, change):
    m = Outer(ret); hs = []
    if kind == "global":
        hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
    elif kind == "both":
        hs.append(unihook.register_full_backward_hook(m.inner, lambda *a: None))
        hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
    elif kind == "outer":
        hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
    x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
    h = x * 1.5
    out = m(h)
    o = out[0] if ret else out
    try:
        if change == "kept":  # the kept one changed, the caller's read
            m.inner.kept.scale_(2.0)
            loss = (o * W).sum() + (h * 3).sum()
        else:  # the caller's changed, the kept one read
            h.scale_(2.0)
            loss = (o * W).sum() + (m.inner.kept * 3).sum()
        loss.backward()
        return x.grad.numpy().tolist()
    except unihook.InPlaceError:
        return "InPlaceError"
    finally:
        for hd in hs: hd.remove()
"""


@pytest.mark.parametrize("kind", ["global", "both"])
def test_paddle_kept_changed_then_callers_read_through_a_hooked_parent(kind: str) -> None:
    # 1f25aaf: silent wrong gradient. A child layer keeps its input (`self.kept = h`), its
    # parent is hooked too (the global hook hooks both): the child's input is the parent's
    # alias of the caller's tensor, an alias of an alias. The caller changes the kept tensor
    # in place and reads its own: paddle gives x.grad [12, 3, 18, 10.5]; a hook on the child
    # alone: InPlaceError; child and parent hooked: [7.5, -1.5, 13.5, 6] (the child's check
    # watches the parent's alias, which nobody reads; the parent's, if any, sees that alias
    # unchanged). (The other way, the caller's tensor changed and the kept one read, is
    # refused.)
    got = _child(
        _NESTED + f"\nprint(repr((run('none', False, 'kept'), run({kind!r}, False, 'kept'))))\n"
    )
    assert got.returncode == 0, got.stderr[-3000:]
    native, hooked = eval(got.stdout.strip().splitlines()[-1])
    assert native == [12.0, 3.0, 18.0, 10.5]
    assert hooked in (native, "InPlaceError"), hooked


@pytest.mark.xfail(
    strict=True,
    reason="a child's kept alias is not looked for by its parent's returned-input check: README",
)
@pytest.mark.parametrize("change", ["kept", "caller"])
def test_paddle_parent_returning_its_input_that_its_child_kept(change: str) -> None:
    # 1f25aaf: silent wrong gradient. A hooked parent returns its input (`return y, h`) and
    # its (unhooked) child keeps it (`self.inner.kept = h`): the child holds the parent's
    # alias. A returned input is looked for "among the module's attributes and containers"
    # only (README), not a child's attribute, so the alias is not watched: the caller's
    # in-place op on its tensor then a read of the kept one, or the other way, gives
    # [7.5, -1.5, 13.5, 6] for paddle's [12, 3, 18, 10.5]. The same without the `return h`
    # is refused (the reference count tells it kept).
    got = _child(
        _NESTED + f"\nprint(repr((run('none', True, {change!r}), run('outer', True, {change!r}),"
        f" run('outer', False, {change!r}))))\n"
    )
    assert got.returncode == 0, got.stderr[-3000:]
    native, hooked, not_returned = eval(got.stdout.strip().splitlines()[-1])
    assert not_returned == "InPlaceError"
    assert hooked in (native, "InPlaceError"), (hooked, native)
