"""TensorBoard output for the recipes, from either framework: the recipes hand plain floats and
numpy arrays to a SummaryWriter, so tensorboardX (numpy and protobuf only, no framework) or
torch.utils.tensorboard's writer (the same methods) both work."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["ROOT_TAG", "Writer", "summary_writer", "write_records"]

ROOT_TAG = "_model_"  # the model's own row ("" in the recipes)


class Writer(Protocol):
    """What the recipes call: tensorboardX.SummaryWriter and torch's have both methods."""

    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = ...) -> Any: ...
    def add_histogram(self, tag: str, values: Any, global_step: int | None = ...) -> Any: ...


def summary_writer(logdir: str, **kwargs: Any) -> Any:
    """A tensorboardX SummaryWriter writing event files into `logdir` (``pip install
    tensorboardX``); ``tensorboard --logdir`` shows them."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError(
            "unihook.recipes.summary_writer needs tensorboardX: pip install tensorboardX "
            "(or pass a torch.utils.tensorboard SummaryWriter to write())"
        ) from e
    return SummaryWriter(logdir, **kwargs)


def write_records(
    writer: Writer, prefix: str, rows: Sequence[dict[str, Any]], keys: Sequence[str], step: int
) -> None:
    """Scalars ``<prefix>/<module>/<key>`` per row (the model itself as ``_model_``, which is
    what TensorBoard's tag rules make of "(model)"), and per key a histogram
    ``<prefix>/<key>`` of its values across the modules (finite ones)."""
    import numpy as np

    for row in rows:
        module = row["name"] or ROOT_TAG
        for key in keys:
            writer.add_scalar(f"{prefix}/{module}/{key}", float(row[key]), step)
    for key in keys:
        values = np.array([float(r[key]) for r in rows])
        values = values[np.isfinite(values)]
        if values.size:
            writer.add_histogram(f"{prefix}/{key}", values, step)
