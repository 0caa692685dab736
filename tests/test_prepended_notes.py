"""The notes of the forward hooks unihook registered with prepend (`unihook._prepended`, for
the places of a recipe with `every` > 1), kept on the framework's hook dict: removing the hook
forgets its note and leaves the dict as it was (a table of notes grew with each registration:
the interruption harness, 2026-12-05), a copy of the model keeps its own when the original's
hook goes (helper-141's FINDING 2), and a paddle key never passes for a torch one's."""

from __future__ import annotations

import copy
import pickle
import signal
from typing import Any, Callable

import pytest

import unihook
from unihook import _prepended, ops
from unihook.recipes import ActivationStats, DropHook

torch = pytest.importorskip("torch")
nn = torch.nn


def _means(stats: ActivationStats) -> list[dict[str, float]]:
    return [{k: round(float(r["mean"]), 5) for k, r in e.items()} for e in stats.history]


@pytest.mark.parametrize("backward", [False, True], ids=["plain", "beside_backward"])
def test_removing_a_prepended_hook_leaves_the_dicts_as_they_were(backward: bool) -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    dicts = ops.forward_hook_dicts(model[0])
    before = [(d, dict(vars(d))) for d in dicts]
    handles = [unihook.register_full_backward_hook(model[0], lambda *a: None)] if backward else []
    handles += [
        unihook.register_forward_hook(model[0], lambda m, i, o: o, prepend=True),
        unihook.register_forward_pre_hook(model[0], lambda m, a: None, prepend=True),
    ]
    assert ops.prepended_keys(model[0], 0) and ops.prepended_keys(model[0], 1)
    for handle in reversed(handles):
        handle.remove()
        handle.remove()  # (idempotent)
    assert [(d, dict(vars(d))) for d in ops.forward_hook_dicts(model[0])] == before


def _double(module: Any, args: Any, out: Any) -> Any:  # (pickles, as a lambda would not)
    return out * 2


def _paddle_model() -> tuple[Any, Any, Callable[[Any], Any]]:
    paddle = pytest.importorskip("paddle")
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Tanh())
    x = paddle.randn([3, 4])

    def prepended(m: Any) -> Any:
        return unihook.register_forward_hook(m[0], _double, prepend=True)

    return model, x, prepended


def _torch_model() -> tuple[Any, Any, Callable[[Any], Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    return model, torch.randn(3, 4), lambda m: DropHook(m, "0", p=0.5)


def _pickled(held: Any) -> Any:
    return pickle.loads(pickle.dumps(held))


@pytest.mark.parametrize("how", [copy.deepcopy, _pickled], ids=["deep", "pickle"])
@pytest.mark.parametrize("make", [_torch_model, _paddle_model], ids=["torch", "paddle"])
@pytest.mark.parametrize("first_recorded", [False, True])
def test_a_copy_keeps_its_places_when_the_originals_hook_goes(
    make: Callable[[], tuple[Any, Any, Callable[[Any], Any]]],
    how: Callable[[Any], Any],
    first_recorded: bool,
) -> None:
    def run(every: int, remove_original: bool) -> list[dict[str, float]]:
        model, x, prepend = make()
        stats = ActivationStats(model, every=every)
        model(x)
        hook = prepend(model)  # made on an off-step of every=2: it goes first
        model2, stats2 = how((model, stats))
        torch.manual_seed(1)
        if first_recorded:
            model2(x)
        if remove_original:  # (its note was forgotten, the copy's with it, for good)
            hook.remove()
            stats.remove()
        for _ in range(5 - first_recorded):
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


def test_a_removal_in_a_signal_handler_while_noting_does_not_wait_for_itself() -> None:
    # helper-141's FINDING 1: the notes' lock was not reentrant; a handler removing a hook
    # on the thread holding it (noting one) waited for ever
    model = nn.Linear(2, 2)
    held = [unihook.register_forward_hook(model, lambda m, i, o: o, prepend=True)]
    acquire = _prepended._lock.acquire

    def handler(signum: int, frame: Any) -> None:
        held.pop().remove()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        with _prepended._lock:  # (as a registration noting holds it)
            signal.raise_signal(signal.SIGALRM)
        assert acquire(timeout=1)
        _prepended._lock.release()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not held and not ops.prepended_keys(model, 1)


def _times_two(m: Any, i: Any, o: Any) -> Any:
    return o * 2


def _plus_one(m: Any, i: Any, o: Any) -> Any:
    return o + 1


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@pytest.mark.parametrize("same", [False, True], ids=["another_function", "the_same_function"])
def test_a_hook_another_thread_appends_while_one_is_prepended_is_not_noted(
    framework: str, same: bool, monkeypatch: Any
) -> None:
    """helper-143's FINDING 3: the keys new after a registration with prepend were all noted,
    a hook another thread appended meanwhile too (508 of 132,753 registrations beside such a
    thread), and an every=2 recipe then recorded that hook's output (1.348 for 0.348); and
    helper-145's FINDING 4: the same function appended (one logging hook on many modules)."""
    appended = _times_two if same else _plus_one
    if framework == "torch":
        import unihook_torch as backend

        def model_of() -> Any:
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 4), nn.Tanh()), torch.randn(3, 4)

        def append(layer: Any) -> None:
            nn.Module.register_forward_hook(layer, appended)

        where, name = backend, "_insert"
    else:
        paddle = pytest.importorskip("paddle")
        from unihook_paddle import _forward as where  # type: ignore[no-redef]

        def model_of() -> Any:
            paddle.seed(0)
            return paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Tanh()), paddle.randn(
                [3, 4]
            )

        def append(layer: Any) -> None:
            layer.register_forward_post_hook(appended)

        name = "add_hook"
    real = getattr(where, name)
    racing: list[bool] = []

    def registering(layer: Any, *args: Any, **kwargs: Any) -> Any:
        made = real(layer, *args, **kwargs)
        if racing:  # (the other thread's registration, in the window)
            racing.clear()
            append(layer)
        return made

    monkeypatch.setattr(where, name, registering)

    def run(every: int) -> list[float]:
        model, x = model_of()
        stats = ActivationStats(model, every=every)
        for step in range(4):
            if step == 1:
                racing.append(True)
                unihook.register_forward_hook(model[0], _times_two, prepend=True)
            model(x)
        stats.remove()
        return [round(float(entry["0"]["mean"]), 5) for entry in stats.history]

    assert run(2) == run(1)[::2]
