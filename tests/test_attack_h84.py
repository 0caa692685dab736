"""helper-84's attack on f77856a (flag tables watched, lazy dicts followed, MindSpore's global
forward dispatchers that run nothing without their flag, `_ensure` ignoring a KeyError).

Each test named ``test_finding*`` is a FINDING that fails on f77856a (see the report). The work
of the finalizer and the weakref callback FINDINGS 5 and 6 interrupt moved into
`HookDict._dropped` and `_pinned._give_back` with their fix: the tests interrupt the same lines
there.
"""

from __future__ import annotations

import gc
import linecache
import sys
from typing import Any, Callable

import pytest

import unihook
from unihook import _pinned

X = [[1.0, -1.0, 2.0]]


def _mindspore() -> Any:
    return pytest.importorskip("mindspore")


def _scale_cell() -> Any:
    from mindspore import nn

    class Scale(nn.Cell):  # type: ignore[misc]
        def construct(self, x: Any, scale: float = 1.0) -> Any:
            return x * scale

    return Scale()


def _x() -> Any:
    import numpy as np

    return _mindspore().Tensor(np.asarray(X, np.float32))


def _interrupt_at(code: Any, text: str, when: Callable[[Any], bool]) -> Callable[[], bool]:
    """Trace this thread: raise KeyboardInterrupt at the first line of `code` holding `text`
    for which `when(frame)` is True (a Ctrl-C landing after the call before it returned).
    Returns whether it fired; the caller calls `sys.settrace(None)`."""
    fired = [False]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not fired[0]:
            if text in linecache.getline(code.co_filename, frame.f_lineno) and when(frame):
                fired[0] = True
                raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code and not fired[0] else None

    sys.settrace(tracer)
    return lambda: fired[0]


# -- FINDING 1: a Ctrl-C in the first call's pinning of a global forward dispatcher loses the
# global hook on that cell for good, silently --


@pytest.mark.parametrize("slot", ["pre", "post"])
def test_finding1_ctrl_c_in_the_dispatchers_insertion_skips_global_hooks_for_ever(
    slot: str,
) -> None:
    # `_pin_forward` (at the cell's first call, no registration: nothing undoes it) is cut
    # short in `HookDict.__setitem__` between `origin[key] = value` and the HookDict's own
    # insertion (a Ctrl-C landing after the `super()` call). `_installed` says the cell has its
    # dispatcher. Every later call: `_ensure` sees the key `in hooks` (the origin), its
    # `move_to_end` raises KeyError, now swallowed (`continue`), and the HookDict itself is
    # empty: MindSpore's `if self._forward_pre_hook:` is False, no hook runs. The global hook,
    # registered and never removed, is skipped on every call of that cell, with no error
    # (before f77856a the KeyError at least surfaced).
    _mindspore()
    from unihook_mindspore import _global

    cell = _scale_cell()
    x = _x()
    seen: list[Any] = []
    if slot == "pre":
        handle = unihook.register_module_forward_pre_hook(
            lambda m, a, k: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
        )
        run = _global._run_pre
    else:
        handle = unihook.register_module_forward_hook(
            lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
        )
        run = _global._run_post
    try:
        fired = _interrupt_at(
            _pinned.HookDict.__setitem__.__code__,
            "super().__setitem__(key, value)",
            lambda frame: frame.f_locals.get("value") is run,
        )
        try:
            cell(x, scale=2.0)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert fired(), "the window was not reached"
        seen.clear()
        for _ in range(3):
            cell(x, scale=3.0)
        assert seen == [{"scale": 3.0}] * 3, f"the global hook's runs over 3 calls: {seen}"
    finally:
        handle.remove()
    seen.clear()
    cell(x, scale=3.0)
    assert seen == []
    gc.collect()
    assert not _pinned._flagged


# -- FINDING 2: a global forward hook skipped for a call in flight when MindSpore's lazy
# property drops the hook dict the call's `_ensure` pinned its dispatcher in --


class _PausedRead:
    """Read `cell.<attr>` on another thread, paused inside MindSpore's lazy property between
    its None check and its assignment (as test_attack_h83.py); `resume()` lets it assign."""

    def __init__(self, cell: Any, attr: str) -> None:
        import threading

        from mindspore import nn

        code = getattr(nn.Cell, attr).fget.__code__
        self.paused, self._resume, self.done = (threading.Event() for _ in range(3))

        def local(frame: Any, event: str, arg: Any) -> Any:
            line = linecache.getline(code.co_filename, frame.f_lineno)
            if event == "line" and "__setattr__" in line:
                self.paused.set()
                self._resume.wait(30)
            return local

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            return local if frame.f_code is code else None

        def read() -> None:
            sys.settrace(tracer)
            try:
                getattr(cell, attr)
            finally:
                sys.settrace(None)
                self.done.set()

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()
        assert self.paused.wait(30), "the property did not create the dict"

    def resume(self) -> None:
        self._resume.set()
        assert self.done.wait(30)
        self.thread.join(30)


@pytest.mark.parametrize("slot", ["pre", "post"])
def test_finding2_global_hook_skipped_for_the_call_whose_dict_the_property_dropped(
    slot: str,
) -> None:
    # A thread reads the cell's hook dict (MindSpore's property found None, is about to create
    # it). Meanwhile the global hook is registered and the cell called on this thread: `_ensure`
    # pins the dispatcher in a dict it creates, with the cell's own hook beside it. The other
    # thread then assigns its empty dict over it (before this call's MindSpore code reads its
    # hooks: here, from construct for the post hooks, from `_ensure`'s end for the pre ones).
    # The cell's own hook follows into the new dict (`_follow`, `Access.recreated`), the global
    # dispatcher does not ("it pins them again at the call": the next one): this call, made
    # after the registration, runs the own hook and silently skips the global one.
    _mindspore()
    from mindspore import nn
    from unihook_mindspore import _global

    attr = "_forward_pre_hook" if slot == "pre" else "_forward_hook"
    reader: list[_PausedRead] = []

    class Scale(nn.Cell):  # type: ignore[misc]
        def construct(self, x: Any, scale: float = 1.0) -> Any:
            if slot == "post" and reader:
                reader.pop().resume()
            return x * scale

    cell = Scale()
    x = _x()
    seen: list[str] = []
    if slot == "pre":
        handles = [
            unihook.register_module_forward_pre_hook(
                lambda m, a: seen.append("global"), backend="mindspore"
            )
        ]
    else:
        handles = [
            unihook.register_module_forward_hook(
                lambda m, a, o: seen.append("global"), backend="mindspore"
            )
        ]
    try:
        reader.append(_PausedRead(cell, attr))
        if slot == "pre":
            # the own hook registered now (it creates the dict too); the other thread's
            # assignment lands once `_ensure` returned, before MindSpore reads the pre-hooks
            handles.append(unihook.register_forward_pre_hook(cell, lambda m, a: seen.append("own")))
            ensure = _global._ensure

            def ensured(c: Any) -> None:
                ensure(c)
                if reader:
                    reader.pop().resume()

            _global._ensure = ensured
            try:
                cell(x, scale=2.0)
            finally:
                _global._ensure = ensure
        else:
            handles.append(unihook.register_forward_hook(cell, lambda m, a, o: seen.append("own")))
            cell(x, scale=2.0)
        assert not reader, "the window was not reached"
        assert sorted(seen) == ["global", "own"], f"the call's hooks: {seen}"
        seen.clear()
        cell(x, scale=2.0)
        assert sorted(seen) == ["global", "own"]
    finally:
        for handle in handles:
            handle.remove()
        if reader:
            reader.pop().resume()


# -- FINDING 3: a shallow copy of a cell (copy.copy) shares its hook dicts: `_ensure` pins a
# second global dispatcher into them, every global forward hook then runs twice per call,
# on the copy and on the original --


def test_finding3_global_forward_hooks_run_twice_after_copy_copy() -> None:
    import copy

    _mindspore()
    cell = _scale_cell()
    x = _x()
    seen: list[str] = []
    handles = [
        unihook.register_module_forward_pre_hook(
            lambda m, a: seen.append("pre"), backend="mindspore"
        ),
        unihook.register_module_forward_hook(
            lambda m, a, k, o: seen.append("post"), with_kwargs=True, backend="mindspore"
        ),
    ]
    try:
        cell(x, scale=2.0)
        assert seen == ["pre", "post"]
        twin = copy.copy(cell)  # (native hooks: shared, and run once, as torch's)
        seen.clear()
        twin(x, scale=2.0)
        assert seen == ["pre", "post"], f"the shallow copy's call: {seen}"
        seen.clear()
        cell(x, scale=2.0)
        assert seen == ["pre", "post"], f"the original's call after: {seen}"
    finally:
        for handle in handles:
            handle.remove()
    seen.clear()
    cell(x)
    assert seen == []


# -- FINDING 4: a shallow copy (copy.copy) of a module with its own backward hooks runs every
# global backward hook two or three times per backward, on every backend --


def _linear_and_backward(name: str) -> tuple[Any, Callable[[Any], None]]:
    if name == "torch":
        torch = pytest.importorskip("torch")
        module = torch.nn.Linear(3, 2)

        def run(m: Any) -> None:
            m(torch.ones(1, 3, requires_grad=True)).sum().backward()

    elif name == "paddle":
        paddle = pytest.importorskip("paddle")
        module = paddle.nn.Linear(3, 2)

        def run(m: Any) -> None:
            x = paddle.ones([1, 3])
            x.stop_gradient = False
            m(x).sum().backward()

    else:
        mindspore = _mindspore()
        import numpy as np
        from mindspore import nn

        module = nn.Dense(3, 2)

        def run(m: Any) -> None:
            mindspore.grad(lambda x: m(x).sum())(mindspore.Tensor(np.ones((1, 3), np.float32)))

    return module, run


@pytest.mark.parametrize("name", ["torch", "paddle", "mindspore"])
def test_finding4_global_backward_hooks_repeat_on_a_shallow_copy(name: str) -> None:
    # the copy shares the original's hook dicts (as torch's own hooks are shared, and run once):
    # the original's backward dispatchers (pinned there) and the copy's global ones both take
    # the global hooks for the copy's call. Observed: torch and MindSpore 3 runs each, paddle 2.
    import copy

    module, run = _linear_and_backward(name)
    seen: list[str] = []
    handles = [
        unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("own")),
        unihook.register_module_full_backward_hook(
            lambda m, gi, go: seen.append("global"), backend=name
        ),
        unihook.register_module_full_backward_pre_hook(
            lambda m, go: seen.append("global_pre"), backend=name
        ),
    ]
    try:
        run(module)
        assert sorted(seen) == ["global", "global_pre", "own"]
        twin = copy.copy(module)
        seen.clear()
        run(twin)
        assert sorted(seen) == ["global", "global_pre", "own"], f"the shallow copy's: {seen}"
    finally:
        for handle in handles:
            handle.remove()
    seen.clear()
    run(module)
    run(twin)
    assert seen == []


# -- FINDING 5: a Ctrl-C landing in `_table_dropped` (a weakref callback: the interpreter
# swallows it, "Exception ignored") loses the global dispatcher's with_kwargs flag for good:
# the dispatcher now runs nothing without it (f77856a), so the global hook is skipped on
# every later call of the cell, silently --


@pytest.mark.parametrize("slot", ["pre", "post"])
@pytest.mark.parametrize("line", ["owner = watch.owner()", "table = watch.access.get"])
def test_finding5_ctrl_c_in_table_dropped_skips_global_hooks_for_ever(slot: str, line: str) -> None:
    # This (main) thread reads the cell's flag table through MindSpore's lazy property; while
    # it is paused between its None check and its assignment, a worker thread registers the
    # global hook and calls the cell (the dispatcher and its flag go in: table T1). This thread
    # then assigns its empty table T2 over T1: T1's watch runs `_table_dropped` here, and the
    # Ctrl-C lands in it. The interpreter reports it as ignored; the flag never reaches T2.
    _mindspore()
    import threading

    from mindspore import nn

    attr = "_forward_pre_hook_with_kwargs" if slot == "pre" else "_forward_hook_with_kwargs"
    cell = _scale_cell()
    x = _x()
    seen: list[Any] = []
    handles: list[Any] = []

    def worker() -> None:
        if slot == "pre":
            handles.append(
                unihook.register_module_forward_pre_hook(
                    lambda m, a, k: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
                )
            )
        else:
            handles.append(
                unihook.register_module_forward_hook(
                    lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
                )
            )
        cell(x, scale=2.0)

    getter = getattr(nn.Cell, attr).fget.__code__
    dropped = _pinned._give_back.__code__
    state = {"worked": False, "fired": False}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event != "line":
            return local
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if frame.f_code is getter and "__setattr__" in text and not state["worked"]:
            state["worked"] = True
            thread = threading.Thread(target=worker, daemon=True)
            thread.start()
            thread.join(30)
        elif frame.f_code is dropped and line in text and not state["fired"]:
            state["fired"] = True
            raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code in (getter, dropped) else None

    sys.settrace(tracer)
    try:
        getattr(cell, attr)
    finally:
        sys.settrace(None)
    try:
        assert state["worked"] and state["fired"], f"the window was not reached: {state}"
        assert seen == [{"scale": 2.0}]
        seen.clear()
        for _ in range(3):
            cell(x, scale=3.0)
        assert seen == [{"scale": 3.0}] * 3, f"the global hook's runs over 3 calls: {seen}"
    finally:
        for handle in handles:
            handle.remove()


# -- FINDING 6: a Ctrl-C landing in `HookDict.__del__` (a finalizer: the interpreter swallows
# it, "Exception ignored") stops unihook's hooks following a replaced hook dict: the handle
# stays active, the hook never runs again, silently --


@pytest.mark.parametrize("line", ["follow = access.recreated", "own = set(self.pinned)"])
@pytest.mark.parametrize("name", ["torch", "paddle"])
def test_finding6_ctrl_c_in_the_dropped_hook_dicts_finalizer_loses_backward_hooks(
    name: str, line: str
) -> None:
    # a library assigns the module a new forward hook dict (the documented case: the backward
    # dispatchers follow it, `_follow`); the Ctrl-C lands in the finalizer of the HookDict
    # dropped, before `_follow` ran. The user's Ctrl-C is lost too (only printed).
    from collections import OrderedDict

    module, run = _linear_and_backward(name)
    attr = "_forward_hooks" if name == "torch" else "_forward_post_hooks"
    seen: list[str] = []
    handle = unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append("own"))
    try:
        run(module)
        assert seen == ["own"]
        fired = _interrupt_at(_pinned.HookDict._dropped.__code__, line, lambda frame: True)
        try:
            setattr(module, attr, OrderedDict())  # (the old HookDict dies here)
        finally:
            sys.settrace(None)
        assert fired(), "the window was not reached"
        seen.clear()
        run(module)
        run(module)
        assert seen == ["own", "own"], f"the backward hook's runs over 2 backward passes: {seen}"
    finally:
        handle.remove()


@pytest.mark.parametrize("line", ["follow = access.recreated", "own = set(self.pinned)"])
def test_finding6_mindspore_own_hook_silently_lost(line: str) -> None:
    # MindSpore: the dict is dropped by its lazy property (this thread read it, paused before
    # its assignment, while a worker thread registered the hook: the documented race that
    # `Access.recreated` repairs). The Ctrl-C lands in the finalizer on this thread: the
    # handle stays active, the hook never runs, nothing is raised.
    _mindspore()
    import threading

    from mindspore import nn

    cell = _scale_cell()
    x = _x()
    seen: list[Any] = []
    handles: list[Any] = []

    def worker() -> None:
        handles.append(
            unihook.register_forward_hook(
                cell, lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True, always_call=True
            )
        )

    getter = nn.Cell._forward_hook.fget.__code__
    finalizer = _pinned.HookDict._dropped.__code__
    state = {"worked": False, "fired": False}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event != "line":
            return local
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if frame.f_code is getter and "__setattr__" in text and not state["worked"]:
            state["worked"] = True
            thread = threading.Thread(target=worker, daemon=True)
            thread.start()
            thread.join(30)
        elif frame.f_code is finalizer and line in text and not state["fired"]:
            state["fired"] = True
            raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code in (getter, finalizer) else None

    sys.settrace(tracer)
    try:
        getattr(cell, "_forward_hook")  # noqa: B009 (the read: MindSpore's lazy property)
    finally:
        sys.settrace(None)
    try:
        assert state["worked"] and state["fired"], f"the window was not reached: {state}"
        assert handles  # (its repr: "active")
        cell(x, scale=2.0)
        assert seen == [{"scale": 2.0}], f"the registered hook's runs: {seen}"
    finally:
        for handle in handles:
            handle.remove()


# -- FINDING 7: a Ctrl-C in `_left` (the end of the cell's last call in flight, after a
# removal of the last global forward hook during it) leaves the waiting post dispatcher pinned
# and forgotten: the next global forward hook gets a second one, and runs twice per call --


@pytest.mark.parametrize(
    "line", ["if found is None or id(cell) in _in_call:", "entry = _installed.get(cell)"]
)
def test_finding7_ctrl_c_in_left_runs_the_next_global_hook_twice(line: str) -> None:
    _mindspore()
    from mindspore import nn
    from unihook_mindspore import _global

    handles: list[Any] = []

    class Scale(nn.Cell):  # type: ignore[misc]
        def construct(self, x: Any, scale: float = 1.0) -> Any:
            if handles:
                handles.pop().remove()  # (the last global forward hook: the dispatcher waits)
            return x * scale

    cell = Scale()
    x = _x()
    seen: list[Any] = []
    handles.append(
        unihook.register_module_forward_hook(
            lambda m, a, k, o: seen.append("first"), with_kwargs=True, backend="mindspore"
        )
    )
    fired = _interrupt_at(_global._left.__code__, line, lambda frame: True)
    try:
        cell(x, scale=2.0)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    assert fired(), "the window was not reached"
    assert not handles
    seen.clear()
    handle = unihook.register_module_forward_hook(
        lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
    )
    try:
        cell(x, scale=3.0)
        assert seen == [{"scale": 3.0}], f"the new global hook's runs for one call: {seen}"
    finally:
        handle.remove()
    seen.clear()
    cell(x, scale=3.0)
    assert seen == []
    assert not any(cell._forward_hook), f"left pinned: {list(cell._forward_hook)}"


# -- FINDING 8: a Ctrl-C landing in `_held_call` after it counted the call in `_in_call` and
# before its `try:` (after the `with _in_call_lock:` block's C exit) leaves the call counted
# for ever: `_in_call` holds the cell strongly (never collected), and the removal of the last
# global forward hook leaves its post dispatcher waiting, pinned and flagged, for ever --


def test_finding8_ctrl_c_before_held_calls_try_leaks_the_cell_and_its_dispatcher() -> None:
    _mindspore()
    import weakref

    from unihook_mindspore import _global

    cell = _scale_cell()
    x = _x()
    seen: list[Any] = []
    handle = unihook.register_module_forward_hook(
        lambda m, a, k, o: seen.append(dict(k)), with_kwargs=True, backend="mindspore"
    )
    try:
        fired = _interrupt_at(_global._held_call.__code__, "try:", lambda frame: True)
        try:
            cell(x, scale=2.0)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert fired(), "the window was not reached"
    finally:
        handle.remove()
    gc.collect()
    leftover = {
        attr: list(getattr(cell, attr))
        for attr in ("_forward_hook", "_forward_hook_with_kwargs", "_forward_hook_always_called")
    }
    counted = id(cell) in _global._in_call
    ref = weakref.ref(cell)
    alive_after_del = True
    try:
        del cell
        gc.collect()
        alive_after_del = ref() is not None
    finally:  # (leave no counted call to the next tests)
        stuck = _global._in_call.pop(id(ref()) if ref() is not None else -1, None)
        waiting = _global._waiting.pop(id(ref()) if ref() is not None else -1, None)
        if waiting is not None:
            _global._unpin_slot(waiting[0], 1, waiting[1])
        del stuck, waiting
    assert not counted, "the call is counted in flight for ever"
    assert not any(leftover.values()), f"left pinned after the removal: {leftover}"
    assert not alive_after_del, "the cell is never collected (held by _in_call)"
