"""MindSpore's own API with unihook hooks: what the conformance kit's imperative tape cannot
express (`unihook.testing.creates_graph`), tested the framework's way. Runs in `make test`'s
MindSpore venv; skipped where MindSpore is not installed."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import unihook  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


def _dense() -> Any:
    lin = ms.nn.Dense(2, 1)
    lin.weight.set_data(ms.Tensor(np.array([[1.0, 2.0]], np.float32)))
    lin.bias.set_data(ms.Tensor(np.zeros(1, np.float32)))
    return lin


def test_double_backward_by_nested_grad_fires_once_per_pass() -> None:
    """torch's `test_double_backward_fires_once_per_pass` (conformance), the MindSpore way:
    `grad(grad(f))`. The inner backward fires the hooks once, the second pass through the first
    backward once more; the values are torch's (2 y W, then 2 W (W . 1))."""
    lin = _dense()
    calls: list[tuple[str, Any]] = []
    handles = [
        unihook.register_full_backward_pre_hook(
            lin, lambda m, go: calls.append(("pre", go[0].asnumpy().tolist()))
        ),
        unihook.register_full_backward_hook(
            lin, lambda m, gi, go: calls.append(("full", gi[0].asnumpy().tolist()))
        ),
    ]
    x = ms.Tensor(np.array([[1.0, 1.0]], np.float32))
    try:
        first = ms.grad(lambda t: (lin(t) ** 2).sum())
        np.testing.assert_allclose(first(x).asnumpy(), [[6.0, 12.0]])
        assert calls == [("pre", [[6.0]]), ("full", [[6.0, 12.0]])]
        calls.clear()
        second = ms.grad(lambda t: first(t).sum())(x)
        np.testing.assert_allclose(second.asnumpy(), [[6.0, 12.0]])
        assert [kind for kind, _ in calls] == ["pre", "full", "pre", "full"]
    finally:
        for handle in handles:
            handle.remove()
    calls.clear()
    ms.grad(lambda t: (lin(t) ** 2).sum())(x)
    assert calls == []  # removed: no residue


def test_tensor_hook_under_nested_grad_sees_each_pass() -> None:
    """A tensor hook doubling the gradient of ``u = x * 1`` in ``grad(grad(u * u))``: it runs in
    both passes with torch's gradients (torch: create_graph, then a second autograd.grad)."""
    torch = pytest.importorskip("torch")
    seen: list[float] = []

    def f(t: Any) -> Any:
        u = t * 1
        unihook.register_tensor_hook(u, lambda g: (seen.append(float(g.asnumpy())), g * 2)[1])
        return u * u

    first = ms.grad(f)
    got = float(ms.grad(lambda t: first(t))(ms.Tensor(np.array(3.0, np.float32))).asnumpy())

    want: list[float] = []
    x = torch.tensor(3.0, requires_grad=True)
    u = x * 1
    unihook.register_tensor_hook(u, lambda g: (want.append(float(g.detach())), g * 2)[1])
    (gx,) = torch.autograd.grad(u * u, [x], create_graph=True)
    (gg,) = torch.autograd.grad(gx, [x])
    assert (got, seen) == (float(gg), want) == (8.0, [6.0, 4.0])


@pytest.mark.parametrize(
    "register",
    [
        lambda cell, x: unihook.register_forward_hook(cell, lambda *a: None),
        lambda cell, x: unihook.register_full_backward_hook(cell, lambda *a: None),
        lambda cell, x: unihook.register_tensor_hook(x, lambda g: None),
    ],
    ids=["forward", "full_backward", "tensor"],
)
def test_graph_mode_is_refused_at_registration(register: Any) -> None:
    """GRAPH_MODE compiles cells and skips Python hooks silently (or fails in MindSpore's graph
    parser): a clear error naming PyNative mode instead."""
    cell, x = _dense(), ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="x")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(unihook.BackendStateError, match="PYNATIVE_MODE.*GRAPH_MODE"):
            register(cell, x)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    register(cell, x).remove()  # (PyNative again: accepted)


def _log_hooks(name: str, cell: Any, calls: list[Any], numpy: Any) -> list[Any]:
    def values(grads: Any) -> Any:
        return tuple(None if g is None else numpy(g).tolist() for g in grads)

    return [
        unihook.register_full_backward_pre_hook(
            cell, lambda m, go: calls.append((name, "pre", values(go)))
        ),
        unihook.register_full_backward_hook(
            cell, lambda m, gi, go: calls.append((name, "full", values(gi), values(go)))
        ),
    ]


@pytest.mark.parametrize("wrt", ["all", "last"])
def test_weights_only_grad_fires_the_first_cells_full_hook(wrt: str) -> None:
    """MindSpore's training idiom, ``value_and_grad(fn, None, weights)``: MindSpore records the
    data as requiring grad, then leaves out the first cell's input side. Its full hook fires as
    torch's does for data that needs no grad: grad_input (None,), a UserWarning, torch's
    grad_output; every call equals torch's on the same weights (the first cell's full hook at
    the end of the backward, where torch's runs too: nothing follows it). With the last cell's
    weights only, its input (computed, torch: requires grad) is left out: no full hook call
    there, in torch neither, and the first cell is not reached."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((4, 3), np.float32), rng.standard_normal((2, 4), np.float32)
    data = rng.standard_normal((5, 3), np.float32)

    a, b = ms.nn.Dense(3, 4), ms.nn.Dense(4, 2)
    for cell, w in ((a, w1), (b, w2)):
        cell.weight.set_data(ms.Tensor(w))
        cell.bias.set_data(ms.Tensor(np.zeros(w.shape[0], np.float32)))
    got: list[Any] = []
    handles = [
        *_log_hooks("a", a, got, lambda g: g.asnumpy()),
        *_log_hooks("b", b, got, lambda g: g.asnumpy()),
    ]
    weights = b.trainable_params() if wrt == "last" else a.trainable_params() + b.trainable_params()
    step = ms.value_and_grad(lambda x: (b(ms.ops.relu(a(x))) ** 2).sum(), None, weights)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            _, weight_grads = step(ms.Tensor(data))
    finally:
        for handle in handles:
            handle.remove()

    ta, tb = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    with torch.no_grad():
        for lin, w in ((ta, w1), (tb, w2)):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.zero_()
    want: list[Any] = []
    handles = [
        *_log_hooks("a", ta, want, lambda g: g.detach().numpy()),
        *_log_hooks("b", tb, want, lambda g: g.detach().numpy()),
    ]
    tweights = [*ta.parameters(), *tb.parameters()][2 if wrt == "last" else 0 :]
    try:
        with warnings.catch_warnings(record=True) as twarned:
            warnings.simplefilter("always")
            loss = (tb(torch.relu(ta(torch.from_numpy(data)))) ** 2).sum()
            tgrads = torch.autograd.grad(loss, tweights)
    finally:
        for handle in handles:
            handle.remove()

    assert [str(w.message) for w in warned] == [str(w.message) for w in twarned]
    assert [c[:2] for c in got] == [c[:2] for c in want]
    if wrt == "all":
        assert got[-1][:3] == ("a", "full", (None,))
        assert any("no inputs require gradients" in str(w.message) for w in warned)
    else:
        assert [c[:2] for c in got] == [("b", "pre")]
    for mine, theirs in zip(got, want):
        for grads, expected in zip(mine[2:], theirs[2:]):  # grad_input, grad_output
            assert [g is None for g in grads] == [e is None for e in expected]
            for g, e in zip(grads, expected):
                if g is not None:
                    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(weight_grads, tgrads):
        np.testing.assert_allclose(mine.asnumpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_weights_only_grad_fires_an_embeddings_full_hook() -> None:
    """Token ids are never differentiated: an Embedding's full hook fires once, grad_input
    (None,), as torch's (whose integer input needs no grad)."""
    emb = ms.nn.Embedding(5, 2)
    calls: list[Any] = []
    handle = unihook.register_full_backward_hook(emb, lambda m, gi, go: calls.append(gi))
    ids = ms.Tensor(np.array([1, 3], np.int32))
    with handle, pytest.warns(UserWarning):
        ms.value_and_grad(lambda i: emb(i).sum(), None, emb.trainable_params())(ids)
    assert calls == [(None,)]


_RAISING_BACKWARDS = """
import gc, sys, warnings
import numpy as np, mindspore as ms, unihook
warnings.simplefilter("ignore")
ms.set_context(mode=ms.PYNATIVE_MODE)
a, b = ms.nn.Dense(3, 4), ms.nn.Dense(4, 2)
weights = a.trainable_params() + b.trainable_params()
step = ms.value_and_grad(lambda x: b(a(x)).sum(), None, weights)
x = ms.Tensor(np.ones((1, 3), np.float32))

class Mine(Exception):
    pass

def boom(*args):
    raise Mine(sys.argv[1])

# the deferred full hook raises: the user's exception, its own type
h = unihook.register_full_backward_hook(a, boom)
try:
    step(x)
except Mine:
    print("deferred hook raised Mine")
h.remove()
# a's output side queues its end-of-backward call, then a hook upstream of it raises
h1 = unihook.register_full_backward_hook(a, lambda m, gi, go: None)
h2 = unihook.register_full_backward_pre_hook(a, boom)
for _ in range(3):
    try:
        step(x)
    except Mine:
        pass
h2.remove()
gc.collect()
calls = []
h1.remove()
h1 = unihook.register_full_backward_hook(a, lambda m, gi, go: calls.append(gi))
step(x)
print("after raising backwards", calls)
"""


def test_weights_only_grad_survives_raising_backwards(tmp_path: Any) -> None:
    """The first cell's full hook runs at the end of the backward, on MindSpore's final
    callback, which a backward that raises never runs (and a queued closure then segfaulted):
    a hook raising there surfaces with its own type, and a backward a hook aborted after the
    callback was queued leaves the next one working. In a subprocess: a crash fails the test."""
    import subprocess
    import sys

    script = tmp_path / "raising.py"
    script.write_text(_RAISING_BACKWARDS)
    done = subprocess.run(
        [sys.executable, str(script), "mine"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deferred hook raised Mine" in done.stdout
    assert "after raising backwards [(None,)]" in done.stdout
