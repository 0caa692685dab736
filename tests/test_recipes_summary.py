"""summary(model, *inputs): the same table for the same architecture in torch and paddle
(tests/models_ref.py twins), through forward hooks only."""

from __future__ import annotations

import collections

import numpy as np
import paddle
import pytest
import torch
from models_ref import ARCHS, build

from unihook.recipes import summary
from unihook.recipes.summary import type_name


def inputs(arch: str) -> tuple[torch.Tensor, paddle.Tensor]:
    x = np.random.default_rng(0).normal(0, 1, ARCHS[arch].input_shape).astype(np.float32)
    return torch.tensor(x), paddle.to_tensor(x)


def no_hooks(model: torch.nn.Module) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("arch", ["resnet18", "vgg11_bn"])
def test_same_table_on_both_frameworks(arch: str) -> None:
    """Identical tables, text included, under no_grad; in-place ReLUs called twice per block
    (ResNet) get a row per call."""
    model, _, twin = build(ARCHS[arch])
    x, y = inputs(arch)
    with torch.no_grad():
        ours = summary(model, x)
    with paddle.no_grad():
        theirs = summary(twin, y)
    assert str(ours) == str(theirs)
    assert ours.total_params == sum(p.numel() for p in model.parameters())
    assert ours.trainable_params == ours.total_params
    assert no_hooks(model)
    rows = {(r.name, r.call): r for r in ours.rows}
    assert rows[("", 0)].params == ours.total_params and rows[("", 0)].depth == 0
    if arch == "resnet18":
        relu = rows[("layer1.0.relu", 1)]  # the block's second call of its relu
        assert relu.type == "ReLU" and relu.output_shapes == [[4, 64, 12, 12]]
        assert rows[("layer1.0.conv1", 0)].type == "Conv2d"
        assert rows[("layer1.0.conv1", 0)].params == 64 * 64 * 9
        assert rows[("bn1", 0)].params == 128  # weight and bias: running statistics are not
        assert "(call 2)" in str(ours) and "(shared)" in str(ours)
        assert [r.name for r in ours.rows[:4]] == ["", "conv1", "bn1", "relu"]


def test_mobilenet_and_transformer_agree_where_the_classes_agree() -> None:
    """torchvision's Conv2dNormActivation is paddle's ConvNormActivation, and paddle's
    attention has q/k/v sublayers: the shapes and counts of every common module agree."""
    for arch in ("mobilenet_v2", "transformer"):
        model, _, twin = build(ARCHS[arch])
        x, y = inputs(arch)
        ours = {(r.name, r.call): r for r in summary(model, x).rows}
        theirs = {(r.name, r.call): r for r in summary(twin, y).rows}
        common = set(ours) & set(theirs)
        assert len(common) >= 0.95 * len(ours)
        for key in common:
            a, b = ours[key], theirs[key]
            assert (a.output_shapes, a.params, a.trainable) == (
                b.output_shapes,
                b.params,
                b.trainable,
            ), key


def test_frozen_parameters_namedtuple_outputs_and_names() -> None:
    pair = collections.namedtuple("pair", "a b")

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 4)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> pair:
            h = self.linear(x)
            return pair(self.head(h), h)

    model = Twice()
    model.linear.weight.requires_grad_(False)
    table = summary(model, torch.ones(5, 3))
    root = table.rows[0]
    assert root.output_shapes == [[5, 2], [5, 4]]
    assert root.trainable == "partial" and root.params == 16 + 10
    assert table.trainable_params == 4 + 10
    assert "Non-trainable params: 12" in str(table)
    assert type_name(paddle.nn.Conv2D(1, 1, 1)) == "Conv2d"
    assert type_name(paddle.nn.BatchNorm1D(2)) == "BatchNorm1d"
    assert type_name(paddle.nn.LayerList()) == "ModuleList"


def test_legacy_paddle_batch_norm_statistics_are_not_parameters() -> None:
    # paddle.nn.BatchNorm (PaddleClas / PaddleOCR style) is no _BatchNormBase: its _mean and
    # _variance are running statistics all the same (helper-129's FINDING 3)
    twin = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm(4))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    ours, theirs = summary(twin, paddle.ones([2, 3, 8, 8])), summary(model, torch.ones(2, 3, 8, 8))
    assert ours.total_params == theirs.total_params == 120
    assert ours.trainable_params == 120 and ours.rows[2].params == 8
    assert ours.rows[2].trainable == "yes"
    # named as torch's class for its input's rank: the twins' tables are the same text
    assert str(ours) == str(theirs)
    flat = summary(paddle.nn.Sequential(paddle.nn.BatchNorm(4)), paddle.ones([2, 4]))
    assert flat.rows[1].type == "BatchNorm1d"
