"""compare's module alignment (issue 14, helper-129's FINDINGS 1, 2 and 8): a port with an extra
module, a Sequential whose indices shifted, a renamed ModuleList. A correct port is `ok` with
every module paired to its counterpart; a mistake is named at its module."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import paddle
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unihook.recipes import compare, copy_weights
from unihook.recipes._align import align

pnn = paddle.nn


def batch(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- the longest common subsequence --------------------------------------------------------


def lcs_length(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, j in itertools.product(reversed(range(len(a))), reversed(range(len(b)))):
        table[i][j] = (
            table[i + 1][j + 1] + 1 if a[i] == b[j] else max(table[i + 1][j], table[i][j + 1])
        )
    return table[0][0]


types = st.lists(st.sampled_from(["Linear", "ReLU", "Conv2d", "Dropout"]), max_size=14)


@settings(max_examples=300, deadline=None)
@given(types, types)
def test_order_pairs_a_longest_common_subsequence_of_the_types(a: list[str], b: list[str]) -> None:
    called_a = [(f"a{i}", t) for i, t in enumerate(a)]
    called_b = [(f"b{i}", t) for i, t in enumerate(b)]
    # ("" missing on purpose: the order rule then pairs everything by type)
    pairs, rule = align(called_a, called_b)
    assert rule == ("order" if a and b else "name")
    index_a = {n: i for i, (n, _) in enumerate(called_a)}
    index_b = {n: i for i, (n, _) in enumerate(called_b)}
    typed = [(index_a[x], index_b[y]) for x, y in pairs if a[index_a[x]] == b[index_b[y]]]
    # the pairs of one type are a common subsequence (increasing on both sides) of the longest
    # length; pairs across types only fill a gap one to one
    assert len(typed) == lcs_length(a, b)
    ordered = sorted(index_a[x] for x, _ in pairs)
    assert [index_b[dict(pairs)[f"a{i}"]] for i in ordered] == sorted(index_b[y] for _, y in pairs)


def test_a_long_renamed_model_aligns_by_order_quickly() -> None:
    kinds = ["Conv2d", "BatchNorm2d", "ReLU"] * 1000
    called_a = [(f"features.{i}", t) for i, t in enumerate(kinds)]
    called_b = [(f"stem_{i}", t) for i, t in enumerate(kinds[:1500] + ["Identity"] + kinds[1500:])]
    pairs, rule = align(called_a, called_b)
    assert rule == "order" and len(pairs) == 3000
    assert dict(pairs)["features.1499"] == "stem_1499"
    assert dict(pairs)["features.1500"] == "stem_1501"


# -- an extra module in a renamed port (FINDING 1) --------------------------------------------


class PaddleWithDropout(pnn.Layer):  # torch's Sequential of three Linears, renamed, + Dropout
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.drop = pnn.Linear(8, 8), pnn.Dropout(0.1)
        self.fc2, self.fc3 = pnn.Linear(8, 8), pnn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return self.fc3(self.fc2(self.drop(self.fc1(x))))


def test_an_extra_module_in_a_renamed_port_does_not_shift_the_pairs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)).eval()
    twin = PaddleWithDropout()
    twin.eval()
    copy_weights(model, twin, layer_map={"0": "fc1", "1": "fc2", "2": "fc3"})
    report = compare(model, twin, batch((6, 8)))
    assert report.ok and report.rule == "order", str(report)
    assert report.pairs == [("0", "fc1"), ("1", "fc2"), ("2", "fc3"), ("", "")]
    assert report.unpaired_b == ["drop"]
    twin.fc2.weight.set_value(twin.fc2.weight.numpy() * 1.01)
    report = compare(model, twin, batch((6, 8)))
    assert report.first_forward == "1" and report.first_parameter == "1.weight"


# -- a Sequential whose indices shifted (FINDING 2) ------------------------------------------


class TorchHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


class PaddleHead(pnn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.head = pnn.Sequential(pnn.Linear(4, 8), pnn.Dropout(0.1), pnn.ReLU(), pnn.Linear(8, 4))

    def forward(self, x: Any) -> Any:
        return self.head(x)


def test_a_shared_name_on_modules_of_other_types_is_paired_by_order() -> None:
    torch.manual_seed(0)
    model, twin = TorchHead().eval(), PaddleHead()
    twin.eval()
    copy_weights(model, twin, layer_map={"head.2": "head.3"})
    report = compare(model, twin, batch((6, 4)))
    assert report.ok and report.rule == "name", str(report)
    assert ("head.1", "head.2") in report.pairs and ("head.2", "head.3") in report.pairs
    assert report.unpaired_b == ["head.1"]


# -- a renamed ModuleList (FINDING 8) ---------------------------------------------------------


class TorchBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class PaddleBlock(pnn.Layer):
    def __init__(self, approximate: bool = False) -> None:
        super().__init__()
        self.fc, self.act = pnn.Linear(8, 8), pnn.GELU(approximate=approximate)

    def forward(self, x: Any) -> Any:
        return x + self.act(self.fc(x))


class TorchLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Tanh())
        self.layers = nn.ModuleList([TorchBlock(), TorchBlock()])
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class PaddleBlocks(pnn.Layer):  # torch's `layers` named `blocks`
    def __init__(self, approximate: bool = False) -> None:
        super().__init__()
        self.stem = pnn.Sequential(pnn.Linear(8, 8), pnn.LayerNorm(8), pnn.Tanh())
        self.blocks = pnn.LayerList([PaddleBlock(approximate), PaddleBlock()])
        self.norm, self.head = pnn.LayerNorm(8), pnn.Linear(8, 3)

    def forward(self, x: Any) -> Any:
        x = self.stem(x)
        for layer in self.blocks:
            x = layer(x)
        return self.head(self.norm(x))


@pytest.mark.parametrize("layer_map", [None, {"layers": "blocks"}])
def test_a_renamed_module_list_pairs_its_blocks(layer_map: Any) -> None:
    torch.manual_seed(0)
    model = TorchLayers().eval()
    x = 3 * batch((16, 8))
    twin = PaddleBlocks()
    twin.eval()
    copy_weights(model, twin, layer_map={"layers": "blocks"})
    report = compare(model, twin, x, layer_map=layer_map)
    assert report.ok and report.unpaired_a == [] and report.unpaired_b == [], str(report)
    assert ("layers.0.act", "blocks.0.act") in report.pairs
    wrong = PaddleBlocks(approximate=True)  # block 0's GELU tanh-approximated
    wrong.eval()
    copy_weights(model, wrong, layer_map={"layers": "blocks"})
    report = compare(model, wrong, x, layer_map=layer_map)
    assert report.first_forward == "layers.0.act", str(report)


# -- dict outputs whose keys differ (FINDING 7) -----------------------------------------------


class TorchDictHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"cls": self.a(x), "reg": self.b(x)}


class PaddleDictHead(pnn.Layer):
    def __init__(self, keys: tuple[str, str]) -> None:
        super().__init__()
        self.a, self.b, self.keys = pnn.Linear(4, 5), pnn.Linear(4, 5), keys

    def forward(self, x: Any) -> Any:
        return {self.keys[0]: self.a(x), self.keys[1]: self.b(x)}


@pytest.mark.parametrize("keys", [("cls", "reg"), ("score", "bbox")])
def test_dict_outputs_with_other_keys_are_a_structural_divergence(
    keys: tuple[str, str], tmp_path: Any
) -> None:
    from unihook.recipes import compare_dumps, dump

    torch.manual_seed(0)
    model, twin = TorchDictHead(), PaddleDictHead(keys)
    copy_weights(model, twin)
    x = batch((4, 4))
    loss = (lambda o: o["cls"].sum() + o["reg"].sum(), lambda o: sum(v.sum() for v in o.values()))
    dump(model, x, tmp_path / "a.npz", loss=loss[0])
    dump(twin, x, tmp_path / "b.npz", loss=loss[1])
    for report in (
        compare(model, twin, x, loss=loss),
        compare_dumps(tmp_path / "a.npz", tmp_path / "b.npz"),
    ):
        if keys == ("cls", "reg"):
            assert report.ok, str(report)
            continue
        assert report.first_forward == "", str(report)
        (row,) = [r for r in report.table if r.name_a == ""]
        assert row.output.note == "dict keys {cls, reg} vs {bbox, score}"


# -- an index shift onto modules of the same type (helper-133's FINDING A) --------------------


def test_an_index_shift_onto_modules_of_the_same_type_pairs_by_order() -> None:
    a = [("0", "Linear"), ("1", "ReLU"), ("2", "Linear"), ("3", "Linear"), ("", "Sequential")]
    b = [("0", "Linear"), ("1", "ReLU"), ("2", "Dropout"), ("3", "Linear"), ("4", "Linear"),
         ("", "Sequential")]  # fmt: skip
    pairs, rule = align(a, b)
    assert rule == "name" and pairs == [("0", "0"), ("1", "1"), ("2", "3"), ("3", "4"), ("", "")]


def test_children_pair_by_name_only_under_parents_paired_by_name() -> None:
    # Sequential(Enc, Dec) against Sequential(Identity, Enc, Dec): a's 1.fc is b's 2.fc
    a = [("0.fc", "Linear"), ("0", "Enc"), ("1.fc", "Linear"), ("1", "Dec"), ("", "Sequential")]
    b = [("0", "Identity"), ("1.fc", "Linear"), ("1", "Enc"), ("2.fc", "Linear"), ("2", "Dec"),
         ("", "Sequential")]  # fmt: skip
    pairs, _ = align(a, b)
    assert pairs == [("0.fc", "1.fc"), ("0", "1"), ("1.fc", "2.fc"), ("1", "2"), ("", "")]


def test_a_module_list_shifted_by_an_inserted_block_pairs_its_blocks() -> None:
    kinds = ["BlockA", "BlockA", "BlockB"]
    a = [x for i, k in enumerate(kinds) for x in ((f"layers.{i}.fc", "Linear"), (f"layers.{i}", k))]
    b = [("layers.0", "Identity")] + [
        x
        for i, k in enumerate(kinds)
        for x in ((f"layers.{i + 1}.fc", "Linear"), (f"layers.{i + 1}", k))
    ]
    pairs, _ = align([*a, ("head", "Linear"), ("", "Net")], [*b, ("head", "Linear"), ("", "Net")])
    assert dict(pairs) == {
        **{f"layers.{i}": f"layers.{i + 1}" for i in range(3)},
        **{f"layers.{i}.fc": f"layers.{i + 1}.fc" for i in range(3)},
        "head": "head",
        "": "",
    }


def test_a_sequential_shifted_onto_the_same_types_is_ok() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 4)).eval()
    twin = pnn.Sequential(
        pnn.Linear(4, 8), pnn.ReLU(), pnn.Dropout(0.1), pnn.Linear(8, 8), pnn.Linear(8, 4)
    )
    twin.eval()
    copy_weights(model, twin, layer_map={"2": "3", "3": "4"})
    report = compare(model, twin, batch((6, 4)))
    assert report.ok and report.unpaired_b == ["2"], str(report)


# -- a port running a block's shortcut first (helper-133's FINDING D) -------------------------


class TorchDownBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(4, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU()
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, 1, 1), nn.BatchNorm2d(8)
        self.downsample = nn.Sequential(nn.Conv2d(4, 8, 1, 2), nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + self.downsample(x)


class PaddleShortcutFirst(pnn.Layer):  # renamed, flat, and the shortcut computed first
    def __init__(self) -> None:
        super().__init__()
        self.c_a, self.n_a, self.act = pnn.Conv2D(4, 8, 3, 2, 1), pnn.BatchNorm2D(8), pnn.ReLU()
        self.c_b, self.n_b = pnn.Conv2D(8, 8, 3, 1, 1), pnn.BatchNorm2D(8)
        self.short_conv, self.short_bn = pnn.Conv2D(4, 8, 1, 2), pnn.BatchNorm2D(8)

    def forward(self, x: Any) -> Any:
        shortcut = self.short_bn(self.short_conv(x))
        return self.n_b(self.c_b(self.act(self.n_a(self.c_a(x))))) + shortcut


def test_a_shortcut_run_first_pairs_by_parameter_shapes() -> None:
    torch.manual_seed(0)
    model, twin = TorchDownBlock().eval(), PaddleShortcutFirst()
    twin.eval()
    names = {"conv1": "c_a", "bn1": "n_a", "conv2": "c_b", "bn2": "n_b",
             "downsample.0": "short_conv", "downsample.1": "short_bn"}  # fmt: skip
    copy_weights(model, twin, layer_map=names)
    report = compare(model, twin, batch((2, 4, 8, 8)))
    assert report.ok and report.rule == "order", str(report)
    assert {**names, "relu": "act", "": ""} == dict(report.pairs)


def test_modules_with_other_parameter_shapes_never_pair() -> None:
    # a port computing the 1x1 branch first: its convs cross (helper-134's FINDING 3: the
    # gap step paired the 3x3 conv with the 1x1)
    a = [("s.c3", "Conv2d"), ("s.b3", "BatchNorm2d"), ("s.c1", "Conv2d"), ("s.b1", "BatchNorm2d"),
         ("", "Net")]  # fmt: skip
    b = [("one", "Conv2d"), ("one_bn", "BatchNorm2d"), ("three", "Conv2d"),
         ("three_bn", "BatchNorm2d"), ("", "Net")]  # fmt: skip
    norm = ((8,), (8,), (8,), (8,))
    weights_a = {"s.c3": ((3, 3, 3, 8), (8,)), "s.c1": ((1, 1, 3, 8), (8,)), "s.b3": norm,
                 "s.b1": norm}  # fmt: skip
    weights_b = {"three": ((3, 3, 3, 8), (8,)), "one": ((1, 1, 3, 8), (8,)), "one_bn": norm,
                 "three_bn": norm}  # fmt: skip
    pairs = dict(align(a, b, weights=(weights_a, weights_b))[0])
    assert pairs["s.c3"] == "three" and pairs["s.c1"] == "one"


def test_a_layer_map_of_a_module_list_across_an_index_shift_is_left_to_the_rules() -> None:
    # (helper-134's FINDING 4: the names were paired across the shift, a block with a Dropout)
    a = [x for i in range(3) for x in ((f"blocks.{i}.fc", "Linear"), (f"blocks.{i}", "Blk"))]
    b = [("layers.0.fc", "Linear"), ("layers.0", "Blk"), ("layers.1", "Dropout")] + [
        x for i in (2, 3) for x in ((f"layers.{i}.fc", "Linear"), (f"layers.{i}", "Blk"))
    ]
    for layer_map in (None, {"blocks": "layers"}):
        pairs = dict(align([*a, ("", "Net")], [*b, ("", "Net")], layer_map)[0])
        assert pairs["blocks.1"] == "layers.2" and pairs["blocks.2.fc"] == "layers.3.fc"
