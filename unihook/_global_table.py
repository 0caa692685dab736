"""A framework's module-level dict of global hooks, which its own code runs in a loop over the
live dict, while unihook has hooks in it.

torch (``register_parameter``, ``register_buffer``, ``register_module``) and MindSpore
(``register_buffer``) run their global registration hooks as ``for hook in
_global_buffer_registration_hooks.values(): ...``. A hook that another thread adds or removes
there while such a loop is inside a hook makes the loop raise "OrderedDict mutated during
iteration": that registration is lost (the frameworks' own registration functions do the
same). So unihook never changes a dict such a loop may be reading. While it has hooks there,
the module attribute holds a `GlobalTable` in place of the dict it found (the origin), and
unihook changes the table instead:

- ``values()`` is a snapshot: a loop reads the hooks there were as it started, whatever
  changes meanwhile (as torch's forward hooks, which it snapshots at each call);
- a native hook registered meanwhile (its handle refers to the table) goes into the origin
  too, in the same order; one that an older handle removes from the origin is left out;
- when unihook's last hook there goes, the origin goes back, holding exactly the native hooks.
  A table through which native hooks were registered lives on (`_retired`) while they remain
  in the origin, so their handles still remove them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from ._locks import RegistryLock, undo_if_unfinished
from ._pinned import _snapshot

__all__ = ["GlobalTable", "add_to_global_table"]

_lock = RegistryLock()
# tables put back while native hooks registered through them remained (see the docstring)
_retired: list[GlobalTable] = []
_MISSING = object()


class GlobalTable(OrderedDict[int, Any]):
    """A framework's global hook dict while unihook has hooks in it (see the module
    docstring)."""

    def __init__(self, origin: OrderedDict[int, Any]) -> None:
        super().__init__()
        self.origin = origin
        self.own: set[int] = set()  # unihook's keys
        self.native: set[int] = set()  # the keys of native hooks registered through this table
        for key, value in _snapshot(origin.items):  # (not `update`: it calls __setitem__)
            OrderedDict.__setitem__(self, key, value)

    def __setitem__(self, key: int, value: Any) -> None:
        # a native registration (the framework's handle is made on this table, then this)
        self.native.add(key)
        self.origin[key] = value
        super().__setitem__(key, value)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or key in self.origin

    def __delitem__(self, key: int) -> None:
        # a native handle's removal (OrderedDict's C pop would bypass this: handles use del)
        here = OrderedDict.pop(self, key, _MISSING) is not _MISSING
        there = self.origin.pop(key, _MISSING) is not _MISSING
        self.native.discard(key)
        if not (here or there):
            raise KeyError(key)

    def values(self) -> tuple[Any, ...]:  # type: ignore[override]
        own, origin = self.own, self.origin
        items = _snapshot(lambda: OrderedDict.items(self))
        return tuple(value for key, value in items if key in own or key in origin)


def add_to_global_table(
    owner: Any, attr: str, hook: Callable[..., Any], new_key: Callable[[Any], int]
) -> Callable[[], None]:
    """Put `hook` last in ``owner.attr``, a framework's global hook OrderedDict that its own
    code loops over (see the module docstring), under the key ``new_key(table)`` (the id of a
    native removal handle made on the table, so no native key is the same); return its
    remover, which is idempotent and also undoes an addition a Ctrl-C cut short."""
    tables: list[GlobalTable] = []
    keys: list[int] = []

    def remove() -> None:
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            for table in tables:
                for key in keys:
                    table.own.discard(key)
                    OrderedDict.pop(table, key, None)
                if not table.own and getattr(owner, attr) is table:
                    _retire(table)  # (first: a Ctrl-C landing between leaves it kept, no more)
                    setattr(owner, attr, table.origin)

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        found = getattr(owner, attr)
        table = found if isinstance(found, GlobalTable) else GlobalTable(found)
        tables.append(table)
        if table is not found:
            setattr(owner, attr, table)
        keys.append(new_key(table))
        table.own.add(keys[0])
        OrderedDict.__setitem__(table, keys[0], hook)
    return remove


def _retire(table: GlobalTable) -> None:
    """`table` goes: it lives on while native hooks registered through it remain."""
    _retired[:] = [t for t in (*_retired, table) if any(k in t.origin for k in tuple(t.native))]
