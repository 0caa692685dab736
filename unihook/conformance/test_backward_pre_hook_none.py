"""A module backward pre-hook that returns None for a gradient: as torch's BackwardHook, the
module's backward gets zeros there (the next pre-hook still sees the None)."""

from __future__ import annotations

from typing import Any

import numpy as np

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
    """torch sends zeros on from a pre-hook's None: the module's own full hook and the hooks of
    the modules before it run (MindSpore's engine pruned them all before 2026-12-03)."""
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
    calls, with zeros (torch hands its pre-hook None there; paddle's and MindSpore's engines
    take no None, so zeros go on: README); MindSpore's engine pruned them before 2026-12-03."""
    kit = backend
    a, b, log = _logged_chain(kit)
    unihook.register_full_backward_hook(b, lambda mod, gi, go: (None,))
    x = kit.tensor(np.ones((2, 3)), requires_grad=True)
    kit.backward(b(kit.relu(a(x))).sum())
    assert log[:2] == [("pre", "b", [6.0]), ("full", "b", [4.5], [6.0])]
    zero = None if kit.name == "torch" else 0.0
    assert log[2:] == [("pre", "a", [zero]), ("full", "a", [0.0], [zero])]
    np.testing.assert_array_equal(kit.grad(x), np.zeros((2, 3)))
