"""A module's forward hook dicts while unihook has hooks in them.

torch and paddle register a forward (pre-)hook by inserting into the module's hook OrderedDict
(``move_to_end(last=False)`` for prepend), and their removal handles hold a weak reference to
that dict object. unihook's backward dispatchers must run after every other hook, whoever
registers after them. So while unihook has a key in a hook dict, the module holds a `HookDict`:

- insertion and ``move_to_end`` keep the pinned keys (the dispatchers) last;
- ``items()`` returns a snapshot: paddle iterates the live dict, so a hook that registers or
  removes a hook mid-call would raise "OrderedDict mutated during iteration";
- every change is mirrored into the dict it replaced (the origin), and a key an older native
  handle deletes from the origin is dropped at the next call: native handles keep working;
- when unihook's last key leaves, the origin object itself goes back, holding exactly what
  native registration alone would hold. The HookDict lives on beside it (`_retired`), so the
  handles created meanwhile (a weakref to it) still remove their hook; so does one the
  module dropped (it died, or a library gave it another dict): another module (a shallow
  copy) may hold the origin;
- a library may assign the module a new hook dict (``m._forward_hooks = OrderedDict()``, or a
  copy of the old one): torch's own backward hooks live elsewhere and survive that, so the
  pinned keys (the backward dispatchers) follow the module into the new dict, which becomes
  the origin of a new HookDict. The signal is free: the module held the only reference to
  the HookDict, which is finalized at the assignment (`HookDict.__del__`, `_follow`). The
  flag tables (the keys of hooks called with kwargs, or always) that hold a key of unihook's
  are watched the same way (`_Flagged`): the key follows the module into its new table.
- MindSpore creates a cell's hook dicts and flag tables on first read, unlocked: a call on
  another thread that found none yet assigns a new empty one over the one a registration
  just wrote to. The same signals repair that: when `Access.recreated` says the framework
  dropped a hook dict so, unihook's own hooks follow it too, not only the pinned ones.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections import OrderedDict
from collections.abc import Set as AbstractSet
from functools import partial
from itertools import count
from operator import is_not
from types import CodeType
from typing import Any, Callable, Iterable, Iterator, Protocol, TypeVar

from ._describe import Site
from ._entries import eager_entry
from ._hook_names import HookName
from ._locks import RegistryLock, undo_if_unfinished
from ._prepended import carry_notes, notes_state
from .errors import DispatchersOnlyError

__all__ = [
    "Access",
    "HookDict",
    "Pinned",
    "SnapshotDict",
    "dicts_of",
    "new_key",
    "pin",
    "pinned_key",
    "unpin",
    "unpin_orphaned",
]


_E = TypeVar("_E", bound=Exception)


class Access(Protocol):
    """How a backend reads and replaces a module's own hook dict. Optional attributes:
    ``iterates_live = True`` where the framework iterates the live hook dict in a module's
    call (paddle, MindSpore; torch copies it first): a pickled module's hook dicts then come
    back as `SnapshotDict`s (`HookDict.__reduce__`). ``ids_drawn()`` (the framework's handle
    counter: the next id) and ``reserve_ids(top)`` (moves it past `top`), both or neither,
    with the Access a module-level class (a pickle names it): a pickled module's hooks keep
    their ids in the loading process (see `_loaded`). ``moves_hooks(code)``: whether `code`
    is the framework's own function that moves a module's forward hooks onto another module,
    deleting each (see `HookDict._moving`)."""

    def recreated(self, owner: Any, attr: str, /) -> bool:
        """Whether the framework itself is assigning `owner` a new hook dict `attr` (asked
        by the finalizer of the one it drops): its lazy creation raced a registration, not
        a library's choice, and unihook's own hooks follow into the new one."""
        ...

    def get(self, owner: Any, attr: str, /) -> OrderedDict[int, Any]: ...

    def put(self, owner: Any, attr: str, hooks: OrderedDict[int, Any], /) -> None: ...


class SnapshotDict(OrderedDict[int, Any]):
    """A module's hook dict as a pickled `HookDict` comes back where the framework iterates
    the live dict (`Access.iterates_live`): a plain dict whose iteration is a snapshot, as the
    HookDict's. The loaded module's hooks (a recipe's, with `every` > 1) place hooks on it
    during its call, the first of which installs a HookDict over this one and mirrors into it:
    paddle, iterating a plain OrderedDict, raised "OrderedDict mutated during iteration"."""

    # As the pickled HookDict had them (`HookDict.__reduce__`): the backend's check of the
    # calling context, run before each call's hooks (paddle: a to_static(full_graph=True)
    # build is refused, SOT breaks the graph; until 2026-12-04 a loaded copy's hooks ran
    # in a static build once, silently: helper-117's FINDING 1), which reads `owned` and
    # `pinned` (no backward dispatcher pickles) and `owner()` (unknown here).
    guard: Callable[[Any], None] | None = None
    owned: frozenset[int] = frozenset()
    pinned: tuple[int, ...] = ()
    access: Any = None  # the backend's Access (`_loaded`), for a pickle of this one

    def owner(self) -> Any:
        return None

    def __reduce__(self) -> Any:
        """Pickled again (a loaded copy saved): as the HookDict it came from (`_loaded`)."""
        items = list(OrderedDict.items(self))
        state = {k: v for k, v in self.__dict__.items() if k != "access"} or None
        top = _top(self.access, (k for k, _ in items))
        return (_loaded, (SnapshotDict, self.access, top), state, None, iter(items))

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__()))

    def keys(self) -> SetView:  # type: ignore[override]
        return SetView(super().keys())

    def values(self) -> tuple[Any, ...]:  # type: ignore[override]
        return tuple(super().values())

    def items(self) -> SetView:  # type: ignore[override]
        if self.guard is not None:
            self.guard(self)
        return SetView(super().items())


def _loaded(kind: type[OrderedDict[int, Any]], access: Any, top: int) -> OrderedDict[int, Any]:
    """A pickled `HookDict` (or `SnapshotDict`) as it loads: an empty `kind`, once the
    backend's handle counter has moved past `top`, the last id the saving process had drawn
    when it pickled (`_top`). A fresh process counts from 0, and a hook registered after the
    load drew the id of a loaded one (unihook's, or a native one of any layer the pickle
    holds): it replaced that hook silently, or took its flags (``with_kwargs``) and raised
    TypeError (helper-117's FINDING 4; torch and paddle do so with their own pickled hooks;
    until helper-120's FINDING 1 only this dict's keys were passed). The `SnapshotDict`
    keeps `access`, so that a copy loaded and saved again does the same (its FINDING 2)."""
    if access is not None:
        access.reserve_ids(top)
    loaded = kind()
    if isinstance(loaded, SnapshotDict):
        loaded.access = access
    return loaded


def _top(access: Any, keys: Iterable[int]) -> int:
    """The last id drawn so far in this process, or the largest of `keys` if larger."""
    drawn = access.ids_drawn() - 1 if access is not None else -1
    return max(drawn, max(keys, default=-1))


class HookDict(OrderedDict[int, Any]):
    """A module's hook dict while unihook has keys in it (see the module docstring)."""

    def __init__(self, *items: Any, **named: Any) -> None:
        # (`items`: a library's ``type(d)(d)``, a dict of its own: TypeError until 2026-12-06,
        # helper-169; unihook's dispatchers go in inert, as in any dict it holds no key of)
        super().__init__()
        self._origin: OrderedDict[int, Any] | None = None  # strong while installed
        self._origin_ref: weakref.ref[OrderedDict[int, Any]] | None = None
        # dropped while installed and kept for its handles since (`_park`): never installed
        # again (CPython finalizes an object once: a second drop would not tell)
        self._finalized = False
        self._owner: weakref.ref[Any] | None = None
        # the shallow copy that holds it too, where `_shared_again` put it back on the owner
        self._sharer: weakref.ref[Any] | None = None
        # retired: the modules it was taken from, which shared it (`_retire`, `_pin`)
        self._sharers: list[weakref.ref[Any]] = []
        self._attr = ""  # the owner's attribute holding it, read through `_access`
        self._access: Access | None = None
        self.pinned: list[int] = []  # kept last, in this order
        self.tail: set[int] = set()  # pinned keys kept after the other pinned ones
        self.owned: set[int] = set()  # unihook's keys, the pinned ones included
        # the owner's flag tables (attributes) that hold a key of unihook's too (see `pin`)
        self.flags: dict[int, tuple[str, ...]] = {}
        self.uncopied: set[int] = set()  # keys a deep copy of the owner goes without
        # items(), tagged with the version it was taken at. A version is unique (a global
        # counter) and set after each change: a snapshot a reader took while another thread
        # changed the dict carries an older tag, so it is never reused.
        self._version = next(_versions)
        self._snap: _Snapshot | None = None
        # a backend's check of the calling context, run before each call's hooks (paddle:
        # raise under a to_static program build, where hooks would see symbolic values)
        self.guard: Callable[[HookDict], None] | None = None
        if items or named:
            self.update(*items, **named)

    def _changed(self) -> None:
        self._version = next(_versions)

    def _install(
        self, origin: OrderedDict[int, Any], owner: Any, attr: str, access: Access | None
    ) -> None:
        # (a retired one taken back: `_Retired`)
        self.__class__ = HookDict  # type: ignore[assignment]
        # A retired one a shallow copy holds, which unihook pinned the copy's dispatchers in
        # since (`_Retired`), taken back by the module: they stay, as in the one dict the
        # framework's copy and module share (until 2026-12-06 they went, the copy's backward
        # hooks silently never fired again: helper-166's FINDING 3).
        kept = [
            (k, OrderedDict.get(self, k)) for k in self.pinned if OrderedDict.__contains__(self, k)
        ]
        tail, flags, uncopied = self.tail, self.flags, self.uncopied
        self._origin = origin
        self._origin_ref = weakref.ref(origin)
        self._owner = weakref.ref(owner)
        self._sharer = None
        self._attr = attr
        self._access = access
        self.pinned = [k for k, _ in kept]
        self.tail = tail & set(self.pinned)
        self.flags = {k: v for k, v in flags.items() if k in self.pinned}
        self.uncopied = uncopied & set(self.pinned)
        self.owned = set(self.pinned)
        super().clear()
        # (a snapshot: another thread's registration, or a finalizer's removal, changing the
        # origin meanwhile failed a registration with "OrderedDict mutated during iteration",
        # helper-158's FINDING 6)
        for key, value in _snapshot(origin.items):
            super().__setitem__(key, value)
        for key, value in kept:
            super().__setitem__(key, value)
        self._changed()

    def owner(self) -> Any:
        """The module whose hook dict this is, None once it died."""
        return None if self._owner is None else self._owner()

    def origin(self) -> OrderedDict[int, Any] | None:
        if self._origin is not None:
            return self._origin
        return None if self._origin_ref is None else self._origin_ref()

    def _repin(self) -> None:
        for key in self.pinned:
            try:
                super().move_to_end(key)
            except KeyError:  # gone meanwhile (a finalizer the collector ran removed it)
                continue
        self._changed()

    def __setitem__(self, key: int, value: Any) -> None:
        new = not OrderedDict.__contains__(self, key)
        if key in self.pinned:
            if not new and _dispatcher(value) and _self_of(value) is not self._state_at(key):
                # Another state's dispatcher under this key: a deep copy's dict updated from
                # its original's (the same keys). It would take the copy's place (until
                # 2026-12-06 the copy's backward hooks never fired, the original's ran for
                # it: helper-167's FINDING 4). The copy keeps its own, as torch's copy keeps
                # its backward hooks beside forward hooks copied in. (The same state's, in
                # another wrapper, goes in: unihook_torch's `_FromNextCall`.)
                return
            super().__setitem__(key, value)
            self._changed()
            if new:  # (in its place among the pinned: before the tail ones)
                self._repin()
            return
        if _dispatcher(value):  # (under a key not pinned: a copy a library carried here)
            value = _Carried()
        # The origin first: a key here and not there is one a native handle removed there,
        # which `items` drops (so another thread's `items` never drops one half inserted).
        origin = self.origin()
        if origin is not None:
            origin[key] = value
        super().__setitem__(key, value)
        self._changed()
        if new and self.pinned:
            self._repin()

    def _state_at(self, key: int) -> Any:
        """The state of the dispatcher pinned under `key`."""
        return _self_of(OrderedDict.get(self, key))

    def __contains__(self, key: object) -> bool:
        if super().__contains__(key):
            return True
        # A key in the origin only: retired, a native handle made just before the swap back
        # (a finalizer the garbage collector ran between torch's `RemovableHandle(...)` and
        # its insertion) refers to this dict while its hook went into the origin; installed,
        # one added to the origin directly (`items` takes it in) or an insertion cut short (a
        # Ctrl-C: the origin goes first), which its handle's removal must still find.
        origin = self.origin()
        return origin is not None and key in origin

    def __delitem__(self, key: int) -> None:
        if key in self.pinned:
            if self._moving(sys._getframe(1).f_code):
                return
            raise self._kept(key)
        if self.drop(key) is _ABSENT:
            raise KeyError(key)

    # OrderedDict's C pop and popitem bypass __delitem__ even in a subclass.
    def pop(self, key: int, *default: Any) -> Any:  # type: ignore[override]
        if key in self.pinned:
            if self._moving(sys._getframe(1).f_code):
                return OrderedDict.__getitem__(self, key)
            raise self._kept(key)
        # (one step, `drop`: tested first, the key could go meanwhile, and a KeyError came
        # out of ``d.pop(k, None)``, helper-165's FINDING 2)
        value = self.drop(key)
        if value is _ABSENT:
            if default:
                return default[0]
            raise KeyError(key)
        return value

    def drop(self, key: int) -> Any:
        """Take `key` out, a pinned one too (unihook's own removal); its value, `_ABSENT`
        where neither this dict nor the origin held it."""
        # Each dict's pop in one step: tested first, the key could go between the test and
        # the deletion (the install clearing a retired dict it takes back, another thread's
        # follow), which raised KeyError from the framework's handle's removal.
        origin = self.origin()
        value = OrderedDict.pop(self, key, _ABSENT)
        if value is not _ABSENT:
            self._changed()
        there = _ABSENT if origin is None else origin.pop(key, _ABSENT)
        self.owned.discard(key)
        if key in self.pinned:
            self.pinned.remove(key)
        self.tail.discard(key)
        return there if value is _ABSENT else value

    def popitem(self, last: bool = True) -> tuple[int, Any]:
        pinned = self.pinned
        keys = [key for key, _ in self._followed() if key not in pinned]
        if not keys and pinned:
            raise self._kept(pinned[-1] if last else pinned[0])
        if not keys:
            raise KeyError("dictionary is empty")
        key = keys[-1] if last else keys[0]
        return key, self.pop(key)

    def _moving(self, code: CodeType) -> bool:
        """Whether `code`, removing a pinned dispatcher, is the framework's own moving a
        module's forward hooks onto another module (`Access.moves_hooks`): the dispatcher
        stays, silently, as the framework's own backward hooks stay with the module; the
        copy it registered on the other module does nothing there
        (`ModuleBackward._foreign`). Until 2026-12-06 paddle's layer fusion raised
        `DispatchersOnlyError` (helper-166's FINDING 1)."""
        moves = getattr(self._access, "moves_hooks", None)
        return moves is not None and moves(code)

    def _kept(self, key: int) -> DispatchersOnlyError:
        """The error of a removal of unihook's pinned dispatcher `key` by another's code.

        unihook's backward dispatchers are not forward hooks (the framework keeps its own
        backward hooks elsewhere), so they stay while unihook's backward hooks of the module
        do, as `clear` leaves them; they still count for `len` and `bool`, which the
        framework's call tests before it runs any. Popped, the backward hooks stopped firing
        for good, later ones too, silently (helper-164's FINDING 1); left in place silently,
        a ``while d: d.pop(next(iter(d)))`` never ended (helper-165's FINDING 1). A KeyError,
        as the framework's dict's once empty."""
        return self._site_error(
            DispatchersOnlyError,
            "a forward hook to remove: unihook's backward-hook dispatchers are not forward "
            "hooks and stay while the module's unihook backward hooks do (`clear()` leaves "
            "them; remove those hooks first, or remove the forward hooks by their handles)",
            f"the dispatcher's key {key}",
        )

    def move_to_end(self, key: int, last: bool = True) -> None:
        if not OrderedDict.__contains__(self, key):
            # A key in the origin only: a registration with prepend that inserted there just
            # before the install moves it in the dict it reads now (torch and paddle read the
            # attribute again): it failed with KeyError, the hook left unprepended.
            origin = self.origin()
            if origin is None or key not in origin:
                raise KeyError(key)
            origin.move_to_end(key, last)
            if self._origin is not None:
                self._follow_origin(origin)
            return
        super().move_to_end(key, last)
        self._changed()
        if key in self.pinned:
            self._repin()
            return
        origin = self.origin()
        if origin is not None and key in origin:
            origin.move_to_end(key, last)
        if last:
            self._repin()

    def clear(self) -> None:
        # Clearing forward hooks leaves the backward hooks' dispatchers in place (as torch's
        # own backward hooks do not live in the forward hook dicts).
        kept = [(key, self[key]) for key in self.pinned if key in self]
        super().clear()
        origin = self.origin()
        if origin is not None:
            origin.clear()
        self.owned.intersection_update(self.pinned)
        for key, value in kept:
            super().__setitem__(key, value)
        self._changed()

    @partial(eager_entry, callees_too=True)
    def items(self) -> Any:  # type: ignore[override]
        # once per hooked module call (twice with pre-hooks): a cached snapshot until a change
        if self.guard is not None:
            self.guard(self)
        return self._followed(self._snap)

    # Snapshots too: dynamo iterates a module's hook dicts live while it compiles
    # (``nn_module_get_all_hooks``: ``for name in hooks``), where a dispatcher another thread's
    # call pins meanwhile made the compile raise "OrderedDict mutated during iteration" (torch
    # registers and removes hooks while no frame compiles: unihook_torch._watched). Each
    # follows the origin's changes first, as `items` (helper-163's FINDING 2).
    def __iter__(self) -> Iterator[int]:
        return iter([key for key, _ in self._followed()])

    def keys(self) -> SetView:  # type: ignore[override]
        return SetView(key for key, _ in self._followed())

    def values(self) -> tuple[Any, ...]:  # type: ignore[override]
        # (the cached snapshot, as `items`: unihook_torch reads the last value at each call
        # of a module whose torch backward hooks it runs)
        return tuple(value for _, value in self._followed(self._snap))

    def __reversed__(self) -> Iterator[int]:
        # The last hook registered first, as in the framework's own dict: unihook's pinned
        # dispatchers, kept last to run last, come after the others. paddle's
        # `Layer._set_op_attrs` takes ``next(reversed(hooks))`` for its own hook, registered
        # last, and found a dispatcher: a second call registered its hook again and failed
        # its own assertion (helper-162's FINDING 4).
        keys = [key for key, _ in self._followed()]
        pinned = set(self.pinned)
        return iter(
            [k for k in reversed(keys) if k not in pinned]
            + [k for k in reversed(keys) if k in pinned]
        )

    def _followed(self, cached: _Snapshot | None = None) -> tuple[tuple[int, Any], ...]:
        """The items, a snapshot (`cached`, where taken at the current version) that holds,
        apart from the pinned keys, the origin's keys and hooks in its order: where the
        origin changed behind this dict, it follows first (`_follow_origin`).

        The origin's keys, not only their number (until 2026-12-06): a hook removed there and
        another added (an older native handle's removal, a registration that read the origin
        just before the install) kept the removed hook running and never ran the added one
        (helper-160's FINDING 4: a native hook fired twice). A hook another put under a key
        there (``d[k] = wrapped``, through a dict read before the take-over) is a change too:
        the hooks are compared by identity (with ==, as `tuple(origin.items())` compared them
        until helper-162's FINDING 1, an __eq__ of the user's missed a replacement or raised
        from the module's call). The snapshot itself is what is compared, after it was taken:
        compared first, the dict could change between the compare and the copy (another
        thread's follow adding back a key it had read in the origin before a removal that
        returned since: a native hook ran in a call made after its removal returned, one call
        in about 50k of a stress, helper-161's FINDING 2)."""
        origin = self._origin
        if origin is None:
            # Retired (`_retire`): the module holds the origin again. A call that read this
            # dict just before, or a library that kept it, reads the origin's hooks (a
            # snapshot cached while installed held removed ones too; this dict's own items
            # missed hooks registered since, and ``popitem()`` raised KeyError where the
            # framework's dict pops its last hook: helper-164's FINDING 5).
            # (Not one unihook pinned in again: a shallow copy of the module, made while it
            # was installed, holds it, and the copy's hooks go in it, helper-86's FINDING 1.)
            back = self.origin()
            return self._copy() if back is None or self.owned else _snapshot(back.items)
        snap = cached
        # (the size: a key taken out by OrderedDict's own methods, which bypass `_changed`)
        if snap is None or snap[0] != self._version or len(snap[1]) != len(self):
            snap = self._snapshot_now()
        # (most modules: no forward hook but the pinned ones)
        if not (origin or snap[2]) or not _differs(origin, snap):
            return snap[1]
        # (a bounded number of rounds where other threads keep changing the origin: the last
        # snapshot is as good as any taken during their changes)
        for _ in range(_ROUNDS):
            self._follow_origin(origin)
            if self._origin is None:  # (retired meanwhile, as above)
                return _snapshot(origin.items)
            snap = self._snapshot_now()
            if not _differs(origin, snap):
                break
        return snap[1]

    def _snapshot_now(self) -> _Snapshot:
        """The items as `_followed` compares them, copied now; `items` reuses them until a
        change (`_snap`). The other readers copy each time: a registration that iterates the
        dict makes the same steps whatever was read before it (tests/interruption_child.py
        counts them)."""
        version = self._version  # read before the copy: a change during it retags
        items = self._copy()
        pinned = self.pinned
        own = [item for item in items if item[0] not in pinned]
        snap = self._snap = (version, items, tuple(k for k, _ in own), tuple(h for _, h in own))
        return snap

    def _follow_origin(self, origin: OrderedDict[int, Any]) -> None:
        """The origin changed behind this dict: a native handle created before this dict was
        installed removed its hook there, or the code that assigned the origin to the module
        (a library replacing its hook dict, see `_follow`) or read it before the take-over
        added one to it directly, or put another hook under a key."""
        if self._origin is None:  # (retired meanwhile: its values forward to the origin's)
            return
        for key in [k for k, _ in self._copy() if k not in origin and k not in self.pinned]:
            OrderedDict.pop(self, key, None)  # (another thread may be removing it too)
            self.owned.discard(key)
        native = _snapshot(origin.items)
        added = [(k, v) for k, v in native if not OrderedDict.__contains__(self, k)]
        for key, value in added:
            OrderedDict.__setitem__(self, key, value)
        for key, value in native:  # (a hook put there under a key this dict holds: it runs)
            if OrderedDict.get(self, key, value) is not value:
                OrderedDict.__setitem__(self, key, value)
        order = [key for key, _ in native]
        if added or [k for k, _ in self._copy() if k not in self.pinned] != order:
            # in the origin's order (a library may move a key there too), then the pinned keys
            for key in order:
                try:
                    OrderedDict.move_to_end(self, key)
                except KeyError:  # (removed meanwhile by another thread)
                    continue
            self._repin()
        self._changed()

    def _copy(self) -> tuple[tuple[int, Any], ...]:
        return _snapshot(super().items)

    def copy(self) -> OrderedDict[int, Any]:  # type: ignore[override]
        """An OrderedDict of the same entries, as ``OrderedDict(self)`` (a library copying the
        module's hook dict gets a plain one, as without unihook), once the origin's changes
        are followed (a hook removed there by an older handle came back with a library's
        ``saved = d.copy(); d.clear(); d.update(saved)``: helper-164's FINDING 3)."""
        return OrderedDict(self._followed())

    __copy__ = copy

    def __or__(self, other: Any) -> Any:
        """A plain OrderedDict, as ``copy()`` (OrderedDict's builds ``type(self)(self)``)."""
        if not isinstance(other, dict):
            return NotImplemented
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        merged: OrderedDict[int, Any] = OrderedDict(other)
        merged.update(self.copy())
        return merged

    def __del__(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Dropped by its module while installed: a library assigned the module another
        # hook dict, the pinned keys follow the module there (see the module docstring); or
        # the module died. It lives on for the native handles registered through it (`_park`).
        # (getattr: a Ctrl-C landing in __init__ leaves one without its attributes;
        # `finalizing` bound now: at interpreter exit this module's globals may be gone first)
        if getattr(self, "_origin", None) is None or finalizing():
            return
        try:
            self._dropped()
        except KeyboardInterrupt:
            # a finalizer: the interpreter swallows a Ctrl-C landing here ("Exception
            # ignored"), and the hooks would stop following for good. `_follow` can run twice.
            self._dropped()
        if self.owner() is None:
            # (its forward hooks' flags stay, as the hooks do, until their handles go)
            _unflag_dead({k: v for k, v in self.flags.items() if k in self.pinned})
        _park(self)

    def _dropped(self) -> None:
        """`__del__`'s work: the module dropped this dict while installed."""
        owner = self.owner()
        access = self._access
        if owner is None or access is None:
            return  # (the module died)
        flags = self.flags
        pinned = [
            (key, OrderedDict.__getitem__(self, key), key in self.tail, flags.get(key, ()))
            for key in self.pinned
            if OrderedDict.__contains__(self, key)
        ]
        # unihook's own hooks: they follow where the framework itself dropped the dict (a
        # backend's global dispatchers too, first again: the call in flight that made the new
        # dict runs them), else they go as the framework's own do, and so do their flags (a
        # global dispatcher is left out then: its backend pins it again at the next call).
        follow = access.recreated(owner, self._attr)
        own = set(self.pinned) | (set() if follow else self.uncopied)
        others = [
            (key, value, flags.get(key, ()), key in self.uncopied)
            for key, value in self._copy()
            if key in self.owned and key not in own
        ]
        if pinned or others:
            _follow(owner, self._attr, access, pinned, set(self.owned), others, follow)

    def __reduce__(self) -> Any:
        """Pickled (torch.save of a whole module), the dict is a plain one with its forward
        hooks; backward hooks' per-call state does not pickle: say so plainly. Left out, as
        a deep copy leaves them: the dispatchers of removed backward hooks (kept for a call
        in flight) and of global ones (the loaded module gets those at its first call where
        they are registered; until 2026-12-04 they made every module a global backward hook
        had reached refuse to pickle: helper-124's FINDING 1), a backend's global forward
        dispatcher."""
        if self._serves_backward():
            raise self._pickling_error()
        left = self._left_out()
        # (retired, held by a shallow copy: the framework's dict's hooks, as its reads; its
        # own values forward to them by a weak reference, which does not pickle: TypeError
        # until 2026-12-06, helper-168's FINDING 4)
        source = self._followed() if self._origin is None else OrderedDict.items(self)
        items = [(k, v) for k, v in source if k not in left]
        # (an Access without the pair, a third party's: the ids stay as they come)
        access = self._access if hasattr(self._access, "ids_drawn") else None
        top = _top(access, (k for k, _ in items))
        notes = notes_state(self, (k for k, _ in items))  # (the prepended hooks' keys)
        if not getattr(self._access, "iterates_live", False):
            return (_loaded, (OrderedDict, access, top), notes or None, None, iter(items))
        owned = frozenset(k for k, _ in items if k in self.owned)
        guard = {"guard": self.guard, "owned": owned} if self.guard is not None else {}
        return (_loaded, (SnapshotDict, access, top), {**guard, **notes} or None, None, iter(items))

    def _serves_backward(self) -> bool:
        """Whether a dispatcher of live backward hooks of this module's own is pinned here."""
        left = self._left_out()
        return any(key not in left for key in self.pinned)

    def _site_error(self, cls: type[_E], expected: str, received: str, owner: Any = None) -> _E:
        """`cls` naming the module's backward hooks whose dispatcher is pinned here first."""
        from ._describe import Site

        state = getattr(self.get(self.pinned[0]), "__self__", None)
        backend = getattr(getattr(state, "autograd", None), "backend", "?")
        owner = self.owner() if owner is None else owner
        return Site.of("full_backward", backend, owner).error(cls, expected, received)

    def _copy_error(self, owner: Any) -> Exception:
        from .errors import HookTargetError

        # (until 2026-12-04 a TypeError about a thread-local, helper-124's FINDING 5; copying
        # the module first instead left the copy a hidden module's dict: helper-127's FINDING 1)
        return self._site_error(
            HookTargetError,  # a TypeError, as deepcopy's own for what it cannot copy
            "its module deep-copied with it, the module first (a deep copy of a shallow copy "
            "of the module, or by a __deepcopy__ that copies __dict__ before the module is in "
            "the memo, cannot give its backward hooks a module)",
            "a deep copy reaching the module's hook dict before the module",
            owner,
        )

    def _left_out(self) -> set[int]:
        """The keys a pickle leaves out (`__reduce__`)."""
        left = set(self.uncopied)
        for key in self.pinned:
            state = getattr(self.get(key), "__self__", None)
            if getattr(state, "removed", False) or getattr(state, "is_global", False):
                left.add(key)
        return left

    def _pickling_error(self) -> Exception:
        from ._describe import Site
        from .errors import HookTargetError

        owner = None if self._owner is None else self._owner()
        state = getattr(self.get(self.pinned[0]), "__self__", None)
        backend = getattr(getattr(state, "autograd", None), "backend", "?")
        kind = "module_full_backward" if getattr(state, "is_global", False) else "full_backward"
        return Site.of(kind, backend, owner).error(
            HookTargetError,  # a TypeError, as pickle's own for what it cannot pickle
            "a module without unihook backward hooks to pickle (remove them first, or use "
            "copy.deepcopy, which keeps them)",
            "a module with backward hooks",
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> OrderedDict[int, Any]:
        """A copied module keeps its hooks, as torch's copy does, its backward hooks too: the
        copy gets its own backward state (`ModuleBackward.copied`) behind the copied dispatchers."""
        from copy import deepcopy

        if not self.owned:
            # retired, a shallow copy's (`_retire`), or installed still where the copy
            # outlived its original (`unpin_orphaned`): what the framework's dict holds, as
            # its reads (until 2026-12-07 TypeError once the module it was installed on died:
            # helper-174's FINDING 4, helper-177's FINDING 1)
            return self._forward_hooks_copy(memo)
        owner = None if self._owner is None else self._owner()
        if id(owner) not in memo and self._serves_backward():
            if not memo:
                # the dict alone, the root of the copy (`other._forward_hooks =
                # copy.deepcopy(m._forward_hooks)`, a hook transfer): what torch's dict holds,
                # its forward hooks; torch's backward hooks live in other dicts (until
                # 2026-12-04 refused: helper-127's FINDING 4)
                return self._forward_hooks_copy(memo)
            # the dict reached before its module: its backward dispatchers serve the
            # module's state, which a copy can only have with the module's copy
            raise self._copy_error(owner)
        copied = memo.get(id(owner), owner)
        new = HookDict()
        memo[id(self)] = new
        origin: OrderedDict[int, Any] = OrderedDict()
        new._install(origin, copied, self._attr, self._access)
        for key, value in self.items():
            if key in self.uncopied:  # (a backend's global forward dispatcher)
                self._leave_flags(key, owner, memo)
                continue
            state = getattr(value, "__self__", None) if key in self.pinned else None
            if getattr(state, "is_global", False) or getattr(state, "removed", False):
                # the global dispatchers: the copy gets them where it needs them; removed
                # ones only wait for this module's calls in flight
                _leave_out(state, owner, memo)
                self._leave_flags(key, owner, memo)
                continue
            if state is not None and id(state) not in memo and copied is not owner:
                memo[id(state)] = state.copied(owner, copied, memo)
            copied_value = deepcopy(value, memo)
            if state is not None and getattr(copied_value, "__self__", None) is state:
                # copied before as another module's hook, one a library carried there (its
                # state kept: `ModuleBackward.__deepcopy__`): the copy's own is bound to the
                # copy's state (until 2026-12-06 the original's: BackendStateError in the
                # copy's backward, helper-167's FINDING 2)
                copied_value = deepcopy(value, {id(state): memo[id(state)]})
            value = copied_value
            OrderedDict.__setitem__(new, key, value)
            if key not in self.pinned:
                origin[key] = value
        carry_notes(self, origin)
        new.pinned = [key for key in self.pinned if key in new]
        new.tail = {key for key in self.tail if key in new}
        new.owned = {key for key in self.owned if key in new}
        new.flags = {key: attrs for key, attrs in self.flags.items() if key in new}
        # the backend's check of the calling context goes with the hooks (paddle: a
        # to_static(full_graph=True) build of the copy is refused as the original's;
        # until 2026-12-04 the copy's hooks ran in the build: helper-123's FINDING 4)
        new.guard = self.guard
        if not new.owned:  # (only removed or global dispatchers were here)
            memo[id(self)] = origin
            return origin
        if copied is not owner and self._access is not None:
            # the copy's flag tables (the copies its owner gets: memo) are watched as these
            # (no lock: the copy is not another thread's yet, and may not hold them yet)
            for key, attrs in new.flags.items():
                for attr in attrs:
                    table = deepcopy(self._access.get(owner, attr), memo)
                    _watch(copied, attr, table, key, self._attr, self._access)
        return new

    def _forward_hooks_copy(self, memo: dict[int, Any]) -> OrderedDict[int, Any]:
        """A plain dict of deep copies of the forward hooks here, in their order, without
        unihook's dispatchers: what the framework's own dict would hold."""
        from copy import deepcopy

        new: OrderedDict[int, Any] = OrderedDict()
        memo[id(self)] = new
        for key, value in self.items():
            if key not in self.pinned and key not in self.uncopied:
                new[key] = deepcopy(value, memo)
        carry_notes(self, new)
        return new

    def _leave_flags(self, key: int, owner: Any, memo: dict[int, Any]) -> None:
        """Take `key`, left out of a deep copy of `owner`, out of the copy's flag tables."""
        from copy import deepcopy

        if owner is None or self._access is None:
            return
        for attr in self.flags.get(key, ()):
            deepcopy(self._access.get(owner, attr), memo).pop(key, None)


def _leave_out(state: Any, owner: Any, memo: dict[int, Any]) -> None:
    """Dispatchers a copy of `owner` goes without: nor their always-called flag."""
    from copy import deepcopy

    pinned = getattr(state, "dispatchers", None)
    if isinstance(pinned, Pinned) and owner is not None:
        flags = pinned.access.get(owner, pinned.always)
        deepcopy(flags, memo).pop(pinned.post[1], None)  # (the copy the module's copy gets)


# a HookDict's items (`HookDict._snapshot_now`): its version, the items, and apart from the
# pinned keys, the keys and the hooks (what the origin holds when in step)
_Snapshot = tuple[int, tuple[tuple[int, Any], ...], tuple[int, ...], tuple[Any, ...]]
_ROUNDS = 4  # follows of the origin per read at most (`HookDict._followed`)
_ABSENT = object()  # a key's value where a dict has none


def _differs(origin: OrderedDict[int, Any], snap: _Snapshot) -> bool:
    """Whether `origin` holds other keys or hooks (by identity) than `snap` beside them."""
    try:
        return tuple(origin) != snap[2] or any(map(is_not, origin.values(), snap[3]))
    except RuntimeError:  # (changed meanwhile by another thread)
        return True


class SetView(tuple[Any, ...], AbstractSet[Any]):
    """A snapshot of a hook dict's keys or items: a tuple (the framework iterates it while
    hooks change the dict), with the set operations and comparisons of the dict view it
    stands for (``d.keys() - {k}``, ``d.keys() <= other``, ``isdisjoint``; a TypeError or
    AttributeError until 2026-12-07, helper-164's FINDING 6). Equal to a set (or a dict
    view) of the same members, as a dict view (helper-182's FINDING 1), and to a tuple of the
    same items in the same order, as the tuple it was; hashed as that tuple."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AbstractSet):
            return AbstractSet.__eq__(self, other)
        return tuple.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __le__(self, other: Any) -> bool:  # type: ignore[override]
        return AbstractSet.__le__(self, other)

    def __lt__(self, other: Any) -> bool:  # type: ignore[override]
        return AbstractSet.__lt__(self, other)

    def __ge__(self, other: Any) -> bool:  # type: ignore[override]
        return AbstractSet.__ge__(self, other)

    def __gt__(self, other: Any) -> bool:  # type: ignore[override]
        return AbstractSet.__gt__(self, other)

    @classmethod
    def _from_iterable(cls, iterable: Iterable[Any]) -> set[Any]:
        return set(iterable)  # (what a dict view's operations give)


def _snapshot(items: Callable[[], Iterable[tuple[int, Any]]]) -> SetView:
    # A finalizer the collector runs during the copy (it allocates), or a thread that takes
    # over meanwhile, may change the dict: "mutated during iteration", copy again.
    while True:
        try:
            return SetView(items())
        except RuntimeError:
            continue


# id(origin) -> (weakref to the origin, its retired HookDicts): they live as long as the
# origin, without keeping it alive (`_keep`)
_retired: dict[int, tuple[weakref.ref[Any], list[HookDict]]] = {}
# key -> the HookDicts `_pin` put it in, weakly: its removal reaches each (`_drop_elsewhere`),
# also one its module gave up for a copy a library made while a shallow copy held it still
# (until 2026-12-07 the shallow copy kept the dispatcher, in a HookDict, for good:
# helper-186's seed 157)
_pinned_in: dict[int, list[weakref.ref[HookDict]]] = {}
_lock = RegistryLock()  # registrations from several threads
_versions = count()  # HookDict versions


class _Flagged:
    """A module's flag table (a framework's keys of the hooks it calls with kwargs, or
    always) that holds keys of unihook's: dropped by the module (a library assigned another,
    or MindSpore's lazy creation raced a registration), the keys follow the module into its
    current table (`_table_dropped`), else the framework calls the hook with the wrong
    arguments (a TypeError) or not on an exception."""

    __slots__ = ("ref", "owner", "sharers", "attr", "access", "keys")

    def __init__(self, table: Any, owner: Any, attr: str, access: Access) -> None:
        ident = id(table)
        self.ref = weakref.ref(table, lambda ref: _table_dropped(ident, ref))
        # (a table that outlives its module, shared by a shallow copy: `_unflag_dead`)
        self.owner = weakref.ref(owner, lambda ref: _outliving.add(ident))
        # the other modules that flagged keys here (shallow copies), as `owner`: a key of
        # one that died stayed for good while `owner` lived (helper-176's seed 4)
        self.sharers: list[weakref.ref[Any]] = []
        self.attr = attr
        self.access = access
        self.keys: dict[int, str] = {}  # key -> the owner's hook dict (attribute) it is in

    def share(self, owner: Any) -> None:
        """`owner`, which shares the table, flags a key in it too."""
        if self.owner() is owner or any(ref() is owner for ref in self.sharers):
            return
        ident = id(self.ref())
        self.sharers = [ref for ref in self.sharers if ref() is not None]
        self.sharers.append(weakref.ref(owner, lambda ref: _outliving.add(ident)))

    def all_alive(self) -> bool:
        return self.owner() is not None and all(ref() is not None for ref in self.sharers)


_flagged: dict[int, _Flagged] = {}  # id(table) -> its watch, while the table lives
_outliving: set[int] = set()  # ids of watched tables whose module died (some may be gone)


def _flag(owner: Any, attr: str, key: int, hooks: str, access: Access) -> None:
    """Put `key`, a hook in `owner`'s hook dict `hooks`, in its flag table `attr`, watched;
    under `_lock`."""
    table = access.get(owner, attr)
    table[key] = True
    _watch(owner, attr, table, key, hooks, access)


def _watch(owner: Any, attr: str, table: Any, key: int, hooks: str, access: Access) -> None:
    """Watch `key` (in `hooks`) in `table`, `owner`'s flag table `attr`."""
    watch = _flagged.get(id(table))
    if watch is not None and watch.ref() is table:
        watch.share(owner)
        watch.keys[key] = hooks
        return
    try:
        watch = _Flagged(table, owner, attr, access)
    except TypeError:  # (a plain dict a library assigned cannot be referred to weakly)
        return
    watch.keys[key] = hooks
    _flagged[id(table)] = watch  # (last: a run a Ctrl-C cut short leaves no empty watch)


def _unflag(owner: Any, attr: str, key: int, access: Access) -> None:
    """Take `key` out of `owner`'s flag table `attr`, unwatched; under `_lock`."""
    table = access.get(owner, attr)
    table.pop(key, None)
    watch = _flagged.get(id(table))
    if watch is not None and watch.ref() is table:
        watch.keys.pop(key, None)
        if not watch.keys:  # (no residue: the table is the framework's alone again)
            del _flagged[id(table)]
            _outliving.discard(id(table))


def _unflag_dead(flags: dict[int, tuple[str, ...]]) -> None:
    """Take the keys `flags` of a HookDict whose module died out of the flag tables that
    outlive it: a shallow copy of the module shares them (the framework calls a hook of a
    flagged key there always, which none is: until 2026-12-07 a flag stayed for good)."""
    for ident in list(_outliving):
        watch = _flagged.get(ident)
        if watch is None or watch.all_alive():  # (gone, or an id reused since)
            _outliving.discard(ident)
            continue
        if not flags.keys() & watch.keys.keys():
            continue
        table = watch.ref()
        for key in flags.keys() & watch.keys.keys():
            watch.keys.pop(key, None)
            if table is not None:
                table.pop(key, None)
        if not watch.keys and _flagged.get(ident) is watch:
            del _flagged[ident]
            _outliving.discard(ident)


def _table_dropped(ident: int, ref: weakref.ref[Any]) -> None:
    """The flag table a `_Flagged` watched is gone: its keys go in the module's current one."""
    found: list[_Flagged] = []
    try:
        _give_back(ident, ref, found)
    except KeyboardInterrupt:
        # A weakref callback: the interpreter swallows a Ctrl-C landing here ("Exception
        # ignored"), and the flags would be lost for good (the framework then calls the hooks
        # without them). Each step can run twice.
        _give_back(ident, ref, found)


def _give_back(ident: int, ref: weakref.ref[Any], found: list[_Flagged]) -> None:
    """`_table_dropped`'s work; the watch goes in `found` first (a run cut short took it out
    of `_flagged` already)."""
    if not found:
        watch = _flagged.get(ident)
        if watch is None or watch.ref is not ref:
            return  # (a later table under the same id)
        found.append(watch)
    watch = found[0]
    if _flagged.get(ident) is watch:
        del _flagged[ident]
        _outliving.discard(ident)
    owner = watch.owner()
    if owner is None or not watch.keys or sys.is_finalizing():
        return  # (the module died, or its flags were all removed)
    try:
        # At once, without the lock: its holder (another thread, or this one inside a
        # registration) may let a call run the key meanwhile, which the framework would call
        # without its flag. A removal unflags after it takes the key: checked again after.
        table = watch.access.get(owner, watch.attr)
        for key, attr in list(watch.keys.items()):
            if _owns(owner, attr, key, watch.access):
                table[key] = True
                if not _owns(owner, attr, key, watch.access):
                    table.pop(key, None)
    except (AttributeError, KeyError):
        return  # (deleted: the framework's own call fails on the module then)
    _reflag(owner, watch)


def _owns(owner: Any, attr: str, key: int, access: Access) -> bool:
    """Whether `key` is unihook's hook in `owner`'s hook dict `attr`."""
    hooks = access.get(owner, attr)
    return isinstance(hooks, HookDict) and key in hooks.owned


def _reflag(owner: Any, watch: _Flagged) -> None:
    """`_table_dropped`'s keys, watched in the module's current table; under `_lock`."""
    if _lock.deferred(lambda: _reflag(owner, watch)):
        return
    with _lock, _lock.mutex:
        for key, attr in watch.keys.items():
            try:
                # (a removal that ran meanwhile took the flag out of the new table already)
                if _owns(owner, attr, key, watch.access):
                    _flag(owner, watch.attr, key, attr, watch.access)
            except (AttributeError, KeyError):
                return  # (deleted: the framework's own call fails on the module then)


def new_key(new_id: Callable[[], int], access: Access, owner: Any, *attrs: str) -> int:
    """An id from `new_id` (the backend's draw from the framework's counter) that none of
    `owner`'s hook dicts `attrs` holds. A module loaded from another process's pickle brings
    that process's ids, in a plain dict where they are its native hooks' (`_loaded` sees
    only unihook's), and this process's counter draws them again: registered under one, a
    hook replaced the loaded one silently (torch's and paddle's own registrations do). The
    counter moves past the dicts' keys (`Access.reserve_ids`), else the draws go on."""
    key = new_id()
    tables = [table for table in (_table(access, owner, attr) for attr in attrs) if table]
    if not any(key in table for table in tables):
        return key
    reserve = getattr(access, "reserve_ids", None)
    if reserve is not None:
        reserve(max(k for table in tables for k in list(table) if type(k) is int))
    while any(key in table for table in tables):
        key = new_id()
    return key


def _table(access: Access, owner: Any, attr: str) -> Any:
    try:
        return access.get(owner, attr)
    except (AttributeError, KeyError):  # (not made yet: nothing to collide with)
        return None


def pin(
    owner: Any,
    attr: str,
    key: int,
    hook: Any,
    access: Access,
    *,
    last: bool,
    prepend: bool,
    tail: bool = False,
    flags: tuple[str, ...] = (),
    copied: bool = True,
) -> None:
    """Insert unihook's hook `key` into `owner`'s hook dict `attr`: pinned last (`last`; with
    `tail`, after the other pinned ones, whenever they come), or first (`prepend`), or before
    the pinned ones. `flags`: the owner's flag tables (attributes) to put `key` in, before
    it (the framework reads them live); not `copied`: a deep copy of the owner goes without
    it (and its flags), a backend's global dispatcher that the copy gets at its first call."""
    if _lock.deferred(
        lambda: pin(
            owner,
            attr,
            key,
            hook,
            access,
            last=last,
            prepend=prepend,
            tail=tail,
            flags=flags,
            copied=copied,
        )
    ):
        return
    with _lock, _lock.mutex:
        for table in flags:
            _flag(owner, table, key, attr, access)
        hooks = _pin(owner, attr, key, hook, access, last=last, prepend=prepend, tail=tail)
        if flags:
            hooks.flags[key] = flags
            # Again: a flag table dropped since (MindSpore's lazy creation on another thread)
            # lost the flag, and its watch gives it back only once this thread lets go.
            for table in flags:
                if key not in access.get(owner, table):
                    _flag(owner, table, key, attr, access)
        if not copied:
            hooks.uncopied.add(key)


def _pin(
    owner: Any,
    attr: str,
    key: int,
    hook: Any,
    access: Access,
    *,
    last: bool,
    prepend: bool,
    tail: bool,
) -> HookDict:
    """`pin`, under `_lock`. Returns the dict it went in."""
    current = access.get(owner, attr)
    hooks = current if isinstance(current, HookDict) else None
    if type(current) is _Retired:
        hooks = _shared_again(current, owner, attr, access)
    if hooks is None:
        if not type(current).__weakrefoffset__:
            # a plain dict a library assigned (`m._forward_hooks = {}`): native handles need
            # a weak reference to their dict, the origin is an OrderedDict of its entries
            current = OrderedDict(current)
        # The one retired over it (`_retire`): a shallow copy may hold it still, and shares it
        # again, as the framework's copy and module share the one dict (the copy's calls run
        # the hooks pinned now, helper-169's FINDING 3).
        kept = _kept(current)
        hooks = HookDict() if kept is None else kept
        sharers, hooks._sharers = hooks._sharers, []
        hooks._install(current, owner, attr, access)
        access.put(owner, attr, hooks)
        # The other modules it was taken from, which hold the framework's dict still: it is
        # theirs too again, as the dict the framework's copy and module share (a backward
        # hook registered on one of them runs for both, as torch's does on a copy made while
        # the module had one).
        for ref in sharers:
            other = ref()
            if other is not None and other is not owner and access.get(other, attr) is current:
                access.put(other, attr, hooks)
        # (out of `_retired` once installed: it holds its origin strongly. Taken out first, a
        # Ctrl-C before the swap would drop it, and with it the removals of the native hooks
        # registered through it; left in, the module's death would not free them.)
        _unkeep(current, hooks)
    hooks.owned.add(key)
    if key in hooks.pinned:  # (a run a Ctrl-C cut short before the key went in)
        hooks.pinned.remove(key)
    if tail:
        hooks.tail.add(key)
        hooks.pinned.append(key)
    elif last:
        first_tail = [i for i, k in enumerate(hooks.pinned) if k in hooks.tail]
        hooks.pinned.insert(first_tail[0] if first_tail else len(hooks.pinned), key)
    hooks[key] = hook
    places = _pinned_in.setdefault(key, [])
    if not any(ref() is hooks for ref in places):
        places.append(weakref.ref(hooks, partial(_forget_place, key)))
    if key in hooks.pinned and _dispatcher(hook):
        for other, value in hooks._copy():
            if value is hook and other != key:  # (a copy a library carried here: `_Carried`)
                hooks[other] = _Carried()
    if prepend:
        hooks.move_to_end(key, last=False)
    return hooks


def _shared_again(retired: _Retired, owner: Any, attr: str, access: Access) -> HookDict:
    """The dict to pin `owner`'s hook in, where `owner` holds a retired HookDict: a shallow
    copy made while unihook held its original's dict, which the original gave back since
    (torch's copy shares the one dict with its original). Installed again over the
    framework's dict, for the original if it holds that dict still, and shared by both again
    (until 2026-12-06 the copy's hook went into the retired dict's own items: the copy no
    longer ran the native hooks registered on the original since, helper-169's FINDING 3);
    else for `owner`. Its own items where the framework's dict died."""
    origin = retired.origin()
    if origin is None:
        return retired
    first = retired.owner()
    holder = first if first is not None and access.get(first, attr) is origin else owner
    retired._install(origin, holder, attr, access)
    if holder is not owner:
        access.put(holder, attr, retired)
        retired._sharer = weakref.ref(owner)
    _unkeep(origin, retired)  # (installed: see `_pin`)
    return retired


def _follow(
    owner: Any,
    attr: str,
    access: Access,
    pinned: list[tuple[int, Any, bool, tuple[str, ...]]],
    owned: set[int],
    others: list[tuple[int, Any, tuple[str, ...], bool]],
    follow: bool,
) -> None:
    """`owner` dropped its HookDict `attr` for another dict (a library assigned one): pin
    there the keys `pinned` (key, hook, tail, flag tables) of the dropped one, in order, and
    the `others` (key, hook, flag tables, uncopied: unihook's own hooks, a backend's global
    dispatcher first) if `follow` (else their flags go, unless the new dict is a copy holding
    them), and keep as unihook's the other `owned` keys a copy of the dropped dict brought
    along."""
    if _lock.deferred(lambda: _follow(owner, attr, access, pinned, owned, others, follow)):
        return
    with _lock, _lock.mutex:
        try:
            current = access.get(owner, attr)
        except (AttributeError, KeyError):
            return  # (deleted: the framework's own call fails on the module then)
        # (a follow that waited for the lock: dispatchers retired meanwhile stay out)
        pinned = [entry for entry in pinned if not _retired_dispatcher(entry[1])]
        if isinstance(current, HookDict) and current._origin is not None:
            # (put back by whoever dropped it, or a deep copy of it; or pinned by a run of this
            # a Ctrl-C cut short: in `pinned` but not in the dict yet)
            pinned = [
                entry
                for entry in pinned
                if not (entry[0] in current.pinned and OrderedDict.__contains__(current, entry[0]))
            ]
        else:
            for key, *_ in pinned:  # a copy of the dropped dict: they go back pinned
                current.pop(key, None)
        for key, hook, flags, uncopied in others:
            if key in current:  # (a copy of the dropped dict: it stays, with its flags)
                continue
            if not follow:
                for table in flags:
                    _unflag(owner, table, key, access)
                continue
            for table in flags:
                _flag(owner, table, key, attr, access)
            current = _pin(owner, attr, key, hook, access, last=False, prepend=uncopied, tail=False)
            current.flags[key] = flags
            if uncopied:
                current.uncopied.add(key)
        for key, hook, tail, flags in pinned:
            for table in flags:
                _flag(owner, table, key, attr, access)
            current = _pin(owner, attr, key, hook, access, last=True, prepend=False, tail=tail)
            current.flags[key] = flags
        if isinstance(current, HookDict):
            current.owned.update(k for k in owned if OrderedDict.__contains__(current, k))


def _retired_dispatcher(hook: Any) -> bool:
    """Whether `hook` is a dispatcher whose backward hooks are all removed and whose calls
    are over (`ModuleBackward.retire` took it out)."""
    state = _self_of(hook)
    return bool(getattr(state, "removed", False)) and getattr(state, "dispatchers", 0) is None


def pinned_key(owner: Any, attr: str, hook: Any, access: Access) -> int | None:
    """The key of unihook's `hook` in `owner`'s hook dict `attr`, if it is there: pinned in
    a dict that `owner`, a shallow copy (``copy.copy``), shares with another module."""
    hooks = access.get(owner, attr)
    if not isinstance(hooks, HookDict):
        return None
    for key, value in hooks._copy():
        if value is hook and key in hooks.owned:
            return key
    return None


def unpin(owner: Any, attr: str, key: int, access: Access, *, flags: tuple[str, ...] = ()) -> None:
    """Remove unihook's hook `key`, then its flags in the tables `flags`; the last one out
    puts the origin back. Idempotent: it undoes a `pin` cut short (a Ctrl-C) and finishes an
    `unpin` cut short."""
    # (the flags go with the key, deferred with it: a flag gone first left the key to run
    # meanwhile as a hook without kwargs, a TypeError in the framework's call)
    if _lock.deferred(lambda: unpin(owner, attr, key, access, flags=flags)):
        return
    with _lock, _lock.mutex:
        _drop_elsewhere(key, _unpin(owner, attr, key, access))
        for table in flags:
            _unflag(owner, table, key, access)


def dicts_of(
    owner: Any, attr: str, flags: tuple[str, ...], access: Access
) -> tuple[weakref.ref[Any] | None, ...]:
    """Weak references to `owner`'s hook dict `attr` and flag tables `flags` (None for one
    that cannot be referred to weakly), as a hook of unihook's went in: `unpin_orphaned`."""
    return tuple(_weak(_table(access, owner, name)) for name in (attr, *flags))


def _weak(value: Any) -> weakref.ref[Any] | None:
    try:
        return weakref.ref(value)
    except TypeError:  # (a plain dict a library assigned, or none)
        return None


def unpin_orphaned(dicts: tuple[weakref.ref[Any] | None, ...], key: int) -> None:
    """Remove unihook's hook `key` from the dicts `dicts_of` took, once its module died: a
    shallow copy of the module shares them, as the framework's own handle, which refers to
    the dicts, not to the module, reaches them (until 2026-12-07 the removal did nothing and
    the copy ran the hook for good: helper-174's FINDING 2). Idempotent."""
    if _lock.deferred(lambda: unpin_orphaned(dicts, key)):
        return
    with _lock, _lock.mutex:
        hooks, *tables = [None if ref is None else ref() for ref in dicts]
        dropped = _ABSENT
        if isinstance(hooks, HookDict):
            dropped = hooks.drop(key)
            # Installed still, its last key gone: retired, the framework's dict back to the
            # modules holding it, a shallow copy (until 2026-12-07 it stayed, a HookDict for
            # good: helper-176's FINDING 1; retired, the copy kept it, which held the
            # framework's dict weakly, and ran none of its hooks: its FINDING 2).
            _retire_emptied(hooks)
        elif hooks is not None:
            dropped = hooks.pop(key, _ABSENT)
        _drop_elsewhere(key, dropped)
        for table in tables:
            if table is None:
                continue
            table.pop(key, None)
            watch = _flagged.get(id(table))
            if watch is not None and watch.ref() is table:
                watch.keys.pop(key, None)
                if not watch.keys:
                    del _flagged[id(table)]
                    _outliving.discard(id(table))


def _retire_emptied(hooks: HookDict) -> None:
    """Retire `hooks` if installed and no key of unihook's is left in it (the module's own is
    retired by `_unpin`): the framework's dict back to the modules holding it. (Its caller
    holds it in one variable.)"""
    access = hooks._access
    if not hooks.owned and hooks._origin is not None and access is not None:
        _retire(hooks, hooks.owner(), hooks._attr, access, callers=2)


def _drop_elsewhere(key: int, hook: Any) -> None:
    """`key` out of every HookDict `_pin` put it in that holds `hook` under it still (the one
    just taken out: a deep copy's dicts hold the copy's own under the same key, which stay;
    `_pinned_in`)."""
    places = _pinned_in.get(key, [])
    for ref in list(places) if hook is not _ABSENT else ():
        hooks = ref()
        if hooks is not None and OrderedDict.get(hooks, key, _ABSENT) is hook:
            hooks.drop(key)
            _retire_emptied(hooks)
    # (those that hold the key no more leave: a hook registered and removed in each step
    # must not grow it)
    places[:] = [ref for ref in places if _holds(ref(), key)]
    if not places:
        _pinned_in.pop(key, None)


def _holds(hooks: HookDict | None, key: int) -> bool:
    return hooks is not None and OrderedDict.__contains__(hooks, key)


def _forget_place(key: int, ref: weakref.ref[HookDict]) -> None:
    """A HookDict `key` was pinned in died: out of `_pinned_in`."""
    places = _pinned_in.get(key)
    if places is None:
        return
    try:
        places.remove(ref)
    except ValueError:  # (another thread's removal took it)
        return
    if not places:
        _pinned_in.pop(key, None)


def _unpin(owner: Any, attr: str, key: int, access: Access) -> Any:
    """`unpin`'s key, under `_lock`; the hook taken out (`_ABSENT`: none)."""
    hooks = access.get(owner, attr)
    if not isinstance(hooks, HookDict):
        # a dict a library assigned that unihook's keys did not follow into (it kept the
        # HookDict it replaced, or that one held no dispatcher): a copy holds the key too
        dropped = hooks.pop(key, _ABSENT) if isinstance(hooks, dict) else _ABSENT
        held = _kept(hooks, installed=True)
        if held is not None:
            # a `pin` cut short between installing a retired HookDict and the swap: it would
            # hold the origin, and the hooks, for ever
            _retire(held, owner, attr, access)
        return dropped
    dropped = hooks.drop(key)  # (and where `pin` was cut short before the key went in: none)
    if not hooks.owned:
        _retire(hooks, owner, attr, access)
    return dropped


def _retire(hooks: HookDict, owner: Any, attr: str, access: Access, callers: int = 1) -> None:
    """unihook's last key left `hooks`, the module's hook dict: the origin goes back in its
    place, holding every native hook in order (mirrored), and `hooks` lives on in `_retired`,
    forwarding its handles' removals. The swap comes last, each step before it leaves a dict
    that works: a run cut short (a Ctrl-C) is finished by the next. `callers`: the variables
    of the functions calling this one that hold `hooks` (`_unpin`'s one)."""
    origin = _to_retired(hooks)
    if origin is None:
        return
    _keep(origin, hooks)
    # The framework's dict goes back to `owner`, and to the other module known to hold this
    # one (its owner, or the copy `_shared_again` shared it with): torch's copy and original
    # share that one dict (until 2026-12-06 the other kept the retired dict, which holds the
    # framework's weakly, and ran none of its native hooks once `owner` died or a library
    # gave it another dict: helper-174's FINDING 5).
    sharer = getattr(hooks, "_sharer", None)
    known = [owner, hooks.owner(), None if sharer is None else sharer()]
    shared = _hand_back(hooks, origin, attr, access, known)
    # And any other module holding it: a shallow copy made while it was installed (until
    # 2026-12-07 it kept the retired dict, and ran none of its native hooks once `owner`
    # died or a library gave it another dict: helper-174's FINDINGS 3 and 4). Looked for
    # only where the reference count tells one holds it (a search of every object: ~15 ms
    # beside torch); what else holds it (a library's variable) keeps the retired dict.
    if _references(hooks) > callers + _RETIRED_SLOT:
        found = _modules_holding(hooks, attr, access)
        shared += _hand_back(hooks, origin, attr, access, found)
    # (installed again for one of them, it is theirs again: `_pin`)
    hooks._sharers = [weakref.ref(holder) for holder in shared] if len(shared) > 1 else []


def _hand_back(
    hooks: HookDict, origin: OrderedDict[int, Any], attr: str, access: Access, holders: list[Any]
) -> list[Any]:
    """Those of `holders` whose attribute `attr` is `hooks`, given `origin` in its place."""
    given = []
    for holder in holders:
        if holder is not None and access.get(holder, attr) is hooks:
            access.put(holder, attr, origin)
            given.append(holder)
    return given


def _modules_holding(hooks: HookDict, attr: str, access: Access) -> list[Any]:
    """The objects whose attribute `attr` (`access`) is `hooks`."""
    found = []
    for table in gc.get_referrers(hooks):
        if not isinstance(table, dict):
            continue
        for holder in gc.get_referrers(table):
            try:
                if vars(holder) is table and access.get(holder, attr) is hooks:
                    found.append(holder)
            except Exception:  # noqa: BLE001 - not a module, or one without that dict
                continue
    return found


def _references(value: object) -> int:
    """`value`'s references, less this call's and those of the caller's one variable."""
    return sys.getrefcount(value) - _CALL


def _call_references() -> int:
    """`_CALL`: what `_references` counts of an object one variable alone holds."""
    probe = object()
    return _references(probe)


_CALL = 0
_CALL = _call_references()
# `_retired`'s reference to a HookDict it keeps (`_retire` counts it, and its callers')
_RETIRED_SLOT = 1


def _to_retired(hooks: HookDict) -> OrderedDict[int, Any] | None:
    """Make `hooks` a `_Retired`; returns its origin (None if dead)."""
    origin = hooks.origin()
    ref = hooks._origin_ref
    if origin is None or ref is None:
        return None
    # Retired, it only forwards its handles' removals (by key): holding the hooks from the
    # global table would keep them, and the module they often refer to, alive (helper-162's
    # FINDING 2). A call on another thread that read the dict just before may still iterate
    # it: each value runs the origin's hook of that key, if there is one still.
    for k, _ in hooks._copy():
        # (a key removed since the copy, by another thread or a finalizer the collector ran
        # here, is left out: a KeyError failed a removal, helper-158's FINDING 6)
        value = OrderedDict.get(hooks, k, _Forwarding)
        if value is not _Forwarding and not isinstance(value, _Forwarding):
            OrderedDict.__setitem__(hooks, k, _Forwarding(ref, k))
    hooks._snap = None
    hooks._origin = None
    hooks.__class__ = _Retired
    hooks._changed()
    return origin


def _keep(origin: OrderedDict[int, Any], hooks: HookDict) -> None:
    """Keep `hooks`, retired, in `_retired` as long as `origin` lives, for its handles (a
    weak reference each), without keeping `origin` alive. Several per origin: two modules'
    HookDicts over one dict a shallow copy shares (until 2026-12-07 one, the other dropped:
    its handles' removals did nothing and both modules ran a removed hook for good,
    helper-174's FINDING 1)."""
    ident = id(origin)
    entry = _retired.get(ident)
    if entry is None or entry[0]() is not origin:

        def forget(ref: weakref.ref[Any], retired: dict[int, Any] = _retired) -> None:
            # (`retired` bound now: at interpreter exit the module's globals are gone first)
            if retired.get(ident, (None,))[0] is ref:
                del retired[ident]

        entry = _retired[ident] = (weakref.ref(origin, forget), [])
    # (by identity: a dict's == compares its items; the ones parked whose handles all went
    # go, else they would pile up where a module is dropped over a dict a copy holds)
    entry[1][:] = [
        h for h in entry[1] if h is not hooks and (not h._finalized or weakref.getweakrefcount(h))
    ] + [hooks]


def _kept(origin: Any, installed: bool = False) -> HookDict | None:
    """The latest retired HookDict kept over `origin` that may be installed again (not
    parked: `_park`), None if none; `installed`: one installed over it since (a `pin` cut
    short before the swap)."""
    entry = _retired.get(id(origin))
    if entry is None or entry[0]() is not origin:
        return None
    for hooks in reversed(entry[1]):
        if not hooks._finalized and (hooks._origin is origin if installed else True):
            return hooks
    return None


def _unkeep(origin: Any, hooks: HookDict) -> None:
    """`hooks` is installed again: out of `_retired` (it holds its origin strongly)."""
    entry = _retired.get(id(origin))
    if entry is None or entry[0]() is not origin:
        return
    entry[1][:] = [h for h in entry[1] if h is not hooks]
    if not entry[1] and _retired.get(id(origin)) is entry:
        del _retired[id(origin)]


def _park(hooks: HookDict) -> None:
    """`hooks`, installed, is dying: its module died, or a library gave the module another
    dict. The native handles registered through it refer to it weakly; it lives on retired
    in `_retired` as long as the framework's dict, forwarding their removals there, where
    another module (a shallow copy) may run them (until 2026-12-07 their removal did nothing
    once the module whose dict unihook held died, and the copy ran the hook for good,
    helper-174's FINDING 2; helper-165's FINDING 8 where a library kept the replaced dict).
    Not where the collector found it in a reference cycle: it cleared the handles' weak
    references first."""
    origin = _to_retired(hooks)  # (its own state: no other holds it)
    hooks._finalized = True
    hooks.owned.clear()  # (no module's dict: its reads answer from the origin's)
    hooks.pinned.clear()
    hooks.tail.clear()
    if origin is not None and weakref.getweakrefcount(hooks):
        _keep_parked(origin, hooks)


def _keep_parked(origin: OrderedDict[int, Any], hooks: HookDict) -> None:
    """`_keep`, under `_lock` (a finalizer runs on any thread, also inside a registration
    on this one: then once it ends)."""
    if _lock.deferred(lambda: _keep_parked(origin, hooks)):
        return
    with _lock, _lock.mutex:
        _keep(origin, hooks)


class _Retired(HookDict):
    """A retired HookDict (`_retire`): one a shallow copy of the module, made while unihook
    held it, shares still, or a library kept. Its size, ``in`` and lookups answer from the
    framework's dict, as its reads do (`HookDict._followed`): the framework's call tests a
    dict's truth before it runs any hook, and a shallow copy never ran the native hooks
    registered on the module after unihook's left (torch; len 0, its own storage), while
    ``list()`` showed them (helper-166's FINDINGS 5 and 2). Not once unihook pinned a hook
    of the copy's in it again (`owned`): its own items then. (A class of its own: the Python
    ``__len__`` costs each call of the modules holding one, not of the others.)"""

    def _live(self) -> OrderedDict[int, Any] | None:
        return None if self.owned else self.origin()

    def __len__(self) -> int:
        back = self._live()
        return OrderedDict.__len__(self) if back is None else len(back)

    def __contains__(self, key: object) -> bool:
        back = self._live()
        return HookDict.__contains__(self, key) if back is None else key in back

    def __getitem__(self, key: int) -> Any:
        back = self._live()
        return OrderedDict.__getitem__(self, key) if back is None else back[key]

    def get(self, key: int, default: Any = None) -> Any:  # type: ignore[override]
        back = self._live()
        return OrderedDict.get(self, key, default) if back is None else back.get(key, default)


def _self_of(value: Any) -> Any:
    """`value`'s ``__self__`` (a dispatcher's: its state), None if none: read on any hook of
    a dict, whose ``__getattr__`` may raise anything (a KeyError failed the framework's own
    registration of such a hook, and a module's call: helper-169's FINDING 1)."""
    try:
        return getattr(value, "__self__", None)
    except Exception:  # noqa: BLE001 - a hook of the user's, not unihook's
        return None


def _dispatcher(value: Any) -> bool:
    """Whether `value` is a backward dispatcher of unihook's (its ``__self__`` a state)."""
    from ._module_backward import ModuleBackward

    return isinstance(_self_of(value), ModuleBackward)


class _Carried:
    """In place of a dispatcher of unihook's that a library registered as a hook of its own
    in a module's dict unihook holds (it carried a module's hooks to another module, or there
    and back: ``values()`` registered there, then there's here), or that unihook pins where
    such a copy was (a backend's global dispatchers, pinned in a module at its first call,
    in the module a library carried a called module's hooks to). Where it pins the same
    dispatcher, it ran a second dispatch per call (a hook fired twice, helper-167's FINDINGS
    8 and 3); a global one took the call before the module's own dispatchers, out of their
    order. Does nothing (the framework's own backward hooks stay with their module)."""

    __slots__ = ()
    __name__ = HookName(lambda carried, module, backend: _carried_refusal(module, backend))

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _carried_refusal(module: Any, backend: str) -> tuple[Site, str]:
    """A compiler of hooks (torch.jit.script) met placeholders in `module`'s hook dicts: they
    go, out of every HookDict of the module (the compiler left its loop: nothing iterates
    them), as the framework alone has no hook there (helper-180's FINDING 1: they stayed for
    good, and the compiler failed on them with an AttributeError). Not where a library
    carried them (a library's handle, a ``prepend`` move, a read back: helper-181)."""
    for hooks in list(vars(module).values()) if module is not None else ():
        if isinstance(hooks, HookDict):
            for key, value in hooks._copy():
                if isinstance(value, _Carried) and key not in hooks.pinned:
                    hooks.pop(key, None)
    return Site.of("full_backward", backend, module), (
        "inert placeholders of unihook's where a library carried backward-hook dispatchers "
        "in (fuse_modules of modules with backward hooks); taken out now: compile it again"
    )


class _Forwarding:
    """A retired HookDict's value: the hook now in the origin under the same key, if any."""

    __slots__ = ("origin", "key")

    def __init__(self, origin: weakref.ref[OrderedDict[int, Any]], key: int) -> None:
        self.origin = origin
        self.key = key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        origin = self.origin()
        hook = None if origin is None else origin.get(self.key)
        return None if hook is None else hook(*args, **kwargs)

    def __reduce__(self) -> Any:
        """Pickled (a retired dict unihook pinned a copy's hooks in since, its own items):
        the hook it forwards to, if any."""
        origin = self.origin()
        hook = None if origin is None else origin.get(self.key)
        return (_Carried, ()) if hook is None else (_same, (hook,))


def _same(value: Any) -> Any:
    """`value` itself (a `_Forwarding` pickled as the hook it forwards to)."""
    return value


class Pinned:
    """A module's backward dispatchers, pinned last in its forward pre- and post-hook dicts
    (``unihook._module_backward.Dispatchers``); the post one is always called."""

    __slots__ = ("owner", "pre", "post", "always", "access", "orphans", "__weakref__")

    def __init__(
        self,
        owner: Any,
        pre: tuple[str, int],
        post: tuple[str, int],
        always: str,
        access: Access,
    ) -> None:
        self.owner: weakref.ref[Any] = weakref.ref(owner)
        self.pre: tuple[str, int] = pre
        self.post: tuple[str, int] = post
        self.always: str = always
        self.access: Access = access
        # (each dispatcher's dicts and key, for its removal once the owner died: `_orphans`)
        self.orphans: tuple[tuple[tuple[weakref.ref[Any] | None, ...], int], ...] = ()

    def _orphans(self, owner: Any) -> None:
        """Take the dicts the dispatchers are in (`dicts_of`): MindSpore's shallow copy
        shares its original's ``__dict__`` itself, and kept the dispatchers of an original
        that died, their removal a no-op, for good (helper-174's FINDING 2)."""
        self.orphans = (
            (dicts_of(owner, self.pre[0], (), self.access), self.pre[1]),
            (dicts_of(owner, self.post[0], (self.always,), self.access), self.post[1]),
        )

    @classmethod
    def install(
        cls,
        owner: Any,
        hooks: tuple[tuple[str, Any], tuple[str, Any]],
        always: str,
        new_id: Callable[[], int],
        access: Access,
        tail: bool = False,
        flags: tuple[str, ...] = (),
    ) -> Pinned:
        """Pin `hooks` (pre, post) last in `owner`'s dicts; `tail` ones stay after the others
        (a backend's global dispatchers after a module's own). `flags`: the owner's other flag
        tables (with_kwargs), whose keys the new ids avoid too (a flag left behind by a
        cleared dict: helper-126's FINDING 5)."""
        (pre_attr, pre), (post_attr, post) = hooks
        pre_key = new_key(new_id, access, owner, pre_attr, always, *flags)
        post_key = new_key(new_id, access, owner, post_attr, always, *flags)
        pinned = cls(owner, (pre_attr, pre_key), (post_attr, post_key), always, access)
        undo_if_unfinished(pinned.remove)  # (inside a registration)
        try:
            pin(owner, pre_attr, pre_key, pre, access, last=True, prepend=False, tail=tail)
            pin(
                owner,
                post_attr,
                post_key,
                post,
                access,
                last=True,
                prepend=False,
                tail=tail,
                flags=(always,),
            )
            pinned._orphans(owner)
        except BaseException:
            # interrupted half-way (a Ctrl-C in a forward that pins lazily): what went in goes,
            # so that the next call pins once, not twice
            pinned.remove()
            raise
        return pinned

    @classmethod
    def find(
        cls,
        owner: Any,
        hooks: tuple[tuple[str, Any], tuple[str, Any]],
        always: str,
        access: Access,
    ) -> Pinned | None:
        """`hooks` (pre, post) as pinned already in `owner`'s dicts, if both are: a shallow
        copy (``copy.copy``) shares the original's hook dicts, where a second pair would run
        twice per call."""
        keys = [pinned_key(owner, attr, hook, access) for attr, hook in hooks]
        if keys[0] is None or keys[1] is None:
            return None
        (pre_attr, _), (post_attr, _) = hooks
        found = cls(owner, (pre_attr, keys[0]), (post_attr, keys[1]), always, access)
        found._orphans(owner)
        return found

    def serving(self, owner: Any) -> Any:
        """The state (``__self__``) whose dispatchers `owner`'s hook dicts both hold under
        these dispatchers' keys (a deep copy's dicts hold the copy's state's under the same
        keys; a shallow copy's, or a library's rebuilt ``OrderedDict(d)``, these), None if
        none: a library registered these there as hooks of its own (under keys of their
        own), or gave a shallow copy a dict of its own in place of one it shared (the
        post-dispatcher never ran for the copy's call: BackendStateError, helper-166's
        FINDING 3)."""
        found = [
            _self_of(dict.get(self.access.get(owner, attr), key))
            for attr, key in (self.pre, self.post)
        ]
        return found[0] if found[0] is found[1] else None

    def disarm(self, owner: Any, state: Any) -> None:
        """Replace `state`'s dispatchers in `owner`'s hook dicts, where a library carried them
        (`ModuleBackward._foreign`), by inert ones: left in, they kept the state alive, and a
        compiler refused the module's hooks (torch.compile with ``fullgraph=True``, paddle's
        to_static with ``full_graph=True``), helper-168's FINDINGS 2 and 3. Where the
        framework iterates the live dict in a call (`Access.iterates_live`), a value replaced
        under its key, its hook loop going on; else (torch) taken out, as the framework alone
        has no hook there (``torch.jit.script`` refuses a hook without a name)."""
        live = getattr(self.access, "iterates_live", False)
        for attr in (self.pre[0], self.post[0]):
            hooks = self.access.get(owner, attr)
            pinned = getattr(hooks, "pinned", ())  # (a dict `owner` shares with the module)
            for key, value in _snapshot(partial(dict.items, hooks)):
                if key in pinned:
                    continue
                if _self_of(value) is state or isinstance(value, _Carried):
                    if live:
                        hooks[key] = _Carried()
                    else:
                        hooks.pop(key, None)

    def holders(self, owner: Any) -> list[Any]:
        """The states (``__self__``) of the hooks in `owner`'s pre-hook dict."""
        hooks = self.access.get(owner, self.pre[0])
        return [_self_of(value) for _, value in _snapshot(partial(dict.items, hooks))]

    def rebound(self, owner: Any) -> Pinned:
        """The same dispatchers in a deep copy `owner` of the module (`HookDict.__deepcopy__`
        watches the copy's flag tables)."""
        return Pinned(owner, self.pre, self.post, self.always, self.access)

    def remove(self) -> None:
        """Unpin both (idempotent: undoes an `install` cut short, finishes a removal too)."""
        owner = self.owner()
        if owner is not None:
            unpin(owner, *self.pre, self.access)
            unpin(owner, *self.post, self.access, flags=(self.always,))
        # The dicts they went in, where the owner died, or holds others now (a library gave
        # it a copy of one): a shallow copy may share them still, and ran the dispatcher of
        # the removed hooks for good (helper-176's FINDING 1).
        for dicts, key in self.orphans:
            unpin_orphaned(dicts, key)
