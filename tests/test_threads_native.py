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


@pytest.mark.parametrize("point", ["torch_call_impl", "keys"])
@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_the_last_global_backward_hook_swapped_by_another_thread_mid_call(
    point: str, kind: str
) -> None:
    """Another thread removes the last global backward hook (G1), registers another (G2), a
    forward pre-hook on the module, and calls it (which pins G2's dispatchers there) while this
    thread's call of the module is between unihook's `_call_impl` wrapper and torch's own call
    function (`torch_call_impl`), or before the wrapper took its snapshot of the pre-hooks
    (`keys`). Exactly one of them fires for the call: G1, which the wrapper took the call for,
    or G2 where no state had taken it yet (as torch, which reads its global backward hooks when
    its `_call_impl` starts). Both fired (G2's pinned dispatcher took the call again), or
    neither (G2's skipped as a pre-hook newer than the call)."""
    import sys

    from unihook_torch import _global

    register = {
        "full_backward": unihook.register_module_full_backward_hook,
        "full_backward_pre": unihook.register_module_full_backward_pre_hook,
    }[kind]
    lin = torch.nn.Linear(3, 2)
    fired: list[str] = []
    handles: dict[str, Any] = {}
    handles["G1"] = register(lambda m, *g: fired.append("G1"), backend="torch")

    def other() -> None:
        handles["G1"].remove()
        handles["G2"] = register(lambda m, *g: fired.append("G2"), backend="torch")
        handles["P"] = unihook.register_forward_pre_hook(lin, lambda m, a: None)
        lin(torch.ones(1, 3))  # (no grad: fires nothing, pins G2's dispatchers in lin)

    target = _global.TORCH_CALL_CODE if point == "torch_call_impl" else _global._keys.__code__
    done: list[bool] = []

    def switch(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is target and not done:
            done.append(True)
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()

    x = torch.ones(2, 3, requires_grad=True)
    sys.setprofile(switch)
    try:
        y = lin(x)
    finally:
        sys.setprofile(None)
    try:
        assert done
        y.sum().backward()
    finally:
        for handle in handles.values():
            handle.remove()
    assert fired == (["G1"] if point == "torch_call_impl" else ["G2"])
    assert torch.equal(x.grad, torch.ones(2, 2) @ lin.weight)


class _KeepsUsingInput(torch.nn.Module):
    """`ident`'s output is `h` without hooks: the in-place op on it changes `h`'s history."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.ident = torch.nn.Identity()
        self.before: Callable[[], None] = lambda: None

    def forward(self, x: Any) -> Any:
        h = self.lin(x)
        self.before()
        self.ident(h).relu_()
        return h * 3


def _profiled(model: Any, x: Any, switch: Callable[[Any, str, Any], None]) -> Any:
    import sys

    sys.setprofile(switch)
    try:
        return model(x)
    finally:
        sys.setprofile(None)


def test_a_global_backward_hook_registered_between_the_own_and_global_dispatchers() -> None:
    """The last global backward hook is removed inside the model's call (the global
    dispatchers stay pinned in `ident` for the call in flight); `ident`'s own pre-dispatcher
    takes its call, finding no global hook; then another thread registers one (which revives
    the removed global state) before the global pre-dispatcher runs. That one must leave the
    call to the own one, as torch's snapshot of the global hooks at the call's start would.
    Taking it too, it wrapped the own dispatcher's aliases in its own, and the output came
    back unwatched: the in-place op on it missed the caller's `h` (a gradient of 3 where it is
    0; 13 wrong in 95,000 threaded calls, helper-42)."""
    from unihook._module_backward import ModuleBackward

    torch.manual_seed(0)
    model = _KeepsUsingInput()
    x = torch.randn(8, 4, requires_grad=True)
    model(x).sum().backward()
    expected, x.grad = x.grad, None
    fired: list[str] = []
    handles: dict[str, Any] = {}

    def register() -> None:
        handles["G2"] = unihook.register_module_full_backward_hook(
            lambda m, gi, go: fired.append(f"G2 {type(m).__name__}"), backend="torch"
        )

    def switch(frame: Any, event: str, arg: Any) -> None:
        if (
            event == "return"
            and frame.f_code is ModuleBackward.pre_dispatch.__code__
            and not frame.f_locals["self"].is_global
            and "G2" not in handles
        ):
            thread = threading.Thread(target=register)
            thread.start()
            thread.join()

    handles["own"] = unihook.register_full_backward_hook(
        model.ident, lambda m, gi, go: fired.append("own")
    )
    handles["G1"] = unihook.register_module_full_backward_hook(
        lambda m, gi, go: fired.append(f"G1 {type(m).__name__}"), backend="torch"
    )
    model(torch.ones(1, 4))  # (no grad: fires nothing, pins the global dispatchers in ident)
    model.before = handles["G1"].remove
    try:
        y = _profiled(model, x, switch)
        assert "G2" in handles
        y.sum().backward()
    finally:
        for handle in handles.values():
            handle.remove()
    assert torch.equal(x.grad, expected)
    assert "own" in fired and "G2 Identity" not in fired and "G1 Identity" not in fired


def test_a_hook_registered_while_a_removed_states_last_call_ends() -> None:
    """The module's last backward hook is removed while a call is in flight, after forward
    (its dispatchers stay pinned for it); as that call ends, another thread registers a new
    hook, which revives the removed state. The ending call must not then take the dispatchers
    out: the new hook would never fire, and the next call's output would come back
    unwatched."""
    from unihook._module_backward import ModuleBackward

    torch.manual_seed(0)
    model = _KeepsUsingInput()
    x = torch.randn(8, 4, requires_grad=True)
    model(x).sum().backward()
    expected, x.grad = x.grad, None
    fired: list[str] = []
    handles: dict[str, Any] = {}
    handles["first"] = unihook.register_full_backward_hook(
        model.ident, lambda m, gi, go: fired.append("first")
    )
    # (a native forward hook runs before unihook's post-dispatcher, pinned last)
    model.ident.register_forward_hook(lambda m, a, o: handles["first"].remove())

    def other() -> None:
        handles["second"] = unihook.register_full_backward_hook(
            model.ident, lambda m, gi, go: fired.append("second")
        )

    def switch(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is ModuleBackward._ended.__code__ and not fired:
            fired.append("switched")
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()

    try:
        _profiled(model, x, switch).sum().backward()
        x.grad = None
        assert "second" in handles
        model(x).sum().backward()
    finally:
        for handle in handles.values():
            handle.remove()
    assert torch.equal(x.grad, expected)
    assert fired == ["switched", "first", "second"]


def test_hook_ids_drawn_on_two_threads_under_different_locks_differ() -> None:
    """The global dispatchers are pinned in a module (its first call with a global backward
    hook) under one registry lock while another thread swaps the module's own backward hook
    under another: both draw ids from torch's counter. A thread switch between its read and
    its write gave both the same id: the own dispatcher's key was lost, the new hook never
    fired (helper-44). The other thread now waits for the id."""
    import linecache
    import sys

    from unihook_torch._backward import _TorchDispatchers

    code = _TorchDispatchers.new_id.__code__
    lines = range(code.co_firstlineno, code.co_firstlineno + 20)
    write = next(n for n in lines if "next_id += 1" in linecache.getline(code.co_filename, n))
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity())
    fired: list[str] = []
    handles = {
        "O1": unihook.register_full_backward_hook(net[1], lambda *a: fired.append("O1")),
        "G": unihook.register_module_full_backward_hook(lambda *a: None, backend="torch"),
    }

    def swap() -> None:
        handles.pop("O1").remove()
        handles["O2"] = unihook.register_full_backward_hook(net[1], lambda *a: fired.append("O2"))

    threads: list[threading.Thread] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == write and not threads:
            threads.append(threading.Thread(target=swap))
            threads[0].start()
            threads[0].join(0.5)  # (it waits for the id, or, before, drew the same one)
        return trace

    x = torch.randn(2, 4, requires_grad=True)
    sys.settrace(trace)
    try:
        y = net(x)
    finally:
        sys.settrace(None)
    try:
        assert threads
        threads[0].join()
        y.sum().backward()
        for _ in range(2):
            fired.clear()
            net(x).sum().backward()
            assert fired == ["O2"]
        keys = list(net[1]._forward_pre_hooks)
        assert len(keys) == len(set(keys)) == 2  # (the own and the global pre-dispatcher)
    finally:
        for handle in handles.values():
            handle.remove()
