"""A table keyed by object identity that keeps no key alive: modules, types."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Generic, Iterator, TypeVar

V = TypeVar("V")


class WeakIdentityKeys(Generic[V]):
    """Values by object, weakly, as ``weakref.WeakKeyDictionary`` but by identity: a module
    class with a value-based ``__eq__`` and ``__hash__`` (two instances equal by type, or by
    weights) made two modules one key, and the second's backward hook went into the first's
    state: it fired for the first, never for the second (helper-167's FINDING 6). By id, with
    a weak reference whose callback drops the entry when its object goes (the entry only:
    the id may be another object's by then). Types too: a class made per model (in a
    function, by a factory, by hypothesis) holds its methods' closures, which a dict keyed by
    the type kept alive (helper-124's FINDING 4); a type's own hash and equality may raise or
    take two types for one (helper-100's FINDING 3)."""

    __slots__ = ("_entries", "__weakref__")

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], V]] = {}

    def _entry(self, key: Any) -> tuple[weakref.ref[Any], V] | None:
        entry = self._entries.get(id(key))
        return entry if entry is not None and entry[0]() is key else None

    def get(self, key: Any, default: Any = None) -> Any:
        # (inline: `ops_for` reads its table by type at each call)
        entry = self._entries.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default

    def __getitem__(self, key: Any) -> V:
        entry = self._entry(key)
        if entry is None:
            raise KeyError(key)
        return entry[1]

    def __contains__(self, key: Any) -> bool:
        return self._entry(key) is not None

    def __setitem__(self, key: Any, value: V) -> None:
        ident = id(key)
        entry = self._entry(key)
        if entry is not None:  # (one weak reference per object: replaced in one step)
            self._entries[ident] = (entry[0], value)
            return
        # The callback pops the entry, in C: no Python frame (a traced one added positions
        # where a Ctrl-C is dropped, whenever the collector freed a module during a
        # registration: tests/interruption_child.py). The object dies as it runs, so its id
        # is no other's yet; a reference replaced or popped before dies without calling it.
        forget = partial(dict.pop, self._entries, ident)
        self._entries[ident] = (weakref.ref(key, forget), value)

    def setdefault(self, key: Any, default: V) -> V:
        entry = self._entry(key)
        if entry is not None:
            return entry[1]
        self[key] = default
        return default

    def pop(self, key: Any, *default: Any) -> Any:
        entry = self._entry(key)
        if entry is None:
            if default:
                return default[0]
            raise KeyError(key)
        self._entries.pop(id(key), None)
        return entry[1]

    def items(self) -> list[tuple[Any, V]]:
        """The live entries, a list (another thread may change the table meanwhile)."""
        found = []
        for ref, value in list(self._entries.values()):
            key = ref()
            if key is not None:
                found.append((key, value))
        return found

    def values(self) -> list[V]:
        return [value for _, value in self.items()]

    def __iter__(self) -> Iterator[Any]:
        return iter([key for key, _ in self.items()])

    def __len__(self) -> int:
        return len(self.items())

    def clear(self) -> None:
        self._entries.clear()
