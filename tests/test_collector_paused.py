"""`collector_paused` across threads: each pause read ``gc.isenabled()``, disabled, and enabled
on leaving if it had been enabled; two threads interleaving left the collector off for good
(an every=2 recipe's places beside a thread registering hooks with dynamo imported: 2 of 4
runs; the dev suite then failed 616 tests, 2026-12-05)."""

from __future__ import annotations

import gc

import pytest
from racing import racing

import unihook
from unihook.backend import collector_paused
from unihook.recipes import ActivationStats


def _pause() -> None:
    with collector_paused():
        pass


def test_pauses_on_threads_leave_the_collector_on() -> None:
    assert gc.isenabled()
    try:
        racing([_pause] * 3, 1.0)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            with collector_paused():
                pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_places_beside_a_thread_registering_hooks_leave_the_collector_on() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._dynamo")
    torch.compile(lambda t: t * 2, backend="eager")(torch.ones(2))  # (dynamo's thread walks)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(4, 8)
    stats = ActivationStats(model, every=2)
    try:
        racing(
            [
                lambda: model(x),
                lambda: unihook.register_forward_hook(
                    model[0], lambda m, a, o: None, prepend=True
                ).remove(),
            ],
            3,
        )
    finally:
        stats.remove()
    enabled = gc.isenabled()
    gc.enable()
    assert enabled
