"""Module backward hooks for MindSpore with torch's semantics: the shared emulation of
``unihook._module_backward`` over one custom autograd function (``_Function``, MindSpore's
port of ``torch.autograd.Function``, PyNative only).

MindSpore 2.10's own ``Cell.register_backward_hook`` gives the same numbers as torch on plain
models but not torch's contract (docs/MINDSPORE.md §4): grad_input has no slot for a non-tensor
argument, an argument the caller does not differentiate gets its real gradient (torch: zeros),
hooks fire for a gradient with respect to the parameters only and for dict outputs (torch: never),
and a wrong return raises a bare TypeError. The emulation gives torch's contract.

MindSpore quirks handled here:
- every tensor recorded under a grad session has ``_requires_grad`` True (MindSpore has no
  per-tensor requires_grad outside a session; Parameters always have it);
- an in-place op on a ``_Function`` output that is its input, a ``view`` or a ``reshape`` of
  it raises "A view of base is being inplace modified ... custom bprop" (a conv followed by an
  in-place ReLU): the output is ``ops.stop_gradient(x)``, which shares memory and is no view
  (torch's BackwardHook has the same trap; unihook's torch identity returns ``detach()``);
- ``Tensor._version`` counts the in-place ops autograd records (``copy_``; ``Tensor.add_``
  and ``mul_`` are not recorded and leave it as it is), but MindSpore bumps it in its
  asynchronous pipeline: it is read after ``_pynative_executor.sync()`` (docs/MINDSPORE.md §10).
  An identity's output (``stop_gradient``) has a counter of its own: forward's in-place ops on
  an input alias are rebased onto the caller's tensor (``_Rebase``), which bumps its counter;
  an in-place op on an output's alias after the call moves the output's counter at the output
  identity's backward (``_carry_versions``), so MindSpore's check of a saved output raises;
- ... where the backward reaches the output by another way than its alias (a kept output, an
  argument returned) and never reaches the output identity (the caller's op cut the alias's
  history), a prehook on the output's node refuses instead (`_reached`), or makes MindSpore's
  version error that follows the refusal (`_converting`, around the executor's `grad`);
- ... and an in-place op on the caller's tensor after the call moves its counter, not that of
  the input side's alias the cell saved (a Dense its input): `_Watched` moves the alias's
  counter at the output identity's backward, where the caller's moved, so that MindSpore's
  own check raises where it does without hooks. A handle on the caller's counter shares its
  autograd data (`Tensor(h)`, `Tensor._make_subclass`; `ops.detach`, which would not, has no
  CPU kernel): held only while the caller holds its own object (a cycle through C++
  otherwise), then read at the next sync unihook does anyway;
- `Tensor(alias)` made before `apply` gives the alias its node shares its counter and memory,
  not its autograd data; `Tensor._make_subclass(Tensor, alias)` there does share it;
- `h[0] = c` is `assign_value`: the tensor object takes another tensor's memory, counter and
  history (what saved that object sees them; an alias of it does not);
- MindSpore refuses an in-place op on a leaf that requires grad and on a view of one, and on
  the output of a custom function that is its input (the trap above): ``_Guard`` turns the
  latter into the former for a leaf an identity would otherwise alias.
"""

from __future__ import annotations

import heapq
import sys
import threading
import weakref
from functools import partial
from typing import Any, Callable, Collection, Sequence

import mindspore
from mindspore._c_expression import _unsafe_set_version_counter as _set_versions
from mindspore.common._grad_function import _Function
from mindspore.graph.api import _pynative_executor
from mindspore.ops import stop_gradient, zeros

from unihook.backend import (
    Autograd,
    Dispatchers,
    ModuleBackward,
    Site,
    add_global_backward_hook,
    check_grad_like,
    check_kept_input,
    kept_inputs,
    register_backward_hook,
)
from unihook.errors import HookReturnError, InPlaceError
from unihook.handles import Handle

from . import NAME
from ._forward import add_dispatchers
from ._global import CALL_CODES

Grads = Sequence[Any]
Tensor = mindspore.Tensor
# the dtypes a gradient is of: torch's identity gives an integer or bool tensor none
_DIFFERENTIABLE = frozenset(
    (*mindspore.common.dtype.float_type, *mindspore.common.dtype.complex_type)
)
# `_share(Tensor, t)`: another tensor object sharing t's memory, version counter and autograd
# data (as `Tensor(t)`, which takes 5 us against 0.8, measured); `h[0] = c` (MindSpore's
# `assign_value`) gives t's object another tensor, and leaves this one as it was
_share = Tensor._make_subclass


def _nonzero(tensor: Any) -> bool:
    """Whether `tensor` has a nonzero element. MindSpore 2.10's `Tensor.any()` (and
    `ops.any`) is wrong for a tensor of two dimensions or more that is not bool: `[[0.,
    0.5]]` gives False (measured: 178 of 400 random float tensors with a few nonzeros, any
    non-bool dtype); a comparison first gives a bool tensor, whose `any()` is right (until
    2026-12-06 the backend used `any()` here: a nonzero gradient a hook returned where it has
    nowhere to go could pass as zeros, and an in-place refusal could be skipped)."""
    return bool((tensor != 0).any())


def _is_tensor(obj: object) -> bool:
    return isinstance(obj, Tensor)


class _Identity(_Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, on_backward: Callable[[Grads], Grads], materialize: bool, site: Site, *xs: Any
    ) -> Any:
        ctx.on_backward = on_backward
        ctx.site = site._replace(kind="full_backward" if materialize else "full_backward_pre")
        ctx.shapes = [(tuple(x.shape), x.dtype) for x in xs]
        ctx.set_materialize_grads(materialize)
        ctx.materialize = materialize  # (the native flag is write-only)
        ctx.ran = False  # (`_emulate`: whether a backward pass reached it)
        ctx.boundary = ()  # (`_emulate`: the edges of a call's inputs, where no input side)
        # MindSpore sends a gradient to an input that needs none (a plain tensor recorded in a
        # grad session); torch's identity marks it non-differentiable: zeros, or None
        ctx.dead = [i for i, x in enumerate(xs) if not x._requires_grad]
        # ... and to an integer or bool tensor (`a > 0`, an `astype(int32)`) its own gradient
        # through the cast, which torch has none of: the hooks see zeros, or None, where torch's
        # do; MindSpore gets its own, as without hooks (helper-108's FINDINGS 5, 5b)
        ctx.integral = [
            i for i, x in enumerate(xs) if x._requires_grad and x.dtype not in _DIFFERENTIABLE
        ]
        # shares memory and is no view: in-place ops after the module work (module docstring)
        aliases = tuple(stop_gradient(x) for x in xs)
        # ... but has a version counter of its own: an in-place op on an output's alias would
        # not move the counter of the output, which the op that made it may have saved (a
        # Sigmoid its output): the output side keeps handles on both counters, and its backward
        # moves the output's where the alias's moved (`_carry_versions`). (Not the caller's
        # tensors the input side got, from the node: they get histories through this node,
        # `h.add_(m(h))`, a cycle through C++ that Python cannot collect; `_Watched` holds
        # them only while the caller holds its own object; and `watch` takes out the outputs
        # that are arguments, or share their memory, for the same reason.)
        ctx.inputs = ctx.probes = ()
        _made.ctx = ctx
        if materialize:
            # The input side's aliases: likewise an in-place op on the caller's tensor after
            # the call would not move theirs, which the cell's ops recorded as they saved them
            # (a Dense its input): handles on their counters (`Tensor(alias)` before `apply`
            # gives the alias its node shares its counter and memory, not its autograd data;
            # `_share(Tensor, alias)` there does share it, measured: the node kept alive by a
            # record waiting in `_dropped`), which `_Watched` moves where the caller's moved
            _made.counters = [Tensor(alias) for alias in aliases]
        else:
            ctx.inputs = [_counter_of(x) for x in xs]
            ctx.probes = [_counter_of(alias) for alias in aliases]
            ctx.versions = [int(probe._version) for probe in ctx.probes]
            # ... and what tells, should an alias have changed, that the caller's tensor is not
            # the output alone (`_carry_versions`): the outputs weakly (one the cell kept is
            # alive), and what `watch` finds (a view of an argument, an output returned twice)
            ctx.outputs = list(map(weakref.ref, xs))
            ctx.hazards = None
            ctx.watched = ()  # the call's arguments the cell got as aliases (`_watch_inputs`)
            ctx.reaches = ()  # (`_on_reach`)
            ctx.input_side = None  # (`identity`'s `held_until`)
        return aliases

    @staticmethod
    def backward(ctx: Any, *came: Any) -> Any:  # type: ignore[override]
        ctx.ran = True
        grads: Grads = came
        if at_end:
            at_end.emulate_after(int(ctx._sequence_nr()))
            grads = at_end.with_zeros_sent(ctx, came)
        results = _identity_backward(ctx, grads)
        for i, result in enumerate(results):
            if result is None and i not in ctx.dead:
                _cut(ctx, results)
                break
        return (None, None, None, *results)


def _identity_backward(ctx: Any, grads: Grads) -> Grads:
    """What an identity's backward returns for `grads`: its hooks' results (MindSpore's
    engine materialized the input side's None gradients as zeros, `set_materialize_grads`)."""
    if ctx.probes:
        _carry_versions(ctx, grads)
    came = grads
    # (a node torch's engine would not run: no hook call; an output side's outputs torch has
    # no edge for: None, `_slots_needing_no_grad`)
    unneeded = _slots_needing_no_grad(ctx, grads)
    if unneeded is None:
        return [None if i in ctx.dead else g for i, g in enumerate(grads)]
    if ctx.dead or ctx.integral or unneeded:
        filled = list(grads)
        for i in (*ctx.dead, *ctx.integral, *unneeded):
            shape, dtype = ctx.shapes[i]
            filled[i] = zeros(shape, dtype) if ctx.materialize else None
        grads = tuple(filled)
    _running.ctx = ctx  # (`_after_backward`)
    try:
        results = ctx.on_backward(grads)
    finally:
        _running.ctx = None
    if results is not grads:
        for result, grad, (shape, dtype) in zip(results, grads, ctx.shapes):
            if grad is None and result is not None:
                check_grad_like(result, shape, dtype, "mindspore.Tensor", _is_tensor, ctx.site)
    if ctx.dead or ctx.integral or unneeded:
        results = list(results)
        for i in ctx.dead:
            results[i] = None
        for i in (*ctx.integral, *unneeded):
            results[i] = came[i]
    return results


# .ctx: the context of the identity `_Identity.apply` just ran; .counters: the handles on the
# counters of the input side's aliases it just made
_made = threading.local()
# .ctx: the identity whose hooks run on this thread (`_identity_backward`)
_running = threading.local()
# the backward pass (MindSpore's engine id, one per pass) that `_carry_versions` last synced in
_synced = [-1]
_engine_id = _pynative_executor.get_current_autodiff_engine_id
_empty: dict[Any, Any] = {}  # an empty tensor by dtype (`_counter_of`)


def _counter_of(tensor: Any) -> Any:
    """A tensor sharing `tensor`'s version counter and nothing else it keeps alive but its
    autograd data (none for a fresh alias, whose node `apply` sets later): `Tensor(t)` shares
    t's counter, memory and autograd data; `set_` onto an empty tensor lets the memory go and
    keeps the counter shared (measured: RSS as without it). The alias itself, or a view of it,
    would hold the node that holds this: a cycle through C++ that Python cannot collect."""
    handle = Tensor(tensor)
    empty = _empty.get(tensor.dtype)
    if empty is None:
        empty = _empty[tensor.dtype] = zeros((0,), tensor.dtype)
    handle.set_(empty)
    return handle


def _carry_versions(ctx: Any, grads: Grads) -> None:
    """An output's alias changed in place after the identity's forward: the output's counter
    moves too, before the backward of the op that made it reads it. MindSpore then raises its
    own RuntimeError ("One of the Tensor needed for gradient computation has been modified by
    an inplace operation") where it does without hooks, not a gradient computed from the
    changed values (issue 16, F1). Where the output is more than the tensor the caller got
    (`_hazard`), no counter can make that exact: `InPlaceError`."""
    inputs, probes = ctx.inputs, ctx.probes
    ctx.inputs = ctx.probes = ()
    for reach in ctx.reaches:
        reach.done = True
    # The counters move in the async pipeline (module docstring): one sync per backward pass,
    # at its first output identity, shows every in-place op issued before the pass. (A sync
    # stalls the pipeline's backward kernels: one per hooked cell made a loop of small cells
    # 2.1-2.7x plain, against 1.5-1.8x: benchmarks/mindspore_pipeline.py.) An op a hook
    # issues during the pass may be missed here (the counters move asynchronously in the
    # backward too); MindSpore's own check, without hooks, misses it at random (3 to 4 runs
    # in 20: a gradient from the changed values, else its error), and where it is missed the
    # gradient is that one (the memory is shared).
    _sync_once_per_pass()
    if ctx.watched:
        # before the cell's own backward (its nodes come before this one in the graph)
        watched, ctx.watched = ctx.watched, ()
        _check_inputs(watched, ctx.site, grads)
    moved = []
    for k, (x, probe, version) in enumerate(zip(inputs, probes, ctx.versions)):
        if int(probe._version) == version:
            continue
        hazard = _hazard(ctx, k, x)
        if hazard is not None:
            raise _changed_error(ctx.site, k, hazard)
        if x is not None:
            moved.append(x)
    if moved:
        _set_versions(moved, [int(x._version) + 1 for x in moved])


def _sync_once_per_pass() -> None:
    engine = _engine_id()
    if engine != _synced[0] or engine < 0:
        _pynative_executor.sync()
        _synced[0] = engine
        _settle_dropped()


class _Reach:
    """What `_reached` needs of output `k` of a hooked call, held by the prehook on the node
    that made it: not the output identity's context, which dies where the caller's op cut its
    alias's history (nothing holds that node any more), nor a handle on the output (its
    autograd data holds that node: a cycle through C++), nor the node's parents (one is the
    call's input identity, whose context holds the call and the cell: a cycle through a cell
    that keeps this output): the handle on the alias's counter (none of its autograd data),
    the version it had, whether its history reaches a leaf (`_live`, walked at the call), and
    what tells a hazard (`_hazard`)."""

    __slots__ = (
        "probe", "version", "k", "live", "index", "site", "output", "static", "view", "done",
        "input_side", "__weakref__",
    )  # fmt: skip

    def __init__(self, ctx: Any, k: int, view: bool) -> None:
        self.probe, self.version, self.k = ctx.probes[k], ctx.versions[k], k
        self.site, self.output = ctx.site, ctx.outputs[k]
        self.static = None if ctx.hazards is None else ctx.hazards[k]
        self.view = view
        self.done = False
        self.index = 0
        self.live = False  # (`_live`, known at the call: nothing upstream changes after it)
        self.input_side: weakref.ref[Any] | None = ctx.input_side


def _reached(reach: _Reach, grads: Grads) -> None:
    """(A prehook on the node that made output `k` of a hooked call, or, for an argument
    returned as it was, on the op that made it.) That node's backward is about to run and the
    call's output identity's backward has not: the backward reaches the tensor by another way
    than the caller's alias (the cell kept it, `self.kept = y`; the caller holds it, an
    argument returned). Where the alias changed in place after the call and the output is
    more than the alias (`_hazard`), `_carry_versions` refuses at the output identity; that
    backward never runs where the op cut the alias's history (`y.copy_(stop_gradient(y) *
    3)`: nothing reaches the alias's old history), and the tensor's own history, which
    misses the op, is read (without hooks the reads after the op go the op's way). Refused
    here where that history reaches a leaf and the gradient arriving is not zeros (`_live`:
    another gradient, silently, before); where it reaches none (the op, or an earlier one,
    cut everything upstream: MindSpore's gradients, 5 programs of the generator's seeds 1, 3,
    7), only if MindSpore's version error follows (something that history saved changed
    since; without hooks there is none: issue 16, the generator's seed 7 with `inputs`,
    programs 71 and 278): `_converting` makes it this refusal."""
    if reach.done:
        return None  # (the output identity's backward checked)
    grad = grads[reach.index] if reach.index < len(grads) else None
    if grad is None:
        return None
    _sync_once_per_pass()
    if int(reach.probe._version) == reach.version:
        return None
    hazard = reach.static
    if hazard is None and reach.output() is not None:
        hazard = _KEPT
    elif hazard is None and reach.view:
        hazard = _VIEW
    if hazard is None:
        return None
    reach.done = True
    error = _changed_error(reach.site, reach.k, hazard + _ANOTHER_WAY)
    # (a reduction, a sync and a walk of the graph, on the way to an error only)
    if reach.live and _nonzero(grad):
        if not _pending.converting:
            raise error
        # Raised by `_converting` once the pass is over: raised here, inside MindSpore's
        # backward, it left the cell and its graph alive for good (one cell per refusal,
        # measured; a hook raising frees them).
        _pending.live = _pending.live or error
        _pending.abandoned.append(reach.input_side)
        return None
    if _pending.error is None:
        _pending.error = error
    return None


_COPIES = frozenset({"InplaceCopy", "CopySlice"})  # (`_live`)


def _live(edges: Sequence[tuple[Any, int]]) -> bool:
    """Whether the backward from a node with these `edges` (its `next_functions`) reaches a
    leaf (a Parameter, an argument of the differentiated function), but through the tensor a
    `copy_` overwrote (the first edge of `InplaceCopy`, which gets zeros, and of `CopySlice`,
    a copy into a view, which gets zeros where the view is: all of a reshape, a part of a
    slice, taken as all): where it does not, the gradient arriving there changes none
    MindSpore returns. (Taking a live path for a dead one refuses MindSpore's numbers; the
    other way round leaves the refusal to `_converting`, as where nothing checked.)"""
    stack: list[Sequence[tuple[Any, int]]] = [edges]
    seen: set[int] = set()
    while stack:
        for parent, _ in stack.pop():
            if parent is None:
                continue
            if parent.is_leaf():
                return True
            key = parent._unique_id()
            if key not in seen:
                seen.add(key)
                more = parent.next_functions
                stack.append(more[1:] if parent.name() in _COPIES else more)
    return False


class _Pending(threading.local):
    """The refusals `_reached` found in this thread's running backward pass (`_converting`):
    `live`, raised when the pass ends; `error`, only if MindSpore's version error follows."""

    error: InPlaceError | None = None
    live: InPlaceError | None = None
    converting = False  # (a `_converting` runs on this thread)
    abandoned: list[weakref.ref[Any] | None] = []  # (per pass: `_abandon`)


_pending = _Pending()
_CHANGED = "modified by an inplace operation"
# The live `_Reach` records, weakly: the executor's `grad` is wrapped (`_converting`) while one
# lives, and restored when the last dies (removing every hook leaves no wrapper once the
# graphs they made are gone)
_reaches: set[weakref.ref[_Reach]] = set()
_reaches_lock = threading.RLock()  # (a record may die, and call back, inside the lock)


def _converting(grad: Callable[..., Any]) -> Callable[..., Any]:
    """MindSpore's executor's `grad` (`mindspore.grad`, `value_and_grad`, `GradOperation`
    run their backward in it), where MindSpore's version error, after `_reached` found that
    the backward read a tensor's history which misses an in-place op through a hooked call's
    alias, becomes that `InPlaceError`. Installed at the first such call (`_on_reach`)."""

    def converting(*args: Any, **kwargs: Any) -> Any:
        # (a `grad` inside a hook, or a function: the outer pass's refusals wait)
        outer = _pending.error, _pending.live, _pending.converting, _pending.abandoned
        _pending.error, _pending.live, _pending.converting = None, None, True
        _pending.abandoned = []
        try:
            result = grad(*args, **kwargs)
        except Exception as error:
            live, pending = _pending.live, _pending.error
            if live is not None and not isinstance(error, InPlaceError):
                _abandon(_pending.abandoned, live)
                raise live from error  # (the pass went on past it: what it met since is moot)
            if (
                pending is None
                or not isinstance(error, RuntimeError)
                or isinstance(error, InPlaceError)
                or _CHANGED not in str(error)
            ):
                raise
            raise pending from error
        finally:
            live = _pending.live
            _pending.error, _pending.live, _pending.converting, _pending.abandoned = outer
        if live is not None:
            raise live
        return result

    converting.__wrapped__ = grad  # type: ignore[attr-defined]
    return converting


def _abandon(input_sides: Sequence[weakref.ref[Any] | None], error: InPlaceError) -> None:
    """A pass that `_reached` refused ("live") and that MindSpore's own error then ended:
    MindSpore frees its nodes' contexts when a pass ends, not when one raised, and the
    refused call's input identity, which that pass never reached, holds the call, so the cell,
    which keeps the output whose history reaches that node: a cycle through C++, the cell and
    its graph alive for good (without hooks that error frees them). Its context lets go of
    the call; a later pass reaching it (another output of the call) raises the refusal again,
    as torch's own hook refuses every use after an in-place op on a hooked output."""
    for ref in input_sides:
        ctx = None if ref is None else ref()
        if ctx is not None:
            ctx.on_backward = partial(_refused, str(error))


def _refused(message: str, grads: Grads) -> Grads:
    raise InPlaceError(message)


def _watch_reach(reach: _Reach) -> None:
    """Keep the executor's `grad` wrapped while `reach` lives."""
    with _reaches_lock:
        _reaches.add(weakref.ref(reach, _reach_died))
        if "grad" not in vars(_pynative_executor):
            _pynative_executor.grad = _converting(_pynative_executor.grad)


def _reach_died(ref: weakref.ref[_Reach]) -> None:
    with _reaches_lock:
        _reaches.discard(ref)
        if not _reaches:  # (a running `grad` keeps its wrapper: only the attribute goes)
            vars(_pynative_executor).pop("grad", None)


_ANOTHER_WAY = (
    "; the backward reaches that tensor by another way than the output the caller got (the "
    "cell, a hook or the caller read it apart from the output)"
)


# The ops whose output shares its input's memory (MindSpore records them by these names; a
# `view`, `reshape`, `flatten` are "Reshape" nodes): an in-place op on such an output without
# hooks goes through MindSpore's handling of views, which differs from that on the alias
_VIEW_NODES = frozenset(
    {
        "Reshape",
        "View",
        "StridedSlice",
        "Slice",
        "Transpose",
        "TransposeView",
        "TransposeExtView",
        "ExpandDims",
        "ExpandDimsView",
        "Squeeze",
        "Unsqueeze",
        "Narrow",
        "NarrowView",
        "SelectExtView",
        "BroadcastTo",
        "BroadcastToView",
        "Diagonal",
        "DiagonalView",
        "Split",
        "SplitTensorView",
        "SplitWithSizeView",
        "UnstackExtView",
        "Unstack",
        "SelectView",
        "ChunkView",
        "SliceExtView",
        "Flatten",
        "Chunk",
        "Unbind",
        "AsStrided",
    }
)


def _is_view_node(node: Any) -> bool:
    # (MindSpore's view kernels are named `...View`: `x[0]` is SelectView, measured 2.10)
    name = node.name()
    return name in _VIEW_NODES or name.endswith("View")


# The ops whose backward reads their output (MindSpore records them by these names): an in-place
# op on it raises without hooks. Measured on MindSpore 2.10 (`tests/test_mindspore_native.py::
# test_ops_that_save_their_output`); Mul, Add, MatMul, BiasAdd, LayerNorm, SiLU, ReLU6, HSwish,
# Mish, Log, Abs, Cast and others do not.
_SAVES_OUTPUT = frozenset(
    {
        "ReLU",
        "Sigmoid",
        "Tanh",
        "Exp",
        "Softmax",
        "LogSoftmax",
        "Sqrt",
        "Rsqrt",
        "Pow",
        "Elu",
        "SeLU",
        "Reciprocal",
        "Expm1",
        "Tan",
        "Erfinv",
        "Sinc",
    }
)


def _producer_node(tensor: Any) -> tuple[Any, int]:
    """The node of the op that made `tensor` and the output's index (None for a leaf), through
    unihook's identity nodes (an earlier hooked cell's output alias, under global hooks):
    output k of one comes from its edge 3 + k (after the three non-tensor arguments),
    whatever its other outputs."""
    node, index = tensor._grad_node, tensor._output_index
    while node is not None and not node.is_leaf() and node.name() == _Identity.__name__:
        node, index = node.next_functions[3 + index]
    return (None, 0) if node is None or node.is_leaf() else (node, index)


def _producer(tensor: Any) -> str:
    """The name of the op that made `tensor` ("" for a leaf), as `_producer_node`."""
    node, _ = _producer_node(tensor)
    return "" if node is None else node.name()


def _on_reach(ctx: Any, reaches: Sequence[tuple[int, Any, int]]) -> None:
    """`_reached` runs before the backward of each node (output k of the call `ctx` stands
    for, made by output `index` of `node`), unless the output identity's ran first."""
    made = []
    for k, node, index in reaches:
        reach = _Reach(ctx, k, _is_view_node(node))
        reach.index = index
        # Its parents walked now: a node's parents do not change after it is made, and holding
        # them would close a cycle through C++ (a parent is the call's input identity, whose
        # context holds the call, the cell; the cell a kept output, its node this record),
        # which kept every cell that keeps its output, and its last graph, alive for good.
        edges = node.next_functions
        reach.live = _live(edges[1:] if node.name() in _COPIES else edges)
        node.register_prehook(partial(_reached, reach))
        _watch_reach(reach)
        made.append(reach)
    ctx.reaches = made


def _hazard(ctx: Any, k: int, x: Any) -> str | None:
    """Why output `k`, whose alias changed in place after the call, is not the alias's alone:
    without hooks the change reaches a tensor (its history, or MindSpore's view handling) that
    with hooks it does not. None where the counter carried over is exact (`x`: the handle on
    the output's counter and history, None where `watch` let go of it)."""
    if ctx.hazards is not None and ctx.hazards[k] is not None:
        return ctx.hazards[k]
    if x is None:
        return None  # (an argument returned unchanged, a leaf: as before, see `watch`)
    if ctx.outputs[k]() is not None:
        return _KEPT
    node = x._grad_node
    if node is not None and _is_view_node(node):
        return _VIEW
    return None


def _view_of_leaf(tensor: Any) -> bool | None:
    """Whether `tensor` is a view (made by a view op: a reshape, a slice, a transpose) of a
    leaf, or of a tensor with a history (False); None where it is no view."""
    node = tensor._grad_node
    if node is None or not _is_view_node(node):
        return None
    while node is not None and _is_view_node(node):
        node = node.next_functions[0][0]
    return node is not None and node.is_leaf()


def _changed_view(site: Site, of_leaf: bool) -> InPlaceError:
    """Forward changed its argument in place, and the caller's tensor is a view: the
    caller's tensor cannot take the op's history (MindSpore's `_Function` marking a view dirty
    cuts the gradient to its base: measured zeros, 2.10), so the call refuses it."""
    why = (
        'of a leaf that requires grad, which MindSpore refuses without hooks too ("A view of '
        'leaf tensor that requires grad is being used in an inplace operator")'
        if of_leaf
        else "of another tensor: MindSpore's own gradient through an in-place op on a view is "
        "not the math's (measured, 2.10), and with backward hooks the view cannot take the "
        "op's history at all (its base would get no gradient)"
    )
    return InPlaceError(
        f"{site}: forward changed its tensor argument in place, and the caller's tensor is a "
        f"view (a reshape, a slice, a transpose) {why}. Pass the cell a copy "
        "(`cell(x.copy())`), or change a copy of the argument in forward"
    )


_KEPT = (
    "the cell (or a hook) kept the output it returned (`self.kept = y`): without hooks the "
    "kept tensor is the one changed, with its new history"
)
_VIEW = (
    "the output is a view of another tensor (a reshape, a slice, a transpose): without hooks "
    "MindSpore's handling of an in-place op on a view applies"
)


def _changed_error(site: Site, k: int, why: str) -> InPlaceError:
    return InPlaceError(
        f"{site}: output {k} of the call was changed in place after it returned, and {why}. "
        "With backward hooks the caller gets an alias of the output (same memory, a history "
        "of its own, as torch's hooks give a view on which they refuse any in-place op): the "
        "change reaches the alias only, and the gradients would differ from MindSpore's "
        "without hooks. Change a copy (`y = cell(x).copy()`), or do the op in the cell"
    )


def _flag(ctx: Any, k: int, why: str) -> None:
    if ctx.hazards is None:
        hazards: list[str | None] = [None] * len(ctx.probes)
        ctx.hazards = hazards
    ctx.hazards[k] = why


class _OwnRef(weakref.ref):  # type: ignore[type-arg]
    """The backend's own weak references to tensors (an input side's aliases, the arguments
    of a call it watches): `kept_inputs` does not take them for a cell keeping its input."""

    __slots__ = ()


class _Watched:
    """An argument of a hooked call whose caller's tensor the cell did not get as it is (the
    input side's alias: same memory, a version counter of its own, `_Identity`), or that
    comes back to the caller as an alias (an `Identity`-like cell, a view of the argument).
    An in-place op on the caller's tensor after the call moves the caller's counter only:
    - not the alias's, which the cell's ops recorded as they saved it (a Dense its input):
      their backward would read the changed values silently, where MindSpore raises without
      hooks. Checked before the cell's backward (`_check_inputs`): where the caller's counter
      moved, the counters of `targets` move too (the alias, and the aliases of inner hooked
      calls that got it as it was), and MindSpore's own check of what the cell saved raises
      its own error, exactly where it does without hooks (and nothing where it saved none);
    - without hooks the output that is that argument (or a view of it) changes too, with the
      op's history; the alias the caller got does not: `returned` says which (the output's
      slot, and why), and the check
      raises `InPlaceError` (the output node's backward runs: the loss reads that output).

    `handle` (`_share(Tensor, caller's tensor)`) shares its counter, memory and autograd data:
    held from the call's output node, it would close a cycle through C++ once the caller's
    history runs through that node (`h.add_(m(h))`), which a pass that raises, or a forward
    that raises, leaves alive. So it is held only while the caller holds its own Python object
    (which holds all that anyway): when that dies (`ref`'s callback; `h = h.copy_(...)`, a
    helper's local), the record waits in `_dropped` until the next pipeline sync unihook does
    anyway (the next hooked call's post-dispatch, or the next backward pass), which reads the
    counter (any op through that object came before its death) and lets the handle go."""

    __slots__ = ("ref", "handle", "base", "targets", "returned", "changed", "__weakref__")

    def __init__(self, original: Any, counter: Any, returned: tuple[int, str] | None) -> None:
        self.handle = _share(Tensor, original)
        self.base = int(original._version)  # (read after post-dispatch's sync)
        self.targets = [] if counter is None else [counter]
        self.returned = returned
        self.changed = False


# records whose caller's Python object died before the backward (`_Watched`)
_dropped: list[_Watched] = []


def _caller_died(record: weakref.ref[_Watched], _: object) -> None:
    watched = record()
    if watched is not None and watched.handle is not None:
        _dropped.append(watched)


def _moved(watched: _Watched) -> None:
    """The caller's tensor changed in place after the call: its aliases' counters move."""
    targets, watched.targets, watched.handle = watched.targets, [], None
    watched.changed = True
    if targets:
        _set_versions(targets, [int(t._version) + 1 for t in targets])


def _settle_dropped() -> None:
    """(After a pipeline sync.) The records whose caller's object died since the last sync:
    any in-place op through it came before its death, and shows in the counter now."""
    while _dropped:
        try:
            watched = _dropped.pop()
        except IndexError:  # (another thread took the last one)
            break
        handle = watched.handle
        if handle is None:
            continue
        if int(handle._version) != watched.base:
            _moved(watched)
        else:
            # Nothing changed it before its Python object died, and an in-place op needs one:
            # let go (another object for the same tensor, a view of it, or a `Tensor(h)` the
            # caller made, may still change it: not seen, docs/MINDSPORE.md section 11)
            watched.handle, watched.targets = None, []


def _swapped(record: _Watched, handle: Any) -> bool:
    """Whether the caller's object, still alive, now holds another tensor whose counter
    MindSpore would find moved: `h[0] = c` under grad gives it a new tensor (memory, counter,
    history: `assign_value`), and what saved the object reads that one in its backward, and
    raises where the new counter's value is not the version it saved. (Where it is the same
    value MindSpore reads the new values: no alias can follow, the gradient stays the one from
    the values at the call, docs/MINDSPORE.md section 11 (a). A dead object: not seen.)"""
    caller = record.ref()
    if caller is None or caller is handle:
        return False
    key = _memory_key(caller)
    return key != _memory_key(handle) and int(caller._version) != record.base


def _check_inputs(watched: Sequence[_Watched], site: Site, grads: Grads) -> None:
    """(After the backward pass's sync, in the call's output node's backward, before the
    cell's own nodes run.) The handle, not the caller's object: `h[0] = c` gives the Python
    object another tensor (version 0), and leaves the one the call got as it was. `grads`:
    the output node's, by slot (an output the loss does not read has None or zeros: the op's
    history would carry nothing through it, nothing to refuse)."""
    for record in watched:
        handle = record.handle
        if handle is not None and int(handle._version) != record.base:
            _moved(record)
        elif handle is not None and _swapped(record, handle):
            _moved(record)
        if record.changed and record.returned is not None:
            slot, why = record.returned
            grad = grads[slot] if slot < len(grads) else None
            # (a reduction and a sync, on the way to an error only)
            if grad is None or not _nonzero(grad):
                continue
            raise InPlaceError(
                f"{site}: an argument of the call was changed in place after the call, and "
                f"{why}. With backward hooks the caller gets an alias of the output "
                "(same memory, a history of its own): without hooks the output is the "
                "argument, and its history has the op; the gradients would differ from "
                "MindSpore's without hooks. Change a copy of the argument, or pass a copy to "
                "the cell (`cell(x.copy())`)"
            )


def _watch_inputs(
    ctx: Any,
    args: Sequence[Any],
    tensor_idx: Sequence[int],
    originals: Sequence[Any],
    returned: dict[int, tuple[int, str]],
) -> None:
    """The call's arguments to watch for an in-place op after the call (`_Watched`)."""
    records: list[_Watched] | None = None
    for k, i in enumerate(tensor_idx):
        original, alias = originals[k], args[i]
        if original is None or alias is None:
            continue
        if alias is original:
            # (no input side: the cell got the caller's tensor, MindSpore checks what it saved)
            if k not in returned:
                continue
            alias = None
        if isinstance(original, mindspore.Parameter):
            continue  # (MindSpore refuses an in-place op on a leaf that requires grad)
        if records is None:
            if alias is None:
                # (without an input side nothing synced since pre_dispatch: forward's own
                # in-place ops on the argument may still be in the pipeline; a call returning
                # its argument or a view of it, with pre-hooks alone: rare)
                _pynative_executor.sync()
            # (else post_dispatch synced the pipeline: the versions of the input side's aliases)
            _settle_dropped()
            records = []
        counter = None
        entry = None if alias is None else _aliases.get(id(alias))
        if entry is not None and entry[0]() is alias:
            # (the handle on the alias's counter, not the alias: its autograd data holds the
            # input side's node, which a record waiting in `_dropped` would keep alive)
            counter = entry[2]
        elif alias is not None:
            continue  # (not the input side's alias: a backend's or hook's own replacement)
        watched = _Watched(original, counter, returned.get(k))
        if entry is not None:
            # An inner hooked call that got this alias as it was: its own alias moves with it
            for link in entry[3:]:
                if isinstance(link, list):  # (the counters of an inner call given a view)
                    watched.targets.extend(link)
                    continue
                inner = link()
                if inner is not None:
                    watched.targets.extend(inner.targets)
            del entry[3:]
        # ... and this one, where the caller's tensor is an outer call's alias
        outer = _aliases.get(id(original))
        if outer is not None and outer[0]() is original:
            outer.append(weakref.ref(watched))
        elif watched.targets:
            # or a view of one (`self.conv(x.reshape(...))`): the view dies when the outer
            # forward ends, and its record is settled before the caller's op (docs/MINDSPORE.md
            # section 11 (g)): the outer call takes this alias's counter itself
            outer = _outer_of_view(original)
            if outer is not None:
                outer.append(list(watched.targets))
        watched.ref = _OwnRef(original, partial(_caller_died, weakref.ref(watched)))
        records.append(watched)
    if records:
        ctx.watched = records


class _Aliases(tuple):  # type: ignore[type-arg]
    """An identity's aliases, with its node's context (for `watch`) and, for the input side,
    a weak reference to it (its `node`, which the core hands the output side)."""

    ctx: Any = None
    node: weakref.ref[Any] | None = None


class _Rebase(_Function):
    """`original` takes `alias`'s history: an in-place node (``mark_dirty``) that moves no data
    (they share memory) and sends the whole gradient to `alias`. On a leaf that requires grad
    MindSpore raises its own "A leaf tensor that need grad is being used in an inplace
    operator", as it does without hooks."""

    @staticmethod
    def forward(ctx: Any, original: Any, alias: Any) -> Any:  # type: ignore[override]
        ctx.mark_dirty(original)
        return original

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return None, grad


class _Guard(_Function):
    """`x` returned as it is: MindSpore refuses every in-place op on it at once, with its own
    RuntimeError ("A view of base is being inplace modified ... custom bprop")."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:  # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:  # type: ignore[override]
        return grad


def _quiet_rebase(original: Any, alias: Any, site: Site) -> Any:
    """`rebase` that leaves `original`'s version counter where it was: no in-place op changed
    it (`watch_inputs`), and the ops that saved it check the counter (a bumped one raised
    MindSpore's "modified by an inplace operation" at a correct program)."""
    version = MindSporeAutograd.version(original)
    MindSporeAutograd.rebase(original, alias, site)
    _set_versions([original], [version])
    return original


def _node_id(tensor: Any) -> object:
    _pynative_executor.sync()  # (an in-place op gives it its node in the pipeline)
    try:
        node = tensor._grad_node
    except RuntimeError:
        # "Try to get grad node of custom function which ctx has been freed!": its node is a
        # Function whose backward ran in this pass (a check's `_Rebase`): no in-place op since
        return ...
    return None if node is None else node._unique_id()


def _memory_key(tensor: Any) -> int | None:
    # the storage: MindSpore refuses an in-place op on a leaf and on any view of it
    if not tensor.size:
        return None  # (an empty tensor has no memory to share)
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, TypeError, AttributeError):  # no device memory yet
        return None


class _End:
    """What to do at the end of a running backward: the deferred calls, and what identities
    cut (`_cut`): the graph before the cut edges as it was then, and what torch's engine
    would send along its edges that MindSpore's does not run. The pass frees its nodes
    before its final callback, and an identity's node with them (its context lives on, held
    here): held strongly (until 2026-12-06 the calls were held weakly, and a call whose
    outputs do not read its inputs died with its output side's node, its full hooks never
    fired), until the final callback, or, where the pass raised (it runs none), until the
    Python frame that entered the pass has left its thread's stack."""

    __slots__ = (
        *("calls", "later", "entered", "graph", "reaching", "sent", "queue", "fired"),
        *("entry", "thread"),
    )

    def __init__(self, entry: tuple[int, Any, int]) -> None:
        self.calls: list[Callable[[], None]] = []  # (`_after_backward`)
        self.later: list[Callable[[], None]] = []  # (`_emulated`: waiting for an input side)
        self.entered: set[tuple[int, int]] = set()  # (`_emulate`: the cutters' `boundary`)
        self.graph: dict[int, _Node] = {}
        self.reaching: _Reaching | None = None  # (with the first cut)
        # node -> output index -> 0 (undefined) or 1 (zeros), as torch's engine would send;
        # the nodes in it by sequence number, latest first (a heap)
        self.sent: dict[int, dict[int, int]] = {}
        self.queue: list[tuple[int, int]] = []
        # unihook's tensor hooks (by `id`: `_Node`s hold them) that ran in the pass since
        self.fired: set[int] = set()
        self.entry = entry  # (`_entry_frame`: frames take no weak reference)
        self.thread = threading.get_ident()

    def send(self, key: int, index: int, kind: int) -> None:
        slots = self.sent.get(key)
        if slots is None:
            slots = self.sent[key] = {}
            heapq.heappush(self.queue, (-self.graph[key].seq, key))
        slots[index] = max(slots.get(index, 0), kind)

    def stale(self, frames: dict[int, Any]) -> bool:
        """Whether its backward raised: the frame that entered it left its thread's stack
        (`frames`: `sys._current_frames`). A frame's id is its address, which a later frame
        may take: the one at the entry frame's depth must be it, with its code (an id found
        anywhere on the stack kept such an `_End`, and the hooks it holds, alive: helper-173's
        FINDING 3)."""
        stack = []
        frame = frames.get(self.thread)
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        ident, code, depth = self.entry
        if not 0 <= depth < len(stack):
            return True
        frame = stack[len(stack) - 1 - depth]
        return id(frame) != ident or frame.f_code is not code


class _Node:
    """A node of the graph before a cut (`_capture`): its sequence number, its context if it is
    an identity, its edges (parent `_unique_id`, output index, or None) by slot, whether it
    is a leaf; `parents` None where MindSpore gave none (one is a custom function that ran)."""

    __slots__ = ("seq", "ctx", "parents", "leaf", "tensor_hooks")

    def __init__(self, node: Any, key: int) -> None:
        self.leaf = bool(node.is_leaf())
        self.ctx = node if isinstance(node, _Identity) else None
        self.seq = 0 if self.leaf else int(node._sequence_nr())
        # unihook's tensor hooks on its outputs, by index: held from here (the pass frees
        # the nodes, and MindSpore the hooks with them, before `_emulate` may run them)
        self.tensor_hooks: dict[int, Any] = {}
        registry = at_end.tensor_hooks
        if registry and not self.leaf:
            # its outputs: an identity's shapes, an op's metadata; a custom function has none
            # (unihook's `_Guard` and `_Rebase` have one output; a user's first output only)
            if self.ctx is not None:
                metadata = self.ctx.shapes
            else:
                metadata = getattr(node, "_input_metadata", (None,))
            for index in range(len(metadata)):
                hooks = registry.get((key, self.seq, index))
                if hooks is not None:
                    self.tensor_hooks[index] = hooks
        edges = _edges(node)
        self.parents: list[tuple[int, int] | None] | None = (
            None
            if edges is None
            else [None if p is None else (p._unique_id(), index) for p, index in edges]
        )


def _entry_frame() -> tuple[int, Any, int]:
    """The Python frame below the running pass's identity backward, which entered MindSpore's
    backward (it stays on the stack until the pass is over, or raised): its `id`, its code and
    its depth (frames below it)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not _BACKWARD_CODE:
        frame = frame.f_back
    entry = None if frame is None else frame.f_back
    if entry is None:
        return (0, None, -1)
    depth, below = 0, entry.f_back
    while below is not None:
        depth, below = depth + 1, below.f_back
    return (id(entry), entry.f_code, depth)


_BACKWARD_CODE = _Identity.backward.__code__


class _Ends(dict):  # type: ignore[type-arg]
    """The running passes' `_End`s, by MindSpore's engine id (one per backward pass; a dict:
    its truth is C's, read at every identity's and unihook tensor hooks' backward), and
    unihook's tensor hooks (`_TensorHooks`) by the history they are on: (node `_unique_id`,
    sequence number, output index), which `_emulate` calls where it runs their node."""

    def __init__(self) -> None:
        super().__init__()
        self.tensor_hooks: weakref.WeakValueDictionary[tuple[int, int, int], Any] = (
            weakref.WeakValueDictionary()
        )

    def emulate_after(self, seq: int, tensor_hooks: Any = None) -> None:
        """Before a node of sequence number `seq` runs: the calls a cut left out that torch's
        engine makes before it (`_emulate`). MindSpore's engine runs its nodes in torch's
        order (by sequence number, latest first; measured: tensor hooks on 300 generated
        graphs fire in torch's order), so a node after it that has not run will not: its
        hooks are called now, among the pass's own calls, as torch's (until 2026-12-06 they
        came once the pass was over: a cell called twice got pre, pre, full, full where torch
        gives pre, full, pre, full, helper-170's FINDING 4 and seed 364)."""
        end = self.get(_engine_id())
        if end is not None:
            if end.queue:
                _emulate(end, seq)
            if tensor_hooks is not None:
                end.fired.add(id(tensor_hooks))  # (its node ran: `_emulate` calls them not)

    def with_zeros_sent(self, ctx: Any, grads: Grads) -> Grads:
        """`grads` of the identity `ctx`, running now, with zeros where MindSpore's engine sends
        nothing and torch's zeros: a left-out input identity made them (`_emulate`, which has
        run every left-out node after this one). Its hooks see them, and it sends them on, as
        torch's (until 2026-12-06 a None: helper-170's FINDING 3)."""
        end = self.get(_engine_id())
        got = None if end is None else end.sent.get(ctx._unique_id())
        if not got:
            return grads
        filled = list(grads)
        for i, kind in got.items():
            if kind and filled[i] is None and i not in ctx.dead:
                filled[i] = zeros(*ctx.shapes[i])
        return tuple(filled)


at_end = _Ends()


class _Emulating(threading.local):
    """`_after_backward`'s callbacks while `_emulate` runs hooks (MindSpore left its node out)."""

    calls: list[Callable[[], None]] | None = None


_emulating = _Emulating()


def _end() -> _End:
    """The running backward's `_End`; the first asks for MindSpore's final callback."""
    engine = _pynative_executor.get_current_autodiff_engine_id()
    end = at_end.get(engine)
    if end is None:
        # (a backward that raised: its calls died with its graph; list(): another thread's
        # backward may add its own meanwhile)
        entry = _entry_frame()
        if at_end:
            frames = sys._current_frames()
            for stale, other in list(at_end.items()):
                # (no two running passes have one entry frame)
                if other.entry == entry or other.stale(frames):
                    at_end.pop(stale, None)
        end = at_end[engine] = _End(entry)
        # A module-level function: MindSpore does not hold a queued callback alive, and a
        # backward that raises after it was queued segfaulted at a closure (docs/MINDSPORE.md)
        _pynative_executor.queue_backward_final_callback(_backward_ended)
    return end


def _after_backward(callback: Callable[[], None]) -> None:
    """Run `callback` (a bound method: the call's full hooks, for inputs that need no grad)
    where the running backward leaves out the input side of the call whose output side runs
    now (`_skips_input_side`): at once, as torch fires them at the output side; where the
    pass is not known (`_differentiated`), once the backward is over, if it did not run."""
    calls = _emulating.calls
    if calls is not None:
        calls.append(callback)  # (MindSpore left the node out: `_emulated` decides)
        return
    ctx = getattr(_running, "ctx", None)
    if ctx is None or ctx.input_side is None or not _skips_input_side(ctx.input_side):
        return
    if _pass.differentiated is None:
        _end().calls.append(callback)
    else:
        callback()


class _Pass(threading.local):
    """What `_leads_to` learnt of this thread's running backward pass: its engine id, the
    leaves it differentiates (`_differentiated`), the arguments of the differentiated
    function, and, for each of `_leads_to`'s questions, the edges from which it reaches no
    such leaf (`dead`) or one (`alive`)."""

    engine = -2  # (none: the others are set with it)
    differentiated: set[int] | None
    arguments: set[int]
    memo: dict[bool, tuple[set[tuple[int, int]], set[tuple[int, int]]]]


_pass = _Pass()


def _pass_state() -> _Pass:
    engine = _engine_id()
    if engine != _pass.engine:
        found = _differentiated()
        _pass.engine, _pass.memo = engine, {True: (set(), set()), False: (set(), set())}
        _pass.differentiated, _pass.arguments = found or (None, set())
    return _pass


def _leads_to(edges: Sequence[tuple[Any, int]], state: _Pass, parameters: bool) -> bool:
    """Whether the running pass reaches, from `edges`, a leaf it differentiates, or, with
    `parameters`, one that needs grad in torch's terms (`requires_grad`): that, or a
    Parameter (a leaf that is no argument of the differentiated function: a frozen one has no
    edge). `state.differentiated` known; what was walked is remembered for the pass.

    torch's graph has an edge to an identity's output k only where its input k requires grad
    (the others are marked non-differentiable): `requires_grad` follows an identity's slot k
    alone (the second output of `(d(a), tanh(data))` needs no grad, helper-170's FINDING 1);
    torch's engine runs a node from which it reaches an input `autograd.grad` asks for, by
    node: through any slot of an identity entered by an edge torch has (helper-170's seed
    275, `test_grad_wrt_some_inputs_of_a_hooked_module`)."""
    differentiated, arguments = state.differentiated or set(), state.arguments
    dead, alive = state.memo[parameters]
    came_from: dict[tuple[int, int], tuple[int, int] | None] = {}
    todo: list[tuple[Any, int, tuple[int, int] | None]] = [
        (node, index, None) for node, index in edges if node is not None
    ]
    while todo:
        node, index, child = todo.pop()
        identity = isinstance(node, _Identity)
        item = (node._unique_id(), index if identity and parameters else -1)
        if item in came_from or item in dead:
            continue
        parents = None if node.is_leaf() else _edges(node)
        if identity and not parameters and parents is not None:
            if not _leads_to(parents[index : index + 1], state, parameters=True):
                continue  # (no edge in torch's graph: not walked, not remembered)
        came_from[item] = child
        found = item in alive
        if not found and node.is_leaf():
            found = item[0] in differentiated or (parameters and item[0] not in arguments)
            if not found:
                continue
        if found or parents is None:  # (None: an identity that ran before it: reached)
            on_the_way: tuple[int, int] | None = item
            while on_the_way is not None:
                alive.add(on_the_way)
                on_the_way = came_from[on_the_way]
            return True
        if identity and parameters:
            parents = parents[index : index + 1]
        todo.extend((parent, i, item) for parent, i in parents if parent is not None)
    dead.update(came_from)  # (all of it walked: none reached)
    return False


def _skips_input_side(ref: _InputSide) -> bool:
    """Whether the running pass leaves out the input identity `ref` (not yet run: it is before
    the output side running now): MindSpore runs only the nodes from which it reaches a leaf
    it differentiates. Where the leaves it reaches are all arguments of the differentiated
    function that it does not differentiate, or Parameters that require no grad (they have
    no edge), the inputs are, in torch's terms, tensors that need no grad: data (`grad(fn,
    None, weights)`, the training idiom), or a tensor computed from it only (`model(x /
    255)`, a reshape of it, a frozen layer; until 2026-12-06 the full hooks of such a call
    never fired: docs/MINDSPORE.md §11 item 2 (a)). Where it reaches a Parameter it does not
    differentiate, torch's `autograd.grad` with respect to other tensors: no call. Where it
    reaches one it differentiates, the input side runs, or a None cut it off and `_emulate`
    runs it. Where the input side is gone (the outputs do not read the inputs) or the pass's
    frame is not found, `_undifferentiated_data`."""
    state = _pass_state()
    input_side = ref()
    if state.differentiated is None or input_side is None:
        return _undifferentiated_data(ref, state.differentiated)
    return not _leads_to(_edges(input_side) or (), state, parameters=True)


def _slots_needing_no_grad(ctx: Any, grads: Grads) -> list[int] | None:
    """For an identity running now: None where torch's engine would not run it (no slot
    reaches a leaf the pass differentiates: a cell whose outputs lead to Parameters
    `autograd.grad` does not ask for, or to data only, which MindSpore's pass may run all the
    same); else the slots whose tensor needs no grad in torch's terms, where MindSpore
    computes a gradient all the same: an output's (`tanh(a)` of `(d(a), tanh(a))` on data
    under `grad(fn, None, weights)`), torch's hooks get None (helper-171's FINDINGS 2 and 3;
    helper-170's seed 275); an input's (an argument `grad` does not differentiate beside one
    it does, or a tensor computed from such only), torch's get zeros (docs/MINDSPORE.md §11
    item 3). Unknown pass: none."""
    state = _pass_state()
    edges = _edges(ctx)
    if state.differentiated is None or edges is None:
        return []
    live = [
        k
        for k, grad in enumerate(grads)
        if grad is not None and k not in ctx.dead and k not in ctx.integral
    ]
    if live and not _leads_to([edges[k] for k in live], state, parameters=False):
        return None
    return [k for k in live if not _leads_to((edges[k],), state, parameters=True)]


def _undifferentiated_data(ref: _InputSide, differentiated: set[int] | None) -> bool:
    """Whether the input side `ref` stands for arguments of the differentiated function
    (`_data_only`) none of which the pass differentiates (where `differentiated` is None,
    unknown: whether it runs tells, as `_Call`'s deferred call fires only if it did not)."""
    leaves = ref.leaves
    if leaves is None:
        return False
    return differentiated is None or not any(leaf in differentiated for leaf in leaves)


def _backward_ended() -> None:
    end = at_end.pop(_pynative_executor.get_current_autodiff_engine_id(), None)
    if end is None:
        return
    if end.queue:
        _emulate(end, -1)
    for callback in (*end.later, *end.calls):
        callback()


def _cut(ctx: Any, results: Grads) -> None:
    """The identity `ctx` returned None for some gradients (a hook's None, or none came for an
    output): MindSpore's engine leaves out what is before it that nothing else reaches,
    where torch's passes None on (undefined: no contribution) and calls the hooks there: the
    edges it cut, and the graph before them, wait for `_emulate`."""
    edges = ctx.next_functions
    cut = [
        edges[3 + i]
        for i, result in enumerate(results)
        if result is None and i not in ctx.dead and edges[3 + i][0] is not None
    ]
    if cut:
        end = _end()
        end.entered.update(ctx.boundary)
        _capture(end.graph, [node for node, _ in cut])
        if end.reaching is None:
            end.reaching = _Reaching(end.graph, _pass_state().differentiated)
        for node, index in cut:
            key = node._unique_id()
            if end.reaching.edge(key, index):
                end.send(key, index, 0)


def _capture(graph: dict[int, _Node], nodes: list[Any]) -> None:
    """Add what is before `nodes` to `graph` (nothing there ran yet: a node runs after every
    node after it). Once per node per pass: the cost of a cut is one walk of the graph before
    it (about 3 us per node)."""
    while nodes:
        node = nodes.pop()
        key = node._unique_id()
        if key in graph:
            continue
        graph[key] = _Node(node, key)
        if not graph[key].leaf:
            nodes.extend(parent for parent, _ in _edges(node) or () if parent is not None)


def _emulate(end: _End, after: int) -> None:
    """Call, with torch's arguments, the hooks of the hooked calls MindSpore's engine left out
    of the running pass after identities returned None (`_cut`) whose sequence number is
    above `after` (-1: all, the pass is over; docs/MINDSPORE.md §11 item 4; until 2026-12-06
    none were called: 244 of 600 generated programs lost calls; zeros sent on instead gave
    NaN where they met an infinite derivative, `sqrt` at 0: helper-108). torch's engine runs
    every node it needs: a None goes on undefined through the ops (no contribution, so
    MindSpore's gradients are torch's) and through an output identity (its pre-hooks get
    None), and an input identity makes zeros of it (its full hooks get zeros, and sends
    zeros on). So: the nodes the cut edges reach through no identity that ran, and from
    which the pass reaches a leaf it differentiates (MindSpore runs no other: `_Reaching`),
    in torch's order (by sequence number, latest first: every consumer before its
    producer), each slot None or zeros as that would give. A gradient a hook returns there
    has nowhere to go (MindSpore left the node out): zeros or None pass, anything else is
    `HookReturnError`."""
    graph, queue, reaching = end.graph, end.queue, end.reaching
    if reaching is None:
        return  # (set with the first cut, which queues the first node)
    while queue and -queue[0][0] > after:
        key = heapq.heappop(queue)[1]
        got = end.sent.pop(key)
        node = graph[key]
        if node.leaf or (node.ctx is not None and node.ctx.ran) or not reaching.runs(key):
            continue
        parents = node.parents or ()
        for index, kind in sorted(got.items()):
            hooks = node.tensor_hooks.get(index)
            if hooks is not None and hooks.entries and id(hooks) not in end.fired:
                _emulated_tensor_hooks(hooks, kind)
        if node.ctx is not None:
            kinds: Sequence[int | None] = _emulated(node.ctx, got, end)
            # the edges into a call without an input side (pre-hooks alone, or inputs that
            # need no grad), entered by the call's output side: torch's input identity, which
            # every hooked call has, makes zeros of what reaches it there (helper-170's
            # FINDING 2)
            end.entered.update(node.ctx.boundary)
        else:
            kinds = [max(got.values())] * len(parents)  # (an op: undefined only from undefined)
        for edge, kind in zip(parents, kinds):
            if edge is not None and kind is not None and reaching.edge(*edge):
                end.send(*edge, 1 if edge in end.entered else kind)


def _edges(node: Any) -> Sequence[tuple[Any, int]] | None:
    """A node's edges; an identity's, by slot (after its three non-tensor arguments). None
    where one leads to a custom function that ran (an identity): MindSpore, which freed its
    context, refuses to give any ("Try to get grad node of custom function which ctx has been
    freed!")."""
    try:
        edges = node.next_functions
    except RuntimeError:
        return None
    return edges[3:] if isinstance(node, _Identity) else edges


class _Reaching:
    """Whether the pass reaches a leaf it differentiates from an edge of a captured graph
    (`_capture`): an op's edge, from any of the op's edges; an identity's output k, from its
    slot k's edge only (an identity passes each slot on apart: the second output of
    ``(d(a), tanh(data))`` needs no grad in torch, which has no edge there, helper-170's
    FINDING 1). MindSpore runs a node where one of its edges does (the input side of a call
    whose inputs are data it does not differentiate, the training idiom `grad(fn, None,
    weights)`, never runs: `_Call`'s deferred full hooks)."""

    def __init__(self, graph: dict[int, _Node], differentiated: set[int] | None) -> None:
        self.graph, self.differentiated = graph, differentiated
        self.memo: dict[tuple[int, int], bool] = {}

    def _item(self, key: int, index: int) -> tuple[int, int]:
        node = self.graph.get(key)
        return (key, index) if node is not None and node.ctx is not None else (key, -1)

    def edge(self, key: int, index: int) -> bool:
        """Whether output `index` of node `key` leads to a differentiated leaf."""
        first = self._item(key, index)
        memo, graph = self.memo, self.graph
        stack = [first]
        while stack:
            item = stack[-1]
            if item in memo:
                stack.pop()
                continue
            node = graph.get(item[0])
            if node is None or node.parents is None or node.leaf:
                # (a leaf; or what MindSpore gave no edges of: taken as reaching one)
                leaf = node is not None and node.leaf
                differentiated = self.differentiated
                memo[item] = not leaf or differentiated is None or item[0] in differentiated
                stack.pop()
                continue
            if node.ctx is not None:
                parents = node.parents[item[1] : item[1] + 1] if item[1] >= 0 else []
            else:
                parents = node.parents
            deps = [self._item(*edge) for edge in parents if edge is not None]
            waiting = [dep for dep in deps if dep not in memo]
            if waiting:
                stack.extend(waiting)
                continue
            memo[item] = any(memo[dep] for dep in deps)
            stack.pop()
        return memo[first]

    def runs(self, key: int) -> bool:
        """Whether MindSpore runs node `key`: one of its edges leads to a differentiated leaf."""
        node = self.graph[key]
        if node.ctx is None or node.parents is None:
            return self.edge(key, -1)
        return any(self.edge(key, k) for k in range(len(node.parents)))


# MindSpore 2.10's executor `grad(obj, grad, weights, grad_position, has_aux, *args)`, in
# which every `grad`, `value_and_grad`, `GradOperation` and the kit's tape run their backward
_GRAD_CODE = type(_pynative_executor).grad.__code__


def _differentiated() -> tuple[set[int], set[int]] | None:
    """The `_unique_id`s of the leaves the running pass differentiates, and of its function's
    arguments, read from the frame of the executor's `grad` below (its `GradOperation`'s
    flags, positions, arguments and weights); None where that is not found."""
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_code is not _GRAD_CODE:
        frame = frame.f_back
    if frame is None:
        return None
    local = frame.f_locals
    try:
        op, args, weights = local["grad"], local["args"], local["weights"]
        if getattr(op, "get_by_position", False):
            position = local["grad_position"]
            chosen = [args[i] for i in ((position,) if isinstance(position, int) else position)]
        elif op.get_all:
            chosen = list(args[:-1] if op.sens_param else args)
        else:
            chosen = [] if op.get_by_list else list(args[:1])
        if weights is not None:
            chosen.extend(weights if isinstance(weights, (list, tuple)) else [weights])
    except (KeyError, AttributeError, IndexError, TypeError):
        return None
    return _leaf_ids(chosen), _leaf_ids(args)


def _edges_of(tensors: Sequence[Any]) -> list[tuple[int, int]]:
    """The edges that reach `tensors` in a backward: their nodes' `_unique_id`s and indexes."""
    edges = []
    for tensor in tensors:
        node = tensor._grad_node
        if node is not None:
            edges.append((node._unique_id(), tensor._output_index))
    return edges


def _leaf_ids(tensors: Any) -> set[int]:
    ids = set()
    for tensor in tensors:
        node = getattr(tensor, "_grad_node", None)
        if node is not None:
            ids.add(node._unique_id())
    return ids


def _emulated(ctx: Any, got: dict[int, int], end: _End) -> list[int | None]:
    """Run the identity `ctx`'s hooks as torch's engine would for what reached it (`_emulate`):
    what it sends on per slot (None: nothing, its input needs no grad)."""
    grads = [
        zeros(*shape_dtype) if ctx.materialize or got.get(i) == 1 else None
        for i, shape_dtype in enumerate(ctx.shapes)
    ]
    ctx.ran = True
    calls: list[Callable[[], None]] = []
    _emulating.calls = calls
    try:
        results = _identity_backward(ctx, grads)
    finally:
        _emulating.calls = None
    if calls:
        # the call's full hooks for inputs that need no grad: torch fires them at its output
        # side, where the pass reaches no differentiated leaf from its input side (MindSpore
        # runs it not: `_skips_input_side`); where it does, they wait for the input side's
        # turn (then nothing is left for them to do); where the cut does not reach it (the
        # outputs do not depend on the inputs), the arguments of the differentiated function
        ref = ctx.input_side
        input_side = None if ref is None else ref()
        graph, reaching = end.graph, end.reaching
        keys = [k for k, n in graph.items() if n.ctx is input_side] if input_side else []
        if keys and reaching is not None and reaching.runs(keys[0]):
            end.later.extend(calls)
        elif keys or (ref is not None and _undifferentiated_data(ref, _pass.differentiated)):
            for call in calls:
                call()
    kinds: list[int | None] = []
    for i, result in enumerate(results):
        if i in ctx.dead:
            kinds.append(None)
        elif result is None:
            kinds.append(0)
        elif result is grads[i] or not _nonzero(result):
            kinds.append(1)
        else:
            raise _nowhere(ctx.site, "call", f"a gradient with nonzero values at position {i}")
    return kinds


def _emulated_tensor_hooks(hooks: Any, kind: int) -> None:
    """Run unihook's tensor hooks of an output of a node `_emulate` runs, as torch's
    engine would: with None (undefined) or zeros (`kind`); MindSpore's engine, which left the
    node out, never calls them (until 2026-12-06 none were called: torch calls a tensor's
    hooks with None inside a cell whose pre-hook returned None, and with zeros before it)."""
    result = hooks.run(zeros(*hooks.like) if kind else None)
    if result is not None and _nonzero(result):
        raise _nowhere(hooks.site, "tensor's node", "a gradient with nonzero values")


def _nowhere(site: Site, what: str, received: str) -> HookReturnError:
    return site.error(
        HookReturnError,
        f"None or zeros for this {what}: MindSpore's engine left it out of the backward after "
        "another hook returned None for the gradients reaching it, and unihook calls its "
        "hooks where torch's engine would, but a gradient has nowhere to go "
        "(docs/MINDSPORE.md, section 11 item 4)",
        received,
    )


# The input side's aliases (`MindSporeAutograd.identity`), by id: [a weak reference, the
# leaves it stands for where they are data (`_data_only`), else None, a handle on its counter
# (`_Identity.forward`), then weak references to the `_Watched` of inner hooked calls that got
# it as it was, and lists of the counters of those that got a view of it, until the call's
# post-dispatch takes them]
_aliases: dict[int, list[Any]] = {}


# This thread's calls in flight with an input side (made, post-dispatch not yet), by their
# aliases: [`_aliases` key, a weak reference to the alias, its memory key once read]. An inner
# hooked call that gets a view of one (`self.conv(x.reshape(...))`) finds it by memory
# (`_watch_inputs`). A call that raised leaves its items (weak: they hold no memory) until the
# thread's next call with an input side.
_in_flight = threading.local()


def _open_items() -> list[list[Any]]:
    try:
        return _in_flight.items  # type: ignore[no-any-return]
    except AttributeError:
        _in_flight.items = []
        return _in_flight.items  # type: ignore[no-any-return]


def _outer_of_view(original: Any) -> list[Any] | None:
    """The `_aliases` entry of an outer call in flight on this thread whose input side's
    alias shares memory with `original` (a view of it), if any: innermost first."""
    items = _open_items()
    if not items:
        return None
    key = _memory_key(original)
    if key is None:
        return None
    for item in reversed(items):
        alias = item[1]()
        entry = _aliases.get(item[0])
        if alias is None or entry is None or entry[0]() is not alias:
            continue
        if item[2] is None:
            item[2] = _memory_key(alias) or 0
        if item[2] == key:
            return entry
    return None


def _forget_alias(key: int, ref: weakref.ref[Any]) -> None:
    entry = _aliases.get(key)
    if entry is not None and entry[0] is ref:
        del _aliases[key]


def _data_leaves(tensor: Any) -> tuple[int, ...] | None:
    """The leaves an input side's alias of data stands for (`_data_only`), else None."""
    entry = _aliases.get(id(tensor))
    return entry[1] if entry is not None and entry[0]() is tensor else None


def _data_only(tensors: Sequence[Any]) -> tuple[int, ...] | None:
    """Where `tensors` are data, the differentiated function's arguments (leaves that are no
    Parameter) or an identity's aliases of them, the `_unique_id`s of those leaves; else
    None."""
    leaves: list[int] = []
    for tensor in tensors:
        if isinstance(tensor, mindspore.Parameter):
            return None
        node = tensor._grad_node
        if node is None:
            continue
        if node.is_leaf():
            leaves.append(node._unique_id())
            continue
        of_data = _data_leaves(tensor)
        if of_data is None:
            return None
        leaves.extend(of_data)
    return tuple(leaves)


class _InputSide(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an input identity's context (`Autograd.identity`'s node), with the
    leaves its inputs stand for where they are data (`_data_only`): a call whose outputs do
    not read its inputs lets that context go at once."""

    __slots__ = ("leaves",)
    leaves: tuple[int, ...] | None


class MindSporeAutograd(Autograd):
    backend = NAME
    own_modules = "mindspore.nn."  # (see Autograd: their forward reads no user tensor)
    # a cell's dispatchers stay until its calls in flight are over (unihook._module_backward)
    call_codes = CALL_CODES
    is_tensor = staticmethod(_is_tensor)

    @staticmethod
    def grad_enabled() -> bool:
        # outside a grad session nothing is recorded: no backward can reach a hook
        return bool(_pynative_executor.enable_grad() and _pynative_executor.requires_grad())

    @staticmethod
    def requires_grad(tensor: Any) -> bool:
        return bool(tensor._requires_grad)

    @staticmethod
    def identity(
        tensors: Sequence[Any],
        on_backward: Callable[[Grads], Grads],
        materialize: bool,
        site: Site,
        held_until: object = None,  # the input side's `node`: a weak reference to its context
    ) -> Sequence[Any]:
        _made.ctx = None
        made = _Identity.apply(on_backward, materialize, site, *tensors)
        outs = _Aliases(made if isinstance(made, (tuple, list)) else (made,))
        outs.ctx, _made.ctx = _made.ctx, None
        if not materialize:
            outs.ctx.input_side = held_until  # (`_abandon`)
        if materialize:
            # the input side's aliases of data are data: the first cell inside a hooked
            # container (or under global hooks) gets them; and an inner hooked call that gets
            # one as it is moves with it (`_watch_inputs`)
            data = _data_only(tensors)
            node = outs.node = _InputSide(outs.ctx)
            node.leaves = data
            counters, _made.counters = _made.counters, ()
            items = _open_items()
            if items:
                items[:] = [item for item in items if item[1]() is not None]
            for out, counter in zip(outs, counters):
                key = id(out)
                ref = _OwnRef(out, partial(_forget_alias, key))
                _aliases[key] = [ref, data, counter]
                items.append([key, ref, None])
        return outs

    # MindSpore records every argument of a differentiated function as requiring grad, and its
    # backward leaves out the input side of a call from which it reaches nothing it
    # differentiates (`grad(fn, None, weights)`, the training idiom): the full hooks fire at
    # its end, as torch's for inputs that need no grad (`_skips_input_side`)
    after_backward = staticmethod(_after_backward)

    @staticmethod
    def data_only(aliases: Sequence[Any]) -> bool:
        # any call: its backward tells (`_after_backward`); `identity` marked the input side's
        # aliases of data, what it falls back on
        return True

    @staticmethod
    def watch(
        replaced: list[Any],
        aliases: Sequence[Any],
        outputs: Sequence[Any],
        idx: Sequence[int],
        args: Sequence[Any],
        tensor_idx: Sequence[int],
        originals: Sequence[Any],
        site: Site,
        mark: object,
        module: Any,  # (torch's looks for tensors it keeps; these are MindSpore's to check)
        result: Any,
    ) -> None:
        # The output identity lets go of the counters of outputs the caller may hold apart from
        # the call (an argument returned, its alias, a view of it, a leaf): a history through
        # this node reaching them (`h.add_(m(h))`, a rebase) would close a cycle. (Nothing
        # replaced: the in-place ops on them are MindSpore's to check, as before.)
        items = _open_items()
        if items:
            for arg in [args[i] for i in tensor_idx if args[i] is not None]:
                for n in range(len(items) - 1, -1, -1):
                    if items[n][1]() is arg:
                        del items[n]
                        break
        ctx = getattr(aliases, "ctx", None)
        if ctx is not None and ctx.input_side is None:
            ctx.boundary = _edges_of([args[i] for i in tensor_idx])
        if ctx is None or not ctx.inputs:
            return
        given = [t for t in [args[i] for i in tensor_idx] + list(originals) if t is not None]
        keys = {_memory_key(t) for t in given} - {None}
        # the arguments whose caller's tensor is, without hooks, an output the caller got an
        # alias of (returned as it was, or a view of it): an in-place op on it after the call
        # changes that output and its history too (`_watch_inputs`)
        returned: dict[int, tuple[int, str]] = {}
        reaches: list[tuple[int, Any, int]] = []  # (`_on_reach`)
        for k, j in enumerate(idx):
            output = outputs[j]
            node = output._grad_node
            computed = node is not None and not node.is_leaf()
            if any(output is t for t in given):
                for kk, i in enumerate(tensor_idx):
                    if (output is args[i] or output is originals[kk]) and replaced[j] is not (
                        originals[kk]
                    ):
                        returned[kk] = (k, f"output {k} is that argument, returned as it was")
                ctx.inputs[k] = None
                # (with full hooks the cell got, and returns, the input side's alias)
                made = output
                for i, original in zip(tensor_idx, originals):
                    if output is args[i] and original is not None:
                        made = original
                producer, index = _producer_node(made)
                if producer is not None and producer.name() in _SAVES_OUTPUT:
                    # Without hooks an in-place op on it changes the values its producer saved:
                    # MindSpore raises. The caller's tensor's counter cannot be moved without
                    # holding that tensor (the cycle above): refused instead.
                    _flag(
                        ctx,
                        k,
                        "the output is an argument of the call returned unchanged, made by an "
                        f"op whose backward reads it ({producer.name()}): without hooks the "
                        "change reaches what that op saved",
                    )
                    # ... also where the backward reaches the caller's tensor (which misses
                    # the op) and not the alias (`_reached`)
                    reaches.append((k, producer, index))
            elif not computed:
                ctx.inputs[k] = None
            elif _memory_key(output) in keys:
                # a view of an argument: without hooks an in-place op on it changes the
                # argument, its history too (`_carry_versions` refuses that)
                ctx.inputs[k] = None
                _flag(
                    ctx, k, "the output is a view of an argument of the call (it shares its memory)"
                )
                key = _memory_key(output)
                for kk, i in enumerate(tensor_idx):
                    # (not the argument itself, changed in place by forward, which the caller
                    # gets back as its own tensor with the cell's history: `copy_` returns
                    # another Python object for it, `same_tensor`)
                    if _memory_key(args[i]) == key and replaced[j] is not originals[kk]:
                        returned[kk] = (k, f"output {k} is a view of that argument")
            else:
                # a computed output: where the backward reaches it by another way than the
                # alias (a kept output), `_carry_versions`'s refusal runs there too
                reaches.append((k, node, output._output_index))
        if tensor_idx:
            _watch_inputs(ctx, args, tensor_idx, originals, returned)
        if len(idx) > 1:
            # an output returned twice, or sharing memory with another: without hooks an
            # in-place op on one changes the other, its history too
            seen: dict[int, int] = {}
            for k, j in enumerate(idx):
                key = _memory_key(outputs[j])
                if key is None:
                    key = id(outputs[j])
                if key in seen:
                    why = "another output of the call is the same tensor, or shares its memory"
                    _flag(ctx, k, why)
                    _flag(ctx, seen[key], why)
                else:
                    seen[key] = k
        if reaches:
            _on_reach(ctx, reaches)

    @staticmethod
    def watch_inputs(
        args: Sequence[Any],
        tensor_idx: Sequence[int],
        originals: Sequence[Any],
        module: Any,
        site: Site,
        *,
        replaced: bool = False,
        returned: Collection[int] = (),
    ) -> None:
        # (`replaced` is torch's: MindSpore has no backward hooks that replace the args)
        for alias, original in kept_inputs(
            args, tensor_idx, originals, returned, module, MindSporeAutograd, own_weakrefs=_OwnRef
        ):
            check_kept_input(
                alias,
                original,
                site,
                identity=MindSporeAutograd.identity,
                rebase=_quiet_rebase,
                node_of=_node_id,
                version=MindSporeAutograd.version,
                # (none: a tensor sharing the counter, `Tensor(x)`, shares x's autograd data,
                # whose history could reach the check: a cycle through C++)
                counter_of=None,
                # (a view's rebase would cut its base's gradient, `_changed_view`: its later
                # uses are not checked, docs/MINDSPORE.md section 11 (h))
                caller_side=MindSporeAutograd.leaf_of(original) is None
                and _view_of_leaf(original) is None,
            )

    @staticmethod
    def version(tensor: Any) -> int:
        _pynative_executor.sync()  # the counter moves in the async pipeline (module docstring)
        return int(tensor._version)

    @staticmethod
    def fresh_version(alias: Any) -> int:
        # an identity's output just made: no in-place op on it can be in the pipeline yet
        return int(alias._version)

    @staticmethod
    def rebase(original: Any, alias: Any, site: Site) -> Any:
        # (no shape to carry over, unlike torch's: MindSpore 2.10 has no in-place shape change,
        # no squeeze_ / unsqueeze_ / t_)
        view_of_leaf = _view_of_leaf(original)
        if view_of_leaf is not None:
            raise _changed_view(site, view_of_leaf)
        _Rebase.apply(original, alias)
        # MindSpore raises its leaf error in the async pipeline: here, as without hooks
        _pynative_executor.sync()
        return original

    @staticmethod
    def same_tensor(a: Any, b: Any) -> bool:
        # `copy_` returns another Python object for the tensor it changed: same memory, same
        # node once the pipeline ran (an identity's alias shares the memory, not the node)
        if a is b:
            return True
        if a is None or b is None:  # (an argument the caller no longer holds)
            return False
        if a.shape != b.shape or a.dtype != b.dtype or _memory_key(a) != _memory_key(b):
            return False
        _pynative_executor.sync()
        node, other = a._grad_node, b._grad_node
        return node is not None and other is not None and node._unique_id() == other._unique_id()

    @staticmethod
    def guard(tensor: Any, error: Callable[[], Exception], site: Site) -> Any:
        # MindSpore's own RuntimeError at the in-place op, where it raises without hooks
        return _Guard.apply(tensor)

    memory_key = staticmethod(_memory_key)

    @staticmethod
    def leaf_of(tensor: Any) -> Any:
        if isinstance(tensor, mindspore.Parameter):
            return tensor
        node = tensor._grad_node
        return tensor if node is not None and node.is_leaf() else None

    @staticmethod
    def refused_like(output: Any, leaf: Any) -> bool:
        key = _memory_key(output)
        return key is not None and key == _memory_key(leaf)

    @staticmethod
    def add_dispatchers(cell: Any, pre: Any, post: Any) -> Dispatchers:
        return add_dispatchers(cell, pre, post)


_AUTOGRAD = MindSporeAutograd()


def register(
    cell: Any, kind: str, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle:
    return register_backward_hook(_AUTOGRAD, cell, kind, hook, prepend, name)


class _GlobalDispatchers:
    """The global backward dispatchers: the last forward hooks of every cell (``_global``)."""

    __slots__ = ("_remove",)

    def __init__(self, state: ModuleBackward) -> None:
        from ._global import add_backward_dispatchers

        self._remove = add_backward_dispatchers(state.pre_dispatch, state.post_dispatch)

    @staticmethod
    def pin(cell: Any) -> None:
        """A removed global state's pre-dispatcher passes a call on to this (newer) state:
        its post-dispatcher must be in the cell's forward hooks, read after construct."""
        from ._global import _ensure

        _ensure(cell)

    def remove(self) -> None:
        self._remove()


def add_global(kind: str, hook: Callable[..., Any]) -> Callable[[], None]:
    return add_global_backward_hook(_AUTOGRAD, kind, hook, _GlobalDispatchers)
