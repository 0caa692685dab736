"""Interleaved, round-based timing: every variant of a case in each round, in shuffled order.

Comparing variants measured in the same round cancels most machine drift (frequency changes,
other load): a metric is computed per round from that round's times, and its median over the
rounds is reported with its spread. The first `warmup` rounds are run and discarded. Within a
round, each variant runs `repeats` times (each pass in a new shuffled order) and keeps its
fastest sample: a sample can only be slowed down by the machine, never sped up.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

Body = Callable[[], object]
Cleanup = Callable[[], None]
#: Untimed: registers hooks / builds state, returns the timed body and the untimed cleanup.
Setup = Callable[[], tuple[Body, Cleanup]]
RoundTimes = Mapping[str, float]


@dataclass
class Variant:
    name: str
    setup: Setup


@dataclass(frozen=True)
class Target:
    limit: float
    text: str  # what the issue asks, e.g. "<= 1.02x"

    def met(self, value: float) -> bool:
        return value <= self.limit


@dataclass
class Metric:
    """A value computed from one round's times (a ratio, a difference), reported over rounds."""

    name: str
    compute: Callable[[RoundTimes], float]
    unit: str  # "x" for a ratio, else the unit of a difference
    target: Target | None
    needs: set[str]  # the variants `compute` reads


def ratio(num: str, den: str, target: Target | None = None) -> Metric:
    return Metric(f"{num} / {den}", lambda t: t[num] / t[den], "x", target, {num, den})


def added_per_hook(hooked: str, reference: str, hooks: int, target: Target | None = None) -> Metric:
    """(t_hooked - t_reference) / hooks, in the case's unit (the time per call)."""
    return Metric(
        f"({hooked} - {reference}) / {hooks} hooks",
        lambda t: (t[hooked] - t[reference]) / hooks,
        "us",
        target,
        {hooked, reference},
    )


@dataclass
class Case:
    id: str
    title: str
    unit: str  # of the variants' times, e.g. "us/call", "ms"
    scale: float  # seconds per sample -> `unit`
    variants: list[Variant]
    metrics: list[Metric]
    notes: str = ""


@dataclass
class Rounds:
    rounds: int
    warmup: int
    repeats: int = 1
    seed: int = 0


@dataclass
class Summary:
    median: float
    q1: float
    q3: float
    min: float
    max: float
    values: list[float] = field(repr=False)

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return cls(statistics.median(values), q1, q3, min(values), max(values), values)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "q1": self.q1,
            "q3": self.q3,
            "min": self.min,
            "max": self.max,
            "values": self.values,
        }


@dataclass
class CaseResult:
    case: Case
    times: dict[str, Summary]  # per variant, in case.unit
    metrics: dict[str, Summary]


def time_sample(variant: Variant) -> float:
    """One sample: setup (untimed), the body with gc off, cleanup (untimed); seconds."""
    body, cleanup = variant.setup()
    try:
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        body()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
        cleanup()
    return elapsed


def run_case(case: Case, plan: Rounds) -> CaseResult:
    rng = random.Random(f"{plan.seed}:{case.id}")
    per_round: list[dict[str, float]] = []
    for index in range(plan.warmup + plan.rounds):
        times = {v.name: float("inf") for v in case.variants}
        for _ in range(plan.repeats):
            order = list(case.variants)
            rng.shuffle(order)
            for v in order:
                times[v.name] = min(times[v.name], time_sample(v) * case.scale)
        if index >= plan.warmup:
            per_round.append(times)
    return CaseResult(
        case,
        {v.name: Summary.of([r[v.name] for r in per_round]) for v in case.variants},
        {m.name: Summary.of([m.compute(r) for r in per_round]) for m in case.metrics},
    )
