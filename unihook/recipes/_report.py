"""How a compare `Report` reads: the model as a tree with the divergences marked, and a plot of
the per-module error along the model."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from ._align import parent, type_key

if TYPE_CHECKING:
    from .compare import Diff, Report, Row

__all__ = ["plot", "render"]


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.1e}"


def _grad_rel(row: Row) -> float | None:
    found = [d.rel for d in (row.grad_output, row.grad_input) if d is not None]
    return max(found) if found else None


def _worst(rows: list[Row]) -> tuple[float, float | None, str]:
    out = max(r.output.rel for r in rows)
    grads = [g for g in map(_grad_rel, rows) if g is not None]
    bad = [
        what
        for what, failed in (
            ("out", any(r.output.failed for r in rows)),
            ("grad", any(r.grad_failed for r in rows)),
        )
        if failed
    ]
    return out, (max(grads) if grads else None), f"DIFF {'+'.join(bad)}" if bad else "ok"


def _describe(d: Diff) -> str:
    return d.note or f"max abs {_num(d.abs)}, rel {_num(d.rel)}"


def _header(report: Report) -> list[str]:
    a, b = report.backends
    failed = {r.name_a for r in report.table if r.verdict != "ok"}
    verdict = "OK" if report.ok else f"{len(failed)} modules diverge"
    lines = [
        f"compare {a} (a) vs {b} (b): {verdict}",
        f"tolerance |a - b| <= {report.atol:g} + {report.rtol:g} * max|a|; modules aligned by "
        f"{report.rule} ({len(report.pairs)} pairs); reference: {report.reference}",
    ]
    firsts = [
        ("forward", report.first_forward, report.table, lambda r: r.output.failed),
        ("backward", report.first_backward, report.backward_order, lambda r: r.grad_failed),
    ]
    for what, name, rows, failed in firsts:
        if name is None:
            lines.append(f"first {what} divergence: none")
            continue
        row = next(r for r in rows if r.name_a == name and failed(r))
        field = "output" if what == "forward" else "grad_input"
        if what == "backward" and row.grad_output is not None and row.grad_output.failed:
            field = "grad_output"
        diff = getattr(row, field)
        lines.append(
            f"first {what} divergence: {name or '(model)'} ({row.type_a}, call {row.call}, "
            f"step {row.step}): {field} {_describe(diff)}"
        )
    if report.first_parameter is not None:
        p = next(p for p in report.params if p.diff.failed)
        lines.append(
            f"first parameter divergence: {p.name_a} ({p.stage}, step {p.step}): "
            f"{_describe(p.diff)}"
        )
    return lines


def render(report: Report, depth: int) -> str:
    by_name: dict[str, list[Row]] = {}
    for row in report.table:
        by_name.setdefault(row.name_a, []).append(row)
    names = list(report.types_a)
    children: dict[str, list[str]] = {}
    for name in names[1:] if names and names[0] == "" else names:
        children.setdefault(parent(name), []).append(name)
    marks: dict[str, list[str]] = {}
    for what, name in (("forward", report.first_forward), ("backward", report.first_backward)):
        if name is not None:
            marks.setdefault(name, []).append(f"<- first {what} divergence")
    hot = set()  # the first divergences and their ancestors: never folded
    for name in marks:
        while True:
            hot.add(name)
            if not name:
                break
            name = parent(name)
    to_b = dict(report.pairs)
    unpaired = set(report.unpaired_a)

    def count(name: str) -> int:
        return sum(1 + count(c) for c in children.get(name, []))

    def line(name: str) -> str:
        label = name.rsplit(".", 1)[-1] if name else "(model)"
        kind = report.types_a.get(name, "?")
        if name in to_b:
            other = report.types_b.get(to_b[name], "?")
            if type_key(other) != type_key(kind):
                kind = f"{kind} / {other}"
            if to_b[name] != name:
                kind += f" = b:{to_b[name] or '(model)'}"
        text = f"{label} ({kind})"
        rows = by_name.get(name)
        if rows:
            out, grad, verdict = _worst(rows)
            calls = f" x{len(rows)}" if len(rows) > 1 else ""
            text += f"{calls}  out {_num(out)}  grad {_num(grad)}  {verdict}"
        else:
            text += "  no counterpart in b" if name in unpaired else "  not run"
        return " ".join([text, *marks.get(name, [])])

    lines = _header(report)
    root = "" if "" in report.types_a else None

    def walk(name: str, prefix: str, level: int) -> None:
        kids = children.get(name, [])
        if level >= depth and name not in hot and kids:
            lines[-1] += f"  [{count(name)} submodules]"
            return
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(prefix + ("└─ " if last else "├─ ") + line(kid))
            walk(kid, prefix + ("   " if last else "│  "), level + 1)

    if root is not None:
        lines.append(line(root))
        walk(root, "", 0)
    if report.unpaired_b:
        shown = ", ".join(n or "(model)" for n in report.unpaired_b[:6])
        more = f" and {len(report.unpaired_b) - 6} more" if len(report.unpaired_b) > 6 else ""
        lines.append(f"ran in b only: {shown}{more}")
    return "\n".join(lines)


Panel = tuple[list["Row"], list[float], list[bool], str, "str | None"]


def _panels(report: Report, step: int) -> list[Panel]:
    """The plot's two panels: rows, relative errors, failed or not, title, first divergence.
    Each panel is coloured by its own verdict: a module whose backward alone differs is red in
    the backward panel only."""
    forward = [r for r in report.table if r.step == step]
    backward = [r for r in report.backward_order if r.step == step]
    return [
        (
            forward,
            [r.output.rel for r in forward],
            [r.output.failed for r in forward],
            "forward",
            report.first_forward,
        ),
        (
            backward,
            [_grad_rel(r) or 0.0 for r in backward],
            [r.grad_failed for r in backward],
            "backward",
            report.first_backward,
        ),
    ]


def plot(report: Report, path: str | os.PathLike[str]) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    step = report.step if report.step is not None and report.step >= 0 else 0
    floor = 1e-12  # exact agreement, drawn on the axis' floor
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
    for ax, (rows, values, failed, what, first) in zip(axes, _panels(report, step)):
        shown = [min(max(v, floor), 1e3) for v in values]
        colors = ["tab:red" if bad else "tab:blue" for bad in failed]
        ax.scatter(range(len(rows)), shown, c=colors, s=10)
        ax.plot(range(len(rows)), shown, lw=0.5, color="gray")
        ax.axhline(report.rtol, color="tab:orange", ls="--", lw=1, label=f"rtol {report.rtol:g}")
        ax.set_yscale("log")
        ax.set_ylabel("max|a-b| / max|a|")
        order = "order of completion" if what == "forward" else "backward order"
        ax.set_xlabel(f"module call, {order} (step {step})")
        found = f"first divergence {first or '(model)'}" if first is not None else "no divergence"
        ax.set_title(f"{what}: {found}", fontsize=10)
        for i, r in enumerate(rows):
            if r.name_a == first:
                ax.annotate(first or "(model)", (i, shown[i]), fontsize=8, color="tab:red")
                break
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"compare {report.backends[0]} (a) vs {report.backends[1]} (b)")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
