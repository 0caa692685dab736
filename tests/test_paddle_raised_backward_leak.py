"""A backward that raised on paddle keeps nothing of the model alive.

paddle 3.3.1 never frees a PyLayer whose backward raised (docs/SEMANTICS.md §4.12), nor the
graph around it, and unihook's identity nodes held their module calls' state: a hook that
raised in a module backward (the user's own exception, an `InPlaceError`) kept the whole model
alive for the rest of the process (found 2026-12-07). After a Tensor.backward without
retain_graph, no pass can go through that graph again (the nodes that ran freed their
tensors): the nodes it reached let go of their calls. paddle.grad, which runs copies of the
nodes and may be retried, is unchanged.
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

import unihook  # noqa: E402
from unihook.errors import InPlaceError  # noqa: E402


class _Keeps(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)

    def forward(self, h: Any) -> Any:
        self.kept = h
        return self.fc(h) * 2


def _run(raise_in_hook: bool, retain: bool = False) -> weakref.ref[Any]:
    x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]], stop_gradient=False)
    model = _Keeps()

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        if raise_in_hook:
            raise KeyError("the user's own")

    unihook.register_full_backward_hook(model, hook)
    h = x * 1
    out = model(h)
    if not raise_in_hook:
        paddle.nn.functional.relu_(h)  # (the kept input changed: InPlaceError)
    loss = out.sum() + (model.kept * 1).sum()
    with pytest.raises(KeyError if raise_in_hook else InPlaceError):
        loss.backward(retain_graph=retain)
    return weakref.ref(model)


@pytest.mark.parametrize("raise_in_hook", [True, False], ids=["users_error", "inplace_error"])
def test_a_backward_that_raised_keeps_no_model_alive(raise_in_hook: bool) -> None:
    ref = _run(raise_in_hook)
    gc.collect()
    assert ref() is None


def test_paddle_grad_retried_after_a_hook_raised_runs_the_hooks_again() -> None:
    """paddle.grad runs copies of the nodes: unchanged, a retry with retain_graph runs the
    hooks again and gives the gradient."""
    x = paddle.to_tensor([[1.0, 2.0, 3.0, 4.0]], stop_gradient=False)
    model = paddle.nn.Linear(4, 4)
    calls: list[int] = []

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise KeyError("once")

    unihook.register_full_backward_hook(model, hook)
    loss = model(x * 1).sum()
    with pytest.raises(KeyError):
        paddle.grad(loss, x, retain_graph=True)
    (grad,) = paddle.grad(loss, x, retain_graph=True)
    assert calls == [0, 1]
    expected = model.weight.sum(axis=1).numpy()
    assert grad.numpy()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("hooked", ["own", "global"])
def test_another_loss_through_calls_that_did_not_run_still_backpropagates(hooked: str) -> None:
    """Two losses share `a`'s call; the first one's backward raises in a hook of `b`, above
    `a`: `a`'s nodes never ran, and the second loss goes through them with `a`'s hook and
    paddle's gradient (a first version let go of every node the raising backward reached:
    BackendStateError, helper-183's FINDING 1)."""
    paddle.seed(0)
    a, b = paddle.nn.Linear(3, 3), paddle.nn.Linear(3, 3)

    def raises(module: Any, grad_input: Any, grad_output: Any) -> None:
        raise KeyError("b")

    seen: list[Any] = []

    def record(module: Any, grad_input: Any, grad_output: Any) -> None:
        if module is a:
            seen.append(grad_output[0].numpy().copy())

    handles = [unihook.register_full_backward_hook(b, raises)]
    if hooked == "own":
        handles.append(unihook.register_full_backward_hook(a, record))
    else:
        handles.append(unihook.register_module_full_backward_hook(record))
    x = paddle.to_tensor([[1.0, 2.0, 3.0]], stop_gradient=False)
    h = a(x)
    first, second = b(h).sum(), (h * 2).sum()
    with pytest.raises(KeyError):
        first.backward()
    second.backward()
    assert len(seen) == 1 and seen[0].tolist() == [[2.0, 2.0, 2.0]]
    expected = (2 * a.weight.sum(axis=1)).numpy()
    assert x.grad.numpy()[0] == pytest.approx(expected, rel=1e-6)
    for handle in handles:
        handle.remove()


_RAISING_STEPS = """
import gc, sys, paddle, unihook
kind, steps = sys.argv[1], int(sys.argv[2])
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(1024, 1024), paddle.nn.Linear(1024, 1024))
x = paddle.randn([1024, 1024])  # (each gradient the hook gets: 4 MB)
def boom(*args):
    raise ValueError("the user's own")
register = {"full_backward": unihook.register_full_backward_hook,
            "full_backward_pre": unihook.register_full_backward_pre_hook}[kind]
register(model[1], boom)
def step():
    try:
        model(x).sum().backward()
    except ValueError:
        pass
    model.clear_gradients()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def contexts():
    return sum(type(o).__name__ == "_UnihookIdentity_backward" for o in gc.get_objects())
for _ in range(5):
    step()
gc.collect()
before, kept = rss(), contexts()
for _ in range(steps):
    step()
gc.collect()
print(rss() - before, contexts() - kept)
"""


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_a_hook_raising_at_every_step_leaks_nothing(kind: str) -> None:
    """paddle keeps what it called and the gradients it passed when a PyLayer's backward
    raises: a module backward hook raising at each step (an early stop, a caught error) kept
    every step's PyLayer context and gradients, 95 KB a step of a 64x256 model (helper-210's
    FINDING 1); here 4 MB a step before."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    steps = 30
    run = subprocess.run(
        [sys.executable, "-c", _RAISING_STEPS, kind, str(steps)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    grown, contexts = map(int, run.stdout.split())
    assert contexts == 0
    assert grown < 30 * 2**20  # (30 steps kept 120 MB of gradients before)


@pytest.mark.parametrize("how", ["strongly", "weakly"])
def test_gradients_a_raising_hook_kept_keep_their_values(how: str) -> None:
    """What the hooks were given is emptied only where nothing else holds it: a hook that
    keeps its gradient and raises keeps it intact, also after the next hooked call, also
    through a weak reference (paddle keeps the object: emptied, it read as an empty tensor,
    and arithmetic on it segfaulted, helper-211's FINDING 1)."""
    paddle.seed(0)
    model = paddle.nn.Linear(3, 2)
    kept: list[Any] = []

    def keep_and_raise(module: Any, grad_output: Any) -> None:
        kept.append(grad_output[0] if how == "strongly" else weakref.ref(grad_output[0]))
        raise KeyError("kept")

    handle = unihook.register_full_backward_pre_hook(model, keep_and_raise)
    x = paddle.to_tensor([[1.0, 2.0, 3.0]], stop_gradient=False)
    with pytest.raises(KeyError):
        (model(x) * 3).sum().backward()
    handle.remove()
    gc.collect()
    with unihook.register_full_backward_hook(model, lambda *args: None):
        model(x).sum().backward()  # (the next hooked call: what paddle kept is emptied here)
    (grad_output,) = kept if how == "strongly" else [ref() for ref in kept]
    assert grad_output is not None
    assert grad_output.numpy().tolist() == [[3.0, 3.0]]
    assert (grad_output * 2).numpy().tolist() == [[6.0, 6.0]]


@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_an_error_a_hook_raised_is_freed_without_the_collector(kind: str) -> None:
    """The guard re-raised the hook's error from a frame that kept it: a cycle through the
    traceback, freed only by the garbage collector, which kept the gradients the hooks saw
    (and paddle's gradients `_clear_orphans` waits for) until it ran."""

    errors: list[weakref.ref[Any]] = []

    class Stop(Exception):
        def __init__(self) -> None:
            super().__init__()
            errors.append(weakref.ref(self))

    def stop(*args: Any) -> None:
        raise Stop  # (not through a local: the hook's own frame would keep it)

    model = paddle.nn.Linear(3, 2)
    register = {
        "full_backward": unihook.register_full_backward_hook,
        "full_backward_pre": unihook.register_full_backward_pre_hook,
    }[kind]
    x = paddle.to_tensor([[1.0, 2.0, 3.0]], stop_gradient=False)
    gc.disable()
    try:
        with register(model, stop):
            try:
                model(x).sum().backward()
            except Stop:
                pass
        assert len(errors) == 1 and errors[0]() is None
    finally:
        gc.enable()


_RETRIES = """
import sys, paddle, unihook
paddle.seed(0)
model = paddle.nn.Linear(1024, 1024)
x = paddle.randn([1024, 1024])
x.stop_gradient = False
def boom(*args):
    raise ValueError("the user's own")
unihook.register_full_backward_pre_hook(model, boom)
loss = model(x).sum()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def retry():
    try:
        paddle.grad(loss, x, retain_graph=True)
    except ValueError:
        pass
for _ in range(3):
    retry()
before = rss()
for _ in range(int(sys.argv[1])):
    retry()
print(rss() - before)
"""


def test_retries_that_raise_keep_no_gradients_waiting() -> None:
    """Each retried paddle.grad whose hook raises leaves paddle a 4 MB gradient: they waited for
    the next hooked forward, 160 MB for 40 retries (helper-213's FINDING 4); now each raise
    empties those of the raises before."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    run = subprocess.run(
        [sys.executable, "-c", _RETRIES, "30"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) < 30 * 2**20  # (120 MB before)
