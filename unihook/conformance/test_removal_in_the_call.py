"""A hook registered during a call and removed in that same call (by the module's forward,
another hook, another thread or a finalizer) is gone: it does not fire later, and the module's
hook dicts hold nothing of it."""

from __future__ import annotations

from typing import Any

import pytest

import unihook


@pytest.mark.parametrize("with_kwargs", [False, True], ids=["args", "kwargs"])
def test_pre_hook_a_global_pre_hook_registers_then_forward_removes(
    backend: Any, with_kwargs: bool
) -> None:
    # torch runs the new pre-hook from the next call (it iterates a snapshot of the hooks);
    # its handle, removed inside forward, removes it for good
    fired: list[str] = []
    handles: list[unihook.Handle] = []

    def register(module: Any, args: Any) -> None:
        if not handles:
            handles.append(
                unihook.register_forward_pre_hook(
                    module, lambda *a: fired.append("new"), with_kwargs=with_kwargs
                )
            )

    def forward(module: Any, x: Any) -> Any:
        for handle in handles:
            handle.remove()
        return module.lin(x)

    model = backend.module(forward, {"lin": backend.linear(2, 2)})
    before = backend.hook_counts(model)
    x = backend.tensor([[1.0, 2.0]])
    with unihook.register_module_forward_pre_hook(register, backend=backend.name):
        model(x)
    model(x)
    assert fired == []
    assert backend.hook_counts(model) == before
