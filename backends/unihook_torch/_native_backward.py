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
"""

from __future__ import annotations

import sys
import threading
import weakref
from functools import partial, update_wrapper
from typing import Any, Callable

import torch

from unihook.backend import Site, hold_call

from . import NAME
from ._global import TORCH_CALL_CODE, WRAPPER_CODES

__all__ = ["Absorption", "natives", "pending", "rank"]

_ATTRS = {"_backward_pre_hooks": "full_backward_pre", "_backward_hooks": "full_backward"}
_lock = threading.Lock()
# id of an absorbed dict -> [the dict weakly, the `Absorption`s that hold it, the keys torch
# registered in it with prepend since]
_absorbed: dict[int, list[Any]] = {}
# torch's methods replaced (see the module's docstring): the ones the class had at first
_originals: dict[str, Any] = {}

Ranked = list[tuple[int, tuple[Callable[..., Any], Site | None]]]
# .calls: id(module) -> [frame, pre-hooks, full hooks left out, the hold's release or None]
_started = threading.local()
_inside = threading.local()  # .method: the replaced method running (see `_call`)
_module_globals = vars(sys.modules["torch.nn.modules.module"])
CALL_CODES = frozenset({TORCH_CALL_CODE, *WRAPPER_CODES})  # (TorchAutograd.call_codes)


def rank(prepend: bool) -> int:
    """A unihook hook's rank, drawn at its registration (see the module's docstring)."""
    from ._backward import _TorchDispatchers

    key = _TorchDispatchers.new_id()
    return -key if prepend else key


def natives(module: Any, frame: int) -> tuple[Ranked, Ranked] | None:
    """torch's own backward pre-hooks and full hooks of `module` that torch left out of this
    call (the call function's frame: `frame`) as it started, ranked; taken once."""
    calls = getattr(_started, "calls", None)
    entry = calls.pop(id(module), None) if calls else None
    if entry is None:
        return None
    if entry[3] is not None:
        entry[3]()  # (the call's entry holds the dispatchers from here)
    return (entry[1], entry[2]) if entry[0] == frame else None


def pending(module: Any, frame: int) -> bool:
    """Whether torch left hooks of `module` out of this call as it started (`natives`)."""
    calls = getattr(_started, "calls", None)
    entry = calls.get(id(module)) if calls else None
    return entry is not None and entry[0] == frame and bool(entry[1] or entry[2])


def _left_out(module: Any, at: int, hooks: Any, kind: str) -> bool:
    """Whether torch leaves `hooks` (absorbed) out of this call of `module`: noted then, for
    it, as they are (torch reads a module's hooks as a call starts; unihook's dispatch runs
    these, added or removed from now on, or unihook's last hook removed: as torch would). The
    call is named by the frame of its call function, as the dispatch finds it (torch asks from
    a closure inside it), and held in flight first (`hold_call`: a removal of unihook's last
    hook on another thread leaves the dispatchers for it), then the dicts read again: still
    absorbed, unihook's hook was there when the hold came."""
    caller: Any = sys._getframe(2)
    while caller is not None and caller.f_code not in CALL_CODES:
        caller = caller.f_back
    frame = 0 if caller is None else id(caller)
    calls = getattr(_started, "calls", None)
    if calls is None:
        calls = _started.calls = {}
    entry = calls.get(id(module))
    if entry is None or entry[0] != frame:
        if entry is not None and entry[3] is not None:
            entry[3]()  # (one a call cut short before its pre-dispatch left)
        entry = calls[id(module)] = [frame, [], [], None]
        entry[3] = hold_call(module, frame)
    if entry[3] is None or not _absorbs(hooks):
        return False
    entry[at] = _ranked(hooks, module, kind)
    return True


def _full(module: Any) -> bool:
    # (the deprecated non-full hooks, `register_backward_hook`, torch runs apart: not absorbed)
    return module.__dict__.get("_is_full_backward_hook") is True


def _ranked(hooks: Any, module: Any, kind: str) -> Ranked:
    entry = _absorbed.get(id(hooks)) if hooks else None
    if entry is None or entry[0]() is not hooks:
        return []
    noted, site = entry[2], Site.of(kind, NAME, module)
    items = tuple(hooks.items())  # (one read: another thread may register meanwhile)
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

    __slots__ = ("_refs",)

    def __init__(self, module: Any) -> None:
        self._refs = []
        for hooks in map(module.__dict__.get, _ATTRS):
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


def _gone(ident: int, ref: weakref.ref[Any]) -> None:
    """(an absorbed dict freed: a finalizer, no lock) Its entry goes."""
    entry = _absorbed.get(ident)
    if entry is not None and entry[0] is ref:
        _absorbed.pop(ident, None)
    if not _absorbed and _lock.acquire(blocking=False):  # (held here: the holder sees to it)
        try:
            if not _absorbed:
                _uninstall()  # (a model dropped with its hooks: torch's methods back)
        finally:
            _lock.release()


def _install() -> None:
    module = torch.nn.Module
    for name, replacement in _REPLACEMENTS.items():
        current = vars(module)[name]
        if current is not replacement:  # (installed still: every absorbed dict died)
            _originals[name] = current
            setattr(module, name, replacement)


def _uninstall() -> None:
    """torch's methods back, each still unihook's (a library that replaced one since keeps
    its own: unihook's beneath it then passes everything through, nothing absorbed)."""
    for name, replacement in _REPLACEMENTS.items():
        if vars(torch.nn.Module).get(name) is replacement:
            setattr(torch.nn.Module, name, _originals[name])


def _absorbs(hooks: Any) -> bool:
    entry = _absorbed.get(id(hooks)) if hooks else None
    return entry is not None and entry[0]() is hooks


def _get_backward_hooks(self: Any) -> Any:
    own = self.__dict__.get("_backward_hooks")
    if not (own and _full(self) and _absorbs(own) and _left_out(self, 2, own, "full_backward")):
        return _call(self, "_get_backward_hooks")
    # torch's lists without the module's own (one read of the globals: no tail to cut, which
    # another thread's registration meanwhile made longer or shorter)
    hooks = list(_module_globals.get("_global_backward_hooks", {}).values())
    full = _module_globals.get("_global_is_full_backward_hook")
    return (hooks if full is True else []), (hooks if full is False else [])


def _get_backward_pre_hooks(self: Any) -> Any:
    own = self.__dict__.get("_backward_pre_hooks")
    if not (own and _absorbs(own) and _left_out(self, 1, own, "full_backward_pre")):
        return _call(self, "_get_backward_pre_hooks")
    return list(_module_globals.get("_global_backward_pre_hooks", {}).values())


def _call(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """The method the class had (a library's replacement of it too) or, called again from
    inside that (a library that replaced unihook's and calls it), torch's."""
    if getattr(_inside, "method", None) == method:
        return _TORCH[method](self, *args, **kwargs)
    _inside.method = method
    try:
        return _originals.get(method, _TORCH[method])(self, *args, **kwargs)
    finally:
        _inside.method = None


def _noting(method: str, attr: str) -> Callable[..., Any]:
    def register(self: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
        handle = _call(self, method, hook, *args, **kwargs)
        if kwargs.get("prepend", args[0] if args else False):
            hooks = self.__dict__.get(attr)
            with _lock:
                entry = _absorbed.get(id(hooks))
                if entry is not None and entry[0]() is hooks:
                    entry[2].add(handle.id)
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
# torch's own methods (a replaced one that calls unihook's again gets these: see `_call`)
_TORCH = {name: vars(torch.nn.Module)[name] for name in _REPLACEMENTS}
for _name, _replacement in _REPLACEMENTS.items():  # (torch's names and docs, for help())
    update_wrapper(_replacement, _TORCH[_name])
