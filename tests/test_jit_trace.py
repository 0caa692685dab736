"""``torch.jit.trace`` of modules with unihook's backward hooks (helper-166's FINDING 4).

torch refuses to trace a module with backward hooks of its own (ValueError); with backward
pre-hooks or global backward hooks its check of the trace fails ("Graphs differed across
invocations"), and with ``check_trace=False`` the traced module runs its global hooks for
itself only. unihook's module hooks raise `TracedHookError` (a ValueError) naming the module
and jit.trace; its global hooks leave the trace alone, as torch's global hooks do with
``check_trace=False`` (until 2026-12-07 the check failed the same way, and unchecked, the
traced module ran unihook's hooks for its inlined modules with the traced call's state).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import unihook  # noqa: E402


def _model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _record(calls: list[Any]) -> Callable[..., None]:
    def hook(module: Any, *grads: Any) -> None:
        calls.append((type(module).__name__, [g.clone() for g in grads[-1] if g is not None]))

    return hook


@pytest.mark.parametrize("check_trace", [True, False])
@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_a_module_with_backward_hooks_is_refused(kind: str, check_trace: bool) -> None:
    model = _model()
    calls: list[Any] = []
    register = getattr(unihook, f"register_{kind}_hook")
    handle = register(model[2], _record(calls))
    with pytest.raises(unihook.TracedHookError, match=r"jit\.trace") as caught:
        torch.jit.trace(model, torch.randn(2, 3), check_trace=check_trace)
    assert isinstance(caught.value, ValueError)  # (torch's type for its own backward hooks)
    assert f"{kind} hook on Linear [backend torch]" in str(caught.value)
    # eager afterwards: one call of the hook per backward, torch's grad_output
    reference = _model()
    seen: list[Any] = []
    getattr(reference[2], f"register_{kind}_hook")(_record(seen))
    for _ in range(2):
        x = torch.randn(2, 3)
        model(x).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
    assert [name for name, _ in calls] == [name for name, _ in seen] == ["Linear"] * 2
    for (_, got), (_, want) in zip(calls, seen):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    handle.remove()
    assert isinstance(torch.jit.trace(model, torch.randn(2, 3)), torch.jit.ScriptModule)


def test_a_global_backward_hook_leaves_the_trace_alone() -> None:
    model = _model()
    calls: list[Any] = []
    handle = unihook.register_module_full_backward_hook(_record(calls))
    try:
        traced = torch.jit.trace(model, torch.randn(2, 3, requires_grad=True))
        assert calls == []
        x = torch.randn(2, 3, requires_grad=True)
        traced(x).sum().backward()
        # torch's traced module runs its global hooks for itself (check_trace=False: its check
        # fails on its own global hooks), not for the modules it inlined
        assert [name for name, _ in calls] == ["TopLevelTracedModule"]
        want = x.grad.clone()
        x.grad = None
        calls.clear()
        model(x).sum().backward()  # eager: every module again
        assert [name for name, _ in calls] == ["Linear", "Tanh", "Linear", "Sequential"]
        assert torch.allclose(x.grad, want)
    finally:
        handle.remove()


def test_a_native_backward_hook_beside_a_global_one_is_refused() -> None:
    """unihook runs torch's own backward hooks of a module its global dispatchers take (it
    hides them from torch while a call runs): the trace is refused all the same."""
    model = _model()
    model[0].register_full_backward_hook(lambda *_: None)
    handle = unihook.register_module_full_backward_hook(lambda *_: None)
    try:
        model(torch.randn(2, 3))  # (an eager call first: the global dispatchers stay pinned)
        with pytest.raises(ValueError, match="backward hooks"):
            torch.jit.trace(model, torch.randn(2, 3), check_trace=False)
    finally:
        handle.remove()


@pytest.mark.parametrize("native", ["global_full", "own_pre"])
def test_native_hooks_beside_a_global_one_trace_as_without_it(native: str) -> None:
    """torch traces a module with its own global backward hooks, or a submodule's backward
    pre-hook (``check_trace=False``; its check fails on them), and the traced module runs
    its global hooks for itself, the pre-hook not at all: the same with a unihook global hook
    beside them (until 2026-12-07 refused, blaming the module: helper-178's FINDING 1)."""

    def run(with_unihook: bool) -> list[str]:
        model = _model()
        calls: list[Any] = []
        handles = []
        if native == "global_full":
            handles.append(
                torch.nn.modules.module.register_module_full_backward_hook(_record(calls))
            )
        else:
            handles.append(
                model[0].register_full_backward_pre_hook(lambda m, go: calls.append(("pre", 0)))
            )
        if with_unihook:
            handles.append(unihook.register_module_full_backward_hook(_record(calls)))
        try:
            model(torch.randn(2, 3))  # (an eager call first: the dispatchers are pinned)
            traced = torch.jit.trace(model, torch.randn(2, 3), check_trace=False)
            calls.clear()
            traced(torch.randn(2, 3, requires_grad=True)).sum().backward()
            return [name for name, _ in calls]
        finally:
            for handle in handles:
                handle.remove()

    alone = run(False)
    assert alone == (["TopLevelTracedModule"] if native == "global_full" else [])
    assert run(True) == alone + ["TopLevelTracedModule"]
