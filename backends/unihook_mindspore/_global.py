"""Global hooks for MindSpore 2.10, which has one (buffer registration) and no global forward
or backward hooks.

While a global forward or backward hook exists, ``Cell.__call__`` is wrapped: before each call
it makes sure the cell holds unihook's global dispatchers in its own hook dicts, the forward
ones first (torch runs global hooks before the module's own), the backward ones last (as a
module's own backward dispatchers). A cell with no hook takes MindSpore's no-hook path, so the
dispatchers must live in its dicts, not around the call. Removing the last global hook takes
them out of every cell and puts ``Cell.__call__`` back.

Registration: ``Cell.__setattr__`` files Parameters through ``insert_param_to_cell`` and cells
through ``insert_child_to_cell``, the public paths too: both are wrapped while a hook exists.
Buffers: MindSpore's own ``register_cell_buffer_registration_hook``.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from itertools import count
from typing import Any, Callable

import mindspore
import mindspore.nn.cell as cell_module
from mindspore import nn

from unihook.backend import (
    Pinned,
    RegistryLock,
    Site,
    WeakIdentityKeys,
    add_to_global_table,
    check_pre_kwargs_result,
    global_label,
    new_key,
    pin,
    pinned_key,
    show_value,
    undo_if_unfinished,
    unpin,
)
from unihook.errors import HookReturnTypeError

from . import NAME
from ._forward import Access, new_id

Hook = Callable[..., Any]
Cell = nn.Cell
_CELL_CALL: Callable[..., Any] = Cell.__call__  # (this module wraps it only later)

_lock = RegistryLock()  # (a finalizer removing a hook meanwhile waits for it)
_ids = count()
_pre: dict[int, tuple[Hook, bool]] = {}
_post: dict[int, tuple[Hook, bool, bool]] = {}  # hook, with_kwargs, always_call


class _Backward:
    """One global backward state's dispatchers and the cells they are pinned in. A removed
    state's stay pinned until its calls in flight end (``unihook._module_backward``), beside a
    newer state's: each goes with its own pins."""

    __slots__ = ("hooks", "pins", "state")

    def __init__(self, pre: Hook, post: Hook) -> None:
        self.hooks = (("_forward_pre_hook", pre), ("_forward_hook", post))
        self.state: Any = getattr(pre, "__self__", None)  # the ModuleBackward (see `_call`)
        self.pins: WeakIdentityKeys[Pinned] = WeakIdentityKeys()


_backward: _Backward | None = None  # the current global state's
# cell -> [pre key, post key, the _Backward pinned in it]: None where none is
_installed: WeakIdentityKeys[list[Any]] = WeakIdentityKeys()


# MindSpore reads a hook's with_kwargs flag live, after it took its snapshot of the hooks: a
# dispatcher another thread unpins meanwhile (the last global hook removed; or a call that
# entered `Cell.__call__` before the wrapper, not counted in `_in_call`) is called without
# kwargs, its flag gone. It is out: the call runs no global hook there, as one that read the
# hooks after the removal (the call's kwargs are not known to give them).


def _run_pre(cell: Any, args: tuple[Any, ...], *flagged: dict[str, Any]) -> Any:
    if not flagged:
        return None
    kwargs = flagged[0]
    changed = False
    for hook, with_kwargs in tuple(_pre.values()):
        if with_kwargs:
            result = hook(cell, args, kwargs)
            if result is not None:
                args, kwargs = check_pre_kwargs_result(
                    result, Site.of("module_forward_pre", NAME, cell)
                )
                changed = True
        else:
            result = hook(cell, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
                changed = True
    return (args, kwargs) if changed else None


def _run_post(cell: Any, args: tuple[Any, ...], *flagged: Any) -> Any:
    if len(flagged) != 2:
        return None
    kwargs, output = flagged
    changed = False
    # MindSpore calls an always_call hook from inside its `except Exception:` around construct:
    # then only the global always_call hooks run
    raising = output is None and sys.exc_info()[0] is not None
    for hook, with_kwargs, always in tuple(_post.values()):
        if raising and not always:
            continue
        result = hook(cell, args, kwargs, output) if with_kwargs else hook(cell, args, output)
        if result is not None:
            output = result
            changed = True
    return output if changed else None


def _ensure(cell: Any) -> None:
    """Give `cell` the global dispatchers it lacks; keep the forward ones first."""
    entry = _installed.get(cell)
    if (
        entry is None
        or (_pre and entry[0] is None)
        or (_post and entry[1] is None)
        or (_backward is not None and entry[2] is not _backward)
    ):
        # Under the lock, checked again: a removal stripping every cell meanwhile (another
        # thread) would miss a dispatcher pinned after it looked, left for ever, and pinned
        # again (run twice) by the next registration.
        with _lock, _lock.mutex:
            entry = _install(cell)
    for slot, attr in ((0, "_forward_pre_hook"), (1, "_forward_hook")):
        key = entry[slot]
        if key is None:
            continue
        hooks = Access.get(cell, attr)
        if hooks is not None and _first_key(hooks) != key:
            if key in hooks:  # a hook prepended since: globals go first
                try:
                    hooks.move_to_end(key, last=False)
                    continue
                except KeyError:  # in its origin only (a pin a Ctrl-C cut short), or gone
                    pass
            # a library assigned the cell a new hook dict: torch's global hooks live outside a
            # module's, and survive that; and a pin cut short is finished
            with _lock, _lock.mutex:
                # (unless they went meanwhile: a removal on another thread took the key)
                hooks = Access.get(cell, attr)
                if entry[slot] == key and not OrderedDict.__contains__(hooks, key):
                    _pin_forward(cell, slot, key)


def _first_key(hooks: Any) -> Any:
    while True:
        try:
            return next(iter(hooks), None)
        except RuntimeError:  # changed meanwhile (another thread removed a hook): again
            continue


def _install(cell: Any) -> list[Any]:
    """`_ensure`'s pinning, under `_lock`."""
    entry = _installed.get(cell)
    if entry is None:
        entry = _installed[cell] = [None, None, None]
    # (a shallow copy of a cell they are pinned in shares its dicts: they serve it too)
    if _pre and entry[0] is None:
        shared = pinned_key(cell, "_forward_pre_hook", _run_pre, Access)
        entry[0] = new_key(new_id, Access, cell, *_KEYED) if shared is None else shared
        if shared is None:
            _pin_forward(cell, 0, entry[0])
    if _post and entry[1] is None:
        waiting = _waiting.pop(id(cell), None)
        shared = pinned_key(cell, "_forward_hook", _run_post, Access)
        if waiting is not None:  # still pinned, its removal waiting for a call's end
            entry[1] = waiting[1]
        else:
            entry[1] = new_key(new_id, Access, cell, *_KEYED) if shared is None else shared
            if shared is None:
                _pin_forward(cell, 1, entry[1])
    # Installed beside the cell's own backward dispatchers too: whichever runs first in a call
    # takes the global hooks (unihook._module_backward). Taking them out while own ones exist
    # lost calls: another thread removing the cell's last own hook between this check and the
    # call's hooks left the call with neither.
    backward = _backward
    if backward is not None and entry[2] is not backward:
        if cell not in backward.pins:
            always = "_forward_hook_always_called"
            backward.pins[cell] = Pinned.find(cell, backward.hooks, always, Access) or (
                Pinned.install(
                    cell,
                    backward.hooks,
                    always,
                    new_id,
                    Access,
                    tail=True,  # after the cell's own ones, which take the globals when present
                    flags=_KEYED,
                )
            )
        entry[2] = backward
    return entry


def _pin_forward(cell: Any, slot: int, key: int) -> None:
    """Pin the global forward dispatcher `slot` (0 pre, 1 post) first in `cell`'s dict."""
    # (a deep copy of the cell goes without it: `_ensure` pins the copy's own at its first call,
    # which else fired the global hooks twice there, and kept one after their removal)
    attr, flags = _SLOTS[slot]
    run = _run_pre if slot == 0 else _run_post
    pin(cell, attr, key, run, Access, last=False, prepend=True, flags=flags, copied=False)


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    # The call is in flight from here (before `_ensure` reads the global backward state): a
    # removal of the global backward hooks by another thread meanwhile leaves their
    # dispatchers pinned for it (a hook registered then goes back into their state), where the
    # cell's hook dicts, read by MindSpore below, would else hold neither the removed ones nor
    # the new ones (see `ModuleBackward.hold`).
    backward = _backward
    state = None if backward is None else backward.state
    mark = None if state is None else state.hold()
    try:
        return _held_call(self, args, kwargs)
    finally:
        if state is not None and mark is not None:
            state.let_go(mark)


def _held_call(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _ensure(self)
    key = id(self)
    mark = object()  # this call's, in `_in_call` while it runs
    try:
        # (counted inside the try: a Ctrl-C landing right after would leave it counted for
        # ever, the cell held and its waiting dispatcher pinned)
        with _in_call_lock:
            entry = _in_call.get(key)
            if entry is None:
                _in_call[key] = [self, mark]
            else:
                entry.append(mark)
        # MindSpore's own, read at import: another thread may have put it back since this
        # call entered the wrapper
        return _CELL_CALL(self, *args, **kwargs)
    finally:
        try:
            left = _uncount(key, mark)
        except KeyboardInterrupt:  # (a Ctrl-C here would leave the call counted for ever)
            _uncount(key, mark)
            raise
        if left and key in _waiting:
            _left(self)


def _uncount(key: int, mark: object) -> bool:
    """The call `mark` of the cell `key` is over (idempotent); whether none is left."""
    with _in_call_lock:
        entry = _in_call.get(key)
        if entry is not None:
            for k in range(len(entry) - 1, 0, -1):
                if entry[k] is mark:
                    del entry[k]
                    break
            if len(entry) == 1:
                del _in_call[key]
        return key not in _in_call


# The code of the functions that run one cell call: MindSpore's `Cell.__call__` (this module is
# imported before it wraps it) and the wrapper. A frame of either means a call is in flight.
CALL_CODES = frozenset({_CELL_CALL.__code__, _call.__code__})


_POST_FLAGS = ("_forward_hook_with_kwargs", "_forward_hook_always_called")
_SLOTS = (("_forward_pre_hook", ("_forward_pre_hook_with_kwargs",)), ("_forward_hook", _POST_FLAGS))
# a cell's hook dicts and flag tables, whose keys a new id avoids (`new_key`)
_KEYED = tuple(name for attr, flags in _SLOTS for name in (attr, *flags))
# The cells in a call (the wrapper counts them, by id: alive while counted). MindSpore reads
# a cell's forward hooks after construct, as torch reads its global ones: a cell's global post
# dispatcher stays until its calls end (`_waiting`: id -> cell, key), so that a global forward
# hook registered during a call, after the last one was removed there, fires for it.
_in_call: dict[int, list[Any]] = {}  # id -> [the cell, a mark per call in flight]
_in_call_lock = threading.Lock()
_waiting: dict[int, tuple[Any, int]] = {}


def _unpin_slot(cell: Any, which: int, key: int) -> None:
    attr, flags = _SLOTS[which]
    unpin(cell, attr, key, Access, flags=flags)


def _strip(which: int) -> None:
    """Take forward dispatcher slot `which` (0 pre, 1 post) out of every cell, a post one
    out of a cell in a call once its calls end; a slot is forgotten only once out (a run a
    Ctrl-C cut short is finished by the next)."""
    cells = list(_installed.items())
    # (a shallow copy shares its original's dicts, and so the key: it stays for a call of
    # either in flight, whose end takes it out)
    kept = {entry[1] for cell, entry in cells if id(cell) in _in_call} if which == 1 else set()
    for cell, entry in cells:
        key = entry[which]
        if key is None:
            continue
        if which == 1 and id(cell) in _in_call:
            _waiting[id(cell)] = (cell, key)
        elif key not in kept:
            _unpin_slot(cell, which, key)
        entry[which] = None


def _left(cell: Any) -> None:
    """A cell's last call in flight ended: its waiting post dispatcher goes, unless global
    forward hooks came back meanwhile (then it stays, the cell's again)."""
    with _lock, _lock.mutex:
        found = _waiting.pop(id(cell), None)
        if found is None or id(cell) in _in_call:
            if found is not None:
                _waiting[id(cell)] = found
            return
        entry = _installed.get(cell)
        if _post and entry is not None and entry[1] is None:
            entry[1] = found[1]
        else:
            _unpin_slot(cell, 1, found[1])


def _unpin_backward(backward: _Backward) -> None:
    """Take `backward`'s dispatchers out of every cell (a run a Ctrl-C cut short is finished
    by the next); the cells' entries let go of it (it holds the state, and so its hooks)."""
    for cell, pinned in list(backward.pins.items()):
        pinned.remove()
        backward.pins.pop(cell, None)
    for entry in list(_installed.values()):
        if entry[2] is backward:
            entry[2] = None


def _sync() -> None:
    """Make the cells and ``Cell.__call__`` match the global hooks. Read from the class: a run
    a Ctrl-C cut short is finished by the next."""
    if not _pre:
        _strip(0)
    if not _post:
        _strip(1)
    else:
        # MindSpore reads a cell's forward hooks after construct, as torch its global ones: a
        # cell in a call (on any thread) gets the post dispatcher now, to run for that call
        for cell, *_ in list(_in_call.values()):
            entry = _installed.get(cell)
            if entry is None or entry[1] is None:
                _install(cell)
    wanted = bool(_pre or _post or _backward is not None)
    patched = Cell.__dict__.get("__call__") is _call
    if wanted and not patched:
        Cell.__call__ = _call
    elif not wanted:
        if patched:
            Cell.__call__ = _CELL_CALL  # type: ignore[method-assign]
        _installed.clear()


def add_backward_dispatchers(pre: Hook, post: Hook) -> Callable[[], None]:
    """Pin a global backward state's dispatchers in every cell called from now on; the
    remover takes them out of every cell (its state calls it once its calls in flight end)."""
    global _backward
    backward = _Backward(pre, post)

    def remove() -> None:
        # idempotent: also undoes an installation cut short (a Ctrl-C, see unihook._locks)
        global _backward
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            if _backward is backward:  # (else newer global hooks came meanwhile)
                _backward = None
            _unpin_backward(backward)
            _sync()

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        _backward = backward
        _sync()
    return remove


def _add_forward(table: dict[int, Any], value: Any) -> Callable[[], None]:
    key = next(_ids)

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            table.pop(key, None)
            _sync()

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        table[key] = value
        _sync()
    return remove


# -- registration hooks --

_registration: dict[str, dict[int, Hook]] = {"parameter": {}, "module": {}}
# MindSpore's own, as found when patched; kept after the patch goes: a thread inside a patched
# one while another removes the last hook still calls them
_originals: dict[str, Callable[..., Any]] = {}


def _insert_param(self: Any, param_name: str, param: Any, *args: Any, **kwargs: Any) -> Any:
    if param is not None:
        for hook in tuple(_registration["parameter"].values()):
            result = hook(self, param_name, param)
            if result is not None:
                param = result
        if not isinstance(param, mindspore.Parameter):
            # torch registers the plain tensor a hook returns; insert_param_to_cell takes only
            # Parameters (TypeError): wrap it, trainable as torch's nn.Parameter would be
            param = mindspore.Parameter(param, name=param_name)
    return _originals["parameter"](self, param_name, param, *args, **kwargs)


def _insert_child(self: Any, child_name: str, child: Any) -> Any:
    if child is not None:
        for hook in tuple(_registration["module"].values()):
            result = hook(self, child_name, child)
            if result is not None:
                child = result
    return _originals["module"](self, child_name, child)


_PATCHES = {
    "parameter": ("insert_param_to_cell", _insert_param),
    "module": ("insert_child_to_cell", _insert_child),
}

_REGISTRABLE = {
    "parameter_registration": (mindspore.Tensor, "a mindspore.Parameter (or mindspore.Tensor)"),
    "buffer_registration": (mindspore.Tensor, "a mindspore.Tensor"),
    "module_registration": (Cell, "a mindspore.nn.Cell"),
}


def _checked(kind: str, hook: Hook) -> Hook:
    """MindSpore would file whatever a registration hook returns: raise TypeError as torch's
    own registration paths do."""
    wanted, what = _REGISTRABLE[kind]

    def registration_hook(cell: Any, name: str, value: Any) -> Any:
        result = hook(cell, name, value)
        if result is None or isinstance(result, wanted):
            return result
        raise Site.of(global_label(kind), NAME, cell).error(
            HookReturnTypeError, f"None or {what} to register as {name!r}", show_value(result)
        )

    return registration_hook


def _add_registration(kind: str, hook: Hook) -> Callable[[], None]:
    checked = _checked(kind, hook)
    if kind == "buffer_registration":
        # as MindSpore's `register_cell_buffer_registration_hook`, in a table its loop reads a
        # snapshot of (another thread's registration would stop a loop mid-way: see there)
        return add_to_global_table(
            cell_module,
            "_global_buffer_registration_hooks",
            checked,
            lambda table: new_id(),
        )
    what = kind.split("_")[0]
    key = next(_ids)

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        if _lock.deferred(remove):
            return
        with _lock, _lock.mutex:
            _registration[what].pop(key, None)
            _sync_patch(what)

    undo_if_unfinished(remove)
    with _lock, _lock.mutex:
        _registration[what][key] = checked
        _sync_patch(what)
    return remove


def _sync_patch(what: str) -> None:
    """Patch `what`'s Cell method while a hook of it exists. Read from the class: a run a
    Ctrl-C cut short is finished by the next."""
    method, patched = _PATCHES[what]
    installed = Cell.__dict__.get(method) is patched
    if _registration[what] and not installed:
        _originals[what] = getattr(Cell, method)
        setattr(Cell, method, patched)
    elif not _registration[what] and installed:
        setattr(Cell, method, _originals[what])


def add(kind: str, hook: Hook, with_kwargs: bool, always_call: bool) -> Callable[[], None]:
    """Install a global hook of `kind`; return its remover."""
    if kind == "forward_pre":
        return _add_forward(_pre, (hook, with_kwargs))
    if kind == "forward":
        return _add_forward(_post, (hook, with_kwargs, always_call))
    if kind in ("full_backward_pre", "full_backward"):
        from ._backward import add_global

        return add_global(kind, hook)
    return _add_registration(kind, hook)
