"""ActivationStats: spot dead or exploding layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unihook import Where, attach, ops

from ._scope import Recipe

__all__ = ["ActivationStats"]


@dataclass
class _Running:
    calls: int = 0
    count: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")
    zeros: int = 0
    nonfinite: int = 0
    order: int = 0


class ActivationStats(Recipe):
    """Running statistics of every selected module's output over forward calls: calls, mean,
    std, min, max, fraction of zeros, and the count of non-finite values (mean, std, min and max
    are over the finite values). Tuple outputs count every tensor in them.

    ``stats.rows()``: one dict per module, in the order modules first ran; ``stats.report()``:
    a readable table. Use as a context manager or call `remove()`.
    """

    def __init__(self, model: Any, where: Where = None) -> None:
        super().__init__()
        self._stats: dict[str, _Running] = {}
        # A pre-hook fixes each module's place at its first call: rows come in call order
        # (a container before its children), not in order of completion.
        self._hooks = attach(model, self._started, kind="forward_pre", where=where)
        self._hooks.extend(attach(model, self._record, where=where))

    def _started(self, module: Any, args: Any, *, name: str) -> None:
        if name not in self._stats:
            self._stats[name] = _Running(order=len(self._stats))

    def _record(self, module: Any, args: Any, output: Any, *, name: str) -> None:
        tensors = (
            [output]
            if ops.is_tensor(output)
            else [
                o for o in (output if isinstance(output, (tuple, list)) else ()) if ops.is_tensor(o)
            ]
        )
        if not tensors:
            return
        running = self._stats[name]
        running.calls += 1
        for tensor in tensors:
            values = ops.to_numpy(tensor).astype(np.float64).ravel()
            finite = values[np.isfinite(values)]
            running.nonfinite += values.size - finite.size
            running.count += finite.size
            running.total += float(finite.sum())
            running.squares += float(np.square(finite).sum())
            running.zeros += int((finite == 0).sum())
            if finite.size:
                running.low = min(running.low, float(finite.min()))
                running.high = max(running.high, float(finite.max()))

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for name, r in sorted(self._stats.items(), key=lambda item: item[1].order):
            mean = r.total / r.count if r.count else float("nan")
            var = r.squares / r.count - mean * mean if r.count else float("nan")
            if not r.calls:
                continue
            rows.append(
                {
                    "name": name,
                    "calls": r.calls,
                    "mean": mean,
                    "std": float(np.sqrt(max(var, 0.0))) if r.count else float("nan"),
                    "min": r.low if r.count else float("nan"),
                    "max": r.high if r.count else float("nan"),
                    "zeros": r.zeros / (r.count + r.nonfinite),
                    "nonfinite": r.nonfinite,
                }
            )
        return rows

    def report(self) -> str:
        rows = self.rows()
        width = max([len("module"), *(len(r["name"] or "(model)") for r in rows)])
        head = (
            f"{'module':<{width}}  {'calls':>5}  {'mean':>10}  {'std':>10}  {'min':>10}  "
            f"{'max':>10}  {'zeros':>6}  {'nonfinite':>9}"
        )
        lines = [head, "-" * len(head)]
        for r in rows:
            lines.append(
                f"{r['name'] or '(model)':<{width}}  {r['calls']:>5}  {r['mean']:>10.4g}  "
                f"{r['std']:>10.4g}  {r['min']:>10.4g}  {r['max']:>10.4g}  "
                f"{r['zeros']:>6.1%}  {r['nonfinite']:>9}"
            )
        return "\n".join(lines)
