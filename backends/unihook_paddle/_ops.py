"""``unihook.ops`` for paddle."""

from __future__ import annotations

import contextlib
import copy as _copy
import dataclasses
import functools
import inspect
import sys
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.autograd.py_layer import PyLayerBackward
from paddle.nn.layer.norm import _BatchNormBase
from paddle.utils.layers_utils import map_structure

from unihook.backend import history_reaches, map_dataclass
from unihook.errors import HookTargetError
from unihook.ops import (
    Moments,
    Ops,
    cpu_moments,
    cpu_sum_squares,
    drop_block_rate,
    slot_values,
)

from . import _autograd_guard as guard

Axis = Union[None, int, Sequence[int]]


def _axes(axis: Axis) -> Any:
    return list(axis) if isinstance(axis, Sequence) else axis


_tracer = paddle.base.framework._dygraph_tracer
_OWN_TRACER = _tracer()  # paddle's, outside any `dygraph.guard()` (the backend loads outside)


def _in_a_py_layer_backward() -> bool:
    """Whether a PyLayer's backward (a reentrant `recompute`'s) is on this thread's stack:
    paddle runs a backward on the thread that asked for it."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "backward" and isinstance(
            frame.f_locals.get("ctx"), PyLayerBackward
        ):
            return True
        frame = frame.f_back
    return False


# paddle's Python entry points to a backward (Tensor.backward, paddle.autograd.backward,
# paddle.grad; the functions under paddle's decorators), by their code objects' ids (they live
# as long as paddle's modules): a frame of one is on the stack of a thread running a backward
# (paddle runs it on the thread that asked)
_ENTRIES = frozenset(
    id(inspect.unwrap(entry).__code__)
    for entry in (paddle.Tensor.backward, paddle.autograd.backward, paddle.grad)
)


def _running_backward(frame: Any) -> bool:
    while frame is not None:
        if id(frame.f_code) in _ENTRIES:
            return True
        frame = frame.f_back
    return False


def _backward_on_this_thread() -> bool:
    """Whether paddle's backward flag, set, is this thread's: the flag is one for the process
    (another thread's backward sets it for a forward running here: until 2026-12-07 the
    recipes took such a forward for a recomputation, and GradientMonitor lost it). This
    thread's own stack tells (a walk, 1 to 4 us 40 frames deep, paid while a backward runs;
    no other thread's frames are read: CPython 3.11 follows freed memory there, and
    `sys._current_frames()` hung where a collection inside it freed a `threading.local`, see
    unihook_torch's `_compile`; a count of `threading`'s threads misses `_thread`'s:
    helper-217's FINDING 1). A backward begun where no entry point above is on the stack
    (from C++) passes for another thread's."""
    return _running_backward(sys._getframe(1))


def _grad_nodes(tensors: Sequence[Any]) -> Iterator[Any]:
    # (`guard.grad_node`: `t.grad_fn` leaks its node, and with it the graph behind, one whose
    # backward never ran too: GradientMonitor's looks kept an auxiliary head's, 250 MB a
    # thousand steps of a 64x256 model, helper-209's FINDING 3)
    for t in tensors:
        node = None if t.stop_gradient else guard.grad_node(t)
        if node is not None:
            yield node


def _edges(node: Any) -> Iterator[tuple[int, None, Any]]:
    for before in node.next_functions:
        if before is not None:
            yield before.node_ptr(), None, before


def _no_order(node: Any) -> None:
    return None


# the nodes `derived_from` walks at most from each tensor a module keeps, at each call (a
# view, a probe's logits are a few nodes from the output; 64 cost a 24-block transformer
# keeping its attention weights 20% a step: helper-196's FINDING 4)
_KEPT_BUDGET = 16


def _is_tensor(obj: object) -> bool:
    # a tenth of paddle.is_tensor's cost, which also looks for static-graph values
    return isinstance(obj, paddle.Tensor)


_NUMPY_FLOATS = (paddle.float32, paddle.float64, paddle.float16)
_NUMPY_DTYPES = (*_NUMPY_FLOATS, paddle.int64, paddle.int32)
_COMPLEX = (paddle.complex64, paddle.complex128)


def _group(like: Any) -> Any:
    """The communication group a ``paddle.DataParallel`` `like` runs over (its ``group``),
    else None: the default group (fleet's wrappers: their data-parallel ranks are all ranks)."""
    return like.group if isinstance(like, paddle.DataParallel) else None


def _cpu_view(t: Any) -> Any:
    """A CPU tensor as numpy sees it, or None on another device: a zero-copy view
    (Tensor.numpy() copies: 2 ms per 2 MB) for numpy's dtypes; a complex one as its real and
    imaginary parts; else a float32 copy (bfloat16: exact) or a float64 one (bool, int8...)."""
    if not t.place.is_cpu_place():
        return None
    x = t.detach()
    if x.dtype not in _NUMPY_DTYPES:  # (dtype first: paddle's is_complex() costs 14 us)
        if x.dtype in _COMPLEX:
            x = paddle.as_real(x)  # |z|^2 = re^2 + im^2
        if x.dtype not in _NUMPY_DTYPES:
            x = x.astype("float32" if x.is_floating_point() else "float64")
    return np.from_dlpack(x)


class PaddleOps(Ops):
    is_tensor = staticmethod(_is_tensor)

    def to_numpy(self, t: Any) -> Any:
        x = t.detach()
        if x.is_floating_point() and x.dtype not in _NUMPY_FLOATS:
            # paddle's numpy() gives bfloat16's raw bits as uint16 (and float8's as uint8)
            x = x.astype("float32")
        return np.array(x.numpy())

    def detach(self, t: Any) -> Any:
        return t.detach()

    def clone(self, t: Any) -> Any:
        return t.detach().clone()

    def zeros_like(self, t: Any) -> Any:
        return paddle.zeros_like(t)

    def sum(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return paddle.sum(t, axis=_axes(axis), keepdim=keepdim)

    def mean(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return paddle.mean(t, axis=_axes(axis), keepdim=keepdim)

    def std(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return paddle.std(t, axis=_axes(axis), unbiased=False, keepdim=keepdim)

    def max(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return paddle.amax(t, axis=_axes(axis), keepdim=keepdim)

    def min(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return paddle.amin(t, axis=_axes(axis), keepdim=keepdim)

    def norm(self, t: Any, p: float) -> Any:
        return paddle.linalg.norm(t.flatten(), p=p)

    def sum_squares(self, t: Any) -> float:
        view = _cpu_view(t)
        if view is not None:  # paddle's float64 elementwise kernels are 20x slower on a CPU
            return cpu_sum_squares(view)
        x = t.detach()
        if x.dtype in _COMPLEX:
            x = paddle.as_real(x)
        return float(x.astype("float64").square().sum())

    def recording(self) -> Any:
        return paddle.set_grad_enabled(True)

    def is_floating(self, t: Any) -> bool:
        return bool(t.is_floating_point() or t.is_complex())

    def moments(self, t: Any) -> Moments:
        view = _cpu_view(t)
        if view is not None:
            return cpu_moments(view)
        x = t.detach()
        x = (paddle.as_real(x) if x.dtype in _COMPLEX else x).astype("float64")
        finite = paddle.isfinite(x)
        count = int(finite.astype("int64").sum())
        size = int(x.numel())
        if count < size:  # rare: mask the non-finite values out
            x = paddle.masked_select(x, finite)
        if not count:
            return 0, 0.0, 0.0, 0.0, 0.0, 0, size
        mean = x.mean()
        m2 = (x - mean).square().sum()
        # |sign| counts the non-zeros (paddle's float64 `x == 0` holds for |x| < 1e-15)
        nonzero = paddle.sign(x).abs().sum()
        stacked = paddle.stack([mean, m2, x.min(), x.max(), nonzero])
        stats: list[float] = stacked.tolist()  # type: ignore[assignment]
        zeros = count - int(stats[4])
        return count, stats[0], stats[1], stats[2], stats[3], zeros, size - count

    def abs(self, t: Any) -> Any:
        return t.abs()

    def clamp(self, t: Any, min: float | None, max: float | None) -> Any:  # noqa: A002
        return paddle.clip(t, min=min, max=max)

    def all_finite(self, t: Any) -> bool:
        return bool(paddle.isfinite(t).all())

    def dropout(self, t: Any, p: float, training: bool) -> Any:
        return F.dropout(t, p, training=training)

    def drop_block(self, t: Any, p: float, block_size: int, training: bool) -> Any:
        if not training or p <= 0:
            return t
        n, c, h, w = t.shape
        size = min(block_size, h, w)
        gamma = drop_block_rate(h, w, size, p)
        # seeds only where a whole block fits; a size x size max pool over them padded by
        # size - 1 spreads each seed over its block
        # the mask and its count in float32 at least: a float16 count over 65,504 was inf (and
        # CPU has no float16 pad kernel); bfloat16 rounded it (helper-125's FINDING 1)
        work = t.dtype if t.dtype in (paddle.float32, paddle.float64) else paddle.float32
        seeds = (paddle.rand([n, c, h - size + 1, w - size + 1]) < gamma).astype(work)
        if size == h == w:  # one seed per map, whose block is the map (a clamped block)
            blocks = seeds.expand([n, c, h, w])
        else:  # separable: O(size), not O(size**2), per point
            padded = F.pad(seeds, [size - 1] * 4)
            blocks = F.max_pool2d(F.max_pool2d(padded, (size, 1), stride=1), (1, size), stride=1)
        keep = 1 - blocks
        scaled = keep * (keep.numel().astype(work) / keep.sum().clip(min=1))
        if work == t.dtype:
            return t * scaled
        return (t.astype(work) * scaled).astype(t.dtype)  # (no float16 multiply on the CPU)

    def children(self, module: Any) -> list[Any]:
        # (paddle files a sublayer under `_sub_layers`: one dict read, where the walk costs
        # a call per module)
        return [m for m in module._sub_layers.values() if m is not None]

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_sublayers(include_self=True))

    def own_parameters(self, module: Any) -> list[tuple[Any, int, bool]]:
        # running statistics, buffers in torch: the 2.x layers' and the legacy
        # `paddle.nn.BatchNorm`'s (PaddleClas / PaddleOCR style), which is no _BatchNormBase
        stats = isinstance(module, (_BatchNormBase, paddle.nn.BatchNorm))
        return [
            (p, int(p.size), not p.stop_gradient)
            for name, p in module.named_parameters(include_sublayers=False)
            if not (stats and name in ("_mean", "_variance"))
        ]

    def attribute_values(self, module: Any) -> list[Any]:
        # paddle files a tensor attribute among the buffers (`_buffers`); the rest of what
        # every Layer has holds hooks, sublayers, Parameters and paddle's own state
        skip = _bookkeeping()
        # (the items in one C call: another thread's new attribute during a walk of the
        # dict raised out of the forward, helper-101's FINDING 3)
        # (and its `__slots__` attributes': helper-95's FINDING 10)
        return [v for k, v in list(module.__dict__.items()) if k not in skip] + slot_values(module)

    def as_tensor(self, array: Any, like: Any) -> Any:
        return paddle.to_tensor(np.asarray(array), dtype=like.dtype, place=like.place)

    def leaf(self, t: Any) -> Any:
        copy = t.detach().clone()
        copy.stop_gradient = False
        return copy

    def float64_copy(self, module: Any) -> Any:
        # `to(dtype=)` casts the floating parameters (BatchNorm's statistics are parameters
        # in paddle) and buffers
        wide = _copy.deepcopy(module)
        wide.to(dtype="float64")
        return wide

    @contextlib.contextmanager
    def float64_default(self, like: Any) -> Iterator[None]:
        before, state = paddle.get_default_dtype(), paddle.get_rng_state()
        paddle.set_default_dtype("float64")
        try:
            yield
        finally:
            paddle.set_default_dtype(before)
            paddle.set_rng_state(state)

    def grad_of(self, t: Any) -> Any:
        return t.grad

    def copy_into(self, buffer: Any, t: Any) -> Any:
        if buffer is None or buffer.shape != t.shape or buffer.dtype != t.dtype:
            return t.detach().clone()
        # Tensor.copy_ of a detached source builds no graph: 1.3 us against paddle.assign's 9.5.
        buffer.copy_(t.detach(), True)
        return buffer

    def on_grad(self, t: Any, fn: Callable[[Any], None]) -> bool:
        # `unihook.ops.on_grad`: paddle's own hook, without register_tensor_hook's emulation
        # (no_grad, returned-gradient checks, leaf copies, removal): `fn` only reads. The guard
        # keeps an exception's type (paddle's C++ would turn it into OSError).
        if t.stop_gradient:
            return False
        leaf, token, serial = t.is_leaf, guard.token(), guard.serial(t)

        def hook(grad: Any) -> None:
            if leaf:
                guard.fired(token, serial)
            try:
                fn(grad)
            except BaseException as error:
                guard.stash(error)
                raise

        guard.register_hook(t, hook, [])  # (None where torch's engine gives None: as torch)
        guard.hold(hook)
        if leaf:  # (paddle.grad skips a leaf's hooks: the guard runs them for its inputs)
            guard.track(t, token, hook)
        return True

    def forward_hook_dicts(self, module: Any) -> tuple[Any, Any]:
        state = vars(module)
        return state.get("_forward_pre_hooks"), state.get("_forward_post_hooks")

    def is_leaf(self, t: Any) -> bool:
        return bool(t.is_leaf)

    def derived_from(
        self,
        held: Sequence[Any],
        tensors: Sequence[Any],
        arguments: Sequence[Any],
        since: object = None,
    ) -> bool | None:
        # as `derived`, from the kept tensors, down to the arguments' nodes and the leaves',
        # `_KEPT_BUDGET` nodes at most: paddle numbers no node, so a walk cannot stop where
        # the outputs were made, and a kept tensor made before them with a long history (a
        # running average kept without detach, features of a deep body) was walked whole at
        # every call and, past the budget, dropped the module for good (helper-191's FINDING
        # 3). Past it, False: a value made from an output that far from it is not told (a
        # view, a value a few ops from it are). A kept tensor of an output's node is one of
        # its outputs: told as made from it.
        outputs = {id(t) for t in tensors}
        # (by type, as torch's)
        kept = [t for t in held if issubclass(type(t), paddle.Tensor) and id(t) not in outputs]
        sources = [(node.node_ptr(), None, node) for node in _grad_nodes(kept)]
        if not sources:
            return False
        targets = [(node.node_ptr(), None, node) for node in _grad_nodes(tensors)]
        if not targets:
            return False
        stops = frozenset(node.node_ptr() for node in _grad_nodes(arguments))
        # (each kept tensor its own budget: one with a long history spent it for a value made
        # from the output beside it, helper-195's FINDING 3)
        return any(
            history_reaches(targets, _edges, _no_order, None, stops, [source], _KEPT_BUDGET)
            for source in sources
        )

    def derived(self, tensors: Sequence[Any], arguments: Sequence[Any]) -> bool | None:
        # grad nodes by address, down to the arguments' nodes and the leaves' accumulation
        # nodes: paddle numbers no node, nor says which of a node's outputs an edge takes (a
        # node two outputs come from is one target)
        outputs = [(node.node_ptr(), None, node) for node in _grad_nodes(tensors)]
        if len(outputs) < 2:
            return False
        stops = frozenset(node.node_ptr() for node in _grad_nodes(arguments))
        return history_reaches(outputs, _edges, _no_order, None, stops)

    def change_mark(self, t: Any, settled: bool) -> object:
        # The tensor's grad node: an in-place op autograd records replaces it; one it does not
        # (under no_grad) moves `inplace_version` and leaves the history, whose gradient then
        # still sums every use of the tensor (helper-67's attack). A leaf's is its
        # accumulation node; a tensor with stop_gradient has none (no gradient: None).
        return guard.node_ptr(t) or None

    def version(self, t: Any) -> int | None:
        return t.inplace_version

    def map_tensors(self, fn: Callable[[Any], Any], value: Any) -> Any:
        def leaf(obj: Any) -> Any:
            if isinstance(obj, paddle.Tensor):
                return fn(obj)
            # paddle.utils keeps a dataclass whole
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                return map_dataclass(obj, lambda v: self.map_tensors(fn, v))
            return obj

        if isinstance(value, dict) and dataclasses.is_dataclass(value):
            # map_structure rebuilds a dict subclass as type(value)(items): wrong for a
            # dataclass that is also a dict (transformers' ModelOutput)
            return leaf(value)
        try:
            return map_structure(leaf, value)
        except TypeError as e:  # a defaultdict, a dict with keys that do not sort
            raise HookTargetError(
                f"unihook (paddle): paddle.utils.map_structure cannot rebuild this "
                f"{type(value).__name__} as its own type: {e}"
            ) from e

    def unwrap(self, module: Any) -> Any:
        wrappers: tuple[type, ...] = (paddle.DataParallel,)
        # fleet's sharding wrapper (optimizer-state sharding: every rank holds the whole model);
        # not its tensor or pipeline wrappers, whose ranks hold different modules
        fleet = sys.modules.get("paddle.distributed.fleet.meta_parallel")
        if fleet is not None:
            wrappers += (fleet.ShardingParallel,)
        while isinstance(module, wrappers):
            module = module._layers
        return module

    def grad_enabled(self, like: Any) -> bool:
        return bool(paddle.is_grad_enabled())

    def in_backward(self, like: Any) -> bool:
        if guard.backward_here():
            # (a backward of the guard's, while unihook's gradient hooks live: paddle's flag,
            # one for the process, is cleared as another thread's backward ends; until
            # 2026-12-07 a checkpoint's recomputation after that passed for a forward,
            # helper-215's FINDING 2)
            return True
        if paddle.base.core.eager._is_run_in_backward():
            return _backward_on_this_thread()
        # paddle's flag is one bool: a backward run inside another (the inner one of a
        # reentrant `recompute`) clears it when it ends, for the rest of the outer one, whose
        # later segments' recomputations then passed for forwards (counted twice by
        # ActivationStats, no GradientMonitor norm). recompute's backward re-runs its segment
        # inside `dygraph.guard()`, a tracer of its own: there (and in code run inside
        # `dygraph.guard()`) the stack tells, a PyLayer's backward being on it.
        if _tracer() is _OWN_TRACER:
            return False
        return _in_a_py_layer_backward()

    def world(self, like: Any) -> tuple[int, int] | None:
        dist = sys.modules.get("paddle.distributed")
        if dist is None or not dist.is_initialized():
            return None
        group = _group(like)
        if group is not None and group.nranks < 2:  # paddle numbers a one-rank group -1 of -1
            return 0, 1
        return dist.get_rank(group), dist.get_world_size(group)

    def grad_sync(self, like: Any) -> bool | None:
        if isinstance(like, paddle.DataParallel):
            return bool(like.grad_need_sync)  # (False in `no_sync()`)
        return None

    def all_gather(self, vector: Any, like: Any) -> Any:
        import paddle.distributed as dist

        group = _group(like)
        if group is not None and group.nranks < 2:  # paddle refuses collectives over one rank
            return np.asarray(vector, dtype=np.float64)[None]
        parts: list[Any] = []
        # on the default place: the CPU for gloo, the group's GPU for NCCL
        local = paddle.to_tensor(np.asarray(vector, dtype=np.float64))
        dist.all_gather(parts, local, group=group)
        return np.stack([part.numpy() for part in parts])

    def after_backward(self, t: Any, fn: Callable[[], None]) -> None:
        guard.at_backward_end(fn)


@functools.cache
def _bookkeeping() -> frozenset[str]:
    """The attributes every Layer has that hold no tensor of the user's (`attribute_values`)."""
    return frozenset(paddle.nn.Layer().__dict__) - {"_buffers", "_customized_attrs"}
