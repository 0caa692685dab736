"""Paddle's `rebase` (a hooked layer's input changed in place in forward: the caller's tensor
takes the layer's history) and the kept-input checks built on it, off the common path:
strided inputs, dtype-changing in-place ops, double backward, a kept leaf, leaks. Oracle: the
same program without hooks. helper-53's attack on dd3e5ad; each test says where it failed."""

from __future__ import annotations

import gc
from typing import Any, Callable

import pytest

import unihook

paddle = pytest.importorskip("paddle")
F = paddle.nn.functional


class Keep(paddle.nn.Layer):
    def forward(self, h: Any) -> Any:
        self.kept = h
        return h * 2


class Relu(paddle.nn.Layer):
    def forward(self, h: Any) -> Any:
        F.relu_(h)
        return h * 2


def _run(program: Callable[[bool], Any], hooked: bool) -> Any:
    handles: list[Any] = []
    try:
        return program(hooked)
    except unihook.InPlaceError:
        return "InPlaceError"
    finally:
        for h in handles:
            h.remove()


def _hook(m: Any, hooked: bool) -> None:
    if hooked:
        unihook.register_full_backward_hook(m, lambda *a: None)


def _x() -> Any:
    return paddle.to_tensor(
        [[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0], [0.5, 1.5, -2.5]], stop_gradient=False
    )


VIEWS = {
    "transposed": lambda x: (x * 1.0).t(),
    "sliced_cols": lambda x: (x * 1.0)[:, 1:],
    "column": lambda x: (x * 1.0)[:, 1],
    "strided_rows": lambda x: (x * 1.0)[::2],
    "diagonal": lambda x: paddle.diagonal(x * 1.0),
    "transposed_leaf": lambda x: x.t(),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_kept_non_contiguous_input_without_any_inplace_op(view: str) -> None:
    # Failed on dd3e5ad (and 11f2c79), passes on 8e424c3: a module that keeps a non-contiguous
    # input (a transposed or sliced activation) and no in-place op anywhere: the hooked call
    # raises paddle's "ValueError: (InvalidArgument) Tensor is not contiguous, cannot call
    # share_buffer_to on it" from the kept check's rebase (`alias._share_buffer_to(fresh)`).
    def program(hooked: bool) -> Any:
        m = Keep()
        _hook(m, hooked)
        x = _x()
        h = VIEWS[view](x)
        out = m(h)
        (out.sum() + (m.kept * m.kept).sum() + (h * 3).sum()).backward()
        return x.grad.tolist()

    assert _run(program, True) == _run(program, False)


@pytest.mark.parametrize("view", ["transposed", "sliced_cols", "column"])
def test_forward_changes_a_non_contiguous_input_in_place(view: str) -> None:
    # Failed on dd3e5ad and on 8e424c3 (the pre-existing rebase path): a layer whose forward
    # does relu_ on a transposed / sliced input raises the same "not contiguous" ValueError
    # with a backward hook; without hooks x.grad is exact.
    def program(hooked: bool) -> Any:
        m = Relu()
        _hook(m, hooked)
        x = _x()
        h = VIEWS[view](x)
        out = m(h)
        (out.sum() + (h * 3).sum()).backward()
        return x.grad.tolist(), h.tolist()

    assert _run(program, True) == _run(program, False)


@pytest.mark.parametrize("layer", ["forward_relu_", "keeps_input"])
def test_double_backward_through_the_rebase(layer: str) -> None:
    # Failed on dd3e5ad, passes on 8e424c3: paddle.grad(create_graph=True) then a second
    # paddle.grad raises "RuntimeError: (Unavailable) The Op assign_out__grad doesn't have any
    # grad op" once the caller's tensor (or the kept alias) took the history of the new
    # `assign_out_` rebase: a layer whose forward does relu_ on its input, or (no in-place op
    # at all) a layer keeping its input. Native: g [0, 12, 0, 21] / [-1.5, 12, -10.5, 21].
    def program(hooked: bool) -> Any:
        m = Relu() if layer == "forward_relu_" else Keep()
        _hook(m, hooked)
        x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
        h = x * 1.5
        out = m(h)
        loss = out.sum() + ((m.kept if layer == "keeps_input" else h) ** 2).sum()
        (g,) = paddle.grad([loss], [x], create_graph=True)
        (g2,) = paddle.grad([(g * g).sum()], [x])
        return g.tolist(), g2.tolist()

    assert _run(program, True) == _run(program, False)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forward_inplace_op_that_promotes_the_inputs_dtype(dtype: str) -> None:
    # Failed on dd3e5ad and 8e424c3: a silent wrong gradient. `h.add_(float32 param)` on a
    # float16 input promotes h to float32 in place (paddle); with a backward hook the caller's
    # h stays float16 with its OLD values, so a later use of h gives w.grad [0, 1, 2] for
    # [0.5, 2, 4].
    class AddBias(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.b = self.create_parameter([3], dtype="float32")
            self.b.set_value(paddle.to_tensor([0.5, 1.0, 2.0]))

        def forward(self, h: Any) -> Any:
            h.add_(self.b)
            return h * 2

    def program(hooked: bool) -> Any:
        m = AddBias()
        _hook(m, hooked)
        x = paddle.to_tensor([0.0, 1.0, 2.0], stop_gradient=False)
        w = paddle.to_tensor([1.0, 1.0, 1.0], stop_gradient=False)
        h = (x * 1.0).astype(dtype)
        out = m(h)
        (out.astype("float32").sum() + (h.astype("float32") * w).sum()).backward()
        return str(h.dtype), w.grad.tolist(), x.grad.tolist()

    assert _run(program, True) == _run(program, False)


def test_forward_exp_on_an_int_input_gives_the_caller_float_bits() -> None:
    # Failed on dd3e5ad and 8e424c3: silent wrong values. paddle's exp_ on an int32 tensor
    # (one paddle lets require grad: `(x * 1.0).astype("int32")`) makes it float32 in place;
    # with a backward hook the caller's h stays int32 and holds the float32 bit patterns
    # ([1065353216, 1076754516, 1089237798] for [1.0, 2.718, 7.389]).
    class Exp(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            h.exp_()
            return h * 2

    def program(hooked: bool) -> Any:
        m = Exp()
        _hook(m, hooked)
        x = paddle.to_tensor([0.0, 1.0, 2.0], stop_gradient=False)
        h = (x * 1.0).astype("int32")
        m(h)
        return str(h.dtype), [round(v, 3) for v in h.astype("float32").tolist()]

    assert _run(program, True) == _run(program, False)


def test_an_inplace_op_on_the_kept_alias_of_a_leaf_is_refused_as_without_hooks() -> None:
    # Failed on dd3e5ad and 8e424c3: README "What the framework rejects without hooks it
    # rejects with them (an in-place op on a leaf that requires grad)". The module keeps its
    # input, the caller passed a leaf; relu_ on the kept tensor: paddle raises its "Leaf Var
    # ... can't use inplace strategy" ValueError; with hooks the kept alias (a view of the
    # leaf) takes the op silently (paddle itself writes the values, then raises).
    def program(hooked: bool) -> Any:
        m = Keep()
        _hook(m, hooked)
        x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
        out = m(x)
        try:
            F.relu_(m.kept)
            (m.kept * 2 + out).sum().backward()
        except unihook.InPlaceError:
            return "InPlaceError"
        except ValueError:
            return "ValueError"
        return "accepted"

    assert _run(program, False) == "ValueError"
    assert _run(program, True) == "InPlaceError"


def test_a_module_keeping_its_input_does_not_leak_per_call() -> None:
    # Failed on dd3e5ad, passes on 8e424c3: two Python lists (['place']) leak per call of a
    # module that keeps its input, backward or not: the kept check's rebase makes
    # `paddle.Tensor()` twice per call, and paddle 3.3.1's Tensor() leaks such a list (a
    # reference only C++ holds). Unbounded over a training run (~130 bytes a call).
    m = Keep()
    unihook.register_full_backward_hook(m, lambda *a: None)
    x = paddle.randn([4, 4])
    x.stop_gradient = False

    def steps(n: int) -> None:
        for _ in range(n):
            h = x * 1
            (m(h).sum() + m.kept.sum()).backward()

    steps(20)
    gc.collect()
    before = sum(type(o) is list for o in gc.get_objects())
    steps(300)
    gc.collect()
    assert sum(type(o) is list for o in gc.get_objects()) - before < 50
