"""``unihook.ops`` for torch."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import math
import sys
import weakref
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor

from unihook.backend import history_reaches, imported, map_dataclass
from unihook.errors import HookArgumentError
from unihook.ops import (
    Moments,
    Ops,
    cpu_moments,
    cpu_sum_squares,
    drop_block_rate,
    slot_values,
)

Axis = Union[None, int, Sequence[int]]


def _dims(axis: Axis) -> Any:
    # torch spells "every axis" as dim=() for amax/amin but dim=None for sum/mean.
    return tuple(axis) if isinstance(axis, Sequence) else axis


# dtypes numpy views without a copy; the rest (bfloat16, complex...) go through torch
# `change_mark`'s key in a grad node's metadata, and its numbers (1, 2, ...: 0 is a leaf's)
_MARK = "unihook.change_mark"
_marks = itertools.count(1)
# the sequence number this thread's next autograd node gets (a peek: no node is made)
_next_sequence_nr: Callable[[], int] | None = getattr(
    getattr(torch._C, "_autograd", None), "_get_sequence_nr", None
)
# `Module._call_impl`'s name and file: dynamo runs code of its own in a compiled frame
_CALL_IMPL = (torch.nn.Module._call_impl.__name__, torch.nn.Module._call_impl.__code__.co_filename)
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32)
_FLOATS = (torch.float32, torch.float64)


def _edges(node: Any) -> Iterator[tuple[int, int, Any]]:
    for before, index in node.next_functions:
        if before is not None:
            yield id(before), index, before


def _sequence_nr(node: Any) -> int:
    return node._sequence_nr()


def _output_nodes(
    tensors: Sequence[Any],
) -> tuple[list[tuple[int, int | None, Any]], int | None] | None:
    """The grad nodes of a call's output tensors that need grad, and the earliest one's
    sequence number (None with a returned leaf, a parameter: its AccumulateGrad node was made
    long before), for `derived` and `derived_from`; None where that cannot be told."""
    outputs: list[tuple[int, int | None, Any]] = []
    floor: int | None = sys.maxsize
    for t in map(_outside_vmap, tensors):
        if not t.requires_grad:
            continue
        node, index = t.grad_fn, t.output_nr
        if node is None:
            if not torch.is_grad_enabled():
                continue
            try:
                node, index = t.view_as(t).grad_fn.next_functions[0]
            except RuntimeError:
                return None  # (a layout without views, a sparse parameter: cannot tell)
            floor = None
        elif floor is not None:
            floor = min(floor, node._sequence_nr())
        outputs.append((id(node), index, node))
    return outputs, floor


def _stops(arguments: Sequence[Any], held: list[Any]) -> frozenset[int]:
    """The ids of a call's argument tensors' grad nodes, where a walk stops; the caller holds
    the nodes meanwhile (`held`: a node's Python wrapper dies with its last reference, and a
    new one may take its id)."""
    held.extend(_outside_vmap(a).grad_fn for a in arguments)
    return frozenset(id(node) for node in held if node is not None)


def _wrapper_types() -> tuple[type, ...]:
    """The data-parallel wrappers that hold the model as ``.module``. FSDP only when its package
    was imported (an FSDP object cannot exist otherwise; importing it costs 0.3 s)."""
    found: list[type] = [torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel]
    fsdp = imported("torch.distributed.fsdp")
    if fsdp is not None:
        found.append(fsdp.FullyShardedDataParallel)
    return tuple(found)


def _unit_wrapped(module: Any) -> Any:
    """The module a wrapper of one part of a model holds, or None: FSDP1's units
    (``auto_wrap_policy``: ``_fsdp_wrapped_module``), ``torch.compile`` of a submodule
    (``_orig_mod``), ``checkpoint_wrapper`` / ``offload_wrapper``
    (``_checkpoint_wrapped_module``). Each has the wrapped module as its only child; torch
    names parameters without these parts (FSDP's ``clean_tensor_name``), and so do the recipes.
    Looked up in ``sys.modules`` (`imported`): none can exist before its package was imported."""
    # (`named_modules` lists the outermost wrapper, whose hooks run once per call: inside a
    # checkpoint a hook runs again in the recomputation, and a random one, DropHook's, draws
    # another mask; but not compile's, whose hooks do not run inside another compiled region,
    # where the module inside it is traced with its hooks)
    return _inside(module, _unit_wrapper_types())


def _unit_wrapper_types() -> list[tuple[type, str]]:
    """The classes of `_UNIT_WRAPPERS` whose packages are imported, with the attribute that
    holds the wrapped module (a walk of a whole model looks them up once: per module they
    cost a third of `named_modules`, helper-128's places benchmark)."""
    found = []
    for package, kind, attribute in _UNIT_WRAPPERS:
        imported_package = imported(package)
        if imported_package is not None:
            found.append((getattr(imported_package, kind), attribute))
    return found


def _inside(module: Any, wrappers: list[tuple[type, str]]) -> Any:
    """The module `module` wraps if it is an instance of one of the `wrappers`, else None."""
    for kind, attribute in wrappers:
        if isinstance(module, kind):
            return getattr(module, attribute)
    return None


_UNIT_WRAPPERS = (
    ("torch.distributed.fsdp", "FullyShardedDataParallel", "_fsdp_wrapped_module"),
    ("torch._dynamo.eval_frame", "OptimizedModule", "_orig_mod"),
    (
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
        "ActivationWrapper",
        "_checkpoint_wrapped_module",
    ),
)


def _compiled(module: Any) -> Any:
    """The module inside ``torch.compile``'s OptimizedModule (``_orig_mod``), or `module`: torch
    recommends compiling the DDP wrapper."""
    eval_frame = imported("torch._dynamo.eval_frame")
    while eval_frame is not None and isinstance(module, eval_frame.OptimizedModule):
        module = module._orig_mod
    return module


def _data_parallel_groups(like: Any) -> list[Any] | None:
    """The process groups whose ranks split the batch of `like`, innermost first (their
    product is the data-parallel world), or None for the default group: DDP's and FSDP's
    ``process_group``; FSDP's hybrid sharding, its shard group then its replicate group
    (``_inter_node_pg``); ``fully_shard``'s device mesh, one group per dimension."""
    like = _compiled(like)
    if isinstance(like, _wrapper_types()):
        group = getattr(like, "process_group", None)  # nn.DataParallel: one process, none
        if group is None:
            return None
        replicate = getattr(like, "_inter_node_pg", None)  # HYBRID_SHARD (FSDP1)
        return [group] if replicate is None else [group, replicate]
    fsdp = imported("torch.distributed.fsdp")
    if fsdp is not None and isinstance(like, fsdp.FSDPModule):
        for module in like.modules():  # the root may hold no parameter of its own
            if isinstance(module, fsdp.FSDPModule):
                groups = module._get_fsdp_state()._fsdp_param_groups
                if groups:
                    mesh = groups[0].mesh_info.mesh  # (replicate, shard) for HSDP: shard first
                    return [mesh.get_group(dim) for dim in reversed(range(mesh.ndim))]
    return None


# the checks each DistributedDataParallel runs when passed to torch's Join (`TorchOps.on_join`)
_join_checks: weakref.WeakKeyDictionary[Any, list[Callable[[], None]]] = weakref.WeakKeyDictionary()


class _CheckedJoinHook:
    """DDP's ``join_hook``, after the checks registered for it: an instance attribute (torch's
    Join calls ``joinable.join_hook(**kwargs)``), gone with the last check."""

    __slots__ = ("_ddp",)

    def __init__(self, ddp: Any) -> None:
        self._ddp = weakref.ref(ddp)

    def __call__(self, **kwargs: Any) -> Any:
        found = self._ddp()
        assert found is not None  # (called as its attribute)
        for check in list(_join_checks.get(found, ())):
            check()
        return type(found).join_hook(found, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _CheckedJoinHook:
        # a deep copy of the wrapper (copied first, into `memo`) joins as itself, unchecked
        return _CheckedJoinHook(memo.get(id(self._ddp()), self._ddp()))


def _join_being_built() -> Any:
    """The torch ``Join`` whose construction calls its joinables' ``join_hook`` on this thread
    (found in the calling frames), or None."""
    join = imported("torch.distributed.algorithms.join")
    if join is None:
        return None
    code = join.Join.__init__.__code__
    frame = sys._getframe(1)
    for _ in range(12):  # (Join.__init__, its comprehension, the hooks: a few frames up)
        if frame is None:
            return None
        if frame.f_code is code:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


# a group `all_gather` ran over: the group of its own it runs over since a recipe on it was
# passed to torch's Join (`TorchOps.join_hook`); None stands for the default group
_own_groups: dict[Any, Any] = {}


def _own_key(group: Any) -> Any:
    import torch.distributed.distributed_c10d as c10d

    return None if group is None or group is c10d._get_default_group() else group


def _make_own_group(group: Any) -> None:
    """`group`'s own group for the recipes' collectives, made once: every rank of `group` gets
    here in the same order (a Join's construction), and only they take part."""
    import torch.distributed as dist

    key = _own_key(group)
    if key not in _own_groups:
        ranks = dist.get_process_group_ranks(group)
        _own_groups[key] = dist.new_group(ranks, use_local_synchronization=True)


def _strided(t: Any, values_only: bool) -> Any:
    """`t` detached as a real strided tensor: a complex one as its real and imaginary parts
    (|z|^2 = re^2 + im^2), a sparse one as its stored values (`values_only`: all a sum of
    squares needs) or dense."""
    x = t.detach()
    if x.layout != torch.strided:
        if values_only and x.layout == torch.sparse_coo:
            x = x.coalesce().values()
        elif values_only and x.layout != torch._mkldnn:  # pyright: ignore[reportAttributeAccessIssue]
            x = x.values()  # compressed layouts (CSR, CSC, BSR, BSC)
        else:
            x = x.to_dense()
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj())
    return x.resolve_neg()  # (numpy cannot view a tensor with the negative bit)


def _values(t: Any) -> Any:
    """`t`'s values, a functorch-wrapped tensor's (one inside torch.func's transforms: the
    wrappers have no storage, and numpy's view of one raised out of the user's transform:
    helper-95's FINDING 9, helper-109's FINDING 5): the tensor under the wrappers, under
    `vmap` the whole batch's, as eager computes them on it (vmap runs a module once per
    call). Read under `_DisableFuncTorch` (a `detach` of it inside a `grad` wraps it again)."""
    while is_functorch_wrapped_tensor(t):
        t = get_unwrapped(t)
    return t


def _outside_vmap(t: Any) -> Any:
    """`t` under the BatchedTensors of the `torch.func.vmap` calls around it: a hook on a
    BatchedTensor never fires (torch's own module backward hooks run nothing under vmap
    either), one on the tensor under it gets the batch's gradient, eager's (helper-109's
    FINDING 5b). A `torch.func.grad` inside the vmap keeps its wrapper: its hooks fire."""
    while is_batchedtensor(t):
        t = get_unwrapped(t)
    return t


def _float_view(t: Any) -> Any:
    """numpy's view of `t` when it is a strided float32 or float64 CPU tensor without the
    negative bit (the recipes' activations and gradients), else None: without `_strided`'s
    torch ops, whose dispatch a hook pays on caches the layers' kernels left cold."""
    if t.is_cpu and t.dtype in _FLOATS and t.layout == torch.strided and not t.is_neg():
        return _unshared(t.detach(), t).numpy()
    return None


def _numpy_view(x: Any, t: Any) -> Any:
    """A CPU tensor `x` (of `t`) as numpy sees it: a view (no copy) for numpy's dtypes, else a
    float32 copy (bfloat16: exact) or a float64 one (bool, integers numpy lacks)."""
    if x.dtype not in _NUMPY_DTYPES:
        x = x.to(torch.float32 if x.is_floating_point() else torch.float64)
        return x.numpy()
    return _unshared(x, t).numpy()


def _unshared(x: Any, t: Any) -> Any:
    """`x` (`t` detached), or a copy where `t` shares its memory with the model's tensors (a
    view, a parameter): numpy's view of a tensor marks its storage not resizable for good, and
    FSDP frees an unsharded parameter by resizing its storage to 0 (its backward raised
    "Trying to resize storage that is not resizable" after the recipes read a slice of a
    parameter, a positional table)."""
    return x.clone() if t._is_view() or (t.is_leaf and t.requires_grad) else x


class TorchOps(Ops):
    is_tensor = staticmethod(torch.is_tensor)

    def to_numpy(self, t: Any) -> Any:
        x = t.detach().cpu()
        if x.layout != torch.strided:
            x = x.to_dense()
        x = x.resolve_conj().resolve_neg()  # (numpy cannot view the lazy bits)
        try:
            return np.array(_unshared(x, t).numpy())
        except TypeError:  # a dtype numpy lacks (bfloat16, float8, complex32): widened
            wide = torch.complex64 if x.is_complex() else torch.float32
            return np.array(x.to(wide).numpy())

    def detach(self, t: Any) -> Any:
        return t.detach()

    def clone(self, t: Any) -> Any:
        return t.detach().clone()

    def zeros_like(self, t: Any) -> Any:
        return torch.zeros_like(t)

    def sum(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return t.sum(dim=_dims(axis), keepdim=keepdim)

    def mean(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return t.mean(dim=_dims(axis), keepdim=keepdim)

    def std(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return torch.std(t, dim=_dims(axis), correction=0, keepdim=keepdim)

    def max(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return torch.amax(t, dim=() if axis is None else _dims(axis), keepdim=keepdim)

    def min(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        return torch.amin(t, dim=() if axis is None else _dims(axis), keepdim=keepdim)

    def norm(self, t: Any, p: float) -> Any:
        return torch.linalg.vector_norm(t, ord=p)

    def sum_squares(self, t: Any) -> float:
        if is_functorch_wrapped_tensor(t):
            with torch._C._DisableFuncTorch():
                return self.sum_squares(_values(t))
        view = _float_view(t)
        if view is not None:
            return cpu_sum_squares(view)
        x = _strided(t, values_only=True)
        if x.device.type == "cpu":
            return cpu_sum_squares(_numpy_view(x, t))
        # a float32 square is exact in float64: the cast makes the float64 sum the only rounding
        return float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2

    def recording(self) -> Any:
        # (GradCAM called under no_grad raised torch's bare "element 0 of tensors does not
        # require grad": helper-125's FINDING 5)
        stack = contextlib.ExitStack()
        if torch.is_inference_mode_enabled():  # (out of it: its tensors record nothing)
            stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        return stack

    def is_floating(self, t: Any) -> bool:
        return bool(t.is_floating_point() or t.is_complex() or t.is_quantized)

    def moments(self, t: Any) -> Moments:
        if t.is_quantized:  # (an eager-quantized model's: its real values; helper-125's F4)
            t = t.dequantize()
        if is_functorch_wrapped_tensor(t):
            with torch._C._DisableFuncTorch():
                return self.moments(_values(t))
        view = _float_view(t)
        if view is not None:
            return cpu_moments(view)
        if t.device.type == "cpu":
            return cpu_moments(_numpy_view(_strided(t, values_only=False), t))
        x = t.detach()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32 if x.is_floating_point() else torch.float64)
        size = x.numel()
        if not size:
            return 0, 0.0, 0.0, 0.0, 0.0, 0, 0
        # Five vectorised passes in the tensor's own dtype: sums are cascaded (pairwise), so
        # float32 keeps about 1e-7 relative; the deviations are summed after the mean is known.
        low, high = torch.aminmax(x)
        mean = x.sum() / size
        deviations = (x - mean).square_()
        m2 = deviations.sum()
        # |sign| counts the non-zeros branch-free (count_nonzero is 10x slower on ReLU outputs)
        nonzero = torch.sign(x, out=deviations).abs_().sum(dtype=torch.float64)
        stats = torch.stack([mean.double(), m2.double(), low.double(), high.double(), nonzero])
        mean_, m2_, low_, high_, nonzero_ = stats.tolist()  # one transfer to the host
        if math.isfinite(low_) and math.isfinite(high_) and math.isfinite(m2_):
            return size, mean_, m2_, low_, high_, size - int(nonzero_), 0
        return self._masked_moments(x)

    @staticmethod
    def _masked_moments(x: Any) -> Moments:
        """Rare: a NaN or Inf among the values (or a float32 sum overflowed). float64, over the
        finite values only."""
        x = x.to(torch.float64)
        finite = torch.isfinite(x)
        count = int(finite.sum())
        nonfinite = x.numel() - count
        if not count:
            return 0, 0.0, 0.0, 0.0, 0.0, 0, nonfinite
        x = x[finite]
        mean = x.mean()
        m2 = (x - mean).square().sum()
        stats = torch.stack([mean, m2, x.amin(), x.amax(), (x == 0).sum().to(x.dtype)]).tolist()
        return count, stats[0], stats[1], stats[2], stats[3], int(stats[4]), nonfinite

    def abs(self, t: Any) -> Any:
        return t.abs()

    def clamp(self, t: Any, min: float | None, max: float | None) -> Any:  # noqa: A002
        return t.clamp(min=min, max=max)

    def all_finite(self, t: Any) -> bool:
        return bool(torch.isfinite(t).all())

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
        shape = (n, c, h - size + 1, w - size + 1)
        # the mask and its count in float32 at least: a float16 count over 65,504 was inf, the
        # scale 0 and the output zeros; bfloat16 rounded it (helper-125's FINDING 1)
        work = t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32
        seeds = (torch.rand(shape, device=t.device) < gamma).to(work)
        if size == h == w:  # one seed per map, whose block is the map (a clamped block)
            blocks = seeds.expand(n, c, h, w)
        else:  # separable: O(size), not O(size**2), per point (1.2 s for the clamped block)
            padded = F.pad(seeds, [size - 1] * 4)
            blocks = F.max_pool2d(F.max_pool2d(padded, (size, 1), stride=1), (1, size), stride=1)
        keep = 1 - blocks
        return t * (keep * (keep.numel() / keep.sum().clamp(min=1))).to(t.dtype)

    def children(self, module: Any) -> list[Any]:
        # (torch files a submodule under `_modules`, None for a slot registered empty: one
        # dict read, where the walk costs a call per module)
        return [m for m in module._modules.values() if m is not None]

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        # torch's own walk (depth first, a shared module once, under its first name), but the
        # modules a part's wrapper holds (`_unit_wrapped`) are left out: the wrapper stands for
        # the part under its name, `0`, not `0` and `0._fsdp_wrapped_module`, and the part's
        # submodules follow (`0.conv`)
        found: list[tuple[str, Any]] = []
        seen: set[int] = set()
        stack = [("", module)]
        wrappers = _unit_wrapper_types()
        kinds = tuple(kind for kind, _ in wrappers)
        while stack:
            name, current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if kinds and isinstance(current, kinds):
                current = _compiled(current)
                seen.add(id(current))
            found.append((name, current))
            inner = _inside(current, wrappers) if kinds else None
            while inner is not None:
                seen.add(id(inner))
                current, inner = inner, _inside(inner, wrappers)
            children = [(k, m) for k, m in current._modules.items() if m is not None]
            stack.extend((f"{name}.{k}" if name else k, m) for k, m in reversed(children))
        return found

    def own_parameters(self, module: Any) -> list[tuple[Any, int, bool]]:
        found: dict[int, tuple[Any, int, bool]] = {}
        while module is not None:  # a part's wrapper: its own and the part's (`named_modules`)
            for p in module.parameters(recurse=False):
                found.setdefault(id(p), (p, p.numel(), p.requires_grad))
            module = _unit_wrapped(module)
        return list(found.values())

    def attribute_values(self, module: Any) -> list[Any]:
        # a tensor kept in an attribute is in `__dict__`, or in `_buffers` under a buffer's
        # name; the rest of what every Module has holds hooks, submodules and Parameters
        skip = _bookkeeping()
        # (the items in one C call: another thread's new attribute during a walk of the
        # dict raised out of the forward, helper-101's FINDING 3)
        # (and its `__slots__` attributes': helper-95's FINDING 10)
        return [v for k, v in list(module.__dict__.items()) if k not in skip] + slot_values(module)

    def as_tensor(self, array: Any, like: Any) -> Any:
        return torch.as_tensor(np.asarray(array), dtype=like.dtype, device=like.device)

    def leaf(self, t: Any) -> Any:
        # (out of inference mode: an inference tensor's clone there records nothing)
        with torch.inference_mode(False):
            return t.detach().clone().requires_grad_(True)

    def float64_copy(self, module: Any) -> Any:
        # `double()` casts the floating parameters and buffers (their .grad too), nothing else
        return copy.deepcopy(module).double()

    @contextlib.contextmanager
    def float64_default(self, like: Any) -> Iterator[None]:
        before = torch.get_default_dtype()
        with torch.random.fork_rng(devices=[]):  # (the CPU generator; a reference run's own)
            torch.set_default_dtype(torch.float64)
            try:
                yield
            finally:
                torch.set_default_dtype(before)

    def grad_of(self, t: Any) -> Any:
        return t.grad

    def copy_into(self, buffer: Any, t: Any) -> Any:
        if buffer is None or buffer.shape != t.shape or buffer.dtype != t.dtype:
            return t.detach().clone()
        # a detached source builds no graph: no no_grad() context (2.5 us) needed
        return buffer.copy_(t.detach())

    def on_grad(self, t: Any, fn: Callable[[Any], None]) -> bool:
        # `unihook.ops.on_grad`: torch's own hook; an exception `fn` raises keeps its type
        t = _outside_vmap(t)
        if not t.requires_grad:
            return False
        t.register_hook(fn)
        return True

    def forward_hook_dicts(self, module: Any) -> tuple[Any, Any]:
        state = vars(module)
        return state.get("_forward_pre_hooks"), state.get("_forward_hooks")

    def is_leaf(self, t: Any) -> bool:
        return _outside_vmap(t).grad_fn is None  # (a BatchedTensor has no grad_fn)

    def derived_from(
        self,
        held: Sequence[Any],
        tensors: Sequence[Any],
        arguments: Sequence[Any],
        since: object = None,
    ) -> bool | None:
        # the kept tensors' grad_fn graphs, walked as `derived`'s: down to the earliest
        # output's sequence number (one made before every output, an attention map or an
        # input kept, is not walked at all), or, with a returned leaf, to the arguments'
        # nodes. One of the same node and output as an output is another object of it
        # (`as_subclass`): its reads reach the output's node too.
        sources: list[tuple[int, int | None, Any]] = []
        for obj in held:
            # (by type: `isinstance` reads `__class__`, which a proxy may raise from, and a
            # `Mock(spec=Tensor)` passes: helper-191's FINDING 4)
            if not issubclass(type(obj), torch.Tensor):
                continue
            t = obj if obj.grad_fn is not None else _outside_vmap(obj)  # (buffers: at once)
            node = t.grad_fn
            if node is not None and all(obj is not out for out in tensors):
                sources.append((id(node), t.output_nr, node))
        if not sources:
            return False
        if torch.compiler.is_compiling():
            return None
        found = _output_nodes(tensors)
        if found is None:
            return None
        targets, floor = found
        if not targets:
            return False
        if isinstance(since, int):
            # (a walk toward an argument made long before, a model's first activation given
            # to every block, went down the whole history at every call: helper-195's
            # FINDING 4)
            floor = since if floor is None else max(floor, since)
        nodes: list[Any] = []
        stops = frozenset() if floor is not None else _stops(arguments, nodes)
        return history_reaches(targets, _edges, _sequence_nr, floor, stops, sources)

    def derived(self, tensors: Sequence[Any], arguments: Sequence[Any]) -> bool | None:
        # grad_fn graphs, walked down to the earliest output's sequence number (a node on a
        # path between two outputs made on the thread of the call was made after the earlier
        # one), then, where that found none, down to the arguments' nodes (a path through
        # an argument computed from a returned tensor made before the call is not walked
        # there). A returned leaf (a parameter) is its AccumulateGrad node, made long before:
        # only the second walk. Traced by dynamo there is no graph to read.
        if torch.compiler.is_compiling():
            return None
        found = _output_nodes(tensors)
        if found is None:
            return None
        outputs, floor = found
        if len(outputs) < 2:
            return False
        if floor is not None:
            found = history_reaches(outputs, _edges, _sequence_nr, floor)
            if found is not False:
                return found  # (a path found is one; None: past the budget)
        # Sequence numbers count per thread: a node made on another thread during the call
        # (a worker's, CUDA's backward threads' under `autograd.grad(create_graph=True)`) may
        # be numbered below the floor (helper-74's attack). Then down to the arguments' nodes,
        # without the floor: the call's own graph.
        held: list[Any] = []
        return history_reaches(outputs, _edges, _sequence_nr, None, _stops(arguments, held))

    def history_mark(self) -> object:
        # the number this thread's next autograd node gets: numbers count up per thread (a
        # node another thread makes during the call may be numbered lower: then the call is
        # left out, conservatively); traced by dynamo there is no graph to read
        if _next_sequence_nr is None or torch.compiler.is_compiling():
            return None
        return _next_sequence_nr()

    def made_before(self, tensors: Sequence[Any], mark: object) -> bool | None:
        if torch.compiler.is_compiling():
            return None
        assert isinstance(mark, int)
        for t in tensors:
            node = _outside_vmap(t).grad_fn
            if node is not None and node._sequence_nr() < mark:
                return True
        return False

    def change_mark(self, t: Any, settled: bool) -> object:
        # The tensor's autograd history: an in-place op autograd records replaces `grad_fn`;
        # one it does not (under no_grad, on `.data`) bumps `_version` and leaves the history,
        # whose gradient then still sums every use of the tensor (helper-67's attack). The
        # node is named by a number kept in its own `metadata` dict (the C++ node's: it lives
        # with the node, whatever Python wrapper reads it), given at its first read, holding
        # nothing (the node would keep its graph alive where a Ctrl-C skipped the end of the
        # call). Not by id: a node's Python wrapper is made per read, and a new node's may take
        # a freed one's address; nor by its sequence number, which counts per thread (a
        # tensor made on one thread and changed in place on another got a node of its old
        # node's number and type: helper-68's and helper-71's attacks). A leaf that requires
        # grad has one history (0).
        if torch.compiler.is_compiling():
            # traced (a hook dynamo inlines): the traced tensor's counter, which moves with the
            # traced in-place ops; its autograd history is not there to read (until 2026-11-30
            # None, nothing told: the sum was reported, helper-68's attack)
            return "traced", t._version
        t = _outside_vmap(t)
        node = t.grad_fn
        if node is None:
            return 0 if t.requires_grad else None
        named = node.metadata
        mark = named.get(_MARK)
        if mark is None:
            mark = named[_MARK] = next(_marks)
        return mark

    def version(self, t: Any) -> int | None:
        if torch.compiler.is_compiling():  # a traced tensor's counter says nothing of the run's
            return None
        try:
            return _outside_vmap(t)._version  # (a BatchedTensor's counter stays at 0)
        except RuntimeError:  # inference tensors keep no version counter
            return None

    def map_tensors(self, fn: Callable[[Any], Any], value: Any) -> Any:
        def leaf(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return fn(obj)
            # pytree keeps an unregistered dataclass whole; registering user types is global
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                return map_dataclass(obj, lambda v: self.map_tensors(fn, v))
            return obj

        return pytree.tree_map(leaf, value)

    def unwrap(self, module: Any) -> Any:
        wrappers = _wrapper_types()
        module = _compiled(module)
        while isinstance(module, wrappers):
            module = _compiled(module.module)
        return module

    def part(self, module: Any) -> Any:
        inner = _unit_wrapped(module)
        while inner is not None:
            module, inner = inner, _unit_wrapped(inner)
        return module

    def grad_enabled(self, like: Any) -> bool:
        return torch.is_grad_enabled()

    def forward_raised(self, frame: Any) -> bool:
        # `Module._call_impl` calls the forward hooks from its `inner` (eager and compiled),
        # and the `always_call` ones itself only in its `except` block, once the forward
        # raised. Under torch.compile that block runs as dynamo's code, where `sys.exc_info()`
        # is empty: a forward that raised counted towards `every` (helper-107's FINDING 5).
        code = getattr(frame, "f_code", None)
        return code is not None and (code.co_name, code.co_filename) == _CALL_IMPL

    def tracing(self, like: Any) -> bool:
        return torch._C._is_tracing()  # (`torch.jit.is_tracing`, which is not exported)

    def in_backward(self, like: Any) -> bool:
        # the id of the graph task autograd's engine runs on this thread, -1 outside one
        return bool(torch._C._current_graph_task_id() != -1)

    def world(self, like: Any) -> tuple[int, int] | None:
        dist = imported("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        groups = _data_parallel_groups(like)
        if groups is None:
            return dist.get_rank(), dist.get_world_size()
        # the rows `all_gather` returns: innermost group first (mixed radix)
        rank, size = 0, 1
        for group in groups:
            rank += size * dist.get_rank(group)
            size *= dist.get_world_size(group)
        return rank, size

    def grad_sync(self, like: Any) -> bool | None:
        wrapper = _compiled(like)
        if isinstance(wrapper, torch.nn.parallel.DistributedDataParallel):
            return bool(wrapper.require_backward_grad_sync)  # (False in `no_sync()`)
        fsdp = imported("torch.distributed.fsdp")
        if fsdp is not None and isinstance(wrapper, fsdp.FullyShardedDataParallel):
            return bool(wrapper._sync_gradients)  # (FSDP1's `no_sync()` clears it)
        return None

    def all_gather(self, vector: Any, like: Any) -> Any:
        import torch.distributed as dist

        local = np.asarray(vector, dtype=np.float64)
        if not local.size:  # nothing to send: as many empty rows as ranks
            return np.zeros(((self.world(like) or (0, 1))[1], 0))
        rows = local[None]
        for group in _data_parallel_groups(like) or [None]:
            if _own_groups:
                group = _own_groups.get(_own_key(group), group)
            # NCCL moves only CUDA tensors; gloo (and "cpu:gloo,cuda:nccl") takes CPU ones
            on_cuda = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else None
            flat = torch.as_tensor(rows.reshape(-1), device=device)
            parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, flat, group=group)
            rows = torch.stack(parts).cpu().numpy().reshape(-1, local.size)
        return rows

    def after_backward(self, t: Any, fn: Callable[[], None]) -> None:
        engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
        # A callback queued by a callback runs after every callback queued before it: after
        # DistributedDataParallel's, which waits for its gradient all-reduce (it queues it when
        # its last bucket is ready, after this hook ran).
        engine.queue_callback(lambda: engine.queue_callback(fn))

    def join_hook(self, like: Any, main: Callable[[], None], post: Callable[[], None]) -> Any:
        from torch.distributed.algorithms.join import JoinHook

        if not isinstance(_compiled(like), torch.nn.parallel.DistributedDataParallel):
            # (the first joinable tells the Join of each forward, before DDP's own collectives)
            raise HookArgumentError(
                f"unihook (torch): a recipe in torch's Join must be given the "
                f"DistributedDataParallel wrapper the Join has, not {type(like).__name__}"
            )

        class _Shadow(JoinHook):
            def main_hook(self) -> None:
                main()

            def post_hook(self, is_last_joiner: bool) -> None:
                post()

        return _Shadow()

    def join_context(self, like: Any) -> tuple[Any, Any]:
        import torch.distributed as dist

        group = _compiled(like).process_group  # (DDP's: `join_hook` made sure)
        # the recipes' own group, made once every joinable gave its hook (a misuse raised
        # there on every rank, before any collective): the Join reads the group now
        _make_own_group(group)
        if dist.get_backend(group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device()), group
        return torch.device("cpu"), group

    def on_join(self, like: Any, check: Callable[[], None]) -> Callable[[], None]:
        ddp = _compiled(like)
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            return lambda: None
        checks = _join_checks.get(ddp)
        if checks is None:
            checks = _join_checks[ddp] = []
            vars(ddp)["join_hook"] = _CheckedJoinHook(ddp)
        checks.append(check)
        ref = weakref.ref(ddp)

        def stop() -> None:
            found = ref()
            mine = _join_checks.get(found) if found is not None else None
            if mine is None or check not in mine:
                return  # (idempotent)
            mine.remove(check)
            if not mine:  # the last one: the class's join_hook again, nothing left behind
                del _join_checks[found]
                vars(found).pop("join_hook", None)

        return stop

    def join_being_built(self, like: Any) -> Any:
        return _join_being_built()

    def notify_join(self, like: Any, joinable: Any) -> None:
        from torch.distributed.algorithms.join import Join

        config = joinable._join_config
        if config is None:  # (its Join's construction failed)
            return
        if config.enable and not config.is_first_joinable:
            # another joinable's hook (DDP's waits for its backward's all-reduces) would run
            # before the recipes' start, while the others wait in the merge at the forward's end
            raise HookArgumentError(
                f"unihook (torch): {type(joinable).__name__} must come before the model (and "
                f"any other joinable) in the list given to torch's Join, as in "
                f"Join([stats, monitor, ddp_model]): a rank that ran out of inputs runs the "
                f"joinables' hooks in that order, and the recipes' merges come first"
            )
        work = Join.notify_join_context(joinable)
        ddp = _compiled(like)
        if work is not None and hasattr(ddp, "_divide_by_initial_world_size"):
            # what DDP does with its own notice, first in the list: its reducer then divides the
            # gradients by the ranks not joined where `divide_by_initial_world_size=False`
            ddp.reducer._set_forward_pass_work_handle(work, ddp._divide_by_initial_world_size)


@functools.cache
def _bookkeeping() -> frozenset[str]:
    """The attributes every Module has that hold no tensor of the user's (`attribute_values`)."""
    return frozenset(torch.nn.Module().__dict__) - {"_buffers"}
