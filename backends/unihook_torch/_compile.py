"""unihook's emulated torch hooks under ``torch.compile``.

Three dynamo behaviours would silently skip them:

1. Dynamo traces the dispatchers (``unihook._module_backward``) into its graph: their identity
   autograd function becomes a traced ``autograd_function_apply`` whose backward never calls
   the hooks, and their per-call state is a trace-time side effect. `EagerUnderCompile` runs a
   dispatcher outside dynamo while it traces: a graph break before and after each hooked
   module call, then the eager code, so the hooks see exactly eager's arguments and gradients.
2. Dynamo does not guard on an empty hook dict (``skip_nnmodule_hook_guards``, True by
   default): a hook added after compiling is ignored, native hooks included (one removed is
   seen). `watch_hooks` turns that guard on, for every thread (`_hook_guards`), when unihook
   registers a torch hook, so adding one
   recompiles the frames that saw the module; removing unihook's last hook turns it back off.
   Code compiled while it was off (`_compiled_blind`), and all compiled code when a global
   hook (native or unihook's ``Module._call_impl`` wrapper, which no guard watches) comes or
   goes, is dropped (`forget_compiled`): the next call recompiles. Code compiled while it was
   on keeps its guards on the hook dicts: it stays.
3. Dynamo recognises torch's own ``Module._call_impl`` by identity, taken when dynamo is
   imported: `watch_call_impl` corrects it if unihook's wrapper was installed by then.
4. Where a compiled function breaks its graph, the calls it makes eagerly run with dynamo's
   frame callback on: dynamo compiles each function they enter, where it stands for an
   ``OptimizedModule`` argument its ``_orig_mod``. torch's own ``Module.__call__`` and
   ``_call_impl`` (and the hook loops in them) are never such a root, so torch's hooks see the
   ``OptimizedModule``; unihook's functions in their place (the ``_call_impl`` wrapper, the
   dispatchers) are not either (`not_a_compile_root`), else their hooks saw the inner module,
   or missed the call (helper-113's FINDING 3).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from contextlib import contextmanager
from functools import partial
from itertools import count
from types import CodeType
from typing import Any, Callable, Iterator, Literal, TypeVar

import torch
import torch.jit._recursive

from unihook.backend import (
    HookName,
    ModuleBackward,
    Pinned,
    RegistryLock,
    Site,
    add_hook_compiler,
    cancel_when_imported,
    collector_kept_off,
    collector_paused,
    eager_entries,
    imported,
    undo_if_unfinished,
    when_imported,
)

__all__ = [
    "EagerUnderCompile",
    "WatchedPinned",
    "compiled_frames_out",
    "compiles_held",
    "forget_compiled",
    "hooks_changeable",
    "not_a_compile_root",
    "outside_compiler",
    "outside_dynamo",
    "watch_call_impl",
    "watch_hooks",
]


F = TypeVar("F", bound=Callable[..., Any])

# unihook's functions dynamo never compiles as a frame of their own (point 4 above): their code,
# and whether the functions they call run eagerly too (else dynamo may compile those)
_NOT_ROOTS: dict[CodeType, bool] = {}
_reasons_given = False  # dynamo is imported and `_give_reason` has run


def not_a_compile_root(fn: F, *, callees_too: bool = False) -> F:
    """Mark `fn` (a function or a method) as one dynamo never compiles as a frame of its own,
    as torch's ``Module._call_impl``: called eagerly with dynamo's frame callback on (a
    compiled function's graph break), it runs eagerly; traced from a compiled frame, it is
    traced. `callees_too`: what it calls runs eagerly too (a dispatcher: unihook's code only).
    A ``functools.partial`` marks its function."""
    _NOT_ROOTS[_code_of(fn)] = callees_too
    if _reasons_given:
        _mark_not_roots()
    return fn


def _code_of(fn: Callable[..., Any]) -> CodeType:
    function: Any = fn
    if isinstance(function, partial):
        function = function.func
    return function.__code__


# The core's functions unihook's `_call_impl` wrapper calls (the global backward state's
# bookkeeping, an error's site): eager, with what they call. (Those torch calls on its own, the
# core lists: `eager_entries`.)
for _fn in (
    ModuleBackward.hold,
    ModuleBackward.let_go,
    ModuleBackward.inside,
    ModuleBackward.outer,
    ModuleBackward.around,
    ModuleBackward.end_around,
    Site.of,
):
    not_a_compile_root(_fn, callees_too=True)
_entries_marked = 0  # how many of the core's `eager_entries` are in `_NOT_ROOTS`


def _mark_entries() -> None:
    """The core's `eager_entries` not marked yet (a module imported since adds its own: the
    recipes'), marked."""
    global _entries_marked
    entries = eager_entries()
    if len(entries) != _entries_marked:
        for fn, callees_too in entries.items():
            _NOT_ROOTS[_code_of(fn)] = callees_too
        _entries_marked = len(entries)
        if _reasons_given:
            _mark_not_roots()


def _mark_not_roots() -> None:
    # (torch 2.6 and later; the mark lives on the code object, which no dynamo reset clears
    # but that of a code it compiled: these it never does)
    try:
        from torch._C._dynamo import eval_frame
    except ImportError:
        return
    action = getattr(eval_frame, "_FrameAction", None)
    strategy = getattr(eval_frame, "_FrameExecStrategy", None)
    if action is None or strategy is None:
        return
    for code, callees_too in tuple(_NOT_ROOTS.items()):
        then = action.SKIP if callees_too else action.DEFAULT
        eval_frame.set_code_exec_strategy(code, strategy(action.SKIP, then))


@torch._disable_dynamo  # pyright: ignore[reportPrivateImportUsage] (the lazy one, see below)
def _outside_dynamo(fn: Callable[..., Any], *args: Any) -> Any:
    # torch._disable_dynamo imports dynamo (2 s) only when first called, that is while
    # dynamo traces; torch.compiler.disable would import it here.
    return fn(*args)


# what dynamo says of a frame compiled before a hook came or went (`forget_compiled`)
_FORGOTTEN = "unihook: a hook dynamo does not guard came or went since this frame was compiled"
# How long a thread waiting for the GIL waits before it asks for it while `forget_compiled`
# tests the threads' frames and resets dynamo's caches (a few ms): the most it stalls a
# registration beside a thread running pure Python, which never lets go of the GIL
_HOLD = 0.1

# What dynamo says where a dispatcher breaks the graph: with fullgraph=True that is its error.
FULLGRAPH_REASON = (
    "unihook runs the dispatchers of module backward hooks (full_backward, full_backward_pre, "
    "and the global module_full_backward kinds) eagerly, with a graph break before and after "
    "each hooked module call: torch.compile(fullgraph=True) cannot take them; compile without "
    "fullgraph, or remove those hooks while compiling"
)


# ... and where unihook leaves dynamo for the rest (`outside_compiler`: `add_compiler_escape`)
ESCAPE_REASONS = {
    "registration": (
        "unihook registers a global hook made inside a compiled function outside dynamo, with "
        "a graph break: torch.compile(fullgraph=True) cannot take that registration; register "
        "the hook before calling the compiled function, or compile without fullgraph"
    ),
    "module_registration": (
        "unihook registers a module hook made inside a compiled function outside dynamo, with a "
        "graph break: torch.compile(fullgraph=True) cannot take that registration; register the "
        "hook before calling the compiled function, or compile without fullgraph"
    ),
    "removal": (
        "unihook removes a hook (Handle.remove) inside a compiled function outside dynamo, "
        "with a graph break: torch.compile(fullgraph=True) cannot take that removal; remove "
        "the hook before or after calling the compiled function, or compile without fullgraph"
    ),
    "backends": (
        "unihook.backends() reads the installed packages outside dynamo, with a graph break: "
        "torch.compile(fullgraph=True) cannot take that call; call unihook.backends() before "
        "calling the compiled function, or compile without fullgraph"
    ),
}


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _lazy(reason: str) -> Callable[..., Any]:
    """`_call` outside dynamo, importing dynamo only when called (`_outside_dynamo`), marked as
    a `torch._dynamo.disable` wrapper is: dynamo reads those marks on any function it would
    call or inline, and gives the reason where it breaks the graph (else it calls torch's lazy
    wrapper a "function marked as skipped")."""
    run: Any = torch._disable_dynamo(_call)  # pyright: ignore[reportPrivateImportUsage]
    run._torchdynamo_disable = True
    run._torchdynamo_disable_msg = reason
    return run


# The ways out of dynamo, each with its reason: lazy ones (`_lazy`) until dynamo is imported
# while unihook has a torch hook, then `torch._dynamo.disable`s of their own, which dynamo
# calls directly (`_give_reason`). The dispatchers' ...
_dispatch_outside: Callable[..., Any] = _lazy(FULLGRAPH_REASON)
# ... and `outside_compiler`'s, by what it does (a registration, a removal, backends())
_escape_outside: dict[str, Callable[..., Any]] = {
    doing: _lazy(reason) for doing, reason in ESCAPE_REASONS.items()
}


def _give_reason(dynamo: Any) -> None:
    global _dispatch_outside, _escape_outside, _reasons_given
    _dispatch_outside = dynamo.disable(_call, reason=FULLGRAPH_REASON)
    _escape_outside = {
        doing: dynamo.disable(_call, reason=reason) for doing, reason in ESCAPE_REASONS.items()
    }
    _mark_entries()  # (all of them marked below, once)
    _reasons_given = True
    _mark_not_roots()
    _watch_hook_loop(dynamo)  # (dynamo imported while torch hooks of unihook's live)


def outside_compiler(call: Callable[[], Any], doing: str) -> Any:
    """`call()` outside dynamo: the torch backend's escape (`add_compiler_escape`), taken
    while dynamo traces (a global hook registered inside a compiled forward, a hook removed
    there, `unihook.backends()` there)."""
    return _escape_outside.get(doing, _escape_outside["registration"])(call)


def outside_dynamo(fn: Callable[[], None]) -> Callable[[], None]:
    """`fn` run with dynamo off, also when called from compiled code (a hook's removal inside
    a compiled forward: dynamo would compile the frames it runs, which read other frames).
    Without dynamo imported nothing is compiled: `fn` runs as it is (no 2 s import)."""

    def run() -> None:
        if "torch._dynamo" in sys.modules:
            _outside_dynamo(fn)
        else:
            fn()

    return run


_dynamo_compiling = torch.compiler.is_dynamo_compiling  # a plain `return False` when run


# torch.jit.script compiles a module's forward hooks from source, taking their `__name__` in
# get_hook_stubs: unihook's objects raise ScriptedHookError there (see unihook.backend)
add_hook_compiler(
    torch.jit._recursive.get_hook_stubs.__code__, "torch.jit.script", "nn_module", "torch"
)


def _dispatchers_refusal(dispatcher: EagerUnderCompile, module: Any, backend: str) -> Any:
    state = dispatcher.__self__
    if isinstance(state, ModuleBackward):
        site = state.site(module)
    else:
        site = Site.of("full_backward", backend, module)
    if module is None:
        return site, _BACKWARD_HOOKS
    # dispatchers of other modules' states a library carried in, or put back after their
    # removal, do nothing here: they go, all at once, as at the module's first call
    # (helper-168's FINDING 3, a fused conv; helper-180's FINDING 1, several fused modules)
    dropped = False
    for attr in ("_forward_pre_hooks", "_forward_hooks"):
        for hook in list(getattr(module, attr, {}).values()):
            other = hook.__self__ if type(hook) is EagerUnderCompile else None
            if isinstance(other, ModuleBackward) and other.drop_carried(module):
                dropped = True
    live = any(
        type(hook) is EagerUnderCompile
        for attr in ("_forward_pre_hooks", "_forward_hooks")
        for hook in list(getattr(module, attr, {}).values())
    )
    if dropped and not live:
        # (the module compiled, not the one the carried dispatchers came from: helper-181)
        return Site.of("full_backward", backend, module), (
            "inert dispatchers of another module's or of a removed hook that a library "
            "carried in (fuse_modules, prepare_qat, a copied hook dict); taken out now: "
            "compile it again"
        )
    if dropped:
        return site, f"{_BACKWARD_HOOKS}; inert ones a library carried in were taken out"
    return site, _BACKWARD_HOOKS


_BACKWARD_HOOKS = (
    "unihook backward hooks (remove them first: the original module keeps them; a module "
    "deep-copied from a hooked one, as fuse_modules copies a conv, has copies of its hooks)"
)


class EagerUnderCompile:
    """A dispatcher that dynamo does not trace. `__self__` is the dispatcher's owner, as for
    the bound method it wraps (a deep copy of the module re-binds it)."""

    __slots__ = ("fn",)
    # (helper-178's FINDING 4: torch.jit.script failed on it with an AttributeError)
    __name__ = HookName(_dispatchers_refusal)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    @property
    def __self__(self) -> Any:
        return getattr(self.fn, "__self__", None)

    @partial(not_a_compile_root, callees_too=True)
    def __call__(self, *args: Any) -> Any:
        # False when run, True while dynamo traces (it folds the call): the graph holds only
        # the call outside dynamo. About 0.3 us per call in eager, two calls per module call.
        if _dynamo_compiling():
            return _dispatch_outside(self.fn, *args)
        return self.fn(*args)


_lock = RegistryLock()
_watching: set[int] = set()  # the unihook torch hooks alive (a token each)
_tokens = count()
_switched = False  # unihook turned the guards on: it turns them off again
# What dynamo had compiled when unihook last turned the guards off (`_compiled`), or None when
# a frame was compiling then; at first, what it has compiled before it compiles anything.
_compiled_when_off: tuple[int, Any] | None = (0, None)
# A switch-on found code compiled blind and no drop finished since: every registration drops it
# (one made meanwhile returned before the first one's drop, and its hook was skipped: helper-96's
# FINDING 3), and a switch-off marks None (a registration cut short before its drop took a
# mark that counted the blind code as seen: FINDING 2).
_drop_owed = False
_cancel_reason: Callable[[], None] | None = None  # waits for dynamo's import while hooks live


def watch_hooks() -> Callable[[], None]:
    """Make dynamo guard on empty module hook dicts while unihook has a torch hook (called at
    every registration; returns the release, for the handle). Before dynamo is imported nothing
    is compiled, and a hook dict that is not empty when dynamo compiles is guarded anyway:
    dynamo is never imported for this."""
    global _switched, _cancel_reason, _drop_owed
    token = next(_tokens)

    def release() -> None:
        # idempotent (a registration cut short is undone by it: see unihook._locks)
        global _switched, _cancel_reason, _compiled_when_off
        if _lock.deferred(release):
            return
        with _lock, _lock.mutex:
            _watching.discard(token)
            if _watching:
                return
            _unwatch_hook_loop()
            cancel = _cancel_reason
            if cancel is not None:
                cancel()  # (a no-op once it ran) no import hook left behind
                _cancel_reason = None
            dynamo = imported("torch._dynamo")
            if _switched and dynamo is not None:
                # torch's default back: code compiled meanwhile keeps its (now extra) guards
                mark = _switch_off(dynamo)
                _compiled_when_off = None if _drop_owed else mark
                _switched = False

    undo_if_unfinished(release)
    blind = False
    with _lock, _lock.mutex:
        _watching.add(token)
        if not _reasons_given and _cancel_reason is None:
            # (the cancel first, then what it cancels)
            _cancel_reason = partial(cancel_when_imported, "torch._dynamo", _give_reason)
            when_imported("torch._dynamo", _give_reason)
        dynamo = imported("torch._dynamo")  # (another thread importing it compiles nothing yet)
        _mark_entries()
        if dynamo is not None:
            _watch_hook_loop(dynamo)
        if dynamo is not None and _hook_guards_skipped(dynamo):
            owed = _drop_owed
            # (owed until the look below: a registration cut short before it, a Ctrl-C, left
            # none owed, and its undo's switch-off counted the blind code as seen: helper-98's
            # FINDING 2; at worst one drop too many)
            _drop_owed = True
            _switched = True  # (before the switch: `release` turns it back)
            _set_hook_guards_skipped(dynamo, False)
            _drop_owed = owed or _compiled_blind(dynamo)
        blind = _drop_owed
    if blind:
        # compiled without the guards: blind to hooks added since. (Outside the lock: dynamo's
        # lock is never asked for under a registry lock, see unihook._locks.)
        forget_compiled()
        with _lock, _lock.mutex:
            _drop_owed = False  # (the guards are on: nothing compiled since is blind)
    return release


def _compiled(dynamo: Any) -> tuple[int, Any]:
    """What dynamo has compiled: how many code objects it made, and its record of the last
    (the weak reference its tracker keeps, one per code made: the record, not the code, which
    a drop frees). It makes a frame's code before it builds the frame's guards (which read the
    setting), so a frame compiling meanwhile counts only once it can be blind. The count starts
    again at ``torch._dynamo.reset()``, which drops every compiled frame (a reset followed by
    as many compiles makes another last record, also where its code died: helper-96's
    FINDING 1). Read at registration only, importing nothing (dynamo still being imported on
    another thread has compiled nothing)."""
    made = getattr(getattr(_converter(dynamo), "output_codes", None), "seen", ())
    return len(made), made[-1] if made else None


def _compiled_blind(dynamo: Any) -> bool:
    """Whether dynamo may have built a frame's guards with the hook guards off since unihook
    last turned them off (on any thread). A frame compiled while they were on guards the hook
    dicts whatever the setting says later: a hook registered and removed each step no longer
    drops every compiled frame each step (helper-91's FINDING 4), nor waits for `_held_gil`
    beside a busy thread (FINDING 3)."""
    mark = _compiled_when_off
    if mark is None:
        return True
    made, last = _compiled(dynamo)
    # (by the record, not its code: a drop frees the codes, and a dead code taken for one
    # compiled since dropped again at every switch-on: helper-98's FINDING 1)
    return made != mark[0] or last is not mark[1]


def _switch_off(dynamo: Any) -> tuple[int, Any] | None:
    """Turn the hook guards off (torch's default) and return what dynamo had compiled by then
    (`_compiled`), or None if a frame was compiling: one that made its code before the mark may
    build its guards after the switch, blind. (In this order: a frame compiling after the look
    made its code after the mark. dynamo's lock is not asked for: see unihook._locks.)"""
    compiled = _compiled(dynamo)
    compiling = _converting_anywhere(dynamo)
    _set_hook_guards_skipped(dynamo, True)
    return None if compiling else compiled


def _converting_anywhere(dynamo: Any) -> bool:
    """Whether a thread, this one too, is inside dynamo's conversion of a frame (holds its
    compile lock: `_compiling_elsewhere`) or waits for that lock to make one (dynamo's
    callback, in ``convert_frame``, near the top of its stack: `_near_tops`)."""
    converter = _converter(dynamo)
    file = getattr(converter, "__file__", None)
    if file is None:
        return False
    if _compiling_elsewhere(converter) is not None or _converting_here(converter):
        return True
    return any(_file_of(code) == file for _, code in _near_tops())


def _converter(dynamo: Any) -> Any:
    """``torch._dynamo.convert_frame``, or None before its import finished."""
    return getattr(dynamo, "convert_frame", None)


def _hook_guards(dynamo: Any) -> Any:
    """dynamo's config entry of ``skip_nnmodule_hook_guards``, or None where torch keeps none.

    Since torch 2.13 a value set by assignment (``config.x = v``) holds on the thread that set
    it only (a ContextVar: each new thread starts from the defaults), so a frame compiled on
    another thread read True, had no guard on empty hook dicts, and missed a hook unihook added
    later, on every thread that reused it; and each new thread's first registration switched
    again and dropped every compiled frame (helper-80's FINDINGS 1 and 3). unihook changes the
    entry's default instead, which every thread reads unless it set a value of its own."""
    config = getattr(getattr(dynamo.config, "_config", None), "get", None)
    return None if config is None else config("skip_nnmodule_hook_guards")


def _hook_guards_skipped(dynamo: Any) -> bool:
    entry = _hook_guards(dynamo)
    return bool(dynamo.config.skip_nnmodule_hook_guards if entry is None else entry.default)


def _set_hook_guards_skipped(dynamo: Any, skipped: bool) -> None:
    entry = _hook_guards(dynamo)
    if entry is None:
        dynamo.config.skip_nnmodule_hook_guards = skipped
    else:
        entry.default = skipped


def watch_call_impl() -> Callable[[], None]:
    """While a global hook exists: if dynamo gets imported, make it know torch's own
    ``Module._call_impl``. Returns the canceller."""
    callback = partial(_unpatched_for_dynamo)  # this hook's own: its cancel takes this one
    cancel = partial(cancel_when_imported, "torch._dynamo", callback)
    undo_if_unfinished(cancel)
    when_imported("torch._dynamo", callback)
    return cancel


def _unpatched_for_dynamo(dynamo: Any) -> None:
    from ._global import original_call_impl

    original = original_call_impl()
    if original is not None:
        # Dynamo takes ``Module._call_impl`` as it is when dynamo is imported for torch's own,
        # and traces only ``forward`` of a module without hooks that calls torch's own: had
        # unihook's wrapper been installed then, dynamo would skip it for every inner module.
        dynamo.utils.unpatched_nn_module_call_impl = original
        dynamo.variables.nn_module.unpatched_nn_module_call_impl = original


def forget_compiled() -> None:
    """Drop every frame dynamo compiled: the next call recompiles with the hooks as they are.

    ``torch._dynamo.reset_code_caches`` frees the cache entries, which crashed a thread running
    a compiled frame meanwhile (helper-68's attack). While another thread runs one the entries
    are invalidated instead, as dynamo does itself when an object a guard holds dies: kept,
    their guards failing from then on. Those still count towards ``recompile_limit`` (beyond
    it dynamo runs the frame eagerly, with its warning naming unihook's reason; under
    ``fullgraph=True`` it raises), so they are only for that case: with other threads alive
    but none inside a compiled frame (a progress bar's, a data loader's) the caches are reset
    as when this thread is alone (helper-71's attack). The test and the reset run without
    another thread running Python in between (`_held_gil`): one that entered a compiled frame
    after the test would be reset under."""
    dynamo = imported("torch._dynamo")
    if dynamo is None:
        return
    from torch._dynamo import convert_frame

    _disabled_code()
    # (dynamo's lock first: a frame compiling on another thread meanwhile is dropped too; and
    # a thread holding it, whose finalizer removes a global hook, asks for `_holding` next:
    # the other order deadlocked, helper-80's FINDING 2)
    with _compile_lock(convert_frame), _held_gil():
        if not _compiled_frame_elsewhere(convert_frame) and not _converting_here(convert_frame):
            dynamo.reset_code_caches()
            return
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo.guards import DeletedGuardManagerWrapper

        for weak in (*convert_frame.input_codes.seen, *convert_frame.output_codes.seen):
            code = weak()
            for entry in () if code is None else _debug_get_cache_entry_list(code):
                guards = entry.guard_manager
                extra = getattr(guards, "extra_state", None)
                if extra is not None and not isinstance(guards, DeletedGuardManagerWrapper):
                    extra.invalidate(entry, DeletedGuardManagerWrapper(_FORGOTTEN))
                    # The entry's old guards keep pointers to it, which dynamo's finalizers
                    # follow when an object they guard dies (dynamo's own invalidation drops
                    # them with the guards): a reset freeing the entry later left them
                    # dangling, and the exit's finalizers crashed (SIGSEGV).
                    guards.cache_entry = None
                    guards.extra_state = None


def _compiled_frame_elsewhere(convert_frame: Any) -> bool:
    """Whether a thread other than this one runs a frame dynamo compiled: see
    `_threads_in_compiled_frames`."""
    return bool(_threads_in_compiled_frames(convert_frame, first=True))


# Where `_threads_in_compiled_frames` found a thread: inside a compiled frame or callable; in
# a frame conversion (waiting for dynamo's lock where another thread holds it) with no
# compiled frame below it; in one, inside a compiled frame.
InFrame = Literal["compiled", "converting", "converting in compiled"]


def _threads_in_compiled_frames(convert_frame: Any, *, first: bool = False) -> dict[int, InFrame]:
    """The threads other than this one (all, or the `first` found) that run a frame dynamo
    compiled (one of its transformed code objects is on that thread's stack: threads
    `threading` does not know, as `_thread`'s, too) or are inside a compiled callable
    (dynamo's `compile_wrapper` or its frame conversion on its stack), each with where
    (`InFrame`): there it may be in dynamo's C frame callback, whose compiled frame is not on
    the stack yet and which holds the frame's cache entries across the lock it waits for to
    compile one (a reset then freed them under it: SIGSEGV under load, CI on 67e982e). The one
    walk of whole stacks left (see `_near_tops`): it runs where no other thread runs Python
    (`_held_gil`, dynamo's lock held), with the collector off (no finalizer of the frames it
    makes lets another thread in), so no stack changes under it."""
    from torch._dynamo import eval_frame

    compiled = {id(code) for code in (w() for w in convert_frame.output_codes.seen) if code}
    dynamo_files = {eval_frame.__file__, convert_frame.__file__}
    disabled = _disabled  # (made by the caller, outside its holds: `_disabled_code`)
    me, found = threading.get_ident(), dict[int, InFrame]()
    with collector_paused():
        for ident, frame in _current_frames().items():
            where: InFrame | None = None
            while ident != me and _a_frame(frame):
                code = frame.f_code
                if id(code) in compiled:
                    where = "compiled" if where is None else "converting in compiled"
                    break
                if code is disabled:
                    # (dynamo's callback is off inside, or run-only under a stance such as
                    # "eager_on_recompile": what runs compiled there is found above it, and a
                    # compiled frame below, below. aot's backward runs in one: a
                    # thread training back to back was seen there, counted, at a removal's
                    # looks, which gave up under its next forward: helper-225's FINDING 1)
                    frame = _back(frame)
                    continue
                if _file_of(code) in dynamo_files and where is None:
                    if _file_of(code) != convert_frame.__file__:
                        where = "compiled"
                        break
                    where = "converting"  # (walked on: a compiled frame below it counts)
                    if first:
                        break
                frame = _back(frame)
            if where is not None:
                found[ident] = where
                if first:
                    return found
        return found


def _disabled_code() -> Any:
    """The code of the wrapper ``torch._dynamo.disable`` makes (recursive: dynamo compiles
    nothing while it runs), made once, before a walk's holds (`_threads_in_compiled_frames`
    reads it)."""
    global _disabled
    if _disabled is None:
        import torch._dynamo

        _disabled = getattr(torch._dynamo.disable(_disabled_code), "__code__", False)
    return _disabled


_disabled: Any = None  # (False: dynamo's disable made no function)


def _file_of(code: Any) -> Any:
    """`code`'s file name. Another thread's frame, read while dynamo converts a frame there,
    has answered ``f_code`` with a dict (helper-98's FINDING 3): its walk takes no attribute
    of it for granted, nor hashes it (by id)."""
    return getattr(code, "co_filename", None)


def _converting_here(convert_frame: Any) -> bool:
    """Whether this thread runs inside dynamo's conversion of a frame (a finalizer the
    collector ran there removed the last hook, or a hook dynamo called): dynamo's C frame
    callback, below it, holds that frame's cache entries across the conversion, and a reset
    freed them under it (SIGSEGV in 2 of 13 runs of helper-80's finalizer scenario, CI on
    8c34783)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == convert_frame.__file__:
            return True
        frame = frame.f_back  # (this thread's own stack: it does not change under the walk)
    return False


def _current_frames() -> dict[int, Any]:
    """`sys._current_frames()` with the garbage collector off: it holds the interpreter's lock
    on its thread list while it makes frame objects, and a collection those allocations
    started freed a `threading.local`, whose cleanup takes that lock (CPython 3.11): the
    process hung (CI on 67e982e, a ModuleBackward collected)."""
    with collector_paused():  # (counted across threads: see unihook's _collector)
        return sys._current_frames()


@contextmanager
def compiles_held() -> Iterator[None]:
    """No frame compiles meanwhile (dynamo's lock, once dynamo is imported): a global hook
    coming or going changes what the guards of a frame compiling on another thread read
    (`InternalTorchDynamoError` there: helper-73's attack)."""
    if imported("torch._dynamo") is None:
        yield
        return
    from torch._dynamo import convert_frame

    with _compile_lock(convert_frame):
        yield


@contextmanager
def _compile_lock(convert_frame: Any) -> Iterator[None]:
    """dynamo's compile lock, taken by unihook (its thread listed in `_holders` meanwhile: a
    hook change on another thread does not wait for it, `_compiling_elsewhere`; it may be
    waiting for that change's registry lock)."""
    with convert_frame.compile_lock:
        _holders.append(threading.get_ident())  # (a Ctrl-C before the try: a later compile
        try:  # of this thread's is taken for unihook's, not waited for, as torch's own hooks)
            yield
        finally:
            _holders.remove(threading.get_ident())


# the threads that hold dynamo's compile lock for unihook (once per hold: it is reentrant)
_holders: list[int] = []


@contextmanager
def compiled_frames_out() -> Iterator[None]:
    """While a global hook goes: no other thread runs a frame dynamo compiled (dynamo's lock
    held too, as `compiles_held`, and no other thread runs Python meanwhile: `_held_gil`). A
    compiled frame that traced the hook in replays the hook's side effects after its graph,
    reaching the hook again by where it was (``_global_forward_hooks[0]``, ``_pre_snapshot[0]``):
    one removed while a frame ran failed that call with KeyError or IndexError (helper-107's
    FINDING 3), and a hook moved into its place would have taken its side effects. Another
    thread in a compiled frame is waited for until it is between compiled calls, at most
    `_WAIT` seconds, then the change goes ahead (as torch's own removal would, then); each
    removal waits afresh (a frame is not told from the next call's: with the first wait's
    time kept, a removal after one that gave up did not wait at all, helper-113). A thread
    only converting a frame (no compiled frame below) waits for dynamo's lock, which this one
    holds: it compiles after, with the hooks as they are then, and is not waited for (two
    threads compiling by turns were always seen there: a wait for them lasted as long as they
    compiled, helper-224's FINDING 1). One converting inside a compiled frame is waited for,
    and left dynamo's lock `_LOCK_GIVEN` seconds between looks: under load it missed the few
    milliseconds between two looks for a whole second, and the removal, giving up, failed the
    compiled frame's call with KeyError (CI on 4e4bb9c)."""
    if imported("torch._dynamo") is None:
        yield
        return
    from torch._dynamo import convert_frame

    _disabled_code()
    pause = 0.0001
    seen: dict[int, float] = {}  # (this removal's: when it first saw each thread in one)
    while True:
        with _compile_lock(convert_frame), _held_gil(keep=True):
            found = _threads_in_compiled_frames(convert_frame)
            # (by thread: one parked in a compiled frame for good, a `torch.compiler.disable`d
            # wait, is waited for once, and another still until it is between calls)
            running = {ident for ident, where in found.items() if where != "converting"}
            if not _waited_for(running, seen):
                yield
                return
        time.sleep(_LOCK_GIVEN if "converting in compiled" in found.values() else pause)
        pause = min(2 * pause, 0.005)


def _watch_hook_loop(dynamo: Any) -> None:
    """While unihook has a torch hook: dynamo's loop over a module's hook dicts
    (``nn_module_get_all_hooks``, looked up in its module at each call) marks the thread in it
    (`_in_hook_loop`), for `hooks_changeable`: the top frames `_near_tops` reads missed the
    loop under a trace function's own calls (a debugger's: helper-107's and helper-109's
    FINDING 2). A loop entered before this went in is still found by its frame."""
    global _loop_original
    utils: Any = getattr(dynamo, "utils", None)
    original = getattr(utils, "nn_module_get_all_hooks", None)
    if original is None:
        return
    with _loop_lock:
        if _loop_original is not None or not _watching:
            return

        def nn_module_get_all_hooks(*args: Any, **kwargs: Any) -> Any:
            # (a number of its own keys this run, for `_waited_for`: an id of an object, freed
            # and reused by a later run, took that run for one waited for already: helper-113)
            run = next(_loop_runs)
            try:
                _in_hook_loop[run] = threading.get_ident()
                return original(*args, **kwargs)
            finally:
                _in_hook_loop.pop(run, None)

        nn_module_get_all_hooks.__wrapped__ = original  # type: ignore[attr-defined]
        _loop_original = original
        utils.nn_module_get_all_hooks = nn_module_get_all_hooks


def _unwatch_hook_loop() -> None:
    """dynamo's own loop back (the last unihook torch hook went)."""
    global _loop_original
    with _loop_lock:
        original, _loop_original = _loop_original, None
        utils: Any = getattr(imported("torch._dynamo"), "utils", None)
        current = getattr(utils, "nn_module_get_all_hooks", None)
        if original is not None and getattr(current, "__wrapped__", None) is original:
            utils.nn_module_get_all_hooks = original


# dynamo's loop over hook dicts, while `_watch_hook_loop`'s wrapper replaces it
_loop_original: Any = None
_loop_lock = threading.Lock()  # (a leaf: nothing is asked for under it)
# the runs of dynamo's hook loop under way: the thread of each, by the run's number
_in_hook_loop: dict[int, int] = {}
_loop_runs = count(-1, -1)  # (negative: no frame id, `_near_tops`' keys, is one)


@contextmanager
def hooks_changeable() -> Iterator[None]:
    """While a module's hooks change: no other thread is in dynamo's live loop over a
    module's hook dicts (``nn_module_get_all_hooks``, which its frame callback runs outside
    its compile lock for each frame it looks at), nor compiling a frame (holding that lock:
    tracing reads the hook dicts live, ``get_items_from_dict``, and the guards, built after the
    trace and the backend's compile, read them by the keys the trace saw: a KeyError). A hook
    another thread registered or removed there failed the compiled call ("OrderedDict mutated
    during iteration", or a KeyError; a hook added there was left out of the compiled code
    its guards passed, as torch's own is; CI on ad2b675). Such a thread is waited for, as long
    as its compile, at most `_WAIT` seconds from the first wait for it (`_waited_for`), then
    the change goes ahead as torch's own would.
    Neither dynamo's lock nor the GIL is held meanwhile: a finalizer that loop ran on the other
    thread may change hooks too (a deadlock, helper-90's FINDING 1), and another busy thread is
    not stalled (FINDING 5). A thread that enters such a loop between the look and the change
    (a GIL switch in those microseconds) is not waited for."""
    dynamo = imported("torch._dynamo")
    utils = getattr(dynamo, "utils", None)
    if utils is not None:
        looping = getattr(_loop_original or utils.nn_module_get_all_hooks, "__code__", None)
        convert_frame = getattr(dynamo, "convert_frame", None)
        # No run of the loop is marked before unihook has a torch hook (the first one comes
        # now): one that began before, under a trace function's deeper calls, is found on the
        # whole stacks (helper-113's FINDING 2: "OrderedDict mutated during iteration")
        deep = _loop_original is None
        pause = 0.0001
        while _waited_for(_reading_elsewhere(convert_frame, looping, deep), _first_seen):
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
    yield


def _reading_elsewhere(convert_frame: Any, looping: Any, deep: bool = False) -> set[Any]:
    """What another thread does now that reads a module's hook dicts: its compile (it holds
    dynamo's compile lock, keyed by its thread and the compiles started: `_compiling_elsewhere`;
    the trace, the guards built after it and the backend's compile all run under that lock) and
    dynamo's loop over a module's hook dicts that its frame callback runs outside the lock
    (``looping``, keyed by the frame's id). That loop calls no Python function: a thread the
    GIL left inside it has it on top of its stack (or under a trace function's frames), so
    only the top frames are read (`_near_tops`); a run under a trace function's deeper calls
    is found by its mark (`_watch_hook_loop`), or, `deep`, on the whole stacks."""
    busy: set[Any] = set()
    compiling = None if convert_frame is None else _compiling_elsewhere(convert_frame)
    if compiling is not None:
        busy.add(compiling)
    busy.update(key for key, code in (_whole_stacks() if deep else _near_tops()) if code is looping)
    me = threading.get_ident()
    busy.update(key for key, ident in list(_in_hook_loop.items()) if ident != me)
    return busy


def _waited_for(running: set[Any], seen: dict[Any, float]) -> bool:
    """Whether one of the `running` frames (ids) is waited for: it has been seen running for
    less than `_WAIT` seconds (`seen`: when each still running was first seen). A longer one
    (a compile, inductor's) is waited for once, by every change together: a thread registering
    hooks on modules that compile never read waited a second per hook (helper-101's FINDING
    1). Threads changing hooks share `_first_seen`: read and changed under `_seen_lock` (a
    loop over it while another thread popped a key failed a registration with "dictionary
    changed size during iteration": CI on 59b67ae)."""
    with _seen_lock:
        for key in [key for key in tuple(seen) if key not in running]:
            seen.pop(key, None)  # (ended)
        now = time.monotonic()
        return any(now - seen.setdefault(key, now) < _WAIT for key in running)


# when `hooks_changeable` first saw each frame it waits for that is still running, by id
_first_seen: dict[Any, float] = {}
# (reentrant: a finalizer run under it may change a hook; nothing else is asked for under it)
_seen_lock = threading.RLock()


# the longest a hook change waits for another thread to leave dynamo's loop over hook dicts
_WAIT = 1.0
# how long a global hook's removal leaves dynamo's lock to a thread that waits for it
_LOCK_GIVEN = 0.02


class WatchedPinned(Pinned):
    """Backward dispatchers pinned in a module's hook dicts, which go in (lazily, at a call's
    start, for the global hooks) and out (at the end of the last call of a removed state) while
    no other thread is in one of dynamo's loops over hook dicts, as a hook does: a
    `hooks_changeable` change (helper-90's FINDING 7: a call ending on one thread failed the
    compiled call tracing on another)."""

    __slots__ = ()

    @classmethod
    def install(cls, *args: Any, **kwargs: Any) -> Pinned:
        with hooks_changeable():
            return super().install(*args, **kwargs)

    def remove(self) -> None:
        with hooks_changeable():
            super().remove()


def _compiling_elsewhere(convert_frame: Any) -> tuple[int, int] | None:
    """The thread other than this one that holds dynamo's compile lock, with the count of
    compiles started (together a compile's key for `_waited_for`), or None. Read from the
    lock's repr (``owner=<thread id>``, C's RLock and Python's alike): an acquire and release
    to test it would leave dynamo's lock held where a Ctrl-C lands between them."""
    found = _OWNER.search(repr(getattr(convert_frame, "compile_lock", None)))
    owner = int(found.group(1)) if found is not None else 0
    if not owner or owner == threading.get_ident() or owner in _holders:
        return None
    started = getattr(convert_frame, "FRAME_COMPILE_COUNTER", None)
    return owner, sum(started.values()) if isinstance(started, dict) else 0


_OWNER = re.compile(r"\bowner=(\d+)")


def _near_tops() -> list[tuple[int, Any]]:
    """(frame id, code) of the `_NEAR` top frames of each thread other than this one.
    No deeper: CPython 3.11 reads freed memory following ``f_back`` through another thread's
    stack (a frame answered ``f_code`` with a dict: helper-98's FINDING 3; a recipe's walk
    crashed with SIGSEGV: helper-101's FINDING 6 test; cpython#99110's kin), and a walk of every
    stack made each hook change cost O(threads x depth) (16 threads 40 deep: 217 to 273 us a
    register / remove pair, 87 to 89 us now; 54 to 63 us alone either way). A walk stops at
    what is not a frame: under load one read a list there (AttributeError: 'list' object has
    no attribute 'f_code', a hook registration failed; the dev suite, 2026-12-05)."""
    me, found = threading.get_ident(), []
    with collector_paused():  # (see `_back`)
        for ident, frame in _current_frames().items():
            for _ in range(_NEAR if ident != me else 0):
                if not _a_frame(frame):  # (None at the bottom)
                    break
                found.append((id(frame), frame.f_code))
                frame = _back(frame)
    return found


def _back(frame: Any) -> Any:
    """The frame below `frame` in another thread's stack, or None (see `_a_frame`). Only with
    the collector off: CPython makes the frame object of the one below there, and a collection
    that allocation started runs finalizers, which let the other thread run meanwhile: it
    returned from both frames, and the new object pointed at a popped frame (CPython 3.11:
    SIGSEGV, or the collector's lists corrupted and a later collection looping for good; the
    dev suite at `tests/test_collector_paused.py`, CI on 9d449c5; `_near_tops` walked with
    the collector on). Turned off again where another thread's own bracket turned it on
    meanwhile (`collector_kept_off`)."""
    collector_kept_off()
    return getattr(frame, "f_back", None)


def _a_frame(frame: Any) -> bool:
    """Whether a walk of another thread's stack may read `frame`'s links: not at the bottom
    (None), nor at what is no frame (see `_near_tops`)."""
    return hasattr(frame, "f_code")


def _whole_stacks() -> list[tuple[int, Any]]:
    """(frame id, code) of every frame of each thread other than this one: read where no
    other thread runs Python (`_held_gil`) with the collector off, so no stack changes under
    it (see `_near_tops`). Only while unihook has no torch hook (`hooks_changeable`)."""
    me, found = threading.get_ident(), []
    with _held_gil(), collector_paused():
        for ident, frame in _current_frames().items():
            while ident != me and _a_frame(frame):
                found.append((id(frame), frame.f_code))
                frame = _back(frame)
    return found


# how many top frames of another thread `_near_tops` reads: the frame itself, and under a
# trace function's (a debugger's) its call and a wait inside it
_NEAR = 4


@contextmanager
def _held_gil(*, keep: bool = False) -> Iterator[None]:
    """No other thread runs Python inside (unless this one blocks): a thread waiting for the
    GIL asks for it only after the switch interval, raised to `_HOLD` seconds; the sleep lets
    one whose wait began before go first (a wait begun before a switch asks for nothing).
    With `keep`, the holds nested inside do not: another thread let in between what this one
    saw and what it does would break it (`compiled_frames_out`: a thread entering a frame
    compiled with the hook going, its `forget_compiled` nested, failed with KeyError after the
    removal, 1 of 40 runs under load)."""
    with _holding:  # (one interval to put back; re-entered by a removal a finalizer makes)
        global _kept
        interval, kept = sys.getswitchinterval(), _kept
        try:
            sys.setswitchinterval(_HOLD)
            if not kept:
                time.sleep(0)
            _kept = kept or keep
            yield
        finally:
            _kept = kept
            sys.setswitchinterval(interval)


_holding = threading.RLock()
_kept = False  # (inside a hold with `keep`: read and changed under `_holding`)


if imported("torch._dynamo") is not None:
    # Imported after dynamo (the first torch hook, registered inside a compiled forward): the
    # direct ways out now. (Else `watch_hooks` takes them when dynamo is imported while a
    # torch hook lives; imported after the last one went, the lazy ones stay, with the same
    # reasons: `_lazy`.)
    _give_reason(sys.modules["torch._dynamo"])
