"""The shared shape of a recipe: it owns a HookGroup and is a context manager."""

from __future__ import annotations

from unihook import HookGroup
from unihook.handles import Removable


class Recipe(Removable):
    """Removes every hook it placed on `remove()` or when its `with` block exits."""

    def __init__(self) -> None:
        self._hooks = HookGroup()

    def remove(self) -> None:
        self._hooks.remove()
