"""Parameters and buffers of a torch or paddle model in one layout, torch's, so that two ports
can be paired by name and copied into each other (`copy_weights`) or compared (`compare`).

The paddle side differs from torch's in a few places, each undone here: Linear weights are
[in, out] (torch: [out, in]); BatchNorm's running statistics are ``_mean`` / ``_variance``
parameters; InstanceNorm's weight is ``scale``; MultiHeadAttention keeps separate q/k/v
projections where torch packs them into ``in_proj_weight`` / ``in_proj_bias``. Everything
else (Conv, Embedding, LayerNorm, LSTM...) has the same names and layout in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from unihook import backend_of, ops

__all__ = ["Entry", "copy_weights", "entries", "match"]

_PADDLE_RENAMES = {
    "BatchNorm": {"_mean": "running_mean", "_variance": "running_var"},
    "InstanceNorm": {"scale": "weight"},
}
# torch-only bookkeeping with no counterpart in paddle (momentum=None BatchNorm's counter)
_TORCH_ONLY = {"num_batches_tracked"}


@dataclass
class Entry:
    """One parameter or buffer in torch's layout: `name` (torch-style qualified name), `native`
    (its name(s) in its own model), `shape`, `read()` / `write(array)` / `grad()` in that
    layout."""

    name: str
    native: str
    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]
    write: Callable[[np.ndarray], None]
    grad: Callable[[], np.ndarray | None]


def _family(module: Any) -> str:
    """The paddle class family a module belongs to ("Linear", "BatchNorm", ...), by its MRO."""
    for cls in type(module).__mro__:
        name = cls.__name__.lstrip("_")
        if name == "Linear" or name == "MultiHeadAttention":
            return name
        for family in ("BatchNorm", "InstanceNorm"):
            if name.startswith(family):
                return family
    return ""


def _tensor_entry(name: str, native: str, t: Any, transpose: bool) -> Entry:
    def read() -> np.ndarray:
        value = ops.to_numpy(t)
        return value.T if transpose else value

    def write(value: np.ndarray) -> None:
        value = np.ascontiguousarray(value.T if transpose else value)
        # a detached alias shares the tensor's memory: the copy needs no no_grad context
        ops.copy_into(ops.detach(t), ops.as_tensor(value, like=t))

    def grad() -> np.ndarray | None:
        g = ops.grad_of(t)
        if g is None:
            return None
        value = ops.to_numpy(g)
        return value.T if transpose else value

    shape = tuple(int(n) for n in t.shape)
    return Entry(name, native, shape[::-1] if transpose else shape, read, write, grad)


def _packed_entry(name: str, natives: list[str], tensors: list[Any], transpose: bool) -> Entry:
    """torch's packed q/k/v projection from paddle's three (weights transposed)."""
    parts = [_tensor_entry(name, n, t, transpose) for n, t in zip(natives, tensors)]
    sizes = np.cumsum([p.shape[0] for p in parts])[:-1]

    def write(value: np.ndarray) -> None:
        for part, piece in zip(parts, np.split(value, sizes)):
            part.write(piece)

    def grad() -> np.ndarray | None:
        grads = [p.grad() for p in parts]
        return None if any(g is None for g in grads) else np.concatenate(grads)  # type: ignore[arg-type]

    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return Entry(
        name,
        "+".join(natives),
        shape,
        lambda: np.concatenate([p.read() for p in parts]),
        write,
        grad,
    )


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _paddle_attention(name: str, module: Any) -> list[Entry]:
    projections = [getattr(module, p) for p in ("q_proj", "k_proj", "v_proj")]
    natives = [_join(name, f"{p}.weight") for p in ("q_proj", "k_proj", "v_proj")]
    weights = [p.weight for p in projections]
    found: list[Entry] = []
    if len({tuple(w.shape) for w in weights}) == 1:
        found.append(_packed_entry(_join(name, "in_proj_weight"), natives, weights, True))
    else:  # kdim / vdim differ from embed_dim: torch keeps three weights too
        for p, native, w in zip(("q", "k", "v"), natives, weights):
            found.append(_tensor_entry(_join(name, f"{p}_proj_weight"), native, w, True))
    biases = [p.bias for p in projections]
    if all(b is not None for b in biases):
        natives = [_join(name, f"{p}.bias") for p in ("q_proj", "k_proj", "v_proj")]
        found.append(_packed_entry(_join(name, "in_proj_bias"), natives, biases, False))
    return found


def entries(model: Any) -> list[Entry]:
    """Every persistent parameter and buffer of `model` (a torch module or paddle layer) in
    torch's layout, in model order; a tensor shared by several modules appears once."""
    paddle = backend_of(model) == "paddle"
    persistent = set(model.state_dict().keys())
    seen: set[int] = set()  # ids of tensors already listed (shared, or packed into another)
    found: list[Entry] = []
    for prefix, module in ops.named_modules(model):
        family = _family(module) if paddle else ""
        if family == "MultiHeadAttention":
            found.extend(_paddle_attention(prefix, module))
            for p in ("q_proj", "k_proj", "v_proj"):
                seen.update(id(t) for _, t in getattr(module, p).named_parameters())
        renames = _PADDLE_RENAMES.get(family, {})
        # positional arguments: torch's (prefix, recurse), paddle's (prefix, include_sublayers)
        own = list(module.named_parameters("", False)) + list(module.named_buffers("", False))
        for key, tensor in own:
            native = _join(prefix, key)
            if tensor is None or id(tensor) in seen or native not in persistent:
                continue
            if not paddle and key in _TORCH_ONLY:
                continue
            seen.add(id(tensor))
            transpose = family == "Linear" and key == "weight" and len(tensor.shape) == 2
            name = _join(prefix, renames.get(key, key))
            found.append(_tensor_entry(name, native, tensor, transpose))
    return found


Shapes = list[tuple[str, tuple[int, ...]]]


def match(a: Shapes, b: Shapes) -> tuple[list[tuple[int, int]], list[str]]:
    """Pairs of indices of `a` and `b` (torch-style names and shapes): by name, then the
    entries left on both sides by order when their counts and shapes agree (ports that renamed
    modules). Returns the pairs and a description of every entry left unmatched or
    mis-shaped."""
    index_b = {name: j for j, (name, _) in enumerate(b)}
    pairs: list[tuple[int, int]] = []
    problems: list[str] = []
    left_a: list[int] = []
    used: set[int] = set()
    for i, (name, shape) in enumerate(a):
        j = index_b.get(name)
        if j is None:
            left_a.append(i)
            continue
        used.add(j)
        if b[j][1] != shape:
            problems.append(f"{name}: shape {list(shape)} vs {list(b[j][1])}")
        else:
            pairs.append((i, j))
    left_b = [j for j in range(len(b)) if j not in used]
    if len(left_a) == len(left_b) and all(a[i][1] == b[j][1] for i, j in zip(left_a, left_b)):
        pairs.extend(zip(left_a, left_b))
        pairs.sort()
    else:
        problems += [f"only in the first: {a[i][0]} {list(a[i][1])}" for i in left_a]
        problems += [f"only in the second: {b[j][0]} {list(b[j][1])}" for j in left_b]
    return pairs, problems


def copy_weights(src: Any, dst: Any) -> list[tuple[str, str]]:
    """Copy every parameter and persistent buffer of `src` into `dst` (torch -> paddle, paddle
    -> torch, or within one framework), converting layouts (Linear [out, in] <-> [in, out],
    BatchNorm running statistics <-> ``_mean`` / ``_variance``, torch's packed attention
    ``in_proj`` <-> paddle's q/k/v projections). Entries pair by name, or by order where the
    port renamed modules (same count, same shapes).

    Returns the (src name, dst name) pairs copied. Raises ValueError listing every unmatched
    or mis-shaped entry before copying anything: never a partial copy.
    """
    found_src, found_dst = entries(src), entries(dst)
    pairs, problems = match(
        [(e.name, e.shape) for e in found_src], [(e.name, e.shape) for e in found_dst]
    )
    if problems:
        raise ValueError(
            f"copy_weights: {len(problems)} entries do not match (nothing was copied; names "
            "in torch's layout):\n  " + "\n  ".join(problems)
        )
    values = [(found_dst[j], found_src[i].read()) for i, j in pairs]  # read all, then write
    for entry, value in values:
        entry.write(value)
    return [(found_src[i].native, found_dst[j].native) for i, j in pairs]
