"""helper-220's attack on 2b3503e (`every` > 1: each forward takes a recorded forward due as it
begins, `Recipe._tickets`). Its findings, fixed, each asserted on both recipes:

1. A forward of the model run inside another of the same thread made a recorded forward due
   of its own: with K nested calls per forward and K + 1 > N they piled up, and every forward
   was recorded, also long after the nesting stopped (plain phase: 10 of 10, 05b8b95 5 of 10).
2. A deep copy of the model taken during a recorded forward (or after one a Ctrl-C left) lost
   the recorded forward that forward took: the copy recorded its forwards 2, 4... (05b8b95: 0,
   2...).
3. A no_grad forward (not counted, its hooks run) on one thread while another thread's
   recorded forward ended: the hooks went under it, its `always_call` hook never ran, and its
   entry kept its inputs alive for good.
4. (Open, low, wrong before too: an evaluation under no_grad running the model again under
   enable_grad counts differently; not pinned.)

What held (random single-thread programs of 40 operations against 05b8b95, free-running and
forced thread interleavings, `remove()` from another thread, checkpoints, `torch.jit.trace`):
see `tests/test_recipes_threads.py` and the files it names.
"""

from __future__ import annotations

import copy
import gc
import threading
import weakref
from typing import Any

import pytest

from unihook.recipes import ActivationStats, GradientMonitor

torch = pytest.importorskip("torch")
nn = torch.nn

RECIPES = [GradientMonitor, ActivationStats]


class _Nesting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.depth, self.nest = nn.Linear(4, 4), 0, 0

    def forward(self, x: Any) -> Any:
        if self.depth == 0 and self.nest:
            self.depth = 1
            try:
                for _ in range(self.nest):
                    x = self(x)
            finally:
                self.depth = 0
        return self.fc(x)


@pytest.mark.parametrize("nest", [2, 3])
@pytest.mark.parametrize("recipe", RECIPES)
def test_finding_1_forwards_run_inside_others_pile_up_no_recorded_forwards(
    recipe: type, nest: int
) -> None:
    torch.manual_seed(0)
    model, x = _Nesting(), torch.randn(2, 4)
    with recipe(model, every=2) as watching:
        model.nest = nest
        for _ in range(6):
            model(x).sum().backward()
        assert watching._tickets <= 1
        model.nest = 0
        before = len(watching.history)
        for _ in range(10):
            model(x).sum().backward()
        assert len(watching.history) - before == 5  # (2b3503e: 10 with nest 3)


def _copy_mid_forward(recipe: type, interrupted: bool) -> list[int]:
    """The copy's history after each of its four forwards, the copy taken inside the
    original's recorded forward 0 (a hook of the user's), or after that forward was left by a
    KeyboardInterrupt."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    watching = recipe(model, every=2)
    box: list[Any] = []

    def hook(module: Any, args: Any, output: Any) -> None:  # (the copy carries it too)
        if box:
            return
        if interrupted:
            raise KeyboardInterrupt
        box.append(copy.deepcopy(model))

    handle = model[1].register_forward_hook(hook)
    x = torch.randn(3, 4)
    try:
        model(x).sum().backward()
    except KeyboardInterrupt:
        box.append(copy.deepcopy(model))
    handle.remove()
    copied = box[0]
    found = [o for o in gc.get_objects() if isinstance(o, recipe) and o._model is copied]
    assert len(found) == 1, found
    lengths = []
    for _ in range(4):
        copied(x).sum().backward()
        lengths.append(len(found[0].history))
    watching.remove()
    found[0].remove()
    return lengths


@pytest.mark.parametrize("interrupted", [False, True], ids=["inside", "after_ctrl_c"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_finding_2_a_copy_taken_in_a_recorded_forward_records_its_first(
    recipe: type, interrupted: bool
) -> None:
    lengths = _copy_mid_forward(recipe, interrupted)  # its forwards 0 and 2
    assert lengths == [1, 1, 2, 2]  # (2b3503e: [0, 0, 1, 1])


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.waits: dict[int, tuple[threading.Event, threading.Event]] = {}

    def forward(self, h: Any) -> Any:
        events = self.waits.get(threading.get_ident())
        if events is not None:
            events[0].set()
            assert events[1].wait(20)
        return h * 2


@pytest.mark.parametrize("recipe", RECIPES)
def test_finding_3_an_evaluation_beside_a_recorded_step_leaves_nothing_behind(
    recipe: type,
) -> None:
    torch.manual_seed(0)
    gate = _Gate()
    model = nn.Sequential(nn.Linear(8, 8), gate, nn.Linear(8, 4))
    watching = recipe(model, every=2)
    x = torch.randn(6, 8)
    reached, go = threading.Event(), threading.Event()
    refs: list[Any] = []
    errors: list[BaseException] = []

    def evaluate() -> None:
        try:
            gate.waits[threading.get_ident()] = (reached, go)
            batch = torch.randn(1000, 8)
            refs.append(weakref.ref(batch))
            with torch.no_grad():
                model(batch)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=evaluate)
    thread.start()
    assert reached.wait(20)
    model(x).sum().backward()  # a training step beside it: recorded
    go.set()
    thread.join(20)
    assert not errors
    for _ in range(6):
        model(x).sum().backward()
    gc.collect()
    assert refs[0]() is None  # (2b3503e: the evaluation's batch stayed)
    assert not watching._inside
    if recipe is GradientMonitor:
        assert watching._running == 0 and not watching._running_on
    watching.remove()
