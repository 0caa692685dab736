"""Forward hooks on a paddle Layer, registered copy-on-write.

Paddle's ``_dygraph_call_func`` iterates the layer's live hook dicts, so a hook that registers
or removes a hook while hooks run raises ``OrderedDict mutated during iteration``. Replacing the
dicts instead of mutating them gives torch's behaviour: the running call keeps its snapshot,
the change applies from the next call. Empty dicts keep ``Layer.__call__``'s no-hook fast path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from paddle.nn.layer.layers import HookRemoveHelper

__all__ = ["add_hook", "remove_hook", "move_last"]

_PRE = ("_forward_pre_hooks", ("_forward_pre_hooks_with_kwargs_flag",))
_POST = (
    "_forward_post_hooks",
    ("_forward_post_hooks_with_kwargs_flag", "_forward_post_hooks_always_called"),
)
_lock = threading.Lock()


def _next_id() -> int:
    # Share paddle's id counter so ids never collide with natively registered hooks.
    hook_id = HookRemoveHelper.next_hook_id
    HookRemoveHelper.next_hook_id += 1
    return hook_id


def _replace(layer: Any, attr: str, update: Callable[[OrderedDict[int, Any]], None]) -> None:
    new: OrderedDict[int, Any] = OrderedDict(getattr(layer, attr))
    update(new)
    object.__setattr__(layer, attr, new)


def add_hook(
    layer: Any,
    hook: Callable[..., Any],
    *,
    pre: bool,
    prepend: bool = False,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> int:
    hooks_attr, (kwargs_attr, *always_attr) = _PRE if pre else _POST
    hook_id = _next_id()

    def insert(hooks: OrderedDict[int, Any]) -> None:
        hooks[hook_id] = hook
        if prepend:
            hooks.move_to_end(hook_id, last=False)

    def flag(flags: OrderedDict[int, Any]) -> None:
        flags[hook_id] = True

    with _lock:
        if with_kwargs:
            _replace(layer, kwargs_attr, flag)
        if always_call:
            _replace(layer, always_attr[0], flag)
        _replace(layer, hooks_attr, insert)
    return hook_id


def remove_hook(layer: Any, hook_id: int, *, pre: bool) -> None:
    hooks_attr, flag_attrs = _PRE if pre else _POST

    def drop(d: OrderedDict[int, Any]) -> None:
        d.pop(hook_id, None)

    with _lock:
        _replace(layer, hooks_attr, drop)
        for attr in flag_attrs:
            if hook_id in getattr(layer, attr):
                _replace(layer, attr, drop)


def move_last(layer: Any, hook_id: int, *, pre: bool) -> None:
    hooks_attr = (_PRE if pre else _POST)[0]

    def to_end(hooks: OrderedDict[int, Any]) -> None:
        if hook_id in hooks:
            hooks.move_to_end(hook_id)

    with _lock:
        if next(reversed(getattr(layer, hooks_attr)), None) != hook_id:
            _replace(layer, hooks_attr, to_end)
