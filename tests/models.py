"""Models built identically in every framework through the conformance kits, with weights
drawn once in numpy (torch layout) and copied."""

from __future__ import annotations

from typing import Any

import numpy as np

from unihook import ops


def classifier(kit: Any, seed: int = 0, classes: int = 3) -> Any:
    """layer1 (conv 3->4, ReLU) -> layer4 (conv 4->6, ReLU) -> global average -> fc."""
    rng = np.random.default_rng(seed)

    def conv(c_in: int, c_out: int) -> Any:
        layer = kit.conv2d(c_in, c_out, 3, padding=1)
        kit.set_value(layer.weight, rng.normal(0, 0.4, (c_out, c_in, 3, 3)))
        kit.set_value(layer.bias, rng.normal(0, 0.1, (c_out,)))
        return layer

    layer1 = kit.sequential(conv(3, 4), kit.relu_module())
    layer4 = kit.sequential(conv(4, 6), kit.relu_module())
    fc = kit.linear(6, classes, rng.normal(0, 0.5, (classes, 6)), rng.normal(0, 0.1, (classes,)))
    return kit.module(
        lambda self, x: self.fc(ops.mean(self.layer4(self.layer1(x)), axis=(2, 3))),
        {"layer1": layer1, "layer4": layer4, "fc": fc},
    )


def images(kit: Any, n: int = 2, size: int = 8, requires_grad: bool = False) -> Any:
    rng = np.random.default_rng(42)
    return kit.tensor(rng.normal(0, 1, (n, 3, size, size)), requires_grad=requires_grad)
