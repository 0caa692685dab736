"""unihook's hook dicts beside changes it does not make under its lock: another thread's native
registration, a finalizer's removal (helper-158's FINDING 6, seen under stress only: these
make the change land at the one step each failed at)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

import unihook
from unihook._pinned import HookDict

torch = pytest.importorskip("torch")


def test_a_key_gone_while_unihooks_last_hook_leaves_is_left_out() -> None:
    """The last unihook hook leaving a module's forward hook dict turns each key into a
    forwarder; a key removed between its look at the keys and that step (another thread, a
    finalizer) failed the removal with KeyError."""
    module = torch.nn.Linear(2, 2)
    seen: list[str] = []
    native = module.register_forward_hook(lambda *a: seen.append("native"))
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    hooks = module._forward_hooks
    assert isinstance(hooks, HookDict)
    stale = HookDict._copy(hooks)

    def copy_then_remove() -> tuple[tuple[int, Any], ...]:
        OrderedDict.pop(hooks, native.id, None)  # (gone after the look)
        return stale

    hooks._copy = copy_then_remove  # type: ignore[method-assign]
    handle.remove()
    assert type(module._forward_hooks) is OrderedDict
    module(torch.ones(1, 2))
    native.remove()
    assert not module._forward_hooks


class _ChangedWhileRead(OrderedDict):  # type: ignore[type-arg]
    """A dict another thread changes the first time it is read whole."""

    def items(self) -> Any:
        if not getattr(self, "changed", False):
            self.changed = True
            raise RuntimeError("OrderedDict mutated during iteration")
        return super().items()


def test_a_dict_changed_while_unihook_takes_it_over_is_read_again() -> None:
    module = torch.nn.Linear(2, 2)
    hooks = _ChangedWhileRead()
    hooks[7] = lambda *a: None
    module._forward_hooks = hooks
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    try:
        assert 7 in module._forward_hooks
    finally:
        handle.remove()
