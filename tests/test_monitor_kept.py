"""GradientMonitor and outputs kept where a later read reaches them (`monitor._kept`, looked
for when the model's forward ends): a user's forward hooks capturing features (on the
module, in a dict, a nested dict or a list on the model), registered before or after the
monitor, read by the loss (a perceptual or feature-matching term). Oracle and promise:
`monitor_oracle` (torch's native hooks on a copy, with the same capture hooks)."""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import broken, monitored, native_norms  # noqa: E402

# where a capture hook puts a module's raw output: on the module, or on the model
PLACES = ("module", "dict", "nested", "list", "detached")


def _model(rng: random.Random) -> Any:
    blocks: list[Any] = []
    for _ in range(rng.randint(2, 5)):
        if rng.random() < 0.4:
            inner = [nn.Linear(4, 4), nn.Tanh()][: rng.randint(1, 2)]
            blocks.append(nn.Sequential(*inner))
        else:
            blocks.append(rng.choice([lambda: nn.Linear(4, 4), nn.Tanh])())
    model = nn.Sequential(*blocks)
    model.features = {}
    model.store = {"features": {}}
    model.captured_list = []
    return model


def _capture(root: Any, name: str, place: str) -> Callable[[Any, Any, Any], None]:
    def hook(module: Any, args: Any, output: Any) -> None:
        if place == "module":
            module.captured = output
        elif place == "dict":
            root.features[name] = output
        elif place == "nested":
            root.store["features"][name] = output
        elif place == "list":
            root.captured_list.append(output)
        else:
            root.features[name] = output.detach()

    return hook


def _case(seed: int, places: tuple[str, ...]) -> tuple[Any, list[str], Any, Any, Any]:
    """A generated model, its module names, an input, the loss reading the captures, and
    what registers the capture hooks (on the model given: the monitored one or the copy)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = _model(rng)
    names = [name for name, _ in model.named_modules()]
    captured = [(name, rng.choice(places)) for name in names[1:] if rng.random() < 0.6]
    weights = [rng.choice([0.0, 1.0, 3.0]) for _ in captured]

    def prepare(root: Any) -> Callable[[], None]:
        root.features.clear()
        root.store["features"].clear()
        root.captured_list.clear()
        handles = [
            root.get_submodule(name).register_forward_hook(_capture(root, name, place))
            for name, place in captured
        ]

        def undo() -> None:
            for handle in handles:
                handle.remove()

        return undo

    def loss(root: Any, out: Any) -> Any:
        total = 2.0 * out.sum()
        reads = [*root.features.values(), *root.store["features"].values()]
        reads += root.captured_list
        reads += [m.captured for m in root.modules() if "captured" in vars(m)]
        for weight, read in zip(weights, reads):
            if weight:
                total = total + weight * (read * read).sum()
        return total

    return model, names, torch.randn(3, 4), loss, prepare


@pytest.mark.parametrize("seed", range(12))
def test_features_captured_by_a_users_hooks_are_native_or_left_out(seed: int) -> None:
    model, names, x, loss, prepare = _case(seed, PLACES)
    assert broken(model, names, x, loss, prepare) == []


@pytest.mark.parametrize("seed", range(4))
def test_detached_captures_leave_nothing_out(seed: int) -> None:
    """A capture of ``output.detach()`` is another tensor: every module is recorded."""
    model, names, x, loss, prepare = _case(seed, ("detached",))
    native = native_norms(model, names, x, loss, prepare)
    step, said = monitored(model, x, loss, prepare)
    assert said == [] and set(step) == set(native)
    assert all(step[name] == pytest.approx(native[name], rel=1e-5) for name in native)


def test_captures_before_the_monitor_too() -> None:
    """The user's capture hooks registered before the monitor: as after it."""
    for seed in range(6):
        model, names, x, loss, prepare = _case(seed, PLACES)
        assert broken(model, names, x, loss, prepare, first=True) == [], seed


class _KeepsInput(nn.Module):
    """A Linear keeping the tensor its call got (``self.last_input = x``: logging, or a
    hand-written backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.last_input: Any = None

    def forward(self, x: Any) -> Any:
        self.last_input = x
        return self.fc(x)


def _reads_kept_inputs(model: Any, out: Any) -> Any:
    kept = [m.last_input for m in model.modules() if isinstance(m, _KeepsInput)]
    return 2.0 * out.sum() + sum(3.0 * (k * k).sum() for k in kept)


@pytest.mark.parametrize("seed", range(6))
def test_a_module_keeping_its_input_native_or_left_out(seed: int) -> None:
    """A module keeping the tensor it got holds the alias torch hands it: the calls that made
    that tensor count its reads, the containers returning it after that call do not. A hook
    keeping the maker's raw output there looks the same (helper-95's FINDING 1): every call
    that returned it is left out, warned."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    blocks = [nn.Linear(4, 4), nn.Sequential(nn.Tanh(), _KeepsInput())]
    blocks += [rng.choice([nn.Tanh, _KeepsInput])() for _ in range(3)]
    model = nn.Sequential(*blocks)
    names = [name for name, _ in model.named_modules()]
    x = torch.randn(3, 4)
    assert broken(model, names, x, _reads_kept_inputs) == []


def test_a_kept_input_of_a_module_where_leaves_out_is_left_out() -> None:
    """The keeper not monitored (`where=`): no call of it tells that it got the tensor, so the
    calls that made it are left out (warned), never recorded with the sum."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _KeepsInput(), nn.Tanh())
    x = torch.randn(3, 4)
    assert broken(model, ["0", "2"], x, _reads_kept_inputs, where=["0", "2"]) == []
    step, said = monitored(model, x, _reads_kept_inputs, where=["0", "2"])
    assert "0" not in step and any("'0'" in s for s in said)
