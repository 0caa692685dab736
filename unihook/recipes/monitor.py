"""GradientMonitor: grad_output norms per module per backward; stop at the first NaN/Inf."""

from __future__ import annotations

import warnings
from typing import Any

from unihook import UnihookError, Where, attach, ops, register_full_backward_pre_hook

from ._scope import Recipe

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
    """

    def __init__(self, model: Any, where: Where = None, *, on_nonfinite: str = "raise") -> None:
        if on_nonfinite not in _POLICIES:
            raise ValueError(
                f"`on_nonfinite` must be one of {{'raise', 'warn', 'ignore'}}. "
                f"Received: on_nonfinite={on_nonfinite!r}"
            )
        super().__init__()
        self.on_nonfinite = on_nonfinite
        self.history: list[dict[str, float]] = []
        self._flagged = False
        # The outermost module's pre-hook fires first in every backward: it opens a new step.
        self._hooks.add("", register_full_backward_pre_hook(model, self._new_step, prepend=True))
        self._hooks.extend(attach(model, self._record, kind="full_backward_pre", where=where))

    def _new_step(self, module: Any, grad_output: Any) -> None:
        self.history.append({})
        self._flagged = False

    def _record(self, module: Any, grad_output: Any, *, name: str) -> None:
        grads = [g for g in grad_output if g is not None]
        if not grads:
            return
        step = self.history[-1] if self.history else self.history.append({}) or self.history[-1]
        finite = all(ops.all_finite(g) for g in grads)
        norm = sum(float(ops.norm(g)) ** 2 for g in grads) ** 0.5
        step[name] = norm
        if finite or self._flagged:
            return
        self._flagged = True
        if self.on_nonfinite == "raise":
            raise NonFiniteGradientError(name, step)
        if self.on_nonfinite == "warn":
            warnings.warn(str(NonFiniteGradientError(name, step)), RuntimeWarning, stacklevel=2)
