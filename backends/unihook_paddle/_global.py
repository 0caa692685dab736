"""Global hooks for paddle 3.3.1, which has none: ``paddle.nn.Layer`` is patched while at least
one is registered, and removing the last one puts back the exact original functions.

Forward kinds: ``Layer.__call__`` skips straight to ``forward`` when a layer has no hooks of its
own, so it is replaced by one that always goes through ``_dygraph_call_func``, which is wrapped
to run with the global hooks merged in front of the layer's own (torch's order: G-pre, L-pre,
forward, G-fwd, L-fwd) and the global backward dispatchers at the very end (after every
forward hook, as torch's BackwardHook). The merged dicts are swapped in for the call and the
layer's own ones put back after it, keeping any hook registered meanwhile. While it runs, the
layer's own dicts wait in `running`: unihook registers there and `remerge`s (the running
call's later hook loops see the change, as torch's do); a hook paddle's own register_* wrote
into a merged dict is copied back, and its handle (a weakref to the merged dict) keeps
working (`Merged`).

Registration kinds: paddle registers in four places that do not call each other
(``__setattr__``, ``add_parameter`` (which ``register_parameter`` calls), ``register_buffer``,
``add_sublayer``); each is wrapped. Assigning a plain tensor attribute registers a
non-persistable buffer in paddle: it fires the buffer hook.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

import paddle
from paddle.base.framework import EagerParamBase
from paddle.nn import Layer
from paddle.nn.layer.layers import HookRemoveHelper

from unihook._checks import check_pre_kwargs_result
from unihook._describe import Site
from unihook.errors import HookReturnError

from . import NAME
from ._static import sot_builds_subgraph

Hook = Callable[..., Any]

_ATTRS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs_flag",
    "_forward_post_hooks",
    "_forward_post_hooks_with_kwargs_flag",
    "_forward_post_hooks_always_called",
)
_FORWARD_METHODS = ("__call__", "_dygraph_call_func")
_REGISTRATION_METHODS = ("__setattr__", "add_parameter", "register_buffer", "add_sublayer")

_lock = threading.RLock()
# kind -> {id: (hook, with_kwargs, always_call)}; ids come from paddle's own counter, so they
# never collide with a layer's own hook ids in the merged dicts.
_forward: dict[str, dict[int, tuple[Hook, bool, bool]]] = {"pre": {}, "post": {}}
_tail: dict[str, dict[int, Hook]] = {"pre": {}, "post": {}}  # backward dispatchers: last
_registration: dict[str, dict[int, Hook]] = {
    "parameter_registration": {},
    "buffer_registration": {},
    "module_registration": {},
}
_originals: dict[str, Any] = {}
# id(layer) -> (its own dicts, the first hook id of the call, the merged dicts `remerge`
# replaced) while it runs
running: dict[int, tuple[list[OrderedDict[int, Any]], int, list[tuple[str, Merged]]]] = {}
# (head dicts, tail dicts, every global id), rebuilt on each change
_merge_parts: tuple[
    tuple[OrderedDict[int, Any], ...],
    tuple[OrderedDict[int, Any], ...],
    frozenset[int],
    tuple[OrderedDict[int, Any], ...],
]


def _next_id() -> int:
    hook_id = HookRemoveHelper.next_hook_id
    HookRemoveHelper.next_hook_id += 1
    return hook_id


class Merged(OrderedDict[int, Any]):
    """A layer's hook dict merged with the global hooks, for one call. Paddle's own register_*
    during the call writes here; after the call the new hook is copied into the layer's own dict
    (`own`), where a removal through its handle (a weakref to this dict) is forwarded."""

    own: OrderedDict[int, Any] | None = None

    def __delitem__(self, key: int) -> None:
        super().__delitem__(key)
        if self.own is not None:
            self.own.pop(key, None)


# id(a layer's own dict) -> (a weakref to it, the merged dicts forwarding removals to it)
_forwarding: dict[int, tuple[weakref.ref[Any], list[Merged]]] = {}


def _copy_new(now: Any, own: OrderedDict[int, Any], first_new: int, ids: frozenset[int]) -> bool:
    """Copy the hooks paddle's own register_* wrote into `now`, a merged dict of the running
    call, into the layer's `own` dict, in registration order. True if there were some."""
    new = [k for k in now if k >= first_new and k not in ids]
    for k in new:
        if k not in own:
            own[k] = now[k]
    if new:
        for k in sorted(k for k in own if k >= first_new):
            own.move_to_end(k)
    return bool(new)


def _keep_handles(now: Merged, own: OrderedDict[int, Any], first_new: int, shared: bool) -> None:
    """After the call: the handles of those hooks (a weakref to `now`) remove them from `own`.
    `now` lives as long as `own`, holding only them (a shared dict is rebuilt, not stripped)."""
    if not shared:
        for k in [k for k in now if k < first_new]:
            OrderedDict.__delitem__(now, k)
    now.own = own
    key = id(own)
    entry = _forwarding.get(key)
    if entry is None or entry[0]() is not own:

        def forget(ref: weakref.ref[Any], forwarding: dict[int, Any] = _forwarding) -> None:
            if forwarding.get(key, (None,))[0] is ref:
                del forwarding[key]

        entry = _forwarding[key] = (weakref.ref(own, forget), [])
    entry[1].append(now)


def _rebuild() -> None:
    global _merge_parts
    pre, post = _forward["pre"], _forward["post"]
    head = (
        OrderedDict((k, _checked_pre(h) if kw else h) for k, (h, kw, _) in pre.items()),
        OrderedDict((k, True) for k, (_, kw, _) in pre.items() if kw),
        OrderedDict((k, h) for k, (h, _, _) in post.items()),
        OrderedDict((k, True) for k, (_, kw, _) in post.items() if kw),
        OrderedDict((k, True) for k, (_, _, always) in post.items() if always),
    )
    tail = (
        OrderedDict(_tail["pre"]),
        OrderedDict(),
        OrderedDict(_tail["post"]),
        OrderedDict(),
        OrderedDict((k, True) for k in _tail["post"]),
    )
    ids = frozenset([*pre, *post, *_tail["pre"], *_tail["post"]])
    # What a layer without hooks of its own (most layers) runs with: built once, shared.
    shared = tuple(Merged([*h.items(), *t.items()]) for h, t in zip(head, tail))
    _merge_parts = (head, tail, ids, shared)


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
    if not paddle.in_dynamic_mode() and sot_builds_subgraph():
        # to_static SOT: a build-time call with symbolic values; the hooks run in dygraph
        return _originals["_dygraph_call_func"](self, *inputs, **kwargs)
    head, tail, ids, shared = _merge_parts
    own = self.__dict__
    # the layer's own dicts while it runs: unihook's ``_forward`` registers into them here
    saved = [own[attr] for attr in _ATTRS]
    key = id(self)
    outer = running.get(key)  # a recursive call of the same layer
    first_new = HookRemoveHelper.next_hook_id
    replaced: list[tuple[str, Merged]] = []
    running[key] = (saved, first_new, replaced)
    merged = []
    for attr, h, s, t, common in zip(_ATTRS, head, saved, tail, shared):
        if s:
            m = Merged(h)
            m.update(s.items())  # items(): a HookDict drops hooks removed by older handles
            m.update(t)
        else:
            m = common
        own[attr] = m
        merged.append((m, len(m)))
    try:
        return _originals["_dygraph_call_func"](self, *inputs, **kwargs)
    finally:
        if outer is None:
            del running[key]
        else:
            running[key] = outer
        polluted = False
        for attr, before, (m, size) in zip(_ATTRS, saved, merged):
            now = own[attr]
            if now is not m or len(now) != size or replaced:
                for d in (*[r for a, r in replaced if a == attr], now):
                    if isinstance(d, Merged) and _copy_new(d, before, first_new, ids):
                        _keep_handles(d, before, first_new, any(d is c for c in shared))
                polluted |= now is m
            own[attr] = before
        if polluted:  # paddle's own register_* mutated a shared dict in place: build anew
            with _lock:
                _rebuild()


def remerge(layer: Any, attr: str) -> None:
    """unihook changed the running layer's own dict `attr`: the call sees the change from its
    next hook loop on, as torch's loops read the module's dicts when they start."""
    head, tail, ids, _ = _merge_parts
    saved, first_new, replaced = running[id(layer)]
    i = _ATTRS.index(attr)
    own = layer.__dict__
    now = own[attr]
    _copy_new(now, saved[i], first_new, ids)
    replaced.append((attr, now))
    merged = Merged(head[i])
    merged.update(saved[i].items())
    merged.update(tail[i])
    own[attr] = merged


def _fire(kind: str, layer: Any, name: str, value: Any) -> Any:
    for hook in tuple(_registration[kind].values()):
        result = hook(layer, name, value)
        if result is not None:
            value = _registrable(kind, layer, name, result)
    return value


def _registrable(kind: str, layer: Any, name: str, value: Any) -> Any:
    """What a registration hook returned, as paddle can register it where torch would."""
    if kind == "parameter_registration" and type(value) is paddle.Tensor:
        # torch registers the tensor returned for a parameter; paddle would file a plain
        # tensor under buffers and the layer would lose the parameter
        return EagerParamBase.from_tensor(value, trainable=not value.stop_gradient)
    if kind == "module_registration" and not isinstance(value, Layer):
        # paddle's own check is a bare assert
        raise Site.of(kind, NAME, layer, name).error(
            HookReturnError, "None or a paddle.nn.Layer", type(value).__name__
        )
    return value


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
    """Patch exactly the methods some registered hook needs; restore the others."""
    forward = any(_forward.values()) or any(_tail.values())
    registration = any(_registration.values())
    wanted = (_FORWARD_METHODS if forward else ()) + (_REGISTRATION_METHODS if registration else ())
    for method in (*_FORWARD_METHODS, *_REGISTRATION_METHODS):
        if method in wanted and method not in _originals:
            _originals[method] = Layer.__dict__[method]
            setattr(Layer, method, _PATCHES[method])
        elif method not in wanted and method in _originals:
            setattr(Layer, method, _originals.pop(method))


def patched_methods() -> tuple[str, ...]:
    return tuple(_originals)


def _add(table: dict[int, Any], entry: Any) -> Callable[[], None]:
    key = _next_id()
    with _lock:
        table[key] = entry
        _rebuild()
        _sync_patches()

    def remove() -> None:
        with _lock:
            if table.pop(key, None) is not None:
                _rebuild()
                _sync_patches()

    return remove


def add_dispatchers(pre: Hook, post: Hook) -> Callable[[], None]:
    """Global backward dispatchers: the last forward pre-hook and the last (always called)
    forward hook of every layer."""
    remove_pre = _add(_tail["pre"], pre)
    remove_post = _add(_tail["post"], post)

    def remove() -> None:
        remove_pre()
        remove_post()

    return remove


def add(kind: str, hook: Hook, with_kwargs: bool, always_call: bool) -> Callable[[], None]:
    """Install a global hook of `kind`; return its remover."""
    if kind == "forward_pre":
        return _add(_forward["pre"], (hook, with_kwargs, False))
    if kind == "forward":
        return _add(_forward["post"], (hook, with_kwargs, always_call))
    if kind in ("full_backward_pre", "full_backward"):
        from ._backward import add_global

        return add_global(kind, hook)
    return _add(_registration[kind], hook)


_rebuild()
