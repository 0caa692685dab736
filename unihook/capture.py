"""Capture activations (and gradients) of many modules for the length of a scope."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable

from . import api
from .compose import HookGroup, Where, select
from .ops import ops_for

__all__ = ["Capture", "capture"]


class Capture:
    """What `capture` records, by qualified module name.

    ``cache[name]``: the detached output of the module's last call; ``cache.calls(name)``: every
    call's, in order; ``cache.inputs[name]``: the last call's positional args (inputs=True);
    ``cache.grads[name]``: the last grad_output (grads=True; a tensor for a single-output
    module, else a tuple). `names` lists the modules hooked. The hooks go away when the scope
    exits (or on `remove()`); the recorded tensors then live only as long as this object.
    """

    def __init__(
        self,
        model: Any,
        where: Where = None,
        *,
        inputs: bool = False,
        outputs: bool = True,
        grads: bool = False,
    ) -> None:
        self._outputs: dict[str, list[Any]] = {}
        self.inputs: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        self._group = HookGroup()
        ops = ops_for(model)
        detach, is_tensor = ops.detach, ops.is_tensor

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
            for name, module in selected:
                if outputs or inputs:
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

    def _grad_hook(self, name: str, detached: Callable[[Any], Any]) -> Callable[..., None]:
        grads = self.grads

        def hook(module: Any, grad_output: Any) -> None:
            grads[name] = detached(grad_output[0] if len(grad_output) == 1 else grad_output)

        return hook

    def __getitem__(self, name: str) -> Any:
        calls = self._outputs.get(name)
        if not calls:
            raise KeyError(self._missing(name))
        return calls[-1]

    def __contains__(self, name: object) -> bool:
        return bool(self._outputs.get(name))  # type: ignore[arg-type]

    def calls(self, name: str) -> list[Any]:
        if name not in self._outputs:
            raise KeyError(self._missing(name))
        return list(self._outputs[name])

    def keys(self) -> list[str]:
        return [n for n in self.names if self._outputs.get(n)]

    def _missing(self, name: str) -> str:
        if name in self._outputs:
            return f"module {name!r} was hooked but has not run"
        return f"no module {name!r} was captured; captured: {', '.join(map(repr, self.names[:8]))}"

    def remove(self) -> None:
        """Remove every hook this capture placed (idempotent)."""
        self._group.remove()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def capture(
    model: Any,
    where: Where = None,
    *,
    inputs: bool = False,
    outputs: bool = True,
    grads: bool = False,
) -> Capture:
    """Record the outputs (and optionally inputs and grad_outputs) of the modules of `model`
    that `where` selects: ``with unihook.capture(model) as cache: model(x)``."""
    return Capture(model, where, inputs=inputs, outputs=outputs, grads=grads)
