"""The notes of the forward hooks unihook registered with prepend (`unihook._prepended`, for
the places of a recipe with `every` > 1): removing the hook forgets its note (the interruption
harness found them piling up, 2026-12-05), a copy of the model keeps its places when the
original's hook goes, and torch's and paddle's keys, drawn from two counters that both start
at 0, are kept apart."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import unihook
from unihook import _prepended, ops
from unihook.recipes import ActivationStats, DropHook

torch = pytest.importorskip("torch")
nn = torch.nn


def _means(stats: ActivationStats) -> list[dict[str, float]]:
    return [{k: round(float(r["mean"]), 5) for k, r in e.items()} for e in stats.history]


def test_removing_a_prepended_hook_forgets_its_note() -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    before = dict(_prepended._noted)
    handles = [
        unihook.register_forward_hook(model[0], lambda m, i, o: o, prepend=True),
        unihook.register_forward_pre_hook(model[0], lambda m, a: None, prepend=True),
    ]
    assert ops.prepended_keys(model[0], 0) and ops.prepended_keys(model[0], 1)
    assert len(_prepended._noted) == len(before) + 2
    for handle in handles:
        handle.remove()
        handle.remove()  # (idempotent)
    assert _prepended._noted == before


def test_a_copy_keeps_its_places_when_the_originals_hook_goes() -> None:
    def run(every: int, remove_original: bool) -> list[dict[str, float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        x = torch.randn(3, 4)
        stats = ActivationStats(model, every=every)
        model(x)
        drop = DropHook(model, "0", p=0.5)  # made on an off-step of every=2: it goes first
        model2, stats2 = copy.deepcopy((model, stats))
        torch.manual_seed(1)
        model2(x)  # (a recorded forward: the copy's places hold its DropHook from here)
        if remove_original:
            drop.remove()
            stats.remove()
            del model, stats
        for _ in range(3):
            model2(x)
        return _means(stats2)

    assert run(2, True) == run(1, False)[::2]


def test_torch_and_paddle_keys_are_kept_apart(monkeypatch: Any) -> None:
    paddle = pytest.importorskip("paddle")
    from paddle.nn.layer.layers import HookRemoveHelper

    linear = nn.Linear(2, 2)
    first = unihook.register_forward_hook(linear, lambda m, i, o: o, prepend=True)
    (key,) = ops.prepended_keys(linear, 1)
    layer = paddle.nn.Linear(2, 2)
    monkeypatch.setattr(HookRemoveHelper, "next_hook_id", key)  # paddle's next key: torch's
    native = layer.register_forward_post_hook(lambda m, i, o: o)  # in paddle's OrderedDict
    try:
        assert key in ops.forward_hook_dicts(layer)[1]
        assert not ops.prepended_keys(layer, 1)
    finally:
        native.remove()
        first.remove()
