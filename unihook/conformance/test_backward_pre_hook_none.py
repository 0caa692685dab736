"""A module backward pre-hook that returns None for a gradient: as torch's BackwardHook, the
module's backward gets zeros there (the next pre-hook still sees the None)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import unihook


def test_pre_hook_none_slot_sends_zeros_on(backend: Any) -> None:
    kit = backend
    m = kit.linear(3, 2, [[1.0, 2.0, 3.0], [-4.0, 5.0, -6.0]], [0.0, 0.0])
    seen: list[Any] = []
    unihook.register_full_backward_pre_hook(m, lambda mod, go: (None,))
    unihook.register_full_backward_pre_hook(m, lambda mod, go: seen.append(go))
    x = kit.tensor([[1.0, -1.0, 2.0]], requires_grad=True)
    kit.backward((m(x) * m(x)).sum())
    assert seen == [(None,), (None,)]
    np.testing.assert_array_equal(kit.grad(x), [[0.0, 0.0, 0.0]])


def _logged_chain(kit: Any) -> tuple[Any, Any, list[tuple[Any, ...]]]:
    """``b(relu(a(x)))``, each of a and b with a logging full hook and pre-hook: the calls, as
    (kind, module, the sums of its gradients, None where None)."""
    log: list[tuple[Any, ...]] = []

    def sums(grads: Any) -> list[float | None]:
        return [None if g is None else float(kit.numpy(g).sum()) for g in grads]

    a = kit.linear(3, 3, np.full((3, 3), 0.5), [0.0, 0.0, 0.0])
    b = kit.linear(3, 3, np.full((3, 3), 0.25), [0.0, 0.0, 0.0])
    for name, m in (("a", a), ("b", b)):
        unihook.register_full_backward_pre_hook(
            m, lambda mod, go, name=name: log.append(("pre", name, sums(go)))
        )
        unihook.register_full_backward_hook(
            m, lambda mod, gi, go, name=name: log.append(("full", name, sums(gi), sums(go)))
        )
    return a, b, log


def test_pre_hook_none_slot_still_runs_the_modules_hooks_and_those_before(backend: Any) -> None:
    """torch's engine passes a pre-hook's None on: the module's own full hook and the hooks of
    the modules before it run (MindSpore's engine leaves out what is before a None: its
    backend calls them where torch's engine would, docs/MINDSPORE.md §11 item 4)."""
    kit = backend
    a, b, log = _logged_chain(kit)
    unihook.register_full_backward_pre_hook(b, lambda mod, go: (None,), prepend=True)
    x = kit.tensor(np.ones((2, 3)), requires_grad=True)
    kit.backward(b(kit.relu(a(x))).sum())
    assert log == [
        ("pre", "b", [None]),
        ("full", "b", [0.0], [None]),
        ("pre", "a", [0.0]),
        ("full", "a", [0.0], [0.0]),
    ]
    np.testing.assert_array_equal(kit.grad(x), np.zeros((2, 3)))


def test_full_hook_none_slot_still_runs_the_hooks_before(backend: Any) -> None:
    """A full hook's None for its input's gradient: the module before it still gets its hook
    calls, and None there, as torch hands it (paddle's engine takes no None: its backend sends
    zeros and tells the identity below they stand for none; until 2026-12-07 its hooks saw
    zeros)."""
    kit = backend
    a, b, log = _logged_chain(kit)
    unihook.register_full_backward_hook(b, lambda mod, gi, go: (None,))
    x = kit.tensor(np.ones((2, 3)), requires_grad=True)
    kit.backward(b(kit.relu(a(x))).sum())
    assert log[:2] == [("pre", "b", [6.0]), ("full", "b", [4.5], [6.0])]
    assert log[2:] == [("pre", "a", [None]), ("full", "a", [0.0], [None])]
    np.testing.assert_array_equal(kit.grad(x), np.zeros((2, 3)))


@pytest.mark.parametrize("kind", ["full", "unused_output"])
def test_a_branch_a_hook_gives_no_gradient_adds_nothing_to_the_others(
    backend: Any, kind: str
) -> None:
    """At x = [0, 1, 4], a square root's branch that gets no gradient: `full`: m's full hook
    returns None for it in ``m(x ** 0.5) + 3 x``; `unused_output`: m returns
    ``(2 h, h ** 0.5)``, a no-op full hook on it, and the loss reads the first only. x's
    gradient is 3, 3, 3 (2, 2, 2), as without the hooks: zeros sent down that branch met the
    root's infinite derivative at 0, NaN (helper-108's FINDINGS 1, 3, 4; paddle's engine takes
    no None, docs/SEMANTICS.md trap 3: the nodes only those zeros reach give zeros since
    2026-12-07). (Not a pre-hook's None: torch's own engine sends the module's backward zeros
    there, NaN in this shape.)"""
    kit = backend
    x = kit.tensor([0.0, 1.0, 4.0], requires_grad=True)
    if kind == "unused_output":
        m = kit.module(lambda self, h: (h * 2, h**0.5))
        unihook.register_full_backward_hook(m, lambda mod, gi, go: None)
        kit.backward(m(x)[0].sum())
        np.testing.assert_array_equal(kit.grad(x), [2.0, 2.0, 2.0])
        return
    m = kit.module(lambda self, h: h * 2)
    unihook.register_full_backward_hook(m, lambda mod, gi, go: (None,))
    kit.backward(m(x**0.5).sum() + (x * 3).sum())
    np.testing.assert_array_equal(kit.grad(x), [3.0, 3.0, 3.0])


def test_full_hook_none_leaves_the_input_without_gradient(backend: Any) -> None:
    """A full hook's None for the gradient of a leaf the module was given: the leaf gets no
    gradient (None), as torch's; the module's parameters get theirs (paddle's engine takes no
    None: its backend sends zeros and gives the leaf None again; until 2026-12-07 x.grad was
    zeros)."""
    kit = backend
    if kit.name == "mindspore":
        pytest.skip(
            "mindspore.grad gives zeros for every input asked for, hooked or not (no None "
            "gradient; docs/MINDSPORE.md section 7)"
        )
    m = kit.linear(3, 2, [[1.0, 2.0, 3.0], [-4.0, 5.0, -6.0]], [0.0, 0.0])
    unihook.register_full_backward_hook(m, lambda mod, gi, go: (None,))
    x = kit.tensor([[1.0, -1.0, 2.0]], requires_grad=True)
    kit.backward(m(x).sum())
    assert kit.grad(x) is None
    assert all(kit.grad(p) is not None for p in kit.parameters(m))
