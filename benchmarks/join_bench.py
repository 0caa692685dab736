"""What putting ActivationStats and GradientMonitor in torch's ``Join`` costs per training step
on ranks that all still have batches (README "Uneven inputs"): 2 CPU ranks (gloo), a 3-Linear
MLP under DistributedDataParallel, batch 32 per rank, even batches. Per run (a pair of ranks
per variant, the variants interleaved over the rounds), the median and the mean of rank 0's
step times after the warm-up:

- ``plain``: no recipe, no Join;
- ``recipes``: both recipes synced, no Join (their all_gathers on DDP's group);
- ``join_model``: no recipe, ``Join([model])`` (DDP's join all-reduces per forward; synced
  recipes left out of a Join are refused since 2026-11-30);
- ``join_recipes``: ``Join([stats, monitor, model])`` (the recipes' own group, their notice).

    python benchmarks/join_bench.py [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

VARIANTS = ("plain", "join_model", "recipes", "join_recipes")
WARMUP = 30


def rank_main(rank: int, port: int, variant: str, steps: int, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    from unihook.recipes import ActivationStats, GradientMonitor

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    nn = torch.nn
    model = DistributedDataParallel(
        nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10)
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, coefficients = torch.randn(32, 64), torch.randn(32, 10)
    recipes: list[Any] = []
    if variant in ("recipes", "join_recipes"):
        recipes = [ActivationStats(model), GradientMonitor(model)]
    joined: Any = contextlib.nullcontext()
    if variant == "join_model":
        joined = Join([model])
    elif variant == "join_recipes":
        joined = Join([*recipes, model])
    times = []
    with joined:
        for step in range(steps):
            if step == WARMUP:
                dist.barrier()
            start = time.perf_counter()
            (model(x) * coefficients).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - start)
    if rank == 0:
        kept = np.array(times[WARMUP:]) * 1e3
        Path(out).write_text(f"{np.median(kept):.2f} {np.mean(kept):.2f}")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # (gloo's threads at the interpreter's exit: see tests/distributed_child.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    found: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.txt")
        for _ in range(args.rounds):
            for variant in VARIANTS:
                mp.spawn(rank_main, args=(free_port(), variant, args.steps, out), nprocs=2)
                median, mean = map(float, Path(out).read_text().split())
                found[variant].append((median, mean))
    print(f"ms per step, rank 0, {args.rounds} rounds (median of the medians, their range):")
    for variant, runs in found.items():
        medians = sorted(m for m, _ in runs)
        middle = medians[len(medians) // 2]
        print(f"  {variant:13s} {middle:6.2f}  ({medians[0]:.2f} to {medians[-1]:.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
