"""In-place ops on a hooked module's inputs and on its returned inputs (issue 11, class 1).

Module backward hooks hand forward an alias of each input; whatever forward or the caller then
does in place must reach the caller's tensor as it would without hooks: the gradients with
hooks equal the gradients without, and what the framework rejects without hooks it rejects
with them. Each case runs with every kind of module backward hook.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pytest

import unihook

KINDS = ["full_backward", "full_backward_pre", "module_full_backward"]


def _hook(kind: str, module: Any, calls: list[str]) -> unihook.Handle:
    if kind == "full_backward":
        return unihook.register_full_backward_hook(module, lambda m, gi, go: calls.append(kind))
    if kind == "full_backward_pre":
        return unihook.register_full_backward_pre_hook(module, lambda m, go: calls.append(kind))
    return unihook.register_module_full_backward_hook(lambda m, gi, go: calls.append(kind))


def _grads(
    backend: Any, build: Callable[[Any], tuple[Any, Any]], kind: str | None
) -> tuple[np.ndarray, int]:
    """x.grad after `loss(x)` from `build(kit) -> (hooked module, loss)`, and the hook calls."""
    module, loss = build(backend)
    calls: list[str] = []
    handle = _hook(kind, module, calls) if kind else None
    try:
        x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
        backend.backward(unihook.ops.sum(loss(x)))
        return backend.grad(x), len(calls)
    finally:
        if handle is not None:
            handle.remove()


def _inplace_act_then_reuse(kit: Any) -> tuple[Any, Any]:
    # the repro: the block keeps using its input after an in-place submodule
    act = kit.relu_module(inplace=True)
    block = kit.module(lambda self, h: (self.act(h), h * 2)[1], {"act": act})
    return act, lambda x: block(x * 1)


def _forward_modifies_input(kit: Any) -> tuple[Any, Any]:
    m = kit.module(lambda self, h: kit.add_(h, 1.0) * 3)
    return m, lambda x: (lambda h: m(h) + h * 5)(x * 1)


def _returned_input_then_inplace_act(kit: Any) -> tuple[Any, Any]:
    # nn.Identity / eval Dropout, then an in-place ReLU on what it returned
    ident = kit.module(lambda self, h: h)
    relu = kit.relu_module(inplace=True)
    return ident, lambda x: relu(ident(x * 1)) * 3


def _inplace_act_returned_then_reused(kit: Any) -> tuple[Any, Any]:
    # an in-place activation returns its (changed) input; the caller reads the input again
    act = kit.relu_module(inplace=True)

    def loss(x: Any) -> Any:
        h = x * 1
        return act(h) * 2 + h * 3

    return act, loss


def _inplace_act_output_used(kit: Any) -> tuple[Any, Any]:
    # the torchvision pattern: Linear -> ReLU(inplace) with the ReLU hooked, output used
    act = kit.relu_module(inplace=True)
    return act, lambda x: act(x * 2) * 3


def _saved_before_returned(kit: Any) -> tuple[Any, Any]:
    # a tensor saved before the call stays valid when the module returns it unchanged
    ident = kit.module(lambda self, h: h)
    return ident, lambda x: (lambda h: h * h + ident(h) * 2)(x * 1)


CASES = {
    "inplace_act_then_reuse": _inplace_act_then_reuse,
    "forward_modifies_input": _forward_modifies_input,
    "returned_input_then_inplace_act": _returned_input_then_inplace_act,
    "inplace_act_returned_then_reused": _inplace_act_returned_then_reused,
    "inplace_act_output_used": _inplace_act_output_used,
    "saved_before_returned": _saved_before_returned,
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_without_hooks(backend: Any, case: str, kind: str) -> None:
    expected, _ = _grads(backend, CASES[case], None)
    got, calls = _grads(backend, CASES[case], kind)
    np.testing.assert_allclose(got, expected, rtol=0, atol=0)
    assert calls >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_leaf_modified_in_forward_raises_as_without_hooks(backend: Any, kind: str) -> None:
    act = backend.relu_module(inplace=True)
    x = backend.tensor([-1.0, 2.0], requires_grad=True)
    with pytest.raises(Exception) as native:  # torch: RuntimeError, paddle: ValueError
        act(x)
    handle = _hook(kind, act, [])
    try:
        with pytest.raises(native.type):
            act(backend.tensor([-1.0, 2.0], requires_grad=True))
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_saved_then_modified_raises_as_without_hooks(backend: Any, kind: str) -> None:
    """A tensor saved before forward modifies it in place: backward refuses, hooks or not."""
    act = backend.relu_module(inplace=True)

    def run() -> None:
        x = backend.tensor([-1.0, 2.0], requires_grad=True)
        h = x * 1
        saved = h * h
        out = act(h)
        backend.backward(unihook.ops.sum(saved + out))

    with pytest.raises(RuntimeError):
        run()
    handle = _hook(kind, act, [])
    try:
        with pytest.raises(RuntimeError):
            run()
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("returned", [False, True], ids=["computed", "returned_input"])
def test_output_the_module_saved_then_modified_raises_as_without_hooks(
    backend: Any, kind: str, returned: bool
) -> None:
    """A ReLU's backward needs its own output, which the caller then changes in place through
    what the hooked module returned (the ReLU's output, or a module returning its input, the
    ReLU's output, unchanged): backward refuses, hooks or not (issue 16, F1: on MindSpore an
    alias has a version counter of its own, and the gradient came from the changed values)."""
    act = backend.relu_module()
    module = backend.module(lambda self, h: h) if returned else act

    def run() -> None:
        x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
        out = module(act(x * 1)) if returned else act(x * 1)
        backend.add_(out, 1.0)
        backend.backward(unihook.ops.sum(out * 3))

    with pytest.raises(RuntimeError):
        run()
    handle = _hook(kind, module, [])
    try:
        with pytest.raises(RuntimeError):
            run()
    finally:
        handle.remove()


def test_hook_sees_the_inplace_modules_gradients(backend: Any) -> None:
    """grad_input / grad_output of an in-place ReLU equal those of an out-of-place one."""
    seen: dict[bool, Any] = {}
    for inplace in (False, True):
        act = backend.relu_module(inplace=inplace)
        got: list[Any] = []
        handle = unihook.register_full_backward_hook(
            act, lambda m, gi, go: got.append((backend.numpy(gi[0]), backend.numpy(go[0])))
        )
        x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
        backend.backward(unihook.ops.sum(act(x * 1) * 3))
        handle.remove()
        seen[inplace] = (got, backend.grad(x))
    ((gi0, go0),) = seen[False][0]
    ((gi1, go1),) = seen[True][0]
    np.testing.assert_array_equal(gi0, gi1)
    np.testing.assert_array_equal(go0, go1)
    np.testing.assert_array_equal(seen[False][1], seen[True][1])


def test_identity_hooks_see_only_their_output_gradient(backend: Any) -> None:
    """A module returning its input unchanged hands back an alias, as torch's BackwardHook:
    a later use of the input itself is not a use of the output (the residual's `x`)."""
    ident = backend.module(lambda self, h: h)
    seen: list[Any] = []
    handle = unihook.register_full_backward_hook(
        ident, lambda m, gi, go: seen.append(backend.numpy(go[0]))
    )
    x = backend.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1
    backend.backward(unihook.ops.sum(ident(h) * 2 + h * 3))
    handle.remove()
    np.testing.assert_array_equal(seen[0], [2.0, 2.0])
    np.testing.assert_array_equal(backend.grad(x), [5.0, 5.0])


LEAF_CASES: dict[str, Callable[[Any], tuple[Any, Any]]] = {
    # (the module whose hook is registered, a call of the model on the leaf)
    "identity": lambda kit: (lambda m: (m, m))(kit.module(lambda self, h: h)),
    "view": lambda kit: (lambda m: (m, m))(kit.module(lambda self, h: h[0:1])),
    "nested": lambda kit: (
        lambda inner: (inner, kit.module(lambda self, h: self.inner(h), {"inner": inner}))
    )(kit.module(lambda self, h: h)),
    "keyword": lambda kit: (lambda m: (m, lambda x: m(h=x)))(kit.module(lambda self, h: h)),
    "in_a_list": lambda kit: (lambda m: (m, lambda x: m([x])))(kit.module(lambda self, hs: hs[0])),
}


def _views_take_inplace_ops(kit: Any) -> bool:
    """Whether an in-place op on a view changes its base (MindSpore 2.10 on CPU: a kernel
    error or no change, docs/MINDSPORE.md)."""
    base = kit.tensor([1.0, 2.0]) * 1
    try:
        kit.add_(base[0:1], 1.0)
    except RuntimeError:
        return False
    return bool(kit.numpy(base)[0] == 2.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("when", ["before_use", "after_use"])
@pytest.mark.parametrize("case", list(LEAF_CASES))
def test_inplace_on_a_leaf_returned_unchanged_raises(
    backend: Any, kind: str, when: str, case: str
) -> None:
    """A module returns its input, a leaf that requires grad, unchanged (nn.Identity), or a
    view of it, also through an outer module: an in-place op on the output is one on the leaf,
    which the framework refuses without hooks (torch: on a view of it too; paddle allows that
    one). Through unihook's alias it would change the leaf's values silently: torch refuses it
    at once (its own RuntimeError, as for its BackwardHook's outputs), paddle in the backward
    through the alias (InPlaceError, a ValueError as paddle's); what the framework allows gives
    the same gradient with hooks."""

    if case == "view" and not _views_take_inplace_ops(backend):
        pytest.skip(f"{backend.name}: an in-place op on a view fails without hooks too")

    def run(hooks: bool) -> Any:
        hooked, model = LEAF_CASES[case](backend)
        handle = _hook(kind, hooked, []) if hooks else None
        try:
            x = backend.tensor([-1.0, 2.0], requires_grad=True)
            out = model(x)
            if when == "after_use":
                out = out * 1 + out  # the alias used before the in-place op
            backend.add_(out if when == "before_use" else model(x), 1.0)
            backend.backward(unihook.ops.sum(out * x))
            return backend.grad(x)
        except Exception as error:  # noqa: BLE001 - compared below
            return error
        finally:
            if handle is not None:
                handle.remove()

    native, got = run(False), run(True)
    if isinstance(native, Exception):
        assert isinstance(got, type(native)), got
        # (torch: "... modified inplace", MindSpore: "... is being inplace modified")
        assert isinstance(got, unihook.InPlaceError) or re.search(
            "modified inplace|inplace modified", str(got)
        ), got
    else:
        assert not isinstance(got, Exception), got
        np.testing.assert_array_equal(got, native)


@pytest.mark.parametrize("kind", KINDS)
def test_inplace_on_a_parameter_a_module_returns_raises(backend: Any, kind: str) -> None:
    """A module returning its own parameter (a leaf that requires grad): an in-place op on the
    output is refused as on the parameter without hooks, and the parameter keeps its values."""

    def run(hooks: bool) -> tuple[Any, Any]:
        weight = backend.parameter(np.array([1.0, 2.0], dtype=np.float32))
        model = backend.module(lambda self: self.weight)
        backend.register_parameter(model, "weight", weight)
        handle = _hook(kind, model, []) if hooks else None
        try:
            out = model()
            backend.add_(out, 100.0)
            backend.backward(unihook.ops.sum(out * 3))
            return None, backend.numpy(weight)
        except Exception as error:  # noqa: BLE001 - compared below
            return error, backend.numpy(weight)
        finally:
            if handle is not None:
                handle.remove()

    (native, kept), (got, values) = run(False), run(True)
    assert isinstance(native, Exception)
    assert isinstance(got, type(native)), got
    if not isinstance(got, unihook.InPlaceError):  # torch: refused at the op, before it ran
        np.testing.assert_array_equal(values, kept)


def test_empty_batch_then_inplace_after_the_hooked_module(backend: Any) -> None:
    """A hooked module on an empty (0-row) batch, an in-place op on its output: the gradients
    of the model without hooks (paddle's alias of an empty tensor kept its input for a version
    check, which the in-place op then failed)."""

    def run(hooks: bool) -> Any:
        linear = backend.linear(3, 2)
        handle = None
        if hooks:
            handle = unihook.register_full_backward_hook(linear, lambda m, gi, go: None)
        try:
            x = backend.tensor(np.zeros((0, 3)), requires_grad=True)
            out = linear(x * 1)
            backend.add_(out, 1.0)
            backend.backward(unihook.ops.sum(backend.relu(out) * 2))
            return backend.grad(x)
        finally:
            if handle is not None:
                handle.remove()

    np.testing.assert_array_equal(run(True), run(False))


def test_leaf_returned_unchanged_without_inplace_keeps_its_gradient(backend: Any) -> None:
    """The guard of a leaf returned unchanged passes its gradient on untouched."""
    ident = backend.module(lambda self, h: h)
    seen: list[Any] = []
    handle = unihook.register_full_backward_hook(
        ident, lambda m, gi, go: seen.append(backend.numpy(go[0]))
    )
    try:
        x = backend.tensor([1.0, 2.0], requires_grad=True)
        backend.backward(unihook.ops.sum(ident(x) * 2 + x * 3))
    finally:
        handle.remove()
    np.testing.assert_array_equal(seen[0], [2.0, 2.0])
    np.testing.assert_array_equal(backend.grad(x), [5.0, 5.0])


@pytest.mark.parametrize("kind", KINDS)
def test_later_inplace_on_a_returned_input_is_checked(backend: Any, kind: str) -> None:
    """The caller changes the tensor an in-place activation returned, after the activation
    saved it: backward refuses, hooks or not (the version counter stays shared); where the
    framework accepts it (MindSpore), the same gradient with hooks."""
    act = backend.relu_module(inplace=True)

    def run() -> Any:
        x = backend.tensor([-1.0, 2.0], requires_grad=True)
        h = x * 1
        out = act(h)
        backend.add_(h, 1.0)
        backend.backward(unihook.ops.sum(out * 1))
        return backend.grad(x)

    try:
        native = run()
    except Exception as error:  # noqa: BLE001 - compared below
        native = error
    if backend.name in ("torch", "paddle"):
        assert isinstance(native, Exception)  # both refuse it without hooks
    handle = _hook(kind, act, [])
    try:
        if isinstance(native, Exception):
            with pytest.raises(type(native), match="inplace|in-place"):
                run()
        else:  # MindSpore 2.10 checks no saved tensor here (docs/MINDSPORE.md): as it does
            np.testing.assert_array_equal(run(), native)
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["unsqueeze_", "squeeze_", "t_"])
@pytest.mark.parametrize("needs_grad", [True, False], ids=["grad", "no_grad_input"])
def test_shape_changed_in_place_in_forward(
    backend: Any, kind: str, op: str, needs_grad: bool
) -> None:
    """`x.squeeze_()` inside forward changes the caller's tensor's shape, hooks or not."""
    if op == "t_" and backend.name == "paddle":
        pytest.skip("paddle has no Tensor.t_")
    if not hasattr(backend.tensor([1.0]), op):  # MindSpore 2.10: none of them
        pytest.skip(f"{backend.name} has no Tensor.{op}")
    change = {
        "unsqueeze_": lambda t: t.unsqueeze_(0),
        "squeeze_": lambda t: t.squeeze_(),
        "t_": lambda t: t.t_(),
    }[op]
    m = backend.module(lambda self, a, w: (change(a), a * w)[1])

    def run(hooked: bool) -> tuple[tuple[int, ...], Any]:
        handle = _hook(kind, m, []) if hooked else None
        try:
            w = backend.tensor([[2.0, 3.0]], requires_grad=True)
            x = backend.tensor([[1.0, -2.0]], requires_grad=needs_grad)
            h = x * 1
            out = m(h, w)
            shape = tuple(h.shape)
            backend.backward(unihook.ops.sum(out) + unihook.ops.sum(h * h))
            return shape, backend.grad(w)
        finally:
            if handle is not None:
                handle.remove()

    (shape, grad), (hooked_shape, hooked_grad) = run(False), run(True)
    assert hooked_shape == shape
    np.testing.assert_array_equal(hooked_grad, grad)


def _two_args_grads(
    backend: Any, kind: str | None, call: Callable[[Any, Any], Any], read_again: bool
) -> Any:
    """x.grad of `call(m, h)` plus, if `read_again`, a use of `h` after the call, where
    `m(a, b)` runs an in-place ReLU on `a` and returns ``a * 2 + b`` (`b[0]` for a list); or
    the error raised."""
    act = backend.relu_module(inplace=True)
    m = backend.module(
        lambda self, a, b: (self.act(a), a * 2 + (b[0] if isinstance(b, list) else b))[1],
        {"act": act},
    )
    handle = _hook(kind, m, []) if kind else None
    try:
        x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
        h = x * 1
        loss = unihook.ops.sum(call(m, h))
        if read_again:
            loss = loss + unihook.ops.sum(h * 3)
        backend.backward(loss)
        return backend.grad(x)
    except Exception as error:  # noqa: BLE001 - compared by the tests
        return error
    finally:
        if handle is not None:
            handle.remove()


SHARED_ARGS: dict[str, Callable[[Any, Any], Any]] = {
    "same_tensor": lambda m, h: m(h, h),
    "same_tensor_by_keyword": lambda m, h: m(h, b=h),
    "same_tensor_in_a_list": lambda m, h: m(h, [h]),
    "tensor_and_view": lambda m, h: m(h[0:2], h[0:2] * 0 + h[1:3]),
    "overlapping_views": lambda m, h: m(h[0:2], h[1:3]),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(SHARED_ARGS))
def test_inplace_on_an_argument_sharing_memory_with_another_raises(
    backend: Any, kind: str, case: str
) -> None:
    """`m(x, x)` (or overlapping views) and forward changes one argument in place: each
    argument is an alias of its own under backward hooks (torch's own hook: a view, on which
    it refuses any in-place op), so the change would not reach the other's history, which
    forward reads after it: InPlaceError, a RuntimeError, where the gradient would be wrong.
    With pre-hooks alone forward gets the caller's tensors: exact, as without hooks."""
    if not case.startswith("same_tensor") and not _views_take_inplace_ops(backend):
        pytest.skip(f"{backend.name}: an in-place op on a view fails without hooks too")
    native = _two_args_grads(backend, None, SHARED_ARGS[case], read_again=True)
    assert not isinstance(native, Exception), native
    got = _two_args_grads(backend, kind, SHARED_ARGS[case], read_again=True)
    # (b a copy: no memory shared; pre-hooks alone: forward gets the caller's tensors, no
    # alias, as without hooks): the gradient without hooks
    if case == "tensor_and_view" or kind == "full_backward_pre":
        assert not isinstance(got, Exception), got
        np.testing.assert_array_equal(got, native)
        return
    assert isinstance(got, unihook.InPlaceError), got
    assert isinstance(got, RuntimeError)
    assert "share" in str(got) and "m(x, x.clone())" in str(got)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("in_a_list", [False, True], ids=["attribute", "in_a_list"])
def test_inplace_on_an_argument_the_module_holds_raises(
    backend: Any, kind: str, in_a_list: bool
) -> None:
    """The module holds the caller's tensor as an attribute (`m.ref = h`; paddle keeps it
    among its buffers) or in a list (`m.ref = [h]`) and forward changes its argument in place,
    then reads it: as for `m(x, x)`, the change would not reach the attribute's history under
    backward hooks (a wrong gradient): InPlaceError. Pre-hooks alone: exact."""

    def forward(self: Any, a: Any) -> Any:
        self.act(a)
        return a * 2 + (self.ref[0] if in_a_list else self.ref)

    def grads(hooked: bool) -> Any:
        act = backend.relu_module(inplace=True)
        m = backend.module(forward, {"act": act})
        handle = _hook(kind, m, []) if hooked else None
        try:
            x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
            h = x * 1
            m.ref = [h] if in_a_list else h
            backend.backward(unihook.ops.sum(m(h)))
            return backend.grad(x)
        except Exception as error:  # noqa: BLE001 - compared below
            return error
        finally:
            if handle is not None:
                handle.remove()

    native = grads(False)
    assert not isinstance(native, Exception), native
    got = grads(True)
    if kind == "full_backward_pre":
        assert not isinstance(got, Exception), got
        np.testing.assert_array_equal(got, native)
        return
    assert isinstance(got, unihook.InPlaceError), got
    assert "the module's attribute 'ref'" in str(got), got


def _same_or_refused(
    backend: Any,
    build: Callable[[Any], tuple[Any, Any]],
    kind: str,
    native: list[float],
    pre_exact: bool = False,
) -> None:
    """`build`'s x.grad is `native` without hooks; with hooks of `kind` the same, or
    `InPlaceError` naming the backend (torch's own hook raises at such a use; paddle and
    MindSpore cannot carry the in-place op). `pre_exact`: pre-hooks alone, which give forward
    no alias, give the same."""
    np.testing.assert_array_equal(_grads(backend, build, None)[0], native)
    try:
        got, _ = _grads(backend, build, kind)
    except unihook.InPlaceError as error:
        assert not (pre_exact and kind == "full_backward_pre"), error
        assert f"[backend {backend.name}]" in str(error) and "in place" in str(error), error
    else:
        np.testing.assert_array_equal(got, native)


@pytest.mark.parametrize("kind", KINDS)
def test_input_returned_unchanged_then_the_callers_inplace_op(backend: Any, kind: str) -> None:
    """An identity module (eval-mode Dropout), then an in-place op on the caller's tensor
    (an in-place ReLU), then the output read: without hooks the output is the caller's
    tensor, with the change (the ReLU's mask read). The caller holds its tensor through the
    backward (paddle's check cannot tell a change of a tensor gone by then: README)."""

    def build(kit: Any) -> tuple[Any, Any]:
        ident, act = kit.module(lambda self, h: h), kit.relu_module(inplace=True)
        held: list[Any] = []

        def loss(x: Any) -> Any:
            h = x * 1
            held.append(h)
            out = ident(h)
            act(h)
            return out * kit.tensor([1.0, 2.0, 3.0, 4.0])

        return ident, loss

    _same_or_refused(backend, build, kind, [0.0, 2.0, 0.0, 4.0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("in_a_list", [False, True], ids=["attribute", "in_a_list"])
@pytest.mark.parametrize("changed", ["callers", "kept"])
def test_input_the_module_kept_then_one_side_changed_in_place(
    backend: Any, kind: str, in_a_list: bool, changed: str
) -> None:
    """The module keeps the input forward got (`self.kept = h`, `[h]`); after the call one
    side is changed in place (the caller's tensor, or the kept one, by an in-place ReLU) and
    the other is read: without hooks they are one tensor, which has the change. The caller
    holds its tensor through the backward (MindSpore cannot tell a change of one gone by
    then: README)."""

    def forward(self: Any, h: Any) -> Any:
        self.kept = [h] if in_a_list else h
        return h * 2

    def build(kit: Any) -> tuple[Any, Any]:
        m, act = kit.module(forward), kit.relu_module(inplace=True)
        held: list[Any] = []

        def loss(x: Any) -> Any:
            h = x * 1
            held.append(h)
            out = m(h)
            kept = m.kept[0] if in_a_list else m.kept
            changed_one, read = (h, kept) if changed == "callers" else (kept, h)
            act(changed_one)
            return read * kit.tensor([1.0, 2.0, 3.0, 4.0]) + out

        return m, loss

    _same_or_refused(backend, build, kind, [2.0, 4.0, 2.0, 6.0], pre_exact=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("read_again", [False, True], ids=["once", "read_again"])
def test_inplace_on_one_of_disjoint_views(backend: Any, kind: str, read_again: bool) -> None:
    """Two views of one tensor that do not overlap (q and k of a split), forward changes one
    in place, the caller reads the whole tensor again: the gradients without hooks (the
    view's base kept the rest of its gradient; the untouched view was not rebased)."""
    if not _views_take_inplace_ops(backend):
        pytest.skip(f"{backend.name}: an in-place op on a view fails without hooks too")

    def call(m: Any, h: Any) -> Any:
        return m(h[0:2], h[2:4])

    native = _two_args_grads(backend, None, call, read_again)
    got = _two_args_grads(backend, kind, call, read_again)
    assert not isinstance(native, Exception), native
    assert not isinstance(got, Exception), got
    np.testing.assert_array_equal(got, native)


@pytest.mark.parametrize("kind", KINDS)
def test_view_argument_changed_in_place_keeps_its_base_gradient(backend: Any, kind: str) -> None:
    """A view of the caller's tensor, changed in place by forward: the rest of the base gets
    its gradient too (torch wraps the rebase of a view in a CopySlices, which dropped the
    base's whole gradient)."""
    if not _views_take_inplace_ops(backend):
        pytest.skip(f"{backend.name}: an in-place op on a view fails without hooks too")
    act = backend.relu_module(inplace=True)
    m = backend.module(lambda self, q: (self.act(q), q * 2)[1], {"act": act})

    def run(hooked: bool) -> Any:
        handle = _hook(kind, m, []) if hooked else None
        try:
            x = backend.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
            h = x * 1
            backend.backward(unihook.ops.sum(m(h[1:3])) + unihook.ops.sum(h * 3))
            return backend.grad(x)
        finally:
            if handle is not None:
                handle.remove()

    np.testing.assert_array_equal(run(True), run(False))
