"""A wrapper of one part of a torch model (``torch.compile`` of a submodule,
``checkpoint_wrapper``, FSDP1's units: `tests/test_distributed.py`'s ``fsdp1-units``) is not a
module of the user's: the recipes report the plain model's names (``0``, not ``0`` and
``0._orig_mod``) and the plain model's numbers, take the wrapper where they take the part, and
``copy_weights`` pairs its parameters with the plain model's (compile's state_dict keys keep
the wrapper's part: ``0._orig_mod.weight``). Before 2026-11-30 each wrapped part was reported
twice."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from unihook import ops
from unihook.recipes import ActivationStats, GradCAM, GradientMonitor, copy_weights, summary


def _plain() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU()),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )


def _compiled(part: torch.nn.Module) -> torch.nn.Module:
    return torch.compile(part, backend="eager")  # pyright: ignore[reportReturnType]


# how each part is wrapped: the block's inner conv, the block, the head
WRAPS: dict[str, Callable[[torch.nn.Module], torch.nn.Module]] = {
    "compile": _compiled,
    "checkpoint": lambda part: checkpoint_wrapper(part),
    "both": lambda part: _compiled(checkpoint_wrapper(part)),
}


def _wrapped(how: str) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    model = _plain()
    wrap = WRAPS[how]
    wrappers = [wrap(model[2][0]), wrap(model[5])]
    model[2][0], model[5] = wrappers
    model[2] = wrap(model[2])
    return model, [model[2], *wrappers]


@pytest.mark.parametrize("how", list(WRAPS))
def test_named_modules_leave_a_parts_wrapper_out(how: str) -> None:
    model, wrappers = _wrapped(how)
    names = [name for name, _ in ops.named_modules(model)]
    assert names == [name for name, _ in _plain().named_modules()]
    listed = dict(ops.named_modules(model))
    for name, wrapper in zip(("2", "2.0", "5"), wrappers):
        # the outermost wrapper but compile's (`TorchOps.named_modules`): its hooks run once
        # per call, outside a checkpoint's recomputation; the part inside it is not listed
        assert listed[name] is ops.unwrap(wrapper), name
        inner = ops.part(wrapper)
        assert inner is listed[name] or all(m is not inner for m in listed.values()), name


def _steps(model: torch.nn.Module, make: Callable[[Any], Any]) -> Any:
    recipe = make(model)
    torch.manual_seed(1)
    for _ in range(2):
        model(torch.randn(2, 3, 6, 6)).square().sum().backward()
    return recipe


@pytest.mark.parametrize("how", list(WRAPS))
def test_recipes_report_the_plain_models_names_and_numbers(how: str) -> None:
    plain = _steps(_plain(), lambda m: (ActivationStats(m), GradientMonitor(m)))
    got = _steps(_wrapped(how)[0], lambda m: (ActivationStats(m), GradientMonitor(m)))
    for want_step, got_step in zip(plain[0].history, got[0].history):
        assert sorted(got_step) == sorted(want_step)
        for name, row in want_step.items():
            for key in ("mean", "std", "min", "max", "zeros", "calls"):
                assert got_step[name][key] == pytest.approx(row[key], rel=1e-5), (name, key)
    for want_step, got_step in zip(plain[1].history, got[1].history):
        assert got_step == pytest.approx(want_step, rel=1e-5)
    assert len(got[1].history) == 2


@pytest.mark.parametrize("how", list(WRAPS))
def test_summary_lists_each_part_once(how: str) -> None:
    x = torch.randn(1, 3, 6, 6)
    want = [(r.name, r.type, r.params) for r in summary(_plain(), x).rows]
    assert [(r.name, r.type, r.params) for r in summary(_wrapped(how)[0], x).rows] == want


@pytest.mark.parametrize("how", list(WRAPS))
def test_a_parts_wrapper_is_taken_where_the_part_is(how: str) -> None:
    """GradCAM's target given as the wrapper, its name, or the module inside: the same map."""
    model, wrappers = _wrapped(how)
    x = torch.randn(2, 3, 6, 6)
    maps = [GradCAM(model, target)(x) for target in (wrappers[0], "2", ops.part(wrappers[0]))]
    np.testing.assert_allclose(maps[0], maps[1])
    np.testing.assert_allclose(maps[2], maps[1])
    np.testing.assert_allclose(maps[1], GradCAM(_plain(), "2")(x), atol=1e-6)


@pytest.mark.parametrize("how", list(WRAPS))
def test_copy_weights_pairs_a_wrapped_part_by_its_plain_name(how: str) -> None:
    source = _plain()
    target, _ = _wrapped(how)
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    pairs = copy_weights(source, target)
    # the dst names are its state_dict keys (compile's keep `_orig_mod.`)
    assert pairs == list(zip(source.state_dict(), target.state_dict()))
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(target(x), source(x))
