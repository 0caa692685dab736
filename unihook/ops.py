"""A small neutral namespace for hook bodies: the framework calls whose spelling differs.

``unihook.ops.mean(t, axis=(2, 3))`` works on a torch or a paddle tensor alike. Each function
dispatches on the type of its first argument to the owning backend's `Ops`, resolved through
pluggy once per type and cached: no plugin call per op. It is not an array library: for
anything else, convert with `to_numpy` or use the framework.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from typing import Any, Callable, ContextManager, Sequence, Union

from ._describe import type_name
from ._identity import WeakIdentityKeys
from ._plugins import plugin_manager
from .errors import HookArgumentError, NoBackendError, NoGradError

__all__ = [
    "Ops",
    "abs",
    "after_backward",
    "all_finite",
    "all_gather",
    "as_tensor",
    "backward",
    "call_frame",
    "clamp",
    "clone",
    "copy_into",
    "cpu_moments",
    "cpu_sum_squares",
    "derived",
    "derived_from",
    "detach",
    "drop_block",
    "drop_block_rate",
    "dropout",
    "float64_copy",
    "float64_default",
    "forward_backward",
    "forward_hook_dicts",
    "prepended_keys",
    "forward_raised",
    "grad_enabled",
    "grad_sync",
    "in_backward",
    "grad_of",
    "is_leaf",
    "is_tensor",
    "join_context",
    "join_being_built",
    "join_hook",
    "leaf",
    "max",
    "mean",
    "min",
    "moments",
    "named_modules",
    "norm",
    "notify_join",
    "on_join",
    "object_version",
    "change_mark",
    "on_grad",
    "own_parameters",
    "part",
    "std",
    "sum",
    "sum_squares",
    "tensors_in",
    "to_numpy",
    "tracing",
    "unwrap",
    "version",
    "world",
    "zeros_like",
]

Axis = Union[None, int, Sequence[int]]
# (finite count, mean, sum of squared deviations from the mean, min, max, zeros, non-finite)
# over the finite values of a tensor; see `moments`.
Moments = tuple[int, float, float, float, float, int, int]


class Ops:
    """A backend's ops facet: the functions below forward to it. A backend subclasses it (one
    instance per framework, returned by its ``unihook_ops`` hookimpl) and implements the
    methods without a default, which raise NotImplementedError naming the facet and the
    method; the others have the default their docstring gives."""

    def _missing(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"unihook.ops: the backend's ops facet ({type(self).__name__}) must implement "
            f"`{name}`; it has no default."
        )

    # -- required: tensors, reductions, modules --
    @staticmethod
    def is_tensor(obj: object, /) -> bool:
        """(A static method: a backend's may be the framework's own type test.)"""
        raise NotImplementedError("unihook.ops: the backend's ops facet must implement `is_tensor`")

    def to_numpy(self, t: Any) -> Any:
        raise self._missing("to_numpy")

    def detach(self, t: Any) -> Any:
        raise self._missing("detach")

    def clone(self, t: Any) -> Any:
        raise self._missing("clone")

    def zeros_like(self, t: Any) -> Any:
        raise self._missing("zeros_like")

    def sum(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        raise self._missing("sum")

    def mean(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        raise self._missing("mean")

    def std(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        raise self._missing("std")

    def max(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        raise self._missing("max")

    def min(self, t: Any, axis: Axis, keepdim: bool) -> Any:
        raise self._missing("min")

    def norm(self, t: Any, p: float) -> Any:
        raise self._missing("norm")

    def sum_squares(self, t: Any) -> float:
        raise self._missing("sum_squares")

    def moments(self, t: Any) -> Moments:
        raise self._missing("moments")

    def is_floating(self, t: Any) -> bool:
        """Whether `t` holds real values: floating, complex (or quantized) ones, not integers
        or bools (ActivationStats leaves those out beside real ones). The default: True."""
        return True

    def abs(self, t: Any) -> Any:
        raise self._missing("abs")

    def clamp(self, t: Any, min: float | None, max: float | None) -> Any:
        raise self._missing("clamp")

    def all_finite(self, t: Any) -> bool:
        raise self._missing("all_finite")

    def dropout(self, t: Any, p: float, training: bool) -> Any:
        raise self._missing("dropout")

    def drop_block(self, t: Any, p: float, block_size: int, training: bool) -> Any:
        raise self._missing("drop_block")

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        raise self._missing("named_modules")

    def children(self, module: Any) -> list[Any]:
        """`module`'s direct submodules, in one step where a backend can (a look at each
        module call): those of `named_modules` by default."""
        return [m for name, m in self.named_modules(module)[1:] if "." not in name]

    def own_parameters(self, module: Any) -> list[tuple[Any, int, bool]]:
        raise self._missing("own_parameters")

    def attribute_values(self, module: Any) -> list[Any]:
        """The values of `module`'s attributes where code may keep a tensor (``self.out = y``,
        a dict or list attribute): those of its ``__dict__``. A backend leaves out the tables
        its framework gives every module that hold no tensor of the user's (hooks, submodules,
        parameters): GradientMonitor looks in them at every module call."""
        return list(getattr(module, "__dict__", {}).values())

    def as_tensor(self, array: Any, like: Any) -> Any:
        raise self._missing("as_tensor")

    def leaf(self, t: Any) -> Any:
        raise self._missing("leaf")

    def grad_of(self, t: Any) -> Any:
        raise self._missing("grad_of")

    def copy_into(self, buffer: Any, t: Any) -> Any:
        raise self._missing("copy_into")

    def version(self, t: Any) -> int | None:
        """The in-place version counter `t` shares with its aliases and views (bumped by every
        in-place op on any of them), or None when the framework keeps none for `t`."""
        raise self._missing("version")

    def map_tensors(self, fn: Callable[[Any], Any], value: Any) -> Any:
        """`value` rebuilt as its own type (namedtuple, return type, dict, list, dataclass,
        nested) with `fn` applied to every tensor in it, through the framework's tree
        utilities."""
        raise self._missing("map_tensors")

    # -- with defaults --
    def object_version(self, t: Any) -> int | None:
        """The in-place counter of the tensor object `t` itself, for a framework whose aliases
        keep counters of their own (MindSpore): `version` by default."""
        return self.version(t)

    def change_mark(self, t: Any, settled: bool) -> object:
        """See the function `change_mark`: `object_version` by default."""
        return object_version(t)

    def derived(self, tensors: Sequence[Any], arguments: Sequence[Any]) -> bool | None:
        """See the function `derived`: None (cannot tell) by default."""
        return None

    def derived_from(
        self,
        held: Sequence[Any],
        tensors: Sequence[Any],
        arguments: Sequence[Any],
        since: object = None,
    ) -> bool | None:
        """See the function `derived_from`: None (cannot tell) where one of `held` is a tensor
        other than `tensors`, else False, by default."""
        outputs = {id(t) for t in tensors}
        for obj in held:
            try:
                tensor = self.is_tensor(obj)
            except Exception:  # (a proxy whose `__class__` raises: it cannot tell)
                return None
            if tensor and id(obj) not in outputs:
                return None
        return False

    def history_mark(self) -> object:
        """See the function `history_mark`: None (cannot tell) by default."""
        return None

    def made_before(self, tensors: Sequence[Any], mark: object) -> bool | None:
        """See the function `made_before` (`mark` is not None here): None by default."""
        return None

    def on_grad(self, t: Any, fn: Callable[[Any], None]) -> bool:
        """See the function `on_grad`: `register_tensor_hook` by default."""
        from .api import register_tensor_hook

        try:
            register_tensor_hook(t, fn)
        except NoGradError:
            return False
        return True

    def backward(self, t: Any) -> None:
        """Backward from the scalar `t` into the leaves' accumulated gradients:
        ``t.backward()`` by default (a framework whose autograd is functional overrides)."""
        t.backward()

    def forward_backward(
        self, fn: Callable[[Any], Any], x: Any, input_grad: bool, caller: str
    ) -> Any:
        """The forward ``fn(x)`` (a scalar) and its backward, returning the gradient with
        respect to `x` when `input_grad`: `backward` of ``fn(x)`` and `grad_of(x)` by default
        (a framework that differentiates a function overrides). `caller` names the recipe or
        function in its errors. The framework records gradients inside (`recording`), as
        captum does: a map asked for in an evaluation loop's no_grad."""
        with self.recording():
            self.backward(fn(x))
        return self.grad_of(x) if input_grad else None

    def recording(self) -> ContextManager[None]:
        """A context in which the framework records gradients (torch's ``enable_grad``), for
        `forward_backward`: a no-op by default."""
        return contextlib.nullcontext()

    def grad_enabled(self, like: Any) -> bool:
        """Whether the framework records gradients now: True by default."""
        return True

    def in_backward(self, like: Any) -> bool:
        """Whether this thread runs a backward now (see `in_backward`): False by default."""
        return False

    def call_frame(self, frame: Any) -> Any:
        """The frame that runs a module call, from `frame`, the framework's frame that called
        one of its forward hooks (see `call_frame`): that frame itself by default, for a
        framework that calls the hooks inline (torch's ``inner``, paddle's layer call)."""
        return frame

    def forward_raised(self, frame: Any) -> bool:
        """Whether `frame` (see `call_frame`) calls an ``always_call`` forward hook because the
        forward raised (see `forward_raised`): False by default."""
        return False

    def tracing(self, like: Any) -> bool:
        """Whether this thread traces a forward into a graph (see `tracing`): False by
        default."""
        return False

    def is_leaf(self, t: Any) -> bool:
        """Whether `t` is a leaf of the autograd graph (see `is_leaf`): False by default."""
        return False

    def forward_hook_dicts(self, module: Any) -> tuple[Any, Any]:
        """`module`'s own forward pre-hook and forward hook dicts, ``(pre, post)``, each None
        where it has none (see `forward_hook_dicts`): ``(None, None)`` by default."""
        return (None, None)

    def float64_copy(self, module: Any) -> Any:
        """A float64 deep copy of a module, or None (the default: `compare` then runs without
        its exact reference)."""
        return None

    def float64_default(self, like: Any) -> ContextManager[None]:
        """See the function `float64_default`: a context that changes nothing by default."""
        return contextlib.nullcontext()

    # data parallelism: a backend without it runs as one process
    def unwrap(self, module: Any) -> Any:
        """The model inside a data-parallel wrapper: `module` by default."""
        return module

    def world(self, like: Any) -> tuple[int, int] | None:
        """``(rank, size)`` of the ranks splitting `like`'s batch: None (one process) by
        default."""
        return None

    def part(self, module: Any) -> Any:
        """`module` itself by default (no wrapper of one part of a model)."""
        return module

    def grad_sync(self, like: Any) -> bool | None:
        """Whether the data-parallel wrapper `like` all-reduces the gradients of a forward
        starting now: None (no such wrapper) by default."""
        return None

    def all_gather(self, vector: Any, like: Any) -> Any:
        """Called only where `world` is not None: required with it."""
        raise self._missing("all_gather")

    def after_backward(self, t: Any, fn: Callable[[], None]) -> None:
        """Called only where `world` is not None: required with it."""
        raise self._missing("after_backward")

    # uneven inputs (torch's `Join`): a backend without it has none
    def join_hook(self, like: Any, main: Callable[[], None], post: Callable[[], None]) -> Any:
        raise self._missing("join_hook")

    def join_context(self, like: Any) -> tuple[Any, Any]:
        raise self._missing("join_context")

    def notify_join(self, like: Any, joinable: Any) -> None:
        raise self._missing("notify_join")

    def on_join(self, like: Any, check: Callable[[], None]) -> Callable[[], None]:
        return _nothing  # (no Join: nothing to check)

    def join_being_built(self, like: Any) -> Any:
        return None


_cache: WeakIdentityKeys[Ops] = WeakIdentityKeys()


def ops_for(obj: object) -> Ops:
    """The Ops of the backend owning `obj` (cached per type, keeping no type alive)."""
    found = _cache.get(type(obj))
    if found is not None:
        return found
    found = plugin_manager().hook.unihook_ops(obj=obj)
    if found is None:
        raise NoBackendError(
            f"unihook.ops: expected a tensor or module of an installed backend. "
            f"Received: {type_name(obj)}."
        )
    _cache[type(obj)] = found
    return found


def is_tensor(obj: object) -> bool:
    """True for a tensor of any installed backend."""
    try:
        return ops_for(obj).is_tensor(obj)
    except NoBackendError:
        return False


def to_numpy(t: Any) -> Any:
    """A numpy copy of `t` (detached, on the CPU)."""
    return ops_for(t).to_numpy(t)


def detach(t: Any) -> Any:
    """`t` cut from the graph, sharing memory."""
    return ops_for(t).detach(t)


def clone(t: Any) -> Any:
    """A detached copy of `t`."""
    return ops_for(t).clone(t)


def zeros_like(t: Any) -> Any:
    return ops_for(t).zeros_like(t)


def sum(t: Any, axis: Axis = None, keepdim: bool = False) -> Any:  # noqa: A001 - numpy's name
    return ops_for(t).sum(t, axis, keepdim)


def mean(t: Any, axis: Axis = None, keepdim: bool = False) -> Any:
    return ops_for(t).mean(t, axis, keepdim)


def std(t: Any, axis: Axis = None, keepdim: bool = False) -> Any:
    """Population standard deviation (numpy's default, ddof=0) on every backend."""
    return ops_for(t).std(t, axis, keepdim)


def max(t: Any, axis: Axis = None, keepdim: bool = False) -> Any:  # noqa: A001
    return ops_for(t).max(t, axis, keepdim)


def min(t: Any, axis: Axis = None, keepdim: bool = False) -> Any:  # noqa: A001
    return ops_for(t).min(t, axis, keepdim)


def norm(t: Any, p: float = 2.0) -> Any:
    """The p-norm of all elements, a 0-d tensor."""
    return ops_for(t).norm(t, p)


def sum_squares(t: Any) -> float:
    """The sum of the squares of all elements, accumulated in float64 (the same number on every
    backend, where a float32 `norm` over a million elements is off by 1e-4 relative)."""
    return ops_for(t).sum_squares(t)


def is_floating(t: Any) -> bool:
    """Whether `t` holds real values (floating, complex or quantized), not integers or bools."""
    return ops_for(t).is_floating(t)


def moments(t: Any) -> Moments:
    """``(count, mean, m2, min, max, zeros, nonfinite)`` of `t`'s finite values, reduced on its
    device in float64 with the two-pass formula (m2: the sum of squared deviations from the
    mean; no E[x²] - mean² cancellation) and brought to the host in one transfer."""
    return ops_for(t).moments(t)


def cpu_moments(array: Any) -> Moments:
    """`moments` of a numpy array (a zero-copy view of a CPU tensor), in few vectorised passes
    without temporaries: min, max, then the sum and the sum of squares as BLAS dot products
    over rows of 256 values (32 partial sums a row, so float32 keeps about 1e-7 relative),
    added in float64. m2 = sum of squares - sum * mean when that cancels at most two bits
    (mean² <= 3 variances: ReLU, BatchNorm, most activations), the two-pass sum of squared
    deviations from the mean otherwise (1e5 +- 1e-3 takes it): never E[x²] - mean²'s
    cancellation. Zeros are counted only when min <= 0 <= max."""
    import numpy as np  # lazily: `import unihook` stays light

    a = _real(np, _flat(np.asarray(array)))
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float32 if a.dtype.kind == "f" else np.float64)
    n = a.size
    if not n:
        return 0, 0.0, 0.0, 0.0, 0.0, 0, 0
    low, high = float(a.min()), float(a.max())  # NaN propagates: finite bounds, finite values
    if -_BOUND < low and high < _BOUND:  # no sum below can overflow, even in float32
        return _bounded_moments(np, a, low, high)
    if -_INF < low and high < _INF:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow: the float64 path
            found = _bounded_moments(np, a, low, high)
        if -_INF < found[2] < _INF and -_INF < found[1] < _INF:
            return found
    # rare: NaN or Inf among the values (or a float32 sum overflowed): float64, finite values
    a = a.astype(np.float64)
    finite = a[np.isfinite(a)]
    nonfinite = a.size - finite.size
    if not finite.size:
        return 0, 0.0, 0.0, 0.0, 0.0, 0, nonfinite
    mean = finite.mean()
    m2 = float(np.square(finite - mean).sum())
    zeros = finite.size - int(np.count_nonzero(finite))
    return finite.size, float(mean), m2, float(finite.min()), float(finite.max()), zeros, nonfinite


def _bounded_moments(np: Any, a: Any, low: float, high: float) -> Moments:
    n = a.size
    if low == high:  # constant (a dead ReLU's zeros): exact, without a pass
        return n, low, 0.0, low, high, n if low == 0.0 else 0, 0
    total = _dot_rows(np, a, None)
    squares = _dot_rows(np, a, a)
    if a.dtype == np.float32 and squares < _TINY_SQUARE * n:  # squares under float32's range
        return _bounded_moments(np, a.astype(np.float64), low, high)
    mean = total / n
    m2 = squares - total * mean
    if not m2 >= 0.25 * squares:  # more than two bits would cancel: two-pass
        # The deviations from the mean rounded to the values' dtype are exact (Sterbenz):
        # their own mean corrects both that rounding (N(1, 1e-7) in float32 was 41 % off
        # in std) and the sum's.
        centre = a.dtype.type(mean)
        deviations = _scratch(np, a.dtype, n)
        np.subtract(a, centre, out=deviations)
        shift = _dot_rows(np, deviations, None) / n
        mean = float(centre) + shift
        m2 = _dot_rows(np, deviations, deviations) - n * shift * shift
        m2 = m2 if m2 > 0.0 else 0.0
    zeros = 0
    if low <= 0.0 <= high:
        # one call: summing the mask's bytes as uint64 lanes was a third faster on warm caches
        # but slower inside a training step, whose kernels leave numpy's code cold
        zeros = int(np.count_nonzero(np.equal(a, 0, out=_scratch(np, np.bool_, n))))
    return n, mean, m2, low, high, zeros, 0


def cpu_sum_squares(array: Any) -> float:
    """`sum_squares` of a numpy array: float32 dot products over rows of 256 values, added in
    float64 (`_dot_rows`), 3.5x faster than an exact float64 copy and dot. The terms are
    positive, so a row's float32 sum is off by at most 256 roundings, 1.5e-5 relative, and the
    norm (its square root) by 7.7e-6, under the 1e-5 promised across frameworks; on real
    gradients it is 1e-9 (`tests/test_recipes_models.py`). Where float32 would not hold (a
    square past its range, or squares so small that values under its normal range would
    weigh more than 1e-7 of the sum) the sum is redone exactly in float64."""
    import numpy as np

    a = _real(np, _flat(np.asarray(array)))
    if a.dtype not in (np.float32, np.float64):
        # float16 squares are exact in float32; integers and the rest go to float64
        a = a.astype(np.float32 if a.dtype == np.float16 else np.float64)
    quiet = _quiet_dot_rows(np)
    if a.dtype == np.float64:
        # (squares past float64's range, |x| over 1e154 or under 1e-154, give inf or 0)
        return quiet(np, a, a)
    total = quiet(np, a, a)  # an overflow goes to float64 below
    if _TINY_SQUARE * a.size <= total < _INF or (total == 0.0 and not a.any()):
        return total
    total = 0.0  # float64: a float32 square is exact in it, the summation is the only rounding
    for start in range(0, a.size, _BLOCK):
        part = a[start : start + _BLOCK]
        wide = _scratch(np, np.float64, part.size)
        np.copyto(wide, part, casting="unsafe")
        total += _dot_rows(np, wide, wide)
    return total


_quiet: list[Callable[..., float]] = []


def _quiet_dot_rows(np: Any) -> Callable[..., float]:
    """`_dot_rows` without overflow or underflow warnings: numpy's errstate as a decorator,
    made once (a `with np.errstate(...)` per call costs twice its time, a gradient hook's
    largest Python cost)."""
    if not _quiet:
        _quiet.append(np.errstate(over="ignore", under="ignore")(_dot_rows))
    return _quiet[0]


def slot_values(obj: Any) -> list[Any]:
    """The values of `obj`'s ``__slots__`` attributes that are set: what a class with slots
    keeps out of ``__dict__`` (``__slots__ = ("out",)``; `Ops.attribute_values` adds them:
    until 2026-12-04 an output a module kept there was not seen, helper-95's FINDING 10), read
    through the slots' own descriptors (a property or ``__getattr__`` of the class's is not
    run)."""
    cls = type(obj)  # (not `__class__`, which a proxy forwards)
    known = _slots.get(id(cls))
    if known is None or known[0]() is not cls:
        known = (weakref.ref(cls), _slot_places(cls))
        if len(_slots) >= _SLOTS_KEPT and id(cls) not in _slots:
            # full: the types gone go, or all (a rescan per call of a type left out cost
            # 1.8 ms: helper-122's FINDING 1)
            dead = [key for key, entry in list(_slots.items()) if entry[0]() is None]
            for key in dead or list(_slots):
                _slots.pop(key, None)
        _slots[id(cls)] = known
    if not known[1]:
        return []
    values, stale = _read_slots(obj, cls, known[1])
    if stale:
        # a base gone since, or not a base any more (its subclass given other bases:
        # helper-123's FINDING 3, helper-124's FINDING 2 where the old one lives on)
        known = _slots[id(cls)] = (known[0], _slot_places(cls))
        values, _ = _read_slots(obj, cls, known[1])
    return values


def _read_slots(
    obj: Any, cls: type, places: tuple[tuple[weakref.ref[type], str], ...]
) -> tuple[list[Any], bool]:
    """The values of `obj`'s slots at `places` that are set, and whether a place is stale."""
    values = []
    stale = False
    for owner, name in places:
        klass = owner()
        if klass is None:
            stale = True
            continue
        descriptor = vars(klass).get(name)
        # (the defining class's own descriptor: not one another class's put there, helper-122's
        # FINDING 3; found whatever the class's bases became since, its FINDING 2)
        if type(descriptor) is types.MemberDescriptorType and descriptor.__objclass__ is klass:
            try:
                values.append(descriptor.__get__(obj, cls))
            except AttributeError:  # (a slot not set)
                continue
            except TypeError:  # (`obj` is no `klass` now)
                stale = True
    return values, stale


def _slot_places(cls: type) -> tuple[tuple[weakref.ref[type], str], ...]:
    """Where the slots of `cls` and its bases are: (the class, weakly; name) of each member
    descriptor a class of its MRO with ``__slots__`` defines (read from the class, not from
    ``__slots__``, which may have been an iterator, or reassigned since; names as mangled; a C
    type's members are not slots: helper-122's FINDING 4; a class whose ``__slots__`` was
    deleted is read too: until 2026-12-04 it was not, helper-124's FINDING 6). The descriptors
    are not kept: they hold their class."""
    return tuple(
        (weakref.ref(klass), name)
        for klass in cls.__mro__
        if "__slots__" in vars(klass) or _defined_in_python(klass)
        for name, value in list(vars(klass).items())
        if type(value) is types.MemberDescriptorType and value.__objclass__ is klass
    )


_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8  # (CPython's type flags)


def _defined_in_python(klass: type) -> bool:
    """Whether `klass` is a class statement's (or ``type()``'s): a heap type that is not
    immutable. A C type is static, or, made from a spec (functools.partial since 3.11), marked
    immutable; its members are not slots."""
    flags = klass.__flags__
    return bool(flags & _HEAPTYPE) and not flags & _IMMUTABLETYPE


# `slot_values`' places by the type's id, with a weak reference to it (a type's own hash and
# equality may raise: see the recipes' `_kinds`), for at most `_SLOTS_KEPT` types at once
_slots: dict[int, tuple[weakref.ref[type], tuple[tuple[weakref.ref[type], str], ...]]] = {}
_SLOTS_KEPT = 4096


def _flat(a: Any) -> Any:
    """`a`'s values along one axis, in memory order: no copy where they fill one block in
    another order than C's (a channels_last activation or gradient, a transpose), whose
    `reshape(-1)` copied them (2.8x the moments' time, 8x the sum of squares'). The statistics
    do not depend on the order."""
    if a.ndim > 1 and not a.flags.c_contiguous:
        a = a.transpose(sorted(range(a.ndim), key=lambda axis: -a.strides[axis]))
    return a.reshape(-1)  # (a copy only where the values do not fill one block)


def _real(np: Any, a: Any) -> Any:
    """A complex array as its real and imaginary parts, side by side (|z|^2 = re^2 + im^2).
    (One not contiguous, `z[::2]`, is copied first: numpy views another dtype only then.)"""
    if a.dtype.kind != "c":  # (iscomplexobj: a Python call)
        return a
    return (a if a.flags.c_contiguous else np.ascontiguousarray(a)).view(a.real.dtype)


_INF = float("inf")
# |values| under this: a row of 256 squares of twice it (the two-pass deviations) stays under
# float32's max (3.4e38), so the sums need no overflow check
_BOUND = 5e17
_ROW = 256  # values per row of `_dot_rows`
_BLOCK = 1 << 19  # values per block of `cpu_sum_squares`: its buffer stays at 4 MB
# float32's smallest normal (1.18e-38) over 1e-7: a float32 sum of squares of n values at
# least n times this loses at most 1e-7 of itself to squares under the normal range
_TINY_SQUARE = 1.2e-31
_buffers = threading.local()  # per thread: hooks may run in several threads at once
_ones: dict[Any, Any] = {}


def _scratch(np: Any, dtype: Any, size: int) -> Any:
    """A per-thread buffer of `size` values of `dtype`, reused across calls (grown as needed)."""
    key = np.dtype(dtype).char
    buffer = _buffers.__dict__.get(key)
    if buffer is None or buffer.size < size:
        buffer = _buffers.__dict__[key] = np.empty(size, dtype)
    return buffer[:size]


def _dot_rows(np: Any, a: Any, b: Any) -> float:
    """sum(a * b) (b None: sum(a)) as a dot product per row of 256 values, the rows' results
    added in float64: a float32 sum or sum of squares to about 1e-7 relative, as fast as one
    pass (numpy's pairwise float32 sum is 3x slower).

    One BLAS call per row, never one over the whole array: OpenBLAS runs a dot over more than
    10,000 values (a gemv over more than 9,216) on its own thread pool, whose threads then spin
    against the framework's intra-op threads. With torch's default threads on 2 cores, one
    ddot per gradient made a training step 16x slower."""
    n = a.size
    body = n - n % _ROW
    total = 0.0
    if body:
        rows = a[:body].reshape(-1, _ROW)
        if b is None:  # a dot with ones per row (the same BLAS dot as the squares': a gemv
            # over stacked rows halves the calls, but its own kernel made a step slower)
            other = _ones.get(a.dtype)
            if other is None:
                other = _ones[a.dtype] = np.ones(_ROW, a.dtype)
        else:
            other = b[:body].reshape(-1, _ROW)
        if hasattr(np, "vecdot"):  # numpy >= 2: a BLAS dot per row
            per_row = np.vecdot(rows, other)
        else:  # numpy's own loop (einsum without `optimize` calls no BLAS)
            per_row = np.einsum("ij,j->i" if b is None else "ij,ij->i", rows, other)
        total = float(per_row.sum(dtype=np.float64))
    if body < n:
        tail = a[body:].astype(np.float64)
        total += float(tail.sum() if b is None else np.dot(tail, b[body:].astype(np.float64)))
    return total


def abs(t: Any) -> Any:  # noqa: A001
    return ops_for(t).abs(t)


def clamp(t: Any, min: float | None = None, max: float | None = None) -> Any:  # noqa: A002
    return ops_for(t).clamp(t, min, max)


def all_finite(t: Any) -> bool:
    """True when no element is NaN or infinite."""
    return ops_for(t).all_finite(t)


def dropout(t: Any, p: float, training: bool) -> Any:
    """Inverted dropout with probability `p` when `training`, the identity otherwise."""
    return ops_for(t).dropout(t, p, training)


def drop_block(t: Any, p: float, block_size: int = 7, training: bool = True) -> Any:
    """DropBlock (Ghiasi et al. 2018) on an NCHW tensor when `training`, identity otherwise."""
    shape = getattr(t, "shape", None) if is_tensor(t) else None
    if shape is None or len(shape) != 4:  # (Python's unpacking error: helper-126's FINDING 6)
        received = f"shape {tuple(shape)}" if shape is not None else type_name(t)
        raise HookArgumentError(
            f"unihook.ops.drop_block: expected a tensor of 4 dimensions (N, C, H, W). "
            f"Received: {received}"
        )
    return ops_for(t).drop_block(t, p, block_size, training)


def drop_block_rate(height: int, width: int, size: int, p: float) -> float:
    """The seed rate gamma at which DropBlock drops a fraction `p` of an `height` x `width` map
    in expectation, seeds drawn where a `size` block fits (Ghiasi et al. 2018). The paper's
    closed form ignores overlapping blocks (it drops 0.25 for p=0.3 with 7x7 blocks): this
    solves ``mean(1 - (1 - gamma) ** cover) = p`` for it, `cover` being how many seed positions
    cover each point."""
    return _drop_block_rate(height, width, size, float(p))


@functools.lru_cache(maxsize=256)
def _drop_block_rate(height: int, width: int, size: int, p: float) -> float:
    import numpy as np  # lazily: only DropBlock needs it

    def cover(n: int) -> Any:  # seed positions whose block covers each row (column)
        valid = n - size + 1
        i = np.arange(n)
        return np.minimum(i, valid - 1) - np.maximum(i - size + 1, 0) + 1

    counts = np.outer(cover(height), cover(width)).ravel()
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the dropped fraction grows with gamma, 1 at gamma = 1
        gamma = (low + high) / 2
        if np.mean(1 - (1 - gamma) ** counts) < p:
            low = gamma
        else:
            high = gamma
    return (low + high) / 2


def named_modules(module: Any) -> list[tuple[str, Any]]:
    """(qualified name, module) for `module` ("") and every submodule, depth first. A wrapper
    of one part of a model (torch: an FSDP1 unit, a checkpoint-wrapped submodule) stands for
    the part under the part's name, the module inside it left out (``0``, not ``0`` and
    ``0._fsdp_wrapped_module``); the part's submodules follow (``0.conv``). A compiled
    submodule is listed as the module inside (``torch.compile``'s wrapper runs no hooks inside
    another compiled region; the module inside is traced with its hooks)."""
    return ops_for(module).named_modules(module)


def children(module: Any) -> list[Any]:
    """`module`'s direct submodules (a part's wrapper: those of the wrapper itself)."""
    return ops_for(module).children(module)


def part(module: Any) -> Any:
    """The part of a model inside a wrapper of that part (torch: an FSDP1 unit's module, a
    compiled or checkpoint-wrapped submodule; see `named_modules`, which lists the wrapper for
    it), or `module` itself."""
    return ops_for(module).part(module)


def own_parameters(module: Any) -> list[tuple[Any, int, bool]]:
    """(parameter, element count, trainable) for each parameter `module` holds itself (not its
    submodules'; for a part's wrapper, see `named_modules`, the part's own too). BatchNorm
    running statistics are not parameters on any backend (paddle keeps them as non-trainable
    parameters, torch as buffers)."""
    return ops_for(module).own_parameters(module)


def attribute_values(module: Any) -> list[Any]:
    """The values of `module`'s attributes where code may keep a tensor (see
    `Ops.attribute_values`)."""
    return ops_for(module).attribute_values(module)


def tensors_in(value: Any, like: Any) -> list[Any]:
    """The tensors in `value` (a tensor, or a tuple, namedtuple, dict, list, dataclass or nested
    container of them), in order; `like` (a tensor or module) names the backend."""
    found: list[Any] = []

    def keep(t: Any) -> Any:
        found.append(t)
        return t

    ops_for(like).map_tensors(keep, value)
    return found


def as_tensor(array: Any, like: Any) -> Any:
    """A tensor of `like`'s backend, dtype and device holding the numpy `array`."""
    return ops_for(like).as_tensor(array, like)


def leaf(t: Any) -> Any:
    """A detached copy of `t` that requires grad: a fresh input to differentiate against."""
    return ops_for(t).leaf(t)


def grad_of(t: Any) -> Any:
    """The gradient accumulated on leaf `t` (``.grad``), or None."""
    return ops_for(t).grad_of(t)


def on_grad(t: Any, fn: Callable[[Any], None]) -> bool:
    """Call ``fn(grad)`` when the gradient of `t` is computed, for a hook that only reads it
    (returns None, keeps no reference): the framework's own tensor hook where the backend
    offers one that keeps an exception's type (torch and paddle: 2x and 3x to 7x cheaper per
    tensor than `register_tensor_hook`, whose checks, emulation and wrapper are for hooks that
    replace gradients), `register_tensor_hook` otherwise. Not removable: it goes with `t`.
    False, with nothing registered, when `t` gets no gradient (no_grad, a constant). `grad` is
    None where torch's engine passes None: on a branch only an unused output of a call with
    module backward hooks reaches (paddle: as torch)."""
    return bool(ops_for(t).on_grad(t, fn))


def forward_hook_dicts(module: Any) -> tuple[Any, Any]:
    """`module`'s own forward pre-hook and forward hook dicts, ``(pre, post)``: the ordered
    dicts (hook id -> hook) the framework runs them from, in their order, each None where the
    module has none yet. A recipe with `every` > 1, placing its hooks anew for each recorded
    forward, puts them back in their places there. ``(None, None)`` on a backend that does not
    say: the hooks placed anew then run after those registered since."""
    return ops_for(module).forward_hook_dicts(module)


def prepended_keys(module: Any, at: int) -> frozenset[int]:
    """The keys in `module`'s forward pre-hook (`at` 0) or forward hook (1) dict (see
    `forward_hook_dicts`) of the hooks unihook registered there with ``prepend=True``: placed
    anew, a recipe's hooks go after them wherever the dict's order cannot say (a hook the
    framework's own registration prepended cannot be told from one appended there)."""
    from ._prepended import prepended

    return prepended(module, at)


def is_leaf(t: Any) -> bool:
    """Whether `t` is a leaf of the autograd graph (a parameter, a tensor made by the user, or
    paddle's slice of a parameter over its whole range): a gradient hook on it (`on_grad`)
    fires in every later backward through it, not only in the running forward's. False where
    the backend cannot tell."""
    return bool(ops_for(t).is_leaf(t))


def version(t: Any) -> int | None:
    """`t`'s in-place version counter (bumped by every in-place op on it or its aliases), or
    None where the framework keeps none: equal versions of one tensor mean equal values."""
    return ops_for(t).version(t)


def object_version(t: Any) -> int | None:
    """The in-place counter of the tensor object `t` (bumped by in-place ops on it and its
    views), or None: what the recipes compare when a container returns its child's output
    object. `version` where the backend has no `object_version`; None on MindSpore, whose
    counter misses `t[i] = v` (its `version` is None too: an identity's alias keeps a counter
    of its own, so capture copies)."""
    found = ops_for(t)
    read = _object_versions.get(type(found))
    if read is None:  # once per backend: the recipes call this per output and forward
        kind = type(found)  # (the default's extra call skipped: it reads `version`)
        own = kind.object_version is not Ops.object_version
        read = _object_versions[kind] = kind.object_version if own else kind.version
    return read(found, t)


_object_versions: dict[type, Callable[[Any, Any], int | None]] = {}


def change_mark(t: Any, settled: bool = False) -> object:
    """A value that differs once an in-place op that autograd records changed the tensor object
    `t` (its autograd history: torch's `grad_fn`, paddle's and MindSpore's grad node; an op
    autograd does not record, under no_grad or on `.data`, leaves it, and the gradient reaching
    `t` still sums every use of it), or None where the backend cannot tell: what
    GradientMonitor compares before and after a module call that returns its argument
    (`object_version` by default). `settled`: read once every op issued so far ran; unsettled,
    a backend whose ops run in an asynchronous pipeline (MindSpore) may still show the mark
    from before an op issued earlier."""
    found = ops_for(t)
    if type(found).change_mark is Ops.change_mark:
        return object_version(t)
    return found.change_mark(t, settled)


def derived(tensors: Sequence[Any], arguments: Sequence[Any] = ()) -> bool | None:
    """Whether one of `tensors`, a module call's outputs, was computed from another (its
    autograd history reaches that one's): the gradient reaching that one then sums its use
    inside the call (`return f, f.sum()`) with the caller's, not its grad_output; what
    GradientMonitor asks of a module returning several tensors. `arguments`: the call's
    argument tensors, whose histories from before the call are not walked. None where the
    backend cannot tell (a long history not given as an argument; a traced call)."""
    return ops_for(tensors[0]).derived(tensors, arguments) if tensors else False


def derived_from(
    held: Sequence[Any],
    tensors: Sequence[Any],
    arguments: Sequence[Any] = (),
    since: object = None,
) -> bool | None:
    """Whether one of `held`, the objects a module holds as its call ends (its attributes'
    values, of any type), is a tensor computed from one of `tensors`, the call's outputs (or
    its arguments), and not one of them: a view kept (``self.out = y[:]``) or a value made
    from one (``y * 2``), whose reads the gradient reaching that tensor sums, where torch's
    hook on the call does not see them; what GradientMonitor asks of a module call.
    `arguments`: the call's argument tensors, whose histories are not walked; `since`: a
    `history_mark` taken as the call started, before which nothing made is walked (a path
    from what the call kept to what it got or made runs through what it made). None where the
    backend cannot tell."""
    if not tensors:
        return False
    return ops_for(tensors[0]).derived_from(held, tensors, arguments, since)


def history_mark(like: Any) -> object:
    """A mark of the autograd history this thread has made so far (torch: the sequence number
    its next autograd node gets), which `made_before` compares with; None where the backend
    cannot tell. `like`: a tensor or module of the backend."""
    return ops_for(like).history_mark()


def made_before(tensors: Sequence[Any], mark: object) -> bool | None:
    """Whether one of `tensors`, a module call's outputs, has an autograd history older than
    `mark` (`history_mark` as the call started): a tensor made before the call (a state an
    earlier layer set, `return self.mem`; an argument returned unchanged), whose gradient
    sums every use of it, not the call's grad_output; what GradientMonitor asks of a module's
    outputs. A leaf (a parameter) has no history and is not told. None where the backend
    cannot tell (no mark; a call traced by a compiler)."""
    if mark is None or not tensors:
        return None
    return ops_for(tensors[0]).made_before(tensors, mark)


def copy_into(buffer: Any, t: Any) -> Any:
    """`t`'s values in `buffer` when it has `t`'s shape and dtype (no allocation), else in a new
    detached copy; returns the tensor holding them."""
    return ops_for(t).copy_into(buffer, t)


def backward(t: Any) -> None:
    """``t.backward()`` for a scalar `t`: its hooks fire, the leaves accumulate gradients
    (``grad_of``). A backend with functional autograd (MindSpore) supplies its own."""
    ops_for(t).backward(t)


def forward_backward(
    fn: Callable[[Any], Any],
    x: Any,
    like: Any,
    input_grad: bool = False,
    caller: str = "unihook.ops.forward_backward",
) -> Any:
    """Run the forward ``fn(x)``, which returns a scalar, and the backward from it, in `like`'s
    framework (a tensor or module names it): hooks fire as in `backward`; the gradient with
    respect to `x` is returned when `input_grad` (`x` then a `leaf`), else None. For a recipe
    that runs its own backward: a framework whose autograd differentiates a function
    (MindSpore: ``mindspore.grad``) runs both there; elsewhere it is ``backward(fn(x))``, the
    leaves accumulating gradients. `caller` names the recipe in the backend's errors."""
    return ops_for(like).forward_backward(fn, x, input_grad, caller)


def grad_enabled(like: Any) -> bool:
    """Whether `like`'s framework (a tensor or a module names it) records gradients now: False
    under torch's ``no_grad`` / ``inference_mode`` and paddle's ``no_grad``."""
    return bool(ops_for(like).grad_enabled(like))


def call_frame(module: Any, frame: Any) -> Any:
    """The frame that runs `module`'s call, from `frame`, the framework's frame that called one
    of its forward hooks (the first below unihook's own): it runs as long as the call does, and
    ends with it also where a BaseException left the call, which no hook sees (the recipes'
    `every` tells such a forward by it). A framework that calls the hooks from a helper that
    returns before the forward (MindSpore's ``Cell._run_forward_pre_hook``) gives its caller."""
    return ops_for(module).call_frame(frame)


def forward_raised(module: Any, frame: Any) -> bool:
    """Whether `frame`, the frame running `module`'s call (`call_frame`), calls its
    ``always_call`` forward hooks because the forward raised. False where the framework does
    not tell it by the frame: the exception being handled tells then (``sys.exc_info()``,
    which torch.compile's code leaves empty)."""
    return bool(ops_for(module).forward_raised(frame))


def tracing(like: Any) -> bool:
    """Whether this thread traces a forward of `like`'s framework into a graph (torch's
    ``torch.jit.trace``, which runs the module again to check its graph, and wants the same
    hooks there): not a forward of the model for the recipes' `every`. False on a backend
    that cannot tell."""
    return bool(ops_for(like).tracing(like))


def in_backward(like: Any) -> bool:
    """Whether this thread runs a backward of `like`'s framework now: a module called there is
    an activation checkpoint's recomputation (torch's ``torch.utils.checkpoint``, paddle's
    ``recompute``), not a forward of the model. False on a backend that cannot tell."""
    return bool(ops_for(like).in_backward(like))


def float64_copy(module: Any) -> Any | None:
    """A deep copy of `module` (its hooks included, as the framework's own deep copy keeps
    them) whose floating parameters and buffers are float64, or None when the backend offers
    none. `compare` runs it as the exact reference of a float32 (or lower) model: how far each
    value of the model is from it is the model's own rounding error."""
    return ops_for(module).float64_copy(module)


def float64_default(like: Any) -> ContextManager[None]:
    """A context for a float64 copy's run: `like`'s framework creates floating tensors as
    float64 by default (a forward making a tensor with ``zeros(shape)``: an RNN cell's
    initial state), and its random state (CPU) is put back on leaving it, with the default
    dtype; a context that changes nothing where the backend offers none. The default is the
    framework's process-wide setting: other threads see it meanwhile."""
    return ops_for(like).float64_default(like)


# -- data parallelism: the framework's own process group and collectives, nothing of ours --


def unwrap(module: Any) -> Any:
    """The model inside a data-parallel wrapper (torch's DistributedDataParallel, DataParallel
    and FullyShardedDataParallel ``.module``, also inside ``torch.compile``'s OptimizedModule;
    paddle's DataParallel ``._layers``), or `module` itself: its qualified names are the
    model's, without the wrapper's prefix."""
    return ops_for(module).unwrap(module)


def world(like: Any) -> tuple[int, int] | None:
    """``(rank, world size)`` among the ranks that split `like`'s batch, when the framework's
    default process group is initialised, else None: a data-parallel wrapper's own group
    (torch's DistributedDataParallel / FullyShardedDataParallel ``process_group``, with its
    replicate group under hybrid sharding, ``fully_shard``'s device mesh, also inside
    ``torch.compile``; paddle's DataParallel ``group``), the default group for anything else
    (a tensor or a module names the framework). Never initialises one, nor imports the
    framework's distributed package."""
    return ops_for(like).world(like)


def all_gather(vector: Any, like: Any) -> Any:
    """Every rank's 1-D float64 numpy `vector` as a ``(world size, len(vector))`` numpy array,
    rows in the order of `world(like)`'s ranks: one ``all_gather`` of `like`'s framework over
    the group `world(like)` names (one per group for hybrid sharding; `world` must be non-None;
    every rank of it must call it with a vector of the same length, or the ranks wait for each
    other until the group's timeout, or gloo aborts)."""
    return ops_for(like).all_gather(vector, like)


def after_backward(t: Any, fn: Callable[[], None]) -> None:
    """Called from a gradient hook of `t` (`on_grad`, `register_tensor_hook`): run ``fn()``
    once the running backward pass is over, after the framework's own end-of-backward work
    (DistributedDataParallel's gradient all-reduce) and before ``backward()`` returns. An
    exception `fn` raises comes out of ``backward()`` with its own type."""
    ops_for(t).after_backward(t, fn)


def grad_sync(like: Any) -> bool | None:
    """Whether the data-parallel wrapper `like` all-reduces the gradients of the backward of a
    forward starting now: False inside its ``no_sync()`` (torch's DistributedDataParallel and
    FullyShardedDataParallel, paddle's DataParallel), True outside, None where `like` is no
    such wrapper. Ranks accumulating gradients unevenly differ here."""
    return ops_for(like).grad_sync(like)


def join_hook(like: Any, main: Callable[[], None], post: Callable[[], None]) -> Any:
    """For a recipe passed to torch's ``Join`` with `like` (a data-parallel wrapper or model):
    the framework's join hook, which runs ``main()`` on a rank that ran out of inputs once per
    iteration the other ranks still run, and ``post()`` once every rank ran out. From the
    first call on (every rank of `like`'s group makes it, building the same ``Join``),
    `all_gather` over `like`'s ranks runs on a process group of its own: there a rank that ran
    out runs the recipes' collectives beside the wrapper's, which the others run in between
    (see `unihook.recipes._scope._Joined`)."""
    return ops_for(like).join_hook(like, main, post)


def join_context(like: Any) -> tuple[Any, Any]:
    """``(device, process group)`` of the join context's own collectives for `like`: the
    wrapper's (every joinable of one ``Join`` must name the same group)."""
    return ops_for(like).join_context(like)


def on_join(like: Any, check: Callable[[], None]) -> Callable[[], None]:
    """Call ``check()`` each time `like` (a data-parallel wrapper) is passed to torch's
    ``Join``, before the wrapper's own join hook (every rank builds the same ``Join``: an error
    `check` raises is raised on every rank, before any collective). Returns the function that
    stops it; where `like` takes no ``Join``, one that does nothing."""
    return ops_for(like).on_join(like, check)


def join_being_built(like: Any) -> Any:
    """The ``Join`` whose construction runs on this thread (from a joinable's ``join_hook``, or
    `on_join`'s check), or None: the recipes of one ``Join`` are told apart by it."""
    return ops_for(like).join_being_built(like)


def _nothing() -> None:
    return None


def notify_join(like: Any, joinable: Any) -> None:
    """At the start of a forward of `like`: tell the join context that this rank has inputs
    still (the first joinable of a ``Join`` does; for the others it does nothing), and raise
    there where ``throw_on_early_termination`` and some rank ran out."""
    ops_for(like).notify_join(like, joinable)
