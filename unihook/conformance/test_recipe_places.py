"""A recipe with `every` > 1 places its hooks anew for each recorded forward; they run where
`every=1` runs them among a module's forward hooks: after those registered before the recipe,
before those registered after it (native or unihook's), whatever was registered or removed
between the recorded forwards (helper-126's FINDING 3: until 2026-12-04 forwards N, 2N...
saw the output of a hook registered after the recipe, forward 0 did not)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from unihook import register_forward_hook, register_full_backward_hook
from unihook.recipes import ActivationStats, GradientMonitor


def _register(kit: Any, how: str, module: Any, hook: Callable[..., Any]) -> Callable[[], None]:
    if how == "native":
        return kit.native_hook(module, "forward", hook)
    return register_forward_hook(module, hook).remove


def _run(kit: Any, recipe: type, every: int, how: str) -> tuple[list[float], Any]:
    kit.seed(0)
    model = kit.sequential(kit.linear(4, 4), kit.linear(4, 3))
    x = kit.tensor(np.random.default_rng(0).normal(size=(2, 4)))
    plain = kit.numpy(model(x))
    _register(kit, how, model[1], lambda m, args, out: out + 1)
    with recipe(model, every=every) as watching:
        _register(kit, how, model[1], lambda m, args, out: out * 10)
        for step in range(7):
            if step == 3:  # registered and removed between recorded forwards
                _register(kit, how, model[1], lambda m, args, out: out * 3)()
                _register(kit, how, model[0], lambda m, args, out: None)
            out = model(x)
            if recipe is GradientMonitor:
                kit.backward(kit.cast(out, "float32").sum())
        history = list(watching.history)
    if recipe is ActivationStats:
        return [row["1"]["mean"] for row in history], plain
    return [row["1"] for row in history], plain


@pytest.mark.parametrize("how", ["native", "unihook"])
def test_activation_stats_every_sees_what_every_one_sees(backend: Any, how: str) -> None:
    for every in (1, 2, 3):
        means, plain = _run(backend, ActivationStats, every, how)
        assert len(means) == len(range(0, 7, every))
        # the hook registered before the recipe applied, the one registered after it not
        np.testing.assert_allclose(means, [(plain + 1).mean()] * len(means), rtol=1e-5)


@pytest.mark.parametrize("how", ["native", "unihook"])
def test_gradient_monitor_every_sees_what_every_one_sees(backend: Any, how: str) -> None:
    for every in (1, 2, 3):
        norms, plain = _run(backend, GradientMonitor, every, how)
        assert len(norms) == len(range(0, 7, every))
        # the gradient at the output the monitor's hook saw: the hook after it scales it 10x
        np.testing.assert_allclose(norms, [10 * np.sqrt(plain.size)] * len(norms), rtol=1e-5)


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
def test_a_hook_registered_between_recorded_forwards_beside_backward_dispatchers(
    backend: Any, recipe: type
) -> None:
    """A module with a unihook backward hook holds its dispatchers pinned last in its forward
    hook dict: a hook registered while the recipe's are away goes before them, and the
    recipe's placed anew must go before it, as with `every=1` (helper-128's FINDING 3: after
    it, the pinned key taken for a place)."""

    def run(every: int) -> list[float]:
        kit = backend
        kit.seed(0)
        model = kit.sequential(kit.linear(4, 4), kit.linear(4, 3))
        x = kit.tensor(np.random.default_rng(0).normal(size=(2, 4)))
        with recipe(model, every=every) as watching:
            handle = register_full_backward_hook(model[1], lambda m, gi, go: None)
            for step in range(5):
                if step == 1:
                    _register(kit, "native", model[1], lambda m, args, out: out * 10 + 100)
                kit.backward(kit.cast(model(x), "float32").sum())
            handle.remove()
        history = list(watching.history)
        if recipe is ActivationStats:
            return [row["1"]["mean"] for row in history]
        return [row["1"] for row in history]

    np.testing.assert_allclose(run(2), run(1)[::2], rtol=1e-5)
