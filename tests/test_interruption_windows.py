"""What lands inside unihook's own code: a finalizer (the garbage collector runs anywhere),
a Ctrl-C (simulated with a trace function, or a real signal)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import unihook
from unihook import _module_backward


def test_global_backward_hook_removed_after_the_call_took_it() -> None:
    # torch: removed inside unihook's ``Module._call_impl`` wrapper after the global
    # dispatchers took the call: as torch takes a call's hooks when it starts, it still fires
    original = torch.nn.Module._call_impl
    fired: list[str] = []
    handle = unihook.register_module_full_backward_hook(
        lambda *args: fired.append("hook"), backend="torch"
    )
    removed: list[bool] = []

    def collect(phase: str, info: Any) -> None:
        if phase != "start" or removed:
            return
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code.co_name == "_call_original":  # between the dispatchers and torch
                removed.append(True)
                handle.remove()
                return
            frame = frame.f_back

    model = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2, requires_grad=True)
    threshold = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(collect)
    gc.set_threshold(1)
    try:
        out = model(x)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collect)
    out.sum().backward()
    assert removed and fired == ["hook"]
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert torch.nn.Module._call_impl is original  # the call over, the wrapper went


@contextlib.contextmanager
def _ctrl_c_at(where: str, path_part: str, nth: int = 1, event: str = "call") -> Iterator[None]:
    """A KeyboardInterrupt at the `nth` entry of a function named `where` ("Class.method" for a
    method) in a file whose path holds `path_part` (where CPython delivers a Ctrl-C: a
    function's entry), or with `event` "return" at its return (after a call made from C, when
    its caller's next instruction checks for signals)."""
    entries = [0]

    def interrupt(frame: Any, event_: str, arg: Any) -> Any:
        code = frame.f_code
        name = code.co_name
        if "." in where and "self" in frame.f_locals:  # ("Class.method")
            name = f"{type(frame.f_locals['self']).__name__}.{name}"
        if name != where or path_part not in code.co_filename:
            return None
        if event_ == "call":
            entries[0] += 1
            if entries[0] == nth and event == "call":
                sys.settrace(None)
                raise KeyboardInterrupt
            return interrupt if entries[0] == nth else None  # (its return event)
        if event_ == "return":
            sys.settrace(None)
            raise KeyboardInterrupt
        return interrupt

    sys.settrace(interrupt)
    try:
        yield
    finally:
        sys.settrace(None)


@pytest.mark.parametrize(
    "where", ["_Backward.__call__", "_backward", "ran", "pruned", "building_graph"]
)
def test_ctrl_c_in_unihook_paddle_backward_is_a_keyboard_interrupt(where: str) -> None:
    # paddle wraps what a PyLayer's backward raises in an OSError; in a user's hook the error
    # keeps its type, and so does a Ctrl-C that lands in unihook's code around it
    paddle = pytest.importorskip("paddle")
    layer = paddle.nn.Linear(2, 2)
    x = paddle.ones([1, 2])
    x.stop_gradient = False
    handle = unihook.register_full_backward_hook(layer, lambda *args: None)
    out = layer(x).sum()

    try:
        with pytest.raises(KeyboardInterrupt), _ctrl_c_at(where, "unihook_paddle"):
            out.backward()
    finally:
        handle.remove()


@pytest.mark.parametrize(
    ("where", "nth"), [("pin", 1), ("pin", 2), ("_changed", 1), ("_changed", 5)]
)
def test_ctrl_c_while_torch_pins_the_global_dispatchers(where: str, nth: int) -> None:
    # a module with a pre-hook gets the global backward dispatchers pinned in its own dicts
    # during its first call: a Ctrl-C half-way leaves nothing half-installed (the next call
    # fired the global hook twice for the module, and hooks stayed after every removal)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    fired: list[str] = []

    def double(module: Any, grad_input: Any, grad_output: Any) -> Any:
        fired.append(type(module).__name__)
        return tuple(None if g is None else g * 2 for g in grad_input)

    handles = [
        unihook.register_forward_pre_hook(model[2], lambda *args: None),
        unihook.register_module_full_backward_hook(double, backend="torch"),
    ]
    x = torch.ones(1, 2, requires_grad=True)
    with pytest.raises(KeyboardInterrupt), _ctrl_c_at(where, "/unihook/", nth):
        model(x).sum().backward()
    fired.clear()
    x.grad = None
    model(x).sum().backward()
    assert sorted(fired) == ["Linear", "Linear", "ReLU", "Sequential"]
    for handle in handles:
        handle.remove()
    for module in model.modules():
        assert not (module._forward_pre_hooks or module._forward_hooks)
        assert not module._forward_hooks_always_called


def test_ctrl_c_after_the_global_wrapper_marked_the_call() -> None:
    # torch: unihook's wrapper marks the module whose whole call the global dispatchers run
    # around; a Ctrl-C right after the mark left it, and the module's later calls on that
    # thread were taken for calls inside its own: the global backward hooks skipped them
    model = torch.nn.Linear(2, 2)
    fired: list[str] = []
    handles = [
        unihook.register_module_forward_pre_hook(lambda *args: None, backend="torch"),
        unihook.register_module_full_backward_hook(
            lambda *a: fired.append("hook"), backend="torch"
        ),
    ]
    x = torch.ones(1, 2, requires_grad=True)
    state = _module_backward._globals["torch"]
    try:
        with pytest.raises(KeyboardInterrupt), _ctrl_c_at("around", "/unihook/", 1, "return"):
            model(x)
        assert getattr(state.local, "around", None) is None  # (the mark went with the call)
        model(x).sum().backward()
        assert fired == ["hook"]
    finally:
        for handle in handles:
            handle.remove()


_FIRST_BACKWARD_HOOK_UNDER_A_GLOBAL_PRE_HOOK = """
import gc, sys
import unihook
KIT = sys.argv[1]
if KIT == "torch":
    import torch
    nn, ones = torch.nn, lambda: torch.ones(1, 2, requires_grad=True)
else:
    import paddle
    nn = paddle.nn
    def ones():
        x = paddle.ones([1, 2])
        x.stop_gradient = False
        return x
# the process's first backward hook, while a global pre-hook has the framework's call patched
g = unihook.register_module_forward_pre_hook(lambda *a: None, backend=KIT)
unihook.register_full_backward_hook(nn.Linear(2, 2), lambda *a: None).remove()
g.remove()
raised = []
for n in range(1, 40):
    m = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    h = unihook.register_full_backward_hook(m[0], lambda *a: None)
    hf = unihook.register_forward_hook(m, lambda *a: None)
    seen = [0]
    def collect(phase, info, n=n, h=h):
        if phase == "start":
            seen[0] += 1
            if seen[0] == n:
                h.remove()
    gc.callbacks.append(collect)
    gc.set_threshold(1, 100000, 100000)
    try:
        m(ones()).sum().backward()
    except Exception as error:
        raised.append(repr(error)[:200])
    finally:
        gc.set_threshold(700, 10, 10)
        gc.callbacks.remove(collect)
    h.remove()
    hf.remove()
print(raised)
"""


@pytest.mark.parametrize("kit", ["torch", "paddle"])
def test_backward_hook_removed_mid_call_after_a_global_pre_hook_came_first(kit: str) -> None:
    # the framework's own call function must count as a module call however the process
    # started (it had been read from the class attribute, unihook's patch at that moment)
    pytest.importorskip(kit)
    proc = subprocess.run(
        [sys.executable, "-c", _FIRST_BACKWARD_HOOK_UNDER_A_GLOBAL_PRE_HOOK, kit],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GLOG_minloglevel": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_backward_hook_removed_by_a_finalizer_during_a_registration(backend: Any) -> None:
    # the removal unpins the dispatchers while the registration re-pins them last
    for n in range(1, 40):
        m = backend.linear(2, 2)
        removed = unihook.register_full_backward_pre_hook(m, lambda *args: None)
        fired: list[int] = []
        seen = [0]

        def collect(phase: str, info: Any, n: int = n, handle: Any = removed) -> None:
            if phase == "start":
                seen[0] += 1
                if seen[0] == n:
                    handle.remove()

        gc.callbacks.append(collect)
        gc.set_threshold(1, 100000, 100000)
        try:
            handle = unihook.register_forward_hook(m, lambda *args: fired.append(1))
        finally:
            gc.set_threshold(700, 10, 10)
            gc.callbacks.remove(collect)
        removed.remove()
        m(backend.tensor([[1.0, 2.0]]))
        handle.remove()
        assert fired == [1], n
        assert not any(backend.hook_counts(m).values()), n
        if seen[0] < n:
            break


FINALIZER_REGISTERING = """
import gc, sys, numpy as np, unihook
from unihook.errors import BackendStateError
import {framework} as fw
x = fw.to_tensor(np.ones((1, 2), np.float32)) if "{framework}" == "paddle" else fw.ones(1, 2)
outcomes = {{"registered": 0, "refused": 0}}
handles = []
noop = lambda *args: None

refused = []

def collect(phase, info):
    # a finalizer registering hooks, run by the collector at every point of a registration
    if phase != "start" or len(refused) > 20:
        return
    fresh = fw.nn.Linear(2, 2)
    try:
        handles.append(unihook.register_full_backward_hook(fresh, noop))
        handles.append(unihook.register_module_forward_pre_hook(noop, backend="{framework}"))
        outcomes["registered"] += 1
    except BackendStateError:  # inside unihook's registration lock: it would wait for itself
        outcomes["refused"] += 1
        refused.append(fresh)

gc.callbacks.append(collect)
gc.set_threshold(1, 100000, 100000)
for _ in range(30):
    handles.append(unihook.register_module_full_backward_hook(noop, backend="{framework}"))
    handles.append(unihook.register_forward_hook(fw.nn.Linear(2, 2), noop))
gc.set_threshold(700, 10, 10)
gc.callbacks.remove(collect)
for handle in handles:
    handle.remove()
# a refusal left nothing half-registered: each refused layer's next backward hook fires
fired = []
for layer in refused:
    handle = unihook.register_full_backward_hook(layer, lambda *args: fired.append(1))
    layer(x).sum().backward()
    handle.remove()
print(outcomes["registered"] > 0, outcomes["refused"] > 0, len(fired) == len(refused))
"""


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_finalizer_registering_inside_a_registration(framework: str) -> None:
    """A finalizer that registers hooks, run by the collector inside a registration on the
    same thread: unihook's lock is held, so the registration raises BackendStateError before
    changing anything (it used to wait for itself for ever; raising halfway left a paddle
    layer whose later backward hooks never fired); elsewhere it registers."""
    pytest.importorskip(framework)
    env = dict(os.environ, GLOG_minloglevel="2", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-c", FINALIZER_REGISTERING.format(framework=framework)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "True True True"


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_registration_inside_each_registry_lock_changes_nothing(framework: str) -> None:
    """What a finalizer run inside each of unihook's registry locks (on this thread) gets
    when it registers: BackendStateError before any change. Raising at the inner lock instead
    left half a registration: a paddle layer whose later backward hooks never fired, a torch
    forward hook with no handle, dynamo's hook guards left on."""
    from unihook import _locks
    from unihook.conformance import kit
    from unihook.errors import BackendStateError

    fw = pytest.importorskip(framework)
    unihook.register_full_backward_hook(fw.nn.Linear(2, 2), lambda *a: None).remove()  # loads
    noop = lambda *args: None  # noqa: E731
    for lock in list(_locks._locks):
        fresh = fw.nn.Linear(2, 2)
        attempts = [
            lambda: unihook.register_full_backward_hook(fresh, noop),
            lambda: unihook.register_forward_hook(fresh, noop),
            lambda: unihook.register_module_forward_pre_hook(noop, backend=framework),
            lambda: unihook.register_module_full_backward_hook(noop, backend=framework),
        ]
        with lock, lock.mutex:
            for attempt in attempts:
                with pytest.raises(BackendStateError, match="finalizer"):
                    attempt()
        assert not any(kit(framework).hook_counts(fresh).values()), lock
        fired: list[int] = []
        handle = unihook.register_full_backward_hook(fresh, lambda *a: fired.append(1))
        x = fw.ones([1, 2]) if framework == "paddle" else fw.ones(1, 2)
        fresh(x).sum().backward()
        handle.remove()
        assert fired == [1], lock


CHILD = Path(__file__).with_name("interruption_child.py")
SIGINT_SECONDS = "1.0"  # of real signals, after the positions


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_ctrl_c_anywhere_in_a_registration_or_a_removal(framework: str) -> None:
    """A KeyboardInterrupt at every position of every kind of registration and removal
    (tests/interruption_child.py: each call, line and return of unihook's frames, by a trace
    function; then real signals for a while): it reaches the caller as itself, no lock stays
    held, a registration is undone (its hook never fires) and a removal finished, exactly:
    the module, the framework's tables and unihook's state as before. Before, a Ctrl-C there
    could leave the registration lock held (every later registration waited for ever), a
    hook registered with no handle, or a handle marked removed over a live hook."""
    pytest.importorskip(framework)
    proc = subprocess.run(
        [sys.executable, str(CHILD), framework, "", SIGINT_SECONDS],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "GLOG_minloglevel": "2", "INTERRUPTION_TIMEOUT": "500"},
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    *failures, result = lines
    assert result["failures"] == 0, failures
    for kind, positions in result["summary"].items():
        assert positions["register"] > 20 and positions["remove"] > 3, (kind, positions)
    assert len(result["summary"]) == 21
    signals = result["signals"]
    assert signals["problems"] == [], signals
    # (most land inside a registration or a removal)
    assert signals["landed"]["register"] + signals["landed"]["remove"] > 500, signals


def _public_registration_functions() -> list[Any]:
    from unihook import api, global_hooks

    return [
        getattr(module, name)
        for module in (api, global_hooks)
        for name in module.__all__
        if name.startswith("register_")
    ]


def test_the_public_functions_return_what_register_returns() -> None:
    """`_register` undoes a registration unless it returns the handle; the public function
    returns it at once, from a plain call of a Python function: CPython checks for a Ctrl-C
    neither when that call returns nor at a return (the child leaves that return out)."""
    import dis

    from unihook import api, global_hooks

    functions = _public_registration_functions()
    assert len(functions) == 13
    for function in functions:
        ops = [i for i in dis.get_instructions(function) if i.opname != "CACHE"]
        returns = [i for i in ops if i.opname == "RETURN_VALUE"]
        assert len(returns) == 1 and ops[-1].opname == "RETURN_VALUE", function
        assert ops[-2].opname == "CALL" and "CALL_FUNCTION_EX" not in {i.opname for i in ops}
        loads = [i.argval for i in ops if i.opname == "LOAD_GLOBAL"]
        assert "_register" in loads, function
    assert {api._register.__name__, global_hooks._register.__name__} == {"_register"}


def test_capture_returns_what_its_python_method_returns() -> None:
    """`capture()` places its hooks in `Capture._start`, which undoes them unless it returns;
    `capture` returns `_start`'s value at once, from a plain call of a Python method (not from
    the type's call `Capture(...)`, on whose return CPython checks for a Ctrl-C: one landing
    there lost a capture whose hooks stayed on the model for good)."""
    import dis
    import importlib

    capture = importlib.import_module("unihook.capture")  # (the module, not the function)
    ops = [i for i in dis.get_instructions(capture.capture) if i.opname != "CACHE"]
    assert [i.opname for i in ops][-2:] == ["CALL", "RETURN_VALUE"]
    assert sum(i.opname == "RETURN_VALUE" for i in ops) == 1
    assert [i.argval for i in ops if i.opname == "LOAD_METHOD"][-1] == "_start"
    start = [i for i in dis.get_instructions(capture.Capture._start) if i.opname != "CACHE"]
    returns = [k for k, i in enumerate(start) if i.opname == "RETURN_VALUE"]
    # (returns self right after letting go of the record: a STORE_ATTR, no check between)
    assert len(returns) == 1 and start[returns[0] - 1].argval == "self"
    assert start[returns[0] - 2].opname == "STORE_ATTR"


def test_every_registry_lock_is_taken_by_its_mutex() -> None:
    """A `with` on a RegistryLock takes its C mutex too (``with lock, lock.mutex:``): the
    Python object alone locks nothing, and a lock taken in Python code could be left held."""
    import ast

    import unihook_paddle
    import unihook_torch

    roots = [Path(m.__file__).parent for m in (unihook, unihook_torch, unihook_paddle)]
    wrong, checked = [], 0
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        locks = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "RegistryLock"
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.With):
                continue
            items = [ast.unparse(item.context_expr) for item in node.items]
            for n, item in enumerate(items):
                if item in locks:
                    checked += 1
                    if items[n + 1 : n + 2] != [f"{item}.mutex"]:
                        wrong.append(f"{path.name}:{node.lineno}: with {', '.join(items)}")
    assert wrong == [] and checked > 10


def test_hook_dict_cut_in_its_init_is_freed_quietly() -> None:
    """A Ctrl-C landing in `HookDict.__init__` (right after the object was made) leaves it
    without its attributes: freeing it reports nothing (its `__del__` raised AttributeError,
    which Python printed as an "Exception ignored")."""
    from unihook._pinned import HookDict

    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        cut = HookDict.__new__(HookDict)
        del cut
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
