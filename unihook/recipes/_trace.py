"""Run one model with hooks on every module and keep, as numpy, what `compare` needs: each
module call's output (in order of completion), each module call's grad_output and grad_input
(in backward order), the parameters in torch's layout, their gradients and their values after
each optimizer step. A `Trace` is what `dump` writes and `compare_dumps` reads."""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from unihook import HookGroup, attach, backend_of, capture, ops

from ._weights import entries

__all__ = ["Step", "Trace", "load", "run", "save"]

Arrays = list[Any]  # numpy arrays, None where a gradient slot is empty
Loss = Callable[[Any], Any]
Inputs = Any  # a tensor or array, a tuple/list of them (positional), or a dict (keywords)

# Warnings of module backward hooks that say nothing about the port: an integer input (token
# ids) needs no gradient; a module returning a non-tensor has no backward.
_QUIET = ("Full backward hook is firing", "For backward hooks to be called")


@dataclass
class Step:
    forward: list[str] = field(default_factory=list)  # a module name per call, by completion
    outputs: list[Arrays] = field(default_factory=list)  # the tensors each call returned
    backward: list[str] = field(default_factory=list)  # a name per backward, in backward order
    grad_outputs: list[Arrays] = field(default_factory=list)
    grad_inputs: list[Arrays] = field(default_factory=list)
    param_grads: Arrays = field(default_factory=list)  # per parameter entry (torch layout)
    updated: Arrays = field(default_factory=list)  # parameters after the optimizer step


@dataclass
class Trace:
    backend: str
    types: dict[str, str]  # qualified name -> class name, every module, in model order
    params: list[tuple[str, str, tuple[int, ...]]]  # (torch-style name, native name, shape)
    initial: Arrays  # parameter values before the first step
    steps: list[Step] = field(default_factory=list)


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
    when floating and `grad`, so every module sees an input gradient)."""
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


def _arrays(values: Sequence[Any]) -> Arrays:
    return [None if v is None else ops.to_numpy(v) for v in values]


def _objective(output: Any, model: Any, loss: Loss | None) -> Any:
    if loss is not None:
        return loss(output)
    sums = [t.sum() for t in ops.tensors_in(output, like=model) if _is_float(t)]
    if not sums:
        raise TypeError("compare: the model returned no floating-point tensor to backpropagate")
    return functools.reduce(lambda x, y: x + y, sums)


def _step(model: Any, inputs: Inputs, loss: Loss | None, backward: bool) -> Step:
    step = Step()

    def on_forward(module: Any, args: Any, output: Any, *, name: str) -> None:
        step.forward.append(name)

    def on_backward(module: Any, grad_input: Any, grad_output: Any, *, name: str) -> None:
        # as numpy now: paddle accumulates into gradient tensors in place later in backward
        step.backward.append(name)
        step.grad_outputs.append(_arrays(grad_output))
        step.grad_inputs.append(_arrays(grad_input))

    args, kwargs = _call_args(inputs, model, backward)
    hooks = HookGroup()
    with warnings.catch_warnings():
        for message in _QUIET:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        # capture keeps each output as returned, whatever in-place op follows the module
        with capture(model) as cache, hooks:
            hooks.extend(attach(model, on_forward, kind="forward"))
            if backward:
                hooks.extend(attach(model, on_backward, kind="full_backward"))
            output = model(*args, **kwargs)
            calls = {name: cache.calls(name) for name in dict.fromkeys(step.forward)}
            seen: dict[str, int] = {}
            for name in step.forward:
                k = seen[name] = seen.get(name, -1) + 1
                step.outputs.append(_arrays(ops.tensors_in(calls[name][k], like=model)))
            if backward:
                _objective(output, model, loss).backward()
    return step


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
    backward (it steps and clears the gradients)."""
    params = entries(model)
    trace = Trace(
        backend_of(model),
        {name: type(m).__name__ for name, m in ops.named_modules(model)},
        [(e.name, e.native, e.shape) for e in params],
        [e.read() for e in params],
    )
    for _ in range(steps):
        # the gradients this backward adds: parameters may hold some from earlier backwards
        before = [e.grad() for e in params] if backward else []
        step = _step(model, inputs, loss, backward)
        if backward:
            after = [e.grad() for e in params]
            step.param_grads = [
                g if g is None or b is None else g - b for g, b in zip(after, before)
            ]
        if optimizer is not None:
            optimizer()
            step.updated = [e.read() for e in params]
        trace.steps.append(step)
    return trace


# -- on disk: one .npz, the arrays under generated keys, the rest as JSON --------------------

_LISTS = ("outputs", "grad_outputs", "grad_inputs")


def save(trace: Trace, path: Any) -> None:
    arrays: dict[str, Any] = {}

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
        record: dict[str, Any] = {"forward": step.forward, "backward": step.backward}
        for what in _LISTS:
            record[what] = [keys(v) for v in getattr(step, what)]
        record["param_grads"] = keys(step.param_grads)
        record["updated"] = keys(step.updated)
        steps.append(record)
    meta = {
        "version": 1,
        "backend": trace.backend,
        "types": list(trace.types.items()),
        "params": [[n, native, list(shape)] for n, native, shape in trace.params],
        "initial": keys(trace.initial),
        "steps": steps,
    }
    with open(path, "wb") as f:  # exactly `path`: np.savez would append ".npz" to a name
        arrays["__meta__"] = np.array(json.dumps(meta))
        np.savez(f, **arrays)


def load(path: Any) -> Trace:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))

        def values(keys: list[str | None]) -> Arrays:
            return [None if k is None else data[k] for k in keys]

        trace = Trace(
            meta["backend"],
            dict((n, t) for n, t in meta["types"]),
            [(n, native, tuple(shape)) for n, native, shape in meta["params"]],
            values(meta["initial"]),
        )
        for record in meta["steps"]:
            step = Step(record["forward"], backward=record["backward"])
            for what in _LISTS:
                setattr(step, what, [values(k) for k in record[what]])
            step.param_grads = values(record["param_grads"])
            step.updated = values(record["updated"])
            trace.steps.append(step)
    return trace
