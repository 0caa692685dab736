"""A framework's module-level dict of global hooks, which its own code runs in a loop over the
live dict, while unihook has hooks in it.

torch (``register_parameter``, ``register_buffer``, ``register_module``) and MindSpore
(``register_buffer``) run their global registration hooks as ``for hook in
_global_buffer_registration_hooks.values(): ...``. A hook that another thread adds or removes
there while such a loop is inside a hook makes the loop raise "OrderedDict mutated during
iteration": that registration is lost (the frameworks' own registration functions do the
same). So unihook never changes a dict such a loop may be reading. While it has hooks there,
the module attribute holds the `GlobalTable` of that attribute in place of the dict it found
(the origin), which keeps holding the native hooks, alone:

- unihook's hooks are in the table only; ``values()`` is a snapshot of both in insertion
  order, as the framework's own loop reads its dict: the table keeps the order of the keys it
  saw go in (the origin's when it was installed, then each one put through it; a key put in
  again after its removal goes last, ``move_to_end`` moves it), and a native key put straight
  into the origin meanwhile goes last. A loop reads the hooks there were as it started,
  whatever changes meanwhile (as torch's forward hooks, which it snapshots at each call);
- every native change made through the table (a handle made on it, ``pop``, ``clear``) is one
  change of the origin, and a native registration or removal made straight on the origin (a
  handle older than the table, or a registration that read the attribute before the table
  went in) is in the next snapshot: nothing to keep in step;
- when unihook's last hook there goes, the origin goes back, the same object, holding exactly
  the native hooks. The table lives on for the process (one per dict it stood for, keeping
  the origin only weakly then), so a native handle made on it still removes its hook from the
  origin.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import ItemsView, Iterator, KeysView, Mapping, MutableMapping
from typing import Any, Callable

from ._locks import RegistryLock, undo_if_unfinished
from ._pinned import _snapshot

__all__ = ["GlobalTable", "add_to_global_table"]

_lock = RegistryLock()
# (id(owner), attr, id(origin)) -> the table standing for that origin, for good (its origin
# held weakly once detached; those whose origin died go when the entries doubled)
_tables: dict[tuple[int, str, int], GlobalTable] = {}
_prune_at = 64


class GlobalTable(MutableMapping[int, Any]):
    """A framework's global hook dict while unihook has hooks in it (see the module
    docstring): a mapping of the origin's hooks and unihook's."""

    def __init__(self, origin: OrderedDict[int, Any]) -> None:
        self.own: dict[int, Any] = {}  # unihook's hooks, in registration order
        self._origin: OrderedDict[int, Any] | None = origin  # strong while installed
        self._origin_ref = weakref.ref(origin)
        # the keys, native and unihook's, in the order they went in (replaced whole, never
        # changed in place, by the writers, who hold the framework's or unihook's lock or the
        # GIL: a loop's snapshot reads one order); a key gone from both dicts is skipped
        self._order: dict[Any, None] = dict.fromkeys(key for key, _ in _snapshot(origin.items))
        # unihook's keys whose handles live: one a library takes out and puts back
        # (``d[k] = d.pop(k)``) stays unihook's, and goes with its handle (helper-91's FINDING 5)
        self._mine: set[Any] = set()

    def attach(self, origin: OrderedDict[int, Any]) -> None:
        """Stand for `origin` (installed): its hooks first, in its order, then unihook's."""
        self._origin, self._origin_ref = origin, weakref.ref(origin)
        found = (*_snapshot(origin.items), *_snapshot(self.own.items))
        self._order = dict.fromkeys(key for key, _ in found)

    def stands_for(self, origin: Any) -> bool:
        """Whether the table stands (or stood) for `origin`: None for one whose dict is gone."""
        return self._origin_ref() is origin

    def add(self, key: int, hook: Any) -> None:
        """One of unihook's hooks, last."""
        self._mine.add(key)
        self.own[key] = hook
        self._put_last(key)

    def drop(self, key: int) -> None:
        """One of unihook's hooks, gone with its handle."""
        self._mine.discard(key)
        self.own.pop(key, None)

    def _put_last(self, key: Any) -> None:
        order = self._order
        if len(order) > 2 * (len(self.own) + len(self.origin)) + 16:  # keys removed elsewhere
            order = {k: None for k in order if k in self.own or k in self.origin}
        order = {k: None for k in order if k != key}
        order[key] = None
        self._order = order

    def detach(self) -> OrderedDict[int, Any]:
        """`origin`, which goes back; the table no longer keeps it alive (a library may drop
        it, and the native hooks in it with it)."""
        origin = self.origin
        self._origin = None
        return origin

    @property
    def origin(self) -> OrderedDict[int, Any]:
        """The framework's dict, holding the native hooks (an empty one once it was dropped:
        a handle made on the table then removes nothing)."""
        origin = self._origin if self._origin is not None else self._origin_ref()
        return OrderedDict() if origin is None else origin

    def items_now(self) -> tuple[tuple[Any, Any], ...]:
        """The hooks, native and unihook's, in the order they went in (a snapshot; a native key
        put straight into the origin, not through the table, last). A plain loop: dynamo
        traces it where a compiled function registers a buffer (fullgraph too)."""
        native = dict(_snapshot(self.origin.items))
        own = dict(_snapshot(self.own.items))
        merged: list[tuple[Any, Any]] = []
        for key in tuple(self._order):
            if key in own:
                merged.append((key, own.pop(key)))
            elif key in native:
                merged.append((key, native.pop(key)))
        merged.extend(native.items())
        merged.extend(own.items())
        return tuple(merged)

    def values(self) -> tuple[Any, ...]:  # type: ignore[override]
        # (what the framework's loop reads)
        return tuple(hook for _, hook in self.items_now())

    def __getitem__(self, key: int) -> Any:
        own = self.own.get(key, self)
        return self.origin[key] if own is self else own

    def __setitem__(self, key: int, value: Any) -> None:
        # a native registration (the framework's handle is made on this table, then this), or
        # a library rewriting a hook in place (a profiler wrapping each: unihook's stay here):
        # a key already in keeps its place, a new one goes last (as in an OrderedDict)
        if key in self.own or key in self._mine:
            new = key not in self.own
            self.own[key] = value
            if new:
                self._put_last(key)
            return
        new = key not in self.origin
        self.origin[key] = value
        if new:
            self._put_last(key)

    def __delitem__(self, key: int) -> None:
        # a native handle's removal, or pop / popitem / clear (MutableMapping's, through this)
        if self.origin.pop(key, self) is self and self.own.pop(key, self) is self:
            raise KeyError(key)
        self._order = {k: None for k in self._order if k != key}

    def move_to_end(self, key: int, last: bool = True) -> None:
        """As OrderedDict's: `key` runs last (first with ``last=False``); a native key moves in
        the origin too, which goes back in that order."""
        if key not in self:
            raise KeyError(key)
        if key in self.origin:
            self.origin.move_to_end(key, last)
        rest = {k: None for k in self._order if k != key}
        self._order = {**rest, key: None} if last else {key: None, **rest}

    def __contains__(self, key: object) -> bool:
        return key in self.origin or key in self.own

    def __iter__(self) -> Iterator[int]:
        return iter([key for key, _ in self.items_now()])

    def __reversed__(self) -> Iterator[int]:
        return iter([key for key, _ in reversed(self.items_now())])

    def __eq__(self, other: object) -> bool:
        # as OrderedDict's: the order counts against another ordered one
        if isinstance(other, (OrderedDict, GlobalTable)):
            return self.items_now() == tuple(other.items())
        return dict(self.items_now()) == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> OrderedDict[int, Any]:
        return self.copy() | other

    def __ror__(self, other: Any) -> OrderedDict[int, Any]:
        return OrderedDict(other) | self.copy()

    def __ior__(self, other: Any) -> GlobalTable:
        # in place, as OrderedDict's (a new dict would leave unihook's hooks in it as native
        # ones, and a library's alias of the table unchanged: helper-91's FINDING 1)
        self.update(other)
        return self

    def keys(self) -> KeysView[int]:  # (reversible, as an OrderedDict's)
        return _Keys(self)

    def items(self) -> ItemsView[int, Any]:
        return _Items(self)

    @classmethod
    def fromkeys(cls, keys: Any, value: Any = None) -> OrderedDict[Any, Any]:
        return OrderedDict.fromkeys(keys, value)

    def __len__(self) -> int:
        return len(self.origin) + len(self.own)

    def popitem(self, last: bool = True) -> tuple[int, Any]:
        """As OrderedDict's: the last hook (the first with ``last=False``), removed."""
        items = self.items_now()
        if not items:
            raise KeyError("dictionary is empty")
        key, value = items[-1 if last else 0]
        del self[key]
        return key, value

    def copy(self) -> OrderedDict[int, Any]:
        """An OrderedDict of the same hooks, as the framework's own dict copies."""
        return OrderedDict(self.items_now())

    def __reduce__(self) -> Any:
        # copied, deep-copied (a native handle's deepcopy takes its dict) or pickled: a plain
        # OrderedDict of the same hooks, as the framework's own
        return (OrderedDict, (), None, None, iter(self.items_now()))

    def __repr__(self) -> str:
        return repr(self.copy())


class _Keys(KeysView[int]):
    def __reversed__(self) -> Iterator[int]:
        return reversed(self._mapping)  # type: ignore[call-overload]


class _Items(ItemsView[int, Any]):
    def __reversed__(self) -> Iterator[tuple[int, Any]]:
        mapping: Mapping[int, Any] = self._mapping
        return iter(reversed(mapping.items_now()))  # type: ignore[attr-defined]


def add_to_global_table(
    owner: Any, attr: str, hook: Callable[..., Any], new_key: Callable[[Any], int]
) -> Callable[[], None]:
    """Put `hook` last in ``owner.attr``, a framework's global hook OrderedDict that its own
    code loops over (see the module docstring), under the key ``new_key(table)`` (the id of a
    native removal handle made on the table: the framework's counter); return its remover,
    which is idempotent and also undoes an addition a Ctrl-C cut short."""
    tables: list[GlobalTable] = []
    keys: list[int] = []

    def remove() -> None:
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            for table in tables:
                for key in keys:
                    table.drop(key)
                if not table.own and getattr(owner, attr) is table:
                    setattr(owner, attr, table.detach())

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        found = getattr(owner, attr)
        table = found if isinstance(found, GlobalTable) else _table_for(owner, attr, found)
        tables.append(table)
        keys.append(new_key(table))
        table.add(keys[0], hook)
        if found is not table:
            setattr(owner, attr, table)
    return remove


def _table_for(owner: Any, attr: str, origin: OrderedDict[int, Any]) -> GlobalTable:
    """The table standing for `origin`, the dict ``owner.attr`` holds: one per dict, so that a
    library that saves the table, puts a dict of its own there for a while (a quiet section,
    during which unihook registers) and restores the table finds it as it was, standing for
    the framework's dict with the native hooks (until 2026-12-02 the table was made to stand
    for the library's dict: they were lost for good, helper-89's FINDING 3). A hook unihook
    registers meanwhile goes to the library's dict's table, and with it, as a native one
    does."""
    global _prune_at
    key = (id(owner), attr, id(origin))
    table = _tables.get(key)
    if table is not None and table.stands_for(origin):
        table.attach(origin)  # (back after its last hook went: as it is now)
        return table
    if len(_tables) >= _prune_at:
        for old in [k for k, t in _tables.items() if t.stands_for(None) and not t.own]:
            del _tables[old]
        _prune_at = 2 * len(_tables) + 64
    table = _tables[key] = GlobalTable(origin)
    return table
