"""unihook's retired hook dicts (`unihook._pinned`): the ones it keeps parked for the native
handles that refer to them are bounded by those handles, not by the scopes a loop runs."""

from __future__ import annotations

import gc
from typing import Any

import unihook
from unihook import _pinned

W = [[1.0, 2.0, 3.0], [-4.0, -5.0, -6.0]]
B = [1.0, 2.0]
X = [[1.0, -1.0, 2.0]]


def _step(kit: Any, module: Any) -> None:
    x = kit.tensor(X, requires_grad=True)
    kit.backward(module(x).sum())


def test_retired_dicts_do_not_pile_up_where_hooks_come_and_go(backend: Any) -> None:
    """A loop of scopes, each a backward hook and a forward hook (a native handle through
    unihook's dict), removed: unihook keeps at most the retired dicts whose handles live, for
    the removals they forward, not one per scope."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    for _ in range(30):
        handles = [
            unihook.register_full_backward_hook(module, lambda m, gi, go: None),
            unihook.register_forward_hook(module, lambda m, args, out: None),
        ]
        _step(kit, module)
        for handle in handles:
            handle.remove()
        del handles
    gc.collect()
    # (this module's dicts' entries: other tests' modules may keep theirs)
    entries = [_pinned._retired.get(id(d)) for d in kit.hook_dicts(module).values()]
    parked = sum(len(entry[1]) for entry in entries if entry is not None)
    assert parked <= 2
    assert kit.hook_counts(module) == kit.hook_counts(kit.linear(3, 2, W, B))
