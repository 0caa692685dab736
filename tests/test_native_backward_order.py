"""torch's own module backward (pre-)hooks and unihook's on one module chain in the order of
registration, ``prepend=True`` first, whoever registered them (helper-144's FINDING 1: torch's
ran first, at BackwardHook nodes torch puts after every forward hook). Generated sequences of
registrations and removals, compared with the same sequence registered natively alone."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

import unihook

torch = pytest.importorskip("torch")
from unihook_torch import _native_backward  # noqa: E402

KINDS = ("full_backward", "full_backward_pre")


def _hook(kind: str, a: float, b: float, seen: list[Any], tag: int) -> Any:
    """Replaces what it gets with ``g * a + b`` (the chain's order shows in the gradient) and
    notes what it saw."""
    if kind == "full_backward":

        def full(module: Any, grad_input: Any, grad_output: Any) -> Any:
            seen.append((tag, grad_input[0].sum().item()))
            return (grad_input[0] * a + b,)

        return full

    def pre(module: Any, grad_output: Any) -> Any:
        seen.append((tag, grad_output[0].sum().item()))
        return (grad_output[0] * a + b,)

    return pre


def _plan(seed: int) -> list[tuple[Any, ...]]:
    """Steps: ("add", who, kind, prepend, a, b) or ("remove", index of an earlier add)."""
    rng = random.Random(seed)
    steps: list[tuple[Any, ...]] = []
    adds = 0
    for _ in range(rng.randint(2, 7)):
        if adds and rng.random() < 0.25:
            steps.append(("remove", rng.randrange(adds)))
            continue
        who = rng.choice(("unihook", "torch"))
        kind = rng.choice(KINDS)
        a, b = rng.choice((2.0, 3.0, 0.5, -1.0)), rng.choice((1.0, -2.0, 0.25))
        steps.append(("add", who, kind, rng.random() < 0.4, a, b))
        adds += 1
    return steps


def _run(steps: list[tuple[Any, ...]], native_only: bool, shallow: bool) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    target = model[0]
    seen: list[Any] = []
    handles: list[Any] = []
    for i, step in enumerate(steps):
        if step[0] == "remove":
            handles[step[1]].remove()
            continue
        _, who, kind, prepend, a, b = step
        hook = _hook(kind, a, b, seen, i)
        if who == "torch" or native_only:
            handles.append(getattr(target, f"register_{kind}_hook")(hook, prepend=prepend))
        else:
            register = getattr(unihook, f"register_{kind}_hook")
            handles.append(register(target, hook, prepend=prepend))
    called = copy.copy(model) if shallow else model  # (a shallow copy shares the dicts)
    x = torch.ones(2, 3, requires_grad=True)
    called(x).sum().backward()
    for handle in handles:
        handle.remove()
    return x.grad, seen


@pytest.mark.parametrize("seed", range(60))
def test_generated_registrations_chain_as_torchs_own(seed: int) -> None:
    steps = _plan(seed)
    got, seen = _run(steps, native_only=False, shallow=seed % 5 == 0)
    want, want_seen = _run(steps, native_only=True, shallow=seed % 5 == 0)
    assert seen == want_seen
    assert torch.allclose(got, want)
    assert not _native_backward._absorbed  # (all removed: torch's methods back)
    assert vars(torch.nn.Module)["_get_backward_hooks"].__module__ == "torch.nn.modules.module"


def test_torchs_methods_come_back_with_the_last_hook() -> None:
    module = torch.nn.Linear(2, 2)
    before = {name: vars(torch.nn.Module)[name] for name in _native_backward._REPLACEMENTS}
    first = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    second = unihook.register_full_backward_pre_hook(module, lambda m, go: None)
    assert vars(torch.nn.Module)["_get_backward_hooks"] is not before["_get_backward_hooks"]
    first.remove()
    first.remove()  # (idempotent: the second leaves the other's absorption)
    assert _native_backward._absorbed
    second.remove()
    assert {name: vars(torch.nn.Module)[name] for name in before} == before
    assert not _native_backward._absorbed


def test_global_native_hooks_run_before_the_modules_own() -> None:
    """torch runs its global module backward hooks before a module's own: they stay at torch's
    BackwardHook node, and unihook's and the module's torch hooks after them, in order."""

    def run(ours: bool) -> Any:
        seen: list[Any] = []
        module = torch.nn.Linear(3, 3)
        torch.manual_seed(0)
        module.reset_parameters()
        glob = torch.nn.modules.module.register_module_full_backward_hook(
            _hook("full_backward", 2.0, 1.0, seen, 0)
        )
        first = _hook("full_backward", 3.0, -2.0, seen, 1)
        handles = [
            unihook.register_full_backward_hook(module, first)
            if ours
            else module.register_full_backward_hook(first),
            module.register_full_backward_hook(_hook("full_backward", 0.5, 0.25, seen, 2)),
        ]
        x = torch.ones(1, 3, requires_grad=True)
        try:
            module(x).sum().backward()
        finally:
            glob.remove()
            for handle in handles:
                handle.remove()
        return x.grad, seen

    (got, seen), (want, want_seen) = run(True), run(False)
    assert seen == want_seen
    assert torch.allclose(got, want)


def test_a_dict_assigned_anew_is_torchs_alone() -> None:
    """A library assigning the module a new backward hook dict: its hooks run at torch's node
    (once: neither lost nor run twice)."""
    from collections import OrderedDict

    module = torch.nn.Linear(3, 3)
    seen: list[Any] = []
    handle = unihook.register_full_backward_hook(module, _hook("full_backward", 1.0, 0.0, seen, 0))
    module._backward_hooks = OrderedDict()
    native = module.register_full_backward_hook(_hook("full_backward", 1.0, 0.0, seen, 1))
    x = torch.ones(1, 3, requires_grad=True)
    module(x).sum().backward()
    handle.remove()
    native.remove()
    assert sorted(tag for tag, _ in seen) == [0, 1]


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_torch_compile_runs_both_in_order(compiler: str) -> None:
    pytest.importorskip("torch._dynamo")
    steps = [
        ("add", "unihook", "full_backward", False, 2.0, 1.0),
        ("add", "torch", "full_backward", True, 3.0, -2.0),
        ("add", "torch", "full_backward_pre", False, 0.5, 0.25),
        ("add", "unihook", "full_backward_pre", True, -1.0, 1.0),
    ]
    want, want_seen = _run(steps, native_only=True, shallow=False)

    def compiled(steps: Any) -> Any:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
        seen: list[Any] = []
        handles = []
        for i, (_, who, kind, prepend, a, b) in enumerate(steps):
            hook = _hook(kind, a, b, seen, i)
            if who == "torch":
                handles.append(getattr(model[0], f"register_{kind}_hook")(hook, prepend=prepend))
            else:
                register = getattr(unihook, f"register_{kind}_hook")
                handles.append(register(model[0], hook, prepend=prepend))
        run = torch.compile(model, backend=compiler)
        x = torch.ones(2, 3, requires_grad=True)
        run(x).sum().backward()
        for handle in handles:
            handle.remove()
        return x.grad, seen

    got, seen = compiled(steps)
    assert seen == want_seen
    assert torch.allclose(got, want)


@pytest.mark.parametrize("where", ["forward_pre", "forward", "forward_hook"])
def test_unihooks_last_hook_removed_during_the_call_leaves_torchs_running(where: str) -> None:
    """helper-148's FINDING 1: removed by a forward pre-hook of the call, before unihook's
    pre-dispatch, torch's own hook (left out of the call as it started) did not run: the
    gradient 10x off."""

    class Lin(torch.nn.Linear):
        def forward(self, x: Any) -> Any:
            if where == "forward":
                handles[0].remove()
            return super().forward(x)

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = Lin(2, 2), []
        native = module.register_full_backward_hook(lambda m, gi, go: (gi[0] * 10,))
        register = unihook.register_full_backward_hook if ours else None
        hook = _hook("full_backward", 1.0, 0.0, seen, 0)
        handles[:] = [
            register(module, hook) if register else module.register_full_backward_hook(hook)
        ]
        remover = (lambda *a: handles[0].remove()) if where != "forward" else (lambda *a: None)
        extra = (
            module.register_forward_pre_hook(remover)
            if where == "forward_pre"
            else module.register_forward_hook(remover)
        )
        x = torch.ones(1, 2, requires_grad=True)
        module(x).sum().backward()
        for handle in (native, extra, handles[0]):
            handle.remove()
        return x.grad

    handles: list[Any] = []
    assert torch.allclose(run(True), run(False))
    assert not _native_backward._absorbed


def test_a_thread_registering_and_removing_leaves_torchs_hook_once_per_backward() -> None:
    """helper-148's FINDING 2: another thread registering and removing unihook's hook on the
    module: torch's own ran in about half of the backwards, and some raised
    BackendStateError."""
    import sys
    import threading
    import time

    module = torch.nn.Linear(4, 4)
    count = [0]
    native = module.register_full_backward_hook(lambda *a: count.__setitem__(0, count[0] + 1))
    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            unihook.register_full_backward_hook(module, lambda *a: None).remove()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=toggle)
    thread.start()
    counts: dict[int, int] = {}
    try:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            count[0] = 0
            module(torch.ones(1, 4, requires_grad=True)).sum().backward()
            counts[count[0]] = counts.get(count[0], 0) + 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
        native.remove()
    assert list(counts) == [1], counts
    assert not _native_backward._absorbed


def test_a_library_replacing_torchs_registration_beside_unihooks() -> None:
    """helper-148's FINDING 3: a library's replacement of the method, made while unihook's
    was installed, recursed for ever once unihook installed its own again."""
    module = torch.nn.Linear(2, 2)
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    unihooks = torch.nn.Module.register_full_backward_hook

    def library(self: Any, hook: Any, prepend: bool = False) -> Any:
        return unihooks(self, hook, prepend=prepend)

    torch.nn.Module.register_full_backward_hook = library  # type: ignore[method-assign]
    try:
        handle.remove()  # (unihook's stays beneath the library's)
        handle = unihook.register_full_backward_hook(module, lambda *a: None)
        native = module.register_full_backward_hook(lambda *a: None)
        native.remove()
        handle.remove()
    finally:
        original = _native_backward._TORCH["register_full_backward_hook"]
        torch.nn.Module.register_full_backward_hook = original  # type: ignore[method-assign]
    assert not _native_backward._absorbed


def test_a_plain_dict_a_library_assigned_is_torchs_alone() -> None:
    """helper-148's FINDING 9: ``m._backward_hooks = {}`` (no weak references) failed
    unihook's registration."""
    module = torch.nn.Linear(2, 2)
    module._backward_hooks = {}  # type: ignore[assignment]
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    handle.remove()
    assert not _native_backward._absorbed


def test_a_model_dropped_with_its_hooks_gives_torchs_methods_back() -> None:
    """helper-148's FINDING 8."""
    import gc

    module = torch.nn.Linear(2, 2)
    unihook.register_full_backward_hook(module, lambda *a: None)
    del module
    gc.collect()
    assert not _native_backward._absorbed
    for name, original in _native_backward._TORCH.items():
        assert vars(torch.nn.Module)[name] is original
