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
