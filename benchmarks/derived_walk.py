"""What `ops.derived`'s walk adds to GradientMonitor on a module returning several tensors.

A training step (forward and backward) of a 2-layer LSTM (batch 8, 20 steps, 32 units) whose
call returns ``out, (h, c)``, none computed from another, so both of torch's walks run (down to
the earliest output's sequence number, then the call's graph down to its arguments): the
monitor as it is, against the same monitor with the test skipped (the recorded numbers are the
same there), and the plain step. Rounds alternate the three in one process, one thread; the
best round of each is compared. ``python benchmarks/derived_walk.py`` prints the times and
the ratios.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch

import unihook.recipes.monitor as monitor_module
from unihook.recipes import GradientMonitor

ROUNDS, STEPS = 7, 40


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(32, 32, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x: Any) -> Any:
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]) + (h.sum() + c.sum()) * 0.0


def _round(step: Callable[[], None], times: list[float]) -> None:
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    times.append((time.perf_counter() - start) / STEPS)


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, x = Encoder(), torch.randn(8, 20, 32)

    def step() -> None:
        model(x).sum().backward()

    walking = monitor_module._one_from_another
    times: dict[str, list[float]] = {"walk": [], "skipped": [], "plain": []}
    step()  # (warm-up)
    for _ in range(ROUNDS):
        _round(step, times["plain"])
        for name in ("walk", "skipped"):
            if name == "skipped":
                monitor_module._one_from_another = lambda tensors, marks: False
            try:
                with GradientMonitor(model):
                    _round(step, times[name])
            finally:
                monitor_module._one_from_another = walking
    best = {name: min(values) for name, values in times.items()}
    print({name: f"{value * 1e3:.3f} ms" for name, value in best.items()})
    print(f"walk / skipped: {best['walk'] / best['skipped']:.3f}x")
    print(f"skipped / plain: {best['skipped'] / best['plain']:.3f}x")


if __name__ == "__main__":
    main()
