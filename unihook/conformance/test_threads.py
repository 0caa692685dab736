"""Threads (issue 12): forward + backward on shared and on separate models while other threads
register and remove hooks of every kind. No crash, no lost call, no wrong gradient, no deadlock.

Each backend's scenarios run in one subprocess (a crash is an exit code, a deadlock a timeout),
which reports a verdict per scenario; the tests read them. Counts and iterations are fixed, so
every run does the same amount of work (a few seconds per backend).
"""

from __future__ import annotations

import copy
import faulthandler
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np
import pytest

import unihook
from unihook.testing import retains_graph

WORKERS = 4
# steps per worker (the counts are checked exactly, whatever the number): 15 give each backend
# 60 steps per setting beside the churners, 120 in the own-beside-global scenario (25 made
# MindSpore's scenarios 70 s of CPU, 48 s at 15)
ITERATIONS = 15
CHURNERS = 2
TIMEOUT = 600  # seconds for all scenarios of one backend: a deadlock fails, it does not hang
# (MindSpore's serialised threads take about 45 s alone, twice that beside another suite)

SCENARIOS = (
    "shared_model",
    "separate_models",
    "remove_tensor_hook_mid_backward",
    "own_backward_hooks_come_and_go_beside_global_ones",
    "global_hooks_come_and_go_during_calls",
    "registration_hooks_come_and_go_while_layers_are_built",
    "grad_api_on_threads",
    "last_backward_hook_removed_mid_call",
    "global_backward_hook_removed_mid_call",
    "global_backward_hooks_replaced_mid_call",
    "handles_removed_by_finalizers",
    "global_hooks_removed_by_finalizers_in_registration",
)


# -- the scenarios (run in the subprocess) ----------------------------------------------------


def _thread() -> str:
    """This thread, for the counts: its name, which no later thread gets (the ident of a
    thread that ended goes to the next one started: two workers' calls counted as one's)."""
    return threading.current_thread().name


class _Calls:
    """Hook calls counted per (hook, thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()

    def hook(self, name: str, result: Callable[..., Any] | None = None) -> Callable[..., Any]:
        def hook(*args: Any) -> Any:
            with self.lock:
                self.counts[name, _thread()] += 1
            return None if result is None else result(*args)

        return hook

    def of(self, thread: str) -> dict[str, int]:
        return {name: n for (name, t), n in self.counts.items() if t == thread}


def _model(kit: Any, seed: int) -> Any:
    kit.seed(seed)
    return kit.sequential(kit.linear(4, 8), kit.relu_module(), kit.linear(8, 3))


def _double(module: Any, grad_input: Any, grad_output: Any) -> Any:
    return tuple(None if g is None else g * 2 for g in grad_input)


def _stable_hooks(kit: Any, model: Any, calls: _Calls, globals_too: bool) -> list[Any]:
    """Hooks that stay for the whole run; the doubling one makes a lost call a wrong gradient."""
    first, _, last = (m for _, m in kit.named_modules(model)[1:])
    handles = [
        unihook.register_forward_pre_hook(first, calls.hook("forward_pre")),
        unihook.register_forward_hook(last, calls.hook("forward")),
        unihook.register_full_backward_pre_hook(first, calls.hook("full_backward_pre")),
        unihook.register_full_backward_hook(last, calls.hook("full_backward", _double)),
    ]
    if globals_too:
        backend = kit.name
        handles += [
            unihook.register_module_forward_pre_hook(calls.hook("g_forward_pre"), backend=backend),
            unihook.register_module_forward_hook(calls.hook("g_forward"), backend=backend),
            unihook.register_module_full_backward_hook(
                calls.hook("g_full_backward", _double), backend=backend
            ),
        ]
    return handles


def _step(kit: Any, model: Any, data: np.ndarray, calls: _Calls) -> np.ndarray:
    x = kit.tensor(data, requires_grad=True)
    handle = unihook.register_tensor_hook(x, calls.hook("tensor", lambda g: g * 3))
    kit.backward((model(x) * kit.tensor([[1.0, -2.0, 0.5]])).sum())
    handle.remove()
    return np.asarray(kit.grad(x))


def _churn(
    kit: Any, models: list[Any], stop: threading.Event, seed: int, errors: list[str]
) -> None:
    """Register and remove no-op hooks of every kind until `stop`."""
    rng = random.Random(seed)
    backend = kit.name
    noop: Callable[..., Any] = lambda *args: None  # noqa: E731
    kinds: list[Callable[[Any], Any]] = [
        lambda m: unihook.register_forward_pre_hook(m, noop),
        lambda m: unihook.register_forward_hook(m, noop, always_call=True),
        lambda m: unihook.register_forward_pre_hook(m, noop, with_kwargs=True, prepend=True),
        lambda m: unihook.register_full_backward_pre_hook(m, noop, prepend=True),
        lambda m: unihook.register_full_backward_hook(m, noop),
        lambda m: unihook.register_full_backward_hook(m, noop, prepend=True),
        lambda m: unihook.register_forward_hook(m, noop, prepend=True),
        lambda m: unihook.register_tensor_hook(kit.parameters(m)[0], noop),
        lambda m: unihook.register_module_forward_pre_hook(noop, backend=backend),
        lambda m: unihook.register_module_forward_hook(noop, backend=backend),
        lambda m: unihook.register_module_full_backward_pre_hook(noop, backend=backend),
        lambda m: unihook.register_module_full_backward_hook(noop, backend=backend),
        lambda m: unihook.register_module_parameter_registration_hook(noop, backend=backend),
        lambda m: unihook.register_module_buffer_registration_hook(noop, backend=backend),
        lambda m: unihook.register_module_module_registration_hook(noop, backend=backend),
    ]
    held: list[Any] = []
    try:
        while not stop.is_set():
            model = rng.choice(models)
            linears = [m for _, m in kit.named_modules(model) if kit.parameters(m)][1:]
            held.append(rng.choice(kinds)(rng.choice(linears)))
            if rng.random() < 0.3:  # registration hooks fire here, beside the running calls
                kit.register_buffer(linears[0], f"b{rng.randrange(3)}", kit.tensor([1.0]))
            while len(held) > rng.randrange(4):
                held.pop(rng.randrange(len(held))).remove()
    except Exception:  # reported, not raised: the thread's verdict
        errors.append(f"churn: {traceback.format_exc()[-3000:]}")
    finally:
        for handle in held:
            handle.remove()


def _run_workers(
    kit: Any, models: list[Any], inputs: list[np.ndarray], expected: list[np.ndarray]
) -> tuple[list[str], _Calls, list[str]]:
    """Each worker i runs ITERATIONS steps on models[i % len(models)], churners meanwhile."""
    calls = _Calls()
    errors: list[str] = []
    idents: list[str] = []
    stop = threading.Event()

    def work(i: int) -> None:
        idents.append(_thread())
        model = models[i % len(models)]
        try:
            for j in range(ITERATIONS):
                k = (i + j) % len(inputs)
                got = _step(kit, model, inputs[k], calls)
                if not np.allclose(got, expected[k], rtol=1e-5, atol=1e-6):
                    errors.append(f"worker {i} step {j}: x.grad {got} != {expected[k]}")
        except Exception as error:
            errors.append(f"worker {i}: {type(error).__name__}: {error}")

    churners = [
        threading.Thread(target=_churn, args=(kit, models, stop, seed, errors))
        for seed in range(CHURNERS)
    ]
    workers = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for t in churners + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in churners:
        t.join()
    return errors, calls, idents


def _expected(kit: Any, model: Any, inputs: list[np.ndarray], globals_too: bool) -> Any:
    """x.grad for each input and the hook calls of one step, run alone on this thread."""
    calls = _Calls()
    handles = _stable_hooks(kit, model, calls, globals_too)
    grads = [_step(kit, model, data, calls) for data in inputs]
    for handle in handles:
        handle.remove()
    per_step = {name: n // len(inputs) for name, n in calls.of(_thread()).items()}
    return grads, per_step


def _check_counts(calls: _Calls, idents: list[str], per_step: dict[str, int]) -> list[str]:
    want = {name: n * ITERATIONS for name, n in per_step.items()}
    return [
        f"thread {t}: hook calls {calls.of(t)} != {want}" for t in idents if calls.of(t) != want
    ]


def _shared_or_separate(kit: Any, n_models: int) -> list[str]:
    models = [_model(kit, seed=0) for _ in range(n_models)]
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(2, 4)).astype("float32") for _ in range(5)]
    errors: list[str] = []
    for globals_too in (False, True):
        expected, per_step = _expected(kit, models[0], inputs, globals_too)
        stable = _Calls()
        handles = [h for m in models for h in _stable_hooks(kit, m, stable, False)]
        if globals_too:  # once, not once per model
            backend = kit.name
            handles += [
                unihook.register_module_forward_pre_hook(
                    stable.hook("g_forward_pre"), backend=backend
                ),
                unihook.register_module_forward_hook(stable.hook("g_forward"), backend=backend),
                unihook.register_module_full_backward_hook(
                    stable.hook("g_full_backward", _double), backend=backend
                ),
            ]
        found, calls, idents = _run_workers(kit, models, inputs, expected)
        for handle in handles:
            handle.remove()
        merged = _Calls()
        merged.counts = stable.counts + calls.counts
        errors += found + _check_counts(merged, idents, per_step)
    return errors


def _shared_model(kit: Any) -> list[str]:
    return _shared_or_separate(kit, 1)


def _separate_models(kit: Any) -> list[str]:
    return _shared_or_separate(kit, WORKERS)


def _remove_tensor_hook_mid_backward(kit: Any) -> list[str]:
    """Another thread removes a tensor's hooks while backward runs inside one of them: as in
    torch (which snapshots a tensor's hooks when they start), both still run in that backward,
    none in the next; removal never crashes (paddle segfaulted)."""
    errors: list[str] = []
    x = kit.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for step in range(40):
        inside, resume = threading.Event(), threading.Event()

        def hold(g: Any) -> Any:
            inside.set()
            resume.wait(10)
            return g * 2

        y = x * 3
        first = unihook.register_tensor_hook(y, hold)
        second = unihook.register_tensor_hook(y, lambda g: g + 1)

        def remove(first: Any = first, second: Any = second) -> None:
            inside.wait(10)
            if step % 2:
                first.remove()
            second.remove()
            resume.set()

        remover = threading.Thread(target=remove)
        remover.start()
        before = np.zeros(3) if kit.grad(x) is None else np.asarray(kit.grad(x))
        again = retains_graph(kit)  # (MindSpore: one backward per forward, no "next" one)
        kit.backward(y.sum(), retain_graph=again)
        remover.join()
        during = np.asarray(kit.grad(x)) - before
        kept = 3.0 if step % 2 else 6.0  # the doubling hook stays on even steps
        after = np.full(3, kept)
        if again:
            kit.backward(y.sum())
            after = np.asarray(kit.grad(x)) - before - during
        if not (np.allclose(during, 9.0) and np.allclose(after, kept)):
            errors.append(f"step {step}: gradients {during}, {after}; expected 9, {kept}")
    return errors


def _in_background(work: Callable[[threading.Event], None]) -> Any:
    """Run `work(stop)` on a thread until the returned stopper is called; its exception (if
    any) is returned by the stopper."""
    stop = threading.Event()
    errors: list[str] = []

    def run() -> None:
        try:
            work(stop)
        except Exception as error:
            errors.append(f"background: {type(error).__name__}: {error}")

    # (a daemon: a scenario that raised never calls the stopper, and its verdict must reach
    # the parent before the process ends, not a timeout)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def stopper() -> list[str]:
        stop.set()
        thread.join()
        return errors

    return stopper


def _own_backward_hooks_come_and_go_beside_global_ones(kit: Any) -> list[str]:
    """A global backward hook scales every module's grad_input while another thread registers
    and removes per-module backward hooks: no call of the global hook may be lost or doubled
    (a call whose own dispatchers come or go mid-call is the global dispatchers' or theirs)."""
    model = _model(kit, seed=0)
    modules = [m for _, m in kit.named_modules(model)]
    counts: Counter[str] = Counter()
    noop: Callable[..., Any] = lambda *args: None  # noqa: E731

    def scale(module: Any, grad_input: Any, grad_output: Any) -> Any:
        counts[type(module).__name__] += 1
        return tuple(None if g is None else g * 1.5 for g in grad_input)

    def churn(stop: threading.Event) -> None:
        rng = random.Random(0)
        held: list[Any] = []
        kinds = (unihook.register_full_backward_hook, unihook.register_full_backward_pre_hook)
        while not stop.is_set():
            held.append(rng.choice(kinds)(rng.choice(modules), noop, prepend=rng.random() < 0.5))
            while len(held) > rng.randrange(3):
                held.pop(rng.randrange(len(held))).remove()
        for handle in held:
            handle.remove()

    data = np.ones((2, 4), "float32")
    errors: list[str] = []
    with unihook.register_module_full_backward_hook(scale, backend=kit.name):
        expected = _plain_grad(kit, model, data)
        counts.clear()
        stopper = _in_background(churn)
        for step in range(ITERATIONS * 8):
            got = _plain_grad(kit, model, data)
            if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
                errors.append(f"step {step}: x.grad {got} != {expected}")
        errors += stopper()
    want = {
        name: n * ITERATIONS * 8 for name, n in Counter(type(m).__name__ for m in modules).items()
    }
    if dict(counts) != want:
        errors.append(f"global hook calls {dict(counts)} != {want}")
    return errors


def _plain_grad(kit: Any, model: Any, data: np.ndarray) -> np.ndarray:
    x = kit.tensor(data, requires_grad=True)
    kit.backward(model(x).sum())
    return np.asarray(kit.grad(x))


def _global_hooks_come_and_go_during_calls(kit: Any) -> list[str]:
    """Removing the last global hook while another thread is inside a module call (in the
    wrapper unihook installs for them) must not break that call (torch: AssertionError)."""
    model = _model(kit, seed=0)
    unihook.register_forward_pre_hook(kit.named_modules(model)[1][1], lambda *args: None)
    data = np.ones((2, 4), "float32")
    expected = _plain_grad(kit, model, data)

    def calls(stop: threading.Event) -> None:
        while not stop.is_set():
            got = _plain_grad(kit, model, data)
            assert np.allclose(got, expected), (got, expected)

    stopper = _in_background(calls)
    slow: Callable[..., Any] = lambda *args: time.sleep(1e-5)  # noqa: E731
    for i in range(300):
        register = (
            unihook.register_module_forward_pre_hook,
            unihook.register_module_full_backward_pre_hook,
            unihook.register_module_forward_hook,
        )[i % 3]
        register(slow, backend=kit.name).remove()
    return stopper()


def _registration_hooks_come_and_go_while_layers_are_built(kit: Any) -> list[str]:
    """Removing the last registration hook while another thread builds layers must not break
    the construction (paddle: KeyError from the patched ``__setattr__``)."""

    def build(stop: threading.Event) -> None:
        while not stop.is_set():
            layer = kit.linear(2, 2)
            assert len(kit.parameters(layer)) == 2

    stopper = _in_background(build)
    noop: Callable[..., Any] = lambda *args: None  # noqa: E731
    for i in range(600):
        register = (
            unihook.register_module_parameter_registration_hook,
            unihook.register_module_buffer_registration_hook,
            unihook.register_module_module_registration_hook,
        )[i % 3]
        register(noop, backend=kit.name).remove()
    return stopper()


def _last_backward_hook_removed_mid_call(kit: Any) -> list[str]:
    """A module's last backward hook removed while its call runs (by a forward pre-hook,
    inside forward, or by another thread), while forward changes its input in place: as torch,
    the running call keeps the hooks it started with (the hook fires once), the caller's
    tensor keeps the in-place history (gradient as without hooks), and once the call is over
    the module holds nothing of unihook's."""
    data = [-1.0, 2.0, -3.0, 4.0]
    errors: list[str] = []

    def step(model: Any) -> np.ndarray:
        x0 = kit.tensor(data, requires_grad=True)
        x = x0 * 1
        kit.backward((model(x) * 2).sum() + (x * x).sum())  # the caller reads x again
        return np.asarray(kit.grad(x0))

    for remover in ("pre_hook", "forward", "thread"):
        inside, removed = threading.Event(), threading.Event()
        held: dict[str, Any] = {}

        def forward(module: Any, x: Any, remover: str = remover) -> Any:
            if remover == "forward" and "handle" in held:
                held.pop("handle").remove()
                # a copy taken now holds nothing of unihook's (the dispatchers wait for this
                # call only)
                copied = copy.deepcopy(module)
                if any(kit.hook_counts(copied).values()):
                    errors.append(f"a copy taken mid-call: {kit.hook_counts(copied)}")
            elif remover == "thread" and "handle" in held:
                inside.set()
                removed.wait(10)
            act(x)  # in place on the input
            return x * 1

        act = kit.relu_module(inplace=True)
        model = kit.module(forward, {"act": act})
        expected = step(model)
        before = kit.hook_counts(model)
        calls: list[int] = []
        held["handle"] = unihook.register_full_backward_hook(model, lambda *args: calls.append(1))
        if remover == "pre_hook":
            pre = unihook.register_forward_pre_hook(
                model, lambda *args: held.pop("handle").remove()
            )
        elif remover == "thread":
            thread = threading.Thread(
                target=lambda: (inside.wait(10), held.pop("handle").remove(), removed.set())
            )
            thread.start()
        got = step(model)
        if remover == "pre_hook":
            pre.remove()  # pyright: ignore[reportPossiblyUnboundVariable]
        elif remover == "thread":
            thread.join()  # pyright: ignore[reportPossiblyUnboundVariable]
        if not np.allclose(got, expected):
            errors.append(f"{remover}: x.grad {got} != {expected} without hooks")
        # (removed by a forward pre-hook, the hook is already gone for the running call, where
        # torch's fires once: README, Hooks)
        once = [] if remover == "pre_hook" else [1]
        if calls != once:
            errors.append(f"{remover}: the hook fired {len(calls)} times for its call")
        if kit.hook_counts(model) != before:
            errors.append(f"{remover}: residue {kit.hook_counts(model)} != {before}")
        step(model)
        if calls != once:
            errors.append(f"{remover}: the removed hook fired in the next call")
    return errors


def _global_backward_hook_removed_mid_call(kit: Any) -> list[str]:
    """The last global backward hook removed inside the forward of a module that has a forward
    pre-hook (where torch's global dispatchers are pinned in the module's own dicts), forward
    changing its input in place: the gradient is the one without hooks, and nothing stays."""
    errors: list[str] = []
    held: dict[str, Any] = {}

    def forward(module: Any, x: Any) -> Any:
        if "handle" in held:
            held.pop("handle").remove()
        module.act(x)  # in place on the input
        return x * 1

    model = kit.module(forward, {"act": kit.relu_module(inplace=True)})
    data = [-1.0, 2.0, -3.0, 4.0]

    def step() -> np.ndarray:
        x0 = kit.tensor(data, requires_grad=True)
        x = x0 * 1
        kit.backward((model(x) * 2).sum() + (x * x).sum())
        return np.asarray(kit.grad(x0))

    expected = step()
    before = kit.hook_counts(model)
    pre = unihook.register_forward_pre_hook(model, lambda *args: None)
    calls: list[int] = []
    held["handle"] = unihook.register_module_full_backward_hook(
        lambda *args: calls.append(1), backend=kit.name
    )
    got = step()
    pre.remove()
    if not np.allclose(got, expected):
        errors.append(f"x.grad {got} != {expected} without hooks")
    if not calls:
        errors.append("the global hook did not fire for the call it was removed in")
    if kit.hook_counts(model) != before:
        errors.append(f"residue {kit.hook_counts(model)} != {before}")
    return errors


def _global_backward_hooks_replaced_mid_call(kit: Any) -> list[str]:
    """Inside a call (its forward, or another thread while forward waits), the last global
    backward hook goes and another comes, which may go too before a third comes: as torch, the
    running call fires the hook it started with, calls that start later the one registered
    then, once per module; the gradient is the one without hooks, and nothing stays.
    (MindSpore stripped the running call's dispatchers with the second hook's, or never pinned
    the second's in a cell where the first's waited for the running call: calls lost hooks.)"""
    errors: list[str] = []
    for where in ("forward", "thread"):
        for chain in (("b",), ("b", "c")):
            label = f"{where}, a -> {' -> '.join(chain)}"
            held: dict[str, Any] = {}
            try:
                errors += [f"{label}: {e}" for e in _replace_mid_call(kit, where, chain, held)]
            except Exception as error:
                errors.append(f"{label}: {type(error).__name__}: {error}")
            for handle in held.values():
                if hasattr(handle, "remove"):
                    handle.remove()
    return errors


def _replace_mid_call(
    kit: Any, where: str, chain: tuple[str, ...], held: dict[str, Any]
) -> list[str]:
    """One case of `_global_backward_hooks_replaced_mid_call`; `held`: the handles alive."""
    calls: list[tuple[str, int]] = []  # (hook, id of the module)
    inside, done = threading.Event(), threading.Event()

    def global_hook(name: str) -> Any:
        return unihook.register_module_full_backward_hook(
            lambda module, *args: calls.append((name, id(module))), backend=kit.name
        )

    def replace() -> None:
        try:
            held.pop("a").remove()
            for k, name in enumerate(chain):
                held[name] = global_hook(name)
                if k < len(chain) - 1:
                    held.pop(name).remove()
        finally:
            done.set()

    def forward(module: Any, x: Any) -> Any:
        if held.pop("armed", False):
            if where == "forward":
                replace()
            else:
                inside.set()
                done.wait(10)
        return module.lin(x) * 1

    model = kit.module(forward, {"lin": kit.linear(4, 4)})

    def step() -> np.ndarray:
        x = kit.tensor(np.asarray([[-1.0, 2.0, -3.0, 4.0]], "float32"), requires_grad=True)
        kit.backward((model(x) * 2).sum())
        return np.asarray(kit.grad(x))

    expected = step()
    before = [kit.hook_counts(m) for _, m in kit.named_modules(model)]
    held["a"] = global_hook("a")
    held["armed"] = True
    thread = threading.Thread(target=lambda: (inside.wait(10), replace()))
    if where == "thread":
        thread.start()
    try:
        first = step()
    finally:
        if where == "thread":
            inside.set()
            thread.join()
    second = step()
    last = chain[-1]
    held.pop(last).remove()
    errors = [
        f"x.grad {got} != {expected} without hooks"
        for got in (first, second)
        if not np.allclose(got, expected)
    ]
    # the outer call running meanwhile by "a"; the child's, which starts after, and the next
    # step's by the last one
    outer, child = id(model), id(model.lin)
    want = sorted([("a", outer), (last, child), (last, outer), (last, child)])
    if sorted(calls) != want:
        errors.append(f"global hook calls {sorted(calls)}, expected {want}")
    if [kit.hook_counts(m) for _, m in kit.named_modules(model)] != before:
        errors.append("residue in the model's hook dicts")
    return errors


class _Owner:
    """Removes its handle when collected; a reference cycle, so only the collector frees it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.me = self

    def __del__(self) -> None:
        self.handle.remove()


def _handles_removed_by_finalizers(kit: Any) -> list[str]:
    """A finalizer removing a handle runs whenever the collector does, also while unihook
    holds its registration lock on the same thread (inside a registration, a removal, or the
    end of a call whose hook was removed mid-call): no deadlock (the scenario's timeout), and
    every hook goes."""
    rng = random.Random(0)
    noop: Callable[..., Any] = lambda *args: None  # noqa: E731
    modules = [kit.linear(2, 2) for _ in range(16)]
    held: dict[str, Any] = {}

    def forward(module: Any, x: Any) -> Any:
        held.pop("handle").remove()
        _Owner(unihook.register_full_backward_hook(modules[0], noop))
        return module.lin(x)

    block = kit.module(forward, {"lin": kit.linear(2, 2)})
    x = kit.tensor([[1.0, 2.0]], requires_grad=True)
    native = kit.native_state()
    threshold = gc.get_threshold()
    try:
        for i in range(400):
            gc.set_threshold(rng.randint(1, 40))
            a, b = modules[(2 * i) % 16], modules[(2 * i + 1) % 16]
            kept = [
                unihook.register_full_backward_hook(b, noop),
                unihook.register_forward_pre_hook(b, noop),
                unihook.register_module_forward_pre_hook(noop, backend=kit.name),
                unihook.register_module_forward_hook(noop, backend=kit.name),
            ]
            _Owner(unihook.register_full_backward_hook(a, noop))
            _Owner(unihook.register_module_forward_hook(noop, backend=kit.name))
            if kit.name != "torch":
                # (torch's forward hooks are its own: its RemovableHandle, collected in a cycle,
                # finds its weak reference cleared and removes nothing, hooks or not)
                _Owner(unihook.register_forward_hook(a, noop))
            _Owner(unihook.register_module_full_backward_hook(noop, backend=kit.name))
            for handle in kept:
                handle.remove()
            held["handle"] = unihook.register_full_backward_hook(block, noop)
            block(x)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    left = [m for m in [*modules, block] if any(kit.hook_counts(m).values())]
    errors = [f"{len(left)} modules keep unihook's dispatchers"] if left else []
    if kit.native_state() != native:
        errors.append("global hooks left behind (the framework is not restored)")
    return errors


def _global_hooks_removed_by_finalizers_in_registration(kit: Any) -> list[str]:
    """A finalizer removing a global hook, run by the collector at each point of another
    global hook's registration in turn (unihook rebuilds its tables there): the registration
    succeeds, and both hooks go when their handles do."""
    noop: Callable[..., Any] = lambda *args: None  # noqa: E731
    fired: list[int] = []
    layer = kit.linear(2, 2)
    native = kit.native_state()
    others = [unihook.register_module_forward_hook(noop, backend=kit.name) for _ in range(5)]
    errors: list[str] = []
    threshold = gc.get_threshold()
    try:
        for step in range(120):
            _Owner(unihook.register_module_forward_pre_hook(noop, backend=kit.name))
            gc.set_threshold(gc.get_count()[0] + step)
            try:
                handle = unihook.register_module_forward_hook(
                    lambda *args, step=step: fired.append(step), backend=kit.name
                )
            except Exception as error:
                errors.append(f"registration {step}: {type(error).__name__}: {error}")
                continue
            finally:
                gc.set_threshold(*threshold)
            gc.collect()
            handle.remove()
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    layer(kit.tensor([[1.0, 2.0]]))
    if fired:
        errors.append(f"removed hooks still fire: {sorted(set(fired))}")
    for handle in others:
        handle.remove()
    if kit.native_state() != native:
        errors.append("global hooks left behind (the framework is not restored)")
    return errors


def _grad_api_on_threads(kit: Any) -> list[str]:
    """torch.autograd.grad / paddle.grad on four threads while a unihook hook lives (paddle
    3.3.1 alone crashes or reports inputs missing from the graph: unihook runs them one at a
    time while its hooks live)."""
    model = _model(kit, seed=0)
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(2, 4)).astype("float32") for _ in range(4)]
    probe = kit.tensor([1.0], requires_grad=True) * 1
    handle = unihook.register_tensor_hook(probe, lambda g: None)  # keeps unihook's guard on

    def grad_of(data: np.ndarray) -> np.ndarray:
        x = kit.tensor(data, requires_grad=True)
        (g,) = kit.autograd_grad([model(x).sum()], [x])
        return np.asarray(kit.numpy(g))

    expected = [grad_of(d) for d in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            for j in range(ITERATIONS * 2):
                k = (i + j) % len(inputs)
                got = grad_of(inputs[k]) if (i + j) % 2 else _plain_grad(kit, model, inputs[k])
                if not np.allclose(got, expected[k], rtol=1e-5, atol=1e-6):
                    errors.append(f"worker {i} step {j}: {got} != {expected[k]}")
        except Exception as error:
            errors.append(f"worker {i}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    handle.remove()
    return errors


def _main(backend: str, names: Sequence[str] = SCENARIOS) -> None:
    from unihook.testing import kits

    # a deadlock fails with every thread's stack (on stderr, which the test reports) before
    # the parent's timeout kills this process without one
    faulthandler.dump_traceback_later(TIMEOUT - 30, exit=True)
    kit = next(k for k in kits() if k.name == backend)
    # what lives now (the framework's modules) is never collected: the collections the
    # scenarios force (small thresholds, finalizers) scan only what came later (a full one
    # took about 70 ms here: MindSpore's finalizer scenario 26 s, 0.3 s so)
    gc.collect()
    gc.freeze()
    # The churners loop without blocking: a worker whose framework op released the GIL waited
    # up to a whole switch interval (5 ms) for it back at each op, which made MindSpore's
    # scenarios take 106 s. At 0.5 ms the threads interleave ten times as often, for a third of
    # the time (more points of each call meet a churner's registration, not fewer).
    sys.setswitchinterval(0.0005)
    verdicts = {}
    for name in names:
        try:
            verdicts[name] = globals()[f"_{name}"](kit)[:5]
        except Exception:
            # the scenario's own thread raised: its verdict, and no later scenario beside the
            # threads it left running
            verdicts[name] = [f"raised: {traceback.format_exc()[-6000:]}"]
            sys.stdout.write(json.dumps({name: verdicts[name]}) + "\n")
            sys.stdout.flush()
            os._exit(1)
        sys.stdout.write(json.dumps({name: verdicts[name]}) + "\n")
        sys.stdout.flush()


# -- the tests ---------------------------------------------------------------------------------

_results: dict[str, dict[str, list[str]]] = {}


def _verdicts(backend: str) -> dict[str, list[str]]:
    if backend not in _results:
        env = {**os.environ, "GLOG_minloglevel": "2"}
        proc = subprocess.run(
            [sys.executable, "-m", "unihook.conformance.test_threads", backend],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )
        verdicts: dict[str, list[str]] = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                verdicts.update(json.loads(line))
        for name in SCENARIOS:
            if name not in verdicts:  # the process died in (or before) this scenario
                verdicts[name] = [f"exit code {proc.returncode}: {proc.stderr[-12000:]}"]
                break
        _results[backend] = verdicts
    return _results[backend]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_threads(backend: Any, scenario: str) -> None:
    verdicts = _verdicts(backend.name)
    assert scenario in verdicts, f"not reached: an earlier scenario crashed: {verdicts}"
    assert verdicts[scenario] == []


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2:] or SCENARIOS)
