"""Where a recipe's hooks sit among a module's forward hooks while `every` > 1 places them
anew for each recorded forward: back in the places they had, as with `every=1`, which places
them once (after the hooks registered before the recipe, before those registered after it).
Until 2026-12-04 the hooks placed anew went after every hook registered since: a user's hook
replacing a module's output was seen in forwards N, 2N... and not in forward 0, one history
mixing two quantities (helper-126's FINDING 3)."""

from __future__ import annotations

from typing import Any, Callable

from unihook import HookGroup, ops
from unihook.backend import HookDict, collector_paused

__all__ = ["Places"]

# (a module's qualified name in the model, 0 for its forward pre-hook dict or 1 for its forward
# hook dict): by name, the places hold for a copy of the model too
_Slot = tuple[str, int]


# the modules a recipe's hooks may sit on, each under the name it keeps its place by
Modules = Callable[[], "list[tuple[str, Any]]"]


def _dicts(modules: Modules) -> dict[_Slot, tuple[Any, Any]]:
    """The forward hook dicts of the `modules`, with their module, by slot."""
    found: dict[_Slot, tuple[Any, Any]] = {}
    for name, module in modules():
        for at, hooks in enumerate(ops.forward_hook_dicts(module)):
            if hooks is not None:
                found[(name, at)] = (module, hooks)
    return found


class Places:
    """The keys a recipe's hooks hold in the forward hook dicts of its model's modules, and,
    once they are removed, the order of each dict then (`leave`), for the next `place`."""

    def __init__(self) -> None:
        self._held: dict[_Slot, tuple[int, ...]] = {}  # the recipe's keys, in the dict's order
        # the dict's keys as the hooks left, and theirs among them
        self._left: dict[_Slot, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # what `_left` held for a slot `place` could not put back (see there)
        self._kept: dict[_Slot, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def copy(self) -> Places:
        """Another object with the same places (a copy of the recipe: its own)."""
        new = Places()
        new._held, new._left, new._kept = dict(self._held), dict(self._left), dict(self._kept)
        return new

    def place(self, modules: Modules, build: Callable[[], HookGroup]) -> HookGroup:
        """Run `build` (which registers the recipe's hooks on the `modules`) and put the
        keys it added where the ones `leave` saw were: the builder registers the same hooks in
        the same order each time, its n-th key in a dict takes the place of the n-th one left.
        (A key another thread registers meanwhile is taken for the recipe's: the counts then
        differ, and that dict's new keys stay last this time only.)"""
        # The collector off while the places are read and put back: the slots of a large model
        # are thousands of small objects, whose allocation started collections of the whole
        # heap (on 1000 modules, 70% of the scans' time: helper-128's places benchmark).
        with collector_paused():
            before = {slot: set(hooks) for slot, (_, hooks) in _dicts(modules).items()}
        built = build()
        try:
            with collector_paused():
                self._put_back_all(modules, before)
        except BaseException:
            # (a Ctrl-C here: the hooks placed go, as a build cut short; until 2026-12-04
            # they stayed, unremovable: helper-128's FINDING 8)
            built.remove()
            raise
        return built

    def _put_back_all(self, modules: Modules, before: dict[_Slot, set[int]]) -> None:
        held: dict[_Slot, tuple[int, ...]] = {}
        kept: dict[_Slot, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for slot, (module, hooks) in _dicts(modules).items():
            known = before.get(slot, ())
            # (one read of the keys: another thread may change the dict meanwhile, and a
            # Python loop over it then raised in the user's forward, helper-139's FINDING 1)
            keys = tuple(hooks)
            ours = tuple(key for key in keys if key not in known)
            if not ours:
                continue
            held[slot] = ours
            left = self._left.get(slot)
            if left is None or len(left[1]) == len(ours) == len(keys):
                continue  # (no place left, or only the recipe's hooks: nothing to put back)
            if len(left[1]) == len(ours):
                first = ops.prepended_keys(module, slot[1])
                _put_back(hooks, keys, left[0], dict(zip(left[1], ours)), first)
            else:
                # another thread's key among the new ones: not put back this time, and the
                # order left stays the place for the next time (until 2026-12-04 the order
                # then was noted, the wrong place kept for good: helper-128's FINDING 6)
                kept[slot] = left
        self._held, self._left, self._kept = held, {}, kept

    def leave(self, modules: Modules) -> None:
        """Note each dict's order before the recipe's hooks are removed from it."""
        if not self._held:
            return
        with collector_paused():
            self._leave(modules)

    def _leave(self, modules: Modules) -> None:
        dicts = _dicts(modules)
        left = {}
        for slot, ours in self._held.items():
            found = dicts.get(slot)
            if slot in self._kept:
                left[slot] = self._kept[slot]
            elif found is not None:
                left[slot] = (tuple(found[1]), ours)
        self._held, self._left, self._kept = {}, left, {}


def _put_back(
    hooks: Any,
    keys: tuple[int, ...],
    order: tuple[int, ...],
    renamed: dict[int, int],
    first: frozenset[int],
) -> None:
    """Move the new keys (`renamed`: old key -> new) of `hooks` where the old ones were in
    `order`: after the nearest key before it still there, else before the nearest one after
    it (keys registered since came first, or last), else first, after the hooks registered
    since with prepend (`first`: through unihook; the framework's own registration is not
    told from an append, and goes after them)."""
    new = set(renamed.values())
    target = [key for key in keys if key not in new]
    # (unihook's backward dispatchers, pinned last: keys registered since went before them,
    # so they tell nothing of a place; until 2026-12-04 taken for one: helper-128's F3)
    pinned = set(hooks.pinned) if isinstance(hooks, HookDict) else set()
    for at, old in enumerate(order):
        key = renamed.get(old)
        if key is not None:
            target.insert(_spot(order, at, target, renamed, pinned, first), key)
    if target != list(keys) and hasattr(hooks, "move_to_end"):
        # (a library's dict without an order to change stays as it is: until 2026-12-04 an
        # AttributeError in the model's forward, helper-128's FINDING 9)
        _reorder(hooks, target)


def _reorder(hooks: Any, target: list[int]) -> None:
    """Put `hooks`' keys in `target`'s order (a HookDict keeps its pinned keys, the
    dispatchers, last). Another thread may change the dict meanwhile: a key it removed is
    passed over, one it registered goes last, as it would have (until 2026-12-05 a KeyError
    in the user's forward, helper-139's FINDING 1)."""
    for key in target:
        try:
            hooks.move_to_end(key)
        except KeyError:
            continue
    placed = set(target)
    for key in tuple(hooks):
        if key not in placed:
            try:
                hooks.move_to_end(key)
            except KeyError:
                continue


def _spot(
    order: tuple[int, ...],
    at: int,
    target: list[int],
    renamed: dict[int, int],
    pinned: set[int],
    first: frozenset[int],
) -> int:
    for key in reversed(order[:at]):
        key = renamed.get(key, key)
        if key in target:
            return target.index(key) + 1
    for key in order[at + 1 :]:
        if key not in renamed and key not in pinned and key in target:
            return target.index(key)
    spot = 0
    while spot < len(target) and target[spot] in first:
        spot += 1
    return spot
