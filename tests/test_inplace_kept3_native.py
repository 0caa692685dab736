"""torch: helper-47's attack on 0c83eb8 (kept input aliases, `_cpp_held`): a view output
kept outside the module (a probe view of a view holds its base, not it), a kept input of a
module whose output needs no grad, in a registered buffer, inside hooked containers, and a
submodule's output standing for the kept input.

Rule: the same program without unihook hooks gives the same x.grad, or unihook raises a clear
`InPlaceError`; never a silently different number. In every case below torch's own full
backward hook raises; unihook gave a silently different x.grad (all failed on 0c83eb8).
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


STASH: list[Any] = []


class ViewOut(torch.nn.Module):
    def __init__(self, how: str, tuple_: bool = False) -> None:
        super().__init__()
        self.how, self.tuple_ = how, tuple_

    def forward(self, x: Any) -> Any:
        y = x * 2
        y = {"view": lambda: y.view(2, 2), "slice": lambda: y[1:], "t": lambda: y[None].t()}[
            self.how
        ]()
        STASH.append(y)  # (a feature cache: a closure / global dict)
        return (x * 5, y) if self.tuple_ else y


@pytest.mark.parametrize("tuple_", [False, True], ids=["alone", "tuple_item"])
@pytest.mark.parametrize("how", ["view", "slice", "t"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_view_output_kept_outside_the_module(kind: str, how: str, tuple_: bool) -> None:
    """A view made in forward, kept in a global list and returned: the caller's in-place op
    on the output must reach the kept one. `_cpp_held` of a view is always 1 (a probe view's
    `_base` is the root base, not the view: no count added), so the Python holder is taken
    for a C++ one. Passed at 494e0ca; x.grad [6, 10, 14, 22] for [18, 30, 42, 66]."""

    def program(x: Any, kind: str | None) -> None:
        STASH.clear()
        m = ViewOut(how, tuple_)
        handle = _register(kind, m) if kind else None
        try:
            out = m(x)
            out = out[1] if tuple_ else out
            out.mul_(3)
            (STASH[0].reshape(-1) * W[-STASH[0].numel() :]).sum().backward()
        finally:
            STASH.clear()
            if handle is not None:
                handle.remove()

    _check(program, kind)


class Sub(torch.nn.Module):
    pass


class KeepsViewInSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Sub()

    def forward(self, x: Any) -> Any:
        y = (x * 2)[1:]
        self.sub.kept = y
        return y


@pytest.mark.parametrize("kind", KINDS)
def test_a_view_output_kept_by_a_submodule(kind: str) -> None:
    """Same through a submodule's attribute (`_keeps_memory_of` looks at the module's own
    attributes only). Passed at 494e0ca."""

    def program(x: Any, kind: str | None) -> None:
        m = KeepsViewInSubmodule()
        handle = _register(kind, m) if kind else None
        try:
            out = m(x)
            out.mul_(3)
            (m.sub.kept * W[1:]).sum().backward()
        finally:
            if handle is not None:
                handle.remove()

    _check(program, kind)


class Tap(torch.nn.Module):
    def __init__(self, ret: str) -> None:
        super().__init__()
        self.ret = ret

    def forward(self, h: Any) -> Any:
        self.inp = h
        return h.detach() * 2 if self.ret == "detached" else h.argmax()


@pytest.mark.parametrize("ret", ["detached", "argmax"])
@pytest.mark.parametrize("kind", ["full_backward", "module_full_backward"])
def test_a_kept_input_of_a_module_whose_output_needs_no_grad(kind: str, ret: str) -> None:
    """`self.inp = h; return h.argmax()`: `watch` (and `_watch_kept_inputs` in it) runs only
    for outputs that need grad, so the kept alias is not watched: the caller's `h.relu_()`
    then a loss on `m.inp` gives [6, 10, 14, 22] for [0, 10, 0, 22]."""

    def program(x: Any, kind: str | None) -> None:
        m = Tap(ret)
        handle = _register(kind, m) if kind else None
        try:
            h = x * 2
            m(h)
            h.relu_()
            (m.inp * W).sum().backward()
        finally:
            if handle is not None:
                handle.remove()

    _check(program, kind)


class KeepsInBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inp", torch.zeros(4))

    def forward(self, h: Any) -> Any:
        self.inp = h  # (the same line as the fixed case: nn.Module puts it in _buffers)
        return h * 3


@pytest.mark.parametrize("kind", ["full_backward", "module_full_backward"])
def test_a_kept_input_in_a_registered_buffer(kind: str) -> None:
    """`self.inp = h` where `inp` is a registered buffer: the alias goes to `_buffers`, not
    `__dict__`; not watched: [6, 10, 14, 22] for [0, 10, 0, 22]."""

    def program(x: Any, kind: str | None) -> None:
        m = KeepsInBuffer()
        handle = _register(kind, m) if kind else None
        try:
            h = x * 2
            m(h)
            h.relu_()
            (m.inp * W).sum().backward()
        finally:
            if handle is not None:
                handle.remove()

    _check(program, kind)


class KeepsInput(torch.nn.Module):
    def forward(self, h: Any) -> Any:
        self.inp = h
        return h * 3


class MyIdentity(torch.nn.Module):
    def forward(self, h: Any) -> Any:
        return h


class Outer(torch.nn.Module):
    def __init__(self, inner: Any, keep_inner_output: bool) -> None:
        super().__init__()
        self.inner, self.keep = inner, keep_inner_output

    def forward(self, h: Any) -> Any:
        if self.keep:
            self.kept = self.inner(h)
            return self.kept * 2
        return self.inner(h) + 1


@pytest.mark.parametrize("hooked", ["global", "both"])
def test_an_inner_module_keeps_its_input_inside_a_hooked_container(hooked: str) -> None:
    """Global hooks (or hooks on both modules): the inner module's kept alias stands for the
    outer call's alias, not for the caller's tensor, which is what the caller changes: no
    `InPlaceError`, x.grad [6, 10, 14, 22] for [0, 10, 0, 22]. A plain model in a container
    under `register_module_full_backward_hook` is enough."""

    def program(x: Any, kind: str | None) -> None:
        m = Outer(KeepsInput(), keep_inner_output=False)
        handles = []
        if kind == "module_full_backward":
            handles.append(_register(kind, m))
        elif kind:
            handles += [_register(kind, m), _register(kind, m.inner)]
        try:
            h = x * 2
            m(h)
            h.relu_()
            (m.inner.inp * W).sum().backward()
        finally:
            for handle in handles:
                handle.remove()

    _check(program, "module_full_backward" if hooked == "global" else "full_backward")


@pytest.mark.parametrize("inner", ["mine", "nn.Identity", "nn.Flatten"])
@pytest.mark.parametrize("hooked", ["global", "both"])
def test_an_outer_module_keeps_its_inner_modules_output_of_its_input(
    hooked: str, inner: str
) -> None:
    """`self.kept = self.inner(h)` (inner returns its input): the kept output's chain ends at
    the outer call's alias, unwatched, so the caller's `h.relu_()` is missed: [6, 10, 14, 22]
    for [0, 10, 0, 22]. (Hooks on one of the two: refused.)"""

    def program(x: Any, kind: str | None) -> None:
        i = {"mine": MyIdentity, "nn.Identity": torch.nn.Identity}.get(inner)
        m = Outer(i() if i else torch.nn.Flatten(0), keep_inner_output=True)
        handles = []
        if kind == "module_full_backward":
            handles.append(_register(kind, m))
        elif kind:
            handles += [_register(kind, m), _register(kind, m.inner)]
        try:
            h = x * 2
            m(h)
            h.relu_()
            (m.kept * W).sum().backward()
        finally:
            for handle in handles:
                handle.remove()

    _check(program, "module_full_backward" if hooked == "global" else "full_backward")


@pytest.mark.parametrize("kind", ["full_backward", "module_full_backward"])
def test_a_kept_input_that_forward_changed_in_place_is_not_refused(kind: str) -> None:
    """`self.inp = h; h.mul_(2); return h * 3`: the caller's tensor takes forward's in-place
    op when the call ends (its rebase); the kept alias was watched before that and read it as
    a change of the caller's: a false InPlaceError at its next use (review of 6bb727f)."""

    class KeepsAndChanges(torch.nn.Module):
        def forward(self, h: Any) -> Any:
            self.inp = h
            h.mul_(2)
            return h * 3

    def program(x: Any, kind: str | None) -> None:
        m = KeepsAndChanges()
        handle = _register(kind, m) if kind else None
        try:
            m(x * 1)
            (m.inp * W).sum().backward()
        finally:
            if handle is not None:
                handle.remove()

    expected = _grad(program, None)
    got = _grad(program, kind)
    assert not isinstance(got, str), got
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
