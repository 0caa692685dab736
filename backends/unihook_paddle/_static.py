"""unihook's emulated paddle hooks under ``paddle.jit.to_static``.

- SOT (``full_graph=False``, the default) simulates the bytecode of every function a converted
  layer calls, the backward dispatchers (``unihook._module_backward``) included, and crashes in
  their autograd guard (``UnboundLocalError ... ___graph_fn_saved_orig_1``). While SOT
  simulates it, `EagerUnderSOT` calls a dispatcher through a function marked
  ``paddle.jit.marker.force_dynamic``: SOT breaks the graph there and runs it in dygraph, so
  the hooks see eager's arguments and gradients. Run normally, it costs two flag checks.
- ``full_graph=True`` runs Python only while it builds the static program, with symbolic
  values, and the program has no place for a Python hook: a dispatcher called then raises
  `UnsupportedHookError` instead of being silently left out of the program.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import paddle
from paddle.base.dygraph.base import in_sot_simulation_mode
from paddle.jit.sot.symbolic import interpreter as sot_interpreter
from paddle.jit.sot.utils import no_eval_frame

from unihook._describe import Site
from unihook.errors import UnsupportedHookError

__all__ = ["EagerUnderSOT", "sot_builds_subgraph"]


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


# SOT translates every frame that runs while a converted function does, except frames of
# paddle's own files: `no_eval_frame`'s wrapper is one, and it turns SOT's frame evaluation off
# for the call. Marked force_dynamic, a call to it is a graph break, not a simulated call.
_outside_sot = paddle.jit.marker.force_dynamic(no_eval_frame(_call))


def sot_builds_subgraph() -> bool:
    """SOT builds each subgraph as a static program too, calling the paddle layers it
    recorded, with symbolic values: global hooks must not see those calls, and the global
    backward dispatchers do nothing then (grad is off). The layers' real calls run in dygraph
    where the caller breaks the graph. Static-mode calls happen at build time only: walking
    the stack then costs nothing per step."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == _SOT_INTERPRETER:
            return True
        frame = frame.f_back
    return False


_SOT_INTERPRETER = sot_interpreter.__file__


class EagerUnderSOT:
    """A dispatcher that SOT does not simulate. `__self__` is the dispatcher's owner, as for
    the bound method it wraps (a deep copy of the layer re-binds it)."""

    __slots__ = ("fn", "__weakref__")  # the autograd guard holds dispatchers weakly

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    @property
    def __self__(self) -> Any:
        return getattr(self.fn, "__self__", None)

    def __call__(self, layer: Any, *args: Any) -> Any:
        # False when run, True while SOT simulates this code (it folds the call)
        if in_sot_simulation_mode():
            return _outside_sot(self.fn, layer, *args)
        if not paddle.in_dynamic_mode() and not sot_builds_subgraph():
            raise Site.of("full_backward", "paddle", layer).error(
                UnsupportedHookError,
                "dygraph or paddle.jit.to_static(full_graph=False) (SOT): module backward "
                "hooks, and global ones, run Python during backward",
                "a call while paddle.jit.to_static(full_graph=True) builds a static program",
            )
        return self.fn(layer, *args)
