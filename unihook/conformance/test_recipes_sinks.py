"""The recipes' sinks and pictures (issue 14, item 8): TensorBoard event files written through
tensorboardX from either framework, read back here; plots rendered to files."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihook.recipes import ActivationStats, GradientMonitor, plot, summary_writer
from unihook.testing import classifier, images

event_pb2: Any = pytest.importorskip("tensorboardX.proto.event_pb2")


def read_events(logdir: Path) -> list[Any]:
    """Every Event in the TFRecord files of `logdir` (length, crc, data, crc per record)."""
    events = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[at + 12 : at + 12 + length])
            events.append(event)
            at += 12 + length + 4
    return events


def train(backend: Any, steps: int, every: int, writer: Any) -> tuple[Any, Any, list[bool]]:
    model = classifier(backend)
    step = backend.sgd(model, 0.1)
    stats = ActivationStats(model, every=every)
    monitor = GradientMonitor(model, every=every)
    written = []
    for i in range(steps):
        step((model(images(backend)) ** 2).sum())
        written.append(stats.write(writer, i) and monitor.write(writer, i))
    stats.remove()
    monitor.remove()
    return stats, monitor, written


def test_tensorboard_event_file(backend: Any, tmp_path: Path) -> None:
    """Scalars per module and step hold the recipes' numbers (TensorBoard stores float32);
    histograms across modules; off-steps of every=2 write nothing."""
    writer = summary_writer(str(tmp_path))
    stats, monitor, written = train(backend, 4, 2, writer)
    writer.close()
    assert written == [True, False, True, False]
    scalars: dict[tuple[str, int], float] = {}
    histograms: dict[tuple[str, int], Any] = {}
    for event in read_events(tmp_path):
        for value in event.summary.value:
            if value.HasField("histo"):
                histograms[(value.tag, event.step)] = value.histo
            else:
                scalars[(value.tag, event.step)] = value.simple_value
    assert len(stats.history) == len(monitor.history) == 2
    for index, step in enumerate((0, 2)):
        for name, row in stats.history[index].items():
            for key in ("mean", "std", "min", "max", "zeros"):
                got = scalars[(f"activations/{name or '_model_'}/{key}", step)]
                assert got == pytest.approx(row[key], rel=1e-6, abs=1e-30)
        for name, norm in monitor.history[index].items():
            assert scalars[(f"gradients/{name or '_model_'}/norm", step)] == pytest.approx(
                norm, rel=1e-6
            )
        assert histograms[("gradients/norm", step)].num == len(monitor.history[index])
        assert histograms[("activations/std", step)].num == len(stats.history[index])
    assert not any(step in (1, 3) for _, step in scalars)


def test_tensorboard_tags_are_one_per_module(backend: Any, tmp_path: Path) -> None:
    """A module whose name TensorBoard cleans ("odd name") beside one named as the cleaned
    name, and a submodule named like the model's tag: each its own curve, the names that need
    no cleaning and the model keeping theirs (helper-125's FINDING 3: one curve for two)."""
    renamed = backend.module(
        lambda self, x: getattr(self, "odd name")(self.odd_name(self._model_(x))), {}
    )
    children = (backend.relu_module(), backend.linear(2, 2), backend.relu_module())
    for name, module in zip(("odd name", "odd_name", "_model_"), children):
        backend.add_module(renamed, name, module)
    writer = summary_writer(str(tmp_path))
    with ActivationStats(renamed) as stats:
        renamed(backend.tensor([[1.0, -2.0]]))
        stats.write(writer, step=0)
    writer.close()
    tags = {value.tag for event in read_events(tmp_path) for value in event.summary.value}
    means = {tag for tag in tags if tag.endswith("/mean") and tag.count("/") == 2}
    assert means == {
        f"activations/{name}/mean" for name in ("_model_", "odd_name", "odd_name_2", "_model__2")
    }


def test_tensorboard_tags_stay_from_step_to_step(tmp_path: Path) -> None:
    """A module absent from a step (a head called every other step) moves no other module's
    tag: each keeps its tag for the recipe's life (helper-126's FINDING 1: "odd?name"'s curve
    alternated with "odd name"'s)."""
    from unihook.recipes.sinks import tags

    known: dict[str, str] = {}
    first = tags(["", "odd name", "odd?name"], known)
    assert tags(["", "odd?name"], known) == [first[0], first[2]]
    assert tags(["odd_name", "", "odd name"], known) == ["odd_name_3", first[0], first[1]]


def test_history_holds_each_forward_alone(backend: Any) -> None:
    model = classifier(backend)
    x = images(backend)
    with ActivationStats(model, max_history=2) as stats:
        for scale in (1.0, 2.0, 3.0):
            model(x * scale)
    assert len(stats.history) == 2  # max_history
    with ActivationStats(model) as alone:
        model(x * 3.0)
    last = {r["name"]: r for r in alone.rows()}
    for name, row in stats.history[-1].items():
        for key in ("calls", "mean", "std", "min", "max", "zeros"):
            assert row[key] == pytest.approx(last[name][key], rel=1e-6), (name, key)
    overall = {r["name"]: r for r in stats.rows()}
    assert overall["fc"]["calls"] == 3 and stats.history[-1]["fc"]["calls"] == 1


def test_plot_renders_to_a_file(backend: Any, tmp_path: Path) -> None:
    stats, monitor, _ = train(backend, 5, 1, _Null())
    path = tmp_path / "training.png"
    figure = plot(stats=stats, monitor=monitor, path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    axes = figure.get_axes()
    assert [a.get_title() for a in axes] == [
        "activation mean",
        "activation std",
        "fraction of zeros",
        "gradient norm (grad_output)",
    ]
    lines = axes[3].get_lines()
    assert len(lines) == len(monitor.history[-1])
    label = lines[0].get_label()
    name = "" if label == "(model)" else label
    np.testing.assert_allclose(lines[0].get_ydata(), [h[name] for h in monitor.history])
    stats.plot(str(tmp_path / "stats.svg"))
    assert (tmp_path / "stats.svg").read_text().startswith("<?xml")
    with pytest.raises(ValueError, match="pass an ActivationStats"):
        plot()


class _Null:
    def add_scalar(self, *args: Any) -> None:
        pass

    def add_histogram(self, *args: Any) -> None:
        pass


def test_monitor_and_stats_on_tuple_outputs_and_under_no_grad(backend: Any) -> None:
    """A namedtuple output: both tensors' gradients count in the module's norm. Under no_grad
    the monitor records nothing and raises nothing; ActivationStats still records."""
    import collections

    pair = collections.namedtuple("pair", "a b")
    inner = backend.module(lambda self, x: pair(x * 2, x * 3))
    model = backend.module(lambda self, x: sum(self.inner(x)), {"inner": inner})
    x = backend.tensor([[1.0, -2.0]], requires_grad=True)
    with GradientMonitor(model) as monitor, ActivationStats(model) as stats:
        backend.backward(model(x).sum())
        with backend.no_grad():
            model(x)
    assert len(monitor.history) == 1
    # the output's gradient is 1 everywhere; each of the two outputs gets 1 per element
    assert monitor.history[0]["inner"] == pytest.approx(np.sqrt(4.0))
    assert monitor.history[0][""] == pytest.approx(np.sqrt(2.0))
    rows = {r["name"]: r for r in stats.rows()}
    assert rows["inner"]["calls"] == 2 and len(stats.history) == 2
    assert rows["inner"]["mean"] == pytest.approx(np.mean([2, -4, 3, -6]))
