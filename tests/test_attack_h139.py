"""helper-139's attack of `every` > 1 and the prepended notes (issue 11): a placement beside
another thread changing the hooks, a copy of the model and its recipe, a module moved to
another parent, modules that compare equal, a failed read of a dict."""

from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import pytest
from racing import racing

import unihook
from unihook.recipes import ActivationStats, DropHook, GradientMonitor

torch = pytest.importorskip("torch")
nn = torch.nn


def means(stats: ActivationStats) -> list[dict[str, float]]:
    return [{k: round(float(r["mean"]), 5) for k, r in e.items()} for e in stats.history]


def hook_dicts(model: Any) -> dict[str, list[int]]:
    return {
        f"{name}.{what}": list(getattr(module, what))
        for name, module in model.named_modules()
        for what in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_always_called")
    }


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_placement_beside_a_thread_changing_the_hooks_does_not_raise(framework: str) -> None:
    # FINDING 1: the places read the dict in a Python loop and moved keys another thread had
    # removed: "OrderedDict mutated during iteration" or a KeyError in the user's forward
    if framework == "torch":
        model, x = nn.Sequential(nn.Linear(8, 8), nn.Tanh()), torch.randn(4, 8)
        first = model[0]
    else:
        paddle = pytest.importorskip("paddle")
        model = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Tanh())
        x, first = paddle.randn([4, 8]), model[0]
    user = unihook.register_forward_hook(first, lambda m, a, o: o * 2)
    stats = ActivationStats(model, every=2)
    errors, counts = [], [0, 0]

    def forwards() -> None:
        try:
            model(x)
            counts[0] += 1
        except Exception as error:  # noqa: BLE001 - what the test looks for
            errors.append(error)

    def churn() -> None:
        handle = unihook.register_forward_hook(
            first, lambda m, a, o: None, prepend=counts[1] % 2 == 0
        )
        handle.remove()
        counts[1] += 1

    racing([forwards, churn], 3)
    stats.remove()
    user.remove()
    assert not errors, errors[:3]
    assert counts[0] > 100 and counts[1] > 100, counts


def _dropped(every: int, how: Callable[[Any], Any]) -> list[dict[str, float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(3, 4)
    stats = ActivationStats(model, every=every)
    model(x)
    DropHook(model, "0", p=0.5)  # made on an off-step of every=2: it goes first
    model2, stats2 = how((model, stats))
    torch.manual_seed(1)
    for _ in range(4):
        model2(x)
    return means(stats2)


@pytest.mark.parametrize(
    "how", [copy.deepcopy, lambda held: pickle.loads(pickle.dumps(held))], ids=["deep", "pickle"]
)
def test_a_copy_keeps_the_notes_of_hooks_that_went_first(how: Callable[[Any], Any]) -> None:
    # FINDING 2: the notes were kept by module: the copy's modules had none, and its every=2
    # recipe recorded the output before the drop
    assert _dropped(2, how) == _dropped(1, how)[::2]


def test_a_module_moved_to_another_parent_keeps_its_place_among_its_hooks() -> None:
    # FINDING 3: the place was noted under the module's name then; under the new one the
    # recipe's hook went after a user's hook registered after the recipe
    def run(every: int) -> list[dict[str, float]]:
        torch.manual_seed(0)
        a = nn.Linear(4, 4)
        model = nn.Sequential(a, nn.Tanh())
        x = torch.randn(3, 4)
        stats = ActivationStats(model, every=every)
        user = unihook.register_forward_hook(a, lambda m, i, o: o - 100.0)
        model(x)
        model[0] = nn.Sequential(a)
        for _ in range(3):
            model(x)
        stats.remove()
        user.remove()
        return means(stats)

    assert run(2) == run(1)[::2]


class _Block(nn.Linear):
    """Equal to another of its in_features (a config-value identity)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.in_features == other.in_features

    def __hash__(self) -> int:
        return hash((type(self), self.in_features))


@pytest.mark.parametrize("recipe", [ActivationStats, GradientMonitor])
def test_modules_that_compare_equal_are_each_recorded(recipe: type) -> None:
    # FINDING 4: the chosen modules were kept by equality: the second Block went unrecorded
    torch.manual_seed(0)
    model = nn.Sequential(_Block(4, 4), nn.Tanh(), _Block(4, 4))
    for every in (1, 2):
        with recipe(model, every=every) as watching:
            model(torch.randn(2, 4)).sum().backward()
            assert sorted(watching.history[0]) == ["", "0", "1", "2"]


def test_hooks_prepended_on_modules_that_compare_equal_are_noted_apart() -> None:
    # FINDING 4: one module's note replaced the other's
    def run(every: int) -> list[dict[str, float]]:
        torch.manual_seed(0)
        model = nn.Sequential(_Block(4, 4), nn.Tanh(), _Block(4, 4))
        x = torch.randn(2, 4)
        stats = ActivationStats(model, every=every)
        model(x)
        handles = [
            unihook.register_forward_hook(model[i], lambda m, a, o: o + 1.0, prepend=True)
            for i in (0, 2)
        ]
        for _ in range(3):
            model(x)
        stats.remove()
        for handle in handles:
            handle.remove()
        return means(stats)

    assert run(2) == run(1)[::2]


def test_a_failed_read_before_a_registration_notes_nothing(monkeypatch: Any) -> None:
    # FINDING 5: a failed read before the registration (another thread changing the dict)
    # noted every key of the dict as prepended, the user's appended hook too
    from unihook import ops

    def run(every: int, fail: bool) -> list[dict[str, float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        x = torch.randn(2, 4)
        stats = ActivationStats(model, every=every)
        model(x)
        user = unihook.register_forward_hook(model[0], lambda m, i, o: o * 10)
        real, calls = ops.forward_hook_dicts, [0]

        def flaky(module: Any) -> Any:
            calls[0] += 1
            if fail and calls[0] == 1:
                raise RuntimeError("OrderedDict mutated during iteration")
            return real(module)

        with monkeypatch.context() as patch:
            patch.setattr(ops, "forward_hook_dicts", flaky)
            first = unihook.register_forward_hook(model[0], lambda m, i, o: o, prepend=True)
        # (failed: nothing noted, the user's appended hook in particular; else the new one)
        assert len(ops.prepended_keys(model[0], 1)) == (0 if fail else 1)
        for _ in range(3):
            model(x)
        stats.remove()
        user.remove()
        first.remove()
        return means(stats)

    assert run(2, True) == run(1, False)[::2]


def test_no_hook_is_left_after_the_attacks() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_Block(4, 4), nn.Tanh(), _Block(4, 4))
    before = hook_dicts(model)
    x = torch.randn(2, 4)
    stats = ActivationStats(model, every=2)
    drop = DropHook(model, "0", p=0.5)
    model(x)
    model[2] = nn.Sequential(model[2])
    for _ in range(3):
        model(x)
    drop.remove()
    stats.remove()
    model[2] = model[2][0]
    assert hook_dicts(model) == before
