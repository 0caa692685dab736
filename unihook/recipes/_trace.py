"""Run one model with hooks on every module and keep, as numpy, what `compare` needs: each
module call's output (in order of completion), each module call's grad_output and grad_input
(in backward order, with the call each answers), the parameters in torch's layout, their
gradients and their values after each optimizer step. A `Trace` is what `dump` writes and
`compare_dumps` reads."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from unihook import (
    HookGroup,
    NoGradError,
    attach,
    backend_of,
    capture,
    ops,
    register_tensor_hook,
)

from ._weights import entries

__all__ = ["Runner", "Step", "Trace", "load", "run", "save", "widen"]

Arrays = list[Any]  # numpy arrays, None where a gradient slot is empty
Loss = Callable[[Any], Any]
Inputs = Any  # a tensor or array, a tuple/list of them (positional), or a dict (keywords)
# (module, call, "out" or "in") -> the gradient each output or positional argument received
Seen = dict[tuple[str, int, str], Arrays]

# Warnings of module backward hooks that say nothing about the port: an integer input (token
# ids) needs no gradient; a module returning a non-tensor has no backward.
_QUIET = ("Full backward hook is firing", "For backward hooks to be called")


@dataclass
class Step:
    forward: list[str] = field(default_factory=list)  # a module name per call, by completion
    outputs: list[Arrays] = field(default_factory=list)  # the tensors each call returned
    # per call: the calls (indices into `forward`) whose outputs it took as inputs, and the
    # largest finite magnitude among its floating inputs no module produced (the model's
    # inputs): from both, `compare` follows how large the values are that reach each module,
    # the scale of the rounding noise its output (and gradients) can carry
    sources: list[list[int]] = field(default_factory=list)
    input_scales: list[float] = field(default_factory=list)
    # per call: the keys of the dicts in its output, in `_leaves`' order ("" without a dict):
    # two outputs whose dicts' keys differ pair their tensors by sorted position, not by key
    keys: list[str] = field(default_factory=list)
    backward: list[str] = field(default_factory=list)  # a name per backward, in backward order
    backward_calls: list[int] = field(default_factory=list)  # the forward call each answers
    grad_outputs: list[Arrays] = field(default_factory=list)
    grad_inputs: list[Arrays] = field(default_factory=list)
    param_grads: Arrays = field(default_factory=list)  # per parameter entry (torch layout)
    updated: Arrays = field(default_factory=list)  # parameters and buffers after the step
    # parameters and buffers before the step: None where they are the previous step's
    # `updated` (or `initial`), as in every dump; set by `compare` after it re-synced b to a
    start: Arrays | None = None
    # with an optimizer, the parameter entries whose .grad held a nonzero gradient before the
    # backward (it steps on that too: a step that did not clear it, a stale one)
    carried: list[int] = field(default_factory=list)


@dataclass
class Trace:
    backend: str
    types: dict[str, str]  # qualified name -> class name, every module, in model order
    params: list[tuple[str, str, tuple[int, ...]]]  # (torch-style name, native name, shape)
    initial: Arrays  # parameter values before the first step
    steps: list[Step] = field(default_factory=list)
    backward: bool = True  # whether the run had a backward
    # parameters whose .grad was nonzero before a run with an optimizer (it consumed it too)
    stale: list[str] = field(default_factory=list)
    optimized: bool = False  # whether an optimizer stepped after each backward
    # a dump's float64 run of the same model (`compare`'s reference), or why there is none
    reference: Trace | None = None
    reference_note: str = "none: not dumped"


def _is_float(t: Any) -> bool:
    return "float" in str(t.dtype)  # torch.float32, paddle.float32, bfloat16...


def _float_like(model: Any) -> Any:
    for p in model.parameters():
        if _is_float(p):
            return p
    raise TypeError(
        "compare: numpy inputs are converted to the dtype of the model's parameters, and this "
        "model has no floating-point parameter: pass tensors"
    )


def _convert(value: Any, model: Any, backend: str, grad: bool) -> Any:
    """`value` as an input of `model`: a tensor of its framework (a fresh leaf requiring grad
    when floating and `grad`, so every module sees an input gradient); lists, tuples and dicts
    of them converted item by item."""
    if isinstance(value, Mapping):
        return {k: _convert(v, model, backend, grad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_convert(v, model, backend, grad) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if ops.is_tensor(value) and backend_of(value) == backend:
        return ops.leaf(value) if grad and _is_float(value) else value
    if ops.is_tensor(value):
        value = ops.to_numpy(value)
    if not isinstance(value, np.ndarray):
        return value
    if value.dtype.kind != "f":
        raise TypeError(
            f"compare: a numpy input of dtype {value.dtype} cannot be converted without naming "
            "the framework's dtype: pass tensors of each framework (inputs_a and inputs_b)"
        )
    tensor = ops.as_tensor(value, like=_float_like(model))
    return ops.leaf(tensor) if grad else tensor


def widen(value: Inputs) -> Inputs:
    """`value` (inputs as `compare` takes them) with every floating tensor or array as a
    float64 numpy array, which `_convert` makes a tensor of a float64 model's dtype."""
    if isinstance(value, Mapping):
        return {k: widen(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [widen(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if ops.is_tensor(value) and _is_float(value):
        value = ops.to_numpy(value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(np.float64)
    return value


def _call_args(inputs: Inputs, model: Any, grad: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    backend = backend_of(model)
    if isinstance(inputs, dict):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}
    args = tuple(_convert(v, model, backend, grad) for v in args)
    return args, {k: _convert(v, model, backend, grad) for k, v in kwargs.items()}


def dict_keys(value: Any) -> str:
    """The keys of the dicts in `value`, nested as `_leaves` walks it ("" when it has none):
    ``{bbox, score}``; a dict inside a tuple ``({a, b}, {c})``."""
    if ops.is_tensor(value):
        return ""
    if isinstance(value, Mapping):
        keys = sorted(value, key=str)
        inner = [dict_keys(value[k]) for k in keys]
        return "{" + ", ".join(f"{k}: {i}" if i else str(k) for k, i in zip(keys, inner)) + "}"
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return ""
    inner = [dict_keys(item) for item in items]
    return f"({', '.join(inner)})" if any(inner) else ""


def _leaves(value: Any) -> list[Any]:
    """The tensors in `value` (a tensor, or a tuple, namedtuple, list, dict, dataclass or nested
    container of them) in an order both frameworks share: dict keys sorted (paddle's flatten
    sorts them where torch keeps insertion order)."""
    if ops.is_tensor(value):
        return [value]
    if isinstance(value, Mapping):
        items = [value[k] for k in sorted(value, key=str)]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return []
    return [t for item in items for t in _leaves(item)]


# Modules whose two ports return different structures for the same values. Paddle's RNN cells
# return (h, states): LSTMCell (h, (h, c)), GRUCell and SimpleRNNCell (h, h); torch's return
# the states only, (h, c) or h. MultiheadAttention: torch returns (output, averaged weights)
# unless need_weights=False, paddle the output alone unless need_weights=True (then per-head
# weights): only the output is compared, and backpropagated by the default loss.
PADDLE_CELLS = {"lstmcell", "grucell", "simplernncell"}
FIRST_ONLY = {"multiheadattention"}


def adapt_leaves(backend: str, type_name: str, values: list[Any]) -> list[Any]:
    """A module's output tensors (`_leaves`) as the other framework's port returns them."""
    key = type_name.lower()
    if key in FIRST_ONLY:
        return values[:1]
    if backend == "paddle" and key in PADDLE_CELLS and len(values) > 1:
        # the leading h kept: paddle's backward hook sees the gradient of the tuple's items,
        # not of the tensors nested in the states
        return values[:1] + values[2:]
    return values


def _arrays(values: Sequence[Any]) -> Arrays:
    return [None if v is None else ops.to_numpy(v) for v in values]


# The default loss projects every floating output tensor on a fixed random tensor (PaDiff's
# choice): its gradient is a generic direction, where `output.sum()` gives gradients that
# vanish in exact arithmetic behind a train-mode BatchNorm (a normalized output sums to a
# constant), leaving rounding noise to compare. Seeded, so both models get the same one.
PROJECTION_SEED = 0


def _objective(output: Any, loss: Loss | None, model: Any) -> Any:
    if loss is not None:
        return loss(output)
    rng = np.random.default_rng(PROJECTION_SEED)
    leaves = adapt_leaves(backend_of(model), type(model).__name__, _leaves(output))
    terms = [
        (t * ops.as_tensor(rng.standard_normal(tuple(t.shape)).astype(np.float32), like=t)).sum()
        for t in leaves
        if _is_float(t)
    ]
    if not terms:
        raise TypeError("compare: the model returned no floating-point tensor to backpropagate")
    return functools.reduce(lambda x, y: x + y, terms)


def _calls_answered(step: Step, counts: dict[str, int], seen: Seen) -> list[int]:
    """The forward call each backward of `step` answers. A module called several times has its
    backwards in an order the framework chooses (independent branches run in any order): each
    answers the call whose output gradients (`seen`, from tensor hooks on each call's outputs)
    equal its grad_output, and among calls whose output gradients tie (two branches summed),
    whose input gradients equal its grad_input; without a match, the k-th backward answers
    the (n-1-k)-th call. Calls still tied have the same gradients: either is right."""
    taken: dict[str, set[int]] = {}
    backwards: dict[str, int] = {}
    out = []
    for name, grad_output, grad_input in zip(step.backward, step.grad_outputs, step.grad_inputs):
        k = backwards[name] = backwards.get(name, -1) + 1
        n = counts.get(name, 0)
        used = taken.setdefault(name, set())
        pool = [c for c in range(n) if c not in used]
        pool = [c for c in pool if _same(seen.get((name, c, "out")), grad_output)] or pool
        pool = [c for c in pool if _same(seen.get((name, c, "in")), grad_input)] or pool
        default = n - 1 - k
        call = default if default in pool or not pool else pool[-1]
        used.add(call)
        out.append(call)
    return out


def _same(recorded: Arrays | None, grads: Arrays) -> bool:
    if not recorded or len(recorded) > len(grads) or all(r is None for r in recorded):
        return False
    return all(
        r is None or (g is not None and np.array_equal(r, g)) for r, g in zip(recorded, grads)
    )


def _where(t: Any) -> Any:
    """A tensor's memory and shape: the same for the tensor a module returned and the one the
    next module receives, though hooks (torch's backward hooks) hand it on as a new object."""
    try:
        return (int(t.data_ptr()), tuple(t.shape), str(t.dtype))
    except (AttributeError, RuntimeError, ValueError):
        return id(t)


def _input_scale(tensors: list[Any]) -> float:
    """The largest finite magnitude among the floating `tensors` (0.0: none)."""
    scale = 0.0
    for t in tensors:
        if _is_float(t) and int(np.prod(t.shape)) > 0:
            value = np.abs(ops.to_numpy(t))
            finite = value[np.isfinite(value)]
            scale = max(scale, float(finite.max(initial=0.0)))
    return scale


def _backward(objective: Any, model: Any) -> None:
    try:
        objective.backward()
    except RuntimeError as error:
        if backend_of(model) != "paddle" or "holds no memory" not in str(error):
            raise
        rnns = [n or "(model)" for n, m in ops.named_modules(model) if _is_rnn(m)]
        raise RuntimeError(
            "compare: paddle could not run the backward of this model ("
            + str(error).split("\n")[0].strip()
            + "). Paddle's RNN layers keep no state for a backward in eval mode"
            + (f" ({', '.join(rnns[:4])} here)" if rnns else "")
            + ": compare forward only (backward=False), or in train mode (with dropout off)"
        ) from error


def _is_rnn(module: Any) -> bool:
    return any(c.__name__ in ("RNNBase", "RNN", "BiRNN") for c in type(module).__mro__)


def _step(model: Any, inputs: Inputs, loss: Loss | None, backward: bool) -> Step:
    step = Step()
    counts: dict[str, int] = {}
    seen: Seen = {}
    produced: dict[Any, tuple[Any, int]] = {}  # _where(tensor) -> (tensor, the call returning it)
    hooks = HookGroup()  # removed on leaving the block below, the tensor hooks too

    def on_grad(key: tuple[str, int, str], slot: int, n: int, grad: Any) -> None:
        if counts[key[0]] > 1:  # only a module called several times needs its calls told apart
            seen.setdefault(key, [None] * n)[slot] = ops.to_numpy(grad)

    def watch(key: tuple[str, int, str], items: Sequence[Any]) -> None:
        for slot, t in enumerate(items):
            if ops.is_tensor(t):
                try:
                    hook = functools.partial(on_grad, key, slot, len(items))
                    hooks.add(key[0], register_tensor_hook(t, hook))
                except NoGradError:
                    pass  # no gradient flows through this one

    def on_forward(module: Any, args: Any, output: Any, *, name: str) -> None:
        if ops.in_backward(module):  # a checkpoint's recomputation: not a forward
            return
        call = counts[name] = counts.get(name, 0) + 1
        step.forward.append(name)
        index = len(step.forward) - 1
        found, free = [], []
        for t in _leaves(args):
            source = produced.get(_where(t))
            if source is not None:
                found.append(source[1])
            else:
                free.append(t)
        step.sources.append(sorted(set(found)))
        step.input_scales.append(_input_scale(free))
        for t in _leaves(output):
            # the tensor held, so its memory is not reused for another meanwhile
            produced[_where(t)] = (t, index)
        if backward:
            # the slots of the module backward hook: a tuple output's items (or the tensor),
            # the positional arguments (as the module got them: the backward hook's own)
            watch((name, call - 1, "out"), output if isinstance(output, tuple) else (output,))
            watch((name, call - 1, "in"), args)

    def on_backward(module: Any, grad_input: Any, grad_output: Any, *, name: str) -> None:
        # as numpy now: paddle accumulates into gradient tensors in place later in backward
        step.backward.append(name)
        step.grad_outputs.append(_arrays(grad_output))
        step.grad_inputs.append(_arrays(grad_input))

    args, kwargs = _call_args(inputs, model, backward)
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        # capture keeps each output as returned, whatever in-place op follows the module
        with capture(model) as cache, hooks:
            hooks.extend(attach(model, on_forward, kind="forward"))
            if backward:
                hooks.extend(attach(model, on_backward, kind="full_backward"))
            output = model(*args, **kwargs)
            calls = {name: cache.calls(name) for name in counts}
            done: dict[str, int] = {}
            for name in step.forward:
                k = done[name] = done.get(name, -1) + 1
                step.outputs.append(_arrays(_leaves(calls[name][k])))
                step.keys.append(dict_keys(calls[name][k]))
            if backward:
                _backward(_objective(output, loss, model), model)
                step.backward_calls = _calls_answered(step, counts, seen)
    return step


class Runner:
    """Trace a model step by step (`step()`), as `run` does at once: `compare` interleaves the
    two models' steps to re-sync b's parameters to a's between them."""

    def __init__(
        self,
        model: Any,
        inputs: Inputs,
        *,
        loss: Loss | None = None,
        backward: bool = True,
        optimizer: Callable[[], Any] | None = None,
    ) -> None:
        self.model, self.inputs, self.loss = model, inputs, loss
        self.backward, self.optimizer = backward, optimizer
        self.params = entries(model)
        self.trace = Trace(
            backend_of(model),
            {name: type(m).__name__ for name, m in ops.named_modules(model)},
            [(e.name, e.native, e.shape) for e in self.params],
            [e.read() for e in self.params],
            backward=backward,
            optimized=optimizer is not None,
        )
        if optimizer is not None and backward:
            self.trace.stale = self.stale()

    def stale(self) -> list[str]:
        """The parameters that hold a nonzero gradient already: an optimizer would consume it
        with the next backward's."""
        found = []
        for e in self.params:
            g = e.grad()
            if g is not None and np.any(g != 0):
                found.append(e.native)
        return found

    def step(self, start: Arrays | None = None) -> Step:
        """One forward (and backward, and optimizer step); `start`: the values the parameters
        were set to since the last step (None: they are where the last step left them)."""
        params = self.params
        # the gradients this backward adds: parameters may hold some from earlier backwards
        before = [e.grad() for e in params] if self.backward else []
        step = _step(self.model, self.inputs, self.loss, self.backward)
        step.start = start
        if self.backward:
            after = [e.grad() for e in params]
            # with an optimizer, the whole .grad it steps on (with what earlier backwards left
            # there); without, what this backward added
            step.param_grads = [
                g if g is None or b is None or self.optimizer is not None else g - b
                for g, b in zip(after, before)
            ]
            if self.optimizer is not None:
                step.carried = [i for i, b in enumerate(before) if b is not None and np.any(b)]
        if self.optimizer is not None:
            self.optimizer()
        # with or without an optimizer: the forward moved the buffers (running statistics)
        step.updated = [e.read() for e in params]
        self.trace.steps.append(step)
        return step

    def restore(self) -> None:
        """Without an optimizer the parameters did not move, but a train-mode BatchNorm's
        running statistics did: put them back, so the next run starts where this one did."""
        if self.optimizer is None:
            for entry, value in zip(self.params, self.trace.initial):
                entry.write(value)


def run(
    model: Any,
    inputs: Inputs,
    *,
    loss: Loss | None = None,
    backward: bool = True,
    steps: int = 1,
    optimizer: Callable[[], Any] | None = None,
) -> Trace:
    """Trace `steps` forward (and backward) passes of `model`, calling `optimizer()` after each
    backward (it steps and clears the gradients). Without `optimizer`, parameters and buffers
    are restored afterwards; the gradients the backward added stay in ``.grad``."""
    runner = Runner(model, inputs, loss=loss, backward=backward, optimizer=optimizer)
    try:
        for _ in range(steps):
            runner.step()
    finally:
        runner.restore()
    return runner.trace


# -- on disk: one .npz, the arrays under generated keys, the rest as JSON --------------------

_LISTS = ("outputs", "grad_outputs", "grad_inputs")
VERSION = 3  # 2: each backward records the forward call it answers; 3: the reference run
READS = (2, 3)


def save(trace: Trace, path: Any) -> None:
    arrays: dict[str, Any] = {}
    meta = _meta(trace, arrays)
    if trace.reference is not None:
        meta["reference"] = _meta(trace.reference, arrays)
    meta["reference_note"] = trace.reference_note
    with open(path, "wb") as f:  # exactly `path`: np.savez would append ".npz" to a name
        arrays["__meta__"] = np.array(json.dumps(meta))
        np.savez(f, **arrays)


def _meta(trace: Trace, arrays: dict[str, Any]) -> dict[str, Any]:
    """`trace` as JSON, its arrays put in `arrays` under generated keys."""

    def keys(values: Arrays) -> list[str | None]:
        out: list[str | None] = []
        for value in values:
            key = None if value is None else f"a{len(arrays)}"
            if key is not None:
                arrays[key] = value
            out.append(key)
        return out

    steps = []
    for step in trace.steps:
        record: dict[str, Any] = {
            "forward": step.forward,
            "backward": step.backward,
            "backward_calls": step.backward_calls,
        }
        for what in _LISTS:
            record[what] = [keys(v) for v in getattr(step, what)]
        record["input_scales"] = step.input_scales
        record["sources"] = step.sources
        record["keys"] = step.keys
        record["carried"] = step.carried
        record["param_grads"] = keys(step.param_grads)
        record["updated"] = keys(step.updated)
        if step.start is not None:
            record["start"] = keys(step.start)
        steps.append(record)
    return {
        "version": VERSION,
        "backend": trace.backend,
        "types": list(trace.types.items()),
        "params": [[n, native, list(shape)] for n, native, shape in trace.params],
        "initial": keys(trace.initial),
        "backward": trace.backward,
        "stale": trace.stale,
        "optimized": trace.optimized,
        "steps": steps,
    }


def load(path: Any) -> Trace:
    """The `Trace` in a file `save` wrote; a clear error for any other file."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"compare_dumps: `path` must name an existing file. Received: {os.fspath(path)!r}"
        ) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:  # not numpy, a pickle
        raise ValueError(_not_a_dump(path, f"not an .npz archive ({error})")) from None
    if not isinstance(data, np.lib.npyio.NpzFile):  # a bare .npy array
        raise ValueError(_not_a_dump(path, "a single array, not an .npz archive"))
    with data:
        if "__meta__" not in data.files:
            raise ValueError(_not_a_dump(path, "no unihook metadata in it"))
        try:
            meta = json.loads(str(data["__meta__"]))
            version = meta.get("version") if isinstance(meta, dict) else None
        except ValueError as error:  # an object array, or not JSON
            raise ValueError(_not_a_dump(path, f"unreadable metadata ({error})")) from None
        if version not in READS:
            raise ValueError(
                _not_a_dump(path, f"format version {version!r}, this reads {list(READS)}")
            )
        try:
            trace = _trace(meta, data)
        except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile) as error:
            # damaged (a bad CRC) or edited by hand
            raise ValueError(_not_a_dump(path, f"{type(error).__name__}: {error}")) from None
        trace.reference_note = str(meta.get("reference_note", trace.reference_note))
        if meta.get("reference") is None:
            if not trace.reference_note.startswith(("none", "off")):
                trace.reference_note = "none: not in the file"
            return trace
        try:
            trace.reference = _trace(meta["reference"], data)
        except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile) as error:
            # the run itself is there: it is compared without its reference
            trace.reference_note = f"none: the reference in the file is unreadable ({error})"
        return trace


def _trace(meta: dict[str, Any], data: Any) -> Trace:
    def values(keys: list[str | None]) -> Arrays:
        return [None if k is None else data[k] for k in keys]

    trace = Trace(
        meta["backend"],
        dict((n, t) for n, t in meta["types"]),
        [(n, native, tuple(shape)) for n, native, shape in meta["params"]],
        values(meta["initial"]),
        backward=bool(meta.get("backward", True)),
        stale=list(meta.get("stale", [])),
        optimized=bool(meta.get("optimized", False)),
    )
    for record in meta["steps"]:
        step = Step(record["forward"], backward=record["backward"])
        step.backward_calls = record["backward_calls"]
        for what in _LISTS:
            setattr(step, what, [values(k) for k in record[what]])
        scales = record.get("input_scales") or [0.0] * len(step.forward)
        step.input_scales = [float(v) for v in scales]
        step.sources = [[int(i) for i in v] for v in record.get("sources") or []]
        step.keys = [str(k) for k in record.get("keys") or []]
        step.carried = [int(i) for i in record.get("carried") or []]
        step.param_grads = values(record["param_grads"])
        if "start" in record:
            step.start = values(record["start"])
        step.updated = values(record["updated"])
        trace.steps.append(step)
    if "backward" not in meta:  # format 2 before it said so
        trace.backward = any(step.backward or step.param_grads for step in trace.steps)
    return trace


def _not_a_dump(path: Any, why: str) -> str:
    return (
        f"compare_dumps: `path` must be a file written by unihook.recipes.dump. Received: "
        f"{os.fspath(path)!r}: {why}"
    )
