"""A hooked cell given a view of a tensor (a reshape, a slice, a transpose of the
differentiated function's argument): MindSpore's `_Function` marking a view dirty cuts the
gradient to its base (measured: zeros, 2.10), so the backend never rebases a view.

Until 2026-12-06 a hooked cell keeping its input (`self.kept = a`), or a hooked container
whose child was hooked too (the child's watch took the container's alias for kept), put a
check on the caller's view by rebasing it: `grad(fn, 0)` gave zeros and no hook fired
(helper-171's FINDING 1). A forward changing a view argument in place gave the caller's view
the op's history the same way: zeros, where MindSpore raises (a view of a leaf) or computes
its own gradient. Oracle: torch's native hooks on the same weights. Runs in `make test`'s
MindSpore venv (it has torch)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import unihook  # noqa: E402
from unihook import _kept_inputs  # noqa: E402
from unihook.errors import InPlaceError  # noqa: E402

W = np.arange(16, dtype=np.float32).reshape(4, 4) / 16 - 0.4
X = np.linspace(-1.0, 1.0, 16, dtype=np.float32)

# the view the container gets, of the argument x (16 values)
_VIEWS: dict[str, Callable[[Any], Any]] = {
    "reshape": lambda x: x.reshape(4, 4),
    "slice": lambda x: x.reshape(4, 4)[0:2],
    "reshape_chain": lambda x: x.reshape(2, 8).reshape(4, 4),
    "transpose": lambda x: x.reshape(4, 4).T,
    # (named `SelectView` and `Unstack` by MindSpore: missed until helper-172's FINDINGS 1, 2)
    "select": lambda x: x.reshape(1, 4, 4)[0],
    "select_last_axis": lambda x: x.reshape(4, 4, 1)[:, :, 0],
    "unsqueeze_select": lambda x: x.reshape(4, 4).unsqueeze(0)[0],
    "unbind": lambda x: x.reshape(1, 4, 4).unbind(0)[0],
}


def _model(framework: str, keeps: bool) -> Any:
    if framework == "torch":

        class TorchTwo(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.d = torch.nn.Linear(4, 4)
                with torch.no_grad():
                    self.d.weight.copy_(torch.tensor(W))
                    self.d.bias.fill_(0.1)

            def forward(self, a: Any) -> Any:
                if keeps:
                    self.kept = a
                return self.d(a)

        return TorchTwo()

    class Two(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.d = ms.nn.Dense(4, 4)
            self.d.weight.set_data(ms.Tensor(W))
            self.d.bias.set_data(ms.Tensor(np.full(4, 0.1, np.float32)))

        def construct(self, a: Any) -> Any:
            if keeps:
                self.kept = a
            return self.d(a)

    return Two()


def _sum(g: Any) -> float | None:
    if g is None:
        return None
    array = g.detach().numpy() if isinstance(g, torch.Tensor) else g.asnumpy()
    return round(float(array.sum()), 4)


def _run(framework: str, view: str, hooks: str, wrt: str) -> tuple[list[Any], list[Any]]:
    """The full hook calls (module, grad_input sums) and the gradients' sums."""
    c = _model(framework, keeps=hooks.startswith("kept"))
    log: list[Any] = []

    def hook(m: Any, gi: Any, go: Any) -> None:
        log.append(("outer" if m is c else "inner", [_sum(g) for g in gi]))

    def forward(x: Any) -> Any:
        return (c(_VIEWS[view](x)) ** 2).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if framework == "torch":
            register: Any = lambda m, h: m.register_full_backward_hook(h)  # noqa: E731
            register_all: Any = torch.nn.modules.module.register_module_full_backward_hook
        else:
            register = unihook.register_full_backward_hook
            register_all = unihook.register_module_full_backward_hook
        handles = []
        if hooks == "global":
            handles.append(register_all(hook))
        else:
            handles.append(register(c, hook))
            if hooks != "kept":
                handles.append(register(c.d, hook))
        try:
            if framework == "torch":
                x = torch.tensor(X, requires_grad=wrt == "input")
                chosen = [x] if wrt == "input" else list(c.parameters())
                grads = torch.autograd.grad(forward(x), chosen)
            elif wrt == "input":
                grads = (ms.grad(forward, 0)(ms.Tensor(X)),)
            else:
                grads = ms.grad(forward, None, c.trainable_params())(ms.Tensor(X))
        finally:
            for handle in handles:
                handle.remove()
    return log, [_sum(g) for g in grads]


@pytest.mark.parametrize("wrt", ["input", "weights"])
@pytest.mark.parametrize("hooks", ["nested", "global", "kept", "kept_nested"])
@pytest.mark.parametrize("view", sorted(_VIEWS))
def test_hooked_cells_given_a_view_of_the_argument_keep_torchs_gradient_and_calls(
    view: str, hooks: str, wrt: str
) -> None:
    expected, got = _run("torch", view, hooks, wrt), _run("mindspore", view, hooks, wrt)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-4, atol=1e-5)
    assert expected[1][0] != 0.0
    assert got[0] == expected[0]
    assert len(got[0]) == (1 if hooks == "kept" else 2)


def _changes_its_input(returns_it: bool) -> Any:
    class Doubles(ms.nn.Cell):
        def construct(self, a: Any) -> Any:
            a.copy_(a * 2)
            return a if returns_it else a * 3

    return Doubles()


@pytest.mark.parametrize("returns_it", [False, True], ids=["output", "returned"])
@pytest.mark.parametrize("base", ["argument", "computed"])
def test_forward_changing_a_view_argument_in_place_raises(
    user_process: None, base: str, returns_it: bool
) -> None:
    """A view of a leaf that requires grad: MindSpore raises without hooks too. A view of a
    computed tensor: MindSpore computes a gradient that is not the math's (measured: [30] * 8
    where torch gives 10 + 288 x), and the caller's view cannot take the op's history: the
    call refuses it, naming the cell, instead of a gradient of zeros."""
    cell = _changes_its_input(returns_it)

    def forward(x: Any, copy: bool = False) -> Any:
        h = (x if base == "argument" else x * 2.0).reshape(4, 4)
        return (cell(h.copy() if copy else h) ** 2).sum() + (h * 5).sum()

    x = ms.Tensor(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if base == "argument":
            with pytest.raises(RuntimeError, match="view of leaf"):
                ms.grad(forward, 0)(x)
        handle = unihook.register_full_backward_hook(cell, lambda m, gi, go: None)
        try:
            with pytest.raises(InPlaceError, match="Doubles.*caller's tensor is a view"):
                ms.grad(forward, 0)(x)
        finally:
            handle.remove()
        # the cell given a copy: MindSpore's gradient without hooks
        expected = ms.grad(lambda x: forward(x, copy=True), 0)(x).asnumpy()
        handle = unihook.register_full_backward_hook(cell, lambda m, gi, go: None)
        try:
            got = ms.grad(lambda x: forward(x, copy=True), 0)(x).asnumpy()
        finally:
            handle.remove()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("keeps", [False, True])
def test_an_inner_hooked_call_does_not_make_the_outer_call_keep_its_input(keeps: bool) -> None:
    """The inner call's watch holds a weak reference to the outer call's alias: it is the
    backend's own, not the cell keeping it. (Taken for a keep, each call put two checks on
    the graph; on a view, a gradient of zeros.)"""
    c = _model("mindspore", keeps=keeps)
    seen: list[int] = []

    def forward(x: Any) -> Any:
        h = x.reshape(4, 4) * 2.0
        out = c(h)
        seen.append(len(_kept_inputs._kept_for))  # (an entry lives as long as `h`)
        return (out**2).sum()

    handles = [
        unihook.register_full_backward_hook(c, lambda m, gi, go: None),
        unihook.register_full_backward_hook(c.d, lambda m, gi, go: None),
    ]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ms.grad(forward, 0)(ms.Tensor(X))
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [1 if keeps else 0]
