"""The benchmark models, defined once and built identically in either framework.

Same architecture, shapes and module tree in torch, paddle and MindSpore (only default
initialisation differs, which does not change timing): the layers a backend's kit builds
(`fw.kit`: linear, conv2d, batchnorm2d, relu_module, sequential) and the few only the
benchmarks need (`frameworks.Framework`). No in-place op anywhere (torch's native
full backward hook, one of the compared variants, raises on an in-place op after a hooked
module), except in ``cnn(inplace=True)``, which only the forward capture case `capture_inplace`
runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frameworks import Framework


@dataclass(frozen=True)
class Sizes:
    """Model and input sizes; `smoke` shrinks everything for the test suite's run."""

    batch: int = 8
    image: int = 64  # CNN input: batch x 3 x image x image
    width: int = 16  # CNN channels: width, 2 width, 4 width, 8 width
    d_model: int = 256
    heads: int = 4
    seq: int = 64
    blocks: int = 4
    mlp_width: int = 256
    mlp_depth: int = 8
    mlp_batch: int = 64
    small_width: int = 16  # `small`: layers whose hooks cost more than their kernels

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            batch=2,
            image=16,
            width=4,
            d_model=32,
            heads=2,
            seq=8,
            blocks=2,
            mlp_width=16,
            mlp_depth=2,
            mlp_batch=4,
        )


def cnn(fw: Framework, s: Sizes, inplace: bool = False) -> Any:
    """4 x (conv 3x3 - BN - ReLU - maxpool 2) + flatten + linear, on batch x 3 x image x image.
    `inplace`: the ReLUs overwrite the BatchNorm outputs (torchvision style)."""
    kit = fw.kit
    stages = []
    c_in = 3
    for i in range(4):
        c_out = s.width * 2**i
        stages.append(
            kit.sequential(
                kit.conv2d(c_in, c_out, 3, padding=1),
                kit.batchnorm2d(c_out),
                fw.relu_inplace() if inplace else kit.relu_module(),
                kit.max_pool2d(2),
            )
        )
        c_in = c_out
    side = s.image // 16
    return kit.sequential(*stages, kit.flatten(), kit.linear(c_in * side * side, 10))


def cnn_input(fw: Framework, s: Sizes) -> Any:
    return fw.randn(s.batch, 3, s.image, s.image)


def transformer(fw: Framework, s: Sizes) -> Any:
    """`blocks` pre-LayerNorm blocks (attention, GELU MLP 4x), from Linear/LayerNorm/softmax."""
    kit = fw.kit

    class Attention(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.qkv = kit.linear(s.d_model, 3 * s.d_model)
            self.proj = kit.linear(s.d_model, s.d_model)
            self.scale = (s.d_model // s.heads) ** -0.5

        def forward(self, x: Any) -> Any:
            q, k, v = (fw.split_heads(t, s.heads) for t in fw.chunk3(self.qkv(x)))
            weights = fw.softmax(fw.matmul(q, k, transpose_b=True) * self.scale)
            return self.proj(fw.merge_heads(fw.matmul(weights, v)))

    class Block(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = fw.layer_norm(s.d_model)
            self.attn = Attention()
            self.ln2 = fw.layer_norm(s.d_model)
            self.mlp = kit.sequential(
                kit.linear(s.d_model, 4 * s.d_model),
                fw.gelu(),
                kit.linear(4 * s.d_model, s.d_model),
            )

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    return kit.sequential(*(Block() for _ in range(s.blocks)), fw.layer_norm(s.d_model))


def transformer_input(fw: Framework, s: Sizes) -> Any:
    return fw.randn(s.batch, s.seq, s.d_model)


def mlp(fw: Framework, s: Sizes) -> Any:
    """`mlp_depth` x (Linear(width, width) + ReLU)."""
    layers = []
    for _ in range(s.mlp_depth):
        layers += [fw.kit.linear(s.mlp_width, s.mlp_width), fw.kit.relu_module()]
    return fw.kit.sequential(*layers)


def mlp_input(fw: Framework, s: Sizes) -> Any:
    return fw.randn(s.mlp_batch, s.mlp_width)


def small(fw: Framework, s: Sizes) -> Any:
    """5 x (Linear(small_width, small_width) + ReLU): each hooked call's fixed cost shows."""
    layers = []
    for _ in range(5):
        layers += [fw.kit.linear(s.small_width, s.small_width), fw.kit.relu_module()]
    return fw.kit.sequential(*layers)


def small_input(fw: Framework, s: Sizes) -> Any:
    return fw.randn(s.batch, s.small_width)


def leaves(fw: Framework, model: Any) -> list[tuple[str, Any]]:
    """The (name, module) pairs of `model` that have no child module."""
    return [(n, m) for n, m in fw.named_modules(model) if not list(fw.children(m))]
