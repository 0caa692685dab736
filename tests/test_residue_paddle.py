"""Paddle-specific residue checks (framework internals, so not in the conformance suite):
after every hook is gone, paddle runs exactly as if unihook had never been used.

- ``Layer.__call__`` takes its no-hook fast path again (``_dygraph_call_func`` not called);
- the autograd guard (``_autograd_guard``) restores ``core.eager.run_backward``,
  ``run_partial_grad``, ``Tensor._register_grad_hook`` and ``Tensor.retain_grads`` once the
  last tensor hook is removed and its tensors are dropped, and its marks go with the nodes.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

from unihook_paddle import _autograd_guard as guard  # noqa: E402

import unihook  # noqa: E402


def _count_slow_path(layer: Any) -> list[int]:
    calls = [0]
    slow = layer._dygraph_call_func

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return slow(*args, **kwargs)

    object.__setattr__(layer, "_dygraph_call_func", counting)
    return calls


def test_layer_fast_path_is_back_after_removing_forward_hooks() -> None:
    layer = paddle.nn.Linear(2, 2)
    calls = _count_slow_path(layer)
    x = paddle.ones([1, 2])
    layer(x)
    assert calls == [0]
    handles = [
        unihook.register_forward_pre_hook(layer, lambda m, a: None),
        unihook.register_forward_pre_hook(layer, lambda m, a, k: None, with_kwargs=True),
        unihook.register_forward_hook(layer, lambda m, a, o: None, always_call=True),
        unihook.register_forward_hook(layer, lambda m, a, k, o: None, with_kwargs=True),
    ]
    layer(x)
    assert calls == [1]
    for h in handles:
        h.remove()
    layer(x)
    assert calls == [1]
    for attr in (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs_flag",
        "_forward_post_hooks",
        "_forward_post_hooks_with_kwargs_flag",
        "_forward_post_hooks_always_called",
    ):
        assert len(getattr(layer, attr)) == 0, attr


def test_guard_counts_follow_hook_lifetimes() -> None:
    gc.collect()
    live_before = len(guard._holders)
    x = paddle.to_tensor([1.0, 2.0], stop_gradient=False)
    z = x * 2
    handles = [
        unihook.register_tensor_hook(x, lambda g: g * 2),
        unihook.register_tensor_hook(z, lambda g: None),
    ]
    assert guard.installed() and len(guard._holders) == live_before + 2
    assert id(x) in guard._tracked and id(z) in guard._tracked
    (gx,) = paddle.grad([(z * 3).sum()], [x])
    assert gx.numpy().tolist() == [12.0, 12.0]
    for h in handles:
        h.remove()
    assert id(x) not in guard._tracked and id(z) not in guard._tracked
    del x, z, gx
    gc.collect()
    assert len(guard._holders) == live_before
    if live_before == 0:
        assert not guard.installed()


_SCRIPT = textwrap.dedent(
    """
    import gc, warnings
    warnings.filterwarnings("ignore", message="No ccache found")
    import paddle
    from paddle.base import core
    import unihook
    from unihook_paddle import _autograd_guard as guard

    original = (core.eager.run_backward, core.eager.run_partial_grad)
    methods = (paddle.Tensor._register_grad_hook, paddle.Tensor.retain_grads)

    def one_round(remove):
        x = paddle.to_tensor([1.0, 2.0], stop_gradient=False)
        z = x * 2
        handles = [unihook.register_tensor_hook(x, lambda g: g * 2),
                   unihook.register_tensor_hook(z, lambda g: g + 1)]
        assert core.eager.run_backward is not original[0]
        assert paddle.Tensor.retain_grads is not methods[1]
        lin = paddle.nn.Linear(2, 2)
        handles.append(unihook.register_full_backward_hook(lin, lambda *a: None))
        out = lin(z.reshape([1, 2]))  # an identity node lives: a retained grad is marked
        z.retain_grads()
        assert guard._seen
        ((z * 3).sum() + out.sum() * 0).backward()
        assert x.grad.numpy().tolist() == [16.0, 16.0], x.grad
        y = x * x
        (gx,) = paddle.grad([y.sum()], [x])
        assert gx.numpy().tolist() == [4.0, 8.0], gx
        if remove:
            for h in handles:
                h.remove()

    for remove in (True, False):  # removed handles, then handles just dropped with the tensors
        one_round(remove)
        gc.collect()
        assert not guard.installed(), "guard still installed"
        assert core.eager.run_backward is original[0]
        assert core.eager.run_partial_grad is original[1]
        assert paddle.Tensor._register_grad_hook is methods[0]
        assert paddle.Tensor.retain_grads is methods[1]
        assert not guard._tracked, guard._tracked
        assert not guard._seen and not guard._marks, (guard._seen, guard._marks)
    print("RESTORED")
    """
)


def test_autograd_entry_points_restored_after_last_tensor_hook() -> None:
    env = dict(os.environ, GLOG_minloglevel="2")
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESTORED" in done.stdout


def test_native_registration_inside_a_global_hook_stays_on_its_layer() -> None:
    """Layers without hooks of their own share the merged global hook dicts during a call: a
    native paddle register_* in a hook mutates that shared dict in place. The new hook must end
    up on its layer alone."""
    seen: list[str] = []
    first, other = paddle.nn.ReLU(), paddle.nn.ReLU()
    added: list[object] = []

    def pre(layer: object, args: object) -> None:
        if layer is first and not added:
            added.append(first.register_forward_post_hook(lambda *a: seen.append("native")))

    with unihook.register_module_forward_pre_hook(pre, backend="paddle"):
        first(paddle.ones([1]))
        other(paddle.ones([1]))
        assert seen == ["native"]  # registered before the post hooks ran: runs in this call
        first(paddle.ones([1]))
        other(paddle.ones([1]))
    assert seen == ["native", "native"]
    first(paddle.ones([1]))
    assert seen == ["native"] * 3 and len(first._forward_post_hooks) == 1
