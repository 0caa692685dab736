"""The run's record (JSON), its table on stdout, and a markdown table for the README.

``python benchmarks/report.py benchmarks/results/latest.json`` prints the markdown table of a
recorded run.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import CaseResult, Summary, Target
from import_time import ImportResult

DISTRIBUTIONS = ("torch", "paddlepaddle", "mindspore", "numpy", "unihook", "pluggy")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(threads: dict[str, Any]) -> dict[str, Any]:
    return {
        "versions": {
            "python": platform.python_version(),
            **{d: _version(d) for d in DISTRIBUTIONS},
        },
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "threads": {**{v: os.environ.get(v) for v in THREAD_VARIABLES}, **threads},
        },
    }


def _target(target: Target | None, value: float) -> dict[str, Any]:
    if target is None:
        return {}
    return {"target": target.text, "limit": target.limit, "met": target.met(value)}


def case_record(result: CaseResult) -> dict[str, Any]:
    case = result.case
    return {
        "title": case.title,
        "unit": case.unit,
        "notes": case.notes,
        "variants": {name: s.as_dict() for name, s in result.times.items()},
        "metrics": {
            m.name: {
                "unit": m.unit,
                **result.metrics[m.name].as_dict(),
                **_target(m.target, result.metrics[m.name].median),
            }
            for m in case.metrics
        },
    }


def import_record(result: ImportResult) -> dict[str, Any]:
    return {
        "runs": result.runs,
        "times_ms": {name: s.as_dict() for name, s in result.times_ms.items()},
        "added_ms": {
            "unit": "ms",
            **result.added_ms.as_dict(),
            **_target(result.target, result.added_ms.median),
        },
    }


def targets(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every metric that has a target, flattened: where, what, median and whether it is met."""
    rows = [
        _target_row(case_id, name, m)
        for case_id, case in record["cases"].items()
        for name, m in case["metrics"].items()
        if "target" in m
    ]
    if "import" in record:
        rows.append(_target_row("import", "import unihook - bare", record["import"]["added_ms"]))
    return rows


def _target_row(case: str, metric: str, m: dict[str, Any]) -> dict[str, Any]:
    keys = ("unit", "median", "q1", "q3", "target", "met")
    return {"case": case, "metric": metric, **{k: m[k] for k in keys}}


def write(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


# -- text --


def _value(value: float, unit: str) -> str:
    return f"{value:.3f}x" if unit == "x" else f"{value:.3f} {unit}"


def _spread(s: Summary) -> str:
    return f"IQR {s.q1:.3f} .. {s.q3:.3f}, range {s.min:.3f} .. {s.max:.3f}"


def print_case(result: CaseResult, out: Any = sys.stdout) -> None:
    case = result.case
    print(f"\n== {case.title} [{case.unit}]", file=out)
    if case.notes:
        print(f"   ({case.notes})", file=out)
    width = max(len(v.name) for v in case.variants)
    for v in case.variants:
        s = result.times[v.name]
        print(f"   {v.name:<{width}}  {s.median:10.3f}  {_spread(s)}", file=out)
    width = max((len(m.name) for m in case.metrics), default=0)
    for m in case.metrics:
        s = result.metrics[m.name]
        verdict = ""
        if m.target is not None:
            verdict = f"  target {m.target.text}: {'met' if m.target.met(s.median) else 'NOT MET'}"
        print(
            f"   {m.name:<{width}}  {_value(s.median, m.unit):>12}  {_spread(s)}{verdict}", file=out
        )


def print_import(result: ImportResult, out: Any = sys.stdout) -> None:
    print(f"\n== import unihook in a fresh interpreter ({result.runs} runs) [ms]", file=out)
    for name, s in result.times_ms.items():
        print(f"   {name:<15} {s.median:10.2f}  {_spread(s)}", file=out)
    added, t = result.added_ms, result.target
    print(
        f"   {'added':<15} {added.median:10.2f}  {_spread(added)}  target {t.text}: "
        f"{'met' if t.met(added.median) else 'NOT MET'}",
        file=out,
    )


def print_skips(peers: dict[str, Any], out: Any = sys.stdout) -> None:
    for name, info in peers.items():
        if info["status"] != "ok":
            print(f"\n== peer {name}: {info['status']}", file=out)


def print_targets(rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    print("\n== targets", file=out)
    for row in rows:
        verdict = "met" if row["met"] else "NOT MET"
        print(
            f"   {verdict:<8} {row['case']}: {row['metric']} = "
            f"{_value(row['median'], row['unit'])} (target {row['target']})",
            file=out,
        )


# -- markdown, for benchmarks/README.md --

HEADER = ["| case | metric | median | IQR | range | target |", "|---|---|---|---|---|---|"]


def _markdown_row(case: str, name: str, m: dict[str, Any]) -> str:
    target = f"{m['target']}: {'met' if m['met'] else '**not met**'}" if "target" in m else ""
    return (
        f"| {case} | {name} | {_value(m['median'], m['unit'])} | "
        f"{m['q1']:.3f} .. {m['q3']:.3f} | {m['min']:.3f} .. {m['max']:.3f} | {target} |"
    )


def markdown(record: dict[str, Any]) -> str:
    """Two tables: the metrics that have a target (and the import time), then all others."""
    with_target, others = list(HEADER), list(HEADER)
    for case_id, case in record["cases"].items():
        for name, m in case["metrics"].items():
            (with_target if "target" in m else others).append(_markdown_row(case_id, name, m))
    if "import" in record:
        with_target.append(
            _markdown_row("import", "import unihook - bare python", record["import"]["added_ms"])
        )
    for name, info in record.get("peers", {}).items():
        if info["status"] != "ok":
            others.append(f"| peers | {name} | {info['status']} | | | |")
    return "\n".join(with_target) + "\n\n" + "\n".join(others)


if __name__ == "__main__":
    print(markdown(json.loads(Path(sys.argv[1]).read_text())))
