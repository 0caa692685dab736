"""torch's own module backward (pre-)hooks and unihook's on one module chain in the order of
registration, ``prepend=True`` first, whoever registered them (helper-144's FINDING 1: torch's
ran first, at BackwardHook nodes torch puts after every forward hook). Generated sequences of
registrations and removals, compared with the same sequence registered natively alone."""

from __future__ import annotations

import copy
import gc
import random
from collections import OrderedDict
from typing import Any, Callable

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


def _torchs_methods_back() -> bool:
    """torch's own methods on ``torch.nn.Module`` (by identity: unihook's carry torch's names,
    ``__module__`` included, for help(); helper-159 found the name test passing on them)."""
    return all(
        vars(torch.nn.Module)[name] is method for name, method in _native_backward._TORCH.items()
    )


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


def _run(steps: list[tuple[Any, ...]], native_only: bool, shallow: bool, deep: bool = False) -> Any:
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
    if deep:  # (a deep copy's hooks are copies, without handles: called, then dropped)
        called = copy.deepcopy(model)
        for handle in handles:
            handle.remove()
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
    assert _torchs_methods_back()


@pytest.mark.parametrize("seed", range(30))
def test_generated_registrations_chain_as_torchs_own_in_a_deep_copy(seed: int) -> None:
    """helper-148's FINDING 6: in a ``copy.deepcopy`` of a module with unihook's and torch's
    backward hooks, torch's ran first (the copy's dicts were torch's alone, and unihook's
    hooks there had lost their ranks)."""
    steps = _plan(seed)
    got, seen = _run(steps, native_only=False, shallow=False, deep=True)
    want, want_seen = _run(steps, native_only=True, shallow=False, deep=True)
    assert seen == want_seen
    assert torch.allclose(got, want)
    gc.collect()  # (the copies gone: their dicts too, and torch's methods back)
    assert not _native_backward._absorbed
    assert _torchs_methods_back()


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


# helper-149's attack of the read at the call's start (2026-12-05)


def _run_mixed(ours: bool, body: Any) -> Any:
    torch.manual_seed(0)
    module, seen = torch.nn.Linear(3, 3), []
    register = (
        partial_register(module)
        if ours
        else (lambda hook: module.register_full_backward_hook(hook))
    )
    handles = [
        register(lambda m, gi, go: (seen.append("u"), (gi[0] * 2,))[1]),
        module.register_full_backward_hook(
            lambda m, gi, go: (seen.append("n"), (gi[0] * 3 + 1,))[1]
        ),
        module.register_full_backward_pre_hook(
            lambda m, go: (seen.append("np"), (go[0] * 0.5,))[1]
        ),
    ]
    x = torch.ones(2, 3, requires_grad=True)
    body(module, handles, x, seen)
    for handle in handles:
        handle.remove()
    return seen, x.grad


def partial_register(module: Any) -> Any:
    return lambda hook: unihook.register_full_backward_hook(module, hook)


def _a_pre_hook_raised(module: Any, handles: list[Any], x: Any, seen: list[Any]) -> None:
    def raising(m: Any, args: Any) -> None:
        raise ValueError("once")

    once = module.register_forward_pre_hook(raising)
    with pytest.raises(ValueError):
        module(x)
    once.remove()
    handles.pop(1).remove()  # (torch's x3 hook out before the next call)
    module(x).sum().backward()


def _a_pre_hook_calls_its_module(module: Any, handles: list[Any], x: Any, seen: list[Any]) -> None:
    busy = [False]

    def calling(m: Any, args: Any) -> None:
        if not busy[0]:
            busy[0] = True
            with torch.no_grad():
                m(args[0])

    handles.append(module.register_forward_pre_hook(calling, prepend=True))
    module(x).sum().backward()


@pytest.mark.parametrize("body", [_a_pre_hook_raised, _a_pre_hook_calls_its_module])
def test_a_call_cut_short_or_inside_another_keeps_each_calls_hooks(body: Any) -> None:
    """FINDINGS 1 and 3: a record a call cut short left passed for the next call's (torch's
    hook removed since ran, 10x the gradient); a forward pre-hook calling its own module
    overwrote the outer call's record (torch's hooks lost)."""
    (seen, got), (want_seen, want) = _run_mixed(True, body), _run_mixed(False, body)
    assert seen == want_seen
    assert torch.allclose(got, want)
    assert not _native_backward._absorbed


def test_a_shallow_copys_torch_hooks_run_among_unihooks() -> None:
    """FINDING 4: called through ``copy.copy``, torch's full hook ran first (before unihook's
    pre-hook replaced grad_output)."""

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []

        def pre(m: Any, go: Any) -> Any:
            seen.append(("pre", go[0].sum().item()))
            return (go[0] * 0.5 + 0.25,)

        def full(m: Any, gi: Any, go: Any) -> Any:
            seen.append(("full", go[0].sum().item()))
            return (gi[0] * go[0].sum(),)

        first = (
            unihook.register_full_backward_pre_hook(module, pre)
            if ours
            else module.register_full_backward_pre_hook(pre)
        )
        second = module.register_full_backward_hook(full)
        x = torch.ones(2, 3, requires_grad=True)
        copy.copy(module)(x).sum().backward()
        first.remove()
        second.remove()
        return seen, x.grad

    _as_with_torch_alone(run)


def test_a_call_cut_short_keeps_no_module_alive() -> None:
    """A call cut short (a forward pre-hook raised) before unihook's pre-dispatch took its
    record keeps nothing once its hooks are removed and the module dropped."""
    import gc
    import weakref

    module, handles = _raising_before_the_dispatch()
    with pytest.raises(ValueError):
        module(torch.ones(1, 2, requires_grad=True))
    for handle in handles:
        handle.remove()
    ref = weakref.ref(module)
    del module
    gc.collect()
    assert ref() is None


# helper-150's attack of the records holding the call's frame (2026-12-05)


@pytest.mark.parametrize("where", ["this_thread", "a_worker_left_idle"])
def test_a_call_cut_short_keeps_neither_model_nor_batch_alive(where: str) -> None:
    """FINDING 1: the record of a call a forward pre-hook cut short held the call's frame, and
    through it the model, the batch and the callers' frames, until the thread's next such
    call (hooks still registered: the user drops the model after catching the error)."""
    import gc
    import threading
    import weakref

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    unihook.register_full_backward_hook(model[0], lambda *a: None)
    model[0].register_full_backward_hook(lambda *a: None)

    def raising(m: Any, args: Any) -> None:
        raise MemoryError("out of memory (offloading)")

    model[0].register_forward_pre_hook(raising)
    batch = torch.ones(3, 4, requires_grad=True)
    box = [model, batch]  # (what the run reads: cleared with the names below)

    def run() -> None:
        with pytest.raises(MemoryError):
            box[0](box[1])

    idle, done = threading.Event(), threading.Event()
    if where == "this_thread":
        run()
    else:

        def worker() -> None:
            run()
            done.set()
            idle.wait(30)  # (a pool's worker: alive, no other call)

        thread = threading.Thread(target=worker)
        thread.start()
        assert done.wait(30)
    refs = weakref.ref(model), weakref.ref(batch)
    del model, batch
    box.clear()
    gc.collect()
    try:
        assert [ref() is None for ref in refs] == [True, True]
    finally:
        idle.set()
        if where != "this_thread":
            thread.join()


def test_a_shallow_copy_called_after_its_original_is_gone() -> None:
    """FINDING 2: with the original dropped, its shallow copy (sharing its dicts and unihook's
    dispatchers) ran torch's full hook before unihook's registered first."""
    import gc

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []

        def first(m: Any, gi: Any, go: Any) -> Any:
            seen.append("first")
            return (gi[0] * 2 + 1,)

        def second(m: Any, gi: Any, go: Any) -> Any:
            seen.append("second")
            return (gi[0] * 3,)

        if ours:
            unihook.register_full_backward_hook(module, first)
        else:
            module.register_full_backward_hook(first)
        module.register_full_backward_hook(second)
        module.register_full_backward_pre_hook(lambda m, go: (go[0] - 0.5,))
        shallow = copy.copy(module)
        del module
        gc.collect()
        x = torch.linspace(-1, 1, 6).reshape(2, 3).requires_grad_()
        shallow(x).sum().backward()
        return seen, x.grad

    (seen, got), (want_seen, want) = run(True), run(False)
    assert seen == want_seen == ["first", "second"]
    assert torch.allclose(got, want)


def test_code_reading_a_modules_hooks_gets_torchs_own() -> None:
    """FINDING 3: a profiler or hook inspector calling ``_get_backward_hooks()`` got none of
    the module's (torch's call alone leaves them out), and its record held the caller."""
    inner = torch.nn.Linear(2, 2)
    native = inner.register_full_backward_hook(lambda *a: None)
    handle = unihook.register_full_backward_hook(inner, lambda *a: None)
    read: list[Any] = []

    class Inspecting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            read.append(self.inner._get_backward_hooks()[0])
            return self.inner(x)

    Inspecting()(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert read == [[inner._backward_hooks[native.id]]]
    assert not getattr(_native_backward._started, "records", None)
    handle.remove()
    native.remove()


@pytest.mark.parametrize("read", [1, 2])
def test_unihooks_last_hook_removed_as_torchs_are_ranked_leaves_them_running(read: int) -> None:
    """Another thread removing unihook's last hook between the read that found the dict
    absorbed and the ranking of its hooks: the ranking found no entry and gave none, torch had
    left them out (1 call in ~40,000 of a stress run lost torch's pre-hook or full hook). The
    removal is made at that very point here, by a trace function."""

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        handle = unihook.register_full_backward_hook(module, lambda *a: None) if ours else None
        module.register_full_backward_hook(lambda m, gi, go: (seen.append("n"), (gi[0] * 3,))[1])
        module.register_full_backward_pre_hook(lambda m, go: (seen.append("np"), (go[0] * 0.5,))[1])
        calls = [0]

        def trace(frame: Any, event: str, arg: Any) -> Any:
            if event == "call" and frame.f_code is _native_backward._ranked.__code__:
                calls[0] += 1
                if calls[0] == read and handle is not None:
                    handle.remove()
            return None

        return seen, _traced_backward(module, trace)

    (seen, got), (want_seen, want) = run(True), run(False)
    assert seen == want_seen == ["np", "n"]
    assert torch.allclose(got, want)
    assert not _native_backward._absorbed


# helper-151's attack of the records named by torch's list (2026-12-05)


@pytest.mark.parametrize("pre_by", ["torch", "unihook"])
@pytest.mark.parametrize("global_pre", [False, True], ids=["full", "full_and_pre"])
def test_torchs_global_full_hook_gets_grad_output_after_the_modules_pre_hooks(
    pre_by: str, global_pre: bool
) -> None:
    """FINDING 1: torch's global full backward hook ran in torch's BackwardHook, with the
    grad_output from before the module's pre-hooks (torch's, run among unihook's, or
    unihook's own) replaced it: the gradient it returned was computed from that one."""
    from torch.nn.modules.module import (
        register_module_full_backward_hook,
        register_module_full_backward_pre_hook,
    )

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []

        def pre(m: Any, go: Any) -> Any:
            seen.append(("pre", go[0].sum().item()))
            return (go[0] * 2,)

        def full(m: Any, gi: Any, go: Any) -> Any:
            seen.append(("full", go[0].sum().item()))
            return (gi[0] + 1,)

        def global_full(m: Any, gi: Any, go: Any) -> Any:
            seen.append(("global", go[0].sum().item()))
            return (gi[0] * go[0].sum(),)

        def global_pre_hook(m: Any, go: Any) -> Any:
            seen.append(("global_pre", go[0].sum().item()))
            return (go[0] + 1,)

        handles = []
        if pre_by == "unihook" and ours:
            handles.append(unihook.register_full_backward_pre_hook(module, pre))
        else:
            handles.append(module.register_full_backward_pre_hook(pre))
        handles.append(register_module_full_backward_hook(global_full))
        if global_pre:
            handles.append(register_module_full_backward_pre_hook(global_pre_hook))
        if ours:
            handles.append(unihook.register_full_backward_hook(module, full))
        else:
            handles.append(module.register_full_backward_hook(full))
        return _backward_once(module, handles, seen)

    _as_with_torch_alone(run)
    assert not _native_backward._absorbed


def test_a_thread_registering_while_the_hooks_are_merged() -> None:
    """FINDING 4: merging torch's hooks with unihook's iterated unihook's dict, which a
    registration on another thread adds to in place: ``RuntimeError: dictionary changed size
    during iteration`` from the forward (2 in ~33,000 steps). A registration is made at that
    very point here, by a trace function; the call keeps the hooks it started with."""

    torch.manual_seed(0)
    module, seen = torch.nn.Linear(3, 2), []
    handles = [
        unihook.register_full_backward_hook(module, lambda *a: seen.append("first")),
        module.register_full_backward_hook(lambda *a: seen.append("torch")),
    ]
    merged = [0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == "_merged":

            def line(frame: Any, event: str, arg: Any) -> Any:
                merged[0] += 1
                if merged[0] == 3:
                    handles.append(
                        unihook.register_full_backward_hook(module, lambda *a: seen.append("late"))
                    )
                return line

            return line
        return None

    _traced_backward(module, trace)
    for handle in handles:
        handle.remove()
    assert merged[0] >= 3
    assert seen == ["first", "torch"]


def test_the_last_absorbed_dict_freed_while_another_thread_registers_with_prepend() -> None:
    """FINDING 3: the finalizer of the last absorbed dict could not take the lock a prepend
    registration on another thread held, and left torch's methods to it; it did not look:
    they stayed replaced with nothing absorbed."""
    import gc
    import sys
    import threading

    inside, dropped = threading.Event(), threading.Event()
    plain = torch.nn.Linear(2, 2)

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is _native_backward._entry.__code__:
            return None
        if event == "call" and frame.f_code.co_name == "register" and not inside.is_set():
            if frame.f_code.co_filename == _native_backward.__file__:

                def line(frame: Any, event: str, arg: Any) -> Any:
                    if _native_backward._lock.locked() and not inside.is_set():
                        inside.set()  # (inside `with _lock:`)
                        assert dropped.wait(30)
                    return line

                return line
        return None

    module = torch.nn.Linear(2, 2)
    unihook.register_full_backward_hook(module, lambda *a: None)

    def register() -> None:
        sys.settrace(trace)
        try:
            plain.register_full_backward_hook(lambda *a: None, prepend=True).remove()
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=register)
    thread.start()
    try:
        assert inside.wait(30)
        del module
        gc.collect()
    finally:
        dropped.set()
        thread.join()
    assert not _native_backward._absorbed
    for name, original in _native_backward._TORCH.items():
        assert vars(torch.nn.Module)[name] is original


def test_a_call_a_pre_hook_cut_short_on_an_idle_thread_leaves_no_dispatchers() -> None:
    """FINDING 2: a worker's call a forward pre-hook cut short (caught) kept its hold on
    unihook's state: every hook removed on the main thread, unihook's dispatchers stayed in
    the module's forward hook dicts, also after the worker ended."""
    import threading

    module, handles = _raising_before_the_dispatch()
    done, idle = threading.Event(), threading.Event()

    def worker() -> None:
        try:
            module(torch.ones(1, 2, requires_grad=True))
        except ValueError:
            pass
        done.set()
        idle.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert done.wait(30)
        for handle in handles:
            handle.remove()
        assert (dict(module._forward_pre_hooks), dict(module._forward_hooks)) == ({}, {})
    finally:
        idle.set()
        thread.join()


_WRAPPED_ORDER = pytest.mark.xfail(
    strict=True,
    reason="open: beside a library's wrapper of torch's getters torch runs its hooks first",
)


@_WRAPPED_ORDER
@pytest.mark.parametrize("wrapper", ["passing_through", "copying"])
def test_a_library_wrapping_torchs_getters_over_unihooks(wrapper: str) -> None:
    """FINDING 7: a profiler's wrapper of ``Module._get_backward_hooks`` /
    ``_get_backward_pre_hooks`` installed while unihook's were in: only torch's own call was
    answered with the module's hooks left out, so torch ran its hook first. A copying wrapper
    hands torch another list than unihook's (which names the call)."""
    names = ("_get_backward_hooks", "_get_backward_pre_hooks")

    def wrap(method: Any) -> Any:
        if wrapper == "passing_through":
            return lambda self: method(self)
        if method.__name__ == "_get_backward_pre_hooks":
            return lambda self: list(method(self))
        return lambda self: tuple(list(hooks) for hooks in method(self))

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        handles = _first_second_pre(module, ours, seen)
        before = {name: vars(torch.nn.Module)[name] for name in names}
        for name in names:
            setattr(torch.nn.Module, name, wrap(before[name]))
        x = torch.ones(2, 3, requires_grad=True)
        try:
            module(x).sum().backward()
        finally:
            for name in names:
                setattr(torch.nn.Module, name, before[name])
            for handle in handles:
                handle.remove()
        return seen, x.grad

    (seen, got), (want_seen, want) = run(True), run(False)
    assert seen == want_seen == ["pre", "first", "second"]
    assert torch.allclose(got, want)
    assert not getattr(_native_backward._started, "records", None)


@pytest.mark.xfail(strict=True, reason="open: helper-151's FINDING 5 (a backward state per module)")
def test_a_hook_registered_on_a_shallow_copy_runs_after_the_originals() -> None:
    """helper-151's FINDING 5 (not the absorption's: without torch's hooks too): a unihook
    backward hook registered on ``copy.copy(m)`` runs for calls of both (as torch's) but
    before the original's hooks, where torch's registration order puts it after them."""

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []

        def hook(tag: str, a: float) -> Any:
            return lambda m, gi, go: (seen.append(tag), (gi[0] * a + 0.1,))[1]

        register = (
            partial_register
            if ours
            else (lambda m: lambda hook: m.register_full_backward_hook(hook))
        )
        register(module)(hook("original", 2.0))
        shallow = copy.copy(module)
        register(shallow)(hook("copy", -1.0))
        x = torch.ones(1, 3, requires_grad=True)
        shallow(x).sum().backward()
        return seen, x.grad

    _as_with_torch_alone(run)


# helper-152's attack (2026-12-05)


@pytest.mark.parametrize("kind", ["pre", "full"])
@pytest.mark.parametrize("torch_first", [True, False], ids=["torchs_first", "unihooks_first"])
def test_torchs_and_unihooks_global_hooks_chain_in_registration_order(
    kind: str, torch_first: bool
) -> None:
    """FINDING 1: on a module with unihook's hooks, torch's global hook registered before
    unihook's global one ran after it (torch's global hooks went among the module's)."""
    from torch.nn.modules.module import (
        register_module_full_backward_hook,
        register_module_full_backward_pre_hook,
    )

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        if kind == "pre":
            hooks = [
                lambda m, go: (seen.append("torch"), (go[0] + 1,))[1],
                lambda m, go: (seen.append("unihook"), (go[0] * 5,))[1],
            ]
            torch_global = register_module_full_backward_pre_hook
            unihook_global = unihook.register_module_full_backward_pre_hook
            own = lambda m, go: (seen.append("own"), (go[0] * 2,))[1]  # noqa: E731
            register_own = unihook.register_full_backward_pre_hook
        else:
            hooks = [
                lambda m, gi, go: (seen.append("torch"), (gi[0] + 1,))[1],
                lambda m, gi, go: (seen.append("unihook"), (gi[0] * 5,))[1],
            ]
            torch_global = register_module_full_backward_hook
            unihook_global = unihook.register_module_full_backward_hook
            own = lambda m, gi, go: (seen.append("own"), (gi[0] * 2,))[1]  # noqa: E731
            register_own = unihook.register_full_backward_hook
        order = [0, 1] if torch_first else [1, 0]
        handles = []
        for i in order:
            use_torch = i == 0 or not ours
            handles.append((torch_global if use_torch else unihook_global)(hooks[i]))
        handles.append(
            register_own(module, own) if ours else getattr(module, register_own.__name__)(own)
        )
        return _backward_once(module, handles, seen)

    _as_with_torch_alone(run)


@_WRAPPED_ORDER
@pytest.mark.parametrize("depth", [1, 6])
def test_a_library_wrapping_torchs_getters_before_unihooks_first_hook(depth: int) -> None:
    """FINDINGS 2 and 3: a library's wrapper of ``_get_backward_hooks`` installed before
    unihook's first hook (adding a hook of its own to each call, after the module's) was
    never called for a module with unihook's hooks: its hook was lost (then it ran first); one
    installed after unihook's, calling it through more than 4 frames, got torch's answer
    (torch ran its hooks first)."""
    added: list[Any] = []

    def library_hook(m: Any, gi: Any, go: Any) -> Any:
        added.append("library")
        return (gi[0] * 10,)

    def nested(method: Any, module: Any, n: int) -> Any:
        return method(module) if n <= 1 else nested(method, module, n - 1)

    def run(ours: bool, before: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        original = vars(torch.nn.Module)["_get_backward_hooks"]
        installed = []

        def install() -> None:
            method = vars(torch.nn.Module)["_get_backward_hooks"]

            def wrapper(self: Any) -> Any:
                full, non_full = nested(method, self, depth)
                return [*full, library_hook] if before else full, non_full

            installed.append(method)
            torch.nn.Module._get_backward_hooks = wrapper  # type: ignore[method-assign]

        if before:
            install()
        first = lambda m, gi, go: (seen.append("first"), (gi[0] + 1,))[1]  # noqa: E731
        handles = [
            unihook.register_full_backward_hook(module, first)
            if ours
            else module.register_full_backward_hook(first),
            module.register_full_backward_hook(
                lambda m, gi, go: (seen.append("second"), (gi[0] * 3,))[1]
            ),
        ]
        if not before:
            install()
        x = torch.ones(2, 3, requires_grad=True)
        try:
            module(x).sum().backward()
        finally:
            torch.nn.Module._get_backward_hooks = installed[0]  # type: ignore[method-assign]
            for handle in handles:
                handle.remove()
            torch.nn.Module._get_backward_hooks = original  # type: ignore[method-assign]
        return seen, x.grad

    for before in (True, False):
        added.clear()
        seen, got = run(True, before)
        ran = list(added)
        added.clear()
        want_seen, want = run(False, before)
        assert ran == added == (["library"] if before else [])
        assert seen == want_seen
        assert torch.allclose(got, want)


@pytest.mark.parametrize(
    "reader",
    ["forward_pre_hook", "global_forward_pre_hook", pytest.param("twice", marks=_WRAPPED_ORDER)],
)
def test_reading_a_modules_hooks_during_its_call_leaves_torchs_running(reader: str) -> None:
    """FINDING 7: a forward pre-hook (the module's, or torch's global one: a profiler's)
    reading the module's hooks was taken for torch's call reading them again, and torch's
    full hooks of the call were lost; a library's wrapper reading them twice lost torch's
    pre-hooks."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    def look(m: Any, args: Any) -> None:
        m._get_backward_hooks()
        m._get_backward_pre_hooks()

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        handles = _first_second_pre(module, ours, seen)
        method = vars(torch.nn.Module)["_get_backward_hooks"]
        if reader == "forward_pre_hook":
            handles.append(module.register_forward_pre_hook(look))
        elif reader == "global_forward_pre_hook":
            handles.append(register_module_forward_pre_hook(look))
        else:
            torch.nn.Module._get_backward_hooks = lambda self: (method(self), method(self))[1]  # type: ignore[method-assign]
        x = torch.ones(2, 3, requires_grad=True)
        try:
            module(x).sum().backward()
        finally:
            torch.nn.Module._get_backward_hooks = method  # type: ignore[method-assign]
            for handle in handles:
                handle.remove()
        return seen, x.grad

    (seen, got), (want_seen, want) = run(True), run(False)
    assert seen == want_seen == ["pre", "first", "second"]
    assert torch.allclose(got, want)


@pytest.mark.parametrize("installed", ["before", "over"])
@pytest.mark.parametrize("wrapper", ["passing", "copying", "adding", "filtering", "caching"])
def test_a_library_wrapping_torchs_getters_loses_no_hook(wrapper: str, installed: str) -> None:
    """helper-152's FINDING 2, helper-153's A4-A6: beside a library's wrapper of torch's
    getters (installed before unihook's or over them; passing torch's lists on, copying them,
    adding a hook, filtering one out, caching them per module) every hook runs as often as
    with torch alone (its order: torch's first, see the strict xfails above). They had been
    lost, run against the wrapper's filter, or run from a stale cache."""
    names = ("_get_backward_hooks", "_get_backward_pre_hooks")

    def library(m: Any, gi: Any, go: Any) -> Any:
        return None

    def wrap(method: Any, name: str, seen: list[Any]) -> Any:
        cache: dict[int, Any] = {}

        def pre(self: Any) -> Any:
            hooks = method(self)
            if wrapper == "copying":
                return list(hooks)
            if wrapper == "filtering":
                return [hook for hook in hooks if getattr(hook, "tag", "") != "off"]
            return hooks

        def full(self: Any) -> Any:
            if wrapper == "caching":
                return cache.setdefault(id(self), method(self))
            hooks, non_full = method(self)
            if wrapper == "copying":
                return list(hooks), list(non_full)
            if wrapper == "adding":
                return [*hooks, partial_hook(library, "library", seen)], non_full
            if wrapper == "filtering":
                return [hook for hook in hooks if getattr(hook, "tag", "") != "off"], non_full
            return hooks, non_full

        return pre if name == "_get_backward_pre_hooks" else full

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        originals = {name: vars(torch.nn.Module)[name] for name in names}

        def install() -> None:
            for name in names:
                setattr(torch.nn.Module, name, wrap(vars(torch.nn.Module)[name], name, seen))

        if installed == "before":
            install()
        first = partial_hook(lambda m, gi, go: (gi[0] + 1,), "first", seen)
        off = partial_hook(lambda m, gi, go: (gi[0] * 3,), "off", seen)
        handles = [
            unihook.register_full_backward_hook(module, first)
            if ours
            else module.register_full_backward_hook(first),
            module.register_full_backward_hook(off),
            module.register_full_backward_pre_hook(
                lambda m, go: (seen.append("pre"), (go[0] * 2,))[1]
            ),
        ]
        if installed == "over":
            install()
        try:
            for _ in range(2):
                module(torch.ones(2, 3, requires_grad=True)).sum().backward()
        finally:
            for name in names:
                setattr(torch.nn.Module, name, originals[name])
            for handle in handles:
                handle.remove()
        return sorted(seen)

    assert run(True) == run(False)
    assert not _native_backward._absorbed


def partial_hook(body: Any, tag: str, seen: list[Any]) -> Any:
    """A full hook recording `tag` (also its `tag` attribute: a wrapper may filter by it)."""

    def hook(m: Any, gi: Any, go: Any) -> Any:
        seen.append(tag)
        return body(m, gi, go)

    hook.tag = tag  # type: ignore[attr-defined]
    return hook


@pytest.mark.parametrize("key", ["a_string", "an_id"])
def test_a_hook_put_in_torchs_dict_by_hand(key: str) -> None:
    """helper-153's A3: a hook a library put in ``m._backward_hooks`` under its own key made
    every forward raise a TypeError (a string), or ran after unihook's (an ``id()``): such a
    call keeps torch's order."""

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        first = lambda m, gi, go: (seen.append("first"), (gi[0] + 1,))[1]  # noqa: E731
        handle = (
            unihook.register_full_backward_hook(module, first)
            if ours
            else module.register_full_backward_hook(first)
        )
        native = module.register_full_backward_hook(lambda m, gi, go: seen.append("second"))
        by_hand = lambda m, gi, go: (seen.append("by_hand"), (gi[0] * 3,))[1]  # noqa: E731
        module._backward_hooks["library" if key == "a_string" else id(by_hand)] = by_hand
        x = torch.ones(2, 3, requires_grad=True)
        try:
            module(x).sum().backward()
        finally:
            module._backward_hooks.pop("library" if key == "a_string" else id(by_hand))
            handle.remove()
            native.remove()
        return seen, x.grad

    (seen, _), (want_seen, _) = run(True), run(False)
    assert want_seen == ["first", "second", "by_hand"]
    assert seen == ["second", "by_hand", "first"]  # (torch's hooks first, as before 2026-12-05)
    assert not _native_backward._absorbed


def _backward_once(module: Any, handles: list[Any], seen: list[Any]) -> Any:
    """A backward through `module` of a (2, 3) input; then the handles removed."""
    x = torch.ones(2, 3, requires_grad=True)
    try:
        module(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return seen, x.grad


def _as_with_torch_alone(run: Callable[[bool], Any]) -> None:
    """`run(True)` (with unihook's hooks) calls the hooks as `run(False)` (torch's alone)
    does, and gives its gradient."""
    (seen, got), (want_seen, want) = run(True), run(False)
    assert seen == want_seen
    assert torch.allclose(got, want)


def _raising_before_the_dispatch() -> tuple[Any, list[Any]]:
    """A module with a no-op unihook hook, a no-op torch hook and a forward pre-hook that
    raises ValueError (before unihook's pre-dispatch), and the three handles."""
    module = torch.nn.Linear(2, 2)

    def raising(m: Any, args: Any) -> None:
        raise ValueError("once")

    return module, [
        unihook.register_full_backward_hook(module, lambda *a: None),
        module.register_full_backward_hook(lambda *a: None),
        module.register_forward_pre_hook(raising),
    ]


def _traced_backward(module: Any, trace: Any) -> Any:
    """A backward through `module` of a (2, 3) input whose forward ran under `trace` (a
    `sys.settrace` function); the input's gradient."""
    import sys

    x = torch.ones(2, 3, requires_grad=True)
    sys.settrace(trace)
    try:
        out = module(x)
    finally:
        sys.settrace(None)
    out.sum().backward()
    return x.grad


def _first_second_pre(module: Any, ours: bool, seen: list[Any]) -> list[Any]:
    """Three hooks on `module`, recording their names in `seen`: a full hook "first"
    (unihook's if `ours`, else torch's), torch's full hook "second" and torch's pre-hook
    "pre", each replacing what it gets; their handles."""

    def first(m: Any, gi: Any, go: Any) -> Any:
        seen.append("first")
        return (gi[0] + 1,)

    return [
        unihook.register_full_backward_hook(module, first)
        if ours
        else module.register_full_backward_hook(first),
        module.register_full_backward_hook(
            lambda m, gi, go: (seen.append("second"), (gi[0] * 3,))[1]
        ),
        module.register_full_backward_pre_hook(lambda m, go: (seen.append("pre"), (go[0] * 2,))[1]),
    ]


# helper-154's attack (2026-12-05)


def test_a_memo_of_the_getters_set_on_the_module_loses_no_hook() -> None:
    """FINDING 1: ``m._get_backward_hooks = functools.cache(m._get_backward_hooks)`` (a
    per-instance memo, no Python frame between torch's call and unihook's method) kept the
    first call's list, left out of torch's: from the second call torch's hooks were lost."""
    import functools

    def run(ours: bool) -> Any:
        torch.manual_seed(0)
        module, seen = torch.nn.Linear(3, 2), []
        handles = _first_second_pre(module, ours, seen)
        for name in ("_get_backward_hooks", "_get_backward_pre_hooks"):
            setattr(module, name, functools.cache(getattr(module, name)))
        for _ in range(3):
            module(torch.ones(2, 3, requires_grad=True)).sum().backward()
        for handle in handles:
            handle.remove()
        return sorted(seen)

    assert run(True) == run(False) == sorted(["pre", "first", "second"] * 3)


def test_a_filter_a_library_lifted_stays_lifted() -> None:
    """FINDING 3: a library's wrapper dropping torch's hook, installed over unihook's and
    lifted (restoring what it saved, unihook's) after unihook's hook was removed and
    registered again, kept dropping it, and came back on ``torch.nn.Module`` for good with
    unihook's last hook gone."""
    module, seen = torch.nn.Linear(3, 2), []
    module.register_full_backward_hook(lambda m, gi, go: seen.append("torch"))
    first = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("first"))
    saved = vars(torch.nn.Module)["_get_backward_hooks"]

    def muting(self: Any) -> Any:
        return [], []

    torch.nn.Module._get_backward_hooks = muting  # type: ignore[method-assign]
    first.remove()
    again = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("first"))
    torch.nn.Module._get_backward_hooks = saved  # type: ignore[method-assign]
    module(torch.ones(2, 3, requires_grad=True)).sum().backward()
    assert seen == ["torch", "first"]  # (registered in that order)
    again.remove()
    seen.clear()
    module(torch.ones(2, 3, requires_grad=True)).sum().backward()
    assert seen == ["torch"]
    assert (
        vars(torch.nn.Module)["_get_backward_hooks"]
        is _native_backward._TORCH["_get_backward_hooks"]
    )


def test_a_call_with_the_forward_pre_hooks_set_aside_runs_torchs_hooks() -> None:
    """FINDING 4: a library running a call with ``m._forward_pre_hooks`` swapped for an empty
    dict (and back): torch left its hooks out, and unihook's pre-dispatcher, which runs them,
    was not in the dict the call ran: torch's hooks were lost. (unihook's own, whose
    dispatchers live in that dict, do not run there: as before.)"""
    from collections import OrderedDict

    module, seen = torch.nn.Linear(3, 2), []
    handles = _first_second_pre(module, True, seen)
    kept = module._forward_pre_hooks
    module._forward_pre_hooks = OrderedDict()
    try:
        module(torch.ones(2, 3, requires_grad=True)).sum().backward()
    finally:
        module._forward_pre_hooks = kept
    assert seen == ["pre", "second"]
    seen.clear()
    module(torch.ones(2, 3, requires_grad=True)).sum().backward()
    assert seen == ["pre", "first", "second"]
    for handle in handles:
        handle.remove()


# helper-155's attack (2026-12-05)


@pytest.mark.parametrize("library", ["muting", "registering_a_companion"])
def test_a_library_wrapping_torchs_registration_over_unihooks(library: str) -> None:
    """helper-155's R1, R2: unihook's registration methods went over a library's (kept to
    call it): a mute the library lifted kept muting torch's registrations and came back for
    good, and a wrapper registering a companion hook recursed (330 hooks left behind).
    unihook's methods now go over torch's own only."""
    saved = vars(torch.nn.Module)["register_full_backward_hook"]
    module, seen = torch.nn.Linear(3, 2), []
    calls = [0]

    def wrapper(self: Any, hook: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if library == "muting":
            return torch.utils.hooks.RemovableHandle(OrderedDict())
        self.register_full_backward_pre_hook(lambda m, go: seen.append("companion"))
        return saved(self, hook, *args, **kwargs)

    first = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("first"))
    torch.nn.Module.register_full_backward_hook = wrapper  # type: ignore[method-assign]
    first.remove()
    again = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("first"))
    if library == "muting":
        torch.nn.Module.register_full_backward_hook = saved  # type: ignore[method-assign]
    try:
        native = module.register_full_backward_hook(lambda m, gi, go: seen.append("torch"))
        module(torch.ones(2, 3, requires_grad=True)).sum().backward()
    finally:
        torch.nn.Module.register_full_backward_hook = saved  # type: ignore[method-assign]
    again.remove()
    native.remove()
    # (a library's method was on the class as unihook's hook came: torch's order, torch's
    # hooks first; every hook once)
    if library == "muting":
        assert seen == ["torch", "first"] and calls == [0]
    else:
        assert seen == ["companion", "torch", "first"] and calls == [1]
    assert (
        vars(torch.nn.Module)["register_full_backward_hook"]
        is _native_backward._TORCH["register_full_backward_hook"]
    )


@pytest.mark.parametrize("seed", range(12))
def test_hooks_registered_on_a_deep_copy_chain_as_torchs_own(seed: int) -> None:
    """A deep copy's hooks (copies), then a generated sequence registered on the copy: the
    same order and gradient as with torch's own hooks alone."""
    before, after = _plan(seed), _plan(seed + 1000)

    def run(native_only: bool) -> Any:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
        seen: list[Any] = []
        handles: list[Any] = []
        for model_now, steps in ((model, before), (None, after)):
            if model_now is None:
                model_now = model = copy.deepcopy(model)
                for handle in handles:
                    handle.remove()
                handles = []
            for i, step in enumerate(steps):
                if step[0] == "remove":
                    handles[step[1]].remove()
                    continue
                _, who, kind, prepend, a, b = step
                hook = _hook(kind, a, b, seen, i + (len(before) if steps is after else 0))
                if who == "torch" or native_only:
                    register = getattr(model_now[0], f"register_{kind}_hook")
                    handles.append(register(hook, prepend=prepend))
                else:
                    register = getattr(unihook, f"register_{kind}_hook")
                    handles.append(register(model_now[0], hook, prepend=prepend))
        x = torch.ones(2, 3, requires_grad=True)
        model(x).sum().backward()
        for handle in handles:
            handle.remove()
        return x.grad, seen

    got, seen = run(native_only=False)
    want, want_seen = run(native_only=True)
    assert seen == want_seen
    assert torch.allclose(got, want)


@pytest.mark.parametrize("where", ["module", "global"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_return_of_torchs_own_hook_is_named_torchs(kind: str, where: str) -> None:
    """helper-148's FINDING 11: torch's own hook, run among unihook's, returning what torch
    refuses (a gradient of another shape) raised unihook's error naming it as if it were
    unihook's. Now it says whose it is, and stays a RuntimeError, as torch's own error."""
    module = torch.nn.Linear(2, 2)

    def bad(*args: Any) -> Any:
        return (torch.ones(5),)

    from torch.nn.modules import module as torch_module

    ours = getattr(unihook, f"register_{kind}_hook")(module, lambda *args: None)
    if where == "module":
        theirs = getattr(module, f"register_{kind}_hook")(bad)
    else:
        theirs = getattr(torch_module, f"register_module_{kind}_hook")(bad)
    try:
        with pytest.raises(RuntimeError) as caught:
            module(torch.ones(1, 2, requires_grad=True)).sum().backward()
    finally:
        theirs.remove()
        ours.remove()
    label = kind if where == "module" else f"module_{kind}"
    assert str(caught.value).startswith(f"torch's own {label} hook on Linear [backend torch]")


def _global_plan(seed: int) -> list[tuple[Any, ...]]:
    """Steps: ("add", who, scope, kind, prepend, a, b, at) or ("remove", index of an add);
    scope "global" (every module) or "module" (the module `at` of the model)."""
    rng = random.Random(seed)
    steps: list[tuple[Any, ...]] = []
    adds = 0
    for _ in range(rng.randint(2, 7)):
        if adds and rng.random() < 0.2:
            steps.append(("remove", rng.randrange(adds)))
            continue
        who, scope = rng.choice(("unihook", "torch")), rng.choice(("global", "module"))
        a, b = rng.choice((2.0, 3.0, 0.5, -1.0)), rng.choice((1.0, -2.0, 0.25))
        prepend = scope == "module" and rng.random() < 0.4
        steps.append(("add", who, scope, rng.choice(KINDS), prepend, a, b, rng.randrange(3)))
        adds += 1
    return steps


def _run_globals(steps: list[tuple[Any, ...]], native_only: bool) -> Any:
    from torch.nn.modules import module as torch_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    seen: list[Any] = []
    handles: list[Any] = []
    try:
        for i, step in enumerate(steps):
            if step[0] == "remove":
                handles[step[1]].remove()
                continue
            _, who, scope, kind, prepend, a, b, at = step
            hook = _hook(kind, a, b, seen, i)
            native = who == "torch" or native_only
            if scope == "global":
                register = (
                    getattr(torch_module, f"register_module_{kind}_hook")
                    if native
                    else getattr(unihook, f"register_module_{kind}_hook")
                )
                handles.append(register(hook))
            elif native:
                handles.append(getattr(model[at], f"register_{kind}_hook")(hook, prepend=prepend))
            else:
                register = getattr(unihook, f"register_{kind}_hook")
                handles.append(register(model[at], hook, prepend=prepend))
        x = torch.ones(2, 3, requires_grad=True)
        model(x).sum().backward()
        return x.grad, seen
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("seed", range(60))
def test_generated_global_and_module_hooks_chain_as_torchs_own(seed: int) -> None:
    """unihook's global backward hooks and torch's own, global and module hooks, on modules
    with or without unihook hooks of their own: torch's order (global hooks first, by
    registration; then the module's, by registration, prepended first). Until 2026-12-06 a
    unihook global full hook ran after torch's own hooks of a module without unihook hooks of
    its own, and torch's global ones there ran first whatever the order of registration."""
    steps = _global_plan(seed)
    got, seen = _run_globals(steps, native_only=False)
    want, want_seen = _run_globals(steps, native_only=True)
    assert seen == want_seen
    assert torch.allclose(got, want)
    assert not _native_backward._absorbed
    assert _torchs_methods_back()


def test_dispatchers_pinned_by_another_thread_after_the_wrappers_look_lose_no_torch_hook() -> None:
    """The global backward dispatchers' wrapper runs around a call of a module without hooks of
    its own; another thread pins them in the module (it has a torch hook now) before torch
    reads the hooks: the pinned ones leave the call to the wrapper, which took it already, so
    torch keeps its hook (it runs first, as before 2026-12-06) rather than losing it."""
    from unihook_torch import _global

    module, seen = torch.nn.Linear(2, 2), []
    handle = unihook.register_module_full_backward_hook(lambda m, gi, go: seen.append("global"))
    state = _global.global_backward_state()
    assert state is not None
    around = state.around

    def pinning_around(called: Any) -> None:  # (the window: after the look, before the call)
        if called is module and not seen:
            module.register_full_backward_hook(lambda m, gi, go: seen.append("torch"))
            _global._pin(module)
        around(called)

    state.around = pinning_around  # type: ignore[method-assign]
    try:
        module(torch.ones(1, 2, requires_grad=True)).sum().backward()
    finally:
        del state.around
        handle.remove()
    assert sorted(seen) == ["global", "torch"]
