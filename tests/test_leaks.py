"""Leaks (issue 12, class 4), on every backend.

- A BaseException (KeyboardInterrupt, SystemExit, a custom subclass) raised at every point of a
  call (forward pre-hook, forward, forward hook, backward pre-hook, backward hook, tensor hook;
  module or global hooks; in the inner or outer module) of a model with every kind of backward
  hook installed: afterwards the model works (hooks fire, gradients as without hooks), removing
  the handles restores the framework exactly, and the model, its inputs and outputs are freed
  (frameworks run always-call hooks only for an Exception, so per-call state never hears of it).
- 10,000 register/remove cycles per hook kind keep the RSS and the object count bounded.
- A handle removed twice, after its model died, or from another thread is a no-op.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import unihook
from unihook._module_backward import _globals, _states


class Interrupt(BaseException):
    """What a user's own BaseException subclass (a timeout, a cancellation) looks like."""


RAISED = (KeyboardInterrupt, SystemExit, Interrupt)
BACKWARD_KINDS = ("full_backward_pre", "full_backward")
# the backward hooks installed: each kind alone (module or global), and all four together
INSTALLED = (
    *[(scope, kind) for scope in ("module", "global") for kind in BACKWARD_KINDS],
    ("all", "all"),
)
# where the BaseException is raised, and by a module's own hook or a global one
POINTS = (
    ("forward_pre", "module"),
    ("forward_pre", "global"),
    ("forward", "module"),
    ("forward_hook", "module"),
    ("forward_hook", "global"),
    ("full_backward_pre", "module"),
    ("full_backward_pre", "global"),
    ("full_backward", "module"),
    ("full_backward", "global"),
    ("tensor", "module"),
)


@dataclass
class Arm:
    """Which module raises what, where; `raised` None: disarmed."""

    point: str
    target: str
    raised: type[BaseException] | None = None
    made: list[weakref.ref[Any]] = field(default_factory=list)  # every tensor a call made

    def fire(self, point: str, target: str) -> None:
        if self.raised is not None and (point, target) == (self.point, self.target):
            raise self.raised


def _model(backend: Any, arm: Arm) -> Any:
    def inner(self: Any, x: Any) -> Any:
        arm.fire("forward", "inner")
        h = self.lin(x)
        return _made(h, "inner")

    def outer(self: Any, x: Any) -> Any:
        arm.fire("forward", "outer")
        y = self.inner(x) * 2
        return _made(y, "outer")

    def _made(t: Any, name: str) -> Any:
        arm.made.append(weakref.ref(t))
        if arm.point == "tensor" and arm.target == name:
            unihook.register_tensor_hook(t, lambda g: arm.fire("tensor", name))
        return t

    lin = backend.linear(2, 2)
    return backend.module(outer, {"inner": backend.module(inner, {"lin": lin})})


def _install(backend: Any, model: Any, installed: tuple[str, str], calls: list[str]) -> list[Any]:
    """The observed backward hooks, counting their calls; their handles."""
    scope, kind = installed
    pairs = INSTALLED[:-1] if scope == "all" else [installed]
    handles = []
    for scope, kind in pairs:

        def hook(*args: Any, kind: str = kind, scope: str = scope) -> None:
            calls.append(f"{scope} {kind}")

        if scope == "global":
            register = getattr(unihook, f"register_module_{kind}_hook")
            handles.append(register(hook, backend=backend.name))
        else:
            for m in (model, model.inner):
                handles.append(getattr(unihook, f"register_{kind}_hook")(m, hook))
    return handles


def _arm(backend: Any, model: Any, arm: Arm, scope: str) -> list[Any]:
    """The hooks that raise (the forward and tensor points raise from the model itself)."""
    if arm.point in ("forward", "tensor"):
        return []
    target = model if arm.target == "outer" else model.inner
    kind = {"forward_hook": "forward"}.get(arm.point, arm.point)

    target_ref = weakref.ref(target)  # (a global hook holding the model would keep it alive)

    def raiser(m: Any, *rest: Any) -> None:
        if m is target_ref():
            arm.fire(arm.point, arm.target)

    if scope == "global":
        register = getattr(unihook, f"register_module_{kind}_hook")
        return [register(raiser, backend=backend.name)]
    return [getattr(unihook, f"register_{kind}_hook")(target, raiser)]


def _pass(backend: Any, model: Any) -> tuple[Any, Any]:
    """One forward and backward on a new input: (output, input gradient)."""
    x = backend.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    out = model(x)
    backend.backward(out.sum())
    return backend.numpy(out), backend.grad(x)


def _expected_calls(installed: tuple[str, str]) -> list[str]:
    """Per pass: a module hook fires for outer and inner, a global one for lin too."""
    scope, kind = installed
    pairs = INSTALLED[:-1] if scope == "all" else [installed]
    return sorted(f"{s} {k}" for s, k in pairs for _ in range(2 if s == "module" else 3))


def _interrupt(
    backend: Any, arm: Arm, installed: tuple[str, str], scope: str, keep_hooks: bool
) -> tuple[list[tuple[str, weakref.ref[Any]]], list[Any]]:
    """Raise `arm.raised` in a call of a new model. `keep_hooks`: drop the model with its hooks
    still registered; else check that it keeps working and that removing the hooks restores
    it. Returns weakrefs to what must die, and the handles still registered."""
    calls: list[str] = []
    model = _model(backend, arm)
    handles = _install(backend, model, installed, calls)
    handles += _arm(backend, model, arm, scope)
    x = backend.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    try:
        backend.backward(model(x).sum())
    except BaseException as error:
        if type(error) is not arm.raised:
            raise
    else:
        raise AssertionError(f"{arm.raised.__name__} was not raised")
    refs = [
        (name, weakref.ref(o))
        for name, o in [("model", model), ("inner", model.inner), ("lin", model.inner.lin)]
    ]
    refs += [("input", weakref.ref(x))] + [("a tensor forward made", r) for r in arm.made]
    del x
    label = f"{arm.raised.__name__} at {arm.target} {arm.point} ({scope}), installed {installed}"
    label += ", hooks kept" if keep_hooks else ""
    if keep_hooks:
        return [(f"{name}: {label}", r) for name, r in refs], handles

    # the model keeps working: hooks fire once per module, the results are those without hooks
    arm.raised, arm.made = None, []
    calls.clear()
    out, grad = _pass(backend, model)
    assert sorted(calls) == _expected_calls(installed), label
    for h in handles:
        h.remove()
    plain_out, plain_grad = _pass(backend, model)
    np.testing.assert_allclose(out, plain_out, err_msg=label)
    np.testing.assert_allclose(grad, plain_grad, err_msg=label)
    for m in (model, model.inner, model.inner.lin):
        assert not any(backend.hook_counts(m).values()), label
        assert m not in _states, label
    assert backend.name not in _globals, label
    return [(f"{name}: {label}", r) for name, r in refs], []


@pytest.mark.parametrize(("point", "scope"), POINTS, ids=["-".join(p) for p in POINTS])
@pytest.mark.parametrize("target", ["inner", "outer"])
def test_base_exception_leaves_nothing_behind(
    backend: Any, point: str, scope: str, target: str
) -> None:
    gc.collect()
    native = backend.native_state()
    refs = []
    kept = []
    # every exception type and every set of installed hooks, with the model dropped after its
    # hooks are removed, and while they are still registered (torch frees it then too)
    for keep_hooks, raised, installed in itertools.product((False, True), RAISED, INSTALLED):
        arm = Arm(point, target, raised)
        found, handles = _interrupt(backend, arm, installed, scope, keep_hooks)
        refs += found
        kept += handles
    gc.collect()
    alive = sorted({label for label, r in refs if r() is not None})
    for h in kept:
        h.remove()
    assert not alive, f"still alive after gc: {alive}"
    gc.collect()
    assert backend.native_state() == native
    assert backend.name not in _globals


# -- register/remove cycles, in a subprocess of their own: an RSS measure no test disturbs --

CYCLES = 10_000
WARMUP = 300
RSS_BOUND = 4 << 20  # bytes; a leak of one small object per cycle is caught by OBJECTS_BOUND
OBJECTS_BOUND = 200

_CYCLES_SCRIPT = """
import gc, json, sys
import numpy as np
import unihook
from unihook._plugins import plugin_manager

kit = next(k for k in plugin_manager().hook.unihook_conformance_kit() if k and k.name == NAME)
model = kit.sequential(kit.linear(2, 2), kit.relu_module())
x = kit.tensor([[1.0, 2.0]], requires_grad=True)
hook = lambda *args: None
G = dict(backend=NAME)
KINDS = {
    "forward_pre": lambda: unihook.register_forward_pre_hook(model, hook),
    "forward_pre with_kwargs": lambda: unihook.register_forward_pre_hook(
        model, hook, with_kwargs=True),
    "forward": lambda: unihook.register_forward_hook(model, hook),
    "forward always_call": lambda: unihook.register_forward_hook(model, hook, always_call=True),
    "full_backward_pre": lambda: unihook.register_full_backward_pre_hook(model, hook),
    "full_backward": lambda: unihook.register_full_backward_hook(model, hook),
    "tensor": lambda: unihook.register_tensor_hook(x, hook),
    "global forward_pre": lambda: unihook.register_module_forward_pre_hook(hook, **G),
    "global forward": lambda: unihook.register_module_forward_hook(hook, **G),
    "global full_backward_pre": lambda: unihook.register_module_full_backward_pre_hook(hook, **G),
    "global full_backward": lambda: unihook.register_module_full_backward_hook(hook, **G),
    "global parameter_registration":
        lambda: unihook.register_module_parameter_registration_hook(hook, **G),
    "global buffer_registration":
        lambda: unihook.register_module_buffer_registration_hook(hook, **G),
    "global module_registration":
        lambda: unihook.register_module_module_registration_hook(hook, **G),
}

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE

def measure():
    gc.collect()
    return rss(), len(gc.get_objects())

def cycles(register, n):
    for _ in range(n):
        register().remove()

import os
PAGE = os.sysconf("SC_PAGE_SIZE")
result = {}
for kind, register in KINDS.items():
    # a forward and backward with the hook, so per-call state exists before the cycles
    with register():
        kit.backward(model(x).sum())
    cycles(register, WARMUP)
    rss0, objects0 = measure()
    cycles(register, CYCLES)
    rss1, objects1 = measure()
    result[kind] = (rss1 - rss0, objects1 - objects0)
print(json.dumps(result))
"""


@pytest.fixture(scope="module", autouse=True)
def cycle_runs() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """One subprocess per backend, started with the module's first test: they run beside the
    other tests of this file (their RSS is their own), which keeps the file's wall time low."""
    from unihook.conformance import kits

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    runs = {}
    for kit in kits():
        script = f"NAME, CYCLES, WARMUP = {kit.name!r}, {CYCLES}, {WARMUP}\n" + _CYCLES_SCRIPT
        runs[kit.name] = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    yield runs
    for run in runs.values():
        run.kill()
        run.communicate()


def test_register_remove_cycles_keep_memory_bounded(
    backend: Any, cycle_runs: dict[str, subprocess.Popen[str]]
) -> None:
    stdout, stderr = cycle_runs[backend.name].communicate(timeout=300)
    assert cycle_runs[backend.name].returncode == 0, stderr[-3000:]
    growth = json.loads(stdout.strip().splitlines()[-1])
    assert len(growth) == 14
    over = {
        kind: (rss, objects)
        for kind, (rss, objects) in growth.items()
        if rss > RSS_BOUND or objects > OBJECTS_BOUND
    }
    assert not over, f"after {CYCLES} register/remove cycles: (RSS bytes, objects) {over}"


# -- handles: removing twice, after the model died, or from another thread is a no-op --


@dataclass
class Target:
    """What a hook kind hooks, and how to make its hooks fire."""

    backend: Any
    model: Any = None
    x: Any = None

    def __post_init__(self) -> None:
        # (a module with its own forward: the registrations of `trigger` leave it alone)
        self.model = self.backend.module(_linear_forward, {"lin": self.backend.linear(2, 2)})
        self.x = self.backend.tensor([[1.0, 2.0]], requires_grad=True)

    def trigger(self) -> None:
        kit = self.backend
        kit.backward(self.model(self.x).sum())
        kit.register_parameter(self.model, "p", kit.parameter([1.0]))
        kit.register_buffer(self.model, "b", kit.tensor([1.0]))
        kit.add_module(self.model, "child", kit.linear(1, 1))


def _linear_forward(self: Any, x: Any) -> Any:
    return self.lin(x)


KINDS: dict[str, Callable[[Target, Callable[..., Any], str], Any]] = {
    "forward_pre": lambda t, h, b: unihook.register_forward_pre_hook(t.model, h),
    "forward": lambda t, h, b: unihook.register_forward_hook(t.model, h),
    "full_backward_pre": lambda t, h, b: unihook.register_full_backward_pre_hook(t.model, h),
    "full_backward": lambda t, h, b: unihook.register_full_backward_hook(t.model, h),
    "tensor": lambda t, h, b: unihook.register_tensor_hook(t.x, h),
    **{
        f"global {kind}": (
            lambda t, h, b, kind=kind: getattr(unihook, f"register_module_{kind}_hook")(
                h, backend=b
            )
        )
        for kind in (
            "forward_pre",
            "forward",
            "full_backward_pre",
            "full_backward",
            "parameter_registration",
            "buffer_registration",
            "module_registration",
        )
    },
}


def _counter(calls: list[str], name: str) -> Callable[..., None]:
    def hook(*args: Any, **kwargs: Any) -> None:
        calls.append(name)

    return hook


@pytest.mark.parametrize("kind", list(KINDS))
def test_handle_removal_twice_or_from_another_thread_is_a_no_op(backend: Any, kind: str) -> None:
    target = Target(backend)
    calls: list[str] = []
    first = KINDS[kind](target, _counter(calls, "first"), backend.name)
    second = KINDS[kind](target, _counter(calls, "second"), backend.name)
    third = KINDS[kind](target, _counter(calls, "third"), backend.name)
    target.trigger()
    assert {"first", "second", "third"} <= set(calls)

    first.remove()
    first.remove()  # the second removal must not take another hook with it
    remover = threading.Thread(target=second.remove)
    remover.start()
    remover.join()
    second.remove()
    calls.clear()
    target.trigger()
    assert "third" in calls and "first" not in calls and "second" not in calls
    third.remove()
    third.remove()
    calls.clear()
    target.trigger()
    assert calls == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_handle_removal_after_the_model_died_is_a_no_op(backend: Any, kind: str) -> None:
    gc.collect()
    native = backend.native_state()
    target = Target(backend)
    calls: list[str] = []
    handle = KINDS[kind](target, _counter(calls, "hook"), backend.name)
    target.trigger()
    assert calls
    refs = [weakref.ref(target.model), weakref.ref(target.x)]
    del target
    gc.collect()
    alive = [r for r in refs if r() is not None]
    handle.remove()
    handle.remove()
    gc.collect()
    # the handle did not keep the model and input alive (a global hook is the framework's)
    assert alive == []
    assert backend.native_state() == native
    assert backend.name not in _globals


def _referring(model: Any, seen: list[Any]) -> Callable[..., None]:
    def hook(*args: Any) -> None:
        seen.append(model)

    return hook


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.startswith("global")])
def test_a_hook_referring_to_its_model_does_not_keep_it_alive(backend: Any, kind: str) -> None:
    """torch frees a module whose hook closes over it (a plain reference cycle) even while
    the user keeps the handle: so must unihook's state, whichever kind holds the hook."""
    target = Target(backend)
    seen: list[Any] = []
    handle = KINDS[kind](target, _referring(target.model, seen), backend.name)
    target.trigger()
    assert seen
    refs = [weakref.ref(target.model), weakref.ref(target.x)]
    seen.clear()
    del target
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    handle.remove()


@pytest.mark.parametrize("kind", [*KINDS, "recipes"])
def test_a_module_class_made_per_model_is_not_kept_alive(backend: Any, kind: str) -> None:
    """A class made per model (by a factory, hypothesis, a config) holds what its methods
    refer to: once the model and its hooks are gone, nothing of unihook's keeps it (until
    2026-12-04 ops' and the plugin manager's tables by type kept every class they saw, with
    its closures: helper-124's FINDING 4)."""
    from unihook.recipes import ActivationStats, GradientMonitor

    target = Target(backend)
    made = type("Made", (type(target.model),), {})
    target.model = made(_linear_forward, {"lin": backend.linear(2, 2)})
    if kind == "recipes":
        with ActivationStats(target.model), GradientMonitor(target.model):
            target.trigger()
    else:
        handle = KINDS[kind](target, lambda *a: None, backend.name)
        target.trigger()
        handle.remove()
    ref = weakref.ref(made)
    del made, target
    gc.collect()
    assert ref() is None


class _Boom(Exception):
    pass


def _backward_hooked(kit: Any, module: Any, kind: str) -> Any:
    if kind == "full":
        return unihook.register_full_backward_hook(module, lambda *a: None)
    if kind == "pre":
        return unihook.register_full_backward_pre_hook(module, lambda *a: None)
    return unihook.register_module_full_backward_hook(lambda *a: None, backend=kit.name)


@pytest.mark.parametrize("kind", ["full", "pre", "global"])
def test_what_a_pass_gave_a_hooked_modules_output_is_freed_with_it(backend: Any, kind: str) -> None:
    """A tensor hook on a hooked module's output sees a gradient with a graph (create_graph:
    its graph reaches back to the output), in a pass that never runs the module's backward (a
    gradient with respect to the output): nothing stays alive after it. (paddle: what the
    hooks leave is recorded for the module's identity node; recorded on the node, it held the
    node's own graph through C++, out of the collector's reach.)"""
    from unihook.testing import creates_graph, grads_non_leaves

    if not (creates_graph(backend) and grads_non_leaves(backend)):
        pytest.skip(f"{backend.name}: no create_graph gradient with respect to an output")

    module = backend.module(lambda self, x: x * 3)
    refs = []
    with _backward_hooked(backend, module, kind):
        for _ in range(3):

            def log(g: Any) -> None:
                return None

            # (the hook lives as long as the graph holding it: the Python `y` may die while
            # its tensor lives on, saved in a node)
            refs.append(weakref.ref(log))
            x = backend.tensor([1.0, 2.0], requires_grad=True)
            y = module(x)
            unihook.register_tensor_hook(y, log)
            backend.autograd_grad([(y * y).sum()], [y], create_graph=True)
            refs += [weakref.ref(x), weakref.ref(y)]
            del x, y, log
        gc.collect()
        assert [r for r in refs if r() is not None] == []


@pytest.mark.parametrize("pass_", ["reaching_the_output_only", "raised"])
@pytest.mark.parametrize("kind", ["full", "pre", "global"])
def test_what_paddles_own_hook_on_a_hooked_output_returned_is_freed(kind: str, pass_: str) -> None:
    """paddle's own ``register_hook`` on a hooked layer's output, returning a tensor whose
    graph holds that output (gradient times activation), in a pass that never runs the layer's
    identity node: nothing stays alive after it (its result was recorded for that node)."""
    paddle = pytest.importorskip("paddle")
    from unihook.testing import kits

    kit = next(k for k in kits() if k.name == "paddle")
    module = kit.module(lambda self, x: x * 3)
    refs = []
    with _backward_hooked(kit, module, kind):
        for _ in range(3):
            x = kit.tensor([1.0, 2.0], requires_grad=True)
            y = module(x)
            held = [y]  # (emptied below: the hook itself must not hold `y` for good)

            def times_output(g: Any) -> Any:
                return g * held[0]

            def boom(g: Any) -> Any:
                raise _Boom

            refs.append(weakref.ref(times_output))
            y.register_hook(times_output)
            if pass_ == "raised":
                y.register_hook(boom)
                try:
                    (y * y).sum().backward()
                except (_Boom, OSError):  # (paddle's own hooks raise OSError)
                    pass  # (pytest.raises would keep the traceback, and its frames `y`)
                else:
                    raise AssertionError("the hook did not raise")
            else:
                paddle.grad([(y * y).sum()], [y])
            refs += [weakref.ref(x), weakref.ref(y)]
            held.clear()
            del x, y, times_output, boom
        gc.collect()
        assert [r for r in refs if r() is not None] == []
