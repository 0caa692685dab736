"""DropHook: dropout or DropBlock on named modules' outputs, in training mode only."""

from __future__ import annotations

import functools
from typing import Any, Mapping

from unihook import (
    HookArgumentError,
    HookTargetError,
    backend_of,
    ops,
    register_forward_hook,
)

from ._scope import Recipe, Targets, resolve

__all__ = ["DropHook"]

_MODES = ("dropout", "dropblock")


class DropHook(Recipe):
    """Inject dropout (``mode="dropout"``) or DropBlock (``mode="dropblock"``, NCHW outputs) on
    the outputs of target modules while the model is in training mode; an identity in eval
    mode. The model trains as usual with its optimizer: nothing is wrapped or subclassed.
    The drop runs before the module's other forward hooks (``prepend``), whenever they were
    registered: they and the recipes see the output the call returns. Global forward hooks
    run before a module's own (torch's order): they see the output before the drop. Removable, and a
    context manager.

    `targets`: ``{"layer3": 0.1, model.layer4: 0.3}`` (modules or qualified names to drop
    probabilities), or a module, a name or a list of either with one probability `p`.

    DropBlock follows Ghiasi et al. 2018: seeds only where a whole block fits, the block
    clamped to the map (``min(block_size, H, W)``), the output rescaled by the kept fraction;
    its seed rate is solved so that a fraction `p` of the map is dropped in expectation, for
    any map and block size (the paper's closed form drops less once blocks overlap).
    """

    def __init__(
        self,
        model: Any,
        targets: Mapping[Any, float] | Targets,
        p: float | None = None,
        *,
        mode: str = "dropout",
        block_size: int = 7,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(
                f"`mode` must be one of {{'dropout', 'dropblock'}}. Received: mode={mode!r}"
            )
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise HookArgumentError(
                f"`block_size` must be a positive int. Received: block_size={block_size!r}"
            )
        if isinstance(targets, Mapping):
            if p is not None:
                raise HookArgumentError(
                    f"`p` must be None when `targets` maps modules to probabilities. "
                    f"Received: p={p!r}"
                )
            inner = ops.unwrap(model)
            chosen = [(resolve(inner, key, "targets")[0], q) for key, q in targets.items()]
        else:
            if p is None:
                raise HookArgumentError(
                    "`p` must be a probability when `targets` is a module, a name or a list. "
                    "Received: p=None"
                )
            chosen = [(found, p) for found in resolve(ops.unwrap(model), targets, "targets")]
        for (name, _), q in chosen:
            if not 0.0 <= q < 1.0:
                raise ValueError(f"drop probability for {name!r} must be in [0, 1). Received: {q}")
        chosen = _once(chosen)
        super().__init__()
        try:
            for (name, module), q in chosen:
                hook = (
                    functools.partial(_dropout, name, q)
                    if mode == "dropout"
                    else functools.partial(_drop_block, name, q, block_size)
                )
                # first among the module's forward hooks, also those registered before: every
                # other hook sees the dropped output, the one the call returns and whose
                # gradient is its grad_output (until 2026-12-01 a GradientMonitor made before
                # hooked the output before the drop: helper-72's attack)
                handle = register_forward_hook(module, hook, when="train", name=name, prepend=True)
                self._hooks.add(name, handle)
        except BaseException:
            self.remove()
            raise


# (the hooks: partials of module-level functions, so a model carrying them pickles,
# `torch.save(model)`)


def _dropout(name: str, p: float, module: Any, args: Any, output: Any) -> Any:
    _check("dropout", name, module, output)
    return ops.dropout(output, p, training=True)


def _drop_block(name: str, p: float, block_size: int, module: Any, args: Any, output: Any) -> Any:
    _check("dropblock", name, module, output)
    return ops.drop_block(output, p, block_size, training=True)


def _check(mode: str, name: str, module: Any, output: Any) -> None:
    """What the drop needs of the module's output: a tensor (not a tuple or a dict: which of
    their tensors to drop is not known), of a real floating dtype, dense, and NCHW for
    DropBlock. Until 2026-12-05 an integer, complex or sparse output, or DropBlock's on a
    tensor of another rank, raised the framework's error naming no module (helper-135's
    FINDING 2)."""
    if not ops.is_tensor(output):
        raise _wrong_output(mode, name, module, "a tensor", type(output).__name__)
    dtype = str(getattr(output, "dtype", ""))
    # (the frameworks' dtype names: torch.float32, paddle.bfloat16, MindSpore's Float16)
    if "float" not in dtype.lower():
        raise _wrong_output(mode, name, module, "a floating-point tensor", f"dtype {dtype}")
    sparse = getattr(output, "is_sparse", False)  # (torch: a property, paddle: a method)
    if sparse() if callable(sparse) else sparse:
        raise _wrong_output(mode, name, module, "a dense tensor", "a sparse tensor")
    shape = tuple(getattr(output, "shape", ()))
    if mode == "dropblock" and len(shape) != 4:
        # (a HookArgumentError, as `ops.drop_block`'s, which said no module)
        expected = "a tensor of 4 dimensions (N, C, H, W)"
        raise _wrong_output(mode, name, module, expected, f"shape {shape}", HookArgumentError)


def _wrong_output(
    mode: str,
    name: str,
    module: Any,
    expected: str,
    received: str,
    error: type[HookTargetError | HookArgumentError] = HookTargetError,
) -> Exception:
    return error(
        f"DropHook(mode={mode!r}) on module {name!r} ({type(module).__name__}, backend "
        f"{backend_of(module)}): expected the module to return {expected}. Received: "
        f"{received}. Target the module that takes that output, or a submodule returning one"
    )


def _once(chosen: list[tuple[tuple[str, Any], float]]) -> list[tuple[tuple[str, Any], float]]:
    """Each module once: given twice (a name and the module, a name repeated, two names of a
    shared module) it was dropped twice, 0.51 for 0.3 (helper-125's FINDING 7); with two
    probabilities, which one is meant is not known."""
    first: dict[int, tuple[tuple[str, Any], float]] = {}
    for (name, module), q in chosen:
        seen = first.setdefault(id(module), ((name, module), q))
        if seen[1] != q:
            raise HookArgumentError(
                f"`targets` must give each module one probability. Received: {seen[1]} for "
                f"{seen[0][0]!r} and {q} for {name!r}, the same module"
            )
    return list(first.values())
