"""unihook's emulated paddle hooks under ``paddle.jit.to_static``.

- SOT (``full_graph=False``, the default) simulates the bytecode of every function a converted
  layer calls, the backward dispatchers (``unihook._module_backward``) included, and crashes in
  their autograd guard (``UnboundLocalError ... ___graph_fn_saved_orig_1``). While SOT
  simulates it, `EagerUnderSOT` calls a dispatcher through a function marked
  ``paddle.jit.marker.force_dynamic``: SOT breaks the graph there and runs it in dygraph, so
  the hooks see eager's arguments and gradients; run in dygraph while SOT still translates
  the frames it calls (after a graph break), it turns that off for the dispatcher's call.
  Run normally, it costs three flag checks.
- ``full_graph=True`` runs Python only while it builds the static program, with symbolic
  values, and the program has no place for a Python hook: a layer with unihook hooks (or any
  layer, while global hooks live) called then raises `UnsupportedHookError` instead of being
  silently left out of the program or seeing symbolic values. A program built before a layer
  in it got unihook hooks would leave them out: registering drops it (`forget_programs`), so
  the next call builds again and raises. To find those programs, this module records every
  converted function paddle makes (``ASTStaticFunction.__init__`` wrapped, for as long as the
  process runs: paddle keeps no registry of them). Raising from a build leaves paddle a record
  that crashes a later build unless it goes with the failed program (`_abandon_build`).
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from typing import Any, Callable

import paddle
import pluggy
from paddle.base import core
from paddle.base.dygraph.base import in_sot_simulation_mode, in_to_static_mode
from paddle.base.framework import global_var
from paddle.jit.dy2static import parameter_recorder
from paddle.jit.dy2static.program_translator import ASTStaticFunction
from paddle.jit.sot.opcode_translator import skip_files as _sot_skip_files
from paddle.jit.sot.opcode_translator.executor.executor_cache import OpcodeExecutorCache
from paddle.jit.sot.opcode_translator.executor.variables import callable as _sot_layers
from paddle.jit.sot.symbolic import interpreter as sot_interpreter
from paddle.jit.sot.utils.exceptions import BreakGraphError, ForceBreak
from paddle.jit.sot.utils.utils import StepInfoManager, no_eval_frame

import unihook
from unihook.backend import HookDict, Site
from unihook.errors import UnsupportedHookError

__all__ = [
    "EagerUnderSOT",
    "builds_full_graph",
    "forget_programs",
    "full_graph_error",
    "guard_forward",
    "guard_forward_pre",
    "outside_sot",
    "sot_escape",
    "sot_tracing",
    "retranslate",
    "sot_builds_subgraph",
    "sot_calls_layers",
]


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


# SOT translates every frame that runs while a converted function does, except frames of
# paddle's own files: `no_eval_frame`'s wrapper is one, and it turns SOT's frame evaluation off
# for the call. Marked force_dynamic, a call to it is a graph break, not a simulated call.
_outside_sot = paddle.jit.marker.force_dynamic(no_eval_frame(_call))
_set_eval_frame = core.set_eval_frame  # (returns the callback it replaced)
# the SOT step running, if any: paddle turns SOT's frame evaluation on only inside one
# (`symbolic_translate`), on the thread running it (a singleton)
_sot_steps = StepInfoManager()
# SOT's frame evaluation skips frames of paddle's own files, and of unihook's (its core, its
# recipes, this backend) and pluggy's. After a hooked layer's guard breaks SOT's graph
# (`guard_forward`), the layer's call runs in dygraph but SOT translates each frame it makes,
# and with MIN_GRAPH_SIZE=0 compiled them and crashed: on a `functools.partial` or
# bound-method hook in the hook table, whose repr SOT's guard holds (helper-67's attack; every
# recipe's hooks are such), in pluggy (InnerError "... HookCaller ... has no attribute
# _inner_hookexec": a recipe hook's first `unihook.ops` call on a layer or tensor type) and in
# a registration's `retranslate` (a hook registered by a hook; helper-70's). Those frames run
# as in dygraph; a hook of the user's, which they call, is still SOT's to translate, as it
# translates paddle's own hooks.
for _package in (
    unihook.__file__,
    sys.modules[__name__.rpartition(".")[0]].__file__,
    pluggy.__file__,
):
    _sot_skip_files.skip_file_names.add(os.path.dirname(os.path.abspath(str(_package))) + os.sep)
_sot_skip_files.setup_skip_files()
# (paddle 3.3.1's name, which SOT's `from_value` reads as it translates a layer's call;
# pyright takes it for private)
_SUPPORT_CHECK = "is_not_supported_paddle_layer"
_supported_check = getattr(_sot_layers, _SUPPORT_CHECK)


def outside_sot(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` from code SOT simulates: a graph break, the call in dygraph."""
    return _outside_sot(fn, *args, **kwargs)


def sot_tracing() -> bool:
    """Whether a SOT step runs on this thread (its frame evaluation on), or SOT simulates."""
    return _sot_steps.current_code is not None or in_sot_simulation_mode()


def sot_escape(call: Callable[[], Any]) -> Any:
    """The paddle backend's escape from SOT (`unihook.backend.add_compiler_escape`), which a
    global registration and `unihook.backends()` take (through pluggy): `call()` with none of
    its frames simulated or translated by SOT, which cannot simulate pluggy. Registered from a
    hook, or from a converted function, while a SOT step runs: SOT's frame evaluation is off
    for the call (the frames it makes outside unihook's and paddle's files, which SOT skips:
    `importlib.metadata`'s, a callback's); while SOT simulates this code, a graph break
    (`outside_sot`), as `EagerUnderSOT`. Else one attribute read."""
    if in_sot_simulation_mode():
        return _outside_sot(call)
    if _sot_steps.current_code is None:
        return call()
    callback = _set_eval_frame(None)
    try:
        return call()
    finally:
        _set_eval_frame(callback)


def sot_calls_layers(hooked: bool) -> None:
    """Global forward hooks come (`hooked`) or go. SOT records a paddle layer without hooks of
    its own as one op of its graph, which the global hooks would never see (silently;
    helper-62's attack): while they live, SOT takes every layer for one it does not support
    that way, simulates its call, and meets unihook's wrapper of ``Layer._dygraph_call_func``,
    which breaks the graph there (`outside_sot`): the layer runs in dygraph, with them. (A
    layer with hooks of its own breaks it in its hook table's guard: `guard_forward`.)"""
    setattr(_sot_layers, _SUPPORT_CHECK, _every_layer if hooked else _supported_check)
    retranslate()


def _every_layer(layer_class: type) -> bool:
    return True


def retranslate() -> None:
    """unihook's hooks of a layer (or the global ones) changed: drop the code SOT translated.
    SOT guards a frame it translated on its inputs, not on the hooks of the layers it calls:
    a hook registered after a frame's first call would never run in it (paddle's own too),
    silently (helper-62's attack). Paddle translates each frame again at its next call; a
    process that never ran SOT has nothing to drop."""
    cache = OpcodeExecutorCache()
    if cache.cache:
        cache.clear()


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


def builds_full_graph() -> bool:
    """Whether this call runs while paddle.jit.to_static(full_graph=True) builds a program
    (not in dygraph, not while SOT simulates or builds a subgraph). One flag check when run."""
    return not (paddle.in_dynamic_mode() or in_sot_simulation_mode() or sot_builds_subgraph())


def full_graph_error(kind: str, layer: Any) -> UnsupportedHookError:
    """The error to raise from a full_graph build (the build is abandoned: `_abandon_build`)."""
    _abandon_build()
    return Site.of(kind, "paddle", layer).error(
        UnsupportedHookError,
        "dygraph or paddle.jit.to_static(full_graph=False) (SOT, the default): unihook's "
        "hooks run Python on every call",
        "a call while paddle.jit.to_static(full_graph=True) builds a static program, which "
        "runs Python once, with symbolic values",
    )


# Paddle 3.3.1 trap (plain paddle crashes the same way, with any exception): while
# to_static(full_graph=True) builds a program, paddle records the symbolic value it made for each
# parameter (`parameter_recorder._global_parameter_recorder`; in-place rewrites in
# `_global_inplace_map`) under id(program), and pops the entry only when the build returns
# (`graph_tracing_guard` has no `finally`). A build that raises leaves it behind, holding the
# layer's parameters and values that point into the failed program. Once that program is freed,
# a program allocated later at its address inherits the entry: its build takes those values as
# parameters of its own and crashes, SIGSEGV or SIGFPE in `pir::ParameterOp::param_name`
# (`name_analysis::GetValueFirstName`), or raises std::bad_alloc. When the failed program is
# freed depends on the collector (the exception's traceback holds it), hence the crash came and
# went with gc timing. So the entry goes with the program: a finalizer, which runs before the
# program's memory is freed, so no program can reuse its id first. (Not popped now: a caller
# that catches the error inside the converted function and goes on building needs it.)
_abandoned: set[int] = set()  # id(program) of the builds unihook raised from, until freed


def _forget_records(key: int) -> None:
    _abandoned.discard(key)
    recorder = parameter_recorder._global_parameter_recorder
    recorder.params_dict.pop(key, None)
    recorder.tensor2value.pop(key, None)
    parameter_recorder._global_inplace_map.params_dict.pop(key, None)


def _abandon_build() -> None:
    """The program being built is abandoned (unihook raises from its build): paddle's records
    of it go when it is freed. See above."""
    if not in_to_static_mode():
        return
    program = paddle.pir.core.default_main_program()
    key = id(program)
    if key in _abandoned:
        return
    _abandoned.add(key)
    weakref.finalize(program, _forget_records, key).atexit = False


def _guard(hooks: HookDict, kind: str) -> None:
    if builds_full_graph():
        if hooks.owned.issubset(hooks.pinned):  # only the backward dispatchers
            kind = "full_backward"
        raise full_graph_error(kind, hooks.owner() or _calling_layer(hooks))


def _calling_layer(hooks: Any) -> Any:
    """The layer whose call reads `hooks` (a pickled layer's `SnapshotDict` knows no owner):
    the `self` of a calling frame holding them, or None."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            break
        layer = frame.f_locals.get("self")
        if isinstance(layer, paddle.nn.Layer) and any(
            vars(layer).get(attr) is hooks for attr in ("_forward_pre_hooks", "_forward_post_hooks")
        ):
            return layer
        frame = frame.f_back
    return None


# Raised as SOT simulates a hooked layer's hook table: a graph break, so that the layer's call
# runs in dygraph, its hooks with eager's values, and SOT simulates none of unihook's code,
# whose hook tables it cannot guard (a `functools.partial` hook crashed its guard with a
# SyntaxError) and whose hooks' bodies it could not run (a recipe's call into pluggy crashed
# it; helper-62's attack). (Raised in the guard itself: raised by a function it calls, SOT
# passed it on to the caller, measured.)
_BREAK_REASON = "unihook: a layer with hooks runs in dygraph"


# `HookDict.guard`s, once per hooked call: in dygraph, one attribute read (paddle's own
# in_dynamic_mode() without the call) and one call of in_sot_simulation_mode (False; True
# while SOT simulates the layer's call)
def guard_forward_pre(hooks: HookDict) -> None:
    if global_var._dygraph_tracer_ is None:
        _guard(hooks, "forward_pre")
    elif in_sot_simulation_mode():
        raise BreakGraphError(ForceBreak(reason_str=_BREAK_REASON))


def guard_forward(hooks: HookDict) -> None:
    if global_var._dygraph_tracer_ is None:
        _guard(hooks, "forward")
    elif in_sot_simulation_mode():
        raise BreakGraphError(ForceBreak(reason_str=_BREAK_REASON))


# paddle keeps no registry of its converted functions: those made before this module was
# imported are found in the heap (once), later ones are recorded as they are made. (Counting
# instances through the class's reference count misses one made while another is freed.)
_functions: dict[int, weakref.ref[Any]] = {}


def _record(function: Any) -> None:
    key = id(function)
    _functions[key] = weakref.ref(function, lambda _: _functions.pop(key, None))


def _record_existing() -> None:
    for function in gc.get_referrers(ASTStaticFunction):
        if isinstance(function, ASTStaticFunction):
            _record(function)


_record_existing()
_paddle_init = ASTStaticFunction.__init__


def _recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _paddle_init(self, *args, **kwargs)
    _record(self)


ASTStaticFunction.__init__ = _recording_init  # type: ignore[method-assign]


def _full_graph_functions() -> list[Any]:
    return [f for f in (ref() for ref in list(_functions.values())) if f is not None]


def forget_programs(layer: Any) -> None:
    """unihook hooks come to `layer` (None: global hooks, every layer): drop the programs
    paddle.jit.to_static(full_graph=True) built with it, so that its next call builds again
    and meets the hooks (which raise then) instead of running a program without them; and
    the code SOT translated (`retranslate`)."""
    retranslate()
    for function in _full_graph_functions():
        cache = function._program_cache
        if not cache._caches:
            continue
        owner = function._class_instance() if function._class_instance is not None else None
        if (
            layer is None
            or owner is None  # a converted function: its program may call any layer
            or owner is layer
            or any(sub is layer for sub in owner.sublayers())
        ):
            cache.clear()


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
        # (paddle.in_dynamic_mode()'s own test, without its call)
        if global_var._dygraph_tracer_ is None and not sot_builds_subgraph():
            raise full_graph_error("full_backward", layer)
        # Run for real, SOT's frame evaluation may still be on: after a graph break SOT runs
        # the hooked layer's call in dygraph but translates each frame that call makes, the
        # dispatcher's too (with MIN_GRAPH_SIZE=0 it compiled them, and crashed simulating a
        # generator: helper-62's attack). Off for the call. Only a SOT step (on any thread)
        # turns it on: an attribute read when none runs.
        if _sot_steps.current_code is None:
            return self.fn(layer, *args)
        callback = _set_eval_frame(None)
        try:
            return self.fn(layer, *args)
        finally:
            _set_eval_frame(callback)
