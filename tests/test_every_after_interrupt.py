"""A recipe with ``every`` > 1 records no call of a submodule made on its own (no forward of the
model running), also after a forward of the model left by a KeyboardInterrupt (a notebook's
Ctrl-C), which runs no ``always_call`` hook and so leaves its entry behind (helper-119: until
2026-12-04 the next lone calls were recorded, into ActivationStats' rows).

Generated: forwards, interrupted forwards (at a random module) and lone calls of random
submodules, interleaved; the oracle is the same run without the lone calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unihook.recipes import ActivationStats, GradientMonitor

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# a step: ("f",) a forward and backward; ("k", i) a forward interrupted in module i;
# ("l", i) module i called on its own (and a backward through it)
_STEPS = st.lists(
    st.one_of(
        st.just(("f", 0)),
        st.tuples(st.just("k"), st.integers(0, 3)),
        st.tuples(st.just("l"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=10,
)


def _framework(name: str) -> Any:
    """(nn, a module class raising KeyboardInterrupt while armed, to_tensor, seed)."""
    if name == "torch":
        import torch

        return torch.nn, _raising(torch.nn.Module), torch.tensor, lambda: torch.manual_seed(0)
    import paddle

    return paddle.nn, _raising(paddle.nn.Layer), paddle.to_tensor, lambda: paddle.seed(0)


def _raising(base: Any) -> Any:
    class Raise(base):  # type: ignore[misc,valid-type]
        armed = False

        def forward(self, x: Any) -> Any:
            if self.armed:
                raise KeyboardInterrupt
            return x * 1.0

    return Raise


def _run(framework: str, kind: str, every: int, steps: list[tuple[str, int]]) -> Any:
    nn, raising, tensor, seed = _framework(framework)
    seed()
    # four modules a forward passes, each of which may raise before its own work
    blocks = [nn.Sequential(raising(), nn.Linear(4, 4)) for _ in range(4)]
    model = nn.Sequential(*blocks)
    recipe = (ActivationStats if kind == "stats" else GradientMonitor)(model, every=every)
    data = np.random.default_rng(0)
    lone = np.random.default_rng(1)  # (the lone calls' inputs: the others' stay the same)
    try:
        for what, where in steps:
            if what == "f":
                model(tensor(data.standard_normal((2, 4), dtype=np.float32))).sum().backward()
            elif what == "k":
                x = tensor(data.standard_normal((2, 4), dtype=np.float32))
                blocks[where][0].armed = True
                try:
                    with pytest.raises(KeyboardInterrupt):
                        model(x)
                finally:
                    blocks[where][0].armed = False
            else:
                y = blocks[where](tensor(lone.standard_normal((2, 4), dtype=np.float32)))
                y.sum().backward()
    finally:
        recipe.remove()
    if kind == "stats":
        return [
            {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}
            for row in recipe.rows()
        ]
    return [{k: round(v, 5) for k, v in entry.items()} for entry in recipe.history]


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@pytest.mark.parametrize("kind", ["stats", "grad"])
def test_lone_calls_after_an_interrupted_forward_are_not_recorded(
    framework: str, kind: str
) -> None:
    pytest.importorskip(framework)
    # (forward 0, then 1: the hooks placed for forward 2, which a Ctrl-C leaves in module 2)
    steps = [("f", 0), ("f", 0), ("k", 2), ("l", 0), ("l", 3), ("f", 0), ("l", 1)]
    expected = _run(framework, kind, 2, [s for s in steps if s[0] != "l"])
    assert _run(framework, kind, 2, steps) == expected


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@given(steps=_STEPS, every=st.sampled_from([2, 3]), kind=st.sampled_from(["stats", "grad"]))
@settings(max_examples=25, deadline=None)
def test_generated_lone_calls_beside_interrupted_forwards(
    framework: str, steps: list[tuple[str, int]], every: int, kind: str
) -> None:
    pytest.importorskip(framework)
    expected = _run(framework, kind, every, [s for s in steps if s[0] != "l"])
    assert _run(framework, kind, every, steps) == expected
