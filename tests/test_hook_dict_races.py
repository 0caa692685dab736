"""unihook's hook dicts beside changes it does not make under its lock: another thread's native
registration, a finalizer's removal (helper-158's FINDING 6, seen under stress only: these
make the change land at the one step each failed at)."""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from typing import Any, Callable

import pytest

import unihook
from unihook._pinned import HookDict

if os.environ.get("UNIHOOK_CONFORMANCE_BACKEND") == "mindspore":  # (make test-mindspore)
    # before paddle: paddle's oneDNN build breaks a later MindSpore import
    pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")


def test_a_key_gone_while_unihooks_last_hook_leaves_is_left_out() -> None:
    """The last unihook hook leaving a module's forward hook dict turns each key into a
    forwarder; a key removed between its look at the keys and that step (another thread, a
    finalizer) failed the removal with KeyError."""
    module = torch.nn.Linear(2, 2)
    seen: list[str] = []
    native = module.register_forward_hook(lambda *a: seen.append("native"))
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    hooks = module._forward_hooks
    assert isinstance(hooks, HookDict)
    stale = HookDict._copy(hooks)

    def copy_then_remove() -> tuple[tuple[int, Any], ...]:
        OrderedDict.pop(hooks, native.id, None)  # (gone after the look)
        return stale

    hooks._copy = copy_then_remove  # type: ignore[method-assign]
    handle.remove()
    assert type(module._forward_hooks) is OrderedDict
    module(torch.ones(1, 2))
    native.remove()
    assert not module._forward_hooks


class _ChangedWhileRead(OrderedDict):  # type: ignore[type-arg]
    """A dict another thread changes the first time it is read whole."""

    def items(self) -> Any:
        if not getattr(self, "changed", False):
            self.changed = True
            raise RuntimeError("OrderedDict mutated during iteration")
        return super().items()


def test_a_dict_changed_while_unihook_takes_it_over_is_read_again() -> None:
    module = torch.nn.Linear(2, 2)
    hooks = _ChangedWhileRead()
    hooks[7] = lambda *a: None
    module._forward_hooks = hooks
    handle = unihook.register_full_backward_hook(module, lambda *a: None)
    try:
        assert 7 in module._forward_hooks
    finally:
        handle.remove()


def _native(framework: str) -> tuple[Any, str, Callable[[Any, Any], int]]:
    """A layer of `framework`, the attribute of its forward hook dict, and a native
    registration's first step: the framework's handle made on a dict it read, its id."""
    if framework == "torch":
        from torch.utils.hooks import RemovableHandle

        return torch.nn.Linear(2, 2), "_forward_hooks", lambda d, _: RemovableHandle(d).id
    if framework == "mindspore":
        ms = pytest.importorskip("mindspore")
        from mindspore.common.hook_handle import HookHandle
        from mindspore.nn.cell import _update_hook_version

        def handle(hooks: Any, _: Any) -> int:
            _update_hook_version()  # (MindSpore's registration does: its call reads it)
            return HookHandle(hooks).handle_id

        return ms.nn.Dense(2, 2), "_forward_hook", handle
    paddle = pytest.importorskip("paddle")
    from paddle.nn.layer.layers import HookRemoveHelper

    layer = paddle.nn.Linear(2, 2)
    return layer, "_forward_post_hooks", lambda d, _: HookRemoveHelper(d)._hook_id


def _input(framework: str) -> Any:
    if framework == "torch":
        return torch.ones(1, 2)
    if framework == "mindspore":
        return pytest.importorskip("mindspore").ops.ones((1, 2))
    return pytest.importorskip("paddle").ones([1, 2])


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_a_native_hook_removed_and_another_added_behind_unihooks_dict_are_followed(
    framework: str,
) -> None:
    """helper-160's FINDING 4 (a native hook firing twice per call under threads): a native
    handle made before unihook took the dict over removes its hook from the dict it holds,
    and a registration that read that dict just before the take-over inserts there. The
    number of hooks is the same: until 2026-12-06 the removed hook kept running and the
    added one never ran; torch runs the added one only."""
    layer, attr, handle_on = _native(framework)
    seen: list[str] = []
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    old = register(lambda *a: seen.append("removed"))
    origin = getattr(layer, attr)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        assert isinstance(getattr(layer, attr), HookDict)
        old.remove()  # (from the dict it was made on)
        key = handle_on(origin, None)
        origin[key] = lambda *a: seen.append("added")  # (the racing registration's insert)
        layer(_input(framework))
        assert seen == ["added"]
        seen.clear()
        register(lambda *a: seen.append("later"))
        layer(_input(framework))
        assert seen == ["added", "later"]
    finally:
        backward.remove()
    seen.clear()
    layer(_input(framework))
    assert seen == ["added", "later"]


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_a_prepend_whose_insert_went_to_the_dict_unihook_took_over_moves_it(
    framework: str,
) -> None:
    """A registration with prepend reads the hook dict three times (handle, insert, move): an
    insert into the dict unihook took over just after, then the move in unihook's, raised
    KeyError from the registration until 2026-12-06, the hook left last."""
    layer, attr, handle_on = _native(framework)
    seen: list[str] = []
    origin = getattr(layer, attr)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    forward = unihook.register_forward_hook(layer, lambda *a: seen.append("unihook"))
    try:
        key = handle_on(origin, None)
        origin[key] = lambda *a: seen.append("prepended")
        getattr(layer, attr).move_to_end(key, last=False)
        layer(_input(framework))
        assert seen == ["prepended", "unihook"]
    finally:
        forward.remove()
        backward.remove()
    assert getattr(layer, attr) is origin and list(origin) == [key]


class _EqualToAll:
    """A hook whose ``==`` says True to anything (a dataclass recorder equal to a fresh one):
    only its identity tells one from another (helper-162's FINDING 1)."""

    def __init__(self, run: Callable[..., None]) -> None:
        self.run = run

    def __call__(self, *args: Any) -> None:
        self.run(*args)

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def _plans() -> Any:
    """Steps on one layer's forward hook dict: ``read`` (a registration reads the dict),
    ``native`` / ``late`` (a native registration, whole or with its insert going to the dict
    read at the last ``read``: another thread's, racing unihook's take-over or hand-back),
    ``remove``, ``swap`` (another hook under its key, in the dict read: a library's wrapper),
    unihook's backward (``bw``) and forward (``fw``) hooks toggled, ``call``."""
    from hypothesis import strategies as st

    index = st.integers(0, 3)
    step = st.one_of(
        st.just(("read",)),
        st.tuples(st.sampled_from(["native", "late"]), index, st.booleans()),
        st.tuples(st.sampled_from(["remove", "swap"]), index),
        st.tuples(st.sampled_from(["bw", "fw"])),
        st.just(("call",)),
    )
    return st.lists(step, min_size=1, max_size=25)


def _run_plan(framework: str, plan: list[tuple[Any, ...]], ours: bool) -> list[tuple[int, ...]]:
    """The native hooks each call ran, in order; unihook's steps skipped unless `ours`."""
    layer, attr, handle_on = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    fired: list[int] = []
    natives: dict[int, Any] = {}
    unihooks: dict[str, Any] = {}
    read = getattr(layer, attr)
    calls: list[tuple[int, ...]] = []

    def call() -> None:
        fired.clear()
        layer(_input(framework))
        calls.append(tuple(fired))

    def hook(i: int) -> Callable[..., None]:
        return _EqualToAll(lambda *a: fired.append(i))

    for step in plan:
        op = step[0]
        if op == "read":
            read = getattr(layer, attr)
        elif op in ("native", "late"):
            i, prepend = step[1], step[2]
            if i in natives:
                natives.pop(i).remove()
            if op == "native":
                natives[i] = register(hook(i), prepend=prepend)
                continue
            key = handle_on(read, None)
            read[key] = hook(i)
            if prepend:
                getattr(layer, attr).move_to_end(key, last=False)

            class _Late:  # (the framework's handle made on the dict read: removal by key)
                def __init__(self, hooks: Any, key: int) -> None:
                    self.hooks, self.key = hooks, key

                def remove(self) -> None:
                    self.hooks.pop(self.key, None)

            natives[i] = _Late(read, key)
        elif op == "remove":
            if step[1] in natives:
                natives.pop(step[1]).remove()
        elif op == "swap":  # another hook put under its key, in the dict read (a wrapper)
            handle = natives.get(step[1])
            key = getattr(handle, "key", None)
            for name in ("id", "_hook_id", "handle_id"):
                key = getattr(handle, name, key)
            if key is not None and key in read:
                read[key] = hook(step[1] + 10)
        elif op in ("bw", "fw") and ours:
            if op in unihooks:
                unihooks.pop(op).remove()
            elif op == "bw":
                unihooks[op] = unihook.register_full_backward_hook(layer, lambda *a: None)
            else:
                unihooks[op] = unihook.register_forward_hook(layer, lambda *a: None)
        elif op == "call":
            call()
    for handle in unihooks.values():
        handle.remove()
    call()
    for handle in natives.values():
        handle.remove()
    call()
    return calls


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_generated_native_registrations_racing_unihooks_run_as_without_it(
    framework: str,
) -> None:
    """Generated plans of native registrations, whole or racing unihook's take-over and
    hand-back of the dict (an insert into the dict read before), removals, and unihook's
    hooks coming and going: each call runs the native hooks the framework alone runs, in its
    order, also after unihook's hooks left (until 2026-12-06 a removed hook kept running
    and an added one never ran: helper-160's FINDING 4)."""
    from hypothesis import HealthCheck, example, given, settings

    pytest.importorskip(framework)

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(_plans())
    # (what the generation found against earlier versions, kept whatever it generates now)
    @example([("fw",), ("bw",), ("late", 0, False), ("fw",), ("call",)])
    @example([("bw",), ("late", 0, True)])
    @example([("bw",), ("native", 0, False), ("swap", 0), ("call",)])
    def check(plan: list[tuple[Any, ...]]) -> None:
        assert _run_plan(framework, plan, True) == _run_plan(framework, plan, False)

    check()


class _RaisingEq:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __call__(self, *args: Any) -> None:
        self.seen.append("new")

    def __eq__(self, other: object) -> bool:
        raise TypeError("no ==")

    __hash__ = object.__hash__


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_a_hook_whose_eq_raises_put_behind_the_dict_runs(framework: str) -> None:
    """helper-162's FINDING 1: the origin's hooks were compared with ``==``: a hook whose
    ``__eq__`` raises, put under a key through a dict read before the take-over, raised from
    the module's call (a numpy-like one's ValueError too); torch runs it."""
    layer, attr, _ = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    seen: list[str] = []
    native = register(lambda *a: seen.append("old"))
    origin = getattr(layer, attr)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        layer(_input(framework))
        seen.clear()
        key = next(iter(origin))
        origin[key] = _RaisingEq(seen)
        layer(_input(framework))
        assert seen == ["new"]
    finally:
        backward.remove()
        native.remove()


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_the_dict_unihook_hands_back_keeps_no_hook_alive(framework: str) -> None:
    """helper-162's FINDING 2: the handed-back dict lives as long as the framework's (its
    old handles remove through it) and its cache of the framework's hooks kept a hook
    holding its module, and the module, alive for good."""
    import gc
    import weakref

    layer, _, _ = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    register(lambda *a, layer=layer: None)  # (a hook holding its module)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    layer(_input(framework))
    backward.remove()
    ref = weakref.ref(layer)
    del layer, backward, register
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
def test_the_last_hook_of_the_dict_is_the_last_registered_beside_unihooks(framework: str) -> None:
    """helper-162's FINDING 4: ``next(reversed(hooks))`` (paddle's `Layer._set_op_attrs` looks
    there for its own hook) was unihook's pinned dispatcher; ``popitem()`` took it."""
    layer, attr, _ = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        first, last = (register(lambda *a: None) for _ in range(2))
        hooks = getattr(layer, attr)
        key = next(reversed(hooks))
        assert key == _key(last)
        assert hooks.popitem()[0] == _key(last)
        assert list(hooks)[:1] == [_key(first)]
        layer(_input(framework))  # (the dispatchers still in)
    finally:
        backward.remove()


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
@pytest.mark.parametrize("last", [True, False])
def test_popitem_pops_no_dispatcher_of_unihooks(framework: str, last: bool) -> None:
    """helper-163's FINDING 1: with the native hooks popped, ``popitem()`` popped unihook's
    pinned dispatcher (the next backward raised BackendStateError); the framework alone
    raises KeyError, and so does the dict now, its dispatchers still running."""
    layer, attr, _ = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    seen: list[str] = []
    backward = unihook.register_full_backward_hook(layer, lambda *a: seen.append("backward"))
    try:
        first, second = (register(lambda *a: None) for _ in range(2))
        hooks = getattr(layer, attr)
        popped = [hooks.popitem(last=last)[0] for _ in range(2)]
        assert popped == [_key(h) for h in ((second, first) if last else (first, second))]
        # (a KeyError, as the framework's; named: `while d: d.popitem()` would not end)
        with pytest.raises(unihook.DispatchersOnlyError, match="full_backward hook on"):
            hooks.popitem(last=last)
        assert isinstance(unihook.DispatchersOnlyError("x"), KeyError)
        assert hooks and list(hooks) == hooks.pinned  # (the module still calls its hooks)
        _backward(framework, layer)
        assert seen == ["backward"]
    finally:
        backward.remove()
    assert len(getattr(layer, attr)) == 0


_PRE_ATTRS = {"torch": "_forward_pre_hooks", "paddle": "_forward_pre_hooks"}


_LOOPS: dict[str, Callable[[Any], None]] = {
    "pop each": lambda hooks: [hooks.pop(key) for key in list(hooks)] and None,
    "del each": lambda hooks: [hooks.__delitem__(key) for key in list(hooks.keys())] and None,
    "pop default": lambda hooks: [hooks.pop(key, None) for key in list(hooks)] and None,
    "while pop first": lambda hooks: _bounded(hooks, lambda: hooks.pop(next(iter(hooks)))),
    "while del last": lambda hooks: _bounded(
        hooks, lambda: hooks.__delitem__(next(reversed(hooks)))
    ),
    "while popitem": lambda hooks: _bounded(hooks, hooks.popitem),
}


def _bounded(hooks: Any, step: Callable[[], object]) -> None:
    """``while hooks: step()``, failing where it would not end."""
    for _ in range(50):
        if not hooks:
            return
        step()
    raise AssertionError("the loop would not end")


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_removing_each_forward_hook_raises_at_unihooks_dispatchers(
    framework: str, loop: str
) -> None:
    """A library empties a module's forward hook dicts key by key; the framework's backward
    hooks live elsewhere and keep firing. helper-164's FINDING 1: unihook's dispatchers went
    with the keys, and its backward hooks, and ones registered later, never fired again,
    silently. helper-165's FINDING 1: left in place silently instead (still counted by
    ``bool``), ``while d: d.pop(next(iter(d)))`` never ended. The forward hooks go, then
    `DispatchersOnlyError` (a KeyError) names them, and the backward hooks keep firing."""
    layer, attr, _ = _native(framework)
    pre_attr = _PRE_ATTRS.get(framework, "_forward_pre_hook")
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    seen: list[str] = []
    ran: list[str] = []
    register(lambda *a: ran.append("native"))
    first = unihook.register_full_backward_hook(layer, lambda *a: seen.append("first"))
    second = None
    try:
        for hooks in (getattr(layer, attr), getattr(layer, pre_attr)):
            with pytest.raises(unihook.DispatchersOnlyError, match="full_backward hook on"):
                _LOOPS[loop](hooks)
            assert list(hooks) == hooks.pinned
        _backward(framework, layer)
        assert (seen, ran) == (["first"], [])
        second = unihook.register_full_backward_hook(layer, lambda *a: seen.append("second"))
        seen.clear()
        _backward(framework, layer)
        assert seen == ["first", "second"]
    finally:
        first.remove()
        if second is not None:
            second.remove()
    assert type(getattr(layer, attr)) is not HookDict and not getattr(layer, attr)
    assert type(getattr(layer, pre_attr)) is not HookDict and not getattr(layer, pre_attr)


def test_pop_with_a_default_while_the_hook_goes_meanwhile_returns() -> None:
    """helper-165's FINDING 2: ``d.pop(k, None)`` raised KeyError where another thread removed
    the hook between the dict's test of the key and its read (about 80 in 3M pops of a
    stress); the framework's dict's never does. Made deterministic: the removal runs at the
    key's second hash inside ``pop``."""
    module = torch.nn.Linear(2, 2)
    backward = unihook.register_full_backward_hook(module, lambda *a: None)
    hooks = module._forward_hooks
    from torch.utils.hooks import RemovableHandle

    handle = RemovableHandle(hooks)
    key = handle.id = _TracedKey(handle.id)
    hooks[key] = lambda *a: None
    hashes = [0]

    def removal_meanwhile() -> None:
        hashes[0] += 1
        if hashes[0] == 2:
            handle.remove()

    try:
        _TracedKey.on_hash = staticmethod(removal_meanwhile)  # type: ignore[assignment]
        hooks.pop(key, None)
        assert hashes[0] >= 2  # (the removal ran inside)
    finally:
        _TracedKey.on_hash = None
        backward.remove()
    assert key not in module._forward_hooks


def _backward(framework: str, layer: Any) -> None:
    """One forward and backward of `layer` through its input, which requires grad."""
    if framework == "torch":
        layer(torch.ones(1, 2, requires_grad=True)).sum().backward()
    elif framework == "paddle":
        x = _input(framework)
        x.stop_gradient = False
        layer(x).sum().backward()
    else:
        ms = pytest.importorskip("mindspore")
        ms.grad(lambda x: layer(x).sum())(_input(framework))


_READS: dict[str, Callable[[Any], int]] = {
    "reversed": lambda hooks: next(reversed(hooks)),
    "copy": lambda hooks: [k for k in hooks.copy() if k not in hooks.pinned][-1],
    "copy.copy": lambda hooks: [k for k in copy.copy(hooks) if k not in hooks.pinned][-1],
    "iter": lambda hooks: [k for k in hooks if k not in hooks.pinned][-1],
    "keys": lambda hooks: [k for k in hooks.keys() if k not in hooks.pinned][-1],
    "popitem": lambda hooks: hooks.popitem()[0],
}


@pytest.mark.parametrize("framework", ["torch", "paddle", "mindspore"])
@pytest.mark.parametrize("read", sorted(_READS))
def test_the_dicts_reads_follow_a_removal_behind_it(framework: str, read: str) -> None:
    """helper-163's FINDING 2: a native hook removed from the dict unihook took over (by its
    handle, made before) stayed in ``reversed()``, ``popitem()``, ``list()`` until the next
    module call; the framework alone no longer lists it. ``copy()`` too (helper-164's
    FINDING 3: a library's ``saved = d.copy(); d.clear(); d.update(saved)`` ran it again)."""
    layer, attr, _ = _native(framework)
    register = (
        layer.register_forward_post_hook if framework == "paddle" else layer.register_forward_hook
    )
    kept, old = (register(lambda *a: None) for _ in range(2))
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        hooks = getattr(layer, attr)
        assert isinstance(hooks, HookDict)
        old.remove()  # (from the dict it was made on, which unihook's mirrors)
        assert _READS[read](hooks) == _key(kept)
    finally:
        backward.remove()


class _Choreographed(OrderedDict):  # type: ignore[type-arg]
    """A module's hook dict whose reads by unihook's dict wait for another thread's steps:
    `on_items` runs inside ``items()`` once armed (a follow's read), `on_values` inside
    ``values()`` (a call's compare of its hooks)."""

    on_items: Callable[[], None] | None = None
    on_values: Callable[[], None] | None = None

    def items(self) -> Any:
        items = list(super().items())
        if self.on_items is not None:
            self.on_items()
        return items

    def values(self) -> Any:
        if self.on_values is not None:
            self.on_values()
        return super().values()


class _TracedKey(int):
    """A hook's key whose hashing (every dict operation with it) runs `on_hash` on one thread."""

    on_hash: Callable[[], None] | None = None

    def __hash__(self) -> int:
        if self.on_hash is not None:
            self.on_hash()
        return int.__hash__(self)


def test_a_follow_on_another_thread_never_brings_back_a_hook_whose_removal_returned() -> None:
    """helper-161's FINDING 2 (one call in about 50k of a paddle stress ran a native hook
    whose removal had returned), made deterministic. Thread A follows a change of the origin
    (an older handle's removal) and reads the origin's hooks; thread B then removes hook K
    through the dict (as its handle does) and calls the module: B's compare of the origin
    finds no change, A puts K back from what it read, B's call copies the dict. Until
    2026-12-06 B's call ran K."""
    import threading

    module = torch.nn.Linear(2, 2)
    origin = _Choreographed()
    module._forward_hooks = origin
    older = module.register_forward_hook(lambda *a: None)
    backward = unihook.register_full_backward_hook(module, lambda *a: None)
    hooks = module._forward_hooks
    assert isinstance(hooks, HookDict) and hooks.origin() is origin
    ran: list[str] = []
    key = _TracedKey(10**9)
    hooks[key] = lambda *a: ran.append("K")  # (a registration through the dict)
    module.register_forward_hook(lambda *a: ran.append("L"))  # (the calls compare it)
    steps = {name: threading.Event() for name in ("read", "removed", "compared", "added")}
    a_thread: list[int] = []
    hashes_after_removal = [0]

    def wait(name: str) -> None:
        assert steps[name].wait(10), f"the step {name!r} never came"

    def a_read() -> None:  # (A, inside its follow's read of the origin)
        origin.on_items = None
        steps["read"].set()
        wait("removed")

    def a_hash() -> None:  # (A: 1 its check of K, 2 its insert of K, 3 its compare after)
        if threading.get_ident() not in a_thread or not steps["removed"].is_set():
            return
        hashes_after_removal[0] += 1
        if hashes_after_removal[0] == 2:
            wait("compared")
        elif hashes_after_removal[0] == 3:
            steps["added"].set()

    def b_values() -> None:  # (B, inside its call's compare of the hooks)
        origin.on_values = None
        steps["compared"].set()
        steps["added"].wait(2)  # (A may not put K back at all: then none comes)

    def follow() -> None:
        a_thread.append(threading.get_ident())
        hooks.items()

    try:
        older.remove()  # (from the origin: A's call follows that)
        origin.on_items = a_read
        _TracedKey.on_hash = staticmethod(a_hash)  # type: ignore[assignment]
        a = threading.Thread(target=follow)
        a.start()
        wait("read")
        del hooks[key]  # (B: K's removal returns)
        steps["removed"].set()
        origin.on_values = b_values
        seen = [k for k, _ in hooks.items()]  # (B's call, after K's removal returned)
        a.join(10)
        assert not a.is_alive() and steps["added"].is_set()  # (A put K back: the race ran)
        assert key not in seen
        assert key not in [k for k, _ in hooks.items()]
        module(torch.ones(1, 2))
        assert ran == ["L"]
    finally:
        _TracedKey.on_hash = None
        origin.on_items = origin.on_values = None
        backward.remove()


def test_a_removal_while_unihook_takes_its_dict_back_removes_the_hook() -> None:
    """A native handle made on unihook's dict removes its hook while another thread's first
    unihook backward hook takes that dict back over (it clears it, then copies the module's
    dict in): tested before the clear, deleted after it, the removal raised KeyError from
    torch's ``handle.remove()`` (found by a stress of helper-161's FINDING 2, 2 in 400k)."""
    import threading

    from torch.utils.hooks import RemovableHandle

    module = torch.nn.Linear(2, 2)
    origin = _Choreographed()
    module._forward_hooks = origin
    first = unihook.register_full_backward_hook(module, lambda *a: None)
    hooks = module._forward_hooks
    assert isinstance(hooks, HookDict)
    ran: list[str] = []
    handle = RemovableHandle(hooks)  # (torch's registration, with a key whose hashes we see)
    key = handle.id = _TracedKey(handle.id)
    hooks[key] = lambda *a: ran.append("K")
    first.remove()  # (the dict retired: the module's own is back, the handle still on it)
    assert module._forward_hooks is origin
    testing, cleared, removed = threading.Event(), threading.Event(), threading.Event()
    b_thread: list[int] = []
    hashes = [0]

    def b_hash() -> None:  # (B, the removal: its third hash of the key is its last step)
        if threading.get_ident() in b_thread:
            hashes[0] += 1
            if hashes[0] == 2:
                testing.set()
            elif hashes[0] == 3:
                assert cleared.wait(10)

    def a_items() -> None:  # (A, the take-over: the dict is cleared, the copy comes next)
        origin.on_items = None
        cleared.set()
        assert removed.wait(10)

    errors: list[BaseException] = []

    def remove() -> None:
        b_thread.append(threading.get_ident())
        try:
            handle.remove()
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)
        finally:
            removed.set()

    second = None
    try:
        _TracedKey.on_hash = staticmethod(b_hash)  # type: ignore[assignment]
        origin.on_items = a_items
        b = threading.Thread(target=remove)
        b.start()
        assert testing.wait(10)
        second = unihook.register_full_backward_hook(module, lambda *a: None)  # (A)
        b.join(10)
        assert not b.is_alive() and hashes[0] >= 3  # (the race ran)
        assert errors == []
        assert key not in origin
        module(torch.ones(1, 2))
        assert ran == []
    finally:
        _TracedKey.on_hash = None
        origin.on_items = None
        if second is not None:
            second.remove()


def _key(handle: Any) -> int:
    for name in ("id", "_hook_id", "handle_id"):
        if hasattr(handle, name):
            return int(getattr(handle, name))
    raise AttributeError(handle)


def test_paddles_set_op_attrs_twice_beside_unihooks_backward_hook() -> None:
    """helper-162's FINDING 4 as found: paddle's `_set_op_attrs` (its quantization export)
    called twice on a layer with a unihook backward hook failed paddle's own assertion."""
    paddle = pytest.importorskip("paddle")
    layer = paddle.nn.Linear(2, 2)
    backward = unihook.register_full_backward_hook(layer, lambda *a: None)
    try:
        layer._set_op_attrs({"a": 1})
        layer._set_op_attrs({"b": 2})
        pre, post = layer._forward_pre_hooks, layer._forward_post_hooks
        assert (len(pre), len(post)) == (1 + len(pre.pinned), 1 + len(post.pinned))
    finally:
        backward.remove()
    assert (len(layer._forward_pre_hooks), len(layer._forward_post_hooks)) == (1, 1)
