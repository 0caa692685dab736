"""Reference architectures built in both frameworks with identical weights (a test helper).

Torch models follow torchvision's module layout (so qualified names match torchvision's) and
keep torchvision's in-place ops (``ReLU(inplace=True)``, ``ReLU6(inplace=True)``,
``out += identity``); `without_inplace` turns a deep copy into the out-of-place twin that
torch's native module backward hooks accept (the oracle). The paddle side is
``paddle.vision.models`` where the layout matches (resnet18, mobilenet_v2, vgg11 with batch
norm), else a paddle twin written here. `copy_weights` copies torch -> paddle by qualified name:
Linear weights transposed to paddle's [in, out], BatchNorm running stats to ``_mean`` /
``_variance``, MultiheadAttention's packed ``in_proj`` split into q/k/v projections, LSTM
weights as they are (both frameworks use the gate order i, f, g, o).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

warnings.filterwarnings("ignore", message="No ccache found")
import paddle  # noqa: E402

__all__ = [
    "ARCHS",
    "Arch",
    "build",
    "copy_weights",
    "one_torch_thread",
    "param_pairs",
    "without_inplace",
]


# -- torch: torchvision layouts -----------------------------------------------------------------


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: one ReLU(inplace=True) called twice, `out += identity`."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride
        self.inplace = True  # `without_inplace` sets False: `out = out + identity`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        if self.inplace:
            out += identity
        else:
            out = out + identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision.models.resnet18's layout."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 2)
        self.layer2 = self._make_layer(128, 2, 2)
        self.layer3 = self._make_layer(256, 2, 2)
        self.layer4 = self._make_layer(512, 2, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation with BatchNorm2d and ReLU6(inplace=True)."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden, kernel=1))
        layers += [
            Conv2dNormActivation(hidden, hidden, stride=stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


MOBILENET_SCALE = 0.5  # paddle's `scale`, torchvision's `width_mult`: fewer channels, same layout


class MobileNetV2(nn.Module):
    """torchvision.models.mobilenet_v2's layout (the pooling is functional, as in torchvision)."""

    def __init__(self, num_classes: int = 10, width_mult: float = MOBILENET_SCALE) -> None:
        super().__init__()
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                   [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]  # fmt: skip
        cin = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [Conv2dNormActivation(3, cin, stride=2)]
        for t, c, n, s in setting:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(Conv2dNormActivation(cin, self.last_channel, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(self.last_channel, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


VGG_HIDDEN = 64  # torchvision's classifier is 25088 -> 4096 -> 4096: narrowed, same layout


class VGG(nn.Module):
    """torchvision.models.vgg11_bn's layout with a narrower classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                assert isinstance(v, int)
                layers += [
                    nn.Conv2d(cin, v, 3, padding=1),
                    nn.BatchNorm2d(v),
                    nn.ReLU(inplace=True),
                ]
                cin = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, VGG_HIDDEN), nn.ReLU(True), nn.Dropout(),
            nn.Linear(VGG_HIDDEN, VGG_HIDDEN), nn.ReLU(True), nn.Dropout(),
            nn.Linear(VGG_HIDDEN, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


class LSTMNet(nn.Module):
    """An LSTM whose nested ``(out, (h, c))`` output is all used downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1] + h[-1] * c[-1])


class PaddleLSTMNet(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = paddle.nn.LSTM(8, 16, num_layers=2)  # time_major=False: batch first
        self.head = paddle.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1] + h[-1] * c[-1])


# -- the two sides, the weights, the oracle ----------------------------------------------------


def without_inplace(model: nn.Module) -> nn.Module:
    """A deep copy with every in-place op replaced by its out-of-place twin (the oracle's model)."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    return twin


def _put(param: Any, value: np.ndarray) -> None:
    assert list(param.shape) == list(value.shape), (param.shape, value.shape)
    param.set_value(value.astype("float32"))


def copy_weights(src: nn.Module, dst: paddle.nn.Layer) -> None:
    """Copy every parameter and BatchNorm running statistic of `src` into `dst` by name."""
    targets = dict(dst.named_sublayers(include_self=True))
    for name, m in src.named_modules():
        own = {k: v.detach().numpy() for k, v in m.named_parameters(recurse=False)}
        own.update({k: v.numpy() for k, v in m.named_buffers(recurse=False)})
        if not own:
            continue
        t = targets[name]
        if isinstance(m, nn.MultiheadAttention):
            wq, wk, wv = np.split(own["in_proj_weight"], 3)
            bq, bk, bv = np.split(own["in_proj_bias"], 3)
            for proj, w, b in (("q_proj", wq, bq), ("k_proj", wk, bk), ("v_proj", wv, bv)):
                _put(getattr(t, proj).weight, w.T)
                _put(getattr(t, proj).bias, b)
        elif isinstance(m, nn.Linear):
            _put(t.weight, own["weight"].T)
            _put(t.bias, own["bias"])
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            _put(t.weight, own["weight"])
            _put(t.bias, own["bias"])
            _put(t._mean, own["running_mean"])
            _put(t._variance, own["running_var"])
        elif isinstance(m, (nn.Conv2d, nn.LayerNorm)):
            _put(t.weight, own["weight"])
            if "bias" in own:
                _put(t.bias, own["bias"])
        elif isinstance(m, nn.LSTM):
            state = t.state_dict()
            for k, v in own.items():
                _put(state[k], v)
        else:
            raise TypeError(f"copy_weights: no rule for {name!r} ({type(m).__name__})")


def param_pairs(
    src: nn.Module, dst: paddle.nn.Layer
) -> list[tuple[str, Any, Callable[[Any], np.ndarray]]]:
    """(torch parameter name, paddle parameter, paddle grad -> torch layout) for comparisons."""
    targets = dict(dst.named_sublayers(include_self=True))
    out: list[tuple[str, Any, Callable[[Any], np.ndarray]]] = []
    same: Callable[[Any], np.ndarray] = lambda g: g  # noqa: E731
    for name, m in src.named_modules():
        t = targets.get(name)
        for k, _ in m.named_parameters(recurse=False):
            full = f"{name}.{k}" if name else k
            if isinstance(m, nn.MultiheadAttention):
                continue  # compared through its q/k/v split below
            if isinstance(m, nn.LSTM):
                out.append((full, t.state_dict()[k], same))
            elif isinstance(m, nn.Linear) and k == "weight":
                out.append((full, t.weight, lambda g: g.T))
            else:
                out.append((full, getattr(t, k), same))
        if isinstance(m, nn.MultiheadAttention):
            ws = [getattr(t, p).weight for p in ("q_proj", "k_proj", "v_proj")]
            bs = [getattr(t, p).bias for p in ("q_proj", "k_proj", "v_proj")]
            out.append((f"{name}.in_proj_weight", ws, lambda gs: np.concatenate([g.T for g in gs])))
            out.append((f"{name}.in_proj_bias", bs, lambda gs: np.concatenate(gs)))
    return out


def _randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """BatchNorm/LayerNorm affine parameters and running stats away from 1/0 (else trivial)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm)):
                n = m.weight.shape
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)


@dataclass
class Arch:
    """One architecture: its builders, input shape, mode and the modules some tests single out."""

    name: str
    torch_model: Callable[[], nn.Module]
    paddle_model: Callable[[], paddle.nn.Layer]
    input_shape: tuple[int, ...]
    train: bool  # train mode (BatchNorm batch statistics); Dropout always in eval
    scale_module: str  # the module whose grad_input a hook doubles
    tensor_modules: tuple[str, ...]  # modules whose outputs get tensor hooks from forward hooks
    rtol: float  # max|paddle - torch| / max|torch| allowed; torch vs torch is always 1e-6
    paddle_skip: frozenset[str] = frozenset()  # modules that run on one side only
    halve_module: str = ""  # the module whose output a forward hook halves ("": scale_module)


def _transformer_torch() -> nn.Module:
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)


def _transformer_paddle() -> paddle.nn.Layer:
    return paddle.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0)


def _paddle_vgg() -> paddle.nn.Layer:
    from paddle.vision.models import vgg11

    model = vgg11(batch_norm=True, num_classes=10)
    pnn = paddle.nn
    model.classifier = pnn.Sequential(
        pnn.Linear(512 * 7 * 7, VGG_HIDDEN), pnn.ReLU(), pnn.Dropout(),
        pnn.Linear(VGG_HIDDEN, VGG_HIDDEN), pnn.ReLU(), pnn.Dropout(),
        pnn.Linear(VGG_HIDDEN, 10),
    )  # fmt: skip
    return model


def _paddle_resnet() -> paddle.nn.Layer:
    from paddle.vision.models import resnet18

    return resnet18(num_classes=10)


def _paddle_mobilenet() -> paddle.nn.Layer:
    from paddle.vision.models import mobilenet_v2

    return mobilenet_v2(scale=MOBILENET_SCALE, num_classes=10)


# Tolerances `rtol` (float32, CPU; max|paddle - torch| / max|torch| per tensor, measured by
# test_port without any hook): ResNet-18 1e-5, VGG-11-BN 4e-6, MobileNetV2 7e-5 (about 50
# train-mode BatchNorms in a row; 2.4e-4 with guided-backprop clamping on every ReLU6), LSTM
# 2.4e-7, Transformer 3e-7. Set at ~2-3x the measured figure: a wrong hook gradient is off by
# O(1).
ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        Arch(
            "resnet18",
            ResNet,
            _paddle_resnet,
            (4, 3, 48, 48),
            True,
            "layer2.0",
            ("bn1", "layer1.0.bn1", "layer1.0", "layer3.1.bn2"),
            3e-5,
        ),
        Arch(
            "mobilenet_v2",
            MobileNetV2,
            _paddle_mobilenet,
            (4, 3, 64, 64),
            True,
            "features.2.conv.1",
            ("features.0.1", "features.3", "features.3.conv.0.1"),
            5e-4,
            frozenset({"pool2d_avg"}),
            "features.2",
        ),
        Arch(
            "vgg11_bn",
            VGG,
            _paddle_vgg,
            (4, 3, 32, 32),
            True,
            "features.4",
            ("features.1", "features.5", "classifier.0"),
            2e-5,
            halve_module="classifier.0",
        ),
        Arch("lstm", LSTMNet, PaddleLSTMNet, (2, 5, 8), True, "lstm", ("lstm", "head"), 2e-6),
        Arch(
            "transformer",
            _transformer_torch,
            _transformer_paddle,
            (2, 5, 16),
            False,
            "norm1",
            ("self_attn", "norm1", "linear1"),
            2e-6,
            frozenset({"self_attn.out_proj"}),
        ),
    ]  # fmt: skip
}


def build(arch: Arch, seed: int = 0) -> tuple[nn.Module, nn.Module, paddle.nn.Layer]:
    """(torch model with in-place ops, its out-of-place oracle twin, the paddle twin)."""
    torch.manual_seed(seed)
    model = arch.torch_model()
    _randomize_norms(model, torch.Generator().manual_seed(seed + 1))
    paddle.seed(seed)
    twin = arch.paddle_model()
    copy_weights(model, twin)
    oracle = without_inplace(model)
    for m in (model, oracle):
        m.train(arch.train)
        for sub in m.modules():
            if isinstance(sub, nn.Dropout):
                sub.eval()
    twin.train() if arch.train else twin.eval()
    for sub in twin.sublayers():
        if isinstance(sub, paddle.nn.Dropout):
            sub.eval()
    return model, oracle, twin


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread, its count restored after: the same numbers in every run, and no
    slowdown from oversubscribed cores (the kits have no thread setting: torch's own here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
