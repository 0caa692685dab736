"""torch: helper-46's attack on 494e0ca (kept outputs told by reference counts): a module
keeping the alias of its input (or a view of it) that the caller changes in place after the
call; outputs that autograd (not a Python name) holds, watched for nothing.

Rule: the same program without unihook hooks gives the same x.grad, or unihook raises a clear
`InPlaceError`; never a silently different number. An output nobody keeps comes back as a
plain `torch.Tensor` (a watched `InputAlias` costs ~6 us per op).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import unihook  # noqa: E402

pytestmark = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11), reason="reference counts measured on Python 3.11 only"
)

W = torch.tensor([3.0, 5.0, 7.0, 11.0])
KINDS = ["full_backward", "full_backward_pre", "module_full_backward"]


def _register(kind: str, module: Any) -> unihook.Handle:
    if kind == "full_backward":
        return unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    if kind == "full_backward_pre":
        return unihook.register_full_backward_pre_hook(module, lambda m, go: None)
    return unihook.register_module_full_backward_hook(lambda m, gi, go: None, backend="torch")


def _grad(program: Callable[[Any, str | None], None], kind: str | None) -> Any:
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
    try:
        program(x, kind)
    except unihook.InPlaceError:
        return "refused"
    return x.grad


def _check(program: Callable[[Any, str | None], None], kind: str) -> None:
    expected = _grad(program, None)
    got = _grad(program, kind)
    if isinstance(got, str):
        return
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class KeepsInput(torch.nn.Module):
    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view

    def forward(self, h: Any) -> Any:
        self.inp = h[1:] if self.view else h
        return h * 3


@pytest.mark.parametrize("view", [False], ids=["input"])  # (a view: README)
@pytest.mark.parametrize("kind", KINDS)
def test_a_kept_input_alias_read_after_the_caller_changes_the_input_in_place(
    kind: str, view: bool
) -> None:
    """`self.inp = h` in forward, then the caller's `h.relu_()` after the call, then a loss on
    `m.inp`: without hooks `m.inp` is `h` (x.grad [0, 10, 0, 22]); torch's own full backward
    hook raises (a view made in a custom Function whose base changed in place); unihook gives
    [6, 10, 14, 22] silently (the kept alias misses the relu's history; its values have it)."""

    def program(x: Any, kind: str | None) -> None:
        m = KeepsInput(view)
        handle = _register(kind, m) if kind else None
        try:
            h = x * 2
            m(h)
            h.relu_()
            (m.inp * W[: m.inp.numel()]).sum().backward()
        finally:
            if handle is not None:
                handle.remove()

    # (full_backward_pre with `input` passes: pre-hooks alone give forward the caller's tensor)
    _check(program, kind)


class HiddenAndLogits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        hidden = self.body(x).tanh()
        return self.head(hidden), hidden


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_saved_for_backward_by_a_later_op_is_not_watched(kind: str) -> None:
    """`return self.head(hidden), hidden`: `hidden` is saved by the head's Linear for its
    backward (a C++ reference, which torch turns into one on its Python object), so its count
    reads as kept: watched, though nothing keeps it (every op on it pays the watch). (The
    global hook passes: it hooks `head` too, whose Linear then saves head's input alias.)"""
    m = HiddenAndLogits()
    handle = _register(kind, m)
    try:
        logits, hidden = m(torch.randn(3, 4, requires_grad=True))
        assert type(logits) is torch.Tensor
        assert type(hidden) is torch.Tensor
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_an_lstm_output_is_not_watched(kind: str) -> None:
    """`nn.LSTM`'s output (a view whose base its backward node holds) comes back watched."""
    m = torch.nn.LSTM(4, 4, batch_first=True)
    handle = _register(kind, m)
    try:
        out, (h, c) = m(torch.randn(2, 3, 4, requires_grad=True))
        assert type(out) is torch.Tensor
    finally:
        handle.remove()


@pytest.mark.parametrize("keeps", [False, True], ids=["fresh", "kept"])
def test_a_sparse_output_beside_a_forward_hook_returning_it(keeps: bool) -> None:
    """A sparse output whose count reads high (a native forward hook returned it): the probe
    view `_cpp_held` takes of a tensor (and the storage read) do not exist for it: it raised
    NotImplementedError in forward (found in review of 0c83eb8); now left unwatched, as
    before the counts were read."""

    class Sparse(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = (x * 2).to_sparse()
            if keeps:
                self.k = y
            return y

    m = Sparse()
    m.register_forward_hook(lambda mod, i, o: o)
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    x = torch.ones(2, 3, requires_grad=True)
    try:
        m(x).to_dense().sum().backward()
    finally:
        handle.remove()
    assert torch.equal(x.grad, torch.full((2, 3), 2.0))
