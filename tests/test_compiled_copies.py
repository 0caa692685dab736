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
