"""unihook's hook dicts beside changes it does not make under its lock: another thread's native
registration, a finalizer's removal (helper-158's FINDING 6, seen under stress only: these
make the change land at the one step each failed at)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

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


def _native(framework: str) -> tuple[Any, str, Callable[[Any, Any], int]]:
    """A layer of `framework`, the attribute of its forward hook dict, and a native
    registration's first step: the framework's handle made on a dict it read, its id."""
    if framework == "torch":
        from torch.utils.hooks import RemovableHandle

        return torch.nn.Linear(2, 2), "_forward_hooks", lambda d, _: RemovableHandle(d).id
    paddle = pytest.importorskip("paddle")
    from paddle.nn.layer.layers import HookRemoveHelper

    layer = paddle.nn.Linear(2, 2)
    return layer, "_forward_post_hooks", lambda d, _: HookRemoveHelper(d)._hook_id


def _input(framework: str) -> Any:
    if framework == "torch":
        return torch.ones(1, 2)
    return pytest.importorskip("paddle").ones([1, 2])


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_native_hook_removed_and_another_added_behind_unihooks_dict_are_followed(
    framework: str,
) -> None:
    """helper-160's FINDING 4 (a native hook firing twice per call under threads): a native
    handle made before unihook took the dict over removes its hook from the dict it holds,
    and a registration that read that dict just before the take-over inserts there. The
    number of hooks is the same: until 2026-12-06 the removed hook kept running and the
    added one never ran; torch runs the added one only."""
    layer, attr, handle_on = _native(framework)
    seen: list[str] = []
    register = (
        layer.register_forward_hook if framework == "torch" else layer.register_forward_post_hook
    )
    old = register(lambda *a: seen.append("removed"))
    origin = getattr(layer, attr)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        assert isinstance(getattr(layer, attr), HookDict)
        old.remove()  # (from the dict it was made on)
        key = handle_on(origin, None)
        origin[key] = lambda *a: seen.append("added")  # (the racing registration's insert)
        layer(_input(framework))
        assert seen == ["added"]
        seen.clear()
        register(lambda *a: seen.append("later"))
        layer(_input(framework))
        assert seen == ["added", "later"]
    finally:
        backward.remove()
    seen.clear()
    layer(_input(framework))
    assert seen == ["added", "later"]


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_prepend_whose_insert_went_to_the_dict_unihook_took_over_moves_it(
    framework: str,
) -> None:
    """A registration with prepend reads the hook dict three times (handle, insert, move): an
    insert into the dict unihook took over just after, then the move in unihook's, raised
    KeyError from the registration until 2026-12-06, the hook left last."""
    layer, attr, handle_on = _native(framework)
    seen: list[str] = []
    origin = getattr(layer, attr)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    forward = unihook.register_forward_hook(layer, lambda *a: seen.append("unihook"))
    try:
        key = handle_on(origin, None)
        origin[key] = lambda *a: seen.append("prepended")
        getattr(layer, attr).move_to_end(key, last=False)
        layer(_input(framework))
        assert seen == ["prepended", "unihook"]
    finally:
        forward.remove()
        backward.remove()
    assert getattr(layer, attr) is origin and list(origin) == [key]
