"""The shared shape of a recipe: it owns a HookGroup and is a context manager."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

from unihook import HookGroup

_R = TypeVar("_R", bound="Recipe")


class Recipe:
    """Removes every hook it placed on `remove()` or when its `with` block exits."""

    def __init__(self) -> None:
        self._hooks = HookGroup()

    def remove(self) -> None:
        self._hooks.remove()

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()
