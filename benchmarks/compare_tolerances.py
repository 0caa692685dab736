"""Measure what correct float32 ports reach: the numbers behind compare's default tolerance.

For each reference architecture of the test suite (torch model, its paddle twin, the same
weights), in train and in eval mode (Dropout always off), over a few seeds: the worst error of
any module output and of any module gradient (grad_output, grad_input), each relative to its
own tensor's max (floored as compare floors it), as ``compare`` reports them, leaving aside
a kink flipped by rounding (a ReLU input within rounding of 0 on the other side in one
framework: a few elements, and the gradients behind it); and how many seeds fail at the
default tolerance on such a kink ("kinks") and otherwise ("failed": should be 0).

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


def worst(arch: str, train: bool, seeds: int) -> tuple[float, float, int, int]:
    """The worst output and gradient error over `seeds`, leaving aside a kink flipped by
    rounding (a failure in a few elements, its note says so, and everything behind it in
    backward order), and how many seeds fail at the default tolerance: (outputs, gradients,
    seeds failing on a kink, seeds failing otherwise)."""
    from models_ref import ARCHS, build

    from unihook.recipes import compare
    from unihook.recipes.compare import KINK_NOTE, NOISE_NOTE_REF

    spec = ARCHS[arch]
    out = grad = 0.0
    kinks = others = 0
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
        report = compare(model, twin, x)
        kinked = False
        # (a check the float64 references excused is the rounding a model amplifies, not
        # a tolerance's measure: left aside, as a kink)
        for row in report.table:
            if not row.output.note.startswith(NOISE_NOTE_REF):
                out = max(out, row.output.rel)
        for row in report.backward_order:  # in backward order: a kink spoils what follows
            diffs = [d for d in (row.grad_output, row.grad_input) if d is not None]
            kinked = kinked or any(d.failed and KINK_NOTE in d.note for d in diffs)
            if not kinked:
                kept = [d.rel for d in diffs if not d.note.startswith(NOISE_NOTE_REF)]
                grad = max([grad, *kept])
        if not report.ok:
            if kinked and report.first_forward is None:
                kinks += 1
            else:
                others += 1
    return out, grad, kinks, others


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from models_ref import ARCHS

    from unihook.recipes.compare import RTOL

    print(
        f"{'architecture':<14} {'mode':<6} {'outputs':>9} {'gradients':>9} "
        f"{'kinks':>6} {'failed':>6}   (rtol {RTOL:g}, {args.seeds} seeds)"
    )
    for arch in ARCHS:
        for train in (True, False):
            if arch in TRAIN_ONLY and not train:
                continue
            out, grad, kinks, others = worst(arch, train, args.seeds)
            mode = "train" if train else "eval"
            print(f"{arch:<14} {mode:<6} {out:9.1e} {grad:9.1e} {kinks:6d} {others:6d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
