"""ActivationStats: spot dead or exploding layers."""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from unihook import (
    HookGroup,
    attach,
    ops,
    register_forward_hook,
    register_forward_pre_hook,
    select,
)

from ._scope import Chosen, Synced, check_every, check_history, tensors_of, where_of
from ._shared import (
    EVALUATION_FORWARD,
    JOINED,
    NEW,
    NO_INPUTS_HEADER,
    SAMPLE,
    SHARED,
    TRAINING_FORWARD,
    Key,
    Seen,
    Slots,
    batch_of,
    encode,
    inputs_header,
    stamp_of,
)
from .sinks import Writer, write_records

__all__ = ["ActivationStats"]


@dataclass
class _Running:
    calls: int = 0
    count: int = 0
    total: float = 0.0  # the mean is total / count: exact, whatever the order of calls
    m2: float = 0.0  # the sum of squared deviations from the mean, merged by Chan's formula
    low: float = float("inf")
    high: float = float("-inf")
    zeros: int = 0
    nonfinite: int = 0
    order: int = 0

    def merge(self, moments: ops.Moments) -> None:
        count, mean, m2, low, high, zeros, nonfinite = moments
        self.nonfinite += nonfinite
        if not count:
            return
        if self.count:  # Chan et al.: m2 of the union from both parts' means and m2s
            delta = mean - self.total / self.count
            m2 += self.m2 + delta * delta * self.count * count / (self.count + count)
        self.count += count
        self.total += mean * count
        self.m2 = m2
        self.low, self.high = min(self.low, low), max(self.high, high)
        self.zeros += zeros

    def add(self, other: _Running) -> None:
        """Merge another part's numbers (another rank's, another forward's) into these."""
        self.calls += other.calls
        self.merge(other.moments())

    def moments(self) -> ops.Moments:
        mean = self.total / self.count if self.count else 0.0
        return self.count, mean, self.m2, self.low, self.high, self.zeros, self.nonfinite


# per module in the ranks' vectors: calls, then `moments`, then its place in the rank's order
# (`_Running.order`: a rank that ran no forward files the modules in the others' call order)
_FIELDS = 9


class ActivationStats(Synced):
    """Running statistics of every selected module's output over forward calls: calls, mean,
    std, min, max, fraction of zeros, and the count of non-finite values (mean, std, min and max
    are over the finite values). Tuple, namedtuple, dict and nested outputs count every tensor
    in them. Each output is reduced where it lives (a CPU tensor through a zero-copy numpy view,
    numpy's pairwise sums being the fastest there; another device's with the framework's ops)
    with the two-pass variance per call and Chan's formula across calls: only seven numbers per
    tensor reach the host.

    `where`: None (every module), a glob or a list of globs, ``callable(name, module) -> bool``,
    or modules of `model` (alone or in a list, with names). `every=N`: record forwards 0, N,
    2N... of `model` only; between them the hooks are removed (one counter hook remains).

    ``stats.rows()``: one dict per module over every recorded call, in the order modules first
    ran; ``stats.report()``: a readable table. ``stats.history``: per recorded forward of
    `model`, ``{module name: row}`` of that forward alone (the last `max_history` forwards;
    None keeps all), which ``stats.write(writer, step)`` sends to TensorBoard and
    ``stats.plot()`` draws over steps. Use as a context manager or call `remove()`.

    Data parallel: `model` may be a DistributedDataParallel / paddle.DataParallel wrapper
    (names are the inner model's), also compiled. With `sync` (the default) and an initialised
    process group, each recorded forward of `model` ends with one all_gather of the numbers of
    every rank that splits the batch (the wrapper's own group; the default group for a model
    given unwrapped), merged by Chan's formula in rank order: every rank records the
    statistics of the global batch (calls: the most any rank made; an output shared by every
    sample, equal on every rank, counted once, as one process computes it once: README "Data
    parallel" has the rule), and `rows()` covers the forwards of `model` only (a submodule
    called on its own is left out). Merging, a forward of `model` under no_grad (an
    evaluation, which one rank may run alone) is neither recorded nor counted by `every`.
    `sync=False` keeps each rank's own numbers, and records those too. Uneven inputs: list
    the recipe before the model in torch's ``Join`` (README "Data parallel").
    """

    def __init__(
        self,
        model: Any,
        where: Any = None,
        *,
        every: int = 1,
        max_history: int | None = 1000,
        sync: bool = True,
    ) -> None:
        every = check_every(every)
        check_history(max_history)
        inner = ops.unwrap(model)
        where = where_of(inner, where)
        super().__init__()
        self.sync = sync
        self._model = model
        # this forward's ranks, when merged (from the start: a module called on one rank
        # before the model's first forward is left out of `rows()` as after it)
        self._world = self._merging(model, sync)
        self._names: list[str] = []  # the modules hooked: the layout of the ranks' vectors
        self._skipping = False  # this forward of the model is not recorded (see _counted)
        self._opened = 0  # forwards of the model whose start this recipe saw, not ended yet
        self._training = True  # the mode of the running forward of the model
        self._grad_sync: bool | None = None  # whether its wrapper all-reduces its gradients
        self._stats: dict[str, _Running] = {}
        self._fresh: list[str] = []  # the modules first seen in this forward, in call order
        # per thread, its forward's calls, into `history` at its end (`_step` reads this
        # thread's: two threads' forwards of one model at once, each entry of `history` is one
        # forward's; until 2026-12-07 one was shared, and a forward started on another thread
        # took this one's first calls)
        self._steps: dict[int, dict[str, _Running]] = {}
        self._history: deque[dict[str, _Running]] = deque(maxlen=max_history)
        self._written: object = None
        self._tags: dict[str, str] = {}  # module name -> its TensorBoard tag (`write`)
        # the last output reduced: (tensor, its version, its moments, what the ranks compare
        # of it), whose last a container returning its last child's output shares
        self._last: tuple[Any, Any, ops.Moments, Seen | None] | None = None
        # merging (see _shared): each output's kind, and this forward's model batch, inputs,
        # calls per module and the outputs not known per sample, with their moments
        self._slots = Slots()
        self._batch = -1
        self._inputs: Sequence[Any] = ()
        self._calls: dict[str, int] = {}
        self._seen: dict[Key, tuple[Seen, ops.Moments]] = {}
        self._folding = threading.RLock()  # `_step` changes (`_record_own`, `_fold`, `rows`)

        self._inner, self._where = inner, where
        self._schedule(model, every, self._place)
        self._watch_joins()

    @property
    def _step(self) -> dict[str, _Running]:
        return self._steps.setdefault(threading.get_ident(), {})

    @_step.setter
    def _step(self, step: dict[str, _Running]) -> None:
        self._steps[threading.get_ident()] = step

    def _hooked_modules(self) -> list[tuple[str, Any]]:
        walked = ops.named_modules(self._model)
        where = self._where
        return where.slots(walked) if isinstance(where, Chosen) else walked

    def _place(self, group: HookGroup) -> None:
        """The hooks of a recorded forward (`_schedule`)."""
        if not isinstance(self._where, Chosen):  # (the first placement chooses)
            self._where = Chosen(select(self._inner, self._where))
        model, inner, own = self._model, self._inner, self._own
        where = self._where.pairs(inner)  # (walked once for the hooks below)
        # A pre-hook fixes each module's place at its first call: rows come in call order (a
        # container before its children), not in order of completion.
        if self._every == 1:  # (else `_enter` calls it)
            group.add("", register_forward_pre_hook(model, self._begin, with_kwargs=True))
        group.extend(attach(inner, own(self._started), kind="forward_pre", where=where))
        attached = attach(inner, own(self._record), where=where)
        self._names = attached.names
        group.extend(attached)
        group.add("", register_forward_hook(model, own(self._close), always_call=True))

    def _counted(self, module: Any) -> bool:
        # Merging ranks, a forward under no_grad (an evaluation, which one rank may run alone)
        # is neither recorded nor counted: the ranks' collectives stay paired. A checkpoint's
        # recomputation in backward repeats a forward already recorded.
        if ops.in_backward(module):
            return False
        return self._merging(module, self.sync) is None or ops.grad_enabled(module)

    def _started(self, module: Any, args: Any, *, name: str) -> None:
        # (removed: a copy's hooks, which its `remove()` has no handle to take away)
        if self._skipping or self._removed or ops.in_backward(module):  # (or a recomputation)
            return
        if name not in self._stats:
            self._stats[name] = _Running(order=len(self._stats))
            self._fresh.append(name)

    def _record(self, module: Any, args: Any, output: Any, *, name: str) -> None:
        if self._skipping or self._removed or ops.in_backward(module):
            return
        tensors = tensors_of(output, module)
        if not tensors:
            return
        if len(tensors) > 1:
            # the integer and bool tensors beside real ones are bookkeeping (max pooling's
            # indices, a PackedSequence's batch sizes, topk's indices), not activations: until
            # 2026-12-04 they went into the row (helper-125's FINDING 8)
            real = [t for t in tensors if ops.is_floating(t)]
            if real:
                tensors = real
        running = self._stats.get(name)
        if running is None:
            # its pre-hook did not run: the call started before this recipe was made (inside a
            # forward of the model, by a hook or another thread; until 2026-12-01 KeyError
            # there: helper-80's FINDING 5)
            return
        if self._world is None:
            self._record_own(name, running, tensors)
            return
        # merged across ranks: the running numbers come from the merged steps (`_add`)
        step = self._step.get(name)
        if step is None:
            step = self._step[name] = _Running(order=running.order)
        step.calls += 1
        call = self._calls[name] = self._calls.get(name, -1) + 1  # (see _shared: slots)
        for position, tensor in enumerate(tensors):
            version, moments, seen = self._moments(tensor)
            key = (name, call, position)
            kind = self._slots.kind(key)
            if kind == SAMPLE:
                step.merge(moments)
            else:  # compared across ranks (the tensor kept until decided: NEW)
                if seen is None:
                    seen = Seen(tensor, self._batch, kind == NEW, args)
                elif kind == NEW and seen.tensor is None:
                    seen.tensor = tensor
                self._seen[key] = (seen, moments)
            self._last = (tensor, version, moments, seen)

    def _record_own(self, name: str, running: _Running, tensors: Sequence[Any]) -> None:
        """`_record` of this process's numbers alone (not merged across ranks): into this
        forward's step, folded into the running numbers as it ends (`_fold`)."""
        found = []
        for tensor in tensors:
            version, moments, _ = self._moments(tensor)
            self._last = (tensor, version, moments, None)
            found.append(moments)
        with self._folding:  # (another thread's forward may end the step meanwhile: `_fold`)
            step = self._step.get(name)
            if step is None:
                step = self._step[name] = _Running(order=running.order)
            step.calls += 1
            for moments in found:
                step.merge(moments)

    def _moments(self, tensor: Any) -> tuple[Any, ops.Moments, Seen | None]:
        """`tensor`'s version, its moments and what the ranks compare of it: the moments are
        its own at each call, also where a container returns its last child's output (until
        2026-12-04 the child's numbers were reused while the version counter had not moved,
        which writes through ``.data``, a numpy view or paddle's ``copy_`` do not move:
        helper-125's FINDING 2); what the ranks compare is the child's for that tensor."""
        version, last = ops.object_version(tensor), self._last
        seen = None
        if last is not None and last[0] is tensor and version is not None and version == last[1]:
            seen = last[3]
        return version, ops.moments(tensor), seen

    def _begin(self, module: Any, args: Any, kwargs: Any) -> None:
        if ops.in_backward(module):  # the model's recomputation: this forward's state stays
            return
        self._fold()
        self._opened += 1
        self._world = self._merging(module, self.sync)
        self._training = bool(ops.unwrap(module).training)  # (what the merge says it is about)
        self._grad_sync = ops.grad_sync(module) if self._world is not None else None
        self._skipping = not self._counted(module)
        self._calls, self._seen = {}, {}
        self._fresh = []
        if self._world is not None and not self._skipping:
            self._inputs = ops.tensors_in((args, kwargs), like=module)
            self._batch = batch_of(self._inputs)

    def _close(self, module: Any, args: Any, output: Any) -> None:
        if ops.in_backward(module):
            return
        self._last = None
        if not self._opened:  # a forward that started before this recipe: not a step of it
            self._fold()
            return
        self._opened -= 1
        if self._skipping:
            self._skipping = False
            return
        if self._world is not None and output is None and sys.exc_info()[0] is not None:
            # the forward raised (torch's Join with throw_on_early_termination, at its start,
            # on every rank that has inputs left): no merge, which the others do not run
            self._step, self._inputs, self._seen = {}, (), {}
            return
        if self._world is not None:
            stamp = TRAINING_FORWARD if self._training else EVALUATION_FORWARD
            self._add(self._merge(self._step, stamp_of(stamp, self._grad_sync)))
            self._inputs, self._seen = (), {}
        elif self._step:
            self._history.append(self._step)
        self._fold()

    def _fold(self) -> None:
        """The calls recorded since the last fold (a forward's, or calls of modules outside
        one) into the running numbers, which `rows()` reads with them meanwhile. Not as each
        call ends: a deep copy made during a forward (by a hook) then took the original's
        half forward as its own (helper-109's FINDING 3b). Merged across ranks, the running
        numbers are the merged steps' (`_add`)."""
        with self._folding:
            step = self._steps.pop(threading.get_ident(), {})
            if self._world is None:
                for name, part in step.items():
                    self._stats[name].add(part)

    def _copied(self) -> None:
        super()._copied()
        # (no forward under way: the original's running one is not the copy's; calls made
        # outside a forward are the copy's numbers too: helper-116's FINDING 1)
        if not self._opened and any(self._steps.values()) and self._world is None:
            self._stats = self._totals()
        self._steps, self._opened, self._skipping, self._fresh = {}, 0, False, []
        self._calls, self._seen, self._inputs, self._batch = {}, {}, (), -1
        del self.__dict__["_folding"]  # (a lock: the copy's own, `__setstate__`)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._folding = threading.RLock()

    def _let_go(self) -> None:
        super()._let_go()
        self._last = None

    def _add(self, merged: dict[str, _Running]) -> None:
        """A forward's numbers merged across ranks: in `rows()` and `history`."""
        for name, step in merged.items():
            self._stats[name].add(step)
        if merged:
            self._history.append(merged)

    def _shadowing(self) -> bool:
        # (see Synced) unless `every` skips the others' forward
        merging = not self._removed and self._merging(self._model, self.sync) is not None
        return merging and self._advance()

    def _shadow_forward(self) -> None:
        self._add(self._merge({}, JOINED))  # (the merge of that forward: nothing of this rank)

    def _merge(self, step: dict[str, _Running], stamp: int) -> dict[str, _Running]:
        """The end of a forward with several ranks: one all_gather of every rank's vector (per
        module: calls, count, mean, m2, min, max, zeros, non-finite of its per-sample outputs;
        then the outputs not known per sample, see _shared: digest, shape, moments), merged in
        rank order (Chan's formula; a shared output counted once), the same on every rank."""
        names = self._names
        index = {name: i for i, name in enumerate(names)}
        local = np.zeros((len(names), _FIELDS))
        local[:, 4], local[:, 5] = np.inf, -np.inf  # min and max of nothing
        for i, name in enumerate(names):
            part = step.get(name)
            if part is not None:
                local[i, :-1] = (part.calls, *part.moments())
            local[i, -1] = self._stats[name].order if name in self._stats else len(names)
        seen = self._seen
        entries = [encode(index, key, s, moments) for key, (s, moments) in seen.items()]
        compared = self._slots.wants_inputs((key, s) for key, (s, _) in seen.items())
        header = (self._batch, *(inputs_header(self._inputs) if compared else NO_INPUTS_HEADER))
        ranks, headers, parts = self._slots.exchange(
            self,
            self._model,
            names,
            local.reshape(-1),
            lambda n: n * _FIELDS,
            header,
            entries,
            stamp,
        )
        found = {key: s for key, (s, _) in seen.items()}
        kinds = self._slots.decide(self._model, names, parts, headers, found, {})
        self._slots.keep_room(parts, kinds)
        for s, _ in seen.values():
            s.tensor = None
        if not names:  # (every rank watches none: the check above said so)
            return {}
        ranks = ranks.reshape(-1, len(names), _FIELDS)
        slots: dict[int, list[tuple[int, list[Any]]]] = {}  # per module: (kind, rank's parts)
        for wire, kind in kinds.items():  # (sorted)
            slots.setdefault(wire[0], []).append((kind, [p[wire] for p in parts if wire in p]))
        ran = ranks[:, :, 0] > 0
        # the modules first seen in this forward, here (`_started`) or on other ranks only,
        # filed in one order on every rank: that of the first rank each ran on (its places)
        fresh = {index[name] for name in self._fresh if name in index}
        start = len(self._stats) - len(fresh)
        new = fresh | {i for i, n in enumerate(names) if ran[:, i].any() and n not in self._stats}

        def place(i: int) -> tuple[float, int]:
            return (ranks[ran[:, i].argmax(), i, -1] if ran[:, i].any() else np.inf, i)

        for k, i in enumerate(sorted(new, key=place)):
            self._stats.setdefault(names[i], _Running()).order = start + k
        self._fresh = []
        merged: dict[str, _Running] = {}
        for i, name in enumerate(names):
            if not ran[:, i].any():
                continue
            calls = ranks[:, i, 0]
            total = merged[name] = _Running(order=self._stats[name].order)
            for row in ranks[:, i]:
                total.merge(_moments(row[1:-1]))
            for kind, found_parts in slots.get(i, ()):
                if kind == SHARED:  # once: the largest rank's (the others' are its part)
                    sizes = [int(np.prod(p.shape)) for p in found_parts]
                    found_parts = [found_parts[sizes.index(max(sizes))]]
                for p in found_parts:
                    total.merge(_moments(p.extra))
            total.calls = int(calls.max())  # each rank runs the model once per global batch
        return merged

    @property
    def history(self) -> list[dict[str, dict[str, Any]]]:
        return [{r["name"]: r for r in _rows(step)} for step in self._history]

    def write(self, writer: Writer | None, step: int, *, all_ranks: bool = False) -> bool:
        """Send the last recorded forward's rows to `writer` (a tensorboardX or torch
        SummaryWriter, see `summary_writer`): scalars ``activations/<module>/<stat>`` and, across
        modules, histograms ``activations/mean`` and ``activations/std``. False (nothing
        written) when no forward was recorded since the last write (an off-step of `every`),
        on every rank but 0 of the ranks that split the model's batch (`ops.world`) unless
        `all_ranks`, and with no `writer` (None: a rank that keeps none)."""
        if writer is None or not self._writes(self._model, all_ranks):
            return False
        if not self._history or self._history[-1] is self._written:
            return False
        self._written = self._history[-1]
        write_records(
            writer,
            "activations",
            _rows(self._history[-1]),
            STATS,
            step,
            vars(self).setdefault("_tags", {}),
        )
        return True

    def plot(self, path: str | None = None, *, all_ranks: bool = False) -> Any:
        """Per-module mean, std and fraction of zeros over the recorded forwards (matplotlib
        Figure; saved to `path` when given, by rank 0 only unless `all_ranks`)."""
        from .plots import plot

        return plot(stats=self, path=path, all_ranks=all_ranks)

    def rows(self) -> list[dict[str, Any]]:
        if self._world is not None or not any(self._steps.values()):
            return _rows(self._stats)
        return _rows(self._totals())  # (during a forward: with its calls so far, see `_fold`)

    def _totals(self) -> dict[str, _Running]:
        """The running numbers with the calls not folded yet, every thread's (new objects
        where they differ)."""
        with self._folding:
            stats = dict(self._stats)
            for step in list(self._steps.values()):
                for name, part in step.items():
                    total = stats[name] = dataclasses.replace(stats[name])
                    total.add(part)
        return stats

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


STATS = ("mean", "std", "min", "max", "zeros")


def _moments(values: Any) -> ops.Moments:
    count, mean, m2, low, high, zeros, nonfinite = values.tolist()
    return int(count), mean, m2, low, high, int(zeros), int(nonfinite)


def _rows(stats: dict[str, _Running]) -> list[dict[str, Any]]:
    rows = []
    for name, r in sorted(stats.items(), key=lambda item: item[1].order):
        if not r.calls:
            continue
        mean = r.total / r.count if r.count else float("nan")
        values = r.count + r.nonfinite  # (0: every output empty, an expert given no token)
        rows.append(
            {
                "name": name,
                "calls": r.calls,
                "mean": mean,
                "std": math.sqrt(r.m2 / r.count) if r.count else float("nan"),
                "min": r.low if r.count else float("nan"),
                "max": r.high if r.count else float("nan"),
                "zeros": r.zeros / values if values else float("nan"),
                "nonfinite": r.nonfinite,
            }
        )
    return rows
