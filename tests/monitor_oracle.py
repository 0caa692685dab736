"""GradientMonitor against torch's own module hooks: the oracle the monitor's tests share.

The promise: a module's entry equals the norm of the grad_output torch's native
``register_full_backward_pre_hook`` sees (over its calls), or the module is absent from the
step and a RuntimeWarning containing "GradientMonitor" names it; never a silently wrong
number."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import warnings
from typing import Any, Callable

import pytest

from unihook.recipes import GradientMonitor

Loss = Callable[[Any, Any], Any]  # (model, output) -> scalar
Prepare = Callable[[Any], Any]  # (model) -> what undoes it: e.g. a user's hooks on the model


def native_norms(
    model: Any, names: list[str], x: Any, loss: Loss, prepare: Prepare | None = None
) -> dict[str, float]:
    """torch's full backward pre-hooks on a deep copy (`prepare` applied to it first), each
    grad_output's norm over the module's calls."""

    def run(ref: Any) -> None:
        if prepare is not None:
            prepare(ref)
        loss(ref, ref(x)).backward()

    return native_run(model, names, run)


def native_run(model: Any, names: list[str], run: Callable[[Any], Any]) -> dict[str, float]:
    """torch's full backward pre-hooks on a deep copy, through `run(copy)` (forward and
    backward as the caller wants), each module's grad_output norm over its calls."""
    ref = copy.deepcopy(model)
    seen: dict[str, float] = {}

    def hook(name: str) -> Any:
        def fn(module: Any, grad_output: Any) -> None:
            squares = sum(float(g.double().pow(2).sum()) for g in grad_output if g is not None)
            seen[name] = seen.get(name, 0.0) + squares

        return fn

    for name in names:
        ref.get_submodule(name).register_full_backward_pre_hook(hook(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(ref)
    return {name: squares**0.5 for name, squares in seen.items()}


def monitored(
    model: Any,
    x: Any,
    loss: Loss,
    prepare: Prepare | None = None,
    first: bool = False,
    **kwargs: Any,
) -> tuple[dict[str, float], list[str]]:
    """The monitor's last entry for one forward and backward of `model` (`prepare` applied
    after the monitor was made, or before it if `first`, undone after), and the monitor's
    warnings."""
    undo = prepare(model) if prepare is not None and first else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            with GradientMonitor(model, **kwargs) as monitor:
                if prepare is not None and not first:
                    undo = prepare(model)
                loss(model, model(x)).backward()
        finally:
            if undo is not None:
                undo()
    said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
    return (dict(monitor.history[-1]) if monitor.history else {}), said


def broken(
    model: Any,
    names: list[str],
    x: Any,
    loss: Loss,
    prepare: Prepare | None = None,
    first: bool = False,
    **kwargs: Any,
) -> list[str]:
    """The modules whose entry breaks the promise (see the module's docstring)."""
    native = native_norms(model, names, x, loss, prepare)
    step, said = monitored(model, x, loss, prepare, first, **kwargs)
    found = []
    for name in names:
        if name in step:
            want = native.get(name)
            if want is None or step[name] != pytest.approx(want, rel=1e-5):
                found.append(f"{name!r}: recorded {step[name]:.4f}, native {want}")
        elif name in native and not any(repr(name) in s for s in said):
            found.append(f"{name!r}: absent without a warning")
    return found


def names(model: Any) -> list[str]:
    """Every module's qualified name (torch)."""
    return [name for name, _ in model.named_modules()]


def square(model: Any, out: Any) -> Any:
    """The loss most attacks take: the output's sum of squares."""
    return (out * out).sum()


def said(caught: Any) -> list[str]:
    """The GradientMonitor warnings among `caught`."""
    return [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]


# The start of a MindSpore twin's script: two seeded Dense(4, 4) weights, `dense(i)` the i-th,
# and an input `x` (3, 4)
MINDSPORE_DENSES = r"""
import json, sys, warnings
import numpy as np
import mindspore as ms
from unihook.recipes import GradientMonitor

rng = np.random.default_rng(0)
w = [rng.normal(size=(4, 4)).astype(np.float32) * 0.5 for _ in range(2)]
b = [rng.normal(size=4).astype(np.float32) * 0.1 for _ in range(2)]
x = ms.Tensor(rng.normal(size=(3, 4)).astype(np.float32))


def dense(i):
    d = ms.nn.Dense(4, 4)
    d.weight.set_data(ms.Tensor(w[i]))
    d.bias.set_data(ms.Tensor(b[i]))
    return d
"""

# the MindSpore venv `make test` makes in the checkout
MINDSPORE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-mindspore", "bin", "python"
)


def run_in_mindspore(script: str) -> Any:
    """Run `script` in the MindSpore venv (this checkout's unihook on its path) and return the
    JSON it prints last; skip where there is no such venv."""
    if not os.path.exists(MINDSPORE):
        pytest.skip("no MindSpore environment")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    env = dict(os.environ, PYTHONPATH=f"{root}:{root}/backends", GLOG_minloglevel="2")
    done = subprocess.run(
        [MINDSPORE, "-c", script], cwd=here, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
