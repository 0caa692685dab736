"""TensorBoard output for the recipes, from either framework: the recipes hand plain floats and
numpy arrays to a SummaryWriter, so tensorboardX (numpy and protobuf only, no framework) or
torch.utils.tensorboard's writer (the same methods) both work."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["ROOT_TAG", "Writer", "summary_writer", "tags", "write_records"]

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
    writer: Writer,
    prefix: str,
    rows: Sequence[dict[str, Any]],
    keys: Sequence[str],
    step: int,
    known: dict[str, str] | None = None,
) -> None:
    """Scalars ``<prefix>/<module>/<key>`` per row (the model itself as ``_model_``, which is
    what TensorBoard's tag rules make of "(model)"), and per key a histogram
    ``<prefix>/<key>`` of its values across the modules (finite ones). `tags` gives each
    module a tag of its own, kept in `known` (the recipe's) from one write to the next."""
    import numpy as np

    for row, module in zip(rows, tags([row["name"] for row in rows], known)):
        for key in keys:
            writer.add_scalar(f"{prefix}/{module}/{key}", float(row[key]), step)
    for key in keys:
        values = np.array([float(r[key]) for r in rows])
        values = values[np.isfinite(values)]
        if values.size:
            writer.add_histogram(f"{prefix}/{key}", values, step)


def tags(names: Sequence[str], known: dict[str, str] | None = None) -> list[str]:
    """The tag of each module name: the name, as TensorBoard's writers would clean it (a
    character outside ``A-Z a-z 0-9 _ . - /`` becomes ``_``; the model, "", is `ROOT_TAG`),
    and where that tag is taken, with ``_2``, ``_3``... after it; the model, then the names
    that need no cleaning, take theirs first. Until 2026-12-04 a module named "odd name" and
    one named "odd_name" (or a submodule named ``_model_`` and the model) wrote one curve
    between them (helper-125's FINDING 3). `known` (name -> tag, filled in) keeps each name's
    tag from call to call: a module absent from a step does not move the others' (helper-126's
    FINDING 1)."""
    import re

    known = {} if known is None else known
    new = [name for name in dict.fromkeys(names) if name not in known]
    cleaned = {n: re.sub(r"[^A-Za-z0-9_.\-/]", "_", n) if n else ROOT_TAG for n in new}
    # (the model first, then the names as they are, then the cleaned ones)
    new.sort(key=lambda n: (n != "", cleaned[n] != n and n != ""))
    taken = set(known.values())
    for name in new:
        tag = unique = cleaned[name]
        n = 1
        while unique in taken:
            n += 1
            unique = f"{tag}_{n}"
        taken.add(unique)
        known[name] = unique
    return [known[name] for name in names]
