"""A library that assigns a hooked module a new forward hook container instead of clearing it
(``m._forward_hooks = OrderedDict()``, or a copy of the old one, ``OrderedDict(old)``).

torch keeps module backward hooks apart from the forward hook dicts: they survive that. unihook's
backward dispatchers live in those dicts, and follow the module into its new one: the backward
hooks (per module and global) fire as torch's, hooks registered afterwards keep their place
before the dispatchers, and removing the last hook leaves what native registration gives. A
library that keeps the old dict alive (to put it back) gets no such follow-up; a call whose
post-dispatcher it took away raises `BackendStateError` in its backward instead of firing
nothing. The model: a Linear with a native forward pre-hook doubling its input; torch's numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import unihook

W = [[1.0, 2.0, 3.0], [-4.0, -5.0, -6.0]]
B = [1.0, 2.0]
X = [[1.0, -1.0, 2.0]]
# relu(W @ x + B): only the first output reaches the loss
GRAD_OUTPUT = [[1.0, 0.0]]
GRAD_INPUT = [[1.0, 2.0, 3.0]]  # W.T @ grad_output

WHICH: dict[str, tuple[str, ...]] = {
    "forward_pre": ("forward_pre",),
    "forward": ("forward",),
    "both": ("forward_pre", "forward"),
    "always_called": ("always_called",),
    "all": ("forward_pre", "forward", "always_called"),
}


def empty(old: Any) -> Any:
    return OrderedDict()


def copied(old: Any) -> Any:
    return OrderedDict(old)


class Run:
    """The model, its hooks' calls as (kind, grad_input, grad_output), and x's gradients."""

    def __init__(self, kit: Any, hooks: str) -> None:
        self.kit: Any = kit
        self.module: Any = kit.linear(3, 2, W, B)
        self.calls: list[tuple[Any, ...]] = []
        self.native: Any = kit.native_hook(
            self.module, "forward_pre", lambda m, args: (args[0] * 2,)
        )
        self.handles: list[Any] = self.register(hooks)

    def val(self, t: Any) -> Any:
        return None if t is None else np.round(self.kit.numpy(t), 4).tolist()

    def register(self, hooks: str) -> list[unihook.Handle]:
        module = self.module

        def full(m: Any, grad_input: Any, grad_output: Any) -> None:
            if m is module:
                self.calls.append(("full", self.val(grad_input[0]), self.val(grad_output[0])))

        def pre(m: Any, grad_output: Any) -> None:
            self.calls.append(("pre", self.val(grad_output[0])))

        if hooks == "global":
            return [unihook.register_module_full_backward_hook(full, backend=self.kit.name)]
        return [
            unihook.register_full_backward_pre_hook(module, pre),
            unihook.register_full_backward_hook(module, full),
        ]

    def forward(self) -> tuple[Any, Any]:
        x = self.kit.tensor(X, requires_grad=True)
        return x, self.module(x)

    def backward(self, x: Any, y: Any) -> Any:
        self.kit.backward(self.kit.relu(y).sum())
        return self.kit.grad(x).tolist()

    def expected(self, hooks: str, doubled: bool) -> list[tuple[Any, ...]]:
        """One call's hook calls as torch's; the input's gradient (the native pre-hook doubles
        it unless the library dropped it)."""
        calls: list[tuple[Any, ...]] = [("full", GRAD_INPUT, GRAD_OUTPUT)]
        if hooks != "global":
            calls.insert(0, ("pre", GRAD_OUTPUT))
        factor = 2.0 if doubled else 1.0
        return [*calls, ("x.grad", [[factor * g for g in GRAD_INPUT[0]]])]

    def step(self) -> None:
        x, y = self.forward()
        self.calls.append(("x.grad", self.backward(x, y)))

    def remove(self) -> None:
        for handle in self.handles * 2:  # (idempotent)
            handle.remove()


@contextmanager
def hooked(kit: Any, hooks: str) -> Iterator[Run]:
    """A `Run`, its hooks removed at the end whatever happens (a global one would outlive
    the test)."""
    run = Run(kit, hooks)
    try:
        yield run
    finally:
        run.remove()


def twin_counts(kit: Any, native_pre: bool) -> dict[str, int]:
    """The hook containers of the same module with only the native hooks left."""
    module = kit.linear(3, 2, W, B)
    if native_pre:
        kit.native_hook(module, "forward_pre", lambda m, args: None)
    return kit.hook_counts(module)


@pytest.mark.parametrize("hooks", ["module", "global"])
@pytest.mark.parametrize("when", ["before_forward", "before_backward"])
@pytest.mark.parametrize("new", [empty, copied], ids=["empty", "copy"])
@pytest.mark.parametrize("which", list(WHICH))
def test_backward_hooks_follow_a_replaced_hook_dict(
    backend: Any, which: str, new: Callable[[Any], Any], when: str, hooks: str
) -> None:
    # the native pre-hook goes with an emptied pre-hook dict, as in torch
    dropped = new is empty and "forward_pre" in WHICH[which]
    with hooked(backend, hooks) as run:

        def replace() -> None:
            for name in WHICH[which]:
                backend.replace_hook_dict(run.module, name, new)

        if when == "before_forward":
            replace()
            run.step()
            expected = run.expected(hooks, not dropped)
        else:
            x, y = run.forward()
            replace()
            run.calls.append(("x.grad", run.backward(x, y)))
            expected = run.expected(hooks, True)
        run.step()
        assert run.calls == expected + run.expected(hooks, not dropped)

    run.calls.clear()
    run.step()
    assert run.calls == run.expected(hooks, not dropped)[-1:]  # no hook fires
    assert backend.hook_counts(run.module) == twin_counts(backend, not dropped)
    assert all(type(d) is OrderedDict for d in backend.hook_dicts(run.module).values())


@pytest.mark.parametrize("hooks", ["module", "global"])
def test_hooks_registered_after_the_replacement_run_before_the_dispatchers(
    backend: Any, hooks: str
) -> None:
    # torch's backward hooks see the module's final output and input, after every forward
    # hook and pre-hook: also the native ones registered into the library's new dicts
    with hooked(backend, hooks) as run:
        for name in ("forward_pre", "forward"):
            backend.replace_hook_dict(run.module, name, copied)
        backend.native_hook(run.module, "forward", lambda m, args, out: out * 3)
        backend.native_hook(run.module, "forward_pre", lambda m, args: (args[0] * 5,))
        run.step()
    tripled = [[3.0 * g for g in GRAD_INPUT[0]]]
    calls = [("full", tripled, GRAD_OUTPUT), ("x.grad", [[10.0 * g for g in tripled[0]]])]
    assert run.calls == ([] if hooks == "global" else [("pre", GRAD_OUTPUT)]) + calls


def test_a_hook_the_library_puts_into_its_new_dict_runs_before_the_dispatchers(
    backend: Any,
) -> None:
    mine: OrderedDict[int, Any] = OrderedDict()
    with hooked(backend, "module") as run:
        backend.replace_hook_dict(run.module, "forward", lambda old: mine)
        mine[10**9] = lambda m, args, out: out * 3  # into its own dict, not the module's
        run.step()
        tripled = [[3.0 * g for g in GRAD_INPUT[0]]]
        assert run.calls == [
            ("pre", GRAD_OUTPUT),
            ("full", tripled, GRAD_OUTPUT),
            ("x.grad", [[2.0 * g for g in tripled[0]]]),
        ]
        del mine[10**9]
        run.calls.clear()
        run.step()
        assert run.calls == run.expected("module", True)


def test_a_kept_replaced_dict_makes_the_call_raise_not_skip(backend: Any) -> None:
    # the library holds the old dict (to put it back): nothing tells unihook of the new one
    with hooked(backend, "module") as run:
        saved = backend.replace_hook_dict(run.module, "forward", empty)
        x, y = run.forward()
        with pytest.raises(unihook.BackendStateError, match="full_backward hook on .*kept alive"):
            run.backward(x, y)
        assert run.calls == []
        backend.replace_hook_dict(run.module, "forward", lambda old: saved)
        run.step()
        assert run.calls == run.expected("module", True)


@pytest.mark.parametrize("new", [empty, copied], ids=["empty", "copy"])
def test_forward_raising_after_the_always_called_flags_were_replaced(
    backend: Any, new: Callable[[Any], Any]
) -> None:
    # The post-dispatcher must still run when forward raises: forward changed its input in
    # place (an in-place ReLU), and the caller's tensor takes that history, as without hooks.
    def forward(module: Any, h: Any) -> Any:
        module.act(h)
        raise ValueError("forward failed")

    def grads(with_hook: bool) -> Any:
        module = backend.module(forward, {"act": backend.relu_module(inplace=True)})
        calls: list[str] = []
        if with_hook:
            unihook.register_full_backward_hook(module, lambda m, gi, go: calls.append("full"))
            backend.replace_hook_dict(module, "always_called", new)
        x = backend.tensor([[-1.0, 2.0, -3.0]], requires_grad=True)
        h = x * 1
        with pytest.raises(ValueError, match="forward failed"):
            module(h)
        backend.backward((h * 2).sum())
        assert calls == []
        return backend.grad(x)

    np.testing.assert_array_equal(grads(True), grads(False))
    np.testing.assert_array_equal(grads(False), [[0.0, 2.0, 0.0]])


@pytest.mark.parametrize("new", [empty, copied], ids=["empty", "copy"])
def test_global_forward_hooks_stay_with_a_replaced_hook_dict(
    backend: Any, new: Callable[[Any], Any]
) -> None:
    # torch's global forward hooks live outside the module's dicts (MindSpore's are emulated
    # in them): a library replacing those keeps them, and the global backward hooks, firing
    module = backend.linear(3, 2, W, B)
    calls: list[str] = []

    def record(name: str) -> Callable[..., None]:
        def hook(m: Any, *rest: Any) -> None:
            if m is module:
                calls.append(name)

        return hook

    handles = [
        unihook.register_module_forward_pre_hook(record("pre"), backend=backend.name),
        unihook.register_module_forward_hook(record("post"), backend=backend.name),
        unihook.register_module_full_backward_hook(record("full"), backend=backend.name),
    ]
    try:
        x = backend.tensor(X, requires_grad=True)
        backend.backward(backend.relu(module(x)).sum())
        for name in ("forward_pre", "forward", "always_called"):
            backend.replace_hook_dict(module, name, new)
        backend.backward(backend.relu(module(x)).sum())
        assert calls == ["pre", "post", "full"] * 2
    finally:
        for handle in handles:
            handle.remove()
    assert not any(backend.hook_counts(module).values())


@pytest.mark.parametrize("new", [empty, copied], ids=["empty", "copy"])
def test_a_native_handle_still_removes_its_hook_from_the_replaced_dict(
    backend: Any, new: Callable[[Any], Any]
) -> None:
    # A library that keeps the framework's replaced dict (to read it, or put it back) sees
    # a native hook's removal there, as without unihook: the handle refers to unihook's dict,
    # which lives on once the module dropped it (until 2026-12-07 it died with the drop, the
    # handle's removal did nothing and the kept dict held the hook: helper-165's FINDING 8).
    module = backend.linear(3, 2, W, B)
    framework = backend.hook_dicts(module)  # (the library's reference, taken before)
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    remove = backend.native_hook(module, "forward", lambda m, args, out: None)
    backend.replace_hook_dict(module, "forward", new)
    remove()
    handle.remove()
    assert {name: len(d) for name, d in framework.items()} == dict.fromkeys(framework, 0)


def test_the_hook_dicts_views_take_set_operations_as_the_frameworks_own(backend: Any) -> None:
    """A library's ``m._forward_hooks.keys() - flags.keys()`` (a dict view's set operations)
    works on the dicts unihook holds as on the framework's own: until 2026-12-07 their keys()
    and items() were tuples (TypeError, AttributeError: helper-164's FINDING 6)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    kit.native_hook(module, "forward_pre", lambda m, args: None)
    kit.native_hook(module, "forward", lambda m, args, out: None)
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    dicts = [d for d in kit.hook_dicts(module).values() if hasattr(d, "items")]
    assert dicts
    for hooks in dicts:
        plain = OrderedDict(hooks.items())  # (the framework's own type, same entries)
        keys, own = hooks.keys(), plain.keys()
        some = set(list(own)[:1])
        assert keys - some == own - some
        assert keys & some == own & some
        assert keys | {-1} == own | {-1}
        assert keys ^ some == own ^ some
        assert some - keys == some - own
        assert keys.isdisjoint({-1}) and not (own and keys.isdisjoint(own))
        assert keys <= set(own) and not keys < set(own) and keys >= some
        assert hooks.items() - set() == plain.items() - set()
        assert keys == own and keys == set(own) and hooks.items() == plain.items()
        assert not keys != own
    handle.remove()
