"""`every` > 1 places the recipes' hooks anew for each recorded forward: on the modules the first
placement chose, as `every=1`'s hooks, placed once, are (helper-128's FINDING 5: a submodule added
to the model after the recipe was hooked from the next placement on, with every=2 only)."""

from __future__ import annotations

import random
from typing import Any, Callable

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


def optional_model(framework: str) -> tuple[Any, Any]:
    """A model calling `fc` when it has one (else passing its input on), and `head`."""
    if framework == "torch":
        torch = pytest.importorskip("torch")

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc, self.head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)

            def forward(self, x: Any) -> Any:
                return self.head(x if self.fc is None else self.fc(x))

        return Net(), torch.ones(2, 3)
    paddle = pytest.importorskip("paddle")

    class Layer(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = paddle.nn.Linear(3, 3), paddle.nn.Linear(3, 2)

        def forward(self, x: Any) -> Any:
            fc = getattr(self, "fc", None)
            return self.head(x if fc is None else fc(x))

    return Layer(), paddle.ones([2, 3])


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_module_taken_out_and_put_back_is_hooked_again_whatever_every(
    framework: str, recipe: type
) -> None:
    # (helper-135's FINDING 3: a module missing at one placement was lost for good)
    seen = []
    for every in (1, 2, 3):
        model, x = optional_model(framework)
        fc = model.fc
        with recipe(model, every=every) as watching:
            backward(model(x))
            if framework == "torch":
                model.fc = None
            else:
                del model.fc
            for _ in range(3):
                backward(model(x))
            model.fc = fc
            for _ in range(6):
                backward(model(x))
            history = watching.history
        seen.append(sorted(history[-1]))
    assert seen[0] == seen[1] == seen[2] == sorted(["", "fc", "head"]), seen


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
def test_a_forward_interrupted_while_the_hooks_are_placed_is_not_counted(
    recipe: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a Ctrl-C in the places' put-back (helper-130's FINDING 3: the count went on and the
    # next recorded forward had no hooks): the forward raises, is not counted, and the
    # forwards that completed are recorded as without it, 0, 2, 4... of them
    import unihook.recipes._places as places

    model, x, _ = model_and_input("torch")
    real = places._put_back
    calls = []

    def interrupt(*args: Any) -> None:
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        real(*args)

    with recipe(model, every=2) as watching:
        backward(model(x))
        monkeypatch.setattr(places, "_put_back", interrupt)
        with pytest.raises(KeyboardInterrupt):
            backward(model(x))  # (its hooks for the next forward: interrupted)
        for _ in range(6):
            backward(model(x))
        assert len(watching.history) == 4  # of 7 completed forwards: 0, 2, 4, 6
        assert all(sorted(entry) == ["", "fc"] for entry in watching.history)


def _layers_model(framework: str) -> tuple[Any, Any, Callable[[], Any]]:
    """(model running `layers` in order then `spare` when set, input, a new Linear)."""
    if framework == "torch":
        torch = pytest.importorskip("torch")

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(4))
                self.spare: Any = None

            def forward(self, x: Any) -> Any:
                for layer in self.layers:
                    x = torch.tanh(layer(x))
                return x if self.spare is None else self.spare(x)

        torch.manual_seed(0)
        return Net(), torch.randn(2, 3), lambda: torch.nn.Linear(3, 3)
    paddle = pytest.importorskip("paddle")

    class Layer(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.layers = paddle.nn.LayerList([paddle.nn.Linear(3, 3) for _ in range(4)])
            self.spare: Any = None

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = paddle.tanh(layer(x))
            spare = getattr(self, "spare", None)
            return x if spare is None else spare(x)

    paddle.seed(0)
    return Layer(), paddle.randn([2, 3]), lambda: paddle.nn.Linear(3, 3)


def _restructure(model: Any, new: Callable[[], Any], rng: random.Random) -> None:
    """One change of the model's structure between forwards: its modules swapped, moved to
    another attribute, taken out, or a new one put in."""
    layers = model.layers
    change = rng.choice(["swap", "to_spare", "from_spare", "drop", "insert", "reverse"])
    if change == "swap" and len(layers) > 1:
        i, j = rng.sample(range(len(layers)), 2)
        first, second = layers[i], layers[j]
        layers[i], layers[j] = second, first
    elif change == "to_spare" and len(layers) > 1:
        model.spare = layers[rng.randrange(len(layers))]
        del layers[[i for i, m in enumerate(layers) if m is model.spare][0]]
    elif change == "from_spare" and getattr(model, "spare", None) is not None:
        layers.insert(rng.randrange(len(layers) + 1), model.spare)
        model.spare = None
    elif change == "drop" and len(layers) > 1:
        del layers[rng.randrange(len(layers))]
    elif change == "insert":
        layers.insert(rng.randrange(len(layers) + 1), new())
    elif change == "reverse":
        order = list(layers)[::-1]
        for i, module in enumerate(order):
            layers[i] = module


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_modules_swapped_moved_or_renamed_are_filed_as_every_1_files_them(
    framework: str, recipe: type
) -> None:
    # every=1's hooks stay on the modules it chose, under the names they had: every > 1's
    # placements file each module's rows under that name too, wherever the module went
    # (helper-135's FINDING 1: two swapped modules' rows were exchanged, a renamed one lost)
    def value(entry: Any) -> float:
        return round(float(entry["mean"] if isinstance(entry, dict) else entry), 5)

    for seed in range(12):
        rng = random.Random(seed)
        changes = [rng.random() < 0.6 for _ in range(8)]
        histories = {}
        for every in (1, 2, 3):
            model, x, new = _layers_model(framework)
            change_rng = random.Random(seed + 1000)
            with recipe(model, every=every) as watching:
                for step, change in enumerate(changes):
                    if change and step:
                        _restructure(model, new, change_rng)
                    backward(model(x))
                history = watching.history
            histories[every] = [{k: value(v) for k, v in e.items()} for e in history]
        for every in (2, 3):
            assert histories[every] == histories[1][::every], (seed, every, histories)
