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
