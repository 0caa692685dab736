"""Recipes under activation checkpointing (torch's ``torch.utils.checkpoint``, paddle's
``recompute``), of a part of the model or of the whole, reentrant or not: the recomputation in
backward is not a forward. ActivationStats and GradientMonitor record what they record
without checkpointing, `every` counts the forwards alone, and `every` beside a checkpoint no
longer raises "OrderedDict mutated during iteration" (torch's exception path that ends a
non-reentrant recomputation iterates the model's hook dict, which `every` changed)."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

import pytest

from unihook.recipes import ActivationStats, GradientMonitor

# "segments": each of the block's layers in a checkpoint of its own, one after another (paddle
# clears its in-backward flag when the first reentrant recomputation's inner backward ends:
# the later ones passed for forwards until 2026-12-01)
MODES = [
    "none",
    "part",
    "part-reentrant",
    "segments",
    "segments-reentrant",
    "whole",
    "whole-reentrant",
]


def _torch_run() -> Callable[[str, Callable[..., Any]], Any]:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mode = mode
            self.block = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)
            )
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x: Any) -> Any:
            reentrant = self.mode.endswith("reentrant")
            if self.mode.startswith("part"):
                return self.head(checkpoint(self.block, x, use_reentrant=reentrant))
            if self.mode.startswith("segments"):
                for layer in self.block:
                    x = checkpoint(layer, x, use_reentrant=reentrant)
                return self.head(x)
            return self.head(self.block(x))

    def run(mode: str, make: Callable[..., Any]) -> Any:
        torch.manual_seed(0)
        model = Net(mode)
        recipe = make(model)
        for _ in range(4):
            x = torch.randn(3, 4, requires_grad=True)
            if mode.startswith("whole"):
                out = checkpoint(model, x, use_reentrant=mode.endswith("reentrant"))
            else:
                out = model(x)
            out.sum().backward()
        return recipe

    return run


def _paddle_run() -> Callable[[str, Callable[..., Any]], Any]:
    warnings.filterwarnings("ignore", message="No ccache found")
    paddle = pytest.importorskip("paddle")
    from paddle.distributed.fleet.utils import recompute

    logging.getLogger("paddle").setLevel(logging.ERROR)

    class Net(paddle.nn.Layer):
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.mode = mode
            self.block = paddle.nn.Sequential(
                paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 8)
            )
            self.head = paddle.nn.Linear(8, 2)

        def forward(self, x: Any) -> Any:
            reentrant = self.mode.endswith("reentrant")
            if self.mode.startswith("part"):
                return self.head(recompute(self.block, x, use_reentrant=reentrant))
            if self.mode.startswith("segments"):
                for layer in self.block:
                    x = recompute(layer, x, use_reentrant=reentrant)
                return self.head(x)
            return self.head(self.block(x))

    def run(mode: str, make: Callable[..., Any]) -> Any:
        paddle.seed(0)
        model = Net(mode)
        recipe = make(model)
        for _ in range(4):
            x = paddle.randn([3, 4])
            x.stop_gradient = False
            if mode.startswith("whole"):
                out = recompute(model, x, use_reentrant=mode.endswith("reentrant"))
            else:
                out = model(x)
            out.sum().backward()
        return recipe

    return run


RUNS = {"torch": _torch_run, "paddle": _paddle_run}


def _called(mode: str, name: str) -> bool:
    # (the segments are the block's layers, called one by one: the block itself is not)
    return not (mode.startswith("segments") and name == "block")


def _norms(recipe: GradientMonitor) -> list[dict[str, float]]:
    return [{k: round(v, 5) for k, v in entry.items()} for entry in recipe.history]


@pytest.mark.parametrize("every", [1, 2, 3])
@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("framework", sorted(RUNS))
def test_activation_stats_record_each_forward_once(framework: str, mode: str, every: int) -> None:
    run = RUNS[framework]()
    make = lambda m: ActivationStats(m, every=every)  # noqa: E731
    want, got = run("none", make), run(mode, make)
    assert got.rows() == [row for row in want.rows() if _called(mode, row["name"])]
    assert len(got.history) == len(want.history) == len(range(0, 4, every))
    assert got._forwards == want._forwards


@pytest.mark.parametrize("every", [1, 2, 3])
@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("framework", sorted(RUNS))
def test_gradient_monitor_logs_each_backward_once(framework: str, mode: str, every: int) -> None:
    run = RUNS[framework]()
    make = lambda m: GradientMonitor(m, every=every)  # noqa: E731
    want, got = _norms(run("none", make)), _norms(run(mode, make))
    want = [{k: v for k, v in w.items() if _called(mode, k)} for w in want]
    if mode in ("part-reentrant", "segments-reentrant") and every > 1:
        # README: the checkpointed part's gradient hooks come in its recomputation, after
        # `every` took the hooks out; left out, never given to another step
        assert [{k: v for k, v in w.items() if not k.startswith("block")} for w in want] == got
    else:
        assert got == want
