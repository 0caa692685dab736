"""DropHook: dropout or DropBlock on named modules' outputs, in training mode only."""

from __future__ import annotations

from typing import Any, Mapping

from unihook import (
    ops,
    register_forward_hook,
    select,
)

from ._scope import Recipe

__all__ = ["DropHook"]

_MODES = ("dropout", "dropblock")


class DropHook(Recipe):
    """Inject dropout (``mode="dropout"``) or DropBlock (``mode="dropblock"``, NCHW outputs) on
    the outputs of the named modules, ``targets={"layer3": 0.1, "layer4": 0.3}``, while the
    model is in training mode; an identity in eval mode. The model trains as usual with its
    optimizer: nothing is wrapped or subclassed. Removable, and a context manager.
    """

    def __init__(
        self,
        model: Any,
        targets: Mapping[str, float],
        *,
        mode: str = "dropout",
        block_size: int = 7,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(
                f"`mode` must be one of {{'dropout', 'dropblock'}}. Received: mode={mode!r}"
            )
        for name, p in targets.items():
            if not 0.0 <= p < 1.0:
                raise ValueError(f"drop probability for {name!r} must be in [0, 1). Received: {p}")
        super().__init__()
        modules = dict(select(model, list(targets)))
        try:
            for name, p in targets.items():
                hook = self._dropout(p) if mode == "dropout" else self._drop_block(p, block_size)
                self._hooks.add(
                    name, register_forward_hook(modules[name], hook, when="train", name=name)
                )
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def _dropout(p: float) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            return ops.dropout(output, p, training=True)

        return hook

    @staticmethod
    def _drop_block(p: float, block_size: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            return ops.drop_block(output, p, block_size, training=True)

        return hook
