"""Pictures of the recipes' histories with matplotlib: per-module activation statistics and
gradient norms over the recorded steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .monitor import GradientMonitor
    from .stats import ActivationStats

__all__ = ["plot"]

_LEGEND_MAX = 12  # modules; more lines than this get no legend


def plot(
    stats: ActivationStats | None = None,
    monitor: GradientMonitor | None = None,
    path: str | None = None,
    title: str | None = None,
    *,
    all_ranks: bool = False,
) -> Any:
    """One figure: the activation mean, std and fraction of zeros per module over the forwards
    `stats` recorded, and the gradient norm per module over the backwards `monitor` recorded
    (either may be None). Saved to `path` when given (the format from its suffix), under an
    initialised process group by rank 0 only unless `all_ranks`; returns the matplotlib
    Figure. Steps are counted in recorded forwards (with ``every=N``, one per N)."""
    recipe = stats if stats is not None else monitor
    if path is not None and recipe is not None and not recipe._writes(recipe._model, all_ranks):
        path = None
    try:
        import matplotlib

        if path is not None and matplotlib.get_backend().lower() != "agg":
            matplotlib.use("Agg")  # a file needs no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("unihook.recipes.plot needs matplotlib: pip install matplotlib") from e
    panels: list[tuple[str, dict[str, list[float]], bool]] = []
    if stats is not None:
        history = stats.history
        for key, label in (("mean", "activation mean"), ("std", "activation std")):
            panels.append((label, _series(history, key), False))
        panels.append(("fraction of zeros", _series(history, "zeros"), False))
    if monitor is not None:
        norms = [{name: {"norm": v} for name, v in step.items()} for step in monitor.history]
        panels.append(("gradient norm (grad_output)", _series(norms, "norm"), True))
    if not panels:
        raise ValueError("plot: pass an ActivationStats, a GradientMonitor, or both")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (label, series, log) in zip(axes[0], panels):
        for name, values in series.items():
            ax.plot(range(len(values)), values, label=name or "(model)", linewidth=1)
        ax.set_title(label)
        ax.set_xlabel("recorded step")
        if log:
            ax.set_yscale("log")
        if 0 < len(series) <= _LEGEND_MAX:
            ax.legend(fontsize=6)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def _series(history: list[dict[str, dict[str, Any]]], key: str) -> dict[str, list[float]]:
    """Per module, its value of `key` at every step (NaN where it did not run)."""
    names: dict[str, None] = {}
    for step in history:
        names.update(dict.fromkeys(step))
    return {n: [float(s[n][key]) if n in s else float("nan") for s in history] for n in names}
