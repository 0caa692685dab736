"""paddle: GradientMonitor's look at what a module keeps as its call ends (`ops.derived_from`)
leaves in the modules keeping a tensor made before their output with a long history of its
own: a running average kept without detach, the features of a deep body (helper-191's
FINDING 3: paddle numbers no grad node, so the walk could not stop where the output was made;
it walked the whole history at every call and, past its budget, left the module out for good,
warned that it kept its output). The look now stops after a few nodes."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

from unihook.recipes import GradientMonitor  # noqa: E402


class _Averaging(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)
        self.average = paddle.zeros([4])

    def forward(self, x: Any) -> Any:
        self.average = 0.9 * self.average + 0.1 * x.mean(0)  # (not detached)
        return self.fc(x) + 0.0 * self.average


class _Deep(paddle.nn.Layer):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.body = paddle.nn.Sequential(
            *[paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Tanh()) for _ in range(depth)]
        )
        self.head = paddle.nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        self.features = self.body(x)
        return self.head(self.features)


def _entries(
    model: Any, where: list[str], steps: int, make: Any
) -> tuple[list[set[str]], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with GradientMonitor(model, where=where) as monitor:
            for _ in range(steps):
                out = model(make())
                (out * out).sum().backward(retain_graph=True)  # (the average's history)
    said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
    return [set(entry) for entry in monitor.history], said


def test_a_running_average_kept_without_detach_is_no_keep() -> None:
    paddle.seed(0)
    weight = paddle.create_parameter([4], "float32")

    class Model(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.blk = _Averaging()
            self.head = paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.head(self.blk(x))

    entries, said = _entries(
        Model(), ["", "blk", "head"], 300, lambda: paddle.randn([3, 4]) * weight
    )
    assert not said and all("blk" in entry for entry in entries), said


def test_the_features_of_a_deep_body_kept_are_no_keep() -> None:
    paddle.seed(0)
    entries, said = _entries(_Deep(400), ["", "head"], 2, lambda: paddle.randn([3, 4]))
    assert not said and all("" in entry for entry in entries), said
