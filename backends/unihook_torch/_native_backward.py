"""torch's own module backward hooks beside unihook's, in the order of registration.

unihook's module backward hooks run at identity nodes its forward (pre-)hook dispatchers put
around a call, pinned last among the forward hooks; torch's own run at the BackwardHook nodes
``Module._call_impl`` puts around the call after every forward (pre-)hook. So torch's ran
first in the backward, before unihook's, whatever the order of registration or ``prepend``
(helper-144's FINDING 1). While a module has unihook's backward hooks, its backward hook
dicts are *absorbed*: torch's ``_get_backward_hooks`` / ``_get_backward_pre_hooks`` leave
their hooks out (torch makes no BackwardHook for them), and unihook's dispatch runs them among
its own (`natives`), in one order: each hook's rank is its registration's place in torch's id
counter, drawn for unihook's too (`rank`), negative for one prepended (torch's registration
methods note those of torch's hooks). The dicts stay the module's own objects: torch's
handles, old and new, remove from them as ever.

The replaced methods of ``torch.nn.Module`` are installed while any dict is absorbed, and
torch's own come back when the last is released. A dict is absorbed by identity: a shallow
copy of the module (which shares its dicts, and unihook's dispatchers with them) runs them at
unihook's too; a dict assigned anew (``m._backward_hooks = OrderedDict()``) is torch's alone.
Only torch's own call reading the hooks through unihook's methods alone gets them left out
(`_pristine`): beside a library's wrapper of the methods or a class's override, torch runs
its hooks itself, first, as without this module.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable
from copy import deepcopy
from functools import partial, update_wrapper
from types import CodeType
from typing import Any, Callable

import torch

from unihook.backend import Site, call_holder

from . import NAME, _compile, _global
from ._global import TORCH_CALL_CODE, WRAPPER_CODES

__all__ = ["Absorption", "copy_natives", "natives", "pending", "rank"]

_ATTRS = {"_backward_pre_hooks": "full_backward_pre", "_backward_hooks": "full_backward"}
_lock = threading.Lock()
# id of an absorbed dict -> [the dict weakly, the `Absorption`s that hold it, the keys torch
# registered in it with prepend since]
_absorbed: dict[int, list[Any]] = {}

Ranked = list[tuple[float, tuple[Callable[..., Any], Site | None]]]
Found = tuple[Ranked, Ranked]  # torch's global hooks of a kind, the module's own
_started = threading.local()  # .records: see `_Record`
_module_globals = vars(sys.modules["torch.nn.modules.module"])
_Handle = torch.utils.hooks.RemovableHandle
CALL_CODES = frozenset({TORCH_CALL_CODE, *WRAPPER_CODES})  # (TorchAutograd.call_codes)
# where torch's call reads a module's hooks: the closure `inner` of `Module._call_impl`
_INNER = next(
    (c for c in TORCH_CALL_CODE.co_consts if isinstance(c, CodeType) and c.co_name == "inner"),
    None,
)


def rank(prepend: bool) -> int:
    """A unihook hook's rank, drawn at its registration (see the module's docstring)."""
    from ._backward import _TorchDispatchers

    key = _TorchDispatchers.new_id()
    return -key if prepend else key


class _Marker(list):  # type: ignore[type-arg]
    """The list a replaced method hands torch in place of its own: it lives as long as the
    call (torch keeps it in the call's locals), and names the call for its `_Record`."""

    __slots__ = ("__weakref__",)


class _Record:
    """What torch left out of one call of a module as it started (see `_left_out`)."""

    __slots__ = ("frame", "marker", "module", "lists", "release", "read")

    def __init__(self, frame: int, marker: _Marker, module: Any) -> None:
        # the call function's frame (its id) and, weakly, a list torch holds for the call: an
        # id a call cut short had, reused by a later call's frame, never passes for it
        # (helper-149's FINDING 1), and the cut call's frame, its module and arguments go
        # with it (helper-150's FINDING 1: holding the frame kept them)
        self.frame = frame
        self.lists: list[Found] = [_NONE, _NONE, _NONE]  # (index 1: pre-hooks, 2: full hooks)
        self.marker = weakref.ref(marker, partial(_cut, self.lists))
        self.module = weakref.ref(module)  # (not another module with its id: FINDING 2)
        self.release: Callable[[], None] | None = None
        self.read = 0  # the last kind read (1: pre-hooks, 2: full hooks)

    def live(self, module: Any, frame: int) -> bool:
        return self.frame == frame and self.marker() is not None and self.module() is module


_NONE: Found = ([], [])


def _cut(lists: list[Found], _: Any) -> None:
    """(a call's list freed before its pre-dispatch took its record: a finalizer, on any
    thread) The hooks noted go now; the record and its hold at this thread's next look
    (`_prune`)."""
    lists[:] = [_NONE, _NONE, _NONE]


def _records() -> list[_Record]:
    """This thread's records, calls that started last at the end (a forward pre-hook calling
    its own module makes one over the outer call's: helper-149's FINDING 3)."""
    records: list[_Record] | None = getattr(_started, "records", None)
    if records is None:
        records = _started.records = []
    return records


def _find(records: list[_Record], module: Any, frame: int) -> int:
    for k in range(len(records) - 1, -1, -1):
        if records[k].live(module, frame):
            return k
    return -1


def natives(module: Any, frame: int) -> tuple[Ranked, Ranked, Ranked, Ranked] | None:
    """torch's own global backward pre-hooks, pre-hooks of `module`, global full hooks and
    full hooks of `module` that torch left out of this call (the call function's frame:
    `frame`) as it started, ranked; taken once."""
    records = getattr(_started, "records", None)
    k = _find(records, module, frame) if records else -1
    if k < 0:
        return None
    record = records.pop(k)  # type: ignore[union-attr]
    if record.release is not None:
        record.release()  # (the call's entry holds the dispatchers from here)
    (global_pre, pre), (global_full, full) = record.lists[1], record.lists[2]
    return global_pre, pre, global_full, full


def pending(module: Any, frame: int) -> bool:
    """Whether torch left hooks of `module` out of this call as it started (`natives`)."""
    records = getattr(_started, "records", None)
    k = _find(records, module, frame) if records else -1
    return k >= 0 and any(any(found) for found in records[k].lists)  # type: ignore[index]


def _prune(records: list[_Record], caller: Any) -> None:
    """Drop the records of calls no longer running on this thread (cut short before their
    pre-dispatch: a forward pre-hook raised, a Ctrl-C), letting go of their holds."""
    live = set()
    frame = caller
    while frame is not None:
        live.add(id(frame))
        frame = frame.f_back
    for record in [r for r in records if r.frame not in live or r.marker() is None]:
        records.remove(record)
        if record.release is not None:
            record.release()


def _left_out(
    module: Any, at: int, hooks: Any, kind: str, marker: _Marker, first: list[Any]
) -> bool:
    """Whether torch leaves `hooks` (absorbed) and `first`, torch's global hooks of the kind
    (key, hook), out of this call of `module`: noted then, for it, as they are (torch reads a
    module's hooks as a call starts; unihook's dispatch runs these, added or removed from now
    on, or unihook's last hook removed: as torch would). Only torch's call of the module asks
    so (anything else, code reading a module's hooks, a forward pre-hook among it, gets them
    all: helper-150's FINDING 3, helper-152's FINDING 7). The call is named by the frame of
    its call function, as the dispatch finds it, and by `marker`, which torch keeps for it
    (see `_Record`); it is held in flight first (a removal of unihook's last hook on another
    thread leaves the dispatchers for it), then the dicts read again: still absorbed,
    unihook's hook was there when the hold came. (torch's global hooks run among unihook's
    too, before the module's: a global full hook gets the grad_output the module's pre-hooks
    gave; in torch's BackwardHook it got the one before them, helper-151's FINDING 1.)"""
    caller = _torchs_call(sys._getframe(2))
    if caller is None or caller.f_code not in CALL_CODES:
        return False
    records = _records()
    k = _find(records, module, id(caller))
    if k >= 0 and records[k].read >= at:
        # torch's call reads each kind once, pre-hooks first: this is an earlier call's,
        # whose list torch still holds (its BackwardHook), its frame's id reused
        stale = records.pop(k)
        if stale.release is not None:
            stale.release()
        k = -1
    if k < 0:
        if records:
            _prune(records, caller)
        record = _Record(id(caller), marker, module)
        records.append(record)
        record.release = _hold(module, hooks, id(caller))
    else:
        record = records[k]
    record.read = at
    entry = _entry(hooks)  # (one read: another thread may release it meanwhile)
    items = tuple(hooks.items())  # (one read: another thread may register meanwhile)
    if record.release is None or entry is None or not _ranks(items, first):
        return False
    # (what torch's own hook returns is checked as unihook's: the error names it torch's)
    site = Site.of(kind, NAME, module)._replace(owner="torch")
    global_site = site._replace(kind=f"module_{kind}")
    record.lists[at] = (
        [(key, (hook, global_site)) for key, hook in first],
        _ranked(items, entry[2], site),
    )
    return True


def _ranks(items: tuple[Any, ...], first: list[Any]) -> bool:
    """Whether every key is one torch's handles drew (an int below their counter: the rank
    of its registration): a hook put in a dict by hand under another keeps torch's order
    (helper-153 found a TypeError, and one under an `id()` ranked after unihook's)."""
    drawn = _Handle.next_id
    return all(type(key) is int and 0 <= key < drawn for key, _ in (*items, *first))


def _torchs_call(asker: Any) -> Any:
    """The frame of torch's call function whose read of the hooks `asker` (a frame) is: torch's
    `inner`, directly or through `_outside` (under torch.compile), else None."""
    if asker.f_code is TORCH_CALL_CODE:
        return asker
    passing = (_compile._call.__code__, getattr(_compile._dispatch_outside, "__code__", None))
    frame = asker
    while frame is not None and frame.f_code is not _INNER:
        code = frame.f_code
        # (dynamo runs its own code for unihook's frames it compiled: named as they are)
        if code not in passing and (code.co_filename, code.co_name) not in _OWN_FRAMES:
            return None
        frame = frame.f_back
    return None if frame is None else frame.f_back


def _hold(module: Any, hooks: Any, frame: int) -> Callable[[], None] | None:
    """The call held in flight on the state whose dispatchers serve `hooks`: the module's
    own, or, for a shallow copy sharing its dicts, the one an `Absorption` of them noted
    (helper-149's FINDING 4, helper-150's FINDING 2 with the original gone: none held,
    torch's full hook ran first)."""
    holder = call_holder(module)
    release = None if holder is None else holder(frame)
    if release is not None:
        return release
    entry = _absorbed.get(id(hooks))
    for held in () if entry is None else tuple(entry[1]):
        if held._holder is not None:
            release = held._holder(frame)
            if release is not None:
                return release
    return None


def _ranked(items: tuple[Any, ...], noted: set[int], site: Site) -> Ranked:
    """`items` of absorbed hooks (`noted`: the keys torch registered with prepend), ranked. (Read
    from the entry the caller found: released meanwhile by another thread, torch has left
    them out all the same: they were lost in 1 call in ~40,000 beside a thread registering
    and removing unihook's hooks.)"""
    ranked, least = [], None
    for key, hook in reversed(items):
        # prepended: noted at its registration, or before a key registered earlier (one
        # registered through a method bound before the replacement went unnoted)
        prepended = key in noted or (least is not None and least < key)
        ranked.append((-key if prepended else key, (hook, site)))
        least = key if least is None else min(least, key)
    ranked.reverse()
    return ranked


class Absorption:
    """One unihook hook's hold on `module`'s backward hook dicts: `take` absorbs them,
    `release` (idempotent; it finishes what a Ctrl-C left of itself or of `take`) lets go,
    giving them back to torch with the last hold."""

    __slots__ = ("_refs", "_holder")

    def __init__(self, module: Any, dicts: Iterable[Any] | None = None, state: Any = None) -> None:
        # (the state of unihook's hook, weakly: the module's, or `state`, the global hooks')
        self._holder = call_holder(module) if state is None else state.holder()
        self._refs = []
        for hooks in map(module.__dict__.get, _ATTRS) if dicts is None else dicts:
            try:
                self._refs.append(weakref.ref(hooks))
            except TypeError:  # (None, or a plain dict a library assigned: torch's alone)
                pass

    def take(self) -> None:
        with _lock:
            if not _absorbed:
                _install()  # (no-op where installed: a dict a module dropped took the last)
            for ref in self._refs:
                hooks = ref()
                if hooks is None:
                    continue
                ident = id(hooks)
                entry = _absorbed.get(ident)
                if entry is None or entry[0]() is not hooks:
                    _absorbed[ident] = [weakref.ref(hooks, partial(_gone, ident)), {self}, set()]
                else:
                    entry[1].add(self)
            if not _absorbed:  # (each dict died meanwhile)
                _uninstall()

    def release(self) -> None:
        with _lock:
            for ref in self._refs:
                hooks = ref()
                entry = None if hooks is None else _absorbed.get(id(hooks))
                if entry is not None and entry[0]() is hooks:
                    entry[1].discard(self)
                    if not entry[1]:
                        del _absorbed[id(hooks)]
            if not _absorbed:
                _uninstall()
        records = getattr(_started, "records", None)
        if records:  # (a call cut short before its pre-dispatch: its frame, its module go)
            _prune(records, sys._getframe())


def copy_natives(module: Any, copy: Any, memo: dict[int, Any]) -> None:
    """(`copy`, a deep copy of `module`, got a copy of its backward state) The copies of
    `module`'s absorbed dicts are absorbed for `copy`'s state, with the keys torch noted as
    prepended, for good: the copy's hooks have no handle (they go with the copy, and its
    dicts' entries with them, `_gone`)."""
    pairs = [(hooks, deepcopy(hooks, memo)) for hooks in map(module.__dict__.get, _ATTRS)]
    pairs = [(hooks, copied) for hooks, copied in pairs if _absorbs(hooks)]
    if not pairs:
        return
    Absorption(copy, [copied for _, copied in pairs]).take()
    with _lock:
        for hooks, copied in pairs:
            entry, copied_entry = _entry(hooks), _entry(copied)
            if entry is not None and copied_entry is not None:
                copied_entry[2].update(entry[2])


def _gone(ident: int, ref: weakref.ref[Any]) -> None:
    """(an absorbed dict freed: a finalizer, no lock) Its entry goes; the last one gives
    torch's methods back, here or, where another thread holds the lock, there as it lets go
    (each holder looks: helper-151's FINDING 3, `_noting` did not)."""
    entry = _absorbed.get(ident)
    if entry is not None and entry[0] is ref:
        _absorbed.pop(ident, None)
    if not _absorbed and _lock.acquire(blocking=False):
        try:
            if not _absorbed:
                _uninstall()  # (a model dropped with its hooks: torch's methods back)
        finally:
            _lock.release()


def _install() -> None:
    module = torch.nn.Module
    for name, replacement in _REPLACEMENTS.items():
        # over torch's own only: over a library's replacement (which may add, remove or
        # cache hooks, and be taken off in any order) torch keeps running its hooks itself
        # (`_pristine`; a lifted wrapper came back as unihook's was taken off, or recursed:
        # helper-154's FINDING 3, helper-155's)
        if vars(module)[name] is _TORCH[name]:
            setattr(module, name, replacement)


def _uninstall() -> None:
    """torch's methods back, each still unihook's (a library that replaced one since keeps
    its own: unihook's beneath it then passes everything through to torch's)."""
    for name, replacement in _REPLACEMENTS.items():
        if vars(torch.nn.Module).get(name) is replacement:
            setattr(torch.nn.Module, name, _TORCH[name])


def _entry(hooks: Any) -> list[Any] | None:
    """`hooks`' entry in `_absorbed`, None where not absorbed."""
    entry = _absorbed.get(id(hooks)) if hooks is not None else None
    return entry if entry is not None and entry[0]() is hooks else None


def _absorbs(hooks: Any) -> bool:
    return _entry(hooks) is not None


def _get_backward_hooks(self: Any) -> Any:
    if _dynamo_compiling():  # (see `_outside`)
        return _outside(_get_backward_hooks, self)
    own = self.__dict__.get("_backward_hooks")
    # (a module's deprecated non-full hooks, `register_backward_hook`, torch runs apart)
    if (
        self.__dict__.get("_is_full_backward_hook") is not False
        and _absorbs(own)
        and _pristine(self)
    ):
        # torch's global hooks too (one read: another thread may register meanwhile); the
        # non-full ones torch runs apart, as ever
        hooks = list(_module_globals.get("_global_backward_hooks", {}).items())
        full = _module_globals.get("_global_is_full_backward_hook")
        marker = _Marker()
        if _left_out(self, 2, own, "full_backward", marker, hooks if full is True else []):
            return marker, ([hook for _, hook in hooks] if full is False else [])
    return _call(self, "_get_backward_hooks")


def _get_backward_pre_hooks(self: Any) -> Any:
    if _dynamo_compiling():  # (see `_outside`)
        return _outside(_get_backward_pre_hooks, self)
    own = self.__dict__.get("_backward_pre_hooks")
    if _absorbs(own) and _pristine(self):
        first = list(_module_globals.get("_global_backward_pre_hooks", {}).items())
        marker = _Marker()
        if _left_out(self, 1, own, "full_backward_pre", marker, first):
            return marker
    return _call(self, "_get_backward_pre_hooks")


def _pristine(module: Any) -> bool:
    """Whether torch's call reads `module`'s hooks through unihook's methods alone: no
    library's wrapper of them, installed before unihook's or over them, and no override in
    the module's class (a wrapper that adds, removes or caches hooks: where unihook's leave
    them out they were run against the wrapper's will, lost, or run first, helper-152's
    FINDINGS 2-4 and helper-153's): else torch's answer, and torch runs its hooks itself,
    first (the order before 2026-12-05)."""
    cls, own = type(module), module.__dict__
    pre_hooks = own.get("_forward_pre_hooks")
    return (
        # unihook's pre-dispatcher, which takes what is left out, is in the dict the call
        # runs (pinned last: not where a library runs the call with the dict set aside,
        # helper-154's FINDING 4; None where another thread's removal emptied it since the
        # test: StopIteration reached the module's caller)
        bool(pre_hooks)
        and type(next(reversed(pre_hooks.values()), None)) is _compile.EagerUnderCompile
        # (each of the four: a prepend registered through a library's replacement goes
        # unnoted)
        and all(getattr(cls, name, None) is method for name, method in _REPLACEMENTS.items())
        # (nor one set on the module itself: a memo, helper-154's FINDING 1)
        and "_get_backward_hooks" not in own
        and "_get_backward_pre_hooks" not in own
        # nor a call the global backward dispatchers' wrapper runs around (they were pinned
        # in the module after the wrapper looked, by another thread: the pinned ones leave
        # the call to the wrapper, which took it before torch read the hooks)
        and not _around_by_globals(module)
    )


def _around_by_globals(module: Any) -> bool:
    state = _global.global_backward_state()
    return state is not None and state.inside(module)


_dynamo_compiling = torch.compiler.is_dynamo_compiling  # (False when run, True as traced)


def _outside(method: Callable[[Any], Any], module: Any) -> Any:
    """(traced by dynamo, inside a compiled forward) The read run outside dynamo: the module's
    call then runs eagerly (a graph break), where the read sees torch's call's frames (traced,
    the frames it reads gave a graph break each and a warning: "Dynamo does not know how to
    trace the builtin `sys._getframe`")."""
    return _compile._dispatch_outside(method, module)


_OWN_FRAMES = frozenset(
    (function.__code__.co_filename, function.__code__.co_name)
    for function in (_outside, _get_backward_hooks, _get_backward_pre_hooks)
)


def _call(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """torch's method (unihook's replace torch's own only: see `_install`)."""
    return _TORCH[method](self, *args, **kwargs)


def _noting(method: str, attr: str) -> Callable[..., Any]:
    def register(self: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
        handle = _call(self, method, hook, *args, **kwargs)
        if kwargs.get("prepend", args[0] if args else False):
            hooks = self.__dict__.get(attr)
            with _lock:
                entry = _absorbed.get(id(hooks))
                if entry is not None and entry[0]() is hooks:
                    entry[2].add(handle.id)
                if not _absorbed:  # (the last dict died meanwhile: see `_gone`)
                    _uninstall()
        return handle

    return register


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "_get_backward_hooks": _get_backward_hooks,
    "_get_backward_pre_hooks": _get_backward_pre_hooks,
    "register_full_backward_hook": _noting("register_full_backward_hook", "_backward_hooks"),
    "register_full_backward_pre_hook": _noting(
        "register_full_backward_pre_hook", "_backward_pre_hooks"
    ),
}
# torch's own methods: the ones unihook's replace and call (see `_install`, `_call`)
_TORCH = {name: vars(torch.nn.Module)[name] for name in _REPLACEMENTS}
for _name, _replacement in _REPLACEMENTS.items():  # (torch's names and docs, for help())
    update_wrapper(_replacement, _TORCH[_name])
