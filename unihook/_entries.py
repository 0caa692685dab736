"""The core's functions that a framework calls on its own: the adapters and wrappers unihook
places in its hook dicts, and the hook dicts' own methods its hook loops call. A backend whose
compiler would compile each of them as a frame of its own (torch's dynamo, at a compiled
function's graph break, where it stands an ``OptimizedModule`` argument for the module it
wraps) reads them (`eager_entries`) and keeps its compiler off them."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# each with whether what it calls is the core's only (a compiler may stay off those too)
_entries: dict[Callable[..., Any], bool] = {}


def eager_entry(fn: F, *, callees_too: bool = False) -> F:
    """Mark `fn`, a function of the core's that a framework calls on its own."""
    _entries[fn] = callees_too
    return fn


def eager_entries() -> dict[Callable[..., Any], bool]:
    """The core's functions a framework calls on its own (`eager_entry`), so far: a module
    imported later adds its own."""
    return dict(_entries)
