"""The forward (pre-)hooks registered through unihook with ``prepend=True``, by their keys.

A recipe with `every` > 1 removes its hooks between recorded forwards and puts them back in
their places (``recipes._places``). Where no hook that stood beside them is left, the dict's
order cannot say whether a hook registered meanwhile went first (prepend) or last: these keys
say it for the hooks unihook registered (`DropHook`'s, a user's through unihook). Until
2026-12-05 the recipe's hooks went first, before them (helper-128's FINDINGS 1 and 2: an
ActivationStats with every=2 recorded the output before a DropHook made on an off-step).

The notes go by key (a framework draws its hooks' keys from one counter per process) and by
backend (torch's and paddle's counters both start at 0, and both keep OrderedDicts), not by
module: a deep copy of the model keeps its dicts' keys, and so its notes, and modules that
compare equal keep theirs apart (until 2026-12-05 they were kept by module, by equality, and
lost in a copy: helper-139's FINDINGS 2 and 4). Removing the hook forgets its note (until
2026-12-05 they piled up, and a paddle key could pass for a torch one's): a copy whose first
recorded forward comes after that places the recipe's hooks before the copy's hook once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["Note", "forget_prepended", "keys_of", "note_prepended", "prepended"]

Note = tuple[type, int]  # (the backend's Ops type, a key)

# a note -> the dict it was noted in, weakly (None: a dict that takes no weak reference);
# pruned of those whose dict is gone as the notes double (a model dropped with its hooks on)
_noted: dict[Note, weakref.ref[Any] | None] = {}
_pruned_at = 64
_lock = threading.Lock()


def _dict_of(module: Any, at: int) -> tuple[type, Any]:
    from . import ops

    return type(ops.ops_for(module)), ops.forward_hook_dicts(module)[at]


def keys_of(module: Any, at: int) -> frozenset[int] | None:
    """The keys of `module`'s forward pre-hook (`at` 0) or forward hook (1) dict now, empty
    where the backend does not say (``Ops.forward_hook_dicts``); None where the dict could not
    be read (another thread changed it meanwhile: then nothing is noted)."""
    try:
        hooks = _dict_of(module, at)[1]
        return frozenset() if hooks is None else frozenset(hooks)
    except (LookupError, TypeError, NotImplementedError):
        return frozenset()
    except RuntimeError:
        return None


def note_prepended(module: Any, at: int, before: frozenset[int] | None, into: list[Note]) -> None:
    """Note the keys `module`'s dict `at` has now and did not have `before` a registration
    with prepend (its hook's), each added to `into` first (for `forget_prepended`, which the
    caller set up to undo this); nothing where either read failed (the places then take the
    hook for one appended, as one the framework prepended)."""
    global _pruned_at
    now = keys_of(module, at)
    if before is None or now is None or not now - before:
        return
    backend, hooks = _dict_of(module, at)
    try:
        ref: weakref.ref[Any] | None = weakref.ref(hooks)
    except TypeError:
        ref = None
    with _lock:
        for key in now - before:
            into.append((backend, key))
            _noted[(backend, key)] = ref
        if len(_noted) > 2 * _pruned_at:
            for note, held in list(_noted.items()):
                alive = None if held is None else held()
                if held is not None and (alive is None or note[1] not in alive):
                    del _noted[note]
            _pruned_at = max(64, len(_noted))


def forget_prepended(notes: list[Note]) -> None:
    """Forget `notes` (a removed hook's, or a registration's that did not finish). Idempotent."""
    with _lock:
        for note in notes:
            _noted.pop(note, None)


def prepended(module: Any, at: int) -> frozenset[int]:
    """The keys in `module`'s forward pre-hook (`at` 0) or forward hook (1) dict of hooks
    unihook registered with prepend (there, or in the dict it was copied from)."""
    try:
        backend, hooks = _dict_of(module, at)
        keys = () if hooks is None else tuple(hooks)
    except (LookupError, TypeError, NotImplementedError, RuntimeError):
        return frozenset()
    return frozenset(key for key in keys if (backend, key) in _noted)
