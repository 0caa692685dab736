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
from typing import Any, Callable, Mapping

import numpy as np

from unihook import backend_of, ops
from unihook.errors import UnsupportedHookError

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
    # why its memory cannot be read or written (None: it can)
    unusable: Callable[[], str | None] = lambda: None


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
    return Entry(
        name, native, shape[::-1] if transpose else shape, read, write, grad, lambda: _unusable(t)
    )


def _unusable(t: Any) -> str | None:
    """Why a tensor's values cannot be read or copied into (torch's meta device, an expanded
    tensor whose elements share memory, an inference tensor), or None."""
    if backend_of(t) != "torch":
        return None
    if getattr(t, "is_meta", False):
        return "on the meta device (no values to read or write)"
    if any(step == 0 and size > 1 for step, size in zip(t.stride(), t.shape)):
        return "expanded: several elements share one memory location (not writable)"
    if t.is_inference():
        return "an inference-mode tensor (not writable outside torch.inference_mode)"
    return None


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

    def unusable() -> str | None:
        return next((why for why in (p.unusable() for p in parts) if why), None)

    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return Entry(
        name,
        "+".join(natives),
        shape,
        lambda: np.concatenate([p.read() for p in parts]),
        write,
        grad,
        unusable,
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


_LAYOUTS = ("torch", "paddle")  # the backends whose parameter layouts `entries` knows


def entries(model: Any) -> list[Entry]:
    """Every persistent parameter and buffer of `model` (a torch module or paddle layer) in
    torch's layout, in model order; a tensor shared by several modules appears once."""
    backend = backend_of(model)
    if backend not in _LAYOUTS:
        raise UnsupportedHookError(
            "copy_weights, compare and dump read torch's and paddle's models (their layouts "
            f"are mapped to torch's). Received: a {backend} model ({type(model).__name__})"
        )
    paddle = backend == "paddle"
    # each persistent tensor's own key (by identity: a part's wrapper, `_orig_mod` of a compiled
    # submodule, is in the key and not in the names); torch's `keep_vars`, paddle's default
    persistent: dict[int, str] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        persistent.setdefault(id(tensor), key)
    seen: set[int] = set()  # ids of tensors already listed (shared, or packed into another)
    found: list[Entry] = []
    for prefix, wrapped in ops.named_modules(model):
        # a part's wrapper (torch.compile of a submodule...) stands for the part, which holds
        # the tensors and is not listed (`ops.named_modules`)
        module = ops.part(wrapped)
        family = _family(module) if paddle else ""
        if family == "MultiHeadAttention":
            found.extend(_paddle_attention(prefix, module))
            for p in ("q_proj", "k_proj", "v_proj"):
                seen.update(id(t) for _, t in getattr(module, p).named_parameters())
        renames = _PADDLE_RENAMES.get(family, {})
        # positional arguments: torch's (prefix, recurse), paddle's (prefix, include_sublayers)
        own = list(module.named_parameters("", False)) + list(module.named_buffers("", False))
        for key, tensor in own:
            if tensor is None or id(tensor) in seen or id(tensor) not in persistent:
                continue
            native = persistent[id(tensor)]
            if not paddle and key in _TORCH_ONLY:
                continue
            seen.add(id(tensor))
            transpose = family == "Linear" and key == "weight" and len(tensor.shape) == 2
            name = _join(prefix, renames.get(key, key))
            found.append(_tensor_entry(name, native, tensor, transpose))
    return found


Shapes = list[tuple[str, tuple[int, ...]]]


def _renamed(name: str, renames: Mapping[str, str]) -> str:
    """`name` with its longest module prefix found in `renames` replaced."""
    parts = name.split(".")
    for k in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:k])
        if prefix in renames:
            return _join(renames[prefix], ".".join(parts[k:]))
    return name


def _substitution(a: str, b: str) -> tuple[str, str]:
    """What a rename changed: the two names without their longest common dotted tail."""
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[-1 - k] == pb[-1 - k]:
        k += 1
    return ".".join(pa[: len(pa) - k]), ".".join(pb[: len(pb) - k])


def match(
    a: Shapes, b: Shapes, renames: Mapping[str, str] | None = None
) -> tuple[list[tuple[int, int]], list[str]]:
    """Pairs of indices of `a` and `b` (torch-style names and shapes): by name (a's module
    prefixes renamed by `renames` first), then the entries left on both sides by order when
    their counts and shapes agree (ports that renamed modules). Returns the pairs and a
    description of every entry left unmatched or mis-shaped, and of every order pairing that
    is ambiguous: entries of one shape renamed in different ways (torch's q, k against a
    port's key, query declared in another order), which order alone cannot tell apart."""
    index_b = {name: j for j, (name, _) in enumerate(b)}
    pairs: list[tuple[int, int]] = []
    problems: list[str] = []
    left_a: list[int] = []
    used: set[int] = set()
    for i, (name, shape) in enumerate(a):
        j = index_b.get(_renamed(name, renames) if renames else name)
        if j is None or j in used:
            left_a.append(i)
            continue
        used.add(j)
        if b[j][1] != shape:
            problems.append(f"{name}: shape {list(shape)} vs {list(b[j][1])}")
        else:
            pairs.append((i, j))
    left_b = [j for j in range(len(b)) if j not in used]
    if len(left_a) == len(left_b) and all(a[i][1] == b[j][1] for i, j in zip(left_a, left_b)):
        # a rename (module prefix in a -> in b) and its entries; two renamed modules with the
        # same entries (names after the prefix, shapes) could be swapped: order alone decides
        renamed: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for i, j in zip(left_a, left_b):
            renamed.setdefault(_substitution(a[i][0], b[j][0]), []).append((i, j))
        alike: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
        for (pa, pb), found in renamed.items():
            key = tuple((a[i][0][len(pa) :], a[i][1]) for i, _ in found)
            alike.setdefault(key, []).append((pa, pb))
        for rules in alike.values():
            if len(rules) > 1:
                shown = ", ".join(f"{x or '(model)'} -> {y or '(model)'}" for x, y in rules)
                problems.append(
                    f"ambiguous: renamed modules with the same parameters pair only by order "
                    f"({shown}): pass layer_map={{name in the first: name in the second}}"
                )
        pairs.extend(zip(left_a, left_b))
        pairs.sort()
    else:
        problems += [f"only in the first: {a[i][0]} {list(a[i][1])}" for i in left_a]
        problems += [f"only in the second: {b[j][0]} {list(b[j][1])}" for j in left_b]
    return pairs, problems


def copy_weights(
    src: Any, dst: Any, *, layer_map: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Copy every parameter and persistent buffer of `src` into `dst` (torch -> paddle, paddle
    -> torch, or within one framework), converting layouts (Linear [out, in] <-> [in, out],
    BatchNorm running statistics <-> ``_mean`` / ``_variance``, torch's packed attention
    ``in_proj`` <-> paddle's q/k/v projections). Entries pair by name, or by order where the
    port renamed modules (same count, same shapes); `layer_map` ({module name in src: module
    name in dst}) pairs renamed modules by hand, and is needed where order is ambiguous
    (same-shaped entries of modules renamed in different ways).

    Returns the (src name, dst name) pairs copied. Raises ValueError listing every unmatched,
    mis-shaped or unusable entry (torch's meta device, an expanded or inference tensor) before
    copying anything; a write that fails anyway puts back the entries written before it:
    never a partial copy.
    """
    found_src, found_dst = entries(src), entries(dst)
    pairs, problems = match(
        [(e.name, e.shape) for e in found_src],
        [(e.name, e.shape) for e in found_dst],
        dict(layer_map or {}),
    )
    for side, found, index in (("source", found_src, 0), ("destination", found_dst, 1)):
        for pair in pairs:
            entry = found[pair[index]]
            why = entry.unusable()
            if why:
                problems.append(f"{entry.native} ({side}): {why}")
    if problems:
        raise ValueError(
            f"copy_weights: {len(problems)} entries do not match or cannot be copied (nothing "
            "was copied; names in torch's layout):\n  " + "\n  ".join(problems)
        )
    values = [(found_dst[j], found_src[i].read()) for i, j in pairs]  # read all, then write
    backup = [entry.read() for entry, _ in values]
    done = 0
    try:
        for entry, value in values:
            entry.write(value)
            done += 1
    except BaseException:  # a write failed for a reason not checked above: undo the others
        for (entry, _), value in zip(values[:done], backup):
            entry.write(value)
        raise
    return [(found_src[i].native, found_dst[j].native) for i, j in pairs]
