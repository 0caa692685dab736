"""What putting a recipe's hooks back in their places costs with ``every`` > 1 (README,
`every=N`): forwards of a Sequential of many Linears watched by ``ActivationStats(every=N)``,
with the places (as shipped) and with them bypassed (the hooks placed anew go last, as before
2026-12-04), alternated over the rounds in one process; the median ms per forward of each.

    python benchmarks/places_bench.py [--modules 1000] [--rounds 5] [--forwards 40]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from typing import Any


def forwards(model: Any, x: Any, every: int, n: int) -> float:
    from unihook.recipes import ActivationStats

    with ActivationStats(model, every=every):
        for _ in range(2):
            model(x)
        start = time.perf_counter()
        for _ in range(n):
            model(x)
        return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=40)
    args = parser.parse_args()
    import torch

    places = importlib.import_module("unihook.recipes._places").Places
    shipped = places.place, places.leave
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(args.modules)])
    x = torch.randn(2, 8)
    for every in (2, 10):
        times: dict[str, list[float]] = {"places": [], "bypassed": []}
        for _ in range(args.rounds):
            for variant in times:
                if variant == "bypassed":
                    places.place = lambda self, model, build: build()
                    places.leave = lambda self, model: None
                try:
                    times[variant].append(forwards(model, x, every, args.forwards))
                finally:
                    places.place, places.leave = shipped
        with_places, bypassed = (statistics.median(times[v]) for v in ("places", "bypassed"))
        print(
            f"every={every}, {args.modules} modules: {with_places:.1f} ms/forward with the "
            f"places, {bypassed:.1f} bypassed: {with_places / bypassed:.3f}x"
        )


if __name__ == "__main__":
    main()
