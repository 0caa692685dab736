"""Capture activations (and gradients) of many modules for the length of a scope."""

from __future__ import annotations

from typing import Any, Callable

from . import api
from .compose import HookGroup, Where, select
from .handles import Removable
from .ops import ops_for

__all__ = ["Capture", "capture"]


class Capture(Removable):
    """What `capture` records, by qualified module name.

    ``cache[name]``: the detached output of the module's last call; ``cache.calls(name)``: every
    call's, in order; ``cache.inputs[name]``: the last call's positional args (inputs=True);
    ``cache.grads[name]``: the last grad_output (grads=True; a tensor for a single-output
    module, else a tuple). `names` lists the modules hooked. The hooks go away when the scope
    exits (or on `remove()`); the recorded tensors then live only as long as this object.

    ``reuse=True`` is for repeated forwards: each forward of `model` copies every output into
    the buffers the previous forward filled (one per module call) instead of keeping the
    framework's own tensors alive, which costs most of a capture's time (allocation and page
    faults). `cache[name]` and `calls(name)` then hold the latest forward's outputs, valid
    until the next forward overwrites them (copy what you keep).
    """

    def __init__(
        self,
        model: Any,
        where: Where = None,
        *,
        inputs: bool = False,
        outputs: bool = True,
        grads: bool = False,
        reuse: bool = False,
    ) -> None:
        self._outputs: dict[str, list[Any]] = {}
        self._forwards = 0  # forwards of `model` seen (reuse: which buffers are current)
        self._filled: dict[str, list[int]] = {}  # reuse: name -> [forward, calls in it]
        self.inputs: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        self._group = HookGroup()
        ops = ops_for(model)
        detach, is_tensor = ops.detach, ops.is_tensor
        self._copy_into = ops.copy_into

        def detached(value: Any) -> Any:
            if is_tensor(value):
                return detach(value)
            if isinstance(value, (tuple, list)):
                return type(value)(detached(v) for v in value)
            if isinstance(value, dict):
                return {k: detached(v) for k, v in value.items()}
            return value

        selected = select(model, where)
        self.names = [name for name, _ in selected]
        try:
            if reuse:
                self._group.add("", api.register_forward_pre_hook(model, self._next_forward))
            for name, module in selected:
                if reuse and outputs:
                    hook = self._reusing_hook(name, inputs, detached, is_tensor)
                    self._group.add(name, api.register_forward_hook(module, hook, name=name))
                elif outputs or inputs:
                    hook = self._forward_hook(name, outputs, inputs, detached)
                    self._group.add(name, api.register_forward_hook(module, hook, name=name))
                if grads:
                    hook = self._grad_hook(name, detached)
                    self._group.add(
                        name, api.register_full_backward_pre_hook(module, hook, name=name)
                    )
        except BaseException:
            self._group.remove()
            raise

    def _forward_hook(
        self, name: str, outputs: bool, inputs: bool, detached: Callable[[Any], Any]
    ) -> Callable[..., None]:
        calls = self._outputs.setdefault(name, [])
        store_inputs = self.inputs

        if outputs and not inputs:

            def hook(module: Any, args: Any, output: Any) -> None:
                calls.append(detached(output))

        else:

            def hook(module: Any, args: Any, output: Any) -> None:
                if outputs:
                    calls.append(detached(output))
                store_inputs[name] = detached(args)

        return hook

    def _next_forward(self, module: Any, args: Any) -> None:
        self._forwards += 1

    def _reusing_hook(
        self,
        name: str,
        inputs: bool,
        detached: Callable[[Any], Any],
        is_tensor: Callable[[Any], bool],
    ) -> Callable[..., None]:
        buffers = self._outputs.setdefault(name, [])
        filled = self._filled.setdefault(name, [0, 0])
        copy_into = self._copy_into
        store_inputs = self.inputs

        def hook(module: Any, args: Any, output: Any) -> None:
            if filled[0] != self._forwards:
                filled[0], filled[1] = self._forwards, 0
            i = filled[1]
            filled[1] = i + 1
            if not is_tensor(output):
                value = detached(output)
            else:
                value = copy_into(buffers[i] if i < len(buffers) else None, output)
            if i < len(buffers):
                buffers[i] = value
            else:
                buffers.append(value)
            if inputs:
                store_inputs[name] = detached(args)

        return hook

    def _current(self, name: str) -> list[Any]:
        calls = self._outputs[name]
        filled = self._filled.get(name)
        return calls if filled is None else calls[: filled[1]]

    def _grad_hook(self, name: str, detached: Callable[[Any], Any]) -> Callable[..., None]:
        grads = self.grads

        def hook(module: Any, grad_output: Any) -> None:
            grads[name] = detached(grad_output[0] if len(grad_output) == 1 else grad_output)

        return hook

    def __getitem__(self, name: str) -> Any:
        calls = self._current(name) if name in self._outputs else None
        if not calls:
            raise KeyError(self._missing(name))
        return calls[-1]

    def __contains__(self, name: object) -> bool:
        return name in self._outputs and bool(self._current(name))  # type: ignore[arg-type]

    def calls(self, name: str) -> list[Any]:
        if name not in self._outputs:
            raise KeyError(self._missing(name))
        return list(self._current(name))

    def keys(self) -> list[str]:
        return [n for n in self.names if n in self]

    def _missing(self, name: str) -> str:
        if name in self._outputs:
            return f"module {name!r} was hooked but has not run"
        return f"no module {name!r} was captured; captured: {', '.join(map(repr, self.names[:8]))}"

    def remove(self) -> None:
        """Remove every hook this capture placed (idempotent)."""
        self._group.remove()


def capture(
    model: Any,
    where: Where = None,
    *,
    inputs: bool = False,
    outputs: bool = True,
    grads: bool = False,
    reuse: bool = False,
) -> Capture:
    """Record the outputs (and optionally inputs and grad_outputs) of the modules of `model`
    that `where` selects: ``with unihook.capture(model) as cache: model(x)``. See `Capture`
    for ``reuse=True``."""
    return Capture(model, where, inputs=inputs, outputs=outputs, grads=grads, reuse=reuse)
