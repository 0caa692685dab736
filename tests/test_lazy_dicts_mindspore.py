"""MindSpore creates a cell's hook dicts and flag tables on first read, unlocked (properties
over ``_lazy_*`` attributes): a call on another thread that read None before a registration
created the dict assigned a new empty one over it when it resumed, and what the registration
had written there was gone.

CI on 599f359 (MindSpore, `test_threads`): `_run_post() missing 1 required positional argument:
'output'`, MindSpore calling unihook's global forward dispatcher without kwargs: its flag was in
the table the race dropped. A race on a hook dict lost the hooks themselves (silently). Here
deterministically: a thread paused inside the property, between its None check and its
assignment, while this thread registers and calls; every lazy dict, every registration kind.
"""

from __future__ import annotations

import linecache
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import pytest

import unihook

mindspore = pytest.importorskip("mindspore")

X = [[1.0, -1.0, 2.0]]

# -- MindSpore's lazy hook dicts and flag tables --

LAZY = (
    "_forward_pre_hook",
    "_forward_hook",
    "_forward_pre_hook_with_kwargs",
    "_forward_hook_with_kwargs",
    "_forward_hook_always_called",
    "_backward_pre_hook",
    "_backward_hook",
)

# registration -> the hook calls one forward and backward of the cell makes
KINDS: dict[str, tuple[Callable[[Any, list[str]], Any], list[str]]] = {
    "own_forward_pre_kwargs": (
        lambda cell, calls: unihook.register_forward_pre_hook(
            cell, lambda m, a, k: calls.append(f"pre{len(k)}"), with_kwargs=True
        ),
        ["pre0"],
    ),
    "own_forward_kwargs_always": (
        lambda cell, calls: unihook.register_forward_hook(
            cell,
            lambda m, a, k, o: calls.append(f"fwd{len(k)}"),
            with_kwargs=True,
            always_call=True,
        ),
        ["fwd0"],
    ),
    "own_forward_prepend": (
        lambda cell, calls: unihook.register_forward_hook(
            cell, lambda m, a, o: calls.append("fwd"), prepend=True
        ),
        ["fwd"],
    ),
    "own_full_backward": (
        lambda cell, calls: unihook.register_full_backward_hook(
            cell, lambda m, gi, go: calls.append("bwd")
        ),
        ["bwd"],
    ),
    "global_forward_pre": (
        lambda cell, calls: unihook.register_module_forward_pre_hook(
            lambda m, a: calls.append("gpre"), backend="mindspore"
        ),
        ["gpre"],
    ),
    "global_forward": (
        lambda cell, calls: unihook.register_module_forward_hook(
            lambda m, a, o: calls.append("gfwd"), backend="mindspore"
        ),
        ["gfwd"],
    ),
    "global_full_backward": (
        lambda cell, calls: unihook.register_module_full_backward_hook(
            lambda m, gi, go: calls.append("gbwd"), backend="mindspore"
        ),
        ["gbwd"],
    ),
}


def _paused_in_property(cell: Any, attr: str, meanwhile: Callable[[], None]) -> None:
    """Read `cell.<attr>` on another thread, paused in MindSpore's property between its None
    check and its assignment while `meanwhile` runs here; then let it assign."""
    from mindspore import nn

    code = getattr(nn.Cell, attr).fget.__code__
    paused, resume = threading.Event(), threading.Event()

    def local(frame: Any, event: str, arg: Any) -> Any:
        line = linecache.getline(code.co_filename, frame.f_lineno)
        if event == "line" and "__setattr__" in line:
            paused.set()
            resume.wait(30)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    def read() -> None:
        sys.settrace(tracer)
        try:
            getattr(cell, attr)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert paused.wait(30), "the property did not create the dict"
        meanwhile()
    finally:
        resume.set()
        thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attr", LAZY)
def test_a_registration_racing_mindspores_lazy_creation(backend: Any, attr: str, kind: str) -> None:
    from mindspore import nn

    register, expected = KINDS[kind]
    cell = nn.Dense(3, 2)
    assert getattr(cell, "_lazy" + attr) is None
    calls: list[str] = []
    handles: list[Any] = []
    x = mindspore.Tensor(np.asarray(X, np.float32))

    def meanwhile() -> None:
        handles.append(register(cell, calls))
        cell(x)  # (the global dispatchers go in at a cell's call)

    try:
        _paused_in_property(cell, attr, meanwhile)
        calls.clear()
        mindspore.grad(lambda x: cell(x).sum())(x)
        assert calls == expected
    finally:
        for handle in handles:
            handle.remove()
    calls.clear()
    mindspore.grad(lambda x: cell(x).sum())(x)
    assert calls == []
    assert not any(backend.hook_counts(cell).values())  # no key of unihook's left
    assert all(type(d) is OrderedDict for d in backend.hook_dicts(cell).values())
