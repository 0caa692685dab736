"""Global hooks for paddle 3.3.1, which has none: ``paddle.nn.Layer`` is patched while at least
one is registered, and removing the last one puts back the exact original functions.

Forward kinds: ``Layer.__call__`` skips straight to ``forward`` when a layer has no hooks of its
own, so it is replaced by one that always goes through ``_dygraph_call_func``, which is replaced
by a copy of paddle's that runs the global hooks around the layer's own, in torch's order:
G-pre, L-pre, forward, G-fwd, L-fwd, and the global backward dispatchers at the very end (after
every forward hook, as torch's BackwardHook). Like torch's ``_call_impl``, each loop iterates a
snapshot of the global hooks and of the layer's own dict taken when it starts. Nothing is
stored on the layer per call, so one layer runs on several threads, and recursively, at once.

Registration kinds: paddle registers in four places that do not call each other
(``__setattr__``, ``add_parameter`` (which ``register_parameter`` calls), ``register_buffer``,
``add_sublayer``); each is wrapped. Assigning a plain tensor attribute registers a
non-persistable buffer in paddle: it fires the buffer hook.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import paddle
from paddle.base.dygraph.base import in_sot_simulation_mode
from paddle.base.framework import EagerParamBase, name_struct
from paddle.nn import Layer
from paddle.profiler import TracerEventType  # pyright: ignore[reportPrivateImportUsage]
from paddle.profiler.utils import RecordEvent, in_profiler_mode

from unihook.backend import (
    RegistryLock,
    Site,
    check_pre_kwargs_result,
    global_label,
    show_value,
    undo_if_unfinished,
)
from unihook.errors import HookReturnTypeError

from . import NAME
from ._forward import new_id
from ._static import (
    builds_full_graph,
    forget_programs,
    full_graph_error,
    outside_sot,
    sot_builds_subgraph,
    sot_calls_layers,
)

Hook = Callable[..., Any]

_FORWARD_METHODS = ("__call__", "_dygraph_call_func")
_REGISTRATION_METHODS = ("__setattr__", "add_parameter", "register_buffer", "add_sublayer")

_lock = RegistryLock()  # (a finalizer removing a hook meanwhile waits for it)
# kind -> {id: (hook, with_kwargs, always_call)}; ids come from paddle's own counter, so they
# never collide with a layer's own hook ids.
_forward: dict[str, dict[int, tuple[Hook, bool, bool]]] = {"pre": {}, "post": {}}
_tail: dict[str, dict[int, Hook]] = {"pre": {}, "post": {}}  # backward dispatchers: last
_registration: dict[str, dict[int, Hook]] = {
    "parameter_registration": {},
    "buffer_registration": {},
    "module_registration": {},
}
# paddle's own functions, as found when patched; kept after the patch goes: a thread inside a
# patched one while another removes the last hook still calls them
_originals: dict[str, Any] = {}
# paddle's, as found when this module is imported (the patches live here: none is in yet)
PADDLE_CALL_CODE = Layer.__dict__["_dygraph_call_func"].__code__
_patched: set[str] = set()


class _Hooks(NamedTuple):
    """The global forward hooks as a call reads them: immutable, rebuilt on each change."""

    pre: tuple[tuple[int, Hook], ...]
    tail_pre: tuple[tuple[int, Hook], ...]
    post: tuple[tuple[int, Hook], ...]
    tail_post: tuple[tuple[int, Hook], ...]
    with_kwargs: frozenset[int]
    always: frozenset[int]  # always called, also when forward raises (the tail post too)


_hooks = _Hooks((), (), (), (), frozenset(), frozenset())


def _rebuild() -> None:
    global _hooks
    pre, post = _forward["pre"], _forward["post"]
    _hooks = _Hooks(
        tuple((k, _checked_pre(h) if kw else h) for k, (h, kw, _) in pre.items()),
        tuple(_tail["pre"].items()),
        tuple((k, h) for k, (h, _, _) in post.items()),
        tuple(_tail["post"].items()),
        frozenset(k for table in (pre, post) for k, (_, kw, _) in table.items() if kw),
        frozenset([*(k for k, (_, _, always) in post.items() if always), *_tail["post"]]),
    )


def _checked_pre(hook: Hook) -> Hook:
    def pre_hook(layer: Any, args: Any, kwargs: Any) -> Any:
        result = hook(layer, args, kwargs)
        if result is None:
            return None
        return check_pre_kwargs_result(result, Site.of("module_forward_pre", NAME, layer))

    return pre_hook


def _call(self: Any, *inputs: Any, **kwargs: Any) -> Any:
    return self._dygraph_call_func(*inputs, **kwargs)


def _dygraph_call_func(self: Any, *inputs: Any, **kwargs: Any) -> Any:
    """paddle 3.3.1's ``Layer._dygraph_call_func`` with the global hooks merged in."""
    hooks = _hooks
    if in_sot_simulation_mode():
        # to_static SOT simulates this call: the hooks would be left out of the graph it
        # builds unless their own code breaks it (helper-62's attack). A graph break runs
        # the layer in dygraph, with them (while global hooks live, SOT compiles no layer)
        return outside_sot(_dygraph_call_func, self, *inputs, **kwargs)
    if not paddle.in_dynamic_mode():
        if sot_builds_subgraph():
            # to_static SOT: a build-time call with symbolic values; the hooks run in dygraph
            return _originals["_dygraph_call_func"](self, *inputs, **kwargs)
        if builds_full_graph():
            kind = "forward_pre" if hooks.pre else "forward" if hooks.post else "full_backward"
            raise full_graph_error(f"module_{kind}", self)
    outputs = None
    called: set[int] = set()  # the always-called post hooks that ran
    try:
        own_kwargs = self._forward_pre_hooks_with_kwargs_flag
        for key, hook in (*hooks.pre, *self._forward_pre_hooks.items(), *hooks.tail_pre):
            # (the layer's flags are read when its hook is reached, as paddle does)
            if key in hooks.with_kwargs or key in own_kwargs:
                result = hook(self, inputs, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(  # paddle's own words for a layer's own hook
                            "forward pre-hook must return None or a tuple "
                            f"of (new_args, new_kwargs), but got {result}."
                        )
                    inputs, kwargs = result
            else:
                result = hook(self, inputs)
                if result is not None:
                    inputs = result if isinstance(result, tuple) else (result,)
        if not self._built:
            self._build_once(*inputs, **kwargs)
            self._built = True
        outputs = _run_forward(self, inputs, kwargs)
        # as torch, which reads its global forward hooks after forward: one removed (added)
        # during the call does not fire (fires) for it
        hooks = _hooks
        own_kwargs = self._forward_post_hooks_with_kwargs_flag
        own_always = self._forward_post_hooks_always_called
        for key, hook in (*hooks.post, *self._forward_post_hooks.items(), *hooks.tail_post):
            if key in hooks.always or key in own_always:
                called.add(key)
            if key in hooks.with_kwargs or key in own_kwargs:
                result = hook(self, inputs, kwargs, outputs)
            else:
                result = hook(self, inputs, outputs)
            if result is not None:
                outputs = result
        return outputs
    except Exception:
        hooks = _hooks
        own_kwargs = self._forward_post_hooks_with_kwargs_flag
        own_always = self._forward_post_hooks_always_called
        for key, hook in (*hooks.post, *self._forward_post_hooks.items(), *hooks.tail_post):
            if key in called or not (key in hooks.always or key in own_always):
                continue
            try:
                if key in hooks.with_kwargs or key in own_kwargs:
                    result = hook(self, inputs, kwargs, outputs)
                else:
                    result = hook(self, inputs, outputs)
                if result is not None:
                    outputs = result
            except Exception as e:
                warnings.warn(
                    "forward hook with ``always_call=True`` raised an exception "
                    f"that was silenced as another error was raised in forward: {e!s}",
                    stacklevel=2,
                )
        raise


def _run_forward(self: Any, inputs: Any, kwargs: Any) -> Any:
    if in_profiler_mode():
        with RecordEvent(self.__class__.__name__, TracerEventType.Forward):
            return self.forward(*inputs, **kwargs)
    with name_struct(self.__class__.__name__):
        return self.forward(*inputs, **kwargs)


def _fire(kind: str, layer: Any, name: str, value: Any) -> Any:
    for hook in tuple(_registration[kind].values()):
        result = hook(layer, name, value)
        if result is not None:
            value = _registrable(kind, layer, name, result)
    return value


_REGISTRABLE = {
    "parameter_registration": "a paddle.Tensor (a parameter, or a tensor made one)",
    "buffer_registration": "a paddle.Tensor",
    "module_registration": "a paddle.nn.Layer",
}


def _registrable(kind: str, layer: Any, name: str, value: Any) -> Any:
    """What a registration hook returned, as paddle can register it where torch would."""
    if isinstance(value, Layer if kind == "module_registration" else paddle.Tensor):
        if kind == "parameter_registration" and not isinstance(value, EagerParamBase):
            # torch registers the tensor returned for a parameter; paddle would file a plain
            # tensor under buffers and the layer would lose the parameter
            return EagerParamBase.from_tensor(value, trainable=not value.stop_gradient)
        return value
    # paddle would drop a parameter silently, or raise a bare TypeError / AssertionError:
    # a TypeError as torch's register_parameter / register_buffer / add_module raise
    raise Site.of(global_label(kind), NAME, layer).error(
        HookReturnTypeError,
        f"None or {_REGISTRABLE[kind]} to register as {name!r}",
        show_value(value),
    )


def _setattr(self: Any, name: str, value: Any) -> None:
    own = self.__dict__
    params = own.get("_parameters")
    layers = own.get("_sub_layers")
    # The same branch order as Layer.__setattr__, so a hook fires only where paddle registers.
    if isinstance(value, EagerParamBase):
        if params is not None:
            value = _fire("parameter_registration", self, name, value)
    elif params is not None and name in params:
        pass
    elif isinstance(value, Layer):
        if layers is not None:
            value = _fire("module_registration", self, name, value)
    elif layers is not None and name in layers:
        pass
    elif isinstance(value, paddle.Tensor) and own.get("_buffers") is not None:
        value = _fire("buffer_registration", self, name, value)
    _originals["__setattr__"](self, name, value)


def _add_parameter(self: Any, name: str, parameter: Any) -> Any:
    if parameter is not None:
        parameter = _fire("parameter_registration", self, name, parameter)
    return _originals["add_parameter"](self, name, parameter)


def _register_buffer(self: Any, name: str, tensor: Any, persistable: bool = True) -> Any:
    if tensor is not None:
        tensor = _fire("buffer_registration", self, name, tensor)
    return _originals["register_buffer"](self, name, tensor, persistable)


def _add_sublayer(self: Any, name: str, sublayer: Any) -> Any:
    if sublayer is not None:
        sublayer = _fire("module_registration", self, name, sublayer)
    return _originals["add_sublayer"](self, name, sublayer)


_PATCHES: dict[str, Callable[..., Any]] = {
    "__call__": _call,
    "_dygraph_call_func": _dygraph_call_func,
    "__setattr__": _setattr,
    "add_parameter": _add_parameter,
    "register_buffer": _register_buffer,
    "add_sublayer": _add_sublayer,
}


def _sync_patches() -> None:
    """Patch exactly the methods some registered hook needs; restore the others. Read from
    the class, not from `_patched`: a run cut short (a Ctrl-C) is finished by the next."""
    forward = any(_forward.values()) or any(_tail.values())
    registration = any(_registration.values())
    wanted = (_FORWARD_METHODS if forward else ()) + (_REGISTRATION_METHODS if registration else ())
    if forward != (Layer.__dict__["_dygraph_call_func"] is _PATCHES["_dygraph_call_func"]):
        sot_calls_layers(forward)  # (see ._static)
    for method in (*_FORWARD_METHODS, *_REGISTRATION_METHODS):
        patched = Layer.__dict__[method] is _PATCHES[method]
        if method in wanted and not patched:
            _originals[method] = Layer.__dict__[method]
            _patched.add(method)
            setattr(Layer, method, _PATCHES[method])
        elif method not in wanted and (patched or method in _patched):
            if patched:
                setattr(Layer, method, _originals[method])
            _patched.discard(method)


def _add(table: dict[int, Any], entry: Any) -> Callable[[], None]:
    key = new_id()

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            table.pop(key, None)
            _rebuild()
            _sync_patches()

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        table[key] = entry
        _rebuild()
        _sync_patches()
    return remove


def add_dispatchers(pre: Hook, post: Hook) -> Callable[[], None]:
    """Global backward dispatchers: the last forward pre-hook and the last (always called)
    forward hook of every layer."""
    remove_pre = _add(_tail["pre"], pre)
    remove_post = _add(_tail["post"], post)
    forget_programs(None)  # see ._static

    def remove() -> None:
        remove_pre()
        remove_post()

    return remove


def add(kind: str, hook: Hook, with_kwargs: bool, always_call: bool) -> Callable[[], None]:
    """Install a global hook of `kind`; return its remover."""
    if kind in ("forward_pre", "forward"):
        forget_programs(None)  # see ._static
    if kind == "forward_pre":
        return _add(_forward["pre"], (hook, with_kwargs, False))
    if kind == "forward":
        return _add(_forward["post"], (hook, with_kwargs, always_call))
    if kind in ("full_backward_pre", "full_backward"):
        from ._backward import add_global

        return add_global(kind, hook)
    return _add(_registration[kind], hook)
