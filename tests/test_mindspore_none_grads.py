"""Generated: module backward hooks returning None for some gradients (a pre-hook's for
`grad_output` slots, a full hook's for `grad_input`), on chains of Dense and tuple-output cells
with tanh between them, unihook on MindSpore against torch's native hooks on the same weights.
The input and weight gradients must be torch's (a None torch has may be zeros here). MindSpore's
engine prunes what is before a None an identity returns: 244 of 600 programs (seeds 0-599) lose
hook calls torch makes, a cell's own full hook among them (docs/MINDSPORE.md §11 item 4, open,
a strict xfail below). Zeros sent on instead (15dec69) gave every call but NaN gradients where
an op with an infinite derivative (sqrt at 0) met them (helper-108's FINDINGS 1, 2): reverted.
Runs in `make test`'s MindSpore venv (it has torch)."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import unihook  # noqa: E402

# (kind, [(hook kind, None or which slots the hook sets to None)]) per cell
Spec = list[tuple[str, list[tuple[str, "tuple[bool, ...] | None"]]]]
Log = list[tuple[int, str, Any, Any]]

# MindSpore's float32 tanh is about 1e-3 relative off torch's: a structural comparison
RTOL, ATOL = 2e-2, 2e-3


def _cells(framework: str, spec: Spec, weights: list[tuple[Any, Any]]) -> list[Any]:
    cells = []
    for (kind, _), (w, b) in zip(spec, weights):
        if framework == "torch":
            dense: Any = torch.nn.Linear(3, 3)
            with torch.no_grad():
                dense.weight.copy_(torch.tensor(w))
                dense.bias.copy_(torch.tensor(b))
        else:
            dense = ms.nn.Dense(3, 3)
            dense.weight.set_data(ms.Tensor(w))
            dense.bias.set_data(ms.Tensor(b))
        cells.append(dense if kind == "dense" else _pair(framework, dense))
    return cells


def _pair(framework: str, dense: Any) -> Any:
    """A cell returning ``(dense(h), tanh(h))``."""
    if framework == "torch":

        class TorchPair(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.dense = dense

            def forward(self, h: Any) -> Any:
                return self.dense(h), torch.tanh(h)

        return TorchPair()

    class Pair(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dense = dense

        def construct(self, h: Any) -> Any:
            return self.dense(h), ms.ops.tanh(h)

    return Pair()


def _hooked(framework: str, cell: Any, i: int, kind: str, nones: Any, log: Log) -> None:
    def arrays(grads: Any) -> list[Any]:
        if framework == "torch":
            return [None if g is None else g.detach().numpy().copy() for g in grads]
        return [None if g is None else g.asnumpy().copy() for g in grads]

    def replaced(grads: Any) -> Any:
        return None if nones is None else tuple(None if n else g for n, g in zip(nones, grads))

    def full(module: Any, grad_input: Any, grad_output: Any) -> Any:
        log.append((i, "full", arrays(grad_input), arrays(grad_output)))
        return replaced(grad_input)

    def pre(module: Any, grad_output: Any) -> Any:
        log.append((i, "pre", None, arrays(grad_output)))
        return replaced(grad_output)

    hook: Callable[..., Any] = full if kind == "full" else pre
    if framework == "torch":  # the oracle: torch's native hooks
        native = (
            "register_full_backward_hook" if kind == "full" else "register_full_backward_pre_hook"
        )
        getattr(cell, native)(hook)
    elif kind == "full":
        unihook.register_full_backward_hook(cell, hook)
    else:
        unihook.register_full_backward_pre_hook(cell, hook)


def _run(framework: str, spec: Spec, weights: list[tuple[Any, Any]], x0: Any) -> Any:
    """The hook calls and the gradients (input, then each cell's weight and bias)."""
    cells = _cells(framework, spec, weights)
    log: Log = []
    for i, (cell, (_, hooks)) in enumerate(zip(cells, spec)):
        for kind, nones in hooks:
            _hooked(framework, cell, i, kind, nones, log)
    tanh = torch.tanh if framework == "torch" else ms.ops.tanh

    def loss(x: Any) -> Any:
        h = x
        for cell, (kind, _) in zip(cells, spec):
            out = cell(h)
            h = out[0] * 0.5 + out[1] if kind == "pair" else tanh(out)
        return (h * h).sum()

    if framework == "torch":
        x = torch.tensor(x0, requires_grad=True)
        loss(x).backward()
        grads = [x.grad] + [p.grad for cell in cells for p in cell.parameters()]
        return log, [None if g is None else g.numpy() for g in grads]
    params = [p for cell in cells for p in cell.trainable_params()]
    gx, gw = ms.grad(loss, 0, params)(ms.Tensor(x0))
    return log, [gx.asnumpy()] + [g.asnumpy() for g in gw]


def _program(seed: int) -> tuple[Spec, list[tuple[Any, Any]], Any]:
    r = random.Random(seed)
    spec: Spec = []
    for _ in range(r.randint(1, 4)):
        kind = r.choice(["dense", "dense", "pair"])
        hooks = []
        for _ in range(r.randint(0, 3)):
            hook = r.choice(["full", "pre"])
            slots = 2 if hook == "pre" and kind == "pair" else 1
            nones = None if r.random() < 0.4 else tuple(r.random() < 0.5 for _ in range(slots))
            hooks.append((hook, nones))
        spec.append((kind, hooks))
    rs = np.random.RandomState(seed)
    weights = [(rs.randn(3, 3).astype(np.float32), rs.randn(3).astype(np.float32)) for _ in spec]
    return spec, weights, rs.randn(2, 3).astype(np.float32)


def _close(actual: Any, expected: Any) -> bool:
    """Equal within the tolerance; a None torch has may be zeros here."""
    if actual is None or expected is None:
        other = expected if actual is None else actual
        return other is None or not np.any(other)
    return actual.shape == expected.shape and np.allclose(actual, expected, RTOL, ATOL)


def _differences(seed: int) -> tuple[list[str], bool]:
    """What differs from torch in program `seed`: the hook calls (kind and cell, in order,
    then their arguments), and whether the input and weight gradients do."""
    spec, weights, x0 = _program(seed)
    expected, expected_grads = _run("torch", spec, weights, x0)
    actual, grads = _run("mindspore", spec, weights, x0)
    calls = [call[:2] for call in actual]
    wrong = []
    if calls != [call[:2] for call in expected]:
        wrong.append(f"{seed}: {spec}: calls {calls}, torch {[c[:2] for c in expected]}")
    else:
        for got, want in zip(actual, expected):
            for a, e in ((got[2], want[2]), (got[3], want[3])):
                if (a is not None or e is not None) and (
                    len(a) != len(e) or not all(map(_close, a, e))
                ):
                    wrong.append(f"{seed}: {spec}: cell {got[0]}'s {got[1]} hook's args")
    same = len(grads) == len(expected_grads) and all(map(_close, grads, expected_grads))
    return wrong, not same


@pytest.mark.parametrize("block", range(4))
def test_hooks_returning_none_keep_torchs_gradients(block: int) -> None:
    seeds = range(block * 50, block * 50 + 50)
    wrong = [seed for seed in seeds if _differences(seed)[1]]
    assert not wrong, f"programs with other gradients than torch's: {wrong}"


@pytest.mark.xfail(
    strict=True,
    reason="docs/MINDSPORE.md §11 item 4 (open): MindSpore's engine prunes what is before a "
    "None a hook returned, whose hooks torch calls; zeros sent on instead (15dec69) gave NaN "
    "gradients through an op with an infinite derivative there (helper-108's FINDINGS 1, 2)",
)
def test_hooks_returning_none_leave_no_hook_call_out() -> None:
    wrong = [line for seed in range(50) for line in _differences(seed)[0]]
    assert not wrong, "\n".join(wrong[:5]) + f"\n({len(wrong)} of 50)"
