"""unihook's emulated torch hooks under ``torch.compile``.

Two dynamo behaviours would silently skip them:

1. Dynamo traces the dispatchers (``unihook._module_backward``) into its graph: their identity
   autograd function becomes a traced ``autograd_function_apply`` whose backward never calls
   the hooks, and their per-call state is a trace-time side effect. `EagerUnderCompile` runs a
   dispatcher outside dynamo while it traces: a graph break before and after each hooked
   module call, then the eager code, so the hooks see exactly eager's arguments and gradients.
2. Dynamo does not guard on an empty hook dict (``skip_nnmodule_hook_guards``, True by
   default) nor on hook dicts of modules it specialised: a hook added or removed after
   compiling is ignored, native hooks included. `watch_hooks` turns that guard on once unihook
   registers a torch hook, so such a change recompiles the frames that saw the module. Code
   compiled before the switch, and all compiled code when a global hook (native or unihook's
   ``Module._call_impl`` wrapper, which no guard watches) comes or goes, is dropped
   (`forget_compiled`): the next call recompiles.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from unihook._imports import when_imported

__all__ = ["EagerUnderCompile", "forget_compiled", "watch_hooks"]


@torch._disable_dynamo
def _outside_dynamo(fn: Callable[..., Any], *args: Any) -> Any:
    # torch._disable_dynamo imports dynamo (2 s) only when first called, that is while
    # dynamo traces; torch.compiler.disable would import it here.
    return fn(*args)


class EagerUnderCompile:
    """A dispatcher that dynamo does not trace. `__self__` is the dispatcher's owner, as for
    the bound method it wraps (a deep copy of the module re-binds it)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    @property
    def __self__(self) -> Any:
        return getattr(self.fn, "__self__", None)

    def __call__(self, *args: Any) -> Any:
        # constant True while dynamo traces, so the graph holds only the call outside dynamo
        if torch.compiler.is_compiling():
            return _outside_dynamo(self.fn, *args)
        return self.fn(*args)


_watching = False


def watch_hooks() -> None:
    """Make dynamo guard on module hook dicts, now or when it gets imported (never imports it).
    Called at every torch hook registration; a dict lookup once it is on."""
    global _watching
    dynamo = sys.modules.get("torch._dynamo")
    if _watching and (dynamo is None or not dynamo.config.skip_nnmodule_hook_guards):
        return
    _watching = True
    when_imported("torch._dynamo", _guard_hooks)


def _guard_hooks(dynamo: Any) -> None:
    if dynamo.config.skip_nnmodule_hook_guards:
        dynamo.config.skip_nnmodule_hook_guards = False
        forget_compiled()  # compiled without the guards: blind to hooks added since
    from ._global import _original_call_impl

    if _original_call_impl is not None:
        # Dynamo takes ``Module._call_impl`` as it is when dynamo is imported for torch's own,
        # and traces only ``forward`` of a module without hooks that calls torch's own: had
        # unihook's wrapper been installed then, dynamo would skip it.
        dynamo.utils.unpatched_nn_module_call_impl = _original_call_impl
        dynamo.variables.nn_module.unpatched_nn_module_call_impl = _original_call_impl


def forget_compiled() -> None:
    """Drop every frame dynamo compiled: the next call recompiles with the hooks as they are."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset_code_caches()
