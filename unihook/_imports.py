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

__all__ = ["cancel_when_imported", "install_when_imported", "when_imported"]

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()
_searching: set[str] = set()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Call `callback(module)` now if top-level module `name` is imported, else right after it
    is. Return a function that cancels a callback that has not run yet:
    ``cancel_when_imported(name, callback)``, which a caller may take before (a Ctrl-C may land
    between the registration and its return)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return _nothing
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    return partial(cancel_when_imported, name, callback)


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
    for callback in pending:
        callback(module)


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
