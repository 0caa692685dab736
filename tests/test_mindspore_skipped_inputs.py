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
