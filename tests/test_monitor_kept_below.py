"""GradientMonitor with ``where=``: an output kept on a module inside a monitored one that
``where`` leaves out, read and dropped before the forward ends (helper-97's FINDING 2 (a)).

Its gradient sums the reads of the kept tensor where torch's hook on the monitored module sees
only what comes through the output it returned: the monitored module is left out, warned, as
where every module is monitored (until 2026-12-07 its entry was that sum, silently: 29.31
where torch's is 4.01). torch's side, against its own hooks: tests/test_attack_h97.py."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from unihook.recipes import GradientMonitor

paddle = pytest.importorskip("paddle")
nn = paddle.nn


class _Inner(nn.Layer):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.keep = keep

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        if self.keep:
            self.out = y
        return y


class _Blk(nn.Layer):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.k = _Inner(keep)

    def forward(self, x: Any) -> Any:
        return self.k(x)


class _Hidden(nn.Layer):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.blk = _Blk(keep)
        self.head = nn.Linear(4, 4)
        self.keep = keep

    def forward(self, x: Any) -> Any:
        h = self.blk(x)
        out = self.head(paddle.tanh(h))
        if self.keep:
            out = out + 3 * self.blk.k.out
            self.blk.k.out = None
        return out


def _step(keep: bool) -> tuple[dict[str, float], list[str], Any]:
    paddle.seed(0)
    model = _Hidden(keep)
    monitor = GradientMonitor(model, where=["blk", "head"])
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(3, 4)).astype("float32"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x).square().sum().backward()
    monitor.remove()
    said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
    return monitor.history[-1], said, model


def test_an_output_kept_inside_and_dropped_leaves_the_monitored_module_out() -> None:
    step, said, _ = _step(keep=True)
    assert "blk" not in step
    assert any("'blk'" in message for message in said)
    assert "head" in step


def test_nothing_kept_inside_leaves_nothing_out() -> None:
    step, said, model = _step(keep=False)
    assert said == []
    assert set(step) == {"blk", "head"}
    # the gradient at blk's output: d(sum(head(tanh(h))^2))/dh, by hand
    paddle.seed(0)
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(3, 4)).astype("float32"))
    h = model.blk(x).detach()
    h.stop_gradient = False
    model.head(paddle.tanh(h)).square().sum().backward()
    assert step["blk"] == pytest.approx(float(np.linalg.norm(h.grad.numpy())), rel=1e-5)


@pytest.mark.parametrize("where", [["blk", "head"], "*"])
def test_a_keeper_set_in_after_the_monitor_was_made_leaves_the_monitored_module_out(
    where: Any,
) -> None:
    """The modules inside are looked in as they are at each call: one a user sets in after
    the monitor was made too (until 2026-12-07 the look took those at the placement, and
    recorded the sum: helper-178's FINDING 3), also where `where` chose every module (the
    look was skipped there: helper-179's FINDING 3)."""
    paddle.seed(0)
    model = _Hidden(keep=False)
    monitor = GradientMonitor(model, where=where)
    model.blk.k = _Inner(keep=True)
    model.keep = True
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(3, 4)).astype("float32"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x).square().sum().backward()
    monitor.remove()
    assert "blk" not in monitor.history[-1]
    assert any("'blk'" in str(w.message) for w in caught)
