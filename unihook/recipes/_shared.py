"""Per sample or shared: how a module output's numbers merge across data-parallel ranks.

One process on the global batch sees each module output once. Under data parallelism each rank
sees its own, and what the global batch's tensor is depends on the tensor:

- per sample (SAMPLE): its rows belong to the rank's samples, so the global tensor is the
  ranks' tensors side by side and its gradient the ranks' gradients side by side (squared
  norms add up, Chan's merge counts each rank's values);
- shared (SHARED): it does not depend on the data (a positional embedding ``[1, S, D]``
  broadcast over the batch, a relative-position bias): every rank computes the same tensor,
  which one process computes once, and its gradient on the global batch is the ranks'
  gradients summed (the norm of the sum, the values counted once);
- per sample though equal on every rank (COPY: ``cls_token.expand(B, ...)``, timesteps drawn
  with the same seed on every rank): per sample;
- reduced (REDUCED): a number computed from the rank's whole batch (a loss the model
  returns): for a loss summed (or averaged) over samples its gradient is the same on every
  rank and on the global batch.

Each output tensor of a watched module call is a slot, named by (module, its call number in the
forward, the tensor's position in the output). The ranks decide a slot's kind together, from
what each saw of it in the same forward (`Slots.decide`, the rule in README "Data parallel"):
every rank computes the same decision from the same gathered numbers, so every rank takes the
same path through the collectives. A slot found per sample stays so (reduced, while it stays
one number); a shared one is checked again with each forward's values and sent with its
gradient (or statistics) in the recipe's one collective per step.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from unihook import ops

SAMPLE = 0
COPY = 1
SHARED = 2
REDUCED = 3
NEW = -1  # not decided yet

KIND_NAMES = {SAMPLE: "sample", COPY: "copy", SHARED: "shared", REDUCED: "reduced", NEW: "new"}

#: (module name, its call number in the forward, position of the tensor in its output)
Key = tuple[str, int, int]
#: a Key on the wire: the module's index in the recipe's agreed module list
Wire = tuple[int, int, int]

# What a rank's merge is about, sent with it (`Slots.exchange`): collectives that pair must be
# about the same thing, else the ranks' numbers would mix (an evaluation-mode forward with
# gradients on one rank merged with the others' training forward), so every rank raises.
TRAINING_FORWARD, EVALUATION_FORWARD, FORWARD_TABLE, BACKWARD = 1, 2, 3, 4
# A rank that ran out of inputs (torch's Join) sends this in the merges the others still run:
# its rows are left out (it contributes nothing, as a rank with no samples at all).
JOINED = 0
STAMPS = {
    TRAINING_FORWARD: "ActivationStats' numbers of a training-mode forward",
    EVALUATION_FORWARD: "ActivationStats' numbers of an evaluation-mode forward",
    FORWARD_TABLE: "GradientMonitor's outputs of a forward",
    BACKWARD: "GradientMonitor's gradients of a backward",
    JOINED: "nothing (the rank ran out of inputs)",
}
# Added to a stamp for a forward the wrapper does not all-reduce the gradients of (inside its
# `no_sync()`, `ops.grad_sync`): uneven gradient accumulation (3 micro-batches per step on one
# rank, 4 on another) pairs one rank's last micro-batch with another's earlier one.
NO_SYNC = 8


def stamp_of(stamp: int, grad_sync: bool | None) -> int:
    """`stamp` of a forward whose gradients the wrapper all-reduces (`grad_sync`: True, or
    None where there is no such wrapper) or not (False)."""
    return stamp | NO_SYNC if grad_sync is False and stamp != JOINED else stamp


def stamp_name(stamp: int) -> str:
    """What a merge stamped `stamp` is about, for the errors."""
    what = STAMPS.get(stamp & ~NO_SYNC, "?")
    return f"{what} under no_sync()" if stamp & NO_SYNC else what


_WINDOW = 16  # merges over which the collective's section keeps room for its largest entries


def digest(array: Any) -> float:
    """52 bits of the dtype, shape and bytes of a numpy `array` (exact in a float64): two
    equal digests mean equal tensors but by a chance of 2**-52."""
    a = np.ascontiguousarray(array)
    head = f"{a.dtype.str}{a.shape}".encode()
    data: Any = a.reshape(-1).view(np.uint8)  # (a buffer: no copy)
    crc = zlib.crc32(data, zlib.crc32(head))
    return float((crc << 20) | (zlib.adler32(data, zlib.adler32(head)) & 0xFFFFF))


def digest_all(tensors: Sequence[Any]) -> float:
    """One digest of several tensors (a module's inputs)."""
    return _combined([digest(ops.to_numpy(t)) for t in tensors])


def _combined(digests: Sequence[float]) -> float:
    crc = 0
    for found in digests:
        crc = zlib.crc32(np.float64(found).tobytes(), crc)
    return float(crc)


_NO_INPUTS = digest_all(())
_EACH = 8  # the model's first input tensors whose digests the ranks compare one by one


def inputs_header(tensors: Sequence[Any]) -> tuple[float, ...]:
    """What the ranks compare of the model's inputs: one digest of them all, then one of each
    of the first 8 (-1 for none): an input equal on every rank while others differ (timesteps
    drawn with the same seed on every rank) is data the ranks share (see `_copy`)."""
    digests = [digest(ops.to_numpy(t)) for t in tensors]
    each = digests[:_EACH]
    return (_combined(digests), *each, *[-1.0] * (_EACH - len(each)))


#: `inputs_header` where the inputs were not compared (no slot undecided)
NO_INPUTS_HEADER: tuple[float, ...] = (0.0, *[-1.0] * _EACH)

_PROJECTIONS = 8


def sketch(tensor: Any, box: tuple[slice, ...]) -> Any:
    """[tolerance, norm, 8 random projections] of `tensor[box]` in float64 (the projections'
    weights drawn from a fixed seed: the same on every rank): what the ranks compare of the
    part their tensors have in common where their shapes differ (per-rank padded lengths).
    Not bitwise: a matrix product over more rows rounds otherwise."""
    found = np.zeros(2 + _PROJECTIONS)
    if tensor is None:
        found[0] = -1.0
        return found
    a = ops.to_numpy(tensor)[box].astype(np.float64).reshape(-1)
    name = str(tensor.dtype)
    # float32: 1e-4 of the norm; half precision rounds values to 2**-11 (bfloat16 2**-8)
    found[0] = 0.06 if "bfloat16" in name else 0.01 if "float16" in name else 1e-4
    found[1] = float(np.sqrt(np.dot(a, a)))
    weights = np.random.default_rng(17).standard_normal((_PROJECTIONS, len(a)))
    found[2:] = weights @ a
    return found


def alike(rows: Any) -> bool:
    """Whether the ranks' sketches (rows) are of one tensor but for rounding: each projection
    within the tolerance of the norms (a chance of about (1.6 x tolerance) ** 8 for tensors
    that differ)."""
    if (rows[:, 0] < 0).any():
        return False
    tolerance, norm, projections = rows[0, 0], rows[:, 1], rows[:, 2:]
    scale = tolerance * (norm + norm[0])
    return bool((np.abs(projections - projections[0]) <= scale[:, None]).all())


def batch_of(tensors: Sequence[Any]) -> int:
    """The batch the model got: the leading dimension of its first input tensor with one (the
    rows the rank's sampler gave it), -1 for none."""
    for tensor in tensors:
        shape = tensor.shape
        if len(shape):
            return int(shape[0])
    return -1


def _rows_equal(a: Any) -> bool:
    """Whether the rows of `a` along its leading dimension hold equal values (0.0 and -0.0
    alike: a dead ReLU layer's zeros carry either sign; NaN where NaN)."""
    rows = a.reshape(a.shape[0], -1)
    if not np.array_equal(rows[1], rows[0], equal_nan=rows.dtype.kind in "fc"):
        return False
    same = rows[1:] == rows[0]
    if rows.dtype.kind in "fc":
        same |= np.isnan(rows[1:]) & np.isnan(rows[0])
    return bool(same.all())


class Seen:
    """What this rank saw of one output tensor: its digest, shape, and where it has one row
    per sample of the batch, whether its rows are all equal and a digest of the tensors the
    module got (`args`); the tensor itself while its kind is undecided (the ranks then compare
    their common part where their shapes differ)."""

    __slots__ = ("digest", "shape", "rows_equal", "inputs", "tensor", "names")

    def __init__(self, tensor: Any, batch: int, keep: bool, args: Any) -> None:
        a = ops.to_numpy(tensor)
        self.digest = digest(a)
        self.shape: tuple[int, ...] = tuple(int(n) for n in a.shape)
        # one row per sample of the batch: its rows all equal? the module's tensors? (`_copy`)
        follows = bool(a.ndim and a.shape[0] == batch)
        self.rows_equal = follows and (batch < 2 or _rows_equal(a))
        # (the tensors in lists and tuples too: `temb([t])`; not keyword arguments)
        # (only where they may decide: a copy's equal rows need none, nor a ViT's images)
        wanted = follows and not self.rows_equal
        self.inputs = digest_all(ops.tensors_in(args, like=tensor)) if wanted else _NO_INPUTS
        self.tensor = tensor if keep else None
        self.names: list[str] = []  # (GradientMonitor) the modules whose output it is


class Part:
    """One rank's entry for a slot in the collective: `extra` is the recipe's (gradient,
    statistics)."""

    __slots__ = ("digest", "rows_equal", "inputs", "shape", "extra")

    def __init__(
        self, digest: float, rows_equal: bool, inputs: float, shape: tuple[int, ...], extra: Any
    ) -> None:
        self.digest = digest
        self.rows_equal = rows_equal
        self.inputs = inputs
        self.shape = shape
        self.extra = extra


def encode(index: dict[str, int], key: Key, seen: Seen, extra: Sequence[Any]) -> Any:
    """A slot's entry: [module, call, position, digest, rows equal, inputs' digest, ndim,
    *shape, len(extra), *extra], `extra` numbers and numpy arrays (flattened)."""
    parts = [np.asarray(e, np.float64).reshape(-1) for e in extra]
    size = sum(len(p) for p in parts)
    head = [index[key[0]], key[1], key[2], seen.digest, float(seen.rows_equal), seen.inputs]
    head += [len(seen.shape), *seen.shape, size]
    return np.concatenate([np.asarray(head, np.float64), *parts])


def parse(section: Any) -> dict[Wire, Part]:
    found: dict[Wire, Part] = {}
    at = 0
    while at < len(section):
        module, call, position, dig, rows, inputs, ndim = section[at : at + 7].tolist()
        ndim = int(ndim)
        shape = tuple(int(n) for n in section[at + 7 : at + 7 + ndim].tolist())
        size = int(section[at + 7 + ndim])
        start = at + 8 + ndim
        wire = (int(module), int(call), int(position))
        found[wire] = Part(dig, bool(rows), inputs, shape, section[start : start + size])
        at = start + size
    return found


def _room(size: int) -> int:
    """The section's capacity for entries of up to `size` numbers: 10% more, so that lengths
    varying from step to step (per-step padding) seldom need a second all_gather."""
    return size + size // 10 + 16


class Slots:
    """A recipe's decided slots and the size of its collective's section (both the same on
    every rank: changed only from gathered numbers)."""

    def __init__(self) -> None:
        # SAMPLE is final, REDUCED while one number; SHARED and COPY are decided at every merge
        self.kinds: dict[Key, int] = {}
        # a decision saw the ranks' inputs differ (until then GradientMonitor decides at the end
        # of each forward: the ranks cannot tell data from parameters)
        self.settled = False
        # some input tensor of the model was equal on every rank while the others differed
        # (timesteps drawn with the same seed on every rank: see `_copy`)
        self.shared_data = False
        self.capacity = 0  # numbers of slot entries the collective carries per rank
        self._needs: deque[int] = deque(maxlen=_WINDOW)
        self._tables = 0  # the same for GradientMonitor's decisions at the end of a forward
        self.active: Any = None  # the last exchange's ranks that did not join (JOINED)

    def kind(self, key: Key) -> int:
        return self.kinds.get(key, NEW)

    def wants_inputs(self, seen: Any) -> bool:
        """Whether the model's inputs must be compared at a merge for the slots of `seen`
        (Seen values): one undecided, or, until the ranks were found to share some input,
        one with a row per sample equal on every rank (see `_copy`)."""
        return any(
            self.kind(key) == NEW or (not self.shared_data and s.inputs != _NO_INPUTS)
            for key, s in seen
        )

    def exchange(
        self,
        recipe: Any,
        model: Any,
        names: list[str],
        base: Any,
        base_length: Callable[[int], int],
        header: Sequence[float],
        entries: Sequence[Any],
        stamp: int,
        table: bool = False,
    ) -> tuple[Any, Any, list[dict[Wire, Part]]]:
        """One all_gather of [base, need, stamp, *header, slot entries up to `capacity`] (the
        recipe's `_gather`: the ranks agree on the modules first): a second one, with a larger
        capacity, when a rank's entries did not fit. Returns every rank's base, header and
        entries. `stamp` (`STAMPS`): what the merge is about; where the ranks' differ, the
        recipe raises (`_out_of_step`) on every rank. `table`: a decision's table (every
        output of a forward), whose capacity is its own."""
        section = np.concatenate(entries) if entries else np.zeros(0)
        need = len(section)
        head = [float(need), float(stamp), *header]
        width = len(base)
        while True:
            capacity = self._tables if table else self.capacity
            tail = np.zeros(len(head) + capacity)
            tail[: len(head)] = head
            if need <= capacity:
                tail[len(head) : len(head) + need] = section
            size = len(tail)
            rows = recipe._gather(
                model,
                np.concatenate((np.asarray(base, np.float64), tail)),
                names,
                lambda count, size=size: base_length(count) + size,
            )
            stamps = rows[:, width + 1]
            self.active = stamps != JOINED
            sent = stamps[self.active]
            if (sent != sent[0]).any():  # (every rank sees the same rows: all raise)
                recipe._out_of_step(model, [stamp_name(int(s)) for s in stamps.tolist()])
            most = int(rows[:, width].max()) if len(rows) else 0
            if most <= capacity:
                break
            if table:
                self._tables = _room(most)  # every rank sees the same `most`
            else:
                self.capacity = _room(most)
        start = width + len(head)
        rows = rows[self.active]
        parts = [parse(row[start : start + int(row[width])]) for row in rows]
        return rows[:, :width], rows[:, width + 2 : start], parts

    def keep_room(self, parts: list[dict[Wire, Part]], kinds: dict[Wire, int]) -> None:
        """After a merge: room for what the next ones send, the largest entries of the slots
        not found per sample over the last merges (a first forward's entries, every output
        of it, come once), the same on every rank (from the gathered entries)."""
        sizes = [
            sum(8 + len(p.shape) + len(p.extra) for w, p in part.items() if kinds[w] != SAMPLE)
            for part in parts
        ]
        self._needs.append(max(sizes, default=0))
        self.capacity = _room(max(self._needs))

    def decide(
        self,
        model: Any,
        names: list[str],
        parts: list[dict[Wire, Part]],
        headers: Any,
        local: dict[Key, Seen],
        fixed: dict[Key, int],
    ) -> dict[Wire, int]:
        """The kind of every slot a rank sent, the same on every rank (`fixed`: decided for
        this forward already). One more all_gather where a new slot's shapes differ across
        the ranks (per-rank padding): sketches of the ranks' common part (`sketch`)."""
        batches = [int(b) for b in headers[:, 0].tolist()]
        same_inputs = len(set(headers[:, 1].tolist())) == 1
        wires = sorted(set().union(*parts))
        keys = {wire: (names[wire[0]], wire[1], wire[2]) for wire in wires}
        if not self.shared_data and (headers[:, 1] != 0.0).all() and not same_inputs:
            # some input of the model is the same on every rank while others differ (the
            # inputs compared: a slot undecided, or one `wants_inputs`): data the ranks share
            each = headers[:, 2 : 2 + _EACH]
            self.shared_data = any(col[0] != -1.0 and (col == col[0]).all() for col in each.T)
        common: dict[Wire, bool] = {}  # (an empty common part tells nothing: not alike)
        boxes = {
            wire: tuple(min(dims) for dims in zip(*(p[wire].shape for p in parts)))
            for wire in wires
            if keys[wire] not in fixed
            and self.kind(keys[wire]) == NEW
            and all(wire in p for p in parts)
            and len({len(p[wire].shape) for p in parts}) == 1
            and len({p[wire].shape for p in parts}) > 1
        }
        compared = [wire for wire, box in boxes.items() if all(box)]
        if compared:  # every rank computes the same list: all or none gather
            mine = []
            for wire in compared:
                box = tuple(slice(0, n) for n in boxes[wire])
                seen = local.get(keys[wire])  # (none on a rank that joined)
                mine.append(sketch(None if seen is None else seen.tensor, box))
            found = ops.all_gather(np.concatenate(mine), like=model)[self.active]
            found = found.reshape(len(found), len(compared), -1)
            for j, wire in enumerate(compared):
                common[wire] = alike(found[:, j])
        kinds: dict[Wire, int] = {}
        for wire in wires:
            key = keys[wire]
            if key in fixed:
                kinds[wire] = fixed[key]
                continue
            present = [(p[wire], b) for p, b in zip(parts, batches) if wire in p]
            kinds[wire] = self._kind(key, present, len(parts), same_inputs, common.get(wire))
        if not same_inputs or not wires:
            self.settled = True
        return kinds

    def _keep(self, key: Key, kind: int) -> int:
        self.kinds[key] = kind
        return kind

    def _kind(
        self,
        key: Key,
        present: list[tuple[Part, int]],
        world: int,
        same_inputs: bool,
        common: bool | None,
    ) -> int:
        prior = self.kind(key)
        if prior == SAMPLE:
            return prior
        shapes = {p.shape for p, _ in present}
        digests = {p.digest for p, _ in present}
        if prior == REDUCED:  # (data, final) one number while it stays one (a squeeze of a row)
            if all(math.prod(p.shape) == 1 for p, _ in present):
                return prior
            return self._keep(key, SAMPLE)
        if prior == NEW:
            if len(present) < world:  # not computed on every rank: it comes from the data
                return self._keep(key, SAMPLE)
            same = len(digests) == 1 if len(shapes) == 1 else bool(common)
            if not same:  # it depends on the data
                if _reduced(present):
                    return self._keep(key, REDUCED)
                if all(math.prod(p.shape) == 1 for p, _ in present):
                    return SAMPLE  # (one number at one row per rank: decided again next time)
                return self._keep(key, SAMPLE)
            if same_inputs:  # the same inputs everywhere: nothing tells data from parameters
                batched = all(p.shape[:1] == (b,) for p, b in present)
                scalar = shapes == {()}
                return SAMPLE if batched else REDUCED if scalar else SHARED  # this forward's
            return self._keep(key, COPY if _copy(present, self.shared_data) else SHARED)
        # SHARED or COPY, checked again with this forward's values
        if len(present) > 1 and len({len(s) for s in shapes}) > 1:
            return self._keep(key, SAMPLE)
        if len(present) > 1 and len(shapes) == 1 and len(digests) > 1:
            return self._keep(key, REDUCED if _reduced(present) else SAMPLE)
        if len(present) < world:
            return prior  # on some ranks only
        if _copy(present, self.shared_data):
            return self._keep(key, COPY)
        if len(shapes) == 1:
            return self._keep(key, SHARED)
        return prior  # their lengths differ (per-rank padding)


def _reduced(present: list[tuple[Part, int]]) -> bool:
    """Whether an output that depends on the data is one number computed from a rank's whole
    batch (a loss the model returns, 0-d or ``[1]``), not one per sample: one number on every
    rank, and 0-d or of one row where a rank's batch has more (at one row per rank, a ``[1]``
    output is taken as per sample)."""
    return all(math.prod(p.shape) == 1 for p, _ in present) and any(
        not p.shape or p.shape[0] != b for p, b in present
    )


def _copy(present: list[tuple[Part, int]], shared_data: bool) -> bool:
    """Whether an output equal on every rank (their common part where their lengths differ),
    while their inputs to the model differ, is per sample: one row per sample of every rank's
    batch (2 rows or more on some rank), and either its rows are all equal (a token copied per
    sample, `cls.expand(B, 1, D)`; a dead ReLU layer), or the module got the same tensors on
    every rank while some input of the model is equal on every rank (`shared_data`: timesteps
    drawn with the same seed on every rank; the modules after a shared table get the same
    tensors too, but then every input of the model differs)."""
    if not all(p.shape[:1] == (b,) for p, b in present) or all(b < 2 for _, b in present):
        return False
    if all(p.rows_equal for p, _ in present):
        return True
    inputs = {p.inputs for p, _ in present}
    return shared_data and len(inputs) == 1 and _NO_INPUTS not in inputs


def merged_squares(kind: int, grads: list[Any]) -> float:
    """The squared norm of the global batch's gradient of a slot from the ranks' gradients
    (float64, in rank order): the sum of theirs for a shared slot (each padded with zeros to
    the largest shape: the ranks' lengths may differ), their mean for a reduced one, and for a
    per-sample slot the sum of their squared norms."""
    if kind == SHARED:
        shape = tuple(max(dims) for dims in zip(*(g.shape for g in grads)))
        total = np.zeros(shape)
        for g in grads:
            total[tuple(slice(0, n) for n in g.shape)] += g
    elif kind == REDUCED and len({g.shape for g in grads}) == 1:
        total = np.mean(np.stack(grads), axis=0)
    else:
        return float(sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads))
    flat = total.reshape(-1)
    return float(np.dot(flat, flat))
