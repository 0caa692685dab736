"""The forward (pre-)hooks registered through unihook with ``prepend=True``, by module.

A recipe with `every` > 1 removes its hooks between recorded forwards and puts them back in
their places (``recipes._places``). Where no hook that stood beside them is left, the dict's
order cannot say whether a hook registered meanwhile went first (prepend) or last: these keys
say it for the hooks unihook registered (`DropHook`'s, a user's through unihook). Until
2026-12-05 the recipe's hooks went first, before them (helper-128's FINDINGS 1 and 2: an
ActivationStats with every=2 recorded the output before a DropHook made on an off-step).
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["keys_of", "prepended", "note_prepended"]

# module -> the keys of its hooks registered with prepend, per dict (0: pre-hooks, 1: hooks)
_prepended: weakref.WeakKeyDictionary[Any, tuple[frozenset[int], frozenset[int]]] = (
    weakref.WeakKeyDictionary()
)


def keys_of(module: Any, at: int) -> frozenset[int]:
    """The keys of `module`'s forward pre-hook (`at` 0) or forward hook (1) dict now, empty
    where the backend does not say (``Ops.forward_hook_dicts``)."""
    from . import ops

    try:
        hooks = ops.forward_hook_dicts(module)[at]
        # (RuntimeError: another thread changed the dict while it was read; the key is then
        # not noted, and the recipes' places take the hook for one appended)
        return frozenset() if hooks is None else frozenset(hooks)
    except (LookupError, TypeError, NotImplementedError, RuntimeError):
        return frozenset()


def note_prepended(module: Any, at: int, before: frozenset[int]) -> None:
    """Note the keys `module`'s dict `at` has now and did not have `before` a registration with
    prepend (its hook's); keys gone from the dict since are forgotten."""
    now = keys_of(module, at)
    try:
        noted = list(_prepended.get(module, (frozenset(), frozenset())))
        noted[at] = (noted[at] & now) | (now - before)
        _prepended[module] = (noted[0], noted[1])
    except TypeError:  # (a module no weak reference can point to: nothing noted)
        return


def prepended(module: Any, at: int) -> frozenset[int]:
    """The keys in `module`'s forward pre-hook (`at` 0) or forward hook (1) dict of hooks
    unihook registered there with prepend."""
    try:
        return _prepended.get(module, (frozenset(), frozenset()))[at]
    except TypeError:
        return frozenset()
