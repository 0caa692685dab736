"""Forward hooks on a MindSpore Cell, in the cell's own dicts made torch-like by
``unihook._pinned``.

MindSpore 2.10's ``Cell._run_forward_pre_hook`` / ``_run_forward_hook`` iterate the cell's live
OrderedDicts: a hook registered by a hook while hooks run joins the running call (torch runs it
from the next call), one removed mid-call raises ``OrderedDict mutated during iteration``. While
unihook has a hook on the cell, its dicts are `HookDict`s, which iterate over a snapshot. The
dicts live in ``_lazy_*`` attributes behind read-only properties that create them on first read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import partial
from typing import Any, Callable

from mindspore.common.hook_handle import HookHandle

from unihook.backend import (
    Pinned,
    dicts_of,
    new_key,
    pin,
    undo_if_unfinished,
    unpin,
    unpin_orphaned,
)

__all__ = ["Access", "add_dispatchers", "add_hook", "remove_hook", "new_id"]

# (hook dict, its flag dicts), by the names of Cell's properties
_PRE = ("_forward_pre_hook", ("_forward_pre_hook_with_kwargs",))
_POST = ("_forward_hook", ("_forward_hook_with_kwargs", "_forward_hook_always_called"))
_lock = threading.Lock()


_ids = threading.Lock()


def new_id() -> int:
    # MindSpore's own counter: ids never collide with natively registered hooks. Under a lock
    # of its own: the global dispatchers (another thread's cell call) take ids outside `_lock`,
    # and two equal ids made one dispatcher replace the other (a lost global hook call).
    with _ids:
        hook_id: int = HookHandle.unique_id
        HookHandle.unique_id += 1
    return hook_id


def ids_drawn() -> int:
    """The framework's hook id counter: the next id (``unihook._pinned``)."""
    drawn: int = HookHandle.unique_id
    return drawn


def reserve_ids(top: int) -> None:
    """MindSpore's hook id counter past `top` (a loaded cell's hook keys: ``unihook._pinned``)."""
    with _ids:
        HookHandle.unique_id = max(HookHandle.unique_id, top + 1)


class Access:
    """A cell's hook dicts: read through Cell's lazy properties, replaced in the ``_lazy_``
    attribute behind them (Cell.__setattr__ would file an OrderedDict as a plain attribute).

    The properties create a dict on first read, unlocked: a call on another thread that read
    None before a registration created the dict assigns a new empty one over it when it
    resumes, and the hooks (and flags) registered meanwhile were lost. unihook's follow into
    the new one (`unihook._pinned`)."""

    iterates_live = True  # (a layer's call iterates its dicts: `SnapshotDict`)
    ids_drawn = staticmethod(ids_drawn)
    reserve_ids = staticmethod(reserve_ids)

    @staticmethod
    def recreated(owner: Any, attr: str) -> bool:
        # Always: nothing but the properties assigns these dicts (no setter, no public API),
        # so a dropped one is that race. (Not told by the stack: the registering thread may
        # still hold the dropped one, finalized once its `pin` returns.)
        return True

    @staticmethod
    def get(cell: Any, attr: str) -> OrderedDict[int, Any]:
        hooks: OrderedDict[int, Any] = getattr(cell, attr)
        return hooks

    @staticmethod
    def put(cell: Any, attr: str, hooks: OrderedDict[int, Any]) -> None:
        object.__setattr__(cell, "_lazy" + attr, hooks)


def add_hook(
    cell: Any,
    hook: Callable[..., Any],
    *,
    pre: bool,
    prepend: bool = False,
    with_kwargs: bool = False,
    always_call: bool = False,
) -> tuple[int, Callable[[], None]]:
    """Register `hook`; returns its id and its removal once `cell` died (`unpin_orphaned`)."""
    hooks_attr, (kwargs_attr, *always_attr) = _PRE if pre else _POST
    hook_id = new_key(new_id, Access, cell, hooks_attr, kwargs_attr, *always_attr)
    # (a registration cut short by a Ctrl-C is undone: see unihook._locks)
    undo_if_unfinished(partial(remove_hook, cell, hook_id, pre=pre))
    flags = (kwargs_attr,) * with_kwargs + tuple(always_attr) * always_call
    with _lock:
        pin(cell, hooks_attr, hook_id, hook, Access, last=False, prepend=prepend, flags=flags)
        dicts = dicts_of(cell, hooks_attr, (kwargs_attr, *always_attr), Access)
    return hook_id, partial(unpin_orphaned, dicts, hook_id)


def remove_hook(cell: Any, hook_id: int, *, pre: bool) -> None:
    hooks_attr, flag_attrs = _PRE if pre else _POST
    with _lock:
        unpin(cell, hooks_attr, hook_id, Access, flags=flag_attrs)


def add_dispatchers(cell: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> Pinned:
    hooks = ((_PRE[0], pre), (_POST[0], post))
    with _lock:
        return Pinned.install(
            cell, hooks, _POST[1][1], new_id, Access, flags=(_PRE[1][0], _POST[1][0])
        )
