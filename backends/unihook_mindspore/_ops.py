"""``unihook.ops`` for MindSpore."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import weakref
from typing import Any, Callable, Iterator, Sequence, Union

import mindspore
import numpy as np
from mindspore import nn, ops
from mindspore.graph.api import _pynative_executor
from mindspore.nn.layer.normalization import _BatchNorm

from unihook.backend import history_reaches, map_dataclass
from unihook.errors import BackendStateError
from unihook.ops import (
    Moments,
    Ops,
    cpu_moments,
    cpu_sum_squares,
    drop_block_rate,
    slot_values,
)

from ._serial import exclusive

# (MindSpore's annotations say these may return None or a tuple: they return a tensor here)
_detached: Callable[[Any], Any] = ops.stop_gradient

Axis = Union[None, int, Sequence[int]]
Tensor = mindspore.Tensor


def _grad_nodes(tensors: Sequence[Any]) -> Iterator[Any]:
    for t in tensors:
        node = getattr(t, "_grad_node", None)
        if node is not None:
            yield node


def _edges(node: Any) -> Iterator[tuple[int, None, Any]]:
    for before, _ in node.next_functions:
        if before is not None:
            yield before._unique_id(), None, before


def _sequence_nr(node: Any) -> int:
    return node._sequence_nr()


def _axes(axis: Axis) -> Any:
    return tuple(axis) if isinstance(axis, Sequence) else axis


def _is_tensor(obj: object) -> bool:
    return isinstance(obj, Tensor)


class MindSporeOps(Ops):
    is_tensor = staticmethod(_is_tensor)

    def to_numpy(self, t: Any) -> Any:
        return np.array(_detached(t).asnumpy())

    def detach(self, t: Any) -> Any:
        return _detached(t)

    def clone(self, t: Any) -> Any:
        return _detached(t).copy()

    def zeros_like(self, t: Any) -> Any:
        return ops.zeros_like(t)

    def sum(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return t.sum(axis=_axes(axis), keepdims=keepdim)

    def mean(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return t.mean(axis=_axes(axis), keep_dims=keepdim)

    def std(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return ops.std(t, axis=_axes(axis) or (), ddof=0, keepdims=keepdim)

    def max(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return ops.amax(t, axis=_axes(axis) if axis is not None else (), keepdims=keepdim)

    def min(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return ops.amin(t, axis=_axes(axis) if axis is not None else (), keepdims=keepdim)

    def norm(self, t: Any, p: float) -> Any:
        return ops.norm(t.reshape(-1), ord=p)

    def sum_squares(self, t: Any) -> float:
        # (on the host, as torch's and paddle's CPU tensors: the same numbers; a complex
        # gradient counts |z|^2, its real and imaginary parts)
        return cpu_sum_squares(self.to_numpy(t))

    def is_floating(self, t: Any) -> bool:
        return bool(t.is_floating_point() or t.is_complex())

    def moments(self, t: Any) -> Moments:
        # (on the host: MindSpore's CPU reductions in float64 cost more than the copy; a
        # complex output counts its real and imaginary parts as values, as on torch and paddle)
        return cpu_moments(self.to_numpy(t))

    def abs(self, t: Any) -> Any:
        return t.abs()

    def clamp(self, t: Any, min: float | None, max: float | None) -> Any:  # noqa: A002
        return ops.clamp(t, min=min, max=max)

    def all_finite(self, t: Any) -> bool:
        return bool(ops.isfinite(t).all())

    def dropout(self, t: Any, p: float, training: bool) -> Any:
        # mint's dropout raises "The kernel DropoutExt unregistered" on CPU
        return ops.dropout(t, p=p, training=training)

    def drop_block(self, t: Any, p: float, block_size: int, training: bool) -> Any:
        if not training or p <= 0:
            return t
        n, c, h, w = t.shape
        size = min(block_size, h, w)
        gamma = drop_block_rate(h, w, size, p)
        # the mask and its count in float32 at least: a float16 count over 65,504 was inf, the
        # scale 0 and the output zeros; bfloat16 rounded it (helper-125's FINDING 1)
        work = t.dtype if t.dtype in (mindspore.float32, mindspore.float64) else mindspore.float32
        seeds = (ops.rand((n, c, h - size + 1, w - size + 1)) < gamma).astype(work)
        if size == h == w:  # one seed per map, whose block is the map (a clamped block)
            blocks = ops.broadcast_to(seeds, (n, c, h, w))
        else:
            padded = ops.pad(seeds, [size - 1] * 4)
            pool: Callable[..., Any] = ops.max_pool2d  # (mint's has no CPU kernel either)
            blocks = pool(pool(padded, (size, 1), stride=1), (1, size), stride=1)
        keep = 1 - blocks
        return t * (keep * (keep.size / ops.clamp(keep.sum(), min=1))).astype(t.dtype)

    def children(self, module: Any) -> list[Any]:
        # (MindSpore files a cell under `_cells`: one dict read, where the walk costs a
        # call per module)
        return [m for m in module._cells.values() if m is not None]

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.cells_and_names())

    def after_backward(self, t: Any, fn: Callable[[], None]) -> None:
        from ._backward import MindSporeAutograd

        # (the backend's end-of-pass callbacks hold a bound method weakly: what a backward
        # that raised never ran goes with its owner, a recipe's step; another callable is
        # held until it ran)
        callback = fn if inspect.ismethod(fn) and _weakly_held(fn.__self__) else _Once(fn).run
        MindSporeAutograd.after_backward(callback)

    def grad_enabled(self, like: Any) -> bool:
        # outside a grad session (`mindspore.grad`, `value_and_grad`, the kit's tape) and
        # under `_no_grad` nothing is recorded: an evaluation (`every=N` leaves it uncounted)
        return bool(_pynative_executor.enable_grad() and _pynative_executor.requires_grad())

    def forward_hook_dicts(self, module: Any) -> tuple[Any, Any]:
        # (the attributes behind Cell's lazy properties: reading those would create the dicts)
        state = vars(module)
        return state.get("_lazy_forward_pre_hook"), state.get("_lazy_forward_hook")

    def is_leaf(self, t: Any) -> bool:
        # a Parameter (a cell returning its own, a positional table): a gradient hook on it
        # fires in every later backward (a grad session's inputs are new tensors each time)
        return isinstance(t, mindspore.Parameter)

    def own_parameters(self, module: Any) -> list[tuple[Any, int, bool]]:
        # a BatchNorm's moving statistics are Parameters that need no grad: buffers in torch
        stats = isinstance(module, _BatchNorm)
        return [
            (p, int(p.size), bool(p.requires_grad))
            for name, p in module.parameters_and_names(expand=False)
            if not (stats and name in ("moving_mean", "moving_variance"))
        ]

    def attribute_values(self, module: Any) -> list[Any]:
        # a tensor attribute stays in `__dict__`; the rest of what every Cell has (60 tables
        # and flags) holds hooks, cells, Parameters and compile state
        skip = _bookkeeping()
        # (the items in one C call: another thread's new attribute during a walk of the
        # dict raised out of the forward, helper-101's FINDING 3)
        # (and its `__slots__` attributes': helper-95's FINDING 10)
        return [v for k, v in list(module.__dict__.items()) if k not in skip] + slot_values(module)

    def as_tensor(self, array: Any, like: Any) -> Any:
        return Tensor(np.asarray(array), dtype=like.dtype)

    def leaf(self, t: Any) -> Any:
        # MindSpore tracks gradients of Parameters (and of a grad session's inputs) only
        return mindspore.Parameter(_detached(t).copy(), requires_grad=True)

    def backward(self, t: Any) -> None:
        # no Tensor.backward: autograd is functional (docs/MINDSPORE.md §5). The tape's open
        # recording session stands in (the conformance kit opens it; `_tape.start()`)
        from . import _tape

        if _tape._session is None:
            raise BackendStateError(
                "unihook.ops.backward [backend mindspore]: expected a forward recorded for an "
                "imperative backward (MindSpore has none: only the conformance kit records "
                "one). Received: a tensor of an unrecorded forward. Run the forward and its "
                "backward through unihook.ops.forward_backward (the recipes do) or "
                "mindspore.grad, under which the hooks fire"
            )
        _tape.backward(t)

    def forward_backward(
        self, fn: Callable[[Any], Any], x: Any, input_grad: bool, caller: str
    ) -> Any:
        with self.recording():  # (called under `_no_grad`: an evaluation loop's)
            return self._forward_backward(fn, x, input_grad, caller)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        before = _pynative_executor.enable_grad()
        _pynative_executor.set_enable_grad(True)
        try:
            yield
        finally:
            _pynative_executor.set_enable_grad(before)

    def _forward_backward(
        self, fn: Callable[[Any], Any], x: Any, input_grad: bool, caller: str
    ) -> Any:
        from . import _tape

        if mindspore.get_context("mode") != mindspore.PYNATIVE_MODE:
            raise BackendStateError(
                f"{caller} [backend mindspore]: expected PyNative mode (mindspore.set_context("
                "mode=mindspore.PYNATIVE_MODE)), where MindSpore runs Python hooks. Received: "
                "GRAPH_MODE, which compiles the model and skips every Python hook"
            )
        if _tape._session is not None:
            # the conformance kit's tape records every forward: its imperative backward
            if input_grad or isinstance(x, mindspore.Parameter):
                # (a `leaf`: a Parameter of ours, given a `.grad`; GradCAM passes one without
                # asking for its gradient, for the layers no parameter precedes)
                _tape.track(x)
            self.backward(fn(x))
            return self.grad_of(x) if input_grad else None
        # mindspore.grad with respect to the input (grad_position 0; GuidedBackprop's map), not
        # the Parameters: the backward passes every layer between the score and the input
        # wherever Parameters are, gives none a gradient (no `.grad` left on the user's) and
        # runs none of their tensor hooks (asked for a Parameter its graph does not reach,
        # MindSpore runs that one's with zeros: docs/MINDSPORE.md §7)
        with exclusive:  # (PyNative records on one thread at a time: docs/MINDSPORE.md §10)
            flag = _pynative_executor.grad_flag()
            top = not _pynative_executor.requires_grad()
            try:
                gradient = mindspore.grad(fn, grad_position=0)(x)
            except BaseException:
                if top and _pynative_executor.requires_grad():
                    # Python code raising in `fn` leaves MindSpore recording (an op's error
                    # ends it): ended as MindSpore would. Inside a caller's own grad (not
                    # `top`) MindSpore's behaviour stands: its grad then fails, as without us
                    _pynative_executor.end_graph(fn, Tensor(np.float32(0)), x)
                    _pynative_executor.set_grad_flag(flag)
                raise
        return gradient if input_grad else None

    def grad_of(self, t: Any) -> Any:
        return t.grad if hasattr(t, "grad") else None

    def copy_into(self, buffer: Any, t: Any) -> Any:
        if buffer is None or buffer.shape != t.shape or buffer.dtype != t.dtype:
            return _detached(t).copy()
        buffer.copy_(_detached(t))  # returns a new Tensor object, not `buffer`
        return buffer

    def object_version(self, t: Any) -> int | None:
        # None: the recipes never take a tensor they saw for unchanged (a container returning
        # its child's output is reduced again). MindSpore 2.10's `Tensor._version` moves for
        # `copy_` only: `t[i] = v` and `ops.assign(t, v)` change `t` in place and leave it as it
        # was, and a container that did so after its child ran got the child's numbers
        return None

    def derived_from(
        self,
        held: Sequence[Any],
        tensors: Sequence[Any],
        arguments: Sequence[Any],
        since: object = None,
    ) -> bool | None:
        # as `derived`, from the kept tensors (a kept tensor of an output's node is told as
        # made from it; one made before every output is not walked)
        outputs = {id(t) for t in tensors}
        # (by type, as torch's)
        kept = [t for t in held if issubclass(type(t), Tensor) and id(t) not in outputs]
        if not kept:
            return False
        _pynative_executor.sync()
        sources = [(node._unique_id(), None, node) for node in _grad_nodes(kept)]
        targets = [(node._unique_id(), None, node) for node in _grad_nodes(tensors)]
        if not sources or not targets:
            return False
        if not any(node.is_leaf() for _, _, node in targets):
            floor = min(node._sequence_nr() for _, _, node in targets)
            return history_reaches(targets, _edges, _sequence_nr, floor, sources=sources)
        stops = frozenset(node._unique_id() for node in _grad_nodes(arguments))
        return history_reaches(targets, _edges, _sequence_nr, None, stops, sources)

    def derived(self, tensors: Sequence[Any], arguments: Sequence[Any]) -> bool | None:
        # grad nodes by `_unique_id()`, read once the pipeline ran the ops issued so far
        # (as `change_mark`), down to the earliest output's sequence number (as torch's) or,
        # with a leaf among the outputs (its node's number is the largest), to the
        # arguments' nodes. Which output of a node a tensor is goes untold: a node two
        # outputs come from is one target.
        _pynative_executor.sync()
        outputs = [(node._unique_id(), None, node) for node in _grad_nodes(tensors)]
        if len(outputs) < 2:
            return False
        if not any(node.is_leaf() for _, _, node in outputs):
            floor = min(node._sequence_nr() for _, _, node in outputs)
            return history_reaches(outputs, _edges, _sequence_nr, floor)
        stops = frozenset(node._unique_id() for node in _grad_nodes(arguments))
        return history_reaches(outputs, _edges, _sequence_nr, None, stops)

    def change_mark(self, t: Any, settled: bool) -> object:
        # Every in-place op, `t[i] = v` too, gives the tensor a new grad node (InplaceCopy,
        # TensorScatterUpdate) whose input edge holds the old one: the id moves, and the old id
        # is not reused while the tensor lives. The node is set in MindSpore's pipeline: an
        # unsettled read may show the one from before a `copy_` issued earlier (measured).
        # None (nothing told) for a tensor outside a recording, which no gradient reaches.
        if settled:
            from mindspore.graph.api import _pynative_executor

            _pynative_executor.sync()
        node = getattr(t, "_grad_node", None)
        return None if node is None else node._unique_id()

    def call_frame(self, frame: Any) -> Any:
        # A Cell runs its forward hooks from helpers that return before (pre) or after the
        # forward (`_run_forward_pre_hook`, `_run_forward_hook`, behind `jit_forbidden`): the
        # call runs as long as `_run_construct_inner`, their caller. (Taken for the call, the
        # pre-hook's helper had ended at once: GradientMonitor recorded nothing, `every`
        # counted no forward as running; 2026-12-02.)
        while frame is not None and frame.f_code.co_name in _HOOK_RUNNERS:
            frame = frame.f_back
        return frame

    def in_backward(self, like: Any) -> bool:
        # the autodiff engine this thread runs, -1 outside one: a cell recomputed in the
        # backward (`Cell.recompute()`, reentrant or not) runs inside it, as torch's checkpoint
        return bool(_pynative_executor.get_current_autodiff_engine_id() != -1)

    def version(self, t: Any) -> int | None:
        # None: capture copies every value. Tensor._version counts the in-place ops autograd
        # records (copy_) and views share it, but the alias a module backward hook's identity
        # hands the caller has a counter of its own (docs/MINDSPORE.md §10): an in-place op
        # on that alias would leave a captured value's version as it was, stale unseen.
        return None

    def map_tensors(self, fn: Callable[[Any], Any], value: Any) -> Any:
        if isinstance(value, Tensor):
            return fn(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return map_dataclass(value, lambda v: self.map_tensors(fn, v))
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*[self.map_tensors(fn, v) for v in value])
        if isinstance(value, (tuple, list)):
            return type(value)(self.map_tensors(fn, v) for v in value)
        if isinstance(value, dict):
            return type(value)((k, self.map_tensors(fn, v)) for k, v in value.items())
        return value


def _weakly_held(obj: object) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


class _Once:
    """A function run once at the end of a backward pass, alive until then."""

    __slots__ = ("fn",)
    _waiting: set[_Once] = set()

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        _Once._waiting.add(self)

    def run(self) -> None:
        _Once._waiting.discard(self)
        self.fn()


@functools.cache
def _bookkeeping() -> frozenset[str]:
    """The attributes every Cell has that hold no tensor of the user's (`attribute_values`)."""
    return frozenset(nn.Cell().__dict__) - {"_buffers"}


# the helpers a Cell's call runs its forward hooks from (mindspore 2.10), see `call_frame`
_HOOK_RUNNERS = frozenset({"_run_forward_pre_hook", "_run_forward_hook", "jit_forbidden"})
