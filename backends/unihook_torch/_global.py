"""Global hooks for torch.

Forward post-hooks and registration hooks are torch's own. Global forward pre-hooks are not:
torch decides whether to pass kwargs to a global pre-hook by looking the hook's id up in each
*module's* with_kwargs set, so a global with_kwargs pre-hook cannot exist natively. Global
backward hooks are not either: torch's own raise on in-place ops after any module (see
``_backward``). While any such hook is registered, ``Module._call_impl`` is wrapped: it runs
the global pre-hooks first (in registration order, before the module's own pre-hooks, as torch
runs global ones), and for a module without backward hooks of its own, passes the inputs and
the final output (after every forward hook, as torch's BackwardHook) through the global
backward dispatchers. In a process that has compiled, ``Module.__call__`` is replaced too, for a
module compiled in place (``module.compile()``) before the wrapper went in: its compiled call
bound torch's ``_call_impl``, and runs inside the wrapper. Removing the last such hook puts
torch's functions back.
"""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from functools import partial
from itertools import count
from typing import Any, Callable

import torch
import torch.nn.modules.module as torch_module

from unihook.backend import (
    HookName,
    ModuleBackward,
    Pinned,
    RegistryLock,
    Site,
    WeakIdentityKeys,
    add_to_global_table,
    check_pre_kwargs_result,
    global_label,
    kwargs_post_hook,
    show_value,
    undo_if_unfinished,
)
from unihook.errors import HookReturnTypeError

from . import NAME, _compile, insert
from ._compile import EagerUnderCompile, _dynamo_compiling, not_a_compile_root

Hook = Callable[..., Any]

_lock = RegistryLock()  # (a finalizer removing a hook meanwhile waits for it)
_ids = count()
_pre_hooks: dict[int, tuple[Hook, bool]] = {}
_pre_snapshot: tuple[tuple[Hook, bool], ...] = ()
# torch's own (as found when the wrapper goes in), kept after it goes out: a thread inside the
# wrapper while another removes the last hook still calls it
_torch_call_impl: Callable[..., Any] = torch_module.Module._call_impl
_torch_call: Callable[..., Any] = torch_module.Module.__call__  # the same, for `_call`
# torch's, as found when this module is imported (the wrapper lives here: it is not in yet)
TORCH_CALL_CODE = torch_module.Module._call_impl.__code__
_installed = False
_backward: ModuleBackward | None = None  # the global backward hooks, when there are some
# _backward's dispatchers: pre, post, and pre and post as pinned (`_pin_dispatchers`)
_dispatch: (
    tuple[EagerUnderCompile, EagerUnderCompile, EagerUnderCompile, EagerUnderCompile] | None
) = None
# where _backward's dispatchers are pinned (a removed state's stay pinned until its calls end)
_pinned_in: WeakIdentityKeys[Pinned] = WeakIdentityKeys()
# the same modules' backward hook dicts, absorbed meanwhile (see `_pin`)
_absorbing: WeakIdentityKeys[Any] = WeakIdentityKeys()


@partial(not_a_compile_root, callees_too=True)
def _pin_dispatchers(module: Any) -> Any:
    """torch's BackwardHook sees the args after every forward pre-hook: a module with some (its
    own, torch's global ones, or its own backward dispatchers) gets the global dispatchers
    pinned last in its own hook dicts (``unihook._pinned``) until the global backward hooks
    are gone. Beside a module's own dispatchers, whichever runs first in a call takes the
    global hooks (``unihook._module_backward``)."""
    if _dynamo_compiling():
        # outside dynamo (its lock, a process-wide change): a graph break, as the dispatchers
        # pinned take one; under fullgraph=True, their error (FULLGRAPH_REASON). Also the test:
        # dynamo, reading the modules pinned in, takes an OptimizedModule there for the module
        # it wraps, and fails an assertion when it traces that one.
        _compile._dispatch_outside(_pin, module)
    elif module not in _pinned_in:
        _pin(module)
    return module._forward_pre_hooks


def _pin(module: Any) -> None:
    """The global dispatchers pinned in `module`, whose backward hook dicts they absorb
    meanwhile: torch's own hooks of the module run among the global hooks, after them, as
    torch runs its global hooks first (in torch's BackwardHook they ran first, helper-148's
    G8; see ``_native_backward``)."""
    if module not in _pinned_in:
        from ._backward import KWARGS_FLAGS
        from ._backward import _TorchDispatchers as access
        from ._native_backward import Absorption

        with _lock, _lock.mutex:
            if _dispatch is not None and module not in _pinned_in:
                hooks = (("_forward_pre_hooks", _dispatch[2]), ("_forward_hooks", _dispatch[3]))
                always = "_forward_hooks_always_called"
                # (a shallow copy of a module they are pinned in shares its dicts: it has them)
                shared = _compile.WatchedPinned.find(module, hooks, always, access)
                pinned = shared or _compile.WatchedPinned.install(
                    module, hooks, always, access.new_id, access, tail=True, flags=KWARGS_FLAGS
                )
                absorption = Absorption(module, state=_backward)
                try:
                    _pinned_in[module] = pinned
                    _absorbing[module] = absorption
                    absorption.take()
                except BaseException:  # (a Ctrl-C: the next call pins again, once)
                    absorption.release()
                    _absorbing.pop(module, None)
                    _pinned_in.pop(module, None)
                    if shared is None:  # (else they are the original's too)
                        pinned.remove()
                    raise


@not_a_compile_root
def _call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not _installed:  # bound while installed (``Module.compile()``), now gone
        return _torch_call_impl(self, *args, **kwargs)
    return _run(self, _torch_call_impl, args, kwargs)


@not_a_compile_root
def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Module.__call__`` while the wrapper is in: torch's ``_wrapped_call_impl``, but a
    module compiled in place (``module.compile()``) before the wrapper went in has a compiled
    call of torch's own ``_call_impl``, bound then: it runs inside the wrapper (the global
    pre-hooks and backward dispatchers would miss the module otherwise)."""
    compiled = self._compiled_call_impl
    # While dynamo traces, a nested compiled call is inlined as what it compiled: torch's
    # `_call_impl` or the wrapper, which runs it (dynamo's test of the code object would not
    # hold there, and a module compiled in place inside a compiled one missed its hooks).
    if compiled is None or torch.compiler.is_dynamo_compiling():
        if type(self)._call_impl is _call_impl:  # (one frame less: dynamo breaks per frame)
            return _run(self, _torch_call_impl, args, kwargs)
        return self._call_impl(*args, **kwargs)
    bound = getattr(compiled, "__wrapped__", None)  # what torch.compile compiled
    if (
        _installed
        and getattr(getattr(bound, "__func__", None), "__code__", None) is TORCH_CALL_CODE
    ):
        return _run(self, lambda _, *a, **k: compiled(*a, **k), args, kwargs)
    return compiled(*args, **kwargs)


@not_a_compile_root
def _run(self: Any, call: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """The wrapper around `call`, torch's `_call_impl` (or a compiled one) for `self`."""
    own = self._forward_pre_hooks
    if _dispatch is not None and (
        own
        or torch_module._global_forward_pre_hooks
        # torch's own backward hooks run after unihook's global ones (see `_pin`)
        or self._backward_hooks
        or self._backward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
    ):
        own = _pin_dispatchers(self)
    keys = _keys(own)
    # unihook's hooks torch does not see, as the call starts (a pre-hook may remove the last)
    pres = _pre_snapshot
    hooked = bool(pres) or _dispatch is not None
    for hook, with_kwargs in pres:
        if with_kwargs:
            result = hook(self, args, kwargs)
            if result is not None:
                site = Site.of("module_forward_pre", NAME, self)
                args, kwargs = check_pre_kwargs_result(result, site)
        else:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    own = self._forward_pre_hooks  # a global pre-hook may have had unihook install a HookDict
    state = _backward
    if state is None:
        return _call_original(self, call, own, keys, args, kwargs, hooked)
    # The call is in flight from here (before the dispatchers are read): a removal of the
    # global backward hooks by another thread meanwhile leaves them pinned in the module for
    # torch's hook loop (see `ModuleBackward.hold`); else torch's snapshot of the pre-hooks
    # could lack them, and the call fired neither the removed hooks nor the new ones.
    # (Not while dynamo traces: the mark would be a traced side effect, and a graph break.)
    compiling = _dynamo_compiling()
    mark = None if compiling else state.hold()
    try:
        dispatch = _dispatch
        # While dynamo traces, the module marked around, or one the dispatchers are pinned in,
        # may be the OptimizedModule of the one traced (its own call goes through this
        # wrapper): dynamo, comparing them, takes it for the module it already tracks and
        # fails an assertion. Asked outside.
        if dispatch is None or (
            own
            and (_compile._dispatch_outside(_is_pinned, self) if compiling else _is_pinned(self))
        ):
            inside = (
                _compile._dispatch_outside(state.inside, self) if compiling else state.inside(self)
            )
            if not inside:
                return _call_original(self, call, own, keys, args, kwargs, hooked)
            outer = state.outer()
            try:
                state.around(None)  # a call of this module inside its own: not around it
                return _call_original(self, call, own, keys, args, kwargs, hooked)
            finally:
                state.end_around(outer)
        pre_dispatch, post_dispatch, _, _ = dispatch
        replaced = pre_dispatch(self, args)
        if replaced is not None:
            args = replaced
        outer = state.outer()
        try:
            # (own dispatchers registered meanwhile get a repacked args tuple: tell them by
            # module; marked inside the try: a Ctrl-C right after must not leave the mark)
            state.around(self)
            result = _call_original(self, call, own, keys, args, kwargs, hooked)
        except BaseException:
            post_dispatch(self, args, None)
            raise
        finally:
            state.end_around(outer)
        output = post_dispatch(self, args, result)
        return result if output is None else output
    finally:
        if mark is not None:
            state.let_go(mark)


@partial(not_a_compile_root, callees_too=True)
def global_backward_state() -> ModuleBackward | None:
    """The state of the global backward hooks, while there are some."""
    return _backward


@partial(not_a_compile_root, callees_too=True)
def _is_pinned(module: Any) -> bool:
    return module in _pinned_in


RUN_CODE = _run.__code__  # (its frames hold what `_alias` counts)
# the wrapper's frames: a module call on the stack (see `unihook._module_backward._call_frames`)
WRAPPER_CODES = frozenset({_call_impl.__code__, _call.__code__, _run.__code__})


@partial(not_a_compile_root, callees_too=True)
def _keys(hooks: OrderedDict[int, Hook]) -> tuple[int, ...]:
    while True:
        try:
            return tuple(hooks)
        except RuntimeError:  # changed meanwhile (a finalizer the collector ran): again
            continue


@not_a_compile_root
def _call_original(
    self: Any,
    call: Callable[..., Any],
    own: OrderedDict[int, Hook],
    keys: tuple[int, ...],
    args: Any,
    kwargs: Any,
    hooked: bool,
) -> Any:
    """`call` (torch's `_call_impl`) for this call, whose module pre-hooks were `keys` when it
    started (`hooked`: and unihook had global hooks torch does not see). A pre-hook that came
    into the dict since (a global pre-hook, or another thread, registered it) must not run:
    torch iterates a snapshot taken when the call starts. It is wrapped in its place, to skip
    the calls that started before it (told by their frame here): later calls, on any thread,
    run it, and its handle, removing it meanwhile, removes it for good. (The wrapper stays:
    putting the hook back could undo a removal another thread makes at that moment.)"""
    if hooked and _fast_path(self):
        # torch sees no hook and takes its no-hook path; torch with unihook's global hooks as
        # its own would have taken its hook path, which reads the forward hooks after forward:
        # one registered during the call runs for it (when forward raises, an always-called one)
        try:
            result = call(self, *args, **kwargs)
        except Exception:
            _late_always_called(self, args, kwargs)
            raise
        return _late_forward_hooks(self, args, kwargs, result)
    current = _keys(own)
    if current == keys:
        return call(self, *args, **kwargs)
    # A pre-hook of the call's start is gone (another thread removed it): where that was the
    # module's own backward pre-dispatcher (its last backward hook removed, another one
    # registered), the newer one stands in for it, as a removed one passes the call on.
    swapped = not set(keys).issubset(current)
    here = id(sys._getframe())
    waiting: list[_FromNextCall] = []
    for k in current:
        hook = own.get(k)
        if k in keys or hook is None or _backward_dispatcher(hook, swapped):
            continue
        if not isinstance(hook, _FromNextCall):
            hook = own[k] = _FromNextCall(hook)
        hook.skip.add(here)
        waiting.append(hook)
    try:
        return call(self, *args, **kwargs)
    finally:
        for wrapper in waiting:
            wrapper.skip.discard(here)


@partial(not_a_compile_root, callees_too=True)
def _backward_dispatcher(hook: Any, own_too: bool) -> bool:
    """Whether `hook` is a global state's dispatcher pinned in a module (`own_too`: or the
    module's own backward pre-dispatcher): it tells a call that is not its own by itself
    (`pre_dispatch_beside`, `dispatching`), and must run for the others, as torch reads its
    global backward hooks when its `_call_impl` starts. (Pinned by another thread after this
    call's keys were taken, while the state the call started with was removed: skipped, no
    state would take the call.)"""
    if not isinstance(hook, EagerUnderCompile):
        return False
    is_global = getattr(hook.__self__, "is_global", None)
    return bool(is_global) or (own_too and is_global is False)


@partial(not_a_compile_root, callees_too=True)
def _fast_path(module: Any) -> bool:
    """Whether torch's `_call_impl` takes its no-hook path for `module` (unihook's global hooks
    run in the wrapper: torch does not see them)."""
    m = torch_module
    return not (
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or m._global_backward_pre_hooks
        or m._global_backward_hooks
        or m._global_forward_hooks
        or m._global_forward_pre_hooks
    )


@not_a_compile_root
def _late_forward_hooks(module: Any, args: Any, kwargs: Any, result: Any) -> Any:
    """The forward hooks registered during a call torch ran on its no-hook path, run as its
    hook path runs them."""
    m = torch_module
    if not (m._global_forward_hooks or module._forward_hooks):
        return result
    for key, hook in (*m._global_forward_hooks.items(), *module._forward_hooks.items()):
        if key in module._forward_hooks_with_kwargs or key in m._global_forward_hooks_with_kwargs:
            found = hook(module, args, kwargs, result)
        else:
            found = hook(module, args, result)
        if found is not None:
            result = found
    return result


@not_a_compile_root
def _late_always_called(module: Any, args: Any, kwargs: Any) -> None:
    """torch's hook path when forward raised (torch 2.13's `_call_impl`): the always-called
    forward hooks registered during the call run with the output None (the global ones
    without kwargs, as torch calls them), an exception of theirs turned into a warning."""
    m = torch_module
    result = None
    tables = (
        ("global module", m._global_forward_hooks, m._global_forward_hooks_always_called, ()),
        (
            "module",
            module._forward_hooks,
            module._forward_hooks_always_called,
            module._forward_hooks_with_kwargs,
        ),
    )
    for label, hooks, always, with_kwargs in tables:
        for key, hook in tuple(hooks.items()):
            if key not in always:
                continue
            try:
                if key in with_kwargs:
                    found = hook(module, args, kwargs, result)
                else:
                    found = hook(module, args, result)
                if found is not None:
                    result = found
            except Exception as e:  # noqa: BLE001 (torch's words)
                warnings.warn(
                    f"{label} forward hook with ``always_call=True`` raised an exception "
                    f"that was silenced as another error was raised in forward: {e!s}",
                    stacklevel=3,
                )


class _FromNextCall:
    """A pre-hook that came during calls of its module: those calls (`skip`: the ids of their
    `_call_original` frames, alive while they run) skip it, every other calls
    it. `__self__` as the hook's (unihook's pinned dispatchers are told by it)."""

    __slots__ = ("hook", "skip")
    __name__ = HookName(
        lambda wrapper, module, backend: (
            Site.of("forward_pre", backend, module),
            "a forward pre-hook registered while the module ran, in unihook's wrapper "
            "(remove it first)",
        )
    )

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        self.skip: set[int] = set()

    @property
    def __self__(self) -> Any:
        return getattr(self.hook, "__self__", None)

    @not_a_compile_root
    def __call__(self, *args: Any) -> Any:
        if self.skip:
            # torch's hook loop calls this from `_call_impl` (or a function inside it), which
            # `_call_original` called: a few frames up
            frame = sys._getframe(1)
            for _ in range(4):
                if frame is None:
                    break
                if id(frame) in self.skip:
                    return None
                frame = frame.f_back
        return self.hook(*args)

    def __reduce__(self) -> Any:
        return _unwrapped, (self.hook,)


def _unwrapped(hook: Hook) -> Hook:
    """A pickled `_FromNextCall` loads as its hook."""
    return hook


def original_call_impl() -> Callable[..., Any] | None:
    """torch's own ``Module._call_impl`` while the wrapper replaces it, else None."""
    return _torch_call_impl if _installed else None


def _sync_patch() -> None:
    """Wrap ``Module._call_impl`` exactly while a global pre-hook or backward hook exists. Read
    from the class, not from a flag: a run cut short (a Ctrl-C) is finished by the next."""
    global _installed, _torch_call_impl, _torch_call
    wanted = bool(_pre_hooks) or _backward is not None
    module = torch_module.Module
    patched = module._call_impl is _call_impl
    if wanted and not patched:
        _torch_call_impl = module._call_impl
        _installed = True
        module._call_impl = _call_impl
        # Only a process that compiled has dynamo, so only there can a module be compiled in
        # place already (one compiled from now on binds the wrapper). Under torch.compile the
        # replaced `__call__` costs a graph break per module call with global backward hooks
        # (dynamo inlines torch's own without one).
        if "torch._dynamo" in sys.modules and module.__call__ is not _call:
            _torch_call = module.__call__
            module.__call__ = _call
    elif wanted:
        _installed = True
    elif patched or _installed or module.__call__ is _call:
        if patched:
            module._call_impl = _torch_call_impl
        if module.__call__ is _call:
            module.__call__ = _torch_call
        _installed = False


def add_forward_pre(hook: Hook, with_kwargs: bool) -> Callable[[], None]:
    global _pre_snapshot
    key = next(_ids)

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        global _pre_snapshot
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            _pre_hooks.pop(key, None)
            _pre_snapshot = tuple(_pre_hooks.values())
            _sync_patch()

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        _pre_hooks[key] = (hook, with_kwargs)
        _pre_snapshot = tuple(_pre_hooks.values())
        _sync_patch()
    return remove


class _BackwardDispatch:
    """The global backward dispatchers' place in the wrapper (see the module docstring)."""

    def __init__(self, state: ModuleBackward) -> None:
        global _backward, _dispatch, _pinned_in, _absorbing
        self.state = state
        # the modules they are pinned in; in `_pinned_in` too, it tells whose they are
        self.pinned_in: WeakIdentityKeys[Pinned] = WeakIdentityKeys()
        self.absorbing: WeakIdentityKeys[Any] = WeakIdentityKeys()
        undo_if_unfinished(self.remove)
        with _lock, _lock.mutex:
            _pinned_in = self.pinned_in
            _absorbing = self.absorbing
            _backward = state
            # torch.compile: they run outside dynamo (see ._compile)
            _dispatch = (
                EagerUnderCompile(state.pre_dispatch),
                EagerUnderCompile(state.post_dispatch),
                EagerUnderCompile(state.pre_dispatch_beside),
                EagerUnderCompile(state.post_dispatch_beside),
            )
            _sync_patch()

    @staticmethod
    def pin(module: Any) -> None:
        """A removed global state's dispatcher, in torch's snapshot of `module`'s pre-hooks,
        passes the call on to this (newer) state: its post-dispatcher must be in the module's
        forward hooks, which torch reads after forward."""
        _pin_dispatchers(module)

    def remove(self) -> None:
        # idempotent: also undoes an installation cut short (a Ctrl-C, see unihook._locks)
        global _backward, _dispatch, _pinned_in, _absorbing
        if _lock.deferred(self.remove):
            return
        with _lock, _lock.mutex:
            for absorption in list(self.absorbing.values()):
                absorption.release()  # (torch's hooks back to torch before the dispatchers go)
            self.absorbing.clear()
            for pinned in list(self.pinned_in.values()):
                pinned.remove()
            self.pinned_in.clear()
            if _pinned_in is self.pinned_in:  # (else newer global hooks came meanwhile)
                _backward = _dispatch = None
                _pinned_in = WeakIdentityKeys()
                _absorbing = WeakIdentityKeys()
            _sync_patch()


def add(kind: str, hook: Hook, with_kwargs: bool, always_call: bool) -> Callable[[], None]:
    """Install a global hook of `kind`; return its remover."""
    if kind == "forward_pre":
        return add_forward_pre(hook, with_kwargs)
    if kind == "forward":
        # torch's `register_module_forward_hook`, its removal recorded first (see `insert`);
        # the handle forgets the with_kwargs entry too (torch's does not: no residue)
        flags = [
            (torch_module._global_forward_hooks_with_kwargs, with_kwargs),
            (torch_module._global_forward_hooks_always_called, always_call),
        ]
        if with_kwargs:  # (removed mid-call: see kwargs_post_hook)
            hook = kwargs_post_hook(hook)
        native = insert(torch_module._global_forward_hooks, hook, flags)
    elif kind in ("full_backward_pre", "full_backward"):
        from ._backward import add_global

        return add_global(kind, hook)
    else:  # as torch's `register_module_{kind}_hook`, in a table torch's loops read a
        # snapshot of (another thread's registration would stop a loop mid-way: see there)
        from torch.utils.hooks import RemovableHandle

        return add_to_global_table(
            torch_module,
            f"_global_{kind}_hooks",
            _checked_registration(kind, hook),
            lambda table: RemovableHandle(table).id,
        )
    remove: Callable[[], None] = native.remove
    return remove


_REGISTRABLE = {
    "parameter_registration": (torch.Tensor, "a torch.nn.Parameter (or torch.Tensor)"),
    "buffer_registration": (torch.Tensor, "a torch.Tensor"),
    "module_registration": (torch.nn.Module, "a torch.nn.Module"),
}


def _checked_registration(kind: str, hook: Hook) -> Hook:
    """torch registers whatever a registration hook returns (an int as a parameter), where its
    own register_parameter / register_buffer / add_module raise TypeError: so does this."""
    wanted, what = _REGISTRABLE[kind]

    def registration_hook(module: Any, name: str, value: Any) -> Any:
        result = hook(module, name, value)
        if result is None or isinstance(result, wanted):
            return result
        raise Site.of(global_label(kind), NAME, module).error(
            HookReturnTypeError, f"None or {what} to register as {name!r}", show_value(result)
        )

    registration_hook.__wrapped__ = hook  # type: ignore[attr-defined]
    return registration_hook
