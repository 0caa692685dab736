"""unihook's torch backend reads other threads' stacks (`sys._current_frames()`) to wait for
dynamo's loops over hook dicts and for compiled frames. Following ``f_back`` there makes the
frame object of the frame below, and a collection that allocation started ran finalizers, which
let the other thread return from both frames meanwhile: the new object pointed at a popped
frame (CPython 3.11). The dev suite died with SIGSEGV at
`test_collector_paused.py::test_places_beside_a_thread_registering_hooks_leave_the_collector_on`
(CI on 9d449c5, twice; 1 of 7 runs of the suite up to it here): `_near_tops` walked with the
collector on. Every step down another thread's stack now runs with the collector off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch._dynamo")

from torch._dynamo import convert_frame  # noqa: E402
from unihook_torch import _compile  # noqa: E402


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Whether the collector was on at each read of ``f_back`` down another thread's stack,
    while a thread waits 8 calls deep."""
    seen: list[bool] = []

    def getattr_(obj: Any, name: str, *default: Any) -> Any:
        if name == "f_back":
            seen.append(gc.isenabled())
        return getattr(obj, name, *default)

    monkeypatch.setattr(_compile, "getattr", getattr_, raising=False)  # (the module's name)
    started, stop = threading.Event(), threading.Event()

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            started.set()
            stop.wait(30)

    thread = threading.Thread(target=deep, args=(8,))
    thread.start()
    started.wait(30)
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


WALKS: dict[str, Callable[[], object]] = {
    "near_tops": _compile._near_tops,
    "whole_stacks": _compile._whole_stacks,
    "threads_in_compiled_frames": lambda: _compile._threads_in_compiled_frames(convert_frame),
}


@pytest.mark.parametrize("walk", WALKS)
def test_another_threads_stack_is_walked_with_the_collector_off(
    steps: list[bool], walk: str
) -> None:
    assert gc.isenabled()
    WALKS[walk]()
    assert steps, "the walk took no step down the waiting thread's stack"
    assert not any(steps)
    assert gc.isenabled()


@pytest.mark.parametrize("walk", WALKS)
def test_a_threads_own_gc_bracket_ending_in_the_walk_leaves_it_off(
    steps: list[bool], walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-156's FINDING 1: a thread's own ``gc.disable()`` / ``gc.enable()`` bracket
    (torch.distributed.checkpoint's ``_gc_context``, ``timeit``), begun before the walk's pause
    came in and ended during the walk, turned the collector on for the walk's later steps; the
    collector is on after the walk, as that thread left it."""
    inside, walking, left = threading.Event(), threading.Event(), threading.Event()

    def bracket() -> None:
        enabled = gc.isenabled()
        gc.disable()
        try:
            inside.set()
            walking.wait(30)
        finally:
            if enabled:
                gc.enable()
            left.set()

    back = _compile._back

    def first_step_waits(frame: Any) -> Any:
        if not walking.is_set():
            walking.set()
            left.wait(30)  # (that thread leaves its bracket now)
        return back(frame)

    monkeypatch.setattr(_compile, "_back", first_step_waits)
    other = threading.Thread(target=bracket)
    other.start()
    inside.wait(30)
    try:
        WALKS[walk]()
    finally:
        walking.set()
        other.join()
    assert left.is_set()
    assert len(steps) > 1 and not any(steps)
    assert gc.isenabled()
