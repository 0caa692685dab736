"""A framework's flag tables (the keys of the forward hooks it calls with kwargs, or always)
beside unihook's keys: a removal deferred because this thread holds the registry lock (a
finalizer the collector ran inside a registration) took the key's flags at once and the key
only later, so that a call on another thread meanwhile ran the hook without its kwargs (a
TypeError in the framework's call). See also test_lazy_dicts_mindspore.py.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

import unihook
from unihook._pinned import _lock

X = [[1.0, -1.0, 2.0]]


def _on_thread(action: Callable[[], None]) -> list[str]:
    errors: list[str] = []

    def run() -> None:
        try:
            action()
        except Exception as error:  # the verdict, not raised on the thread
            errors.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return errors


KINDS: dict[str, Callable[[Any, Any, list[Any]], Any]] = {
    "forward_pre": lambda kit, m, seen: unihook.register_forward_pre_hook(
        m, lambda mod, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True
    ),
    "forward": lambda kit, m, seen: unihook.register_forward_hook(
        m, lambda mod, args, kwargs, out: seen.append(dict(kwargs)), with_kwargs=True
    ),
    # (their dispatchers are the framework's kwargs hooks, on MindSpore)
    "module_forward_pre": lambda kit, m, seen: unihook.register_module_forward_pre_hook(
        lambda mod, args: seen.append({"scale": 2.0}) if mod is m else None,
        backend=kit.name,
    ),
    "module_forward": lambda kit, m, seen: unihook.register_module_forward_hook(
        lambda mod, args, out: seen.append({"scale": 2.0}) if mod is m else None,
        backend=kit.name,
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_deferred_removal_keeps_the_flag_while_the_hook_stays(backend: Any, kind: str) -> None:
    kit = backend
    m = kit.module(lambda self, x, scale=1.0: x * scale)
    seen: list[Any] = []
    handle = KINDS[kind](kit, m, seen)
    m(kit.tensor(X), scale=2.0)  # (a global dispatcher goes in at a module's call)
    assert seen == [{"scale": 2.0}]
    seen.clear()
    with _lock, _lock.mutex:  # as a finalizer the collector ran inside a registration
        handle.remove()
        errors = _on_thread(lambda: m(kit.tensor(X), scale=2.0))
    assert errors == []
    # the hook ran whole, with the call's kwargs, or not at all
    assert seen in ([], [{"scale": 2.0}])
    m(kit.tensor(X), scale=2.0)
    assert seen in ([], [{"scale": 2.0}])  # removed once the lock went
    assert not any(kit.hook_counts(m).values())
