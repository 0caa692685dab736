"""The forward (pre-)hooks registered through unihook with ``prepend=True``, by their keys.

A recipe with `every` > 1 removes its hooks between recorded forwards and puts them back in
their places (``recipes._places``). Where no hook that stood beside them is left, the dict's
order cannot say whether a hook registered meanwhile went first (prepend) or last: these keys
say it for the hooks unihook registered (`DropHook`'s, a user's through unihook). Until
2026-12-05 the recipe's hooks went first, before them (helper-128's FINDINGS 1 and 2: an
ActivationStats with every=2 recorded the output before a DropHook made on an off-step).

The notes live on the framework's hook dict itself (an attribute, deleted with its last
key): a deep copy or pickle of the model carries them with the keys (`HookDict`'s copies
carry them too, `carry_notes`), modules that compare equal keep theirs apart, a paddle key
never passes for a torch one's, and removing the original's hook leaves a copy's note. Until
2026-12-05 they were kept by module, by equality, and lost in a copy (helper-139's FINDINGS 2
and 4), then in one table by key, which grew with each registration (the interruption
harness) and, forgetting a removed hook's, lost a copy's for good (helper-141's FINDING 2).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = [
    "NOTES",
    "carry_notes",
    "forget_prepended",
    "keys_of",
    "note_prepended",
    "notes_state",
    "prepended",
]

NOTES = "_unihook_prepended"  # the attribute: a frozenset of keys
# (reentrant: a signal handler removing a hook on the thread that notes one waits for no one)
_lock = threading.RLock()


def _home(hooks: Any) -> Any:
    """Where `hooks`' notes live: a `HookDict`'s origin (the framework's own dict, which
    outlives it: the module gets it back when unihook's last key leaves), else the dict."""
    origin = getattr(hooks, "_origin", None)  # (only a HookDict has one; no import cycle)
    return hooks if origin is None else origin


def _dict_of(module: Any, at: int) -> Any:
    from . import ops

    return ops.forward_hook_dicts(module)[at]


def _notes(home: Any) -> frozenset[int]:
    return getattr(home, NOTES, None) or frozenset()


def _set_notes(home: Any, keys: frozenset[int]) -> None:
    if keys:
        setattr(home, NOTES, keys)
    elif NOTES in getattr(home, "__dict__", ()):
        delattr(home, NOTES)  # (the framework's dict as it was)


def keys_of(module: Any, at: int) -> frozenset[int] | None:
    """The keys of `module`'s forward pre-hook (`at` 0) or forward hook (1) dict now, empty
    where the backend does not say (``Ops.forward_hook_dicts``); None where the dict could not
    be read (another thread changed it meanwhile: then nothing is noted)."""
    try:
        hooks = _dict_of(module, at)
        return frozenset() if hooks is None else frozenset(hooks)
    except (LookupError, TypeError, NotImplementedError):
        return frozenset()
    except RuntimeError:
        return None


def note_prepended(
    module: Any, at: int, before: frozenset[int] | None, into: list[Any], hook: Any
) -> None:
    """Note the key of `hook` (registered with prepend) in `module`'s dict `at`: the keys it
    has now and did not have `before`, and among them those holding `hook` (or a wrapper of
    it, by ``__wrapped__``) where any does (another thread's hook appended meanwhile got a
    key too: helper-143's FINDING 3, an every=2 recipe's hook then went after it), the first
    of these where it leads the dict; `into`
    gets the place first (for `forget_prepended`, which the caller set up to undo this).
    Nothing where either read failed (the places then take the hook for one appended, as
    one the framework prepended) or the dict takes no attribute."""
    now = keys_of(module, at)
    if before is None or now is None or not now - before:
        return
    hooks = _dict_of(module, at)
    new = now - before
    holding = [key for key in new if _holds(hooks.get(key), hook)]
    new = frozenset(_front(tuple(hooks), new, holding) or holding or new)
    home = _home(hooks)
    try:
        ref = weakref.ref(home)
    except TypeError:
        return
    with _lock:
        into.append((ref, new))
        try:
            _set_notes(home, _notes(home) | new)
        except (AttributeError, TypeError):
            into.clear()  # (a dict without attributes: a third party's backend)


def _front(order: tuple[int, ...], new: frozenset[int], holding: list[int]) -> list[int]:
    """The first of the `holding` keys in the `order` of the dict, if the keys before it are
    new too: the one prepended (another thread may append the same function meanwhile, one
    logging hook put on many modules: helper-145's FINDING 4)."""
    for key in order:
        if key in holding:
            return [key]
        if key not in new:
            return []
    return []


def _holds(value: Any, hook: Any) -> bool:
    """Whether the dict's `value` is `hook` or wraps it (``__wrapped__``, a few deep)."""
    for _ in range(_DEPTH):
        if value is hook:
            return True
        value = getattr(value, "__wrapped__", None)
        if value is None:
            return False
    return False


_DEPTH = 8  # (a backend's wrapper of unihook's `when` wrapper of the hook: 3)


def forget_prepended(noted: list[Any]) -> None:
    """Forget the notes `note_prepended` put in `noted` (a removed hook's, or a registration's
    that did not finish) in the dict they were made in; a copy's stay. Idempotent."""
    with _lock:
        for ref, keys in noted:
            home = ref()
            if home is not None and _notes(home) & keys:
                _set_notes(home, _notes(home) - keys)


def carry_notes(source: Any, copy: Any) -> None:
    """Give `copy` (a copy of the hook dict `source`, made by unihook) the notes of the keys
    it holds."""
    keys = _notes(_home(source)) & frozenset(copy)
    if keys:
        _set_notes(_home(copy), keys)


def notes_state(source: Any, keys: Any) -> dict[str, frozenset[int]]:
    """The pickle state that gives a loaded copy of the hook dict `source`, holding `keys`,
    their notes: ``{NOTES: ...}``, or empty."""
    found = _notes(_home(source)) & frozenset(keys)
    return {NOTES: found} if found else {}


def prepended(module: Any, at: int) -> frozenset[int]:
    """The keys in `module`'s forward pre-hook (`at` 0) or forward hook (1) dict of hooks
    unihook registered with prepend (there, or in the dict it was copied from)."""
    try:
        hooks = _dict_of(module, at)
        keys = frozenset(()) if hooks is None else frozenset(hooks)
    except (LookupError, TypeError, NotImplementedError, RuntimeError):
        return frozenset()
    return keys & _notes(_home(hooks))
