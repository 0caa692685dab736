"""A table keyed by type that keeps no type alive."""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

V = TypeVar("V")


class ByType(Generic[V]):
    """Values by type: by the type's id, with a weak reference to it whose callback drops the
    entry when the type goes. A class made per model (in a function, by a factory, by
    hypothesis) holds its methods' closures: a dict keyed by the type kept every one alive,
    with what they refer to (helper-124's FINDING 4). By id: a type's own hash and equality
    may raise or take two types for one (helper-100's FINDING 3)."""

    __slots__ = ("_entries", "__weakref__")

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[type], V]] = {}

    def get(self, cls: type) -> V | None:
        entry = self._entries.get(id(cls))
        if entry is not None and entry[0]() is cls:
            return entry[1]
        return None

    def put(self, cls: type, value: V) -> None:
        key = id(cls)
        table = weakref.ref(self)

        def drop(ref: weakref.ref[type]) -> None:
            # (the type's entry only: its id may be another type's by now)
            live = table()
            if live is not None and live._entries.get(key, (None,))[0] is ref:
                live._entries.pop(key, None)

        self._entries[key] = (weakref.ref(cls, drop), value)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
