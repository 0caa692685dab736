"""torch: a finalizer (the garbage collector runs anywhere) removing the last global backward
hook inside unihook's ``Module._call_impl`` wrapper, after the global dispatchers took the
call: as torch takes a call's hooks when it starts, the hook still fires for that call."""

from __future__ import annotations

import gc
import sys
from typing import Any

import torch

import unihook


def test_global_backward_hook_removed_after_the_call_took_it() -> None:
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
