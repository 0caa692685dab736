"""Run code when a framework gets imported, without importing it (a post-import hook)."""

from __future__ import annotations

import sys
import threading
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, cast

from ._locks import undo_if_unfinished

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["cancel_when_imported", "imported", "install_when_imported", "when_imported"]

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()
_searching: set[str] = set()


def imported(name: str) -> ModuleType | None:
    """Module `name` if its import has finished, else None. While another thread imports it
    (torch._dynamo's import takes seconds) it is in ``sys.modules`` already, without most of
    its attributes (helper-96's FINDING 4: a registration there raised AttributeError). Inside
    the callbacks of its import (`when_imported`), on their thread, it is imported."""
    module = sys.modules.get(name)
    if module is None or (_importing(module) and id(module) not in _firing_here()):
        return None
    return module


def _firing_here() -> set[int]:
    """The modules (ids) whose callbacks this thread runs (`_fire`)."""
    firing: set[int] | None = getattr(_firing, "ids", None)
    if firing is None:
        firing = _firing.ids = set()
    return firing


_firing = threading.local()


def _importing(module: Any) -> bool:
    try:  # (a `sys.modules` entry's attributes may run any code: helper-102's FINDING 4)
        return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
    except Exception:
        return False


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Call `callback(module)` now if module `name` is imported, else right after it is (at
    the end of an import under way on another thread, too: before that import returns and
    `imported` gives the module, as for one that starts later). Return a function that
    cancels a callback that has not run yet: ``cancel_when_imported(name, callback)``, which a
    caller may take before (a Ctrl-C may land between the registration and its return)."""
    module = sys.modules.get(name)
    if module is not None and not _importing(module):
        callback(module)
        return _nothing
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    if module is not None:
        _fire_at_end(name, module)
    return partial(cancel_when_imported, name, callback)


def _fire_at_end(name: str, module: ModuleType) -> None:
    """Fire `name`'s callbacks as the import of `module`, under way, ends: our finder did not
    see it begin, so its loader is not ours (`_Loader`). Python's import marks its spec
    ``_initializing = False`` as the module's code has run (failed or not: a failed one has
    left ``sys.modules``), on the importing thread, before the import returns: the spec's
    class gets an attribute setter that fires there, before the mark (`_end_setattr`). Already
    over: fired here. A spec whose class takes no other (not a ModuleSpec): fired now, on the
    module as it is, as before 2026-12-02."""
    spec = module.__spec__
    watched = True
    with _lock:
        _ending_names.setdefault(id(spec), set()).add(name)
        kind = type(spec)
        if kind.__setattr__ is not _end_setattr:
            try:
                spec.__class__ = _ending_class(kind)
            except TypeError:  # (a spec type of C, or one that takes no subclass)
                watched = False
    if not watched or not _importing(module):  # (over before the setter went in, or since)
        _restore_class(spec)
        _fire_names(spec)


def _end_setattr(spec: Any, attr: str, value: Any) -> None:
    base: Any = type(spec).__bases__[0]
    if attr != "_initializing" or value:
        base.__setattr__(spec, attr, value)  # (the spec class's own)
        return
    try:
        _restore_class(spec)
        _fire_names(spec)
    finally:
        with _lock:
            # a callback asked for meanwhile (by one of these, or on another thread) swapped
            # the class again: fired now, after the mark (until 2026-12-02 never: helper-103's
            # FINDING 3); one asked for after this takes the module for imported
            again = type(spec).__setattr__ is _end_setattr
            _restore_class(spec)
            base.__setattr__(spec, attr, value)
        if again:
            _fire_names(spec)


def _fire_names(spec: Any) -> None:
    """Fire the callbacks of the names whose import `spec` made, under whatever `sys.modules`
    holds for each (the module may have put another object there, or be there under a second
    name: helper-102's FINDING 1); none for a name it left (a failed import), nor for one a
    callback of another name took out meanwhile (until 2026-12-02 a KeyError out of the
    import: helper-104's FINDING 4); its callbacks wait for its next import."""
    with _lock:
        names = _ending_names.pop(id(spec), set())
    _each(_fire_present, sorted(names))


def _fire_present(name: str) -> None:
    module = sys.modules.get(name)
    if module is not None:
        _fire(name, module)


def _each(call: Callable[[Any], None], items: list[Any]) -> None:
    """`call(item)` for every item, also after one raised; then the first error raises (a
    callback's error left the others waiting for good: helper-103's FINDING 4)."""
    failed: BaseException | None = None
    for item in items:
        try:
            call(item)
        except BaseException as error:
            failed = failed or error
    if failed is not None:
        raise failed


def _restore_class(spec: Any) -> None:
    kind = type(spec)
    if kind.__setattr__ is _end_setattr:
        spec.__class__ = kind.__bases__[0]


def _reduce_as_base(spec: Any, protocol: Any) -> Any:
    """Pickled (and copied) as the spec class it stands for (helper-102's FINDING 3)."""
    import copyreg

    rebuild = copyreg._reconstructor  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]
    return rebuild, (type(spec).__bases__[0], object, None), dict(vars(spec))


def _ending_class(kind: type) -> type:
    """`kind` (``ModuleSpec``) with `_end_setattr`: no attribute of its own (a class an
    instance can take and give back)."""
    made = _ending.get(kind)
    if made is None:
        made = _ending[kind] = type(
            kind.__name__,
            (kind,),
            {"__slots__": (), "__setattr__": _end_setattr, "__reduce_ex__": _reduce_as_base},
        )
    return made


_ending: dict[type, type] = {}
# the names asked for while an import under way runs, by its spec's id (`_fire_names`)
_ending_names: dict[int, set[str]] = {}


def cancel_when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Cancel `callback` if it waits for `name` (one entry of it); no import hook is left
    when none waits. Idempotent for a callback given once."""
    with _lock:
        pending = _callbacks.get(name, [])
        if callback in pending:
            pending.remove(callback)
        if not pending:
            _callbacks.pop(name, None)
        if not _callbacks and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


def _nothing() -> None:
    return None


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        pending = _callbacks.pop(name, [])
        if not _callbacks and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
    firing = _firing_here()
    outer = id(module) in firing
    firing.add(id(module))
    try:
        _each(lambda callback: callback(module), pending)
    finally:
        if not outer:
            firing.discard(id(module))


class _Loader:
    """Delegates to the real loader; fires the callbacks once the module has executed."""

    def __init__(self, name: str, loader: Any) -> None:
        self._name = name
        self._loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class _Finder:
    """A meta path finder (the protocol needs only find_spec): wraps the named modules' loaders."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _callbacks or fullname in _searching:
            return None
        import importlib.util  # lazily: only when a watched framework gets imported

        _searching.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            _searching.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        # duck-typed: importlib.abc costs an import on `import unihook`
        spec.loader = cast("Loader", _Loader(fullname, spec.loader))
        return spec


_FINDER = _Finder()


def install_when_imported(
    name: str, install: Callable[[], Callable[[], None]]
) -> Callable[[], None]:
    """Run `install()` (which returns its own remover) now if `name` is imported, else when it
    is; return a remover that undoes it, or cancels it if it has not run yet."""
    removers: list[Callable[[], None]] = []

    def callback(_module: ModuleType) -> None:
        removers.append(install())

    def remove() -> None:
        cancel_when_imported(name, callback)
        while removers:
            removers[-1]()  # (run before it leaves the list: a removal cut short runs it again)
            removers.pop()

    undo_if_unfinished(remove)  # (`install` records its own steps too)
    when_imported(name, callback)
    return remove
