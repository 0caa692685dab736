"""`every` > 1 places the recipes' hooks anew for each recorded forward: on the modules the first
placement chose, as `every=1`'s hooks, placed once, are (helper-128's FINDING 5: a submodule added
to the model after the recipe was hooked from the next placement on, with every=2 only)."""

from __future__ import annotations

from typing import Any

import pytest

from unihook.recipes import ActivationStats, GradientMonitor


def model_and_input(framework: str) -> tuple[Any, Any, Any]:
    """(model, input, a function adding a submodule the model's forward then calls)."""
    if framework == "torch":
        torch = pytest.importorskip("torch")

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = torch.nn.Linear(3, 3)

            def forward(self, x: Any) -> Any:
                h = self.fc(x)
                extra = getattr(self, "extra", None)
                return h if extra is None else extra(h)

        model, x = Net(), torch.ones(2, 3)
        return model, x, lambda: setattr(model, "extra", torch.nn.Linear(3, 3))
    paddle = pytest.importorskip("paddle")

    class Layer(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            h = self.fc(x)
            extra = getattr(self, "extra", None)
            return h if extra is None else extra(h)

    layer = Layer()
    return layer, paddle.ones([2, 3]), lambda: setattr(layer, "extra", paddle.nn.Linear(3, 3))


def backward(out: Any) -> None:
    (out * out).sum().backward()


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_module_added_after_the_recipe_is_not_hooked_whatever_every(
    framework: str, recipe: type
) -> None:
    seen = []
    for every in (1, 2):
        model, x, add = model_and_input(framework)
        with recipe(model, every=every) as watching:
            backward(model(x))
            add()
            for _ in range(4):
                backward(model(x))
            history = watching.history
        names = [sorted(entry) for entry in history]
        assert all("extra" not in entry for entry in names), (every, names)
        seen.append(names[-1])
    assert seen[0] == seen[1] == sorted(["", "fc"])
