"""Instructions per training step, counted by callgrind: a measure this shared VM's load does
not move (its wall clock spreads by more than the 1.02x the backward target asks about).

    python benchmarks/instructions.py [--model cnn|linears] [--framework torch|paddle]

For each variant (plain; a no-op full backward hook on every leaf module, torch's native one
and unihook's) it runs this file under ``valgrind --tool=callgrind`` twice, with `few` and `many`
forward + backward steps after the same warm-up, and reports (instructions(many) -
instructions(few)) / (many - few): the per-step count without the imports and set-up. Each run
has ``PYTHONHASHSEED=0`` (a random seed moves the per-step counts by several percent) and one
thread. Needs valgrind; not part of `make bench` (each run takes minutes under callgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARMUP = 3
STEPS = {"cnn": (1, 3), "linears": (10, 110)}  # (few, many)


def _model(fw: Any, name: str) -> tuple[Any, Any]:
    import models

    sizes = models.Sizes()
    if name == "cnn":
        return models.cnn(fw, sizes), models.cnn_input(fw, sizes)
    kit = fw.kit
    model = kit.sequential(*(kit.linear(8, 8) for _ in range(4)))
    return model, fw.randn(2, 8)


def _child(framework: str, name: str, variant: str, steps: int) -> None:
    """The measured program: `steps` training steps of `variant` after the warm-up."""
    sys.path[:0] = [str(HERE)]
    import frameworks
    import models

    import unihook

    (fw,) = frameworks.load([framework])
    fw.single_thread()
    fw.seed(0)
    model, x = _model(fw, name)
    fw.set_training(model, True)
    leaves = [m for _, m in models.leaves(fw, model)]
    if variant == "native":
        for m in leaves:
            fw.native_hook(m, "full_backward", lambda *a: None)
    elif variant == "unihook":
        for m in leaves:
            unihook.register_full_backward_hook(m, lambda *a: None)
    step = fw.train_step(model, model, x)
    for _ in range(WARMUP + steps):
        step()


def _instructions(framework: str, name: str, variant: str, steps: int) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        framework,
        name,
        variant,
        str(steps),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2], argv[3], int(argv[4]))
        return
    parser = argparse.ArgumentParser(description="Instructions per training step (callgrind).")
    parser.add_argument("--model", choices=sorted(STEPS), default="cnn")
    parser.add_argument("--framework", choices=["torch", "paddle"], default="torch")
    args = parser.parse_args(argv)
    few, many = STEPS[args.model]
    variants = ["plain", "unihook"] + (["native"] if args.framework == "torch" else [])
    per_step = {}
    for variant in variants:
        counts = [_instructions(args.framework, args.model, variant, n) for n in (few, many)]
        per_step[variant] = (counts[1] - counts[0]) / (many - few)
        print(f"{args.framework} {args.model} {variant:8s} {per_step[variant] / 1e6:10.3f} M")
    if "native" in per_step:
        print(f"unihook / native: {per_step['unihook'] / per_step['native']:.4f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
