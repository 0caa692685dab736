"""Forward hooks on a paddle Layer, in the layer's own dicts made torch-like by
``unihook._pinned``.

Paddle's ``_dygraph_call_func`` iterates the layer's live hook dicts, so a hook that registers
or removes a hook while hooks run raises ``OrderedDict mutated during iteration``. While unihook
has a hook on the layer, its hook dicts are `HookDict`s, which iterate over a snapshot: the
running call keeps what it started with, the change applies from the next call (torch's
behaviour). The dict objects stay the same, so paddle's own ``HookRemoveHelper`` handles (a
weakref to the dict) keep working; removing unihook's last hook puts paddle's dicts back, and
empty dicts keep ``Layer.__call__``'s no-hook fast path.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from functools import partial
from types import CodeType
from typing import Any, Callable

from paddle.nn.layer.layers import HookRemoveHelper

from unihook.backend import (
    HookDict,
    Pinned,
    RegistryLock,
    dicts_of,
    new_key,
    pin,
    unpin,
    unpin_orphaned,
)

from ._static import forget_programs, guard_forward, guard_forward_pre, retranslate

__all__ = ["Access", "add_dispatchers", "add_hook", "id_for", "new_id", "remove_hook"]

_PRE = ("_forward_pre_hooks", ("_forward_pre_hooks_with_kwargs_flag",))
_POST = (
    "_forward_post_hooks",
    ("_forward_post_hooks_with_kwargs_flag", "_forward_post_hooks_always_called"),
)
_lock = RegistryLock()


def new_id() -> int:
    # Share paddle's id counter so ids never collide with natively registered hooks. Locked:
    # registrations under different registry locks (a layer's forward hooks, the global
    # ones, the backward dispatchers) would otherwise draw the same id on a thread switch
    # between the read and the write (one hook lost).
    with _ID_LOCK:
        hook_id: int = HookRemoveHelper.next_hook_id
        HookRemoveHelper.next_hook_id += 1
    return hook_id


_ID_LOCK = threading.Lock()


def id_for(layer: Any, pre: bool) -> int:
    """An id for a hook of `layer`'s: past the ids a layer loaded from a pickle brought."""
    hooks, flags = _PRE if pre else _POST
    return new_key(new_id, Access, layer, hooks, *flags)


def ids_drawn() -> int:
    """The framework's hook id counter: the next id (``unihook._pinned``)."""
    drawn: int = HookRemoveHelper.next_hook_id
    return drawn


def reserve_ids(top: int) -> None:
    """paddle's hook id counter past `top` (a loaded layer's hook keys: ``unihook._pinned``)."""
    with _ID_LOCK:
        HookRemoveHelper.next_hook_id = max(HookRemoveHelper.next_hook_id, top + 1)


class Access:
    """The layer's own hook dicts: its attributes."""

    iterates_live = True  # (a layer's call iterates its dicts: `SnapshotDict`)
    ids_drawn = staticmethod(ids_drawn)
    reserve_ids = staticmethod(reserve_ids)

    @staticmethod
    def recreated(owner: Any, attr: str) -> bool:
        return False  # (paddle creates them in Layer.__init__)

    @staticmethod
    def moves_hooks(code: CodeType) -> bool:
        """paddle's layer fusion (``quantization.imperative.fuse_utils._fuse_func``, behind
        ``fuse_layers``, ``ImperativeQuantAware(fuse_conv_bn=True)``, PTQ with ``fuse=True``)
        registers each forward hook of the fused layers on the fused one and deletes it."""
        fuse = sys.modules.get("paddle.quantization.imperative.fuse_utils")
        func = getattr(fuse, "_fuse_func", None)
        return code is getattr(func, "__code__", None)

    @staticmethod
    def get(layer: Any, attr: str) -> OrderedDict[int, Any]:
        hooks: OrderedDict[int, Any] = layer.__dict__[attr]
        return hooks

    @staticmethod
    def put(layer: Any, attr: str, hooks: OrderedDict[int, Any]) -> None:
        if isinstance(hooks, HookDict):
            # paddle.jit.to_static(full_graph=True): see ._static
            hooks.guard = guard_forward_pre if attr == _PRE[0] else guard_forward
            forget_programs(layer)
        object.__setattr__(layer, attr, hooks)


def add_hook(
    layer: Any,
    hook_id: int,
    hook: Callable[..., Any],
    *,
    pre: bool,
    prepend: bool = False,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> Callable[[], None]:
    """Register `hook` under `hook_id` (`new_id`, taken before: `remove_hook` undoes a
    registration cut short). Returns its removal once `layer` died (`unpin_orphaned`)."""
    hooks_attr, (kwargs_attr, *always_attr) = _PRE if pre else _POST
    flags = (kwargs_attr,) * with_kwargs + tuple(always_attr) * always_call
    with _lock, _lock.mutex:
        pin(layer, hooks_attr, hook_id, hook, Access, last=False, prepend=prepend, flags=flags)
        dicts = dicts_of(layer, hooks_attr, (kwargs_attr, *always_attr), Access)
    retranslate()  # (the layer's first hook: `Access.put` dropped it already)
    return partial(unpin_orphaned, dicts, hook_id)


def remove_hook(layer: Any, hook_id: int, *, pre: bool) -> None:
    """Idempotent: also undoes an `add_hook` cut short."""
    if _lock.deferred(lambda: remove_hook(layer, hook_id, pre=pre)):
        return
    hooks_attr, flag_attrs = _PRE if pre else _POST
    with _lock, _lock.mutex:
        unpin(layer, hooks_attr, hook_id, Access, flags=flag_attrs)


def add_dispatchers(layer: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> Pinned:
    hooks = ((_PRE[0], pre), (_POST[0], post))
    with _lock, _lock.mutex:
        pinned = Pinned.install(
            layer, hooks, _POST[1][1], new_id, Access, flags=(_PRE[1][0], _POST[1][0])
        )
    retranslate()
    return pinned
