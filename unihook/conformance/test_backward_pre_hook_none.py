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
