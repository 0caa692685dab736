"""A pre-hook registered during a call of its module runs from the next call on that thread,
and in the calls other threads start meanwhile; removed in that same call (by the module's
forward, another hook, another thread or a finalizer) it is gone: it does not fire later, and
the module's hook dicts hold nothing of it."""

from __future__ import annotations

import threading
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


def test_pre_hook_registered_during_a_call_runs_in_other_threads_calls(backend: Any) -> None:
    # thread A's call: its global pre-hook has thread B register Q on the module; while A's
    # forward runs, thread C calls the module: C's call started after Q came, so Q runs there
    fired: list[str] = []
    registered, forward_a, done_c = threading.Event(), threading.Event(), threading.Event()
    handles: list[unihook.Handle] = []

    def q(module: Any, args: Any) -> None:
        fired.append(threading.current_thread().name)

    def forward(module: Any, x: Any) -> Any:
        if threading.current_thread().name == "A":
            forward_a.set()
            done_c.wait(10)
        return module.lin(x)

    model = backend.module(forward, {"lin": backend.linear(2, 2)})
    x = backend.tensor([[1.0, 2.0]])

    def global_pre(module: Any, args: Any) -> None:
        if module is model and threading.current_thread().name == "A" and not handles:
            worker = threading.Thread(target=register, name="B")
            worker.start()
            worker.join(10)

    def register() -> None:
        handles.append(unihook.register_forward_pre_hook(model, q))
        registered.set()

    def call_c() -> None:
        forward_a.wait(10)
        model(x)
        done_c.set()

    threads = [
        threading.Thread(target=lambda: model(x), name="A"),
        threading.Thread(target=call_c, name="C"),
    ]
    with unihook.register_module_forward_pre_hook(global_pre, backend=backend.name):
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert registered.is_set() and fired == ["C"]
    model(x)
    assert fired == ["C", "MainThread"]
    handles[0].remove()
