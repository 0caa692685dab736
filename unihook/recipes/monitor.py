"""GradientMonitor: the norm of the gradient at each module's output per backward; stop at the
first NaN/Inf."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import math
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Mapping
from threading import get_ident
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from unihook import (
    HookGroup,
    NoGradError,
    UnihookError,
    attach,
    ops,
    register_forward_hook,
    register_forward_pre_hook,
    register_tensor_hook,
    select,
)

from ._scope import (
    Chosen,
    Synced,
    check_every,
    check_history,
    executing,
    hook_caller,
    live_thread_ids,
    tensors_of,
    where_of,
)
from ._shared import (
    BACKWARD,
    FORWARD_TABLE,
    JOINED,
    NEW,
    NO_INPUTS_HEADER,
    SAMPLE,
    Key,
    Seen,
    Slots,
    batch_of,
    encode,
    inputs_header,
    merged_squares,
    stamp_of,
)
from .sinks import Writer, write_records

# a call's argument tensors' change marks, by id: (a weak reference to it, its mark)
_Marks = dict[int, tuple["weakref.ref[Any]", object]]
# a call's arguments' marks, the autograd history as it started (`ops.history_mark`), and
# its place among the calls started (`_started`)
_Call = tuple[_Marks, object, int]

__all__ = ["GradientMonitor", "NonFiniteGradientError"]

_POLICIES = ("raise", "warn", "ignore")

# why a module's grad_output norm is left out (`_left_out`)
_RETURNED = (
    "returned its input unchanged as its output, whose gradient sums every use of that input"
)
_MADE_BEFORE = (
    "returned a tensor made before the call (or on another thread) that is not one of its "
    "arguments (a state kept from earlier), whose gradient sums every use of that tensor"
)
_RETURNED_AGAIN = (
    "returned a tensor that a later call returned again (a state it kept), whose gradient "
    "sums both calls' uses"
)
_KEPT = (
    "returned a tensor it also keeps (an attribute, `self.out = ...`, or an item of a dict, "
    "list or tuple attribute, or of an object it holds; or put into a list or dict it was "
    "given; or a module inside it kept it), whose gradient sums every use of it, also where "
    "that is read"
)
_HELD = (
    "returned a tensor that a module of the model holds at the end of the forward (an "
    "attribute, or an item of a dict, list or tuple attribute, also one level deeper), "
    "whose gradient sums every use of it, also where it is read"
)
_FROM_INSIDE = (
    "returned the output of a call inside it that a later call inside it got as an argument, "
    "whose gradient sums that use with the caller's"
)
_FROM_ANOTHER = (
    "returned a tensor twice or one computed from another (or the backend cannot tell which), "
    "whose gradient sums its use inside the call with the caller's"
)


class NonFiniteGradientError(UnihookError, FloatingPointError):
    """A gradient with NaN or Inf reached a module's output (the first one in backward order).
    Across ranks, `rank` is the lowest rank (in the default process group) where one appeared
    and `ranks` all of them (every rank raises the same error); None and () in a single
    process."""

    def __init__(
        self, module: str, norms: dict[str, float], rank: int | None = None, ranks: Any = ()
    ) -> None:
        self.module = module
        self.rank = rank
        self.ranks: tuple[int, ...] = tuple(ranks)
        where = "" if rank is None else f" on rank {rank}"
        others = f"; non-finite on ranks {list(self.ranks)}" if len(self.ranks) > 1 else ""
        super().__init__(
            f"non-finite gradient at the output of {module or '(model)'!r}{where} "
            f"(the first module in backward order where it appeared{others})"
        )


class _Step:
    """One forward of the model: its outputs' gradients fill `norms` during its backward."""

    __slots__ = (
        "norms",
        "squares",
        "logged",
        "flagged",
        "first_bad",
        "world",
        "pending",
        "merge",
        "merged",
        "serial",
        "rank",
        "batch",
        "inputs",
        "inputs_header",
        "calls",
        "seen",
        "kinds",
        "sample",
        "grads",
        "extra",
        "leaves",
        "dropping",
        "grad_sync",
        "hooked",
        "kept",
        "shared",
        "left",
        "consumed",
        "ran",
        "taps",
        "tap_stamps",
        "__weakref__",  # (a backend may hold `drop_leaves` weakly until a backward ends)
    )

    def __init__(self, world: tuple[int, int] | None, serial: int = 0) -> None:
        # the output tensors hooked, by id: the names their hook adds to, and the calls
        # started by then (see `_record`, `_unhook_earlier`)
        self.hooked: dict[int, tuple[weakref.ref[Any], list[str], int]] = {}
        # the outputs left out as kept by a module (`_keeps` as a call ends, `_kept` as the
        # forward ends), by id, and the calls started by then: a container returning one goes
        # too, and a later call returning one was made before it (`_hooked_before`)
        self.kept: dict[int, tuple[weakref.ref[Any], int]] = {}
        # the name lists of the other hooks on an output hooked again (a container returning
        # it in a tuple), by id: `_kept` leaves them all out
        self.shared: dict[int, list[list[str]]] = {}
        # the modules left out of this forward (`_left_out`): a call of one that was recorded
        # is not its grad_output alone (helper-92's FINDING 6)
        self.left: set[str] = set()
        # the tensors calls got as arguments, by id: the latest such call's start (`_started`)
        self.consumed: dict[int, int] = {}
        # the ids of the monitored modules called in this forward (`_before`): a chosen one
        # never called (a ModuleList, a block whose child is called past it) made no look of
        # its own inside (`_kept_below`)
        self.ran: set[int] = set()
        # what monitored modules held as their calls ended, where one was made from the
        # call's arguments (`_arguments_kept`), weakly, and the calls started by then (in
        # order): a call around them checks what was kept inside it (`_tapped`)
        self.taps: list[weakref.ref[Any]] = []
        self.tap_stamps: list[int] = []
        self.norms: dict[str, float] = {}
        self.squares: dict[str, float] = {}  # this rank's, over every backward of the forward
        self.logged = False  # in `history` once its first gradient arrived
        self.flagged = False
        self.first_bad: str | None = None  # across ranks: reported at the end of backward
        self.world = world  # (rank, size) when the ranks' numbers are merged, else None
        self.pending = False  # a merge waits for the end of the running backward
        self.merge: Callable[[], None] | None = None  # (queued: see Recipe._queue_merge)
        self.serial = serial  # the recipe's forwards so far: the same on every rank
        self.merged = False  # merged once: a parameter's gradient starts no further merge
        self.rank = 0  # this rank in the default group (errors name it), when merged
        # merged only (see _shared): the model's batch and input tensors (until their digest
        # is taken, at the end of the forward), each module's calls so far
        self.batch = -1
        self.inputs: Sequence[Any] = ()
        self.inputs_header = NO_INPUTS_HEADER
        self.calls: dict[str, int] = {}
        self.seen: dict[Key, Seen] = {}  # the slots not known per sample: sent with gradients
        self.kinds: dict[Key, int] = {}  # decided at the end of this forward
        self.sample: dict[str, float] = {}  # squares of the per-sample slots, per module
        self.grads: dict[Key, Any] = {}  # the `seen` slots' gradients (float64) until a merge
        self.extra: dict[str, float] = {}  # the `seen` slots' merged squares, per module
        # hooks on outputs that are autograd leaves (a parameter the module returns), which
        # would fire in every later backward: removed after the first backward of this step
        self.leaves: list[Any] = []
        self.dropping = False
        self.grad_sync: bool | None = None  # whether the wrapper all-reduces its gradients

    def drop_leaves(self) -> None:
        leaves, self.leaves = self.leaves, []
        for handle in leaves:
            handle.remove()


class GradientMonitor(Synced):
    """Records ``{module name: grad_output norm}`` for each backward in `history` (one dict per
    forward of `model` whose gradients were computed, modules in backward order). A NaN or Inf
    in a grad_output raises NonFiniteGradientError naming the first module where it appeared
    (`on_nonfinite="raise"`), warns (`"warn"`) or is only recorded (`"ignore"`).

    Each module's forward hook puts a gradient hook on its output tensors (a tuple's or
    namedtuple's each; `ops.on_grad`, torch's own hook on torch): no module backward hook,
    which paddle can only emulate at a cost. A module returning an input unchanged
    (nn.Identity), or a tensor and one computed from it (``return f, f.sum()``), is left out,
    with a RuntimeWarning: the first one's gradient sums every use of it, not its grad_output
    (`ops.derived`). A container returning its last child's output (same
    tensor, same version) shares its hook. Norms are sums of squares accumulated in
    float64 (torch and paddle agree to the gradients' own precision); a module called several
    times reports the norm over all its calls' grad_outputs. `where`: as ActivationStats'.
    `every=N`: record the backward of forwards 0, N, 2N... of `model` only (wandb.watch's
    `log_freq`), counting the forwards that record gradients (not those under no_grad,
    which have none to log); between them the hooks are removed (one counter hook remains).
    `history` keeps the last `max_history` backwards (a ring buffer; None keeps every one).
    ``monitor.write(writer, step)`` sends the last backward's norms to TensorBoard,
    ``monitor.plot()`` draws them over steps.

    Data parallel: `model` may be a DistributedDataParallel / paddle.DataParallel wrapper
    (names are the inner model's), also compiled. With `sync` (the default) and an initialised
    process group, each backward ends with one all_gather over the ranks that split the batch
    (the wrapper's own group; the default group for a model given unwrapped): every rank then
    records the norms of the global batch's grad_outputs, and a NaN or Inf on any rank raises
    (warns) the same NonFiniteGradientError on every rank, at the end of that backward. A
    per-sample output's squares add up across ranks; an output shared by every sample (equal
    on every rank: a positional table broadcast over the batch) is sent whole, its gradients
    summed before the norm; a scalar computed from the batch (a loss the model returns) has
    the ranks' common gradient (README "Data parallel" has the rule). `sync=False` keeps each
    rank's own numbers. Uneven inputs: list the recipe before the model in torch's ``Join``.
    """

    def __init__(
        self,
        model: Any,
        where: Any = None,
        *,
        on_nonfinite: str = "raise",
        every: int = 1,
        max_history: int | None = 1000,
        sync: bool = True,
    ) -> None:
        if on_nonfinite not in _POLICIES:
            raise ValueError(
                f"`on_nonfinite` must be one of {{'raise', 'warn', 'ignore'}}. "
                f"Received: on_nonfinite={on_nonfinite!r}"
            )
        check_history(max_history)
        every = check_every(every)
        inner = ops.unwrap(model)
        where = where_of(inner, where)
        super().__init__()
        self.on_nonfinite = on_nonfinite
        self.sync = sync
        self.history: deque[dict[str, float]] = deque(maxlen=max_history)
        # the forward each entry of `history` is of, by id (see `_log`), and the latest
        self._serials: dict[int, int] = {}
        self._latest = 0
        self._model = model
        # each thread's step: the latest forward with gradients it ran (two threads training
        # one model take turns, each forward's records its own: until 2026-12-07 one step was
        # shared, and a forward started on another thread took the rest of this one's
        # records, or its parameters' gradients: helper-210's FINDING 2); `_step` reads it
        self._steps: dict[int, _Step] = {}
        self._newest = _Step(None)  # the latest started on any thread
        self._names: list[str] = []  # the modules hooked: the layout of the ranks' vectors
        self._written: object = None
        self._tags: dict[str, str] = {}  # module name -> its TensorBoard tag (`write`)
        # the last output hooked: (tensor, its version, the names sharing its gradient hook)
        self._last: tuple[Any, Any, list[str]] | None = None
        # forwards of `model` running: a module called outside them (a submodule on its own,
        # the inner model of a wrapper, GradCAM's forward) is not part of a recorded step; per
        # thread, the `_started` count as each began, whether it began with gradients (one
        # begun without records nothing) and the frame that called `_begin` (see
        # `_left_behind`)
        self._running = 0
        self._running_on: dict[int, list[tuple[int, bool, Any]]] = {}
        self._parameters_hooked = False  # (see _begin)
        self._slots = Slots()  # per sample or shared: each output's merge (see _shared)
        self._deciding: _Step | None = None  # the forward whose slots the ranks decide at its end
        self._forwards_seen = 0  # forwards with gradients: each step's serial
        self._with_grad = False  # the last forward of the model outside backward had gradients
        self._shadowed: _Step | None = None  # (a rank that joined) the step it shadows

        # per thread and module, its running calls' arguments' change marks as they started
        # (`_before`; a module shared by threads has calls running on each at once)
        self._versions: dict[tuple[int, str], list[_Call]] = {}
        # the modules seen returning an input as their output, unchanged (`_left_out`: said once)
        self._returning: set[str] = set()
        # the modules that ran with gradients in a forward begun without (`_record`: said once)
        self._unrecorded: set[str] = set()
        self._started = 0  # calls started (`_before`): which came before which
        # the output tensors earlier forwards hooked that are still alive, by id: their hooks'
        # names (see `_unhook_earlier`; `_Step.hooked` has the running forward's)
        self._earlier: dict[int, tuple[weakref.ref[Any], list[str]]] = {}
        self._prune_at = 256  # (see `_keep_hooked`)
        # the outputs earlier forwards kept (`_kept`), still alive, by id (`_keep_hooked`)
        self._kept_before: dict[int, weakref.ref[Any]] = {}
        self._kept_prune_at = 256

        # the ids of the modules hooked, where `where` leaves some out (see `_kept_below`)
        self._chosen: _Chosen | None = None

        self._inner, self._where = inner, where
        self._schedule(model, every, self._place)
        self._watch_joins()

    @property
    def _step(self) -> _Step:
        """This thread's step; on a thread that ran no forward (a backward run on another
        thread than its forward's: torch's device threads), the latest started."""
        step = self._steps.get(get_ident())
        return self._newest if step is None else step

    @_step.setter
    def _step(self, step: _Step) -> None:
        thread = get_ident()
        with self._counting:
            steps = self._steps
            if thread not in steps and steps:
                # a new thread: the steps of threads that ended go (their leaves' hooks too;
                # one handed its outputs to another thread keeps the newest)
                alive = live_thread_ids()
                for gone in [t for t in steps if t not in alive]:
                    old = steps.pop(gone)
                    # (out of `_hooked_elsewhere`'s sight: its outputs were made before)
                    self._keep_hooked(old)
                    if old is not self._newest:
                        old.drop_leaves()
            steps[thread] = self._newest = step

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
        self._chosen = _chosen_ids(inner, where)
        if self._every == 1:  # (else `_enter` calls it)
            group.add("", register_forward_pre_hook(model, self._begin, with_kwargs=True))
        attached = attach(inner, own(self._record), where=where, with_kwargs=True)
        group.extend(attached)  # (first: a Ctrl-C in `names` left them, helper-103's F5)
        self._names = attached.names
        group.extend(
            attach(inner, own(self._before), kind="forward_pre", where=where, with_kwargs=True)
        )
        # (after `_record`; also when the forward raised: a recursive call's inner call must
        # not leave its marks for the outer one)
        group.extend(attach(inner, own(self._after), where=where, always_call=True))
        # registered after attach's hooks: the forward's outputs are all recorded (and kept,
        # also by a user's hook on a module that runs after the monitor's)
        group.add("", register_forward_hook(model, own(self._kept), always_call=True))
        group.add("", register_forward_hook(model, own(self._settle)))
        group.add("", register_forward_hook(model, own(self._forget), always_call=True))

    def _counted(self, module: Any) -> bool:
        # `every` counts the forwards that record gradients: one under no_grad (an evaluation,
        # which one rank may run alone) has none to log; nor does a checkpoint's recomputation
        # of a forward that had gradients
        return ops.grad_enabled(module) and not self._repeats(module)

    def _repeats(self, module: Any) -> bool:
        """Whether this forward of the model is a checkpoint's recomputation, in backward, of
        one that recorded gradients (torch's non-reentrant `checkpoint`): the gradients come
        through that one's outputs. Recomputing one run without gradients (a reentrant
        checkpoint), it is the forward whose outputs the gradients come through."""
        return self._with_grad and ops.in_backward(module)

    def _begin(self, module: Any, args: Any, kwargs: Any) -> None:
        thread, caller = get_ident(), hook_caller(module, sys._getframe(1))
        entry = (self._started, ops.grad_enabled(module), caller)
        with self._counting:  # (another thread's lone call may end this thread's ended ones)
            if self._running_on.get(thread):
                self._left_behind(thread)
            self._running += 1
            self._running_on.setdefault(thread, []).append(entry)
        if self._repeats(module):
            return
        if not ops.in_backward(module):
            self._with_grad = ops.grad_enabled(module)
        self._deciding = None
        if not ops.grad_enabled(module):
            # no gradient will come: the step of the last forward with gradients stays (an
            # evaluation between a forward and its backward, on one rank, must not start a
            # step that its backward's parameter gradients would merge), and so do hooks
            # placed ahead for the next one (`every`: that forward's backward, a reentrant
            # checkpoint's recomputation in it, is not recorded; until 2026-12-02 it was,
            # into the last recorded step: helper-97's FINDING 8)
            return
        self._placed_ahead = False
        # (this thread's: the newest step may be another thread's, whose forward may be
        # running; until 2026-12-08 a thread's first forward took it for its previous, its
        # outputs hooked so far for ones made before its later calls, those calls left out)
        previous = self._steps.get(thread)
        if previous is not None:
            previous.drop_leaves()  # (a step whose backward never came)
            if previous.pending and previous.merge is not None:
                self._cancel_merge(previous.merge)  # (its backward raised: it never ended)
            self._keep_hooked(previous)
        step = self._step = _Step(self._merging(module, self.sync), self._next_serial())
        if step.world is None:
            return

        step.inputs = ops.tensors_in((args, kwargs), like=module)
        step.batch = batch_of(step.inputs)
        step.grad_sync = ops.grad_sync(module)
        if not self._slots.settled:
            self._deciding = step
        if not self._parameters_hooked:
            # A rank whose backward reaches no watched output (the dummy loss of an empty
            # batch: parameters times 0) merges too, when a parameter's gradient comes. Hooked
            # at the first merged forward (the process group may come after the recipe), for
            # the recipe's life: `every` removes the other hooks after a logged forward, and a
            # parameter's hook removed then would not fire in that forward's backward.
            self._parameters_hooked = True
            for name, inner in ops.named_modules(ops.unwrap(self._model)):
                for param, _, trained in ops.own_parameters(inner):
                    if trained:
                        self._hooks.add(name, register_tensor_hook(param, self._parameter_grad))

    def _forget(self, module: Any, args: Any, output: Any) -> None:
        thread = get_ident()
        with self._counting:
            running = self._running_on.get(thread)
            if running and not executing(running[-1][2]):
                # a call inside this forward that a BaseException left, which this one caught:
                # the last entry is not this one's (helper-104's FINDING 2)
                self._left_behind(thread)
                running = self._running_on.get(thread)
            if running:  # (none: the hooks were placed while this forward ran)
                running.pop()
                self._running -= 1
                if not running:
                    del self._running_on[thread]
        self._last = None
        step = self._step
        if step.inputs:  # a slot still undecided at the merge compares the inputs too
            if self._slots.wants_inputs(step.seen.items()):
                step.inputs_header = inputs_header(step.inputs)
            step.inputs = ()

    def _left_behind(self, thread: int) -> None:
        """The forwards counted as running on `thread` whose frame has ended (`executing`): a
        BaseException left them (a KeyboardInterrupt, a task's CancelledError: no
        `always_call` hook, nor `_after`, runs then; until 2026-12-02 only those at the depth
        a new forward started at or deeper ended, and one left at a shallower place, or on a
        thread that ran no forward since, kept a submodule's later lone call in the last step:
        helper-101's FINDING 5, helper-103's FINDING 2). They end now. Where none is left
        running on `thread`, so do the marks of the calls that started since the first of
        them began; while one still runs (it caught the exception), its own calls' marks
        cannot be told from theirs and all stay (`_record` reads only the newest of a
        module's: helper-79's attack)."""
        with self._counting:  # (that thread may start a forward meanwhile: helper-104 F5)
            self._end_left_behind(thread)

    def _end_left_behind(self, thread: int) -> None:
        running = self._running_on.get(thread, [])
        kept = [entry for entry in running if executing(entry[2])]
        if len(kept) == len(running):
            return
        self._running -= len(running) - len(kept)
        self._last = None
        if kept:
            self._running_on[thread] = kept
            return
        self._running_on.pop(thread, None)
        first = running[0][0]
        for key in [key for key in list(self._versions) if key[0] == thread]:  # (others add)
            stack = [call for call in self._versions.get(key, ()) if call[2] <= first]
            if stack:
                self._versions[key] = stack
            else:
                self._versions.pop(key, None)

    def _running_step(self) -> _Step:
        """The step of the forward running on another thread: the one, else the newest
        (several run: which one the call is part of is not known)."""
        threads = list(self._running_on)
        found = self._steps.get(threads[0]) if len(threads) == 1 else None
        return self._newest if found is None else found

    def _settle(self, module: Any, args: Any, output: Any) -> None:
        """The end of a forward while the ranks have not yet told data from parameters (the
        first one, and those whose inputs were the same on every rank): they decide every
        slot of it now, so that the backward sends only the shared slots' gradients."""
        step, self._deciding = self._deciding, None
        if step is None or step is not self._step or self._slots.settled:
            return
        step.inputs_header = inputs_header(step.inputs)
        step.inputs = ()
        kinds = self._decide_table(step, FORWARD_TABLE)
        index = {name: i for i, name in enumerate(self._names)}
        for key, seen in list(step.seen.items()):
            kind = step.kinds[key] = kinds[index[key[0]], key[1], key[2]]
            seen.tensor = None
            if kind == SAMPLE:
                del step.seen[key]

    def _kept(self, module: Any, args: Any, output: Any) -> None:
        """The end of a forward: an output hooked in it that a module of the model holds (an
        attribute, ``self.out = y``; an item of a dict, list or tuple attribute, or of one
        inside it: paddle files a tensor attribute among its buffers, an RNN its state as a
        tuple) is read again wherever that is read (the caller, a later module, a loss over
        captured features), and its gradient hook sums those uses, where torch's hook on the
        call sees only what comes through the output returned (helper-77's FINDINGS 1 and 2).
        Every call hooked on it is left out, a container returning it too. Looked for as the
        forward ends (also when it raised), in every module (also those `where` leaves out:
        helper-92's FINDING 1), so that a hook of the user's keeping an output after the
        monitor's ran is seen (its FINDING 2); each call also looks in its own module as it
        ends (`_keeps`: an output kept and dropped before the forward ends). Not seen: an
        output kept where no module holds it (a closure, a global), deeper, in larger
        containers (`_objects_within`), by a hook on the model that runs after this one, or a
        view or copy of it kept after the call (one kept in it is `_made_from`'s). A module's
        own parameter it returns is not kept (it is `_record`'s)."""
        step = self._step
        if not step.hooked or not ops.grad_enabled(module) or self._repeats(module):
            return
        # every module of the model, hooked or not, as it is now: also one set in after the
        # monitor was made (helper-94's FINDING 9; about 1.5 us a module, a third of `_held`'s)
        holders = [held for _, held in ops.named_modules(self._inner)]
        for holder, key in _held(holders, step.hooked):
            ref, names, _ = step.hooked[key]
            tensor = ref()
            if tensor is None or (
                ops.is_leaf(tensor) and any(p is tensor for p, _, _ in ops.own_parameters(holder))
            ):
                continue
            step.kept[key] = (ref, self._started)
            # Every call hooked on it goes, also where the holder is a module whose call got it
            # (``self.last_input = x``), which holds the alias torch handed it, so that the
            # calls that made it count its reads: a forward hook of the user's on the maker
            # storing the raw output there looks the same (helper-95's FINDING 1).
            for hooked in (names, *step.shared.get(key, ())):
                for name in hooked:
                    self._left_out(step, name, _HELD)
                hooked.clear()  # (its hook adds to no module now)

    def _decide_table(self, step: _Step, stamp: int) -> dict[Any, int]:
        """The ranks' decision of every output of `step`'s forward (one exchange of them)."""
        names = self._names
        index = {name: i for i, name in enumerate(names)}
        entries = [encode(index, key, seen, ()) for key, seen in step.seen.items()]
        header = (step.batch, *step.inputs_header)
        _, headers, parts = self._slots.exchange(
            self,
            self._model,
            names,
            (),
            lambda count: 0,
            header,
            entries,
            stamp_of(stamp, step.grad_sync),
            table=True,
        )
        return self._slots.decide(self._model, names, parts, headers, step.seen, {})

    def _shadowing(self) -> bool:
        # (see Synced) a forward of the others: the step whose merges this rank shadows,
        # unless `every` skips it
        self._shadowed = None
        world = self._merging(self._model, self.sync)
        if self._removed or world is None or not self._advance():
            return False
        self._step.drop_leaves()  # (as `_begin`)
        if self._step.pending and self._step.merge is not None:
            self._cancel_merge(self._step.merge)
        self._step = self._shadowed = _Step(world, self._next_serial())
        return True

    def _next_serial(self) -> int:
        with self._counting:  # (forwards beginning on two threads: a serial each)
            self._forwards_seen += 1
            return self._forwards_seen

    def _shadow_forward(self) -> None:
        # the decision at the end of the forward while the ranks have not told data from
        # parameters (`_settle`)
        step = self._shadowed
        if step is not None and not self._slots.settled:
            kinds = self._decide_table(step, JOINED)
            # the kinds the others decided for this forward, as they hold them at its merge
            names = self._names
            step.kinds = {(names[w[0]], w[1], w[2]): kind for w, kind in kinds.items()}

    def _shadow_backward(self) -> None:
        step, self._shadowed = self._shadowed, None
        if step is not None:
            self._log(step)
            self._merge(step, JOINED)

    def _before(self, module: Any, args: Any, kwargs: Any, *, name: str) -> None:
        """A call starts: its tensor arguments' change marks (their autograd histories),
        which tell a module returning one unchanged (nn.Identity) from one that changed it in
        place (an in-place ReLU, whose output's gradient hook sees the gradient of the changed
        tensor only). Kept per thread and module until the call ends (`_after`), by id, with a
        weak reference (an argument freed during the call leaves its id to a new tensor): the
        positional ones and those in keyword arguments and containers (`forward(input=h)`,
        `forward([h])`), so a pre-hook of the user's that moves them after this one changes
        nothing (until 2026-12-01 positional marks went by position: helper-72's attack)."""
        if self._removed:  # (a copy's hooks, which its `remove()` has no handle to take away)
            return
        marks: _Marks = {}
        settled = True  # (the first read settles the pipeline for the others)
        plain = not kwargs and all(_is_tensor_type(type(a), a) for a in args)  # (the usual call)
        for t in args if plain else _argument_tensors((args, kwargs), 0, set()):
            if id(t) not in marks:
                marks[id(t)] = (weakref.ref(t), ops.change_mark(t, settled=settled))
                settled = False
        self._started += 1
        step = self._step
        step.ran.add(id(module))
        consumed = step.consumed
        for key in marks:  # (`_inner_output`)
            consumed[key] = self._started
        call = (marks, ops.history_mark(module), self._started)
        self._versions.setdefault((get_ident(), name), []).append(call)

    def _after(self, module: Any, args: Any, output: Any, *, name: str) -> None:
        key = (get_ident(), name)
        stack = self._versions.get(key)
        if stack:
            stack.pop()
            if not stack:  # (a thread's entries go with its last call)
                del self._versions[key]

    def _record(self, module: Any, args: Any, kwargs: Any, output: Any, *, name: str) -> None:
        stack = self._versions.get((get_ident(), name))
        marks, mark, started = stack[-1] if stack else ({}, None, 0)
        # (in backward: a part of the model recomputed by a checkpoint; a reentrant one's
        # outputs are those the gradients come through, a non-reentrant one's get none; of a
        # forward `every` skipped when the hooks were placed ahead for the next one)
        if self._running:
            mine = self._running_on.get(get_ident())
            if not mine:
                # a call outside any forward on this thread while one runs on another, or seems
                # to: one a BaseException left there, or a dead thread's, ends now
                # (helper-103's FINDING 2)
                for thread in list(self._running_on):
                    self._left_behind(thread)
            elif not executing(mine[-1][2]):
                # this thread's: a forward a Ctrl-C left here, or a dead thread's whose id
                # this one got (helper-104's FINDINGS 1, 1a); then the others' too
                for thread in [get_ident(), *self._running_on]:
                    self._left_behind(thread)
        running = self._running_on.get(get_ident())
        step = None
        if not running and (self._placed_ahead or not ops.in_backward(module)):
            if not self._running:
                return
            # a call on a thread running no forward of the model while another thread's runs:
            # part of that one's step (a forward handing its modules to a thread pool, torch's
            # DataParallel replicas); so is a lone call there (helper-104's FINDING 7, open:
            # they cannot be told apart), but never this thread's last entry, logged already
            # (helper-215's FINDING 1, with a step per thread)
            step = self._running_step()
        if running and not running[-1][1]:
            # a forward of the model begun without gradients (an evaluation under no_grad)
            # that enables them inside (forces, -dE/dx): its gradients belong to no step (until
            # 2026-12-02 they were added to the last training step's entry: helper-94's
            # FINDING 12), said once per module (a head trained under enable_grad inside a
            # frozen model's no_grad call: helper-95's FINDING 7)
            if ops.grad_enabled(module) and name not in self._unrecorded:
                self._unrecorded.add(name)
                warnings.warn(
                    f"GradientMonitor: module {name!r} ran with gradients inside a forward of "
                    "the model begun without them (under no_grad): its grad_output norms are "
                    "not recorded",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        if step is None:
            step = self._step
        call = -1
        if step.world is not None:
            call = step.calls[name] = step.calls.get(name, -1) + 1
        tensors = tensors_of(output, module)
        attributes: list[Any] = []
        # (two levels, the second in small containers only: the look runs at every call, so
        # a table the module holds costs each call, 170 us with a deeper look: helper-95's
        # FINDING 11, where a view kept two levels down, ``[[y[:]]]``, was not seen:
        # helper-191's FINDING 1; `_kept` looks deeper once. Lists of numbers cost each call
        # too, 380 us for 15 of 256: helper-97's FINDING 4, open; a smaller budget hid an
        # output kept behind a few of them: helper-100's FINDING 2)
        _objects_within(
            ops.attribute_values(module), _DEEPER, attributes, _BUDGET, True, _EACH_CALL
        )
        attributes += _put_in_arguments(args, kwargs, marks)
        chosen = self._chosen
        below = [] if chosen is None else _held_below(module, chosen, step.ran)
        self._arguments_kept(step, attributes + below, marks, mark)
        if _returns_an_input(tensors, marks):  # (that call only: said once)
            last = self._last
            self._left_out(step, name, _RETURNED)
            if last is not None and any(t is last[0] for t in tensors):
                # passed on unchanged (a last nn.Identity, an eval Dropout): still the last
                # output a container returning it shares (`_inner_output`)
                self._last = last
            return
        # (made_before None: the backend cannot tell; an output an earlier call was hooked on
        # tells anyway)
        if ops.made_before(tensors, mark) or self._hooked_before(step, tensors, marks, started):
            self._left_out(step, name, _MADE_BEFORE)
            self._unhook_earlier(step, tensors, started)
            return
        if (
            _keeps(module, tensors, step.kept, marks, mark, attributes)
            or _kept_below(below, tensors, marks, mark)
            or _tapped(step, tensors, marks, mark, started)
        ):
            for tensor in tensors:
                step.kept[id(tensor)] = (weakref.ref(tensor), self._started)
            self._left_out(step, name, _KEPT)
            return
        if self._inner_output(step, tensors, started):
            self._left_out(step, name, _FROM_INSIDE)
            return
        if len(tensors) > 1 and _one_from_another(tensors, marks):
            self._left_out(step, name, _FROM_ANOTHER)
            return
        for position, tensor in enumerate(tensors):
            leaf = ops.is_leaf(tensor)
            earlier = step.hooked.get(id(tensor)) if leaf else None
            if earlier is not None and earlier[0]() is tensor and earlier[2] < started:
                # a parameter an earlier call of this forward returned too, no call inside this
                # one (a module called twice): a hook on it sees the sum of both calls' uses
                # (until 2026-12-08 recorded twice, the second call taken for a container of
                # the first: helper-222's FINDING 2)
                for before in earlier[1]:
                    self._left_out(step, before, _RETURNED_AGAIN)
                earlier[1].clear()
                self._left_out(step, name, _RETURNED_AGAIN)
                continue
            version = ops.object_version(tensor)
            last = self._last
            if (
                last is not None
                and last[0] is tensor
                and version is not None
                and version == last[1]
            ):
                last[2].insert(0, name)  # a container's output: outermost first, as backward
                continue
            names = [name]
            key = None if call < 0 else (name, call, position)
            # (the monitor held weakly: a module keeping its output keeps the hook, which torch
            # does not collect through, and would keep the monitor and the model: helper-94's
            # FINDING 11)
            hook = functools.partial(_gradient_of, weakref.ref(self), step, names, key)
            if leaf:
                # a parameter the module returns: a hook on it stays for every later backward,
                # so a removable one, removed at the end of this step's first backward
                try:
                    step.leaves.append(register_tensor_hook(tensor, hook))
                except NoGradError:
                    continue
            elif not ops.on_grad(tensor, hook):
                continue  # no gradient will come (no_grad, or a constant output)
            held = step.hooked.get(id(tensor))
            if held is not None and held[0]() is tensor:  # (a container's tuple: see `_kept`)
                step.shared.setdefault(id(tensor), []).append(held[1])
            step.hooked[id(tensor)] = (weakref.ref(tensor), names, self._started)
            if key is not None:
                kind = self._slots.kind(key)
                if kind != SAMPLE:  # compared across ranks (kept until decided: NEW)
                    seen = step.seen[key] = Seen(tensor, step.batch, kind == NEW, args)
                    seen.names = names
            self._last = (tensor, version, names)

    def _arguments_kept(self, step: _Step, held: list[Any], marks: _Marks, mark: object) -> None:
        """A module (or one inside it `where` leaves out) holding, as its call ends, one of
        the call's argument tensors or one made from it (a tap keeping what it was given,
        ``self.out = x * 2``) makes that argument's gradient sum the reads of it: a call
        around it returning the argument (``y = self.fc(x); self.tap(y); return y``) is left
        out then, as for its own keep, since torch's hook on it sees what comes through its
        output only (until 2026-12-07 it recorded the sum, silently: helper-191's FINDING 2,
        helper-193's FINDINGS 1 and 2). The call that made the argument, if it was hooked
        before, keeps its entry: torch's hook on it counts those reads too. Each argument on
        its own (one kept leaves the others: helper-193's FINDING 3); not a leaf. What it
        held then goes to `_Step.taps`: a call around it returning a tensor that an argument
        was made from (``self.probe(y[:, 0])``) checks it (helper-195's FINDING 1). `mark`:
        the call's start (`ops.history_mark`), before which no walk goes (toward an argument
        made long before: helper-195's FINDING 4)."""
        if not marks or not _holds_a_tensor(held):
            return
        ids = set(map(id, held))
        arguments = [ref() for ref, _ in list(marks.values())]
        arguments = [t for t in arguments if t is not None and not ops.is_leaf(t)]
        kept = [t for t in arguments if id(t) in ids]
        kept += _made_of(held, [t for t in arguments if id(t) not in ids], mark)
        for tensor in kept:
            step.kept[id(tensor)] = (weakref.ref(tensor), self._started)
        if kept:
            for obj in held:
                if _is_tensor_type(type(obj), obj):
                    try:
                        step.taps.append(weakref.ref(obj))
                    except TypeError:  # (a tensor type without weak references)
                        continue
                    step.tap_stamps.append(self._started)

    def _keep_hooked(self, step: _Step) -> None:
        """The outputs `step` (the forward before a new one) hooked that are still alive join
        `_earlier`, whose dead ones go once it doubled: outputs a user keeps (every step's
        loss) cost no walk per step (helper-81's attack: 340 us a forward after 2000 steps)."""
        with self._counting:  # (threads' forwards begin at once: one prunes, one adds)
            self._keep_hooked_locked(step)

    def _keep_hooked_locked(self, step: _Step) -> None:
        earlier = self._earlier
        # (copies, read at once: a pool thread's call may add to them meanwhile)
        for key, (ref, names, _) in list(step.hooked.items()):
            if names and ref() is not None:
                earlier[key] = (ref, names)
        if len(earlier) > self._prune_at:
            earlier = {k: v for k, v in list(earlier.items()) if v[1] and v[0]() is not None}
            self._earlier = earlier
            self._prune_at = 2 * len(earlier) + 256
        # the outputs kept (`_kept`), which a later forward may return (helper-92's FINDING 9)
        kept = self._kept_before
        for key, (ref, _) in list(step.kept.items()):
            if ref() is not None:
                kept[key] = ref
        if len(kept) > self._kept_prune_at:
            kept = self._kept_before = {k: r for k, r in list(kept.items()) if r() is not None}
            self._kept_prune_at = 2 * len(kept) + 256

    def _hooked_before(
        self, step: _Step, tensors: Sequence[Any], marks: _Marks, started: int
    ) -> bool:
        """Whether a call (the `started`-th) returns a tensor, not one of its arguments, that
        an earlier call was hooked on (one of this forward's that is no call inside this one,
        or of an earlier forward, still alive): made before the call, whatever its autograd
        history says. torch's numbers count per thread (a state made on another thread passed
        for a new one: helper-76's FINDING 1), a state changed in place in the call has a new
        node (its FINDING 3), and paddle and MindSpore tell no number (their `made_before` is
        None): each recorded the sum of every use of the state. (An argument is
        `_returns_an_input`'s: an in-place ReLU's output is its changed input; a leaf, a
        returned parameter, has no history to compare.)"""
        for tensor in tensors:
            key = id(tensor)
            found = step.hooked.get(key)
            if found is None or found[0]() is not tensor or found[2] >= started:
                before = self._earlier.get(key)
                if (
                    (before is None or before[0]() is not tensor)
                    and not self._kept_earlier(step, tensor, started)
                    and self._hooked_elsewhere(step, tensor) is None
                ):
                    continue
            argument = marks.get(key)
            if (argument is None or argument[0]() is not tensor) and not ops.is_leaf(tensor):
                return True
        return False

    def _hooked_elsewhere(self, step: _Step, tensor: Any) -> list[str] | None:
        """The names another thread's step hooked `tensor` under (its forward may still run;
        its outputs join `_earlier` as that thread's next forward begins, or as its step goes
        with the thread), or None. Until 2026-12-08 a call returning one was recorded and that
        step's hook took its uses too (helper-227's FINDINGS 1 and 2, helper-229's FINDING 1)."""
        steps = self._steps
        if len(steps) < 2:  # (one thread's: a look per output of every call)
            return None
        key = id(tensor)
        for other in list(steps.values()):
            found = None if other is step else other.hooked.get(key)
            if found is not None and found[0]() is tensor:
                return found[1]
        return None

    def _kept_earlier(self, step: _Step, tensor: Any, started: int) -> bool:
        """Whether a call before the `started`-th, of this forward or an earlier one, kept
        `tensor` (`_kept`: left out at the end of that forward)."""
        kept = step.kept.get(id(tensor))
        if kept is not None and kept[0]() is tensor and kept[1] < started:
            return True
        ref = self._kept_before.get(id(tensor))
        return ref is not None and ref() is tensor

    def _inner_output(self, step: _Step, tensors: Sequence[Any], started: int) -> bool:
        """Whether a call (the `started`-th) returns an output of a call inside it that a
        later call inside it got as an argument (``h = self.a(x); self.aux = self.b(h); return
        h``): those uses reach the same tensor hook, which torch's hook on this call does not
        see (helper-77's FINDING 5). The last output hooked, which a container returning its
        last child's output shares (`_last`), came after every call (one passing it on
        unchanged, an nn.Identity, keeps it the last); the uses by ops that are no module
        call are not seen (`self.aux = (h * h).mean()`)."""
        last = self._last
        for tensor in tensors:
            if last is not None and last[0] is tensor:
                continue
            found = step.hooked.get(id(tensor))
            if found is None or found[0]() is not tensor or found[2] < started:
                continue  # (not a call inside this one's: `_hooked_before`)
            if step.consumed.get(id(tensor), -1) > found[2]:
                return True
        return False

    def _unhook_earlier(self, step: _Step, tensors: Sequence[Any], started: int) -> None:
        """A call (the `started`-th) returning a tensor a call that came before it returned (a
        module keeping its output, `self.cache`, called twice; until 2026-12-01 the first
        call's norm summed both calls' uses: helper-76's attack): the earlier call's hook on it
        sees this call's uses too, where torch's hook on that call sees its own, so that call
        goes too. A call inside this one (a child whose output it returns) stays. The earlier
        call may be of an earlier forward (memoised across steps): its entry, in `history`
        already, would have taken this forward's uses too (helper-77's FINDING 3); it keeps
        what its own backward gave."""
        for tensor in tensors:
            found = step.hooked.get(id(tensor))
            if found is not None and found[0]() is tensor and found[2] < started:
                names = found[1]
            else:
                before = self._earlier.get(id(tensor))
                if before is not None and before[0]() is tensor:
                    names = before[1]
                else:
                    elsewhere = self._hooked_elsewhere(step, tensor)
                    if elsewhere is None:
                        continue
                    names = elsewhere
            for name in names:
                self._left_out(step, name, _RETURNED_AGAIN)
            names.clear()  # (its hook adds to no module now)

    def _left_out(self, step: _Step, name: str, why: str) -> None:
        """A module whose output tensor's gradient is not its grad_output: one returning an
        input tensor unchanged (nn.Identity, eval Dropout), whose gradient hook sees the
        gradient of every use of it, also those around the call (`h + self.norm(h)` with
        `norm = nn.Identity()`; until 2026-11-30 that sum was recorded, silently), or one
        returning a tensor and another computed from it (`return f, f.sum()`: BERT's sequence
        and pooled outputs), whose hook on the first sums its use inside the call with the
        caller's (until 2026-12-01 recorded: helper-72's attack), or one returning a tensor
        made before the call that is not an argument (`return self.mem`: every use of it,
        where the backend tells, `ops.made_before`; helper-74's). Only a module backward hook
        can tell them apart, by handing the caller aliases of the outputs; a monitor placing
        one would change what the model computes where the framework cannot follow in-place
        ops through it (paddle, MindSpore) and make torch raise where it ran, so the call is
        left out of the history, said once per module."""
        self._last = None
        step.left.add(name)  # (the call's step: on a pool thread, a running forward's)
        # (gradients may have reached it already: a backward inside the forward, forces as
        # ``autograd.grad(energy, pos)``, before the end walk left it out: helper-97's FINDING 7)
        for recorded in (step.norms, step.squares, step.sample):
            recorded.pop(name, None)
        if name not in self._returning:
            self._returning.add(name)
            warnings.warn(
                f"GradientMonitor: module {name!r} {why}: its grad_output norm is not "
                "recorded (a module backward hook tells it: register_full_backward_pre_hook)",
                RuntimeWarning,
                stacklevel=2,
            )

    def _gradient(self, step: _Step, names: list[str], key: Key | None, grad: Any) -> None:
        if self._removed:  # (a tensor's hook stays; the parameters' went with the recipe)
            return
        if grad is None:
            # torch's full backward hook machinery (BackwardHookFunction) calls the hooks of an
            # output the loss does not use with None: no gradient reached it
            return
        if not names and step.world is None:
            return  # (its calls were left out after the hook was placed: _unhook_earlier)
        if step.left and not step.left.isdisjoint(names):  # (another call of it was left out)
            names = [name for name in names if name not in step.left]
        if not step.logged or step.world is not None or step.leaves:
            self._merge_at_end(step, grad)  # (ranks: also for a left-out call's, to merge)
        if not names:
            return
        squares = ops.sum_squares(grad)
        for name in names:
            total = step.squares.get(name, 0.0) + squares
            step.squares[name] = total
            step.norms[name] = math.sqrt(total)
        if key is not None:
            kind = step.kinds.get(key)
            if kind is None:
                kind = self._slots.kind(key)
            if kind == SAMPLE or key not in step.seen:
                for name in names:
                    step.sample[name] = step.sample.get(name, 0.0) + squares
            else:  # sent whole: the ranks' gradients may have to be summed
                value = ops.to_numpy(grad).astype(np.float64)
                held = step.grads.get(key)
                step.grads[key] = value if held is None else held + value
        # a finite sum of squares has finite terms; an infinite one may be float64 overflow
        if math.isfinite(squares) or step.flagged or ops.all_finite(grad):
            return
        step.flagged = True
        if step.world is not None:  # every rank learns of it at the end of backward
            step.first_bad = names[0]
            return
        self._report(NonFiniteGradientError(names[0], step.norms))

    def _merge_at_end(self, step: _Step, grad: Any) -> None:
        """`step` has a gradient in the running backward: in `history`, and (ranks) merged at
        the end of that backward."""
        if step.leaves and not step.dropping:
            step.dropping = True
            ops.after_backward(grad, step.drop_leaves)
        if not step.logged:
            self._log(step)
        if step.world is not None and not step.pending:
            step.pending = True
            # a tensor names the default group: the wrapper's own groups number ranks apart
            step.rank = (ops.world(grad) or (0, 1))[0]
            step.merge = functools.partial(self._merge, step)
            self._queue_merge(grad, step.merge, step.serial)

    def _log(self, step: _Step) -> None:
        """`step`'s norms into `history`, in the order of the forwards: a backward through the
        graphs of two forwards (a siamese loss) reaches the later one's outputs first on
        paddle (until 2026-11-30 its entries came in that order)."""
        with self._counting:  # (threads' backwards log at once)
            self._log_locked(step)

    def _log_locked(self, step: _Step) -> None:
        step.logged = True
        history, serials = self.history, self._serials
        serials[id(step.norms)] = step.serial
        if step.serial >= self._latest:  # (the common case: a forward's own backward)
            self._latest = step.serial
            history.append(step.norms)
        else:
            k = len(history)
            while k and serials.get(id(history[k - 1]), -1) > step.serial:
                k -= 1
            if history.maxlen is not None and len(history) == history.maxlen:
                if not k:
                    return  # older than every entry kept
                history.popleft()
                k -= 1
            history.insert(k, step.norms)
        if len(serials) > 2 * len(history) + 16:  # (those of entries gone from `history`)
            kept = {id(entry) for entry in history}
            self._serials = {key: n for key, n in serials.items() if key in kept}

    def _parameter_grad(self, grad: Any) -> None:
        step = self._step
        if step.world is not None and not step.merged:  # (not a later backward's: no partner)
            self._merge_at_end(step, grad)

    def _report(self, error: NonFiniteGradientError) -> None:
        if self.on_nonfinite == "raise":
            raise error
        if self.on_nonfinite == "warn":
            warnings.warn(str(error), RuntimeWarning, stacklevel=3)

    def _merge(self, step: _Step, stamp: int = BACKWARD) -> None:
        """The end of a backward with several ranks: one all_gather of every rank's vector
        [has a gradient per module, sum of squares of its per-sample outputs' gradients per
        module, its place in the rank's backward order per module, rank, first non-finite
        module, then the slots not known per sample (see _shared): their digest, shape and
        gradient], then the global norms in place of this rank's, the same on every rank and
        in the same order."""
        step.pending = False
        step.merged = True
        step.merge = None  # (it holds the monitor: a kept output's hook holds the step)
        names = self._names
        index = {name: i for i, name in enumerate(names)}
        count = len(names)
        local = np.zeros(3 * count + 2)
        for name, squares in step.sample.items():
            local[index[name]] = 1.0
            local[count + index[name]] = squares
        for place, name in enumerate(step.norms, 1):
            local[2 * count + index[name]] = place
        local[-2] = step.rank
        local[-1] = -1.0 if step.first_bad is None else index[step.first_bad]
        entries = []
        for key, seen in step.seen.items():
            grad = step.grads.get(key)
            sent = [] if grad is None else [grad]
            ids = [index[name] for name in seen.names]
            entries.append(encode(index, key, seen, [len(sent), len(ids), ids, *sent]))
        step.grads = {}
        header = (step.batch, *step.inputs_header)
        ranks, headers, parts = self._slots.exchange(
            self,
            self._model,
            names,
            local,
            lambda count: 3 * count + 2,
            header,
            entries,
            stamp_of(stamp, step.grad_sync),
        )
        kinds = self._slots.decide(self._model, names, parts, headers, step.seen, step.kinds)
        self._slots.keep_room(parts, kinds)
        for key, seen in list(step.seen.items()):
            seen.tensor = None  # (kept for the decision)
            if self._slots.kind(key) == SAMPLE:  # its next backward's gradients: squares
                del step.seen[key]
        present = ranks[:, :count].any(axis=0)
        totals = ranks[:, count : 2 * count].sum(axis=0)  # in rank order: equal on every rank
        for wire, kind in kinds.items():  # (sorted)
            grads, modules = [], set()
            for part in parts:
                entry = part.get(wire)
                if entry is None or not entry.extra[0]:
                    continue
                ids = int(entry.extra[1])
                modules.update(int(i) for i in entry.extra[2 : 2 + ids].tolist())
                grads.append(entry.extra[2 + ids :].reshape(entry.shape))
            if grads:
                squares = merged_squares(kind, grads)
                for i in sorted(modules):
                    step.extra[names[i]] = step.extra.get(names[i], 0.0) + squares
        for name, squares in step.extra.items():
            present[index[name]] = True
            totals[index[name]] += squares
        order = _merged_order(ranks[:, 2 * count : 3 * count], names)
        step.norms.clear()
        for name in order:
            if present[index[name]]:
                step.norms[name] = math.sqrt(totals[index[name]])
        if not step.norms and self.history and self.history[-1] is step.norms:
            self.history.pop()  # no watched module had a gradient on any rank: as one process
            step.logged = False
        bad = [row for row in ranks if row[-1] >= 0]
        if bad:
            step.first_bad = None  # reported once, not again after a further backward
            module = names[int(bad[0][-1])]
            found = sorted(int(row[-2]) for row in bad)
            self._report(NonFiniteGradientError(module, step.norms, rank=found[0], ranks=found))

    def write(self, writer: Writer | None, step: int, *, all_ranks: bool = False) -> bool:
        """Send the last recorded backward's norms to `writer` (a tensorboardX or torch
        SummaryWriter, see `summary_writer`): scalars ``gradients/<module>/norm`` and, across
        modules, the histogram ``gradients/norm``. False (nothing written) when no backward was
        recorded since the last write (an off-step of `every`), and on every rank but 0 of the
        ranks that split the model's batch (`ops.world`) unless `all_ranks`, and with no
        `writer` (None: a rank that keeps none)."""
        if writer is None or not self._writes(self._model, all_ranks):
            return False
        if not self.history or self.history[-1] is self._written:
            return False
        self._written = last = self.history[-1]
        rows = [{"name": name, "norm": norm} for name, norm in last.items()]
        write_records(
            writer, "gradients", rows, ("norm",), step, vars(self).setdefault("_tags", {})
        )
        return True

    def remove(self) -> None:
        self._removed = True
        for step in {id(s): s for s in [self._newest, *self._steps.values()]}.values():
            step.drop_leaves()
        super().remove()

    def _let_go(self) -> None:
        super()._let_go()
        self._running, self._running_on, self._last = 0, {}, None

    def _copied(self) -> None:
        super()._copied()
        # no forward under way, nor any output of the original's (held weakly: no pickle)
        self._steps, self._newest = {}, _Step(None, self._forwards_seen)
        self._deciding, self._shadowed = None, None
        self._versions, self._earlier, self._kept_before = {}, {}, {}
        self._prune_at = self._kept_prune_at = 256
        # (the original's modules, weakly: a copy chooses by name, `Chosen.__getstate__`, as a
        # predicate, which `_chosen_ids` takes for none)
        self._chosen = None
        # `_serials` is by id of the entries of `history`, which the copy's are not: by place
        serials = self._serials
        del self.__dict__["_serials"]
        self._serial_places = [serials.get(id(entry), -1) for entry in self.history]

    def __setstate__(self, state: dict[str, Any]) -> None:
        places = state.pop("_serial_places", None)
        super().__setstate__(state)
        if places is not None:
            self._serials = {id(e): n for e, n in zip(self.history, places) if n >= 0}

    def plot(self, path: str | None = None, *, all_ranks: bool = False) -> Any:
        """Per-module gradient norms over the recorded backwards, log scale (matplotlib Figure;
        saved to `path` when given, by rank 0 only unless `all_ranks`)."""
        from .plots import plot

        return plot(monitor=self, path=path, all_ranks=all_ranks)


def _gradient_of(
    monitor: weakref.ref[GradientMonitor], step: _Step, names: list[str], key: Key | None, grad: Any
) -> None:
    found = monitor()
    if found is not None:
        found._gradient(step, names, key, grad)


def _held(modules: Sequence[Any], wanted: Mapping[int, Any]) -> Iterator[tuple[Any, int]]:
    """(module, id) for each object with an id in `wanted` that one of `modules` holds: as an
    attribute, or an item of a container attribute or of one inside it (see `_objects_within`; a
    few us a module: by id, the objects found are alive)."""
    keys = wanted.keys()
    for module in modules:
        found: list[Any] = []
        _objects_within(ops.attribute_values(module), _DEEPER, found, _BUDGET)
        for key in keys & set(map(id, found)):
            yield module, key


def _objects_within(
    values: list[Any],
    deeper: int,
    found: list[Any],
    budget: int,
    top: bool = True,
    limits: tuple[int, int] | None = None,
) -> None:
    """`values` (a module's attribute values, `top`, or a container's items) and the items
    of the containers among them (and the attributes of the namespaces, dataclass instances
    and plain objects: helper-179's FINDING 4, helper-191's FINDING 1), `deeper` levels
    down, until `budget` objects. Below the top, `limits`: the containers of at most so many
    items whose containers are looked in, and of at most so many that are (or `_LOOKS`)."""
    limits = limits or _LOOKS
    found.extend(values)
    # (below the attributes, a table's rows are not looked in: helper-94's FINDING 6; the
    # attributes are, however many: helper-97's FINDING 1)
    if not deeper or (not top and len(values) > limits[0]):
        return
    containers: list[tuple[Any, Any]] = []
    sets: list[tuple[Any, Any]] = []
    for value in values:
        cls = type(value)
        # (most of a module's attributes, at once: numbers, strings, a conv's kernel size;
        # by id: a metaclass may make its classes unhashable, helper-100's FINDING 3)
        if id(cls) in _SCALARS or (cls is tuple and _scalars_only(value)):
            continue
        kind = _kind(value)
        if kind is not None:
            (sets if kind is set or kind is frozenset else containers).append((kind, value))
    # sets last: an output in one is rare (a tensor hashes by id), and sets of numbers (stop
    # words, ids seen) spent the budget ahead of a list holding one (helper-100's FINDING 6)
    for kind, value in containers + sets:
        # (the base types' own methods: a subclass's `values` or `__iter__` may run any code;
        # a namedtuple is a tuple: helper-94's FINDING 8; a namespace's own `__dict__`, read
        # past any `__getattr__`)
        if kind is _FIELDS or kind is _OBJECT:
            # (a plain object of many attributes, a model's config of a hundred, is no state
            # box: it cost each call of each module holding one)
            items: Any = _fields_of(value, _LOOKED if kind is _FIELDS else _NESTED)
        elif 0 < kind.__len__(value) <= (_LOOKED if top else limits[1]):
            items = dict.values(value) if kind is dict else kind.__iter__(value)
            if kind is list:
                items = list(items)
                if _scalars_only(items):
                    continue  # (nothing to look at)
        else:
            continue
        if deeper == 1:  # (the last level: its items only)
            found.extend(items)
        else:
            _objects_within(list(items), deeper - 1, found, budget, False, limits)
        if len(found) > budget:
            return


def _put_in_arguments(args: Any, kwargs: Any, marks: _Marks) -> list[Any]:
    """What a call put into the containers it was given (a U-Net's skip list,
    ``feats.append(y)``; ``cache["k"] = y``; also one level deeper, and the attributes of a
    namespace or a dataclass given): the caller reads it, past the output's hook on the call
    (until 2026-12-07 the entry summed those reads, silently: helper-195's FINDING 2). What
    they held as the call started are its arguments (`marks`: `_argument_tensors` walks the
    same containers, and plain objects' attributes, made before the call, are no keep of it:
    `ops.derived_from` starts at the call's start). As wide as `_argument_tensors` looks:
    a list of per-layer caches (helper-197's FINDING 1)."""
    values = [*args, *kwargs.values()] if kwargs else args
    for value in values:  # (the usual call, tensors only, at once)
        if _kind(value) is not None:
            break
    else:
        return []
    values = list(values)
    found: list[Any] = []
    _objects_within(values, _DEEPER, found, _BUDGET, True, _GIVEN)
    put = []
    for obj in found[len(values) :]:
        given = marks.get(id(obj))
        # (one given that the call changed in place, ``acc[0].add_(y)``, holds what it made
        # too: helper-199's FINDING 2)
        if given is None or given[0]() is not obj or ops.change_mark(obj) != given[1]:
            put.append(obj)
    return put


def _kind(value: Any) -> Any:
    """`value`'s kind (`_kind_of`): by type, `isinstance` reads `__class__`, which a proxy
    forwards and may raise from (helper-95's FINDING 6); once per type."""
    cls = type(value)
    known = _kinds.get(id(cls))
    return known[1] if known is not None and known[0]() is cls else _kind_of(cls)


def _kind_of(cls: type) -> Any:
    """The container type of `_CONTAINERS` that `cls` is or subclasses, `_FIELDS` for a
    namespace or a dataclass, `_OBJECT` for a plain object of the user's (`_plain_object`), or
    None (kept in `_kinds` for the first 4096 types seen)."""
    kind = next((base for base in _CONTAINERS if issubclass(cls, base)), None)
    try:
        if kind is None and (issubclass(cls, SimpleNamespace) or dataclasses.is_dataclass(cls)):
            kind = _FIELDS
        elif kind is None and _plain_object(cls):
            kind = _OBJECT
    except Exception:  # (a metaclass whose `__getattr__` raises: helper-197's FINDING 2)
        kind = None
    if len(_kinds) < 4096:
        _kinds[id(cls)] = (weakref.ref(cls), kind)
    return kind


def _keeps(
    module: Any,
    tensors: Sequence[Any],
    kept: dict[int, tuple[weakref.ref[Any], int]],
    marks: _Marks,
    mark: object,
    held: list[Any],
) -> bool:
    """Whether `module` holds one of `tensors`, its call's outputs, as its call ends (where
    `_held` looks), or a call inside it kept one (`kept`): the look `_kept` makes at the end
    of the forward does not see an output kept, read by a later part of the forward and
    dropped before its end (helper-94's FINDING 1), nor one of a forward that raised, a
    nested one or another thread's (its FINDINGS 2 to 4). A parameter of the module it
    returns is `_record`'s. A tensor it holds made from one of them counts (`_made_from`;
    `marks`: the call's arguments, as it started, `mark` its history mark then; `held`: what
    it holds, `_record`'s look)."""
    ids = {id(t) for t in tensors}
    found = {key for key in ids if key in kept and id(kept[key][0]()) == key}
    found.update(ids.intersection(map(id, held)))
    if found:
        parameters = {id(p) for p, _, _ in ops.own_parameters(module)}
        if any(id(t) in found and id(t) not in parameters for t in tensors):
            return True
    return _made_from(held, tensors, marks, mark)


def _tapped(step: _Step, tensors: Sequence[Any], marks: _Marks, mark: object, started: int) -> bool:
    """Whether what a monitored module inside this call (the `started`-th) held as its own
    call ended, having made it from an argument (`_Step.taps`), was made from one of
    `tensors`, this call's outputs: a probe given a view of the output (``self.probe(y[:,
    0])``) keeping its logits, read later (until 2026-12-07 the call's entry summed those
    reads, silently: helper-195's FINDING 1)."""
    stamps = step.tap_stamps
    if not stamps or stamps[-1] <= started:
        return False
    inside = [ref() for ref in step.taps[bisect.bisect_right(stamps, started) :]]
    return _made_from([obj for obj in inside if obj is not None], tensors, marks, mark)


def _made_of(held: list[Any], tensors: list[Any], mark: object) -> list[Any]:
    """Those of `tensors` that one of `held` was made from since `mark` (or the backend
    cannot tell): one walk for all where none was; where one was, the first (a call's first
    argument, what a block makes its output of) and halves of the rest (a walk for each, a
    block given the list of every hidden state before it, cost n walks a call: 56 against
    41 ms a step at 24 blocks, helper-197's FINDING 3)."""
    if not tensors:
        return []
    found = ops.derived_from(held, tensors, (), mark)
    if found is False:
        return []
    if found is None or len(tensors) == 1:
        return tensors
    first = _made_of(held, tensors[:1], mark)
    rest = tensors[1:]
    if len(rest) > 1:
        half = len(rest) // 2
        return first + _made_of(held, rest[:half], mark) + _made_of(held, rest[half:], mark)
    return first + _made_of(held, rest, mark)


def _made_from(held: list[Any], tensors: Sequence[Any], marks: _Marks, mark: object) -> bool:
    """Whether one of `held`, what a module holds as a call ends, is a tensor made from one
    of `tensors`, the call's outputs, in it: a view kept (``self.out = y[:]``, ``y.view(-1)``)
    or a value computed from one, whose reads the gradient reaching that output sums, where
    torch's hook on the call sees what comes through the output only (until 2026-12-07 a
    silently wrong entry: helper-178's FINDING 2); or the backend cannot tell. Plain values
    (numbers, names, the containers they are in) and objects of types that are no tensor are
    passed at once (a paddle layer's ParamAttr went to the backend at every call: 18% of a
    step, helper-196's FINDING 4)."""
    if not _holds_a_tensor(held):
        return False
    arguments = [t for t in (ref() for ref, _ in marks.values()) if t is not None]
    return ops.derived_from(held, tensors, arguments, mark) is not False


# the modules `where` chose, by id, each with a weak reference: a module set in since may take
# the id of one that died (helper-185's FINDING 1: taken for the chosen one, its keep was not
# looked at, and the entry was silently wrong)
_Chosen = dict[int, "weakref.ref[Any]"]


def _chosen_ids(
    model: Any, where: Sequence[tuple[str, Any]] | Callable[[str, Any], bool]
) -> _Chosen | None:
    """The modules `where` chose (pairs), None where it is a predicate (modules without weak
    references): `_kept_below`. Also where it chose every module of `model`: one set in since
    is not hooked (until 2026-12-07 the look was skipped there, and a keeper set in later gave
    a silently wrong entry: helper-179's FINDING 3)."""
    if callable(where):
        return None
    return {id(module): weakref.ref(module) for _, module in where}


def _looked(chosen: _Chosen, ran: set[int], module: Any) -> bool:
    """Whether `module` is a chosen one called in this forward, which looked at its own
    insides as its call ended (`_kept_below`)."""
    return id(module) in ran and _is_chosen(chosen, module)


def _is_chosen(chosen: _Chosen, module: Any) -> bool:
    ref = chosen.get(id(module))
    return ref is not None and ref() is module


def _held_below(module: Any, chosen: _Chosen, ran: set[int]) -> list[Any]:
    """What the modules inside `module` that `where` leaves out (`chosen`: those it took),
    but those inside another one chosen, hold (as `_record` looks, `_BUDGET` a module),
    for `_kept_below` and `_arguments_kept`. The modules inside it as they are now: one set in
    since the monitor was made too (helper-178's FINDING 3). A chosen one looks at its own
    insides as its call ends: not one not called in this forward (`ran`: a ModuleList, which
    has no call, a block whose child is called past it; helper-188's FINDINGS 1 and 2)."""
    inside = [child for child in ops.children(module) if not _looked(chosen, ran, child)]
    # (down from the children, past the chosen ones that ran, whose insides are theirs: a
    # walk of those below the others only; none where every module was chosen)
    seen: set[int] = set()
    held: list[Any] = []
    while inside:
        part = inside.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        _objects_within(
            ops.attribute_values(part), _DEEPER, held, len(held) + _BUDGET, True, _EACH_CALL
        )
        inside.extend(child for child in ops.children(part) if not _looked(chosen, ran, child))
    return held


def _kept_below(below: list[Any], tensors: Sequence[Any], marks: _Marks, mark: object) -> bool:
    """Whether what the modules inside a module hold (`_held_below`) is one of `tensors`, its
    call's outputs, or made from one (`_made_from`): an output kept on one (``self.k.out = y``
    of a child's call) and dropped before the forward ends was seen by no look, and the
    module's entry summed its reads where torch's hook does not (helper-97's FINDING 2)."""
    if not below:
        return False
    ids = {id(t) for t in tensors}
    return not ids.isdisjoint(map(id, below)) or _made_from(below, tensors, marks, mark)


# the containers `_held` looks in (subclasses too; a deque, a set: helper-97's FINDING 3), two
# levels down, of at most `_LOOKED` items (a vocabulary dict of 100,000 entries cost 7 ms a
# call: helper-92's FINDING 8), the second level only in containers of at most `_NESTED`
# items, and at most about `_BUDGET` objects a module; as a call ends, its module's first
# level only
_CONTAINERS: tuple[Any, ...] = (dict, list, tuple, deque, set, frozenset)
# (`_kind_of`) a namespace's or a dataclass instance's kind: its attributes are its items
_FIELDS = SimpleNamespace
# (`_kind_of`) a plain object's kind: its attributes are its items too (`_plain_object`, at
# most `_NESTED` of them)
_OBJECT: Any = object
# (`_is_tensor_type`) by the type's id, with a weak reference to it, whether it is a tensor's
_tensor_types: dict[int, tuple[weakref.ref[type], bool]] = {}
# the types of what `_made_from` passes at once: what most modules hold besides tensors
# (by id: a type's own hash may raise, helper-100's FINDING 3)
_PLAIN = frozenset(map(id, (int, float, bool, str, bytes, complex, type(None), tuple, list, dict)))
# (`_kind_of`) by the type's id, with a weak reference to it: a type's own hash and equality
# may raise or take two types for one (helper-100's FINDING 3), and a type made per model
# must not be kept (its FINDING 4)
_kinds: dict[int, tuple[weakref.ref[type], Any]] = {}
# (`_plain_object`) where the classes come from whose objects are no user's state object
_FOREIGN = frozenset(("builtins", "torch", "paddle", "mindspore", "numpy", "jax", "tensorflow"))
_DEEPER = 2
_LOOKED = 256
_NESTED = 32
# `_objects_within`'s limits below the top: at each call, two levels in small containers only
# (a 20 x 20 table of numbers cost 85 us a call, a config object 27: helper-197's FINDING 3);
# in the arguments, as wide as their marks are taken
_LOOKS = (_NESTED, _LOOKED)
_EACH_CALL = (8, 8)
_GIVEN = (_LOOKED, _LOOKED)
_BUDGET = 4096


def _plain_object(cls: type) -> bool:
    """Whether `cls` is a class of the user's whose instances hold state in attributes (a
    cache object, ``self.state.out = y``; until 2026-12-07 an output kept in one was not seen:
    helper-191's FINDING 1): none of its bases but `object` comes from Python's builtins or a
    framework (a tensor, a module, a framework's own objects such as paddle's ParamAttr, which
    every paddle layer holds, are no such object) and it is no metaclass."""
    if issubclass(cls, type):
        return False
    try:
        roots = [str(type.__getattribute__(base, "__module__")) for base in cls.__mro__[:-1]]
    except Exception:  # (a metaclass whose `__mro__` or `__module__` misbehaves: not looked in)
        return False
    return all(root.partition(".")[0] not in _FOREIGN for root in roots)


def _fields_of(value: Any, most: int) -> list[Any]:
    """The attribute values of a namespace, a dataclass instance or a plain object: its own
    ``__dict__``'s, read past any ``__getattribute__`` of its class, and its ``__slots__``'
    (`ops.slot_values`: helper-191's FINDING 1); none where there are more than `most`."""
    try:
        table = object.__getattribute__(value, "__dict__")
    except Exception:  # (none: slots only; a descriptor of the class's that raised)
        table = None
    values = list(dict.values(table)) if type(table) is dict and len(table) <= most else []
    values += ops.slot_values(value)
    return values if len(values) <= most else []


def _holds_a_tensor(held: list[Any]) -> bool:
    """Whether one of `held` is a tensor of an installed backend (by type, `_tensor_types`)."""
    for obj in held:
        cls = type(obj)
        if id(cls) not in _PLAIN and _is_tensor_type(cls, obj):
            return True
    return False


def _is_tensor_type(cls: type, obj: Any) -> bool:
    """Whether objects of `cls`, `obj`'s type, are tensors (`ops.is_tensor` of the first one
    seen, kept in `_tensor_types` for the first 4096 types by id with a weak reference, as
    `_kinds`: a proxy's own checks may raise, and a type made per model must not be kept)."""
    known = _tensor_types.get(id(cls))
    if known is not None and known[0]() is cls:
        return known[1]
    try:
        found = ops.is_tensor(obj)
    except Exception:  # (a proxy whose `__class__` raises: no tensor of ours)
        found = False
    if len(_tensor_types) < 4096:
        try:
            _tensor_types[id(cls)] = (weakref.ref(cls), found)
        except TypeError:
            pass
    return found


def _one_from_another(tensors: Sequence[Any], marks: _Marks) -> bool:
    """Whether a module call returned one tensor twice or one computed from another (or the
    backend cannot tell: `ops.derived`), so that the gradient reaching the first sums its
    uses inside the call with the caller's."""
    if len({id(t) for t in tensors}) < len(tensors):
        return True
    arguments = [t for t in (ref() for ref, _ in marks.values()) if t is not None]
    return ops.derived(tensors, arguments) is not False


def _returns_an_input(tensors: Sequence[Any], marks: _Marks) -> bool:
    """Whether one of a module call's output tensors is one of its arguments, not changed in
    place by the call (`marks`: theirs as the call started; where the backend tells none, it
    may have been: the tensor's hook then sees the gradient of the changed tensor, its
    grad_output, as for an in-place ReLU)."""
    for tensor in tensors:
        found = marks.get(id(tensor))
        if found is None or found[0]() is not tensor or found[1] is None:
            continue
        if found[1] == ops.change_mark(tensor, settled=True):
            return True
    return False


# how deep `_argument_tensors` looks into containers, and what it skips at once (by id)
_DEPTH = 8
_SCALARS = frozenset(map(id, (str, bytes, int, float, complex, bool, type(None))))


def _scalars_only(items: Sequence[Any]) -> bool:
    return _SCALARS.issuperset(map(id, map(type, items)))


def _argument_tensors(value: Any, depth: int, seen: set[int]) -> Iterator[Any]:
    """The tensors in a call's arguments: in tuples, lists, dicts and other mappings
    (`UserDict`, transformers' `BatchEncoding`), sets, deques, namespaces and dataclasses,
    nested up to `_DEPTH`, each container once (`seen`: a container holding itself, or one
    shared, was walked again at each reference: helper-73's attack). Told by type, as
    `_objects_within` tells them: an object whose ``__class__`` or metaclass raises is no
    container (it raised out of the forward: helper-197's FINDING 2); a dataclass's
    attributes as set (a field with init=False may be unset: helper-73's attack)."""
    cls = type(value)
    if id(cls) in _SCALARS:
        return
    if _is_tensor_type(cls, value):
        yield value
        return
    if depth >= _DEPTH or id(value) in seen:
        return
    kind = _kind(value)
    items: Any
    if kind is dict or ((kind is None or kind is _OBJECT) and _is_mapping(cls)):
        # a mapping's own values (`UserDict`, `BatchEncoding`, a mapping proxy, a dict
        # subclass keeping its items elsewhere: helper-199's FINDING 1), or a dict's; none
        # where they raise (its FINDING 3)
        try:
            items = list(value.values())
        except Exception:
            items = list(dict.values(value)) if kind is dict else []
    elif kind is _FIELDS:
        items = _fields_of(value, sys.maxsize)
    elif kind is None or kind is _OBJECT:
        return
    else:
        items = kind.__iter__(value)  # (the base's: a tuple, list, set or deque)
    seen.add(id(value))
    for item in items:
        yield from _argument_tensors(item, depth + 1, seen)


def _is_mapping(cls: type) -> bool:
    try:
        return issubclass(cls, Mapping)
    except Exception:  # (a metaclass that raises)
        return False


def _merged_order(places: Any, names: list[str]) -> list[str]:
    """The modules of a merged history entry, in one order every rank computes alike (from the
    gathered rows): each rank's backward order kept where the ranks agree (a module reached
    after another on some rank comes after it, as in one process's backward over the global
    batch), ties and disagreements decided by the first rank that reached a module and its place
    there; last the modules no rank's backward reached (gradients merged from other slots
    alone), in reverse order of `names`. `places`: each rank's place of each module in its
    backward, 0 for none."""
    first: dict[int, tuple[int, float]] = {}  # module: (rank, place) where first reached
    after: dict[int, set[int]] = {}  # module: the modules some rank reached right after it
    before = [0] * len(names)  # how many modules must come before each one
    for rank, row in enumerate(places):
        reached = sorted((i for i in range(len(names)) if row[i] > 0), key=lambda i: row[i])
        for i in reached:
            first.setdefault(i, (rank, row[i]))
        for a, b in zip(reached, reached[1:]):
            if b not in after.setdefault(a, set()):
                after[a].add(b)
                before[b] += 1
    order: list[str] = []
    left = set(first)
    ready = [(first[i], i) for i in left if before[i] == 0]
    heapq.heapify(ready)
    while left:
        if ready:
            _, i = heapq.heappop(ready)
        else:  # (a cycle: the ranks disagree)
            i = min(left, key=first.__getitem__)
        left.discard(i)
        order.append(names[i])
        for j in after.get(i, ()):
            before[j] -= 1
            if before[j] == 0 and j in left:
                heapq.heappush(ready, (first[j], j))
    order += [names[i] for i in reversed(range(len(names))) if i not in first]
    return order
