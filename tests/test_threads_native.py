"""Threads on torch, forced interleavings (the backend-neutral thread tests are in
unihook/conformance/test_threads.py): another thread acts inside a call at a point no hook
reaches, which a `TorchFunctionMode` of the calling thread (thread-local) opens."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

import unihook

torch = pytest.importorskip("torch")
TorchFunctionMode = pytest.importorskip("torch.overrides").TorchFunctionMode


class _LetRun(TorchFunctionMode):
    """At the first torch function of its thread inside it, runs `other` on another thread to
    its end: a forced thread switch."""

    def __init__(self, other: Callable[[], None]) -> None:
        super().__init__()
        self.other = other
        self.ran = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.ran:
            self.ran = True
            thread = threading.Thread(target=self.other)
            thread.start()
            thread.join()
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("own_forward_hook", [False, True])
def test_global_dispatchers_pinned_by_another_thread_mid_call(own_forward_hook: bool) -> None:
    """With a global backward hook, `Module._call_impl`'s wrapper takes the call of a module
    without forward pre-hooks itself; another thread pins the global dispatchers in the
    module's dicts (a forward pre-hook came, and it calls the module) after the wrapper looked
    and before torch's own call function reads them. torch's hook loop then runs the pinned
    pre-dispatcher for the call the wrapper took: it must leave the call to the wrapper (a
    second entry, dropped by the wrapper's post-dispatcher, left an input side without output
    side: BackendStateError in the backward). `own_forward_hook`: torch's hook path (a native
    forward hook), else its no-hook path."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    if own_forward_hook:
        lin.register_forward_hook(lambda m, a, o: None)
    x = torch.arange(6.0).reshape(2, 3).requires_grad_()
    lin(x).sum().backward()
    expected, x.grad = x.grad, None
    fired: list[str] = []
    handles = []

    def other() -> None:
        handles.append(unihook.register_forward_pre_hook(lin, lambda m, a: None))
        lin(torch.ones(1, 3))  # (no grad needed: no hook fires for it)

    with unihook.register_module_full_backward_hook(
        lambda m, gi, go: fired.append(type(m).__name__), backend="torch"
    ):
        with _LetRun(other) as mode:
            y = lin(x)
        assert mode.ran and handles
        y.sum().backward()
        handles[0].remove()
    assert fired == ["Linear"]
    assert torch.equal(x.grad, expected)
