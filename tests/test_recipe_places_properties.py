"""Generated: forward hooks registered (native or unihook's, prepended or not; backward
hooks, whose dispatchers unihook pins last in the same dicts) and removed
between the forwards of a model watched by ActivationStats / GradientMonitor: `every=N`
records in forwards 0, N, 2N... what `every=1` records there (the recipe's hooks placed anew
go back to their places: helper-126's FINDING 3). The modules keep a hook registered before
the recipe (with none left, a hook prepended since goes after the recipe's: README)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import unihook
from unihook.recipes import ActivationStats, GradientMonitor

# (add / remove / nothing, native or unihook's, prepend, module 0, 1 or the model, factor, pick)
_OPS = st.tuples(
    st.sampled_from(["add", "add", "remove", "none", "backward"]),
    st.sampled_from(["native", "unihook"]),
    st.booleans(),
    st.integers(0, 2),
    st.integers(1, 5),
    st.integers(0, 50),
)
_KEPT = 3  # the hooks registered before the recipe, never removed


def _framework(name: str) -> Any:
    framework = pytest.importorskip(name)
    if name == "torch":
        framework.manual_seed(0)
        nn = framework.nn
        return nn.Sequential(nn.Linear(3, 3), nn.Tanh()), framework.randn(2, 3)
    framework.seed(0)
    nn = framework.nn
    return nn.Sequential(nn.Linear(3, 3), nn.Tanh()), framework.randn([2, 3])


def _run(name: str, every: int, ops: list[Any], recipe: type) -> list[dict[str, float]]:
    model, x = _framework(name)
    removers: list[Callable[[], Any]] = []

    def add(how: str, prepend: bool, at: int, factor: int) -> None:
        module = model[at] if at < 2 else model
        hook = lambda m, args, out, c=factor: out * c + 0.1 * c  # noqa: E731 (order matters)
        if how == "unihook" or (prepend and name == "paddle"):  # (paddle has no prepend)
            removers.append(unihook.register_forward_hook(module, hook, prepend=prepend).remove)
        elif name == "torch":
            removers.append(module.register_forward_hook(hook, prepend=prepend).remove)
        else:
            removers.append(module.register_forward_post_hook(hook).remove)

    add("native", False, 1, 7)
    add("unihook", False, 0, 3)
    add("native", False, 2, 2)
    watching = recipe(model, every=every)
    for what, how, prepend, at, factor, pick in ops:
        if what == "add":
            add(how, prepend, at, factor)
        elif what == "backward":  # (its dispatchers pinned last in the module's hook dicts)
            module = model[at] if at < 2 else model
            removers.append(
                unihook.register_full_backward_hook(
                    module,
                    lambda m, gi, go, c=factor: tuple(None if g is None else g * c for g in gi),
                ).remove
            )
        elif what == "remove" and len(removers) > _KEPT:
            removers.pop(_KEPT + pick % (len(removers) - _KEPT))()
        out = model(x)
        if recipe is GradientMonitor:
            out.sum().backward()
    watching.remove()
    for remove in removers:
        remove()
    if recipe is ActivationStats:
        return [{k: row["mean"] for k, row in step.items()} for step in watching.history]
    return list(watching.history)


@pytest.mark.parametrize("name", ["torch", "paddle"])
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    ops=st.lists(_OPS, min_size=1, max_size=8),
    every=st.sampled_from([2, 3]),
    recipe=st.sampled_from([ActivationStats, GradientMonitor]),
)
# (a hook added after the recipe, before a recorded forward other than the first)
@example(
    ops=[("add", "native", False, 1, 2, 0)] + [("none", "native", False, 0, 1, 0)] * 2,
    every=2,
    recipe=ActivationStats,
)
@example(
    ops=[("add", "unihook", False, 0, 2, 0)] + [("none", "native", False, 0, 1, 0)] * 3,
    every=3,
    recipe=GradientMonitor,
)
def test_every_records_what_every_one_records(
    name: str, ops: list[Any], every: int, recipe: type
) -> None:
    expected = _run(name, 1, ops, recipe)[::every]
    got = _run(name, every, ops, recipe)
    assert [list(step) for step in got] == [list(step) for step in expected]
    for a, b in zip(got, expected):
        np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=1e-5)
