"""Measure what correct float32 ports reach: the numbers behind compare's default tolerance.

For each reference architecture of the test suite (torch model, its paddle twin, the same
weights), in train and in eval mode (Dropout always off), over a few seeds: the worst error of
any module output and of any module gradient (grad_output, grad_input), each relative to its
own tensor's max, as ``compare(..., rtol=1.0)`` reports them.

    python benchmarks/compare_tolerances.py [--seeds N]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

# Paddle's LSTM keeps no state for a backward in eval mode ("Tensor holds no memory"): train only.
TRAIN_ONLY = {"lstm"}


def worst(arch: str, train: bool, seeds: int) -> tuple[float, float]:
    from models_ref import ARCHS, build

    from unihook.recipes import compare

    spec = ARCHS[arch]
    out = grad = 0.0
    for seed in range(seeds):
        model, _, twin = build(spec, seed)
        model.train(train)
        twin.train() if train else twin.eval()
        for sub in model.modules():
            if type(sub).__name__ == "Dropout":
                sub.eval()
        for sub in twin.sublayers():
            if type(sub).__name__ == "Dropout":
                sub.eval()
        x = np.random.default_rng(seed).standard_normal(spec.input_shape).astype(np.float32)
        for row in compare(model, twin, x, rtol=1.0).rows():
            out = max(out, row["output_rel"])
            grad = max(grad, row["grad_output_rel"] or 0.0, row["grad_input_rel"] or 0.0)
    return out, grad


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from models_ref import ARCHS

    from unihook.recipes.compare import RTOL

    print(f"{'architecture':<14} {'mode':<6} {'outputs':>9} {'gradients':>9}   (rtol {RTOL:g})")
    for arch in ARCHS:
        for train in (True, False):
            if arch in TRAIN_ONLY and not train:
                continue
            out, grad = worst(arch, train, args.seeds)
            mode = "train" if train else "eval"
            print(f"{arch:<14} {mode:<6} {out:9.1e} {grad:9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
