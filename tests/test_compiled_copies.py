"""``copy.deepcopy`` of a ``torch.compile`` wrapper that a recipe watches: torch rebuilds the
wrapper around a copy of its ``_orig_mod`` (``OptimizedModule.__reduce__``), without the
wrapper's own hooks, where the recipe starts each forward. Until 2026-12-04 the copy raised
AttributeError (the recipe, reached through the inner module's hooks, copied the wrapper again
around the half-made inner copy) whenever the recipe's hooks were on the inner modules
(``every=1``, or hooks placed for the next forward), and carried no recipe otherwise. Now the
copy never carries one (as torch drops the wrapper's hooks), and the original records on as if
no copy had been made."""

from __future__ import annotations

import copy
import gc
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from unihook.recipes import ActivationStats, GradientMonitor  # noqa: E402

_RECIPES = {"stats": ActivationStats, "grad": GradientMonitor}


def _numbers(recipe: Any) -> Any:
    if isinstance(recipe, ActivationStats):
        return [
            {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}
            for row in recipe.rows()
        ]
    return [{k: round(v, 5) for k, v in entry.items()} for entry in recipe.history]


def _run(kind: str, every: int, before: int, how: str | None) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")
    recipe = _RECIPES[kind](compiled, every=every)
    g = torch.Generator().manual_seed(1)
    try:
        for _ in range(before):
            compiled(torch.randn(3, 4, generator=g)).sum().backward()
        copied = None
        if how == "model":
            copied = copy.deepcopy(compiled)
        elif how == "holder":
            copied = copy.deepcopy({"ema": compiled, "step": before})["ema"]
        if copied is not None:
            weights = copied._orig_mod[0].weight
            assert weights is not model[0].weight and torch.equal(weights, model[0].weight)
            copied(torch.randn(3, 4)).sum().backward()
            live = [
                r
                for r in gc.get_objects()
                if type(r) is _RECIPES[kind] and r is not recipe and not r._removed
            ]
            assert live == []  # (the copy carries no recipe: torch drops the wrapper's hooks)
        for _ in range(3):
            compiled(torch.randn(3, 4, generator=g)).sum().backward()
    finally:
        recipe.remove()
    return _numbers(recipe), recipe


@pytest.mark.parametrize("how", ["model", "holder"])
@pytest.mark.parametrize("before", [0, 1])
@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_a_deep_copy_of_a_compiled_model_carries_no_recipe(
    kind: str, every: int, before: int, how: str
) -> None:
    torch._dynamo.reset()
    expected, _ = _run(kind, every, before, None)
    got, _ = _run(kind, every, before, how)
    assert got == expected


def test_a_pickled_compiled_model_loads_without_the_recipe() -> None:
    """``torch.save`` of a compiled model with a recipe on it wrote a file whose load raised
    AttributeError (helper-121's FINDING 2): the loaded copy carries no recipe now, as a deep
    copy, and runs."""
    import io

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")
    with GradientMonitor(compiled) as monitor:
        compiled(torch.randn(3, 4)).sum().backward()
        buffer = io.BytesIO()
        torch.save(compiled, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        loaded(torch.randn(3, 4)).sum().backward()
        compiled(torch.randn(3, 4)).sum().backward()
    assert len(monitor.history) == 2
    assert not [r for r in gc.get_objects() if type(r) is GradientMonitor and r._model is loaded]


@pytest.mark.parametrize("every", [1, 2])
def test_a_copy_of_a_data_parallel_model_reached_through_its_module_keeps_its_recipe(
    every: int,
) -> None:
    """A deep copy of an object holding a model before its wrapper (a trainer's ``self.model``
    then ``self.wrapped``): DataParallel copies its state after itself, so the copy's recipe
    watches the copied wrapper and records its forwards, as before 78c0762, which made it a
    removed copy (helper-121's FINDING 1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    wrapped = nn.DataParallel(model)
    monitor = GradientMonitor(wrapped, every=every)
    try:
        for _ in range(every):  # (every > 1: the hooks placed on the inner modules)
            wrapped(torch.randn(3, 4)).sum().backward()
        copied = copy.deepcopy({"model": model, "wrapped": wrapped})["wrapped"]
        found = [r for r in gc.get_objects() if type(r) is GradientMonitor and r._model is copied]
        assert len(found) == 1 and not found[0]._removed
        before = len(found[0].history)
        copied(torch.randn(3, 4)).sum().backward()
        assert len(found[0].history) == before + 1
    finally:
        monitor.remove()


def test_a_shallow_copy_of_a_recipe_on_a_compiled_model_shares_the_model() -> None:
    """`copy.copy` rebuilds no wrapper: the copy shares the model and is not removed, as for
    any model (helper-122's FINDING 5: 3e43b9e made it a removed copy)."""
    model = nn.Sequential(nn.Linear(4, 2))
    compiled = torch.compile(model, backend="eager")
    with ActivationStats(compiled) as stats:
        shallow = copy.copy(stats)
        assert shallow._model is compiled and not shallow._removed
