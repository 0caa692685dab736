"""What lands inside unihook's own code: a finalizer (the garbage collector runs anywhere),
a Ctrl-C (delivered at a Python function's entry; simulated with a trace function)."""

from __future__ import annotations

import gc
import sys
from typing import Any

import pytest
import torch

import unihook


def test_global_backward_hook_removed_after_the_call_took_it() -> None:
    # torch: removed inside unihook's ``Module._call_impl`` wrapper after the global
    # dispatchers took the call: as torch takes a call's hooks when it starts, it still fires
    original = torch.nn.Module._call_impl
    fired: list[str] = []
    handle = unihook.register_module_full_backward_hook(
        lambda *args: fired.append("hook"), backend="torch"
    )
    removed: list[bool] = []

    def collect(phase: str, info: Any) -> None:
        if phase != "start" or removed:
            return
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code.co_name == "_call_original":  # between the dispatchers and torch
                removed.append(True)
                handle.remove()
                return
            frame = frame.f_back

    model = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2, requires_grad=True)
    threshold = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(collect)
    gc.set_threshold(1)
    try:
        out = model(x)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collect)
    out.sum().backward()
    assert removed and fired == ["hook"]
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert torch.nn.Module._call_impl is original  # the call over, the wrapper went


@pytest.mark.parametrize("where", ["backward", "ran", "pruned", "building_graph"])
def test_ctrl_c_in_unihook_paddle_backward_is_a_keyboard_interrupt(where: str) -> None:
    # paddle wraps what a PyLayer's backward raises in an OSError; in a user's hook the error
    # keeps its type, and so does a Ctrl-C that lands in unihook's code around it
    paddle = pytest.importorskip("paddle")
    layer = paddle.nn.Linear(2, 2)
    x = paddle.ones([1, 2])
    x.stop_gradient = False
    handle = unihook.register_full_backward_hook(layer, lambda *args: None)
    out = layer(x).sum()

    def interrupt(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and code.co_name == where and "unihook_paddle" in code.co_filename:
            sys.settrace(None)
            raise KeyboardInterrupt
        return None

    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            out.backward()
    finally:
        sys.settrace(None)
        handle.remove()


@pytest.mark.parametrize(
    ("where", "nth"), [("pin", 1), ("pin", 2), ("_changed", 1), ("_changed", 5)]
)
def test_ctrl_c_while_torch_pins_the_global_dispatchers(where: str, nth: int) -> None:
    # a module with a pre-hook gets the global backward dispatchers pinned in its own dicts
    # during its first call: a Ctrl-C half-way leaves nothing half-installed (the next call
    # fired the global hook twice for the module, and hooks stayed after every removal)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    fired: list[str] = []

    def double(module: Any, grad_input: Any, grad_output: Any) -> Any:
        fired.append(type(module).__name__)
        return tuple(None if g is None else g * 2 for g in grad_input)

    handles = [
        unihook.register_forward_pre_hook(model[2], lambda *args: None),
        unihook.register_module_full_backward_hook(double, backend="torch"),
    ]
    x = torch.ones(1, 2, requires_grad=True)
    entries = [0]

    def interrupt(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and code.co_name == where and "/unihook/" in code.co_filename:
            entries[0] += 1
            if entries[0] == nth:
                sys.settrace(None)
                raise KeyboardInterrupt
        return None

    sys.settrace(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            model(x).sum().backward()
    finally:
        sys.settrace(None)
    fired.clear()
    x.grad = None
    model(x).sum().backward()
    assert sorted(fired) == ["Linear", "Linear", "ReLU", "Sequential"]
    for handle in handles:
        handle.remove()
    for module in model.modules():
        assert not (module._forward_pre_hooks or module._forward_hooks)
        assert not module._forward_hooks_always_called
