"""A module's hook dict unihook gave back while a shallow copy (``copy.copy``) of the module,
made while unihook held it, still holds unihook's: the copy shares the module's hooks as
with the framework alone (helper-166's FINDINGS 2, 3 and 5). Each test fails on 690d5d1."""

from __future__ import annotations

import copy
import os
from collections import OrderedDict

import pytest

import unihook

if os.environ.get("UNIHOOK_CONFORMANCE_BACKEND") == "mindspore":  # (make test-mindspore)
    # before paddle: paddle's oneDNN build breaks a later MindSpore import
    pytest.importorskip("mindspore")

from test_hooks_carried_over import FRAMEWORKS, _Layers  # noqa: E402


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_shallow_copy_runs_the_hooks_registered_on_the_module_after_unihooks_left(
    framework: str,
) -> None:
    """FINDING 5: the copy's dict, unihook's retired one, answered ``len()`` (0) from its own
    storage, and the framework's call, testing the dict's truth first, never ran the native
    hooks registered on the module since (torch); ``list()`` showed them (FINDING 2)."""
    layers = _Layers(framework)
    m = layers.linear()
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    twin = copy.copy(m)
    handle.remove()
    ran: list[str] = []
    layers.register(m, lambda *a: ran.append("pre"), pre=True)
    layers.register(m, lambda *a: ran.append("post"), pre=False)
    layers.input_grad(twin)
    assert ran == ["pre", "post"]
    for attr in layers.attrs:
        mine, shared = getattr(m, attr), getattr(twin, attr)
        assert len(shared) == len(mine) == 1 and bool(shared)
        (key,) = list(mine)
        assert list(shared) == [key] and key in shared and shared[key] is mine[key]
        assert shared.get(key) is mine[key] and shared.get(key + 1000) is None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_shallow_copys_dict_after_every_hook_left_reads_empty(framework: str) -> None:
    """FINDING 2: ``len``, ``bool``, ``in`` and ``[]`` of the copy's dict saw the removed
    native hook (as a forwarder), iteration saw none: ``while d: d.popitem()`` raised KeyError,
    ``if d: next(iter(d))`` StopIteration."""
    layers = _Layers(framework)
    m = layers.linear()
    native = layers.register(m, lambda *a: None, pre=True)
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    twin = copy.copy(m)
    handle.remove()
    native.remove()
    shared = getattr(twin, layers.attrs[0])
    assert len(shared) == 0 and not shared
    assert [k for k in range(1000) if k in shared] == []
    while shared:  # (bounded: the dict is empty)
        shared.popitem()
    layers.input_grad(twin)
    assert type(getattr(m, layers.attrs[0])) is OrderedDict


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_module_taking_back_a_dict_its_copy_holds_keeps_the_copys_dispatchers(
    framework: str,
) -> None:
    """FINDING 3: the copy's backward hook went into the retired dict it shares; a backward
    hook registered on the module after that took the dict back and emptied it of the copy's
    dispatchers: the copy's hook never fired (torch), or its call raised BackendStateError
    (the copy's post-hook dict its own, a library's ``OrderedDict(d)``)."""
    layers = _Layers(framework)
    m = layers.linear()
    first = unihook.register_full_backward_pre_hook(m, lambda *a: None)
    twin = copy.copy(m)
    post = layers.attrs[1]
    layers.assign(twin, post, OrderedDict(getattr(twin, post)))
    first.remove()
    fired: list[str] = []
    on_twin = unihook.register_full_backward_hook(twin, lambda *a: fired.append("twin"))
    on_m = unihook.register_full_backward_hook(m, lambda *a: fired.append("m"))
    layers.input_grad(twin)
    # (and "m" first with the framework alone: README, shallow copies; MindSpore, whose
    # lazy dicts unihook's dispatchers follow into, shares the post-hook dict again)
    assert "twin" in fired and set(fired) <= {"twin", "m"}
    fired.clear()
    layers.input_grad(m)
    assert "m" in fired and set(fired) <= {"twin", "m"}
    on_twin.remove()
    on_m.remove()
    fired.clear()
    layers.input_grad(twin)
    layers.input_grad(m)
    assert fired == []


@pytest.mark.parametrize("framework", ["torch", "paddle"])  # (a MindSpore Dense does not pickle)
def test_a_shallow_copy_holding_a_retired_dict_pickles(framework: str) -> None:
    """helper-168's FINDING 4: the retired dict's values forward to the framework's dict by a
    weak reference: pickling the copy raised TypeError, with no unihook hook left anywhere."""
    import pickle

    layers = _Layers(framework)
    m = layers.linear()
    ran: list[str] = []
    layers.register(m, _Ran(ran), pre=False)
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    twin = copy.copy(m)
    handle.remove()
    loaded = pickle.loads(pickle.dumps(twin))
    layers.input_grad(loaded)
    (hook,) = getattr(loaded, layers.attrs[1]).values()
    assert hook.into == ["post"]


class _Ran:
    """A forward hook that pickles."""

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def __call__(self, *args: object) -> None:
        self.into.append("post")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("copies", [0, 1, 2])
def test_every_module_holding_the_dict_gets_the_frameworks_back_and_only_then_is_it_searched(
    framework: str, copies: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last hook's removal gives the framework's dict back to every module holding
    unihook's, the copies made while it held it too, as the one dict the framework's copy and
    module share (helper-174's FINDINGS 3 and 4: a copy kept the retired dict). The copies
    are told by the retired dict's reference count (`_pinned._references`, calibrated at
    import): without one, no search of every object runs."""
    from unihook import _pinned

    searched: list[int] = []
    search = _pinned._modules_holding

    def counted(*args: object) -> list[object]:
        searched.append(1)
        return search(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_pinned, "_modules_holding", counted)
    layers = _Layers(framework)
    m = layers.linear()
    frameworks = {attr: getattr(m, attr) for attr in layers.attrs}
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    layers.input_grad(m)
    twins = [copy.copy(m) for _ in range(copies)]
    handle.remove()
    for attr in layers.attrs:
        assert getattr(m, attr) is frameworks[attr]
        assert all(getattr(twin, attr) is frameworks[attr] for twin in twins)
    # (MindSpore's copy shares the cell's __dict__ itself: nothing else holds the dict)
    assert (searched != []) == (copies > 0 and framework != "mindspore")
