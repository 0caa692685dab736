"""The plugin manager: built lazily, once, from the ``unihook`` entry-point group."""

from __future__ import annotations

import os
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ._identity import WeakIdentityKeys

if TYPE_CHECKING:
    import pluggy

__all__ = [
    "DISABLE_ENV",
    "ESCAPED",
    "add_compiler_escape",
    "call_owner",
    "disabled_backends",
    "escaped",
    "outside_compilers",
    "plugin_manager",
]

T = TypeVar("T")

#: Comma-separated backend names (entry-point names) that unihook must not load.
DISABLE_ENV = "UNIHOOK_DISABLE"
ENTRY_POINT_GROUP = "unihook"

_pm: pluggy.PluginManager | None = None
_lock = threading.Lock()


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager with every backend of the entry-point group loaded."""
    pm = _pm
    if pm is None:
        pm = _load()
    return pm


def _load() -> pluggy.PluginManager:
    with _lock:
        return _pm if _pm is not None else _build()


# The first use of unihook in a process may come inside a function a compiler traces, before
# any backend could add its escape (`add_compiler_escape`). torch.compile's dynamo reads these
# marks on a function it would trace (as on a `torch._dynamo.disable` wrapper): it calls
# `_load` with a graph break, and where it cannot break the graph (fullgraph=True) its error
# gives this reason instead of "does not know how to enter a lock".
_load._torchdynamo_disable = True  # type: ignore[attr-defined]
_load._torchdynamo_disable_msg = (  # type: ignore[attr-defined]
    "unihook loads its backends (the `unihook` entry points) at its first use in a process, "
    "outside the compiler, with a graph break: torch.compile(fullgraph=True) cannot take that; "
    "call unihook.backends() once before calling the compiled function"
)


def _build() -> pluggy.PluginManager:
    # pluggy (and importlib.metadata under it) loads on first use: `import unihook` stays cheap.
    import pluggy

    from . import spec

    global _pm
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(spec)
    for name in disabled_backends():
        pm.set_blocked(name)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    _pm = pm
    return pm


def disabled_backends() -> list[str]:
    """The backend names that UNIHOOK_DISABLE lists (what messages say was left out)."""
    return [name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()]


# hook name -> type of target -> the hookimpl that answered for it
_owners: dict[str, WeakIdentityKeys[Any]] = {}


def call_owner(hook_name: str, target: object, **kwargs: Any) -> Any:
    """Call the firstresult hook `hook_name` as pluggy does (the last registered plugin first,
    the first non-None result wins), remembering which plugin answered for this type of
    target: ownership goes by type, so later calls for the type go straight to that plugin,
    without pluggy's dispatch (about 4.5 us of a registration)."""
    owners = _owners.get(hook_name)
    if owners is None:
        owners = _owners.setdefault(hook_name, WeakIdentityKeys())
    impl = owners.get(type(target))
    if impl is not None:
        result = impl.function(*[kwargs[arg] for arg in impl.argnames])
        if result is not None:
            return result
    caller = getattr(plugin_manager().hook, hook_name)
    impls = caller.get_hookimpls()
    if any(i.hookwrapper or i.wrapper for i in impls):
        return caller(**kwargs)  # wrappers change the call: leave it to pluggy
    for impl in reversed(impls):
        result = impl.function(*[kwargs[arg] for arg in impl.argnames])
        if result is not None:
            owners[type(target)] = impl
            return result
    return None


# Each backend's escape from its framework's compiler, and whether that compiler traces
# Python now (`add_compiler_escape`).
_escapes: list[tuple[Callable[[Callable[[], Any], str], Any], Callable[[], bool]]] = []

#: What runs through the escapes (`outside_compilers`), named for the error a compiler that
#: cannot take a graph break (torch.compile's fullgraph=True) raises there.
ESCAPED = ("registration", "removal", "backends")


def add_compiler_escape(
    escape: Callable[[Callable[[], T], str], T], tracing: Callable[[], bool]
) -> None:
    """Make registrations of global hooks, removals of hooks and `unihook.backends()` run
    through `escape` while `tracing()` (cheap: it runs at every removal) says the backend's
    framework compiler traces Python now (torch.compile's dynamo): `escape(call, doing)`
    returns `call()`, run outside that compiler. `doing` is one of `ESCAPED`
    ("registration", "removal", "backends"): what the error says where the compiler cannot
    leave its graph there (torch.compile(fullgraph=True)). A registration made inside a
    compiled function is no part of its graph: traced, it would read the installed packages'
    metadata at trace time and change process-wide state as a traced side effect. Called by a
    backend when it is loaded; once per escape."""
    if all(escape is not known for known, _ in _escapes):
        _escapes.append((escape, tracing))


def outside_compilers(doing: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` through every backend's escape (`add_compiler_escape`); `doing`
    is one of `ESCAPED`."""
    plugin_manager()  # (the backends add their escapes when loaded)
    return escaped(doing, partial(fn, *args, **kwargs))


def escaped(doing: str, call: Callable[[], T]) -> T:
    """`call()` through the escapes of the backends loaded so far whose compiler traces now (a
    hook's removal: its backend is loaded)."""
    for escape, tracing in _escapes:
        if tracing():
            call = partial(escape, call, doing)
    return call()


def _reset() -> None:
    """Forget the manager so the next call reloads the entry points (tests only)."""
    global _pm
    with _lock:
        _pm = None
        _owners.clear()
