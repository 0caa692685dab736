"""helper-82: a global backward hook ran twice for one call (conformance scenario
`own_backward_hooks_come_and_go_beside_global_ones`, MindSpore, once under load: x.grad 1.5
times the expected, the global hook `scale` twice for one cell).

The race (every backend): a cell's own pre-dispatcher took a call and its global hooks (it runs
before the global one in the cell's hook dict); another thread removed the cell's last own hook
(the state stays pinned for the call, among the cell's removed states) and registered another
(which revives that state: current again, out of the removed ones). The global pre-dispatcher,
asking `_States.dispatching` whether an own state took the call, read the current state before
the revival (none) and the removed ones after it (none any more): it took the global hooks too.
Fixed: `_States` keeps a module's current and removed states in one tuple, replaced whole, read
once.

Deterministic here: a trace on `_States.dispatching` for one cell runs the removal at one of its
events and the registration at a later one, every pair in turn (another thread, joined: the
switch at that very point).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any

import numpy as np

import unihook
import unihook._module_backward as module_backward


def _on_thread(action: Any) -> None:
    thread = threading.Thread(target=action)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_own_hook_removed_and_registered_while_the_global_dispatcher_asks(backend: Any) -> None:
    kit = backend
    kit.seed(0)
    model = kit.sequential(kit.linear(4, 8), kit.relu_module(), kit.linear(8, 3))
    modules = [m for _, m in kit.named_modules(model)]
    target = modules[1]
    counts: Counter[int] = Counter()

    def scale(module: Any, grad_input: Any, grad_output: Any) -> Any:
        counts[id(module)] += 1
        return tuple(None if g is None else g * 1.5 for g in grad_input)

    noop = lambda *args: None  # noqa: E731
    code = module_backward._States.dispatching.__code__
    held: list[Any] = []

    def register() -> None:
        held.append(unihook.register_full_backward_hook(target, noop))

    def run(at: tuple[int, int] | None) -> tuple[np.ndarray, int]:
        """One step; `at`: the events of `dispatching` (for `target`) at which another thread
        removes the target's own hook, then registers another. Returns x.grad, events seen."""
        seen = [0]

        def local(frame: Any, event: str, arg: Any) -> Any:
            if at is not None:
                if seen[0] == at[0]:
                    _on_thread(lambda: held.pop().remove())
                if seen[0] == at[1]:
                    _on_thread(register)
            seen[0] += 1
            return local

        def trace(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code is code and frame.f_locals.get("module") is target:
                return local(frame, event, arg)
            return None

        x = kit.tensor(np.ones((2, 4), "float32"), requires_grad=True)
        sys.settrace(trace)
        try:
            y = model(x)
        finally:
            sys.settrace(None)
        if not held:  # (the registration's event never came)
            register()
        kit.backward(y.sum())
        return np.asarray(kit.grad(x)), seen[0]

    with unihook.register_module_full_backward_hook(scale, backend=kit.name):
        x = kit.tensor(np.ones((2, 4), "float32"), requires_grad=True)
        kit.backward(model(x).sum())
        expected = np.asarray(kit.grad(x))
        register()
        try:
            _, n = run(None)
            assert n > 2, n
            failures = []
            for i in range(n):
                for j in range(i + 1, n + 1):
                    counts.clear()
                    got, _ = run((i, j))
                    calls = [counts[id(m)] for m in modules]
                    if calls != [1] * len(modules) or not np.allclose(got, expected, rtol=1e-5):
                        failures.append(((i, j), calls, float((got / expected).ravel()[0])))
            assert not failures, failures
        finally:
            for handle in held:
                handle.remove()
