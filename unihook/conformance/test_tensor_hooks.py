"""Conformance: tensor gradient hooks (SEMANTICS.md §3), torch's semantics on every backend.

Every test takes `backend` (a ``unihook.testing.Kit``) and uses only kit operations and the
arithmetic operators both frameworks' tensors share. Several of these cases crash paddle 3.3.1
natively (a float return, a hook removing itself during backward): the adapter must stop them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import unihook
from unihook.conformance import kits
from unihook.testing import creates_graph, grads_non_leaves, retains_graph


def scalar(kit: Any, value: float) -> Any:
    return kit.tensor(value, requires_grad=True)


def val(kit: Any, tensor: Any) -> float:
    return float(kit.numpy(tensor))


# ---------------------------------------------------------------------------------------------
# the seed examples of SEMANTICS.md §3


def test_seed_intermediate_hook_doubles(backend: Any) -> None:
    x, y, w = scalar(backend, 2.0), scalar(backend, 3.0), scalar(backend, 4.0)
    z = x + y
    h = unihook.register_tensor_hook(z, lambda g: g * 2)
    assert h.backend == backend.name and h.kind == "tensor"
    o = w * z
    backend.backward(o)
    assert backend.grad(x) == 8.0 and backend.grad(y) == 8.0 and backend.grad(w) == 5.0


def _seed_chain(kit: Any, remove_h1: bool) -> tuple[list[tuple[str, float]], Any, Any, Any]:
    seen: list[tuple[str, float]] = []

    def hook(tag: str, change: Any) -> Any:
        def fn(g: Any) -> Any:
            seen.append((tag, val(kit, g)))
            return change(g)

        return fn

    a, b = scalar(kit, 2.0), scalar(kit, 3.0)
    c = a * b
    h1 = unihook.register_tensor_hook(c, hook("h1", lambda g: g + 2))
    unihook.register_tensor_hook(c, hook("h2", lambda g: None))
    d = scalar(kit, 4.0)
    unihook.register_tensor_hook(d, hook("d", lambda g: g + 100))
    e = c * d
    unihook.register_tensor_hook(e, hook("e", lambda g: g * 2))
    if remove_h1:
        h1.remove()
    kit.backward(e)
    return seen, a, b, d


def test_seed_hook_order_and_values(backend: Any) -> None:
    seen, a, b, d = _seed_chain(backend, remove_h1=False)
    assert seen == [("e", 1.0), ("d", 12.0), ("h1", 8.0), ("h2", 10.0)]
    assert backend.grad(a) == 30.0 and backend.grad(b) == 20.0 and backend.grad(d) == 112.0


def test_seed_hook_removed_before_backward(backend: Any) -> None:
    seen, a, b, d = _seed_chain(backend, remove_h1=True)
    assert seen == [("e", 1.0), ("d", 12.0), ("h2", 8.0)]
    assert backend.grad(a) == 24.0 and backend.grad(b) == 16.0 and backend.grad(d) == 112.0


# ---------------------------------------------------------------------------------------------
# semantics


def test_hooks_chain_later_sees_earlier_return(backend: Any) -> None:
    x = backend.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    unihook.register_tensor_hook(x, lambda g: seen.append(backend.numpy(g)) or g * 10)
    unihook.register_tensor_hook(x, lambda g: seen.append(backend.numpy(g)) or g + 1)
    backend.backward((x * 3).sum())
    np.testing.assert_allclose(seen[0], [3.0, 3.0])
    np.testing.assert_allclose(seen[1], [30.0, 30.0])
    np.testing.assert_allclose(backend.grad(x), [31.0, 31.0])


def test_removal_after_backward_affects_later_backwards_only(backend: Any) -> None:
    x = scalar(backend, 1.0)
    seen = []
    h = unihook.register_tensor_hook(x, lambda g: seen.append(val(backend, g)) or g * 2)
    backend.backward(x * 3)
    assert seen == [3.0] and backend.grad(x) == 6.0
    h.remove()
    h.remove()  # twice is harmless
    backend.backward(x * 3)
    assert seen == [3.0] and backend.grad(x) == 9.0


def test_leaf_hook_sees_fresh_grad_not_accumulated(backend: Any) -> None:
    x = scalar(backend, 1.0)
    seen = []
    unihook.register_tensor_hook(x, lambda g: seen.append(val(backend, g)))
    backend.backward(x * 3)
    backend.backward(x * 5)
    assert seen == [3.0, 5.0]
    assert backend.grad(x) == 8.0


def test_tensor_used_twice_fires_once_with_summed_grad(backend: Any) -> None:
    x = scalar(backend, 1.0)
    z = x * 2
    seen = []
    unihook.register_tensor_hook(z, lambda g: seen.append(val(backend, g)))
    backend.backward(z * 3 + z * 4)
    assert seen == [7.0]
    assert backend.grad(x) == 14.0


@pytest.mark.parametrize("where", ["leaf", "intermediate"])
def test_in_place_edit_of_grad_changes_it(backend: Any, where: str) -> None:
    x = scalar(backend, 1.0)
    z = x * 2
    target = x if where == "leaf" else z

    def hook(g: Any) -> None:
        backend.add_(g, 5.0)  # no return: the in-place edit is the change

    unihook.register_tensor_hook(target, hook)
    backend.backward(z * 3)
    # leaf: 6 + 5; intermediate: (3 + 5) * 2
    assert backend.grad(x) == (11.0 if where == "leaf" else 16.0)


def test_hook_on_intermediate_fires_during_autograd_grad(backend: Any) -> None:
    x = scalar(backend, 2.0)
    z = x * 3
    seen = []
    unihook.register_tensor_hook(z, lambda g: seen.append(val(backend, g)) or g * 2)
    (gx,) = backend.autograd_grad([z * z], [x])
    assert seen == [12.0]
    assert val(backend, gx) == 72.0
    assert backend.grad(x) is None  # autograd_grad does not accumulate


def test_leaf_hook_fires_during_autograd_grad(backend: Any) -> None:
    # Torch's semantics; paddle 3.3.1 natively skips leaf hooks in paddle.grad.
    x = scalar(backend, 2.0)
    w = scalar(backend, 5.0)
    seen = []
    unihook.register_tensor_hook(x, lambda g: seen.append(("x1", val(backend, g))) or g * 10)
    unihook.register_tensor_hook(x, lambda g: seen.append(("x2", val(backend, g))))
    unihook.register_tensor_hook(w, lambda g: seen.append(("w", val(backend, g))))
    z = x * 3
    unihook.register_tensor_hook(z, lambda g: seen.append(("z", val(backend, g))) or g * 2)
    (gx,) = backend.autograd_grad([z * z * w], [x])
    # w is not an input: its hook does not fire
    assert seen == [("z", 60.0), ("x1", 360.0), ("x2", 3600.0)]
    assert val(backend, gx) == 3600.0
    assert backend.grad(x) is None
    seen.clear()
    gx, gw = backend.autograd_grad([x * w], [x, w])
    assert seen == [("x1", 5.0), ("x2", 50.0), ("w", 2.0)] or seen == [
        ("w", 2.0),
        ("x1", 5.0),
        ("x2", 50.0),
    ]
    assert val(backend, gx) == 50.0 and val(backend, gw) == 2.0


def test_ops_on_grad_fires_on_a_leaf_during_autograd_grad(backend: Any) -> None:
    """`unihook.ops.on_grad` on a leaf: it sees the gradient under autograd_grad too (on
    paddle, whose paddle.grad skips leaf hooks, it was not called until 2026-12-07:
    helper-207's FINDING 4)."""
    x = scalar(backend, 2.0)
    seen: list[float] = []
    assert unihook.ops.on_grad(x, lambda g: seen.append(val(backend, g)))
    (gx,) = backend.autograd_grad([x * x * 3], [x])
    assert seen == [12.0] and val(backend, gx) == 12.0


def test_leaf_hook_during_autograd_grad_with_create_graph(backend: Any) -> None:
    if not creates_graph(backend):
        pytest.skip(f"{backend.name}: no create_graph in its kit (docs/MINDSPORE.md)")
    x = scalar(backend, 3.0)
    unihook.register_tensor_hook(x, lambda g: g * 2)
    (gx,) = backend.autograd_grad([x * x], [x], create_graph=True)
    assert val(backend, gx) == 12.0  # 2 * (2x)
    backend.backward(gx)  # d/dx of 4x, then the hook doubles it once more
    assert backend.grad(x) == 8.0


# ---------------------------------------------------------------------------------------------
# bad returns and targets (paddle: a float return segfaults, a wrong shape is accepted)


def _backward_with(kit: Any, returned: Any) -> pytest.ExceptionInfo[unihook.HookReturnError]:
    x = kit.tensor([1.0, 2.0], requires_grad=True)
    z = x * 2
    unihook.register_tensor_hook(z, lambda g: returned(g))
    with pytest.raises(unihook.HookReturnError) as info:
        kit.backward((z * 3).sum())
    return info


def _common(kit: Any, msg: str) -> None:
    assert msg.startswith("tensor hook on ")
    assert f"[backend {kit.name}]" in msg


def test_wrong_shape_return(backend: Any) -> None:
    info = _backward_with(backend, lambda g: backend.tensor([1.0, 2.0, 3.0]))
    msg = str(info.value)
    _common(backend, msg)
    assert "expected a gradient of shape [2]" in msg and "shape [3]" in msg


def test_wrong_dtype_return(backend: Any) -> None:
    info = _backward_with(backend, lambda g: backend.tensor(backend.numpy(g), dtype="float64"))
    msg = str(info.value)
    _common(backend, msg)
    # the framework's spelling of the dtype: torch.float32, paddle.float32, MindSpore's Float32
    lower = msg.lower()
    assert "expected a gradient of dtype" in msg and "float32" in lower and "float64" in lower


@pytest.mark.parametrize("value", [1.5, "grad", [1.0, 2.0]], ids=["float", "str", "list"])
def test_non_tensor_return(backend: Any, value: Any) -> None:
    info = _backward_with(backend, lambda g: value)
    msg = str(info.value)
    _common(backend, msg)
    assert f"Received: {type(value).__name__}" in msg


def test_bad_return_on_leaf(backend: Any) -> None:
    x = backend.tensor([1.0, 2.0], requires_grad=True)
    unihook.register_tensor_hook(x, lambda g: 2.0)
    with pytest.raises(unihook.HookReturnError, match=r"Received: float"):
        backend.backward((x * 3).sum())


def test_backward_works_after_a_hook_error(backend: Any) -> None:
    x = scalar(backend, 1.0)
    h = unihook.register_tensor_hook(x, lambda g: 1.0)
    with pytest.raises(unihook.HookReturnError):
        backend.backward(x * 3)
    h.remove()
    y = scalar(backend, 1.0)
    backend.backward(y * 4)
    assert backend.grad(y) == 4.0


def test_hook_on_tensor_without_grad_is_a_target_error(backend: Any) -> None:
    t = backend.tensor([1.0, 2.0])
    with pytest.raises(unihook.HookTargetError) as info:
        unihook.register_tensor_hook(t, lambda g: None)
    msg = str(info.value)
    assert "tensor hook" in msg and backend.name in msg and "requires grad" in msg
    assert isinstance(info.value, TypeError)


def test_tensor_hook_on_module_is_a_target_error(backend: Any) -> None:
    with pytest.raises(unihook.HookTargetError):
        unihook.register_tensor_hook(backend.linear(2, 2), lambda g: None)


def test_tensor_hook_on_plain_object_has_no_backend() -> None:
    with pytest.raises(unihook.NoBackendError):
        unihook.register_tensor_hook([1.0, 2.0], lambda g: None)


# ---------------------------------------------------------------------------------------------
# exceptions raised by hooks (paddle natively: OSError "(External) ...")


class CustomHookError(Exception):
    pass


@pytest.mark.parametrize("where", ["leaf", "intermediate"])
@pytest.mark.parametrize("error_type", [ZeroDivisionError, CustomHookError])
def test_user_exception_keeps_type_and_message(
    backend: Any, where: str, error_type: type[Exception]
) -> None:
    x = scalar(backend, 1.0)
    z = x * 2

    def hook(g: Any) -> None:
        raise error_type(f"{error_type.__name__} raised in the hook: 42")

    unihook.register_tensor_hook(x if where == "leaf" else z, hook)
    with pytest.raises(error_type) as info:
        backend.backward(z * 3)
    assert type(info.value) is error_type  # paddle natively: OSError "(External) ..."
    assert str(info.value) == f"{error_type.__name__} raised in the hook: 42"


def test_user_exception_during_autograd_grad(backend: Any) -> None:
    x = scalar(backend, 1.0)
    z = x * 2

    def hook(g: Any) -> None:
        raise CustomHookError("in grad")

    unihook.register_tensor_hook(z, hook)
    with pytest.raises(CustomHookError, match="in grad"):
        backend.autograd_grad([z * 3], [x])


# ---------------------------------------------------------------------------------------------
# hooks removing hooks during backward (paddle natively: segfault)


def test_hook_removing_itself_during_backward(backend: Any) -> None:
    x = scalar(backend, 1.0)
    seen = []
    handles: list[Any] = []

    def once(g: Any) -> Any:
        seen.append(val(backend, g))
        handles[0].remove()
        return g * 10

    handles.append(unihook.register_tensor_hook(x, once))
    backend.backward(x * 3)
    assert seen == [3.0] and backend.grad(x) == 30.0
    backend.backward(x * 3)
    assert seen == [3.0] and backend.grad(x) == 33.0


def _second_backward(kit: Any, tensor: Any) -> bool:
    """Backward through `tensor`'s graph again; False where the framework cannot, after
    checking its clear error (`retains_graph`)."""
    if retains_graph(kit):
        kit.backward(tensor)
        return True
    with pytest.raises(unihook.BackendStateError, match="retain_graph"):
        kit.backward(tensor)
    return False


def test_intermediate_hook_removing_itself_and_another(backend: Any) -> None:
    x = scalar(backend, 1.0)
    z = x * 2
    seen = []
    handles: dict[str, Any] = {}

    def first(g: Any) -> Any:
        seen.append("first")
        handles["first"].remove()
        handles["leaf"].remove()
        return g

    handles["first"] = unihook.register_tensor_hook(z, first)
    handles["leaf"] = unihook.register_tensor_hook(x, lambda g: seen.append("leaf"))
    o = z * 3
    backend.backward(o, retain_graph=True)
    assert seen == ["first"]  # the removed leaf hook did not fire later in the same backward
    assert backend.grad(x) == 6.0
    if _second_backward(backend, o):
        assert seen == ["first"]
        assert backend.grad(x) == 12.0


def test_hook_removing_a_later_hook_of_the_same_tensor(backend: Any) -> None:
    """torch snapshots a tensor's hooks when they start to run: a hook that removes a later
    hook of the same tensor does not skip it in this backward, only in the next one."""
    x = scalar(backend, 1.0)
    handles: dict[str, Any] = {}

    def first(g: Any) -> Any:
        handles["second"].remove()
        return g * 2

    y = x * 3
    handles["first"] = unihook.register_tensor_hook(y, first)
    handles["second"] = unihook.register_tensor_hook(y, lambda g: g + 1)
    backend.backward(y, retain_graph=True)
    assert backend.grad(x) == 9.0  # (1 * 2 + 1) * 3: the removed hook still ran
    if _second_backward(backend, y):
        assert backend.grad(x) == 9.0 + 6.0  # (1 * 2) * 3: from this backward on it is gone


def test_hook_removing_itself_during_autograd_grad(backend: Any) -> None:
    if not grads_non_leaves(backend):
        pytest.skip(
            f"{backend.name}: no gradient with respect to a computed tensor (docs/MINDSPORE.md)"
        )
    x = scalar(backend, 1.0)
    z = x * 2
    seen = []
    handles: list[Any] = []

    def once(g: Any) -> Any:
        seen.append(val(backend, g))
        handles[0].remove()
        return g + 1

    handles.append(unihook.register_tensor_hook(z, once))
    (gz,) = backend.autograd_grad([z * 3], [z])
    assert seen == [3.0] and val(backend, gz) == 4.0
    (gz,) = backend.autograd_grad([z * 3], [z])
    assert seen == [3.0] and val(backend, gz) == 3.0


def test_with_handle_removes_tensor_hook(backend: Any) -> None:
    x = scalar(backend, 1.0)
    with unihook.register_tensor_hook(x, lambda g: g * 0) as h:
        backend.backward(x * 3)
    assert h.removed and backend.grad(x) == 0.0
    backend.backward(x * 3)
    assert backend.grad(x) == 3.0


def test_hook_registering_hooks_during_backward(backend: Any) -> None:
    # torch snapshots a tensor's hooks when they start to run: a hook added to the same tensor
    # runs from the next backward; one added to a tensor not reached yet runs in this one.
    x = scalar(backend, 1.0)
    z = x * 2
    seen = []

    def adder(g: Any) -> None:
        if not seen:
            unihook.register_tensor_hook(z, lambda g2: seen.append("z-new") or g2 * 10)
            unihook.register_tensor_hook(x, lambda g2: seen.append("x-new"))
        seen.append("adder")

    unihook.register_tensor_hook(z, adder)
    o = z * 3
    backend.backward(o, retain_graph=True)
    assert seen == ["adder", "x-new"]
    assert backend.grad(x) == 6.0
    if _second_backward(backend, o):
        assert seen == ["adder", "x-new", "adder", "z-new", "x-new"]
        assert backend.grad(x) == 6.0 + 60.0


def test_other_frameworks_tensor_names_both_frameworks() -> None:
    """Returning the other framework's tensor: the message says which framework is which."""
    every = kits()
    if len(every) < 2:
        pytest.skip("needs two backends")
    for ours, theirs in [(a, b) for a in every for b in every if a is not b]:
        x = ours.tensor([1.0, 2.0], requires_grad=True)
        unihook.register_tensor_hook(x, lambda g, theirs=theirs: theirs.tensor([1.0, 1.0]))
        expected = rf"expected None or a {ours.name}\.Tensor .* Received: {theirs.name}\.Tensor"
        with pytest.raises(unihook.HookReturnError, match=expected):
            ours.backward(unihook.ops.sum(x * 2))


# ---------------------------------------------------------------------------------------------
# tensor hooks on what a module with backward hooks hands out (paddle: a PyLayer's output, whose
# hooks' results paddle ignores natively)

MODULE_HOOKS = ("full", "pre", "global")


def _with_backward_hook(kit: Any, module: Any, kind: str, seen: list[Any]) -> Any:
    def full(m: Any, grad_input: Any, grad_output: Any) -> None:
        if m is module:
            seen.append(("grad_input", kit.numpy(grad_input[0])))
            seen.append(("grad_output", kit.numpy(grad_output[0])))

    def pre(m: Any, grad_output: Any) -> None:
        seen.append(("grad_output", kit.numpy(grad_output[0])))

    if kind == "full":
        return unihook.register_full_backward_hook(module, full)
    if kind == "pre":
        return unihook.register_full_backward_pre_hook(module, pre)
    return unihook.register_module_full_backward_hook(full, backend=kit.name)


@pytest.mark.parametrize("kind", MODULE_HOOKS)
def test_hook_on_a_hooked_modules_output_replaces_its_gradient(backend: Any, kind: str) -> None:
    module = backend.module(lambda self, x: x * 3)
    seen: list[Any] = []
    with _with_backward_hook(backend, module, kind, seen):
        x = backend.tensor([1.0, 2.0], requires_grad=True)
        y = module(x)
        unihook.register_tensor_hook(y, lambda g: g * 2)
        unihook.register_tensor_hook(y, lambda g: g + 1)  # (the chain: sees the first's result)
        backend.backward((y * backend.tensor([1.0, 10.0])).sum())
    np.testing.assert_allclose(backend.grad(x), [9.0, 63.0])
    np.testing.assert_allclose(dict(seen)["grad_output"], [3.0, 21.0])
    if kind != "pre":
        np.testing.assert_allclose(dict(seen)["grad_input"], [9.0, 63.0])


@pytest.mark.parametrize("kind", MODULE_HOOKS)
def test_hook_on_a_hooked_modules_input_inside_forward(backend: Any, kind: str) -> None:
    def forward(self: Any, x: Any) -> Any:
        unihook.register_tensor_hook(x, lambda g: g * 5)
        return x * 3

    module = backend.module(forward)
    seen: list[Any] = []
    with _with_backward_hook(backend, module, kind, seen):
        x = backend.tensor([1.0, 2.0], requires_grad=True)
        backend.backward((module(x * 1) * backend.tensor([1.0, 10.0])).sum())
    np.testing.assert_allclose(backend.grad(x), [15.0, 150.0])
    np.testing.assert_allclose(dict(seen)["grad_output"], [1.0, 10.0])
    if kind != "pre":
        np.testing.assert_allclose(dict(seen)["grad_input"], [15.0, 150.0])


@pytest.mark.parametrize("kind", MODULE_HOOKS)
def test_hook_result_of_a_pass_that_raised_is_not_used_by_the_next(backend: Any, kind: str) -> None:
    if not retains_graph(backend):
        pytest.skip(f"{backend.name} differentiates a graph once")

    class Boom(Exception):
        pass

    def boom(g: Any) -> Any:
        raise Boom

    module = backend.module(lambda self, x: x * 3)
    seen: list[Any] = []
    with _with_backward_hook(backend, module, kind, seen):
        x = backend.tensor([1.0, 2.0], requires_grad=True)
        y = module(x)
        loss = (y * backend.tensor([1.0, 10.0])).sum()
        doubling = unihook.register_tensor_hook(y, lambda g: g * 2)
        raising = unihook.register_tensor_hook(y, boom)
        with pytest.raises(Boom):
            backend.backward(loss, retain_graph=True)
        doubling.remove()
        raising.remove()
        backend.backward(loss)
    np.testing.assert_allclose(backend.grad(x), [3.0, 30.0])
    np.testing.assert_allclose(dict(seen)["grad_output"], [1.0, 10.0])
