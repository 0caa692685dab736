"""torch: helper-45's attack on f54d53b (a tensor made in the call and kept, watched by its
reference count): a kept tuple, a post-dispatcher beside unihook's wrapper, another view of
the base kept, a forward hook returning its output (no watch), the module held after an
in-place op (as torch's own hook holds it).

Each test runs the same program without and with a unihook backward hook; the rule is the
same gradient (or a clear `unihook.InPlaceError`), never a silently different number. All but
the last failed on f54d53b.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import unihook  # noqa: E402

# (the reference counts `unihook_torch._alias` reads are Python 3.11's: README)
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
        return "refused"  # (allowed by the rule)
    return x.grad


def _check(program: Callable[[Any, str | None], None], kind: str) -> None:
    expected = _grad(program, None)
    got = _grad(program, kind)
    if isinstance(got, str):
        return
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_module_keeps_the_tuple_it_returns(kind: str) -> None:
    """`self.out = (x * 2, x * 3); return self.out`: the tuple is kept, its items' counts are
    those of a free tuple item (5). Expected x.grad [0, 10, 0, 22], got [6, 10, 14, 22]."""

    class KeepsTuple(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            self.out = (x * 2, x * 3)
            return self.out

    def program(x: Any, kind: str | None) -> None:
        m = KeepsTuple()
        h = _register(kind, m) if kind else None
        try:
            out = m(x * 1)
            out[0].relu_()
            (m.out[0] * W).sum().backward()
        finally:
            if h is not None:
                h.remove()

    _check(program, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_native_forward_hook_stashes_a_tuple_output(kind: str) -> None:
    """README says a native forward hook's list is seen; not when forward returns a tuple
    (`stash.append(output)` holds the tuple). Expected [0, 10, 0, 22], got [6, 10, 14, 22]."""

    class Two(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return x * 2, x * 3

    def program(x: Any, kind: str | None) -> None:
        m = Two()
        stash: list[Any] = []
        h = _register(kind, m) if kind else None
        m.register_forward_hook(lambda mod, i, o: stash.append(o))
        try:
            out = m(x * 1)
            out[0].relu_()
            (stash[0][0] * W).sum().backward()
        finally:
            if h is not None:
                h.remove()

    _check(program, kind)


@pytest.mark.parametrize("holder", ["closure", "submodule"])
def test_global_hook_beside_a_native_forward_pre_hook(holder: str) -> None:
    """The global hook and any native forward pre-hook on the module (also a global torch
    forward pre-hook, weight_norm's, PEFT's...): the post-dispatcher runs through
    `post_dispatch_beside`, `_counted()` is False, only the module's own attributes are
    looked in. A usual path, not the documented torch.compile / removed-hook ones.
    Expected [0, 10, 0, 22], got [6, 10, 14, 22]. (A leaf's `.grad` holding the output, a C++
    reference like autograd's saving it, is not told: README.)"""
    box: list[Any] = []

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sub = torch.nn.Module()

        def forward(self, x: Any) -> Any:
            y = x * 2
            if holder == "closure":
                box[:] = [y]
            else:
                self.sub.kept = y
            return y

    def read(m: Any) -> Any:
        return box[0] if holder == "closure" else m.sub.kept

    def program(x: Any, kind: str | None) -> None:
        m = M()
        m.register_forward_pre_hook(lambda mod, args: None)
        h = _register(kind, m) if kind else None
        try:
            out = m(x * 1)
            out.relu_()
            (read(m) * W).sum().backward()
        finally:
            if h is not None:
                h.remove()

    _check(program, "module_full_backward")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["overlapping_slices", "view_of_a_view"])
def test_the_module_keeps_a_view_and_returns_another_view_of_its_base(
    kind: str, shape: str
) -> None:
    """`self.kept = y[1:]; return y[:3]` (or `v = y.view(2, 2); self.kept = v; return v[0]`):
    the base `y` has its free count (3: a view holds its base's Python object once, however
    many views there are), the kept view is not looked for. Expected [0, 10, 0, 22], got
    [0, 10, 14, 22] (overlapping slices)."""

    class M(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = x * 2
            if shape == "overlapping_slices":
                self.kept = y[1:]
                return y[:3]
            v = y.view(2, 2)
            self.kept = v
            return v[1]

    def program(x: Any, kind: str | None) -> None:
        m = M()
        h = _register(kind, m) if kind else None
        try:
            out = m(x * 1)
            out.relu_()
            (m.kept * W[-m.kept.numel() :].reshape(m.kept.shape)).sum().backward()
        finally:
            if h is not None:
                h.remove()

    _check(program, kind)


def test_a_native_forward_hook_returning_its_output_does_not_watch_a_fresh_output() -> None:
    """Perf: `return output` in a native forward hook (torch's loop keeps `hook_result`, one
    more reference than `_FREE_WHOLE` counts) makes every fresh output nobody keeps an
    InputAlias (each op on it ~5 us more): nn.Linear, conv, softmax, LayerNorm..."""
    m = torch.nn.Linear(4, 4)
    m.register_forward_hook(lambda mod, i, o: o)
    h = unihook.register_full_backward_hook(m, lambda *a: None)
    try:
        out = m(torch.randn(2, 4, requires_grad=True))
    finally:
        h.remove()
    assert type(out) is torch.Tensor


def test_a_kept_output_changed_in_place_holds_the_module_until_it_is_dropped() -> None:
    """With a backward pre-hook (no input identity), the kept tensor takes the output's
    history after `out.relu_()` (`_Adopt`): module -> kept -> C++ graph -> output identity ->
    call -> module, a cycle through the C++ graph the collector cannot see, as torch's own
    full backward hook makes with any kept tensor made from the input (README). Dropping the
    kept tensor (or the next call replacing it) frees the module."""

    class Keeps(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            self.kept = x * 2
            return self.kept

    m = Keeps()
    h = unihook.register_full_backward_pre_hook(m, lambda mod, go: None)
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
    out = m(x * 1)
    out.relu_()
    h.remove()
    del m.kept
    ref = weakref.ref(m)
    del m, out, h
    gc.collect()
    assert ref() is None
