"""The recipes on a model run under ``torch.func.vmap`` (and ``vmap`` of ``torch.func.grad``:
per-sample gradients): the numbers eager gives on the same batch. vmap runs a module once per
call with BatchedTensors, which have no storage and whose hooks never fire (torch's own module
backward hooks run nothing there): ActivationStats raised torch's "Cannot access data pointer"
out of the user's vmap, GradientMonitor recorded nothing, silently (helper-109's FINDINGS 5,
5b). The oracle is the same recipe on a copy of the model called eagerly on the batch (in the
chunks a ``chunk_size`` makes); tests/test_attack_h109.py checks the norms against torch's
native hooks."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from unihook.recipes import ActivationStats, GradientMonitor  # noqa: E402


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, h: Any) -> Any:
        return self.act(self.lin(h)) + h


def _model(which: str) -> Any:
    torch.manual_seed(0)
    layers = {
        "mlp": lambda: [nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)],
        "inplace": lambda: [nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)],
        "identity": lambda: [nn.Linear(4, 4), nn.Identity(), nn.Tanh(), nn.Linear(4, 2)],
        "dropout_eval": lambda: [nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)],
        "residual": lambda: [nn.Linear(4, 4), _Residual(), nn.Linear(4, 2)],
    }[which]()
    return nn.Sequential(*layers).eval()


def _loss(y: Any) -> Any:
    return y.pow(2).sum()


def _vmapped(m: Any, transform: str, x: Any) -> None:
    """The model's forward and backward through `transform`."""
    vmap = torch.func.vmap
    if transform == "vmap":
        _loss(vmap(m)(x)).backward()
    elif transform == "in_dims_1":
        _loss(vmap(m, in_dims=1)(x.transpose(0, 1))).backward()
    elif transform == "chunks":
        _loss(vmap(m, chunk_size=2)(x)).backward()
    elif transform == "nested":
        _loss(vmap(vmap(m))(x)).backward()
    elif transform == "per_sample_grads":
        params = {k: v.detach() for k, v in m.named_parameters()}

        def loss(p: Any, xi: Any) -> Any:
            return _loss(torch.func.functional_call(m, p, (xi,)))

        vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    else:
        raise AssertionError(transform)


def _eager(m: Any, transform: str, x: Any) -> None:
    """What `_vmapped` computes, eagerly: the model called on the batch (on each chunk)."""
    if transform == "chunks":
        _loss(torch.cat([m(x[:2]), m(x[2:4]), m(x[4:])])).backward()
    else:
        _loss(m(x)).backward()


def _run(cls: Any, m: Any, call: Callable[[], None]) -> tuple[Any, list[str]]:
    recipe = cls(m, sync=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        said = sorted(str(w.message) for w in caught if type(recipe).__name__ in str(w.message))
        if cls is GradientMonitor:
            return list(recipe.history), said
        return recipe.rows(), said
    finally:
        recipe.remove()


def _close(got: Any, want: Any, what: str) -> None:
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), what
        for key in want:
            _close(got[key], want[key], f"{what}[{key!r}]")
    elif isinstance(want, list):
        assert len(got) == len(want), (what, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{what}[{i}]")
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=what)
    else:
        assert got == want, (what, got, want)


def _native_norms(m: Any, transform: str, x: Any) -> dict[str, float]:
    """torch's native grad_output norms of each module (full backward pre-hooks), on a copy
    of `m` without in-place ops (where native hooks work), called as `_eager` calls it."""
    ref = copy.deepcopy(m)
    squares: dict[str, float] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(module: Any, grad_output: Any) -> None:
            squares[name] = squares.get(name, 0.0) + float(grad_output[0].double().square().sum())

        return hook

    for name, module in ref.named_modules():
        if hasattr(module, "inplace"):
            module.inplace = False
        if name:
            module.register_full_backward_pre_hook(keep(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ("Full backward hook is firing ... no inputs")
        _eager(ref, transform, x)
    return {name: value**0.5 for name, value in squares.items()}


_TRANSFORMS = ["vmap", "in_dims_1", "chunks", "nested", "per_sample_grads"]
_MODELS = ["mlp", "inplace", "identity", "dropout_eval", "residual"]


@pytest.mark.parametrize("transform", _TRANSFORMS)
@pytest.mark.parametrize("which", _MODELS)
def test_activation_stats_of_a_vmapped_model_are_eagers(transform: str, which: str) -> None:
    m = _model(which)
    twin = copy.deepcopy(m)
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    got, got_said = _run(ActivationStats, m, lambda: _vmapped(m, transform, x))
    want, want_said = _run(ActivationStats, twin, lambda: _eager(twin, transform, x))
    assert want, "the eager oracle recorded nothing"
    if transform == "chunks":
        for row in want:  # (the same calls, each of a chunk)
            assert row["calls"] == 3
    _close(got, want, f"{which} {transform}")
    assert got_said == want_said


@pytest.mark.parametrize("transform", _TRANSFORMS)
@pytest.mark.parametrize("which", _MODELS)
def test_gradient_monitor_of_a_vmapped_model_records_torchs_norms(
    transform: str, which: str
) -> None:
    """Each norm recorded is torch's native one; each module eager records is recorded, with
    eager's warnings. (An output a later in-place op changes, eager's nn.Linear before an
    in-place ReLU: torch runs no hook registered on it before, so eager records nothing for
    that module; under vmap the hook is on the tensor under the BatchedTensor, and the norm
    it records is torch's native one.)"""
    m = _model(which)
    twin = copy.deepcopy(m)
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    got, got_said = _run(GradientMonitor, m, lambda: _vmapped(m, transform, x))
    want, want_said = _run(GradientMonitor, twin, lambda: _eager(twin, transform, x))
    native = _native_norms(m, transform, x)
    assert len(got) == len(want) == (3 if transform == "chunks" else 1), (got, want)
    for entry, eager in zip(got, want):  # (one per forward of the model: per chunk)
        assert set(eager) <= set(entry), (entry, eager)
        _close({k: entry[k] for k in eager}, eager, f"{which} {transform}")
    for name in {name for entry in got for name in entry if name}:  # ('': the model's own)
        total = sum(entry.get(name, 0.0) ** 2 for entry in got) ** 0.5
        np.testing.assert_allclose(total, native[name], rtol=1e-5, err_msg=name)
    assert got_said == want_said
