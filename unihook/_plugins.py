"""The plugin manager: built lazily, once, from the ``unihook`` entry-point group."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pluggy

__all__ = ["plugin_manager", "DISABLE_ENV"]

#: Comma-separated backend names (entry-point names) that unihook must not load.
DISABLE_ENV = "UNIHOOK_DISABLE"
ENTRY_POINT_GROUP = "unihook"

_pm: pluggy.PluginManager | None = None
_lock = threading.Lock()


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager with every backend of the entry-point group loaded."""
    pm = _pm
    if pm is None:
        with _lock:
            pm = _pm if _pm is not None else _build()
    return pm


def _build() -> pluggy.PluginManager:
    # pluggy (and importlib.metadata under it) loads on first use: `import unihook` stays cheap.
    import pluggy

    from . import spec

    global _pm
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(spec)
    for name in os.environ.get(DISABLE_ENV, "").split(","):
        if name.strip():
            pm.set_blocked(name.strip())
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    _pm = pm
    return pm


def _reset() -> None:
    """Forget the manager so the next call reloads the entry points (tests only)."""
    global _pm
    with _lock:
        _pm = None
