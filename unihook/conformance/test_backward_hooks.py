"""Conformance: module backward hooks (full and pre) with torch's semantics on every backend.

Every test takes the `backend` kit and runs once per installed backend; the rules are torch's
(../shared/SEMANTICS.md §4). Values cross the boundary as numpy arrays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest

import unihook
from unihook import HookReturnError
from unihook.testing import creates_graph

W1 = [[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]]
B1 = [1, 2, 3, 4]
W2 = [[1, 2, 3, 4]]
B2 = [1]


def seed_model(kit: Any) -> Any:
    return kit.sequential(kit.linear(3, 4, W1, B1), kit.relu_module(), kit.linear(4, 1, W2, B2))


def arrays(kit: Any, grads: Any) -> Any:
    return tuple(None if g is None else kit.numpy(g) for g in grads)


def close(actual: Any, expected: Any) -> None:
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None, (actual, expected)
        else:
            assert a is not None, (actual, expected)
            np.testing.assert_allclose(a, np.asarray(e, dtype="float32"), rtol=1e-6, atol=1e-6)


class Log:
    """Records every backward hook call as (label, kind, grad_input, grad_output) in numpy."""

    def __init__(self, kit: Any) -> None:
        self.kit = kit
        self.calls: list[tuple[str, str, tuple[Any, ...] | None, tuple[Any, ...]]] = []

    def full(self, label: str, result: Any = None) -> Any:
        def hook(module, grad_input, grad_output):  # type: ignore[no-untyped-def]
            self.calls.append(
                (label, "full", arrays(self.kit, grad_input), arrays(self.kit, grad_output))
            )
            return result(grad_input, grad_output) if result else None

        return hook

    def pre(self, label: str, result: Any = None) -> Any:
        def hook(module, grad_output):  # type: ignore[no-untyped-def]
            self.calls.append((label, "pre", None, arrays(self.kit, grad_output)))
            return result(grad_output) if result else None

        return hook

    def order(self) -> list[tuple[str, str]]:
        return [(label, kind) for label, kind, _, _ in self.calls]


def leaf(kit: Any, data: Any, requires_grad: Any = True) -> Any:
    return kit.tensor(data, requires_grad=requires_grad)


def hook_residue(kit: Any, module: Any) -> int:
    return sum(kit.hook_counts(module).values())


# -- the seed model: torch's printed numbers -------------------------------------------------


def test_seed_model_full_hooks(backend: Any) -> None:
    kit = backend
    model = seed_model(kit)
    log = Log(kit)
    names = {"": "Sequential", "0": "Linear1", "1": "ReLU", "2": "Linear2"}
    for name, module in kit.named_modules(model):
        unihook.register_full_backward_hook(module, log.full(names[name]))
    x = leaf(kit, [[1, 1, 1]])
    out = model(x)
    np.testing.assert_allclose(kit.numpy(out), [[89]])
    kit.backward(out.sum())
    assert log.order() == [
        ("Linear2", "full"),
        ("ReLU", "full"),
        ("Linear1", "full"),
        ("Sequential", "full"),
    ]
    expected = {
        "Linear2": ([[1, 2, 3, 4]], [[1]]),
        "ReLU": ([[1, 0, 3, 0]], [[1, 2, 3, 4]]),
        "Linear1": ([[22, 26, 30]], [[1, 0, 3, 0]]),
        "Sequential": ([[22, 26, 30]], [[1]]),
    }
    for label, _, gi, go in log.calls:
        close(gi, [expected[label][0]])
        close(go, [expected[label][1]])
    np.testing.assert_allclose(kit.grad(x), [[22, 26, 30]])


def test_seed_model_pre_hooks_outer_first(backend: Any) -> None:
    kit = backend
    model = seed_model(kit)
    log = Log(kit)
    names = {"": "Sequential", "0": "Linear1", "1": "ReLU", "2": "Linear2"}
    for name, module in kit.named_modules(model):
        unihook.register_full_backward_pre_hook(module, log.pre(names[name]))
    x = leaf(kit, [[1, 1, 1]])
    kit.backward(model(x).sum())
    assert [label for label, *_ in log.calls] == ["Sequential", "Linear2", "ReLU", "Linear1"]
    expected = {
        "Sequential": [[1]],
        "Linear2": [[1]],
        "ReLU": [[1, 2, 3, 4]],
        "Linear1": [[1, 0, 3, 0]],
    }
    for label, _, _, go in log.calls:
        close(go, [expected[label]])
    np.testing.assert_allclose(kit.grad(x), [[22, 26, 30]])


# -- grad_input / grad_output slots ------------------------------------------------------------


def _three_args(kit: Any) -> Any:
    def forward(self, a, b, n, scale=None):  # type: ignore[no-untyped-def]
        out = a * b * n
        return out if scale is None else out + scale

    return kit.module(forward)


def test_grad_input_one_slot_per_positional_arg(backend: Any) -> None:
    kit = backend
    m = _three_args(kit)
    log = Log(kit)
    unihook.register_full_backward_hook(m, log.full("m"))
    a = leaf(kit, [1.0, 2.0])
    b = leaf(kit, [3.0, 3.0], requires_grad=False)
    s = leaf(kit, [1.0, 1.0])
    kit.backward(m(a, b, 2, scale=s).sum())
    [(_, _, gi, go)] = log.calls
    # a: its gradient; b (needs no grad): zeros; 2 (not a tensor): None; the kwarg: no slot.
    close(gi, [[6, 6], [0, 0], None])
    close(go, [[1, 1]])
    np.testing.assert_allclose(kit.grad(a), [6, 6])
    np.testing.assert_allclose(kit.grad(s), [1, 1])


def test_fires_once_after_all_input_grads(backend: Any) -> None:
    kit = backend

    def forward(self, a, b):  # type: ignore[no-untyped-def]
        return a * 2 + b * 3

    m = kit.module(forward)
    log = Log(kit)
    unihook.register_full_backward_hook(m, log.full("m"))
    x = leaf(kit, [1.0])
    a = x * 5
    b = kit.relu(x) * 7  # a and b reach x along different paths
    kit.backward(m(a, b).sum())
    [(_, _, gi, go)] = log.calls
    close(gi, [[2], [3]])
    close(go, [[1]])
    np.testing.assert_allclose(kit.grad(x), [2 * 5 + 3 * 7])


def test_unused_output_gives_none_and_tuple_outputs(backend: Any) -> None:
    kit = backend

    def forward(self, a):  # type: ignore[no-untyped-def]
        return a * 2, a * 3, 7

    m = kit.module(forward)
    log = Log(kit)
    unihook.register_full_backward_pre_hook(m, log.pre("m"))
    unihook.register_full_backward_hook(m, log.full("m"))
    x = leaf(kit, [1.0, 1.0])
    first, second, seven = m(x)
    assert seven == 7
    kit.backward(first.sum())
    assert log.order() == [("m", "pre"), ("m", "full")]
    close(log.calls[0][3], [[1, 1], None, None])
    close(log.calls[1][2], [[2, 2]])
    close(log.calls[1][3], [[1, 1], None, None])

    log.calls.clear()
    x = leaf(kit, [1.0, 1.0])
    first, second, _ = m(x)
    kit.backward((first + second * 10).sum())
    close(log.calls[1][2], [[32, 32]])
    close(log.calls[1][3], [[1, 1], [10, 10], None])
    np.testing.assert_allclose(kit.grad(x), [32, 32])


@pytest.mark.parametrize("kind", ["full", "pre", "global"])
def test_a_parameter_only_an_unused_output_reaches_keeps_no_gradient(
    backend: Any, kind: str
) -> None:
    """An auxiliary head whose output the loss leaves out: its parameters' .grad stays None, as
    without hooks (an optimizer skips such a parameter; zeros would take weight decay and
    momentum: a hook that only looks would change the training)."""
    kit = backend
    if kit.name == "mindspore":
        pytest.skip(
            "mindspore.grad gives zeros for every weight asked for, hooked or not (no None "
            "gradient); the kit's None is its tape's graph reach (docs/MINDSPORE.md section 7)"
        )

    def forward(self, a):  # type: ignore[no-untyped-def]
        return self.head(a), self.aux(a)

    head, aux = kit.linear(2, 2), kit.linear(2, 2)
    m = kit.module(forward, {"head": head, "aux": aux})
    seen: list[Any] = []
    if kind == "full":
        handle = unihook.register_full_backward_hook(m, lambda mod, gi, go: seen.append(go))
    elif kind == "pre":
        handle = unihook.register_full_backward_pre_hook(m, lambda mod, go: seen.append(go))
    else:
        handle = unihook.register_module_full_backward_hook(
            lambda mod, gi, go: seen.append(go) if mod is m else None, backend=kit.name
        )
    with handle:
        out, _ = m(leaf(kit, [[1.0, -2.0]]))
        kit.backward(out.sum())
    assert len(seen) == 1 and seen[0][1] is None
    assert kit.grad(aux.weight) is None and kit.grad(aux.bias) is None
    assert kit.grad(head.weight) is not None


@pytest.mark.parametrize("container", ["dict", "list"])
def test_output_not_tensor_or_tuple_warns_and_never_fires(backend: Any, container: Any) -> None:
    kit = backend

    def forward(self, a):  # type: ignore[no-untyped-def]
        return {"out": a * 2} if container == "dict" else [a * 2]

    m = kit.module(forward)
    log = Log(kit)
    unihook.register_full_backward_pre_hook(m, log.pre("m"))
    unihook.register_full_backward_hook(m, log.full("m"))
    x = leaf(kit, [1.0, 2.0])
    with pytest.warns(UserWarning, match="module output should be a Tensor or a tuple"):
        out = m(x)
    kit.backward((out["out"] if container == "dict" else out[0]).sum())
    assert log.calls == []
    np.testing.assert_allclose(kit.grad(x), [2, 2])


def test_module_called_twice_fires_twice(backend: Any) -> None:
    kit = backend
    inner = kit.linear(2, 2, [[1, 0], [0, 1]], [0, 0])
    log = Log(kit)
    unihook.register_full_backward_hook(inner, log.full("inner"))
    x = leaf(kit, [[1.0, 2.0]])
    y = inner(inner(x) * 3)
    kit.backward(y.sum())
    assert log.order() == [("inner", "full"), ("inner", "full")]
    close(log.calls[0][2], [[[1, 1]]])  # the second call's input: inner(x) * 3
    close(log.calls[1][2], [[[3, 3]]])
    close(log.calls[1][3], [[[3, 3]]])
    np.testing.assert_allclose(kit.grad(x), [[3, 3]])


def test_nothing_fires_under_no_grad(backend: Any) -> None:
    kit = backend
    model = seed_model(kit)
    log = Log(kit)
    for _, module in kit.named_modules(model):
        unihook.register_full_backward_hook(module, log.full("m"))
        unihook.register_full_backward_pre_hook(module, log.pre("m"))
    x = leaf(kit, [[1, 1, 1]])
    with kit.no_grad():
        out = model(x)
    assert not kit.requires_grad(out)
    assert log.calls == []
    # The per-call state of the no_grad call did not leak: a normal call works after it.
    kit.backward(model(x).sum())
    assert len(log.calls) == 8
    np.testing.assert_allclose(kit.grad(x), [[22, 26, 30]])


def test_double_backward_fires_once_per_pass(backend: Any) -> None:
    if not creates_graph(backend):
        pytest.skip(f"{backend.name}: no create_graph in its kit (docs/MINDSPORE.md)")
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    log = Log(kit)
    unihook.register_full_backward_pre_hook(lin, log.pre("lin"))
    unihook.register_full_backward_hook(lin, log.full("lin"))
    x = leaf(kit, [[1.0, 1.0]])
    y = lin(x)
    [gx] = kit.autograd_grad([(y * y).sum()], [x], create_graph=True)
    np.testing.assert_allclose(kit.numpy(gx), [[6, 12]])  # 2*y*W, y=3
    assert log.order() == [("lin", "pre"), ("lin", "full")]
    close(log.calls[1][2], [[[6, 12]]])
    close(log.calls[1][3], [[[6]]])
    log.calls.clear()
    # d/dx sum(gx) = 2 * W * (W . 1): the second pass goes through lin's forward once more.
    kit.backward(gx.sum())
    assert log.order() == [("lin", "pre"), ("lin", "full")]
    close(log.calls[0][3], [[[6]]])
    np.testing.assert_allclose(kit.grad(x), [[6, 12]])


def test_grad_wrt_parameter_only(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    log = Log(kit)
    unihook.register_full_backward_pre_hook(lin, log.pre("lin"))
    unihook.register_full_backward_hook(lin, log.full("lin"))
    x = leaf(kit, [[1.0, 3.0]])
    weight = [p for p in kit.parameters(lin) if kit.numpy(p).size == 2][0]
    [gw] = kit.autograd_grad([lin(x).sum()], [weight])
    assert kit.numpy(gw).reshape(-1).tolist() == [1, 3]
    # As torch: the pre-hook fires (the gradient passed the output), the full hook does not
    # (grad_input was never computed).
    assert log.order() == [("lin", "pre")]
    close(log.calls[0][3], [[[1]]])


def test_grad_wrt_inner_parameters_fires_no_full_hook_of_the_containers(backend: Any) -> None:
    """The gradient of an inner layer's parameters only: a full hook fires where grad_input is
    computed, on a layer whose input leads to them (`b`, given ``cat([a(x), x])``), not on the
    containers whose input is the model's (torch's engine runs no node from which none of the
    inputs asked for is reached; paddle's ran the containers' input sides past a concat, and
    their full hooks fired: until 2026-12-07, helper-207's FINDING 6)."""
    kit = backend
    a = kit.linear(2, 2, [[1, 2], [3, 4]], [0, 0])
    b = kit.linear(4, 1, [[1, -1, 5, 7]], [0])
    inner = kit.module(lambda self, x: b(kit.cat([a(x), x], 1)), {"a": a, "b": b})
    outer = kit.module(lambda self, x: inner(x) * 2, {"inner": inner})
    log = Log(kit)
    for name, module in (("outer", outer), ("inner", inner), ("b", b)):
        unihook.register_full_backward_pre_hook(module, log.pre(name))
        unihook.register_full_backward_hook(module, log.full(name))
    x = leaf(kit, [[1.0, 3.0]])
    weight = [p for p in kit.parameters(a) if kit.numpy(p).size == 4][0]
    [gw] = kit.autograd_grad([outer(x).sum()], [weight])
    assert sorted(kit.numpy(gw).reshape(-1).tolist()) == [-6, -2, 2, 6]  # (either layout)
    assert log.order() == [("outer", "pre"), ("inner", "pre"), ("b", "pre"), ("b", "full")]


def test_full_hook_fires_for_an_input_only_the_graph_holds(backend: Any) -> None:
    """An input nobody holds after the forward: the graph holds it (torch's does), also through
    a garbage collection before the backward. (A MindSpore Parameter is in a reference cycle:
    the collector freed it and the backward left the input side out, intermittently.)"""
    import gc

    lin = backend.linear(3, 2)
    calls: list[int] = []
    unihook.register_full_backward_hook(lin, lambda m, gi, go: calls.append(len(gi)))
    y = lin(backend.tensor([[1.0, 2.0, 3.0]], requires_grad=True)).sum()
    gc.collect()
    backend.backward(y)
    assert calls == [1]


# -- returned values -----------------------------------------------------------------------------


def test_full_hook_return_replaces_grad_input(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    unihook.register_full_backward_hook(lin, lambda m, gi, go: (gi[0] * 2,))
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin(x).sum())
    np.testing.assert_allclose(kit.grad(x), [[2, 4]])
    # a list works as a tuple
    lin2 = kit.linear(2, 1, [[1, 2]], [0])
    unihook.register_full_backward_hook(lin2, lambda m, gi, go: [gi[0] * 3])
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin2(x).sum())
    np.testing.assert_allclose(kit.grad(x), [[3, 6]])


def test_pre_hook_return_replaces_grad_output(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    log = Log(kit)
    unihook.register_full_backward_pre_hook(lin, lambda m, go: (go[0] * 3,))
    unihook.register_full_backward_hook(lin, log.full("lin"))
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin(x).sum())
    [(_, _, gi, go)] = log.calls
    close(go, [[[3]]])
    close(gi, [[[3, 6]]])
    np.testing.assert_allclose(kit.grad(x), [[3, 6]])
    grads = {kit.numpy(p).size: kit.grad(p) for p in kit.parameters(lin)}
    np.testing.assert_allclose(grads[2].reshape(-1), [3, 3])
    np.testing.assert_allclose(grads[1], [3])


def test_chaining_prepend_and_pre_before_full(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    seen: list[tuple[str, list]] = []

    def full(label, factor):  # type: ignore[no-untyped-def]
        def hook(m, gi, go):  # type: ignore[no-untyped-def]
            seen.append((label, kit.numpy(gi[0]).tolist()))
            return (gi[0] * factor,)

        return hook

    def pre(label, factor):  # type: ignore[no-untyped-def]
        def hook(m, go):  # type: ignore[no-untyped-def]
            seen.append((label, kit.numpy(go[0]).tolist()))
            return (go[0] * factor,)

        return hook

    unihook.register_full_backward_hook(lin, full("full-a", 2))
    unihook.register_full_backward_hook(lin, full("full-b", 3))
    unihook.register_full_backward_hook(lin, full("full-first", 5), prepend=True)
    unihook.register_full_backward_pre_hook(lin, pre("pre-a", 7))
    unihook.register_full_backward_pre_hook(lin, pre("pre-first", 11), prepend=True)
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin(x).sum())
    g = 77  # the pre-hooks' product scales grad_output
    assert seen == [
        ("pre-first", [[1]]),
        ("pre-a", [[11]]),
        ("full-first", [[g, 2 * g]]),
        ("full-a", [[5 * g, 10 * g]]),
        ("full-b", [[10 * g, 20 * g]]),
    ]
    np.testing.assert_allclose(kit.grad(x), [[30 * g, 60 * g]])


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_wrong_length_raises_hook_return_error(backend: Any, kind: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)
    if kind == "full_backward":
        unihook.register_full_backward_hook(lin, lambda m, gi, go: (gi[0], gi[0]))
    else:
        unihook.register_full_backward_pre_hook(lin, lambda m, go: (go[0], go[0], go[0]))
    x = leaf(kit, [[1.0, 1.0]])
    with pytest.raises(HookReturnError) as info:
        kit.backward(lin(x).sum())
    message = str(info.value)
    assert f"{kind} hook" in message
    assert type(lin).__name__ in message
    assert f"[backend {kit.name}]" in message
    assert "1 gradients" in message  # expected
    assert f"length {2 if kind == 'full_backward' else 3}" in message  # received


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_wrong_shape_raises_hook_return_error(backend: Any, kind: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)
    bad = kit.tensor([[1.0, 2.0, 3.0]])
    if kind == "full_backward":
        unihook.register_full_backward_hook(lin, lambda m, gi, go: (bad,))
    else:
        unihook.register_full_backward_pre_hook(lin, lambda m, go: (bad,))
    x = leaf(kit, [[1.0, 1.0]])
    with pytest.raises(HookReturnError, match=r"shape \[1, (2|1)\]"):
        kit.backward(lin(x).sum())


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_wrong_dtype_raises_hook_return_error(backend: Any, kind: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)
    if kind == "full_backward":
        unihook.register_full_backward_hook(
            lin, lambda m, gi, go: (kit.tensor([[1.0, 2.0]], dtype="float64"),)
        )
    else:
        unihook.register_full_backward_pre_hook(
            lin, lambda m, go: (kit.tensor([[1.0]], dtype="float64"),)
        )
    with pytest.raises(HookReturnError, match="dtype"):
        kit.backward(lin(leaf(kit, [[1.0, 1.0]])).sum())


def test_not_a_tuple_raises_hook_return_error(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)
    unihook.register_full_backward_hook(lin, lambda m, gi, go: gi[0])
    with pytest.raises(HookReturnError, match="tuple"):
        kit.backward(lin(leaf(kit, [[1.0, 1.0]])).sum())


def test_no_input_needs_grad(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    log = Log(kit)
    unihook.register_full_backward_hook(lin, log.full("lin"))
    x = leaf(kit, [[1.0, 1.0]], requires_grad=False)
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        kit.backward(lin(x).sum())
    [(_, _, gi, go)] = log.calls
    assert gi == (None,)
    close(go, [[[1]]])
    grads = {kit.numpy(p).size: kit.grad(p) for p in kit.parameters(lin)}
    np.testing.assert_allclose(grads[2].reshape(-1), [1, 1])


def test_no_input_needs_grad_pre_hooks_only_warn(backend: Any) -> None:
    """As torch: with backward pre-hooks alone, the warning comes when no input needs grad,
    and only then."""
    kit = backend
    lin = kit.linear(2, 1)
    log = Log(kit)
    unihook.register_full_backward_pre_hook(lin, log.pre("lin"))
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        kit.backward(lin(leaf(kit, [[1.0, 1.0]], requires_grad=False)).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kit.backward(lin(leaf(kit, [[1.0, 1.0]])).sum())
    assert [c[0] for c in log.calls] == ["lin", "lin"]


def test_no_input_needs_grad_return_raises(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)
    unihook.register_full_backward_hook(lin, lambda m, gi, go: (go[0],))
    x = leaf(kit, [[1.0, 1.0]], requires_grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(HookReturnError, match="no input of the module requires grad"):
            kit.backward(lin(x).sum())


def test_returning_none_slot_for_differentiable_input(backend: Any) -> None:
    kit = backend

    def forward(self, a, b):  # type: ignore[no-untyped-def]
        return a * b

    m = kit.module(forward)
    unihook.register_full_backward_hook(m, lambda mod, gi, go: (None, gi[1]))
    x = leaf(kit, [1.0, 2.0])
    y = leaf(kit, [3.0, 4.0])
    kit.backward((m(x, y) + x).sum())
    # torch leaves the dropped gradient undefined, paddle needs zeros (trap 3): either way x
    # gets only the gradient of its other path.
    np.testing.assert_allclose(kit.grad(x), [1, 1])
    np.testing.assert_allclose(kit.grad(y), [1, 2])


# -- interaction with forward hooks ------------------------------------------------------------


def test_forward_hooks_see_the_same_values(backend: Any) -> None:
    kit = backend
    x_data = [[1.0, -1.0, 2.0]]

    def run(with_backward_hooks: bool):  # type: ignore[no-untyped-def]
        model = seed_model(kit)
        lin = kit.named_modules(model)[1][1]
        seen: list = []

        def pre(m, args):  # type: ignore[no-untyped-def]
            seen.append(("pre", kit.numpy(args[0]).tolist(), kit.requires_grad(args[0])))

        def post(m, args, out):  # type: ignore[no-untyped-def]
            seen.append(("post", kit.numpy(args[0]).tolist(), kit.numpy(out).tolist()))

        unihook.register_forward_pre_hook(lin, pre)
        unihook.register_forward_hook(lin, post)
        if with_backward_hooks:
            unihook.register_full_backward_hook(lin, lambda m, gi, go: None)
            unihook.register_full_backward_pre_hook(lin, lambda m, go: None)
        unihook.register_forward_pre_hook(lin, pre)
        unihook.register_forward_hook(lin, post)
        x = leaf(kit, x_data)
        kit.backward(model(x).sum())
        return seen, kit.grad(x)

    plain, plain_grad = run(False)
    hooked, hooked_grad = run(True)
    assert hooked == plain
    np.testing.assert_allclose(hooked_grad, plain_grad)


def test_dispatchers_stay_after_forward_hooks(backend: Any) -> None:
    """A forward pre-hook replacing args and a forward hook replacing the output, both
    registered after the backward hooks: grad_input and grad_output refer to the replaced
    values (as torch: its BackwardHook wraps args after pre-hooks, the output after hooks)."""
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    log = Log(kit)
    unihook.register_full_backward_pre_hook(lin, log.pre("lin"))
    unihook.register_full_backward_hook(lin, log.full("lin"))
    unihook.register_forward_pre_hook(lin, lambda m, args: (args[0] * 2,))
    unihook.register_forward_hook(lin, lambda m, args, out: out * 3)
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin(x).sum())
    assert log.order() == [("lin", "pre"), ("lin", "full")]
    close(log.calls[0][3], [[[1]]])  # d sum / d (out * 3)
    close(log.calls[1][2], [[[3, 6]]])  # d / d (2 x)
    close(log.calls[1][3], [[[1]]])
    np.testing.assert_allclose(kit.grad(x), [[6, 12]])


# -- exceptions and removal ----------------------------------------------------------------------


class HookFailure(Exception):
    pass


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_exception_keeps_its_type(backend: Any, kind: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1)

    def boom(*args):  # type: ignore[no-untyped-def]
        raise HookFailure("boom")

    if kind == "full_backward":
        handle = unihook.register_full_backward_hook(lin, boom)
    else:
        handle = unihook.register_full_backward_pre_hook(lin, boom)
    x = leaf(kit, [[1.0, 1.0]])
    with pytest.raises(HookFailure, match="boom"):
        kit.backward(lin(x).sum())
    # the module still works, with and without the hook
    handle.remove()
    log = Log(kit)
    unihook.register_full_backward_hook(lin, log.full("lin"))
    kit.backward(lin(leaf(kit, [[1.0, 1.0]])).sum())
    assert log.order() == [("lin", "full")]


def test_remove_restores_module(backend: Any) -> None:
    kit = backend
    lin = kit.linear(2, 1, [[1, 2]], [0])
    before = kit.hook_counts(lin)
    assert hook_residue(kit, lin) == 0
    log = Log(kit)
    h1 = unihook.register_full_backward_hook(lin, log.full("a"))
    h2 = unihook.register_full_backward_pre_hook(lin, log.pre("b"))
    assert hook_residue(kit, lin) > 0
    h1.remove()
    h1.remove()  # idempotent
    assert hook_residue(kit, lin) > 0  # the pre-hook still needs the dispatchers
    kit.backward(lin(leaf(kit, [[1.0, 1.0]])).sum())
    assert log.order() == [("b", "pre")]
    h2.remove()
    h2.remove()
    assert kit.hook_counts(lin) == before
    log.calls.clear()
    x = leaf(kit, [[1.0, 1.0]])
    kit.backward(lin(x).sum())
    assert log.calls == []
    np.testing.assert_allclose(kit.grad(x), [[1, 2]])
    # forward hooks registered around the backward hooks are left alone
    fwd = unihook.register_forward_hook(lin, lambda m, a, o: None)
    h3 = unihook.register_full_backward_hook(lin, log.full("c"))
    with_fwd = hook_residue(kit, lin)
    h3.remove()
    assert hook_residue(kit, lin) < with_fwd
    fwd.remove()
    assert kit.hook_counts(lin) == before


def test_hook_removed_after_forward_still_fires_for_that_call(backend: Any) -> None:
    """As torch: a call snapshots its hooks at forward time."""
    kit = backend
    lin = kit.linear(2, 1)
    log = Log(kit)
    handle = unihook.register_full_backward_hook(lin, log.full("lin"))
    y = lin(leaf(kit, [[1.0, 1.0]]))
    handle.remove()
    kit.backward(y.sum())
    assert log.order() == [("lin", "full")]


def test_gradients_a_hook_keeps_do_not_change(backend: Any) -> None:
    """As torch: the tensors a hook received stay as they were, also when the framework later
    accumulates another gradient for the same tensor (paddle does that in place)."""
    kit = backend

    def forward(self, a):  # type: ignore[no-untyped-def]
        t = a * 2
        return t, kit.relu(t) * 3  # the gradient of output 0 and the relu path both reach t

    m = kit.module(forward)
    kept: list = []

    def pre(module, grad_output):  # type: ignore[no-untyped-def]
        kept.append(("pre", grad_output, [kit.numpy(g) for g in grad_output]))

    def full(module, grad_input, grad_output):  # type: ignore[no-untyped-def]
        kept.append(("full-in", grad_input, [kit.numpy(g) for g in grad_input]))
        kept.append(("full-out", grad_output, [kit.numpy(g) for g in grad_output]))

    unihook.register_full_backward_pre_hook(m, pre)
    unihook.register_full_backward_hook(m, full)
    x = leaf(kit, [1.0, 2.0])
    h = x * 1
    first, second = m(h)
    # h also reaches the loss along a longer path: its gradient from m arrives first
    other = kit.relu(kit.relu(kit.relu(h))) * 100
    kit.backward((first + second * 10 + other).sum())
    assert [k[0] for k in kept] == ["pre", "full-in", "full-out"]
    for _, grads, seen in kept:
        close(arrays(kit, grads), seen)
    close(kept[0][2], [[1, 1], [10, 10]])
    close(kept[1][2], [[62, 62]])
    np.testing.assert_allclose(kit.grad(x), [162, 162])


class _Hook:
    def __call__(self, *args: Any) -> Any:
        return None


@pytest.mark.parametrize("run", ["forward-only", "backward", "autograd-grad", "no-grad"])
def test_graph_and_hooks_are_freed(backend: Any, run: Any) -> None:
    """Nothing keeps a module call's graph (and the hooks it snapshots) alive after use."""
    import gc
    import weakref

    kit = backend

    def forward(self, a, mask):  # type: ignore[no-untyped-def]
        return self.lin(a) * mask

    # a tensor argument that needs no grad (a mask) goes through the input side too
    m = kit.module(forward, {"lin": kit.linear(2, 2)})
    full, pre = _Hook(), _Hook()
    handles = [
        unihook.register_full_backward_hook(m, full),
        unihook.register_full_backward_pre_hook(m, pre),
    ]
    refs = [weakref.ref(full), weakref.ref(pre)]
    del full, pre
    mask = leaf(kit, [[1.0, 0.0]], requires_grad=False)
    for _ in range(3):
        x = leaf(kit, [[1.0, 2.0]])
        if run == "no-grad":
            with kit.no_grad():
                y = m(x, mask)
        else:
            y = m(x * 2, mask)
        if run == "backward":
            kit.backward(y.sum())
        elif run == "autograd-grad":
            kit.autograd_grad([y.sum()], [x])
        del x, y
    for handle in handles:
        handle.remove()
    gc.collect()
    assert [r() for r in refs] == [None, None]


# -- in-place safety -----------------------------------------------------------------------------


def _residual(kit: Any, inplace: bool) -> Any:
    kit.seed(0)
    conv = kit.conv2d(2, 2, 3, padding=1)
    relu = kit.relu_module(inplace=inplace)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.relu(self.conv(x)) + x

    return kit.module(forward, {"conv": conv, "relu": relu}), conv


def _run_block(kit: Any, block: Any, conv: Any, x_data: Any) -> Any:
    log = Log(kit)
    unihook.register_full_backward_pre_hook(conv, log.pre("conv"))
    unihook.register_full_backward_hook(conv, log.full("conv"))
    unihook.register_full_backward_hook(block, log.full("block"))
    x = leaf(kit, x_data)
    out = block(x)
    kit.backward((out * out).sum())
    return log, kit.grad(x), [kit.grad(p) for p in kit.parameters(block)]


def test_inplace_relu_after_hooked_conv(backend: Any) -> None:
    kit = backend
    x_data = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype("float32")
    plain, plain_conv = _residual(kit, inplace=False)
    inplace, inplace_conv = _residual(kit, inplace=True)
    for p, q in zip(kit.parameters(plain), kit.parameters(inplace)):
        np.testing.assert_array_equal(kit.numpy(p), kit.numpy(q))
    log_a, gx_a, gp_a = _run_block(kit, plain, plain_conv, x_data)
    log_b, gx_b, gp_b = _run_block(kit, inplace, inplace_conv, x_data)
    assert (
        log_a.order()
        == log_b.order()
        == [
            ("conv", "pre"),
            ("conv", "full"),
            ("block", "full"),
        ]
    )
    for a, b in zip(log_a.calls, log_b.calls):
        for grads_a, grads_b in ((a[2], b[2]), (a[3], b[3])):
            if grads_a is None:
                assert grads_b is None
                continue
            close(grads_b, grads_a)
    np.testing.assert_allclose(gx_b, gx_a, rtol=1e-6, atol=1e-6)
    for a, b in zip(gp_a, gp_b):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_inplace_add_on_hooked_output(backend: Any) -> None:
    kit = backend

    def run(inplace: bool):  # type: ignore[no-untyped-def]
        lin = kit.linear(2, 2, [[1, 2], [3, 4]], [0, 0])
        log = Log(kit)
        unihook.register_full_backward_pre_hook(lin, log.pre("lin"))
        unihook.register_full_backward_hook(lin, log.full("lin"))
        x = leaf(kit, [[1.0, -1.0]])
        y = lin(x)
        y = kit.add_(y, 1.0) if inplace else y + 1.0
        kit.backward((y * y).sum())
        return log, kit.grad(x), [kit.grad(p) for p in kit.parameters(lin)]

    log_a, gx_a, gp_a = run(False)
    log_b, gx_b, gp_b = run(True)
    assert log_a.order() == log_b.order() == [("lin", "pre"), ("lin", "full")]
    close(log_b.calls[0][3], log_a.calls[0][3])
    close(log_b.calls[1][2], log_a.calls[1][2])
    close(log_b.calls[1][3], log_a.calls[1][3])
    close(log_a.calls[1][3], [[[0, 0]]])  # y = [-1, -1] + 1 = 0
    np.testing.assert_allclose(gx_b, gx_a)
    for a, b in zip(gp_a, gp_b):
        np.testing.assert_allclose(b, a)


# -- framework traps (run in a subprocess: a regression must not kill pytest) ---------------------

_RETAIN_GRAPH_SCRIPT = """
import warnings
warnings.filterwarnings("ignore")
import numpy as np
import unihook
from unihook.testing import kits

kit = next(k for k in kits() if k.name == {name!r})
lin = kit.linear(2, 1, [[1, 2]], [0])
calls = []
unihook.register_full_backward_hook(lin, lambda m, gi, go: calls.append(kit.numpy(gi[0])))
x = kit.tensor([[1.0, 1.0]], requires_grad=True)
y = lin(x).sum()
kit.backward(y, retain_graph=True)
print("first", len(calls), flush=True)
try:
    {second}
except unihook.BackendStateError as error:
    assert "retain_graph" in str(error) and "[backend" in str(error), str(error)
    print("BackendStateError", flush=True)
else:
    print("second", len(calls), kit.grad(x).tolist(), flush=True)
# the module and the framework are fine afterwards
x = kit.tensor([[1.0, 1.0]], requires_grad=True)
kit.backward(lin(x).sum())
print("fresh", kit.grad(x).tolist(), flush=True)
"""


@pytest.mark.parametrize(
    "second",
    [
        "kit.backward(y, retain_graph=True)",
        "kit.backward(y)",
        "kit.autograd_grad([y], [x])",
    ],
    ids=["backward", "backward-no-retain", "autograd-grad"],
)
def test_second_backward_through_hooked_module(backend: Any, second: Any) -> None:
    """Natively paddle segfaults on any second backward through a PyLayer after a
    Tensor.backward (SEMANTICS trap 7). It must work (torch) or raise BackendStateError."""
    script = _RETAIN_GRAPH_SCRIPT.format(name=backend.name, second=second)
    env = dict(os.environ, GLOG_minloglevel="2")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert "first 1" in lines
    assert "fresh [[1.0, 2.0]]" in lines, result.stdout
    if "BackendStateError" not in lines:
        if "autograd_grad" in second:
            assert "second 2 [[1.0, 2.0]]" in lines, result.stdout
        else:
            assert "second 2 [[2.0, 4.0]]" in lines, result.stdout


_SURVIVES_SCRIPT = """
import warnings
warnings.filterwarnings("ignore")
import unihook
from unihook.testing import kits

kit = next(k for k in kits() if k.name == {name!r})
lin = kit.linear(2, 1, [[1, 2]], [0])
unihook.register_full_backward_hook(lin, lambda m, gi, go: None)
x = kit.tensor([[1.0, 1.0]], requires_grad=True)
y = lin(x).sum()
kit.autograd_grad([y], [x], create_graph=False)
print("grad ok", flush=True)
y = lin(x).sum()
kit.backward(y)
print("backward ok", kit.grad(x).tolist(), flush=True)
# a fresh forward after a backward is always fine
for _ in range(3):
    kit.backward(lin(x).sum())
print("loop ok", kit.grad(x).tolist(), flush=True)
"""


def test_paddle_style_usage_does_not_crash(backend: Any) -> None:
    script = _SURVIVES_SCRIPT.format(name=backend.name)
    env = dict(os.environ, GLOG_minloglevel="2")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "loop ok [[4.0, 8.0]]" in result.stdout


def test_an_exception_in_a_backward_hook_leaks_nothing(backend: Any) -> None:
    """paddle never frees a PyLayer context whose backward raised: ours holds nothing then."""
    import gc
    import weakref

    layer = backend.linear(3, 1)
    alive = weakref.ref(layer)
    handle = unihook.register_full_backward_hook(layer, lambda m, gi, go: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        backend.backward(layer(backend.tensor([[1.0, 2.0, 3.0]], requires_grad=True)).sum())
    handle.remove()
    del layer, handle
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_forward_frees_the_model(
    backend: Any, raised: type[BaseException]
) -> None:
    """torch runs always_call hooks only for an Exception: a BaseException raised in forward
    of a module with backward hooks must not leave per-call state holding the model."""
    import gc
    import weakref

    def forward(self: Any, x: Any) -> Any:
        raise raised

    m = backend.module(forward, {"lin": backend.linear(2, 2)})
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    with pytest.raises(raised):
        m(backend.tensor([[1.0, 2.0]], requires_grad=True))
    ref = weakref.ref(m)
    del m
    gc.collect()
    alive = ref() is not None
    handle.remove()
    assert not alive


@pytest.mark.parametrize(
    "kinds",
    [
        pytest.param(
            "pre",
            marks=pytest.mark.xfail(
                strict=True,
                reason="helper-148's FINDING 10 (open): pre-hooks alone have no input side, "
                "forward gets the caller's tensors (exact under in-place ops), and an unused "
                "one gets None",
            ),
        ),
        "full",
        "pre+full",
    ],
)
def test_an_unused_input_gets_zeros_beside_a_backward_hook(backend: Any, kinds: str) -> None:
    # torch's BackwardHook passes every tensor input through its own node once the module has
    # a backward hook of either kind: an input forward never uses gets a gradient of zeros
    kit = backend

    def forward(self, a, unused):  # type: ignore[no-untyped-def]
        return a * 2

    m = kit.module(forward)
    log = Log(kit)
    if "pre" in kinds:
        unihook.register_full_backward_pre_hook(m, log.pre("m"))
    if "full" in kinds:
        unihook.register_full_backward_hook(m, log.full("m"))
    x, unused = leaf(kit, [1.0, 2.0]), leaf(kit, [3.0])
    kit.backward(m(x, unused).sum())
    np.testing.assert_allclose(kit.grad(x), [2, 2])
    np.testing.assert_allclose(kit.grad(unused), [0])
    assert len(log.calls) == len(kinds.split("+"))
    if "full" in kinds:
        close(log.calls[-1][2], [[2, 2], [0]])
