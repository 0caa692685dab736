"""GradientMonitor: grad_output norms per module per backward; stop at the first NaN/Inf."""

from __future__ import annotations

import math
import warnings
from collections import deque
from typing import Any

from unihook import (
    HookArgumentError,
    HookGroup,
    UnihookError,
    attach,
    ops,
    register_full_backward_pre_hook,
)

from ._scope import Recipe, check_every, where_of

__all__ = ["GradientMonitor", "NonFiniteGradientError"]

_POLICIES = ("raise", "warn", "ignore")


class NonFiniteGradientError(UnihookError, FloatingPointError):
    """A gradient with NaN or Inf reached a module's output (the first one in backward order)."""

    def __init__(self, module: str, norms: dict[str, float]) -> None:
        self.module = module
        super().__init__(
            f"non-finite gradient at the output of {module or '(model)'!r} "
            f"(the first module in backward order where it appeared)"
        )


class GradientMonitor(Recipe):
    """Records ``{module name: grad_output norm}`` for each backward in `history` (one dict per
    backward, modules in backward order). A NaN or Inf in a grad_output raises
    NonFiniteGradientError naming the first module where it appeared (`on_nonfinite="raise"`),
    warns (`"warn"`) or is only recorded (`"ignore"`).

    Norms are accumulated in float64 on the device (torch and paddle agree to the gradients'
    own precision); a module called several times reports the norm over all its calls'
    grad_outputs. `where`: as ActivationStats'. `every=N`: record the backward of forwards
    0, N, 2N... of `model` only (wandb.watch's `log_freq`); between them the hooks are removed
    (one counter hook remains). `history` keeps the last `max_history` backwards (a ring
    buffer; None keeps every one).
    """

    def __init__(
        self,
        model: Any,
        where: Any = None,
        *,
        on_nonfinite: str = "raise",
        every: int = 1,
        max_history: int | None = 1000,
    ) -> None:
        if on_nonfinite not in _POLICIES:
            raise ValueError(
                f"`on_nonfinite` must be one of {{'raise', 'warn', 'ignore'}}. "
                f"Received: on_nonfinite={on_nonfinite!r}"
            )
        if max_history is not None and (
            isinstance(max_history, bool) or not isinstance(max_history, int) or max_history < 1
        ):
            raise HookArgumentError(
                f"`max_history` must be a positive int or None. Received: {max_history!r}"
            )
        every = check_every(every)
        where = where_of(model, where)
        super().__init__()
        self.on_nonfinite = on_nonfinite
        self.history: deque[dict[str, float]] = deque(maxlen=max_history)
        self._flagged = False

        def hooks() -> HookGroup:
            # The outermost module's pre-hook fires first in every backward: it opens a step.
            group = HookGroup()
            group.add("", register_full_backward_pre_hook(model, self._new_step, prepend=True))
            group.extend(attach(model, self._record, kind="full_backward_pre", where=where))
            return group

        self._schedule(model, every, hooks)

    def _new_step(self, module: Any, grad_output: Any) -> None:
        self.history.append({})
        self._flagged = False

    def _record(self, module: Any, grad_output: Any, *, name: str) -> None:
        grads = [g for g in grad_output if g is not None]
        if not grads:
            return
        if not self.history:
            self.history.append({})
        step = self.history[-1]
        squares = sum(ops.sum_squares(g) for g in grads) + step.get(name, 0.0) ** 2
        step[name] = math.sqrt(squares)
        # a finite sum of squares has finite terms; an infinite one may be float64 overflow
        if math.isfinite(squares) or all(ops.all_finite(g) for g in grads) or self._flagged:
            return
        self._flagged = True
        if self.on_nonfinite == "raise":
            raise NonFiniteGradientError(name, step)
        if self.on_nonfinite == "warn":
            warnings.warn(str(NonFiniteGradientError(name, step)), RuntimeWarning, stacklevel=2)
