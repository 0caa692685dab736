"""MindSpore's backward runs only the nodes from which it reaches what it differentiates: the
input side of a hooked call whose inputs lead to none of it never runs (`grad(fn, None,
weights)`, the training idiom, on data or on a tensor computed from data only; Parameters the
pass does not differentiate). The full hooks then fire once the pass is over with
``grad_input`` None, as torch's for inputs that need no grad (their output side). Until
2026-12-06 they fired only where the inputs were the differentiated function's arguments
themselves; a reshape, a normalisation or a frozen layer before the cell lost the call
(docs/MINDSPORE.md §11 item 2 (a)). Oracle: torch's native hooks, the data not requiring grad,
a frozen layer's Parameters neither, and ``torch.autograd.grad`` with respect to what
MindSpore differentiates. Runs in `make test`'s MindSpore venv (it has torch)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import unihook  # noqa: E402

W = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
F = np.arange(16, dtype=np.float32).reshape(4, 4) / 16 - 0.5
X = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(2, 2, 2)


def _dense(framework: str, w: Any) -> Any:
    if framework == "torch":
        layer = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(w))
            layer.bias.zero_()
        return layer
    layer = ms.nn.Dense(w.shape[1], w.shape[0])
    layer.weight.set_data(ms.Tensor(w))
    layer.bias.set_data(ms.Tensor(np.zeros(w.shape[0], np.float32)))
    return layer


def _sums(grads: Any) -> list[float | None]:
    out: list[float | None] = []
    for g in grads:
        if g is None:
            out.append(None)
        else:
            array = g.detach().numpy() if isinstance(g, torch.Tensor) else g.asnumpy()
            out.append(round(float(np.abs(array).sum()), 4))
    return out


# before the hooked Dense: (the op on the input, a Dense first: frozen (its Parameters
# require no grad) or trainable (they do, and the pass does not differentiate them))
_INPUTS = {
    "argument": (lambda x: x.reshape(2, 4), None),
    "reshape": (lambda x: x.reshape(2, 4), None),
    "normalised": (lambda x: x.reshape(2, 4) / 255.0 - 0.5, None),
    "frozen_layer": (lambda x: x.reshape(2, 4), "frozen"),
    "trainable_layer": (lambda x: x.reshape(2, 4), "trainable"),
}


def _run(framework: str, case: str, wrt: str) -> tuple[list[Any], list[float]]:
    """Full hook calls on the hooked Dense (grad_input sums), and what is differentiated."""
    before, first = _INPUTS[case]
    d, f = _dense(framework, W), _dense(framework, F)
    log: list[Any] = []

    def hook(m: Any, gi: Any, go: Any) -> None:
        log.append(_sums(gi))

    def forward(x: Any) -> Any:
        h = x if case == "argument" else before(x)
        if first:
            h = f(h)
        return (d(h) ** 2).sum()

    x0 = X.reshape(2, 4) if case == "argument" else X
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if framework == "torch":
            d.register_full_backward_hook(hook)
            for p in f.parameters():
                p.requires_grad_(first != "frozen")
            x = torch.tensor(x0, requires_grad=wrt == "input")
            chosen = [x] if wrt == "input" else list(d.parameters())
            grads = torch.autograd.grad(forward(x), chosen)
        else:
            unihook.register_full_backward_hook(d, hook)
            for p in f.trainable_params():
                p.requires_grad = first != "frozen"
            if wrt == "input":
                grads = (ms.grad(forward, 0)(ms.Tensor(x0)),)
            else:
                grads = ms.grad(forward, None, d.trainable_params())(ms.Tensor(x0))
    return log, _sums(grads)


@pytest.mark.parametrize("wrt", ["weights", "input"])
@pytest.mark.parametrize("case", sorted(_INPUTS))
def test_a_call_whose_inputs_need_no_grad_gets_torchs_full_hook_call(case: str, wrt: str) -> None:
    expected, got = _run("torch", case, wrt), _run("mindspore", case, wrt)
    assert got[0] == expected[0]
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-4)
    if wrt == "input":
        assert expected[0] == [[expected[0][0][0]]] and expected[0][0][0] is not None
    else:
        assert expected[0] == ([] if case == "trainable_layer" else [[None]])


def test_a_cell_whose_output_does_not_read_its_input_gets_no_full_hook_call() -> None:
    """torch fires no full hook where the outputs do not depend on an input that requires
    grad (the input side is never reached), and fires it with None where no input needs
    grad: MindSpore's backend tells the two apart by what the pass differentiates. (Its input
    side, which nothing reads, is gone by the backward: for an argument of the
    differentiated function it knows the leaf; for a tensor computed from one, `x * 2`, it
    does not, and fires nothing, docs/MINDSPORE.md §11 item 2 (a).)"""
    calls = {}
    for framework in ("torch", "mindspore"):
        for wrt in ("input", "weights"):
            log: list[Any] = []
            if framework == "torch":

                class TorchConst(torch.nn.Module):
                    def __init__(self) -> None:
                        super().__init__()
                        self.w = torch.nn.Parameter(torch.ones(2))

                    def forward(self, h: Any) -> Any:
                        return self.w * 3.0

                cell: Any = TorchConst()
                cell.register_full_backward_hook(lambda m, gi, go: log.append(_sums(gi)))
                x = torch.ones(2, requires_grad=wrt == "input")
                y = cell(x) + x
                chosen = [x] if wrt == "input" else [cell.w]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.autograd.grad(y.sum(), chosen)
            else:

                class Const(ms.nn.Cell):
                    def __init__(self) -> None:
                        super().__init__()
                        self.w = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")

                    def construct(self, h: Any) -> Any:
                        return self.w * 3.0

                cell = Const()
                unihook.register_full_backward_hook(cell, lambda m, gi, go: log.append(_sums(gi)))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if wrt == "input":
                        ms.grad(lambda x: (cell(x) + x).sum(), 0, [cell.w])(
                            ms.Tensor(np.ones(2, np.float32))
                        )
                    else:
                        ms.grad(lambda x: (cell(x) + x).sum(), None, [cell.w])(
                            ms.Tensor(np.ones(2, np.float32))
                        )
            calls[framework, wrt] = log
    assert calls["mindspore", "input"] == calls["torch", "input"] == []
    assert calls["mindspore", "weights"] == calls["torch", "weights"] == [[None]]


def _output_case(framework: str, case: str, wrt: str) -> tuple[list[Any], list[float | None]]:
    """Pre and full hook calls ((cell, kind, grad sums)) of a cell whose output, or one of
    whose outputs, needs no grad in torch's terms, and the gradients."""
    d = _dense(framework, F)
    log: list[Any] = []
    names = {id(d): "d"}

    def pre(m: Any, go: Any) -> None:
        log.append((names.get(id(m), "?"), "pre", _sums(go)))

    def full(m: Any, gi: Any, go: Any) -> None:
        log.append((names.get(id(m), "?"), "full", _sums(gi), _sums(go)))

    torch_side = framework == "torch"
    tanh = torch.tanh if torch_side else ms.ops.tanh
    if case == "tuple_output":
        base = torch.nn.Module if torch_side else ms.nn.Cell

        class Pair(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.d = d

            def forward(self, a: Any) -> Any:
                return self.d(a), tanh(a)

            construct = forward

        cell: Any = Pair()
        names[id(cell)] = "pair"

        def forward(x: Any, y: Any) -> Any:
            a, b = cell(x)
            return ((a + b) ** 2).sum() + y.sum()

    elif case == "frozen_in_container":
        # a frozen Dense on the data, times a function of the differentiated `y`, in a hooked
        # container: MindSpore's pass runs the Dense's output side (helper-171's seed 342)
        base = torch.nn.Module if torch_side else ms.nn.Cell
        for p in d.parameters() if torch_side else d.get_parameters():
            if torch_side:
                p.requires_grad_(False)
            else:
                p.requires_grad = False

        class Gate(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.d = d

            def forward(self, h: Any, g: Any) -> Any:
                return self.d(h) * tanh(g)

            construct = forward

        cell = Gate()
        names[id(cell)] = "gate"

        def forward(x: Any, y: Any) -> Any:
            return (cell(x.reshape(2, 4), y) ** 2).sum()

    else:  # a Dense on the data only: its output leads to Parameters only
        cell = d

        def forward(x: Any, y: Any) -> Any:
            return (cell(x) ** 2).sum() + (y**2).sum()

    x0, y0 = X.reshape(2, 4), np.linspace(0.5, 1.5, 8, dtype=np.float32).reshape(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if torch_side:
            handles = [
                torch.nn.modules.module.register_module_full_backward_pre_hook(pre),
                torch.nn.modules.module.register_module_full_backward_hook(full),
            ]
            if case == "frozen_in_container":
                handles.append(cell.register_full_backward_hook(full))
            try:
                x = torch.tensor(x0, requires_grad=wrt == "input")
                y = torch.tensor(y0, requires_grad=True)
                chosen = [x, y] if wrt == "input" else [y, *cell.parameters()]
                if case == "weights_not_asked":
                    chosen = [y]
                chosen = [t for t in chosen if t.requires_grad]
                grads = torch.autograd.grad(forward(x, y), chosen)
            finally:
                for handle in handles:
                    handle.remove()
        else:
            handles = [
                unihook.register_module_full_backward_pre_hook(pre),
                unihook.register_module_full_backward_hook(full),
            ]
            if case == "frozen_in_container":
                handles.append(unihook.register_full_backward_hook(cell, full))
            try:
                weights = None if wrt == "input" else cell.trainable_params() or None
                position = (0, 1) if wrt == "input" else 1
                if case == "weights_not_asked":
                    weights, position = None, 1
                got = ms.grad(forward, position, weights)(ms.Tensor(x0), ms.Tensor(y0))
                grads = _flat(got)
            finally:
                for handle in handles:
                    handle.remove()
    return log, _sums(grads)


def _flat(grads: Any) -> list[Any]:
    out: list[Any] = []
    for g in grads if isinstance(grads, tuple) else (grads,):
        out.extend(_flat(g) if isinstance(g, tuple) else [g])
    return out


@pytest.mark.parametrize("wrt", ["weights", "input"])
@pytest.mark.parametrize("case", ["tuple_output", "frozen_in_container", "weights_not_asked"])
def test_an_output_that_needs_no_grad_gets_none_or_no_call_as_in_torch(case: str, wrt: str) -> None:
    """`(d(a), tanh(a))` on data: torch's hooks get None for `tanh(a)`, which needs no grad,
    where MindSpore computes its gradient (the pass runs the output side for `d(a)`); a
    frozen Dense on data times `tanh(y)`, `y` differentiated: torch makes no call on the
    Dense, whose output needs no grad, where MindSpore's pass runs its output side; a Dense
    on the data, its Parameters not asked for: torch's engine does not run its node
    (helper-171's FINDINGS 2 and 3, helper-170's seed 275: until 2026-12-06 the values, and
    the calls)."""
    expected, got = _output_case("torch", case, wrt), _output_case("mindspore", case, wrt)
    assert _shape(got) == _shape(expected)
    np.testing.assert_allclose(_values(got), _values(expected), rtol=1e-4)
    if wrt == "weights" and case == "tuple_output":
        assert [call[-1][1] for call in expected[0] if call[0] == "pair"] == [None, None]
    if wrt == "weights" and case == "frozen_in_container":
        assert [call for call in expected[0] if call[0] == "d"] == []
    if wrt == "weights" and case == "weights_not_asked":
        assert expected[0] == []


def _shape(item: Any) -> Any:
    """`item` with its numbers left out (None stays None)."""
    if isinstance(item, (list, tuple)):
        return [_shape(x) for x in item]
    return "n" if isinstance(item, float) else item


def _values(item: Any) -> list[float]:
    if isinstance(item, (list, tuple)):
        return [v for x in item for v in _values(x)]
    return [item] if isinstance(item, float) else []


@pytest.mark.parametrize("b_computed", [False, True])
@pytest.mark.parametrize("position", [0, (0, 1)])
def test_an_argument_grad_does_not_differentiate_gets_zeros_in_grad_input(
    position: Any, b_computed: bool
) -> None:
    """`grad(f, 0)` of `c(a, b) = a * b`: `b` (or a tensor computed from it only) needs no
    grad in torch's terms, whose hook gets zeros for it (until 2026-12-06: its real
    gradient, docs/MINDSPORE.md §11 item 3); differentiated, its gradient."""
    calls: dict[str, list[Any]] = {}
    for framework in ("torch", "mindspore"):
        log: list[Any] = calls.setdefault(framework, [])
        if framework == "torch":

            class TorchProduct(torch.nn.Module):
                def forward(self, a: Any, b: Any) -> Any:
                    return a * b

            cell: Any = TorchProduct()
            cell.register_full_backward_hook(lambda m, gi, go: log.append(_sums(gi)))
            a = torch.tensor([2.0, 1.0], requires_grad=True)
            b = torch.tensor([3.0, -1.0], requires_grad=position != 0)
            b_in = b * 1.0 if b_computed else b
            chosen = [a] if position == 0 else [a, b]
            log.append(_sums(torch.autograd.grad(cell(a, b_in).sum(), chosen)))
        else:

            class Product(ms.nn.Cell):
                def construct(self, a: Any, b: Any) -> Any:
                    return a * b

            cell = Product()
            unihook.register_full_backward_hook(cell, lambda m, gi, go: log.append(_sums(gi)))

            def forward(a: Any, b: Any) -> Any:
                return cell(a, b * 1.0 if b_computed else b).sum()

            got = ms.grad(forward, position)(
                ms.Tensor(np.array([2.0, 1.0], np.float32)),
                ms.Tensor(np.array([3.0, -1.0], np.float32)),
            )
            log.append(_sums(got if isinstance(got, tuple) else (got,)))
    assert calls["mindspore"] == calls["torch"]
    assert calls["torch"][0][1] == (0.0 if position == 0 else 3.0)
