"""A shallow copy of a hooked module (``copy.copy(m)``) shares the original's hook dicts, as in
torch: the hooks registered on either run for both, each once per call, with the module called.
Global hooks run once per call of either, as torch's, which live outside the modules: a copy
never gets a second set of unihook's global dispatchers beside the ones the shared dicts hold.
Removing every hook leaves both modules as native registration alone would."""

from __future__ import annotations

import copy
import gc
from collections import OrderedDict
from typing import Any

import pytest

import unihook

W = [[1.0, 2.0, 3.0], [-4.0, -5.0, -6.0]]
B = [1.0, 2.0]
X = [[1.0, -1.0, 2.0]]


def _register(kit: Any, module: Any, own: str, seen: list[tuple[str, Any]]) -> list[Any]:
    def record(name: str) -> Any:
        return lambda m, *_: seen.append((name, m))

    if own == "backward":
        return [
            unihook.register_full_backward_hook(module, record("own_full")),
            unihook.register_full_backward_pre_hook(module, record("own_pre")),
        ]
    if own == "forward":
        return [
            unihook.register_forward_pre_hook(module, record("own_fwd_pre")),
            unihook.register_forward_hook(module, record("own_fwd")),
        ]
    return []


def _register_globals(kit: Any, seen: list[tuple[str, Any]]) -> list[Any]:
    def record(name: str) -> Any:
        return lambda m, *_: seen.append((name, m))

    return [
        unihook.register_module_forward_pre_hook(record("g_fwd_pre"), backend=kit.name),
        unihook.register_module_forward_hook(
            lambda m, a, k, o: seen.append(("g_fwd", m)), with_kwargs=True, backend=kit.name
        ),
        unihook.register_module_full_backward_pre_hook(record("g_pre"), backend=kit.name),
        unihook.register_module_full_backward_hook(record("g_full"), backend=kit.name),
    ]


def _step(kit: Any, module: Any) -> None:
    x = kit.tensor(X, requires_grad=True)
    kit.backward(module(x).sum())


def _expected(own: str) -> list[str]:
    names = ["g_fwd_pre", "g_fwd", "g_pre", "g_full"]
    if own == "backward":
        names += ["own_pre", "own_full"]
    elif own == "forward":
        names += ["own_fwd_pre", "own_fwd"]
    return sorted(names)


@pytest.mark.parametrize("copied", ["after_a_call", "before_a_call", "before_the_globals"])
@pytest.mark.parametrize("native_pre", [False, True], ids=["", "native_pre"])
@pytest.mark.parametrize("own", ["none", "backward", "forward"])
def test_a_shallow_copy_runs_each_hook_once_per_call(
    backend: Any, own: str, native_pre: bool, copied: str
) -> None:
    kit = backend
    module = kit.linear(3, 2, W, B)
    natives = []
    if native_pre:
        natives.append(kit.native_hook(module, "forward_pre", lambda m, args: None))
    seen: list[tuple[str, Any]] = []
    handles = _register(kit, module, own, seen)
    twin = None
    try:
        if copied == "before_the_globals":
            twin = copy.copy(module)
        handles += _register_globals(kit, seen)
        if copied == "before_a_call":
            twin = copy.copy(module)
        _step(kit, module)
        if twin is None:
            twin = copy.copy(module)
        for called in (twin, module, twin):
            seen.clear()
            _step(kit, called)
            assert sorted(name for name, _ in seen) == _expected(own), f"{called is twin=}"
            assert all(m is called for _, m in seen), "a hook saw the other module"
    finally:
        for handle in handles:
            handle.remove()
    assert twin is not None
    seen.clear()
    _step(kit, module)
    _step(kit, twin)
    assert seen == []
    plain = kit.linear(3, 2, W, B)
    if native_pre:
        kit.native_hook(plain, "forward_pre", lambda m, args: None)
    assert kit.hook_counts(module) == kit.hook_counts(plain)
    assert kit.hook_counts(twin) == kit.hook_counts(plain)
    for remove in natives:
        remove()
    _step(kit, twin)
    assert kit.hook_counts(twin) == kit.hook_counts(kit.linear(3, 2, W, B))
    assert kit.hook_counts(module) == kit.hook_counts(twin)


def _nothing_left(kit: Any, module: Any, twin: Any, seen: list[Any]) -> None:
    """Every hook removed: neither module runs one, and both hold what a fresh one does."""
    seen.clear()
    _step(kit, module)
    _step(kit, twin)
    assert seen == []
    assert kit.hook_counts(module) == kit.hook_counts(kit.linear(3, 2, W, B))
    assert kit.hook_counts(twin) == kit.hook_counts(module)


@pytest.mark.parametrize("on", ["original", "copy"])
def test_native_hooks_after_unihooks_are_gone_run_on_both(backend: Any, on: str) -> None:
    # without unihook both modules hold one dict: a native hook registered on either, once
    # unihook's last hook went, runs for both calls, and its removal reaches both
    kit = backend
    module = kit.linear(3, 2, W, B)
    handle = unihook.register_forward_pre_hook(module, lambda m, args: None)
    twin = copy.copy(module)
    _step(kit, twin)
    handle.remove()
    seen: list[Any] = []
    remove = kit.native_hook(
        module if on == "original" else twin, "forward_pre", lambda m, args: seen.append(m)
    )
    _step(kit, module)
    _step(kit, twin)
    assert seen == [module, twin]
    remove()
    _nothing_left(kit, module, twin, seen)


@pytest.mark.parametrize("hooked", ["copy", "original"])
def test_a_backward_hook_after_the_original_gave_its_dict_back_keeps_the_shared_hooks(
    backend: Any, hooked: str
) -> None:
    """A shallow copy made while unihook held the original's dict; the hook goes, the
    original takes the framework's dict back, native forward hooks are registered on it, and
    a backward hook on one of them: both modules run the native hooks and that hook, as
    torch's, whose copy shares the one dict (until 2026-12-06, with the hook on the copy, the
    copy ran neither native hook and the original not the hook: helper-169's FINDING 3)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    _step(kit, module)
    twin = copy.copy(module)
    handle.remove()
    seen: list[str] = []
    removes = [kit.native_hook(module, "forward", lambda m, args, out: seen.append("f1"))]
    target = twin if hooked == "copy" else module
    handle = unihook.register_full_backward_hook(target, lambda m, gi, go: seen.append("C"))
    removes.append(kit.native_hook(module, "forward", lambda m, args, out: seen.append("f2")))
    try:
        for called in (twin, module, twin):
            seen.clear()
            _step(kit, called)
            assert seen == ["f1", "f2", "C"], f"{called is twin=}"
    finally:
        handle.remove()
    for remove in removes:
        remove()
    _nothing_left(kit, module, twin, seen)


@pytest.mark.parametrize("then", ["copy_dies", "copy_dict_replaced"])
def test_the_original_keeps_its_native_hooks_after_the_copys_hook_came_and_went(
    backend: Any, then: str
) -> None:
    """A native hook on the original; a copy made while unihook held its dict; that hook
    removed; a backward hook on the copy, removed: both modules get the framework's dict
    back, as torch's copy and original share it, and the original runs its native hook
    once the copy died or a library gave the copy another dict (until 2026-12-06 the
    original kept a retired dict, which holds the framework's weakly, and ran nothing:
    helper-174's FINDING 5, a regression of the fix above, caught before it landed)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    seen: list[str] = []
    remove = kit.native_hook(module, "forward", lambda m, args, out: seen.append("f"))
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    _step(kit, module)
    twin: Any = copy.copy(module)
    handle.remove()
    unihook.register_full_backward_hook(twin, lambda m, gi, go: None).remove()
    if then == "copy_dies":
        twin = None
        gc.collect()
    else:
        kit.replace_hook_dict(twin, "forward", OrderedDict)
    seen.clear()
    _step(kit, module)
    assert seen == ["f"]
    remove()
    if then == "copy_dict_replaced" and kit.name == "mindspore":
        return  # (MindSpore alone leaves the hook in the original there: measured)
    assert kit.hook_counts(module) == kit.hook_counts(kit.linear(3, 2, W, B))


def test_a_forward_hook_removed_is_gone_where_copy_and_original_each_had_backward_hooks(
    backend: Any,
) -> None:
    """A copy made before any hook; a backward hook on each, a forward hook on the copy;
    all removed: neither module runs the forward hook (until 2026-12-07 both ran it for
    good: each module had a HookDict over the one framework dict, and the copy's, retired
    first, was dropped from unihook's table when the original's retired, with it the
    forward hook's removal: helper-174's FINDING 1)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    twin = copy.copy(module)
    seen: list[str] = []
    handles = [
        unihook.register_full_backward_pre_hook(twin, lambda m, go: None),
        unihook.register_full_backward_hook(module, lambda m, gi, go: None),
        unihook.register_forward_hook(twin, lambda m, args, out: seen.append("F")),
    ]
    for called in (module, twin):
        seen.clear()
        _step(kit, called)
        assert seen == ["F"]
    for handle in handles:
        handle.remove()
    _nothing_left(kit, module, twin, seen)


@pytest.mark.parametrize("cycle", [False, True], ids=["", "in_a_cycle"])
@pytest.mark.parametrize("hooked", ["original", "copy"])
@pytest.mark.parametrize("forward", ["native", "unihook"])
def test_a_hook_registered_while_unihook_held_the_dict_is_removed_after_its_module_died(
    backend: Any, forward: str, hooked: str, cycle: bool
) -> None:
    """A copy made before any hook; a backward hook and a forward hook on one of them; that
    one dies; the hooks' handles still remove the forward hook from the dict the other one
    shares (until 2026-12-07 the removal did nothing, the handle's weak reference was to
    unihook's dict, which died with the module, and the other ran the hook for good:
    helper-174's FINDING 2). Open where the module dies in a reference cycle: the collector
    clears the handle's weak reference before unihook's dict can be kept (helper-175's
    FINDING A)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    twin = copy.copy(module)
    mortal, kept = (module, twin) if hooked == "original" else (twin, module)
    if cycle and kit.name == "mindspore":
        pytest.skip("MindSpore's copy shares the cell's __dict__: the other one keeps it alive")
    if cycle:
        vars(mortal)["_cycle"] = [mortal]
    seen: list[str] = []
    handle = unihook.register_full_backward_hook(mortal, lambda m, gi, go: None)
    if forward == "native":
        remove = kit.native_hook(mortal, "forward", lambda m, args, out: seen.append("f"))
    else:
        remove = unihook.register_forward_hook(mortal, lambda m, args, out: seen.append("f")).remove
    _step(kit, kept)
    assert seen == ["f"]
    del mortal, module, twin
    gc.collect()
    handle.remove()
    remove()
    seen.clear()
    _step(kit, kept)
    if cycle:
        pytest.xfail("helper-175's FINDING A: the handle's weak reference was cleared first")
    assert seen == []
    assert kit.hook_counts(kept) == kit.hook_counts(kit.linear(3, 2, W, B))


@pytest.mark.parametrize("cycle", [False, True], ids=["", "in_a_cycle"])
def test_a_hook_registered_while_unihook_held_the_dict_is_removed_after_a_copy_died(
    backend: Any, cycle: bool
) -> None:
    """A native hook registered while unihook held the dict; a copy made then, which holds
    unihook's dict retired once the backward hook goes, dies: the hook's handle still
    removes it from the dict the original got back (helper-175's FINDING B, a regression
    of a first version of the fix above, caught before it landed: the retired dict, held
    by the copy alone, died with it in a cycle)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    seen: list[str] = []
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    remove = kit.native_hook(module, "forward", lambda m, args, out: seen.append("f"))
    twin = copy.copy(module)
    handle.remove()
    if cycle and kit.name != "mindspore":
        vars(twin)["_cycle"] = [twin]
    del twin
    gc.collect()
    remove()
    _step(kit, module)
    assert seen == []
    assert kit.hook_counts(module) == kit.hook_counts(kit.linear(3, 2, W, B))


@pytest.mark.parametrize("then", ["original_dies", "original_dict_replaced"])
def test_a_copy_made_while_unihook_held_the_dict_keeps_the_native_hooks(
    backend: Any, then: str
) -> None:
    """Native hooks on the original; a copy made while unihook held its dict; unihook's hook
    removed: the copy runs the native hooks once the original died, or a library gave it
    another dict, as torch's copy, which holds the framework's dict (until 2026-12-07 the
    copy kept unihook's retired dict, which refers to the framework's weakly, and ran none:
    helper-174's FINDING 3)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    seen: list[str] = []
    kit.native_hook(module, "forward_pre", lambda m, args: seen.append("p"))
    kit.native_hook(module, "forward", lambda m, args, out: seen.append("f"))
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    _step(kit, module)
    twin = copy.copy(module)
    handle.remove()
    if then == "original_dict_replaced":
        kit.replace_hook_dict(module, "forward", OrderedDict)
    else:
        module = None
        gc.collect()
    seen.clear()
    _step(kit, twin)
    assert seen == ["p", "f"]


def test_a_deep_copy_of_a_copy_that_outlived_its_original(backend: Any) -> None:
    """A copy made while unihook held its original's dict, the hook removed, the original
    dead: the copy deep-copies, as torch's (until 2026-12-07 TypeError, a weak reference to
    the dead original: helper-174's FINDING 4), into a plain dict."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    _step(kit, module)
    twin = copy.copy(module)
    handle.remove()
    module = None
    gc.collect()
    deep = copy.deepcopy(twin)
    _step(kit, deep)
    assert all(type(d) is OrderedDict for d in kit.hook_dicts(deep).values())
    assert kit.hook_counts(deep) == kit.hook_counts(kit.linear(3, 2, W, B))


def test_a_copy_made_while_unihook_held_the_dict_runs_its_hooks_after_a_removal_past_the_original(
    backend: Any,
) -> None:
    """Native hooks and a backward hook on the original; a copy made then; the original
    dies; the backward hook's removal (its dispatchers leave the dict the copy holds) leaves
    the copy running the native hooks, as torch's, and deep-copying (helper-176's FINDING 2,
    helper-177's FINDING 1, regressions of first versions of the removal after a module's
    death, caught before they landed)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    seen: list[str] = []
    kit.native_hook(module, "forward_pre", lambda m, args: seen.append("p"))
    kit.native_hook(module, "forward", lambda m, args, out: seen.append("f"))
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("B"))
    twin = copy.copy(module)
    module = None
    gc.collect()
    _step(kit, twin)
    assert seen == ["p", "f", "B"]
    handle.remove()
    seen.clear()
    _step(kit, twin)
    assert seen == ["p", "f"]
    if kit.name == "mindspore":
        return  # (MindSpore's own deep copy of such a cell raises: measured)
    deep = copy.deepcopy(twin)  # (TypeError for a day: helper-177's FINDING 1)
    seen.clear()
    _step(kit, deep)
    assert seen == ["p", "f"]
    assert all(type(d) is OrderedDict for d in kit.hook_dicts(deep).values())


def test_a_copy_keeps_no_dispatcher_after_a_library_replaced_the_originals_dict(
    backend: Any,
) -> None:
    """A backward hook on the original; a copy made then; a library gives the original a
    copy of its forward pre-hook dict; the hook removed: neither module keeps a dispatcher
    (until 2026-12-07 the copy kept the removed hook's, run at each of its calls: helper-176's
    FINDING 1)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: None)
    twin = copy.copy(module)
    kit.replace_hook_dict(module, "forward_pre", OrderedDict)
    handle.remove()
    gc.collect()
    fresh = kit.hook_counts(kit.linear(3, 2, W, B))
    for each in (module, twin):
        _step(kit, each)
        assert kit.hook_counts(each) == fresh


def test_a_dead_originals_flags_leave_the_tables_its_copy_shares(backend: Any) -> None:
    """A copy made before any hook; a backward hook on each; the original dies; both hooks
    removed: the copy's flag tables hold no key of unihook's (until 2026-12-07 the original's
    post-dispatcher stayed flagged there for good, the copy having flagged the table first:
    helper-176's seed 4)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    twin = copy.copy(module)
    handles = [
        unihook.register_full_backward_hook(each, lambda m, gi, go: None) for each in (twin, module)
    ]
    _step(kit, twin)
    module = None
    gc.collect()
    for handle in handles:
        handle.remove()
    gc.collect()
    _step(kit, twin)
    assert kit.hook_counts(twin) == kit.hook_counts(kit.linear(3, 2, W, B))


@pytest.mark.parametrize("removed", [False, True], ids=["", "removed"])
def test_a_deep_copy_after_a_library_rebuilt_a_dict_a_copy_shares(
    backend: Any, removed: bool
) -> None:
    """A backward hook on the original; a shallow copy made then; a library gives the
    original a copy of its forward hook dict (the shallow copy keeps unihook's); a deep copy
    of the original: it runs its copy of the hook, as torch's, and the original and the
    shallow copy theirs (until 2026-12-07 every backward of the deep copy raised
    BackendStateError: its post-dispatcher was the original's, helper-175's FINDING D)."""
    kit = backend
    if kit.name == "mindspore":
        pytest.skip("MindSpore's own deep copy of a cell with hooks raises (measured)")
    module: Any = kit.linear(3, 2, W, B)
    seen: list[str] = []

    class Hook:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, m: Any, grad_input: Any, grad_output: Any) -> None:
            seen.append(self.name)

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            return Hook("copy")

    handle = unihook.register_full_backward_hook(module, Hook("original"))
    twin = copy.copy(module)
    kit.replace_hook_dict(module, "forward", OrderedDict)
    deep = copy.deepcopy(module)
    if removed:
        handle.remove()
    for each, expected in ((module, "original"), (twin, "original"), (deep, "copy")):
        seen.clear()
        _step(kit, each)
        assert seen == ([] if removed and each is not deep else [expected])


@pytest.mark.parametrize("rebuilt", ["forward", "both"])
def test_a_copy_whose_dicts_a_library_rebuilt_runs_the_hooks_after_its_original_died(
    backend: Any, rebuilt: str
) -> None:
    """A shallow copy made after a backward hook; a library gives the copy copies of its hook
    dicts; the original dies: the copy runs the hook, as torch's, whose copy shares the
    original's backward hook dict (helper-179's FINDING 1: a first version of freeing a dead
    module's hooks, caught before a CI, dropped them)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    seen: list[str] = []
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("B"))
    twin = copy.copy(module)
    for name in ("forward", "forward_pre") if rebuilt == "both" else ("forward",):
        kit.replace_hook_dict(twin, name, OrderedDict)
    module = None
    gc.collect()
    _step(kit, twin)
    assert seen == ["B"]
    handle.remove()
    seen.clear()
    _step(kit, twin)
    assert seen == []


def _dict_types(kit: Any, module: Any) -> dict[str, type]:
    return {name: type(value) for name, value in kit.hook_dicts(module).items()}


@pytest.mark.parametrize("then", ["original_dies", "original_dict_replaced"])
def test_a_backward_hooks_removal_after_the_original_let_go_gives_the_copy_the_frameworks_dict(
    backend: Any, then: str
) -> None:
    """Native hooks on the original; a copy made while unihook's backward hook was on it; the
    original dies, or a library gives it another pre-hook dict; the hook's removal leaves the
    copy running the native hooks, with the framework's own dicts (until 2026-12-07 the copy
    kept an installed HookDict for good, holding unihook's dispatcher where the library gave
    the original another dict, helper-176's FINDING 1; a first fix of that retired it, and
    the copy ran none of the native hooks, its FINDING 2)."""
    kit = backend
    module: Any = kit.linear(3, 2, W, B)
    fresh = _dict_types(kit, kit.linear(3, 2, W, B))
    seen: list[str] = []
    kit.native_hook(module, "forward_pre", lambda m, args: seen.append("p"))
    kit.native_hook(module, "forward", lambda m, args, out: seen.append("f"))
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("B"))
    _step(kit, module)
    twin = copy.copy(module)
    if then == "original_dies":
        module = None
        gc.collect()
    else:
        kit.replace_hook_dict(module, "forward_pre", OrderedDict)
    seen.clear()
    _step(kit, twin)
    assert seen == ["p", "f", "B"]
    handle.remove()
    gc.collect()
    seen.clear()
    _step(kit, twin)
    assert seen == ["p", "f"]
    assert _dict_types(kit, twin) == fresh
    if module is not None:
        seen.clear()
        _step(kit, module)
        assert seen == ["p", "f"]
        assert _dict_types(kit, module) == fresh


@pytest.mark.parametrize("replaced_first", [False, True], ids=["", "replaced_first"])
def test_a_library_replacing_a_dict_a_copy_shares_leaves_no_dispatcher_behind(
    backend: Any, replaced_first: bool
) -> None:
    """Backward hooks on the original (the dispatchers in); a copy made then shares its
    dicts; a library gives the original a copy of its pre-hook dict (the copy keeps the old
    one alive); the hooks' removal takes the dispatchers out of both, each module's dicts the
    framework's own again (until 2026-12-07 the copy kept unihook's dict, with a dispatcher
    running at each call, for good: helper-186's seed 157, helper-187's FINDING 1)."""
    kit = backend
    module = kit.linear(3, 2, W, B)
    fresh = _dict_types(kit, kit.linear(3, 2, W, B))
    seen: list[Any] = []
    handles = [
        unihook.register_full_backward_pre_hook(module, lambda m, go: seen.append("P")),
        unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("B")),
    ]
    _step(kit, module)
    if replaced_first:
        kit.replace_hook_dict(module, "forward_pre", OrderedDict)
    twin = copy.copy(module)
    kit.replace_hook_dict(module, "forward_pre", OrderedDict)
    for handle in handles:
        handle.remove()
    _nothing_left(kit, module, twin, seen)
    assert _dict_types(kit, module) == fresh
    assert _dict_types(kit, twin) == fresh
