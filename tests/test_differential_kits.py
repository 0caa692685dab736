"""Differential, through the backends' conformance kits: the same models with the same weights
in torch (the oracle) and in every other installed framework, every hook kind registered
through unihook on every module and globally. Hook order, every hook's arguments, outputs and
gradients, and the Grad-CAM / Grad-CAM++ maps must agree.

In the dev venv this compares torch with paddle; in `make test`'s MindSpore venv, torch with
MindSpore (the venv that has both frameworks decides).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np
import pytest

import unihook
from unihook.conformance import installed_kits
from unihook.testing import Kit, classifier, images

RTOL = 1e-5
ATOL = 1e-5  # of the largest value compared: float32 convolutions summed in other orders


def _kits() -> tuple[Kit, list[Kit]]:
    found = {k.name: k for k in installed_kits()}
    if "torch" not in found or len(found) < 2:
        pytest.skip("needs torch and another framework in this venv")
    return found.pop("torch"), list(found.values())


def _mlp(kit: Kit) -> Any:
    rng = np.random.default_rng(7)
    layers: list[Any] = []
    sizes = [(3, 8), (8, 4), (4, 2)]
    for i, (n_in, n_out) in enumerate(sizes):
        w, b = rng.normal(0, 0.7, (n_out, n_in)), rng.normal(0, 0.2, (n_out,))
        layers.append(kit.linear(n_in, n_out, w, b))
        if i < len(sizes) - 1:
            layers.append(kit.relu_module())
    return kit.sequential(*layers)


MODELS: dict[str, tuple[Callable[[Kit], Any], Callable[[Kit], Any]]] = {
    "mlp": (_mlp, lambda kit: np.random.default_rng(3).normal(0, 1, (5, 3))),
    "cnn": (classifier, lambda kit: np.asarray(kit.numpy(images(kit)))),
}


def _arrays(kit: Kit, value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(kit, v)]
    return [None if value is None else kit.numpy(value)]


def _record(kit: Kit, model: Any, data: Any) -> dict[str, list[list[Any]]]:
    """Every hook call's arrays by hook (in call order), then the output and gradients."""
    log: dict[str, list[list[Any]]] = defaultdict(list)

    def rec(key: str, *values: Any) -> None:
        log[key].append([a for v in values for a in _arrays(kit, v)])
        log["order"].append([key])

    handles = []
    for name, m in kit.named_modules(model):
        handles += [
            unihook.register_forward_pre_hook(m, lambda _m, a, n=name: rec(f"pre {n}", a)),
            unihook.register_forward_hook(m, lambda _m, a, o, n=name: rec(f"fwd {n}", a, o)),
            unihook.register_forward_hook(
                m, lambda _m, a, k, o, n=name: rec(f"fwd-kw {n}", o), with_kwargs=True
            ),
            unihook.register_full_backward_pre_hook(
                m, lambda _m, go, n=name: rec(f"bwd-pre {n}", go)
            ),
            unihook.register_full_backward_hook(
                m, lambda _m, gi, go, n=name: rec(f"bwd {n}", gi, go)
            ),
        ]
    be = kit.name
    handles += [
        unihook.register_module_forward_pre_hook(lambda _m, a: rec("G-pre", a), backend=be),
        unihook.register_module_forward_hook(lambda _m, a, o: rec("G-fwd", o), backend=be),
        unihook.register_module_full_backward_pre_hook(
            lambda _m, go: rec("G-bwd-pre", go), backend=be
        ),
        unihook.register_module_full_backward_hook(
            lambda _m, gi, go: rec("G-bwd", gi, go), backend=be
        ),
    ]
    try:
        x = kit.tensor(data, requires_grad=True)
        handles.append(unihook.register_tensor_hook(x, lambda g: rec("tensor x", g)))
        out = model(x)
        handles.append(unihook.register_tensor_hook(out, lambda g: rec("tensor out", g)))
        kit.backward(unihook.ops.sum(out * out))
        log["output"].append([kit.numpy(out)])
        log["x.grad"].append([kit.grad(x)])
        log["param grads"].append([kit.grad(p) for p in kit.parameters(model)])
    finally:
        for h in handles:
            h.remove()
    return log


def _close(got: Any, want: Any, what: str) -> None:
    assert (got is None) == (want is None), what
    if want is None:
        return
    if got.shape != want.shape and got.T.shape == want.shape:
        got = got.T  # paddle's Linear weight is [in, out], torch's [out, in]
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * scale, err_msg=what)


@pytest.mark.parametrize("model", list(MODELS))
def test_every_hook_kind_sees_torchs_numbers(model: str) -> None:
    oracle, others = _kits()
    build, data = MODELS[model]
    want = _record(oracle, build(oracle), data(oracle))
    assert len(want["order"]) > 20
    for kit in others:
        got = _record(kit, build(kit), data(oracle))
        assert got["order"] == want["order"], f"{kit.name}: hook calls in another order"
        assert sorted(got) == sorted(want)
        for key, calls in want.items():
            if key == "order":
                continue
            assert len(got[key]) == len(calls), f"{kit.name} {key}: calls"
            for i, (g, w) in enumerate(zip(got[key], calls)):
                assert len(g) == len(w), f"{kit.name} {key} call {i}: number of arrays"
                for j, (a, b) in enumerate(zip(g, w)):
                    _close(a, b, f"{kit.name} {key} call {i} array {j}")


@pytest.mark.parametrize("method", ["GradCAM", "GradCAMPlusPlus"])
def test_grad_cam_maps_equal_torchs(method: str) -> None:
    from unihook import recipes

    oracle, others = _kits()
    recipe = getattr(recipes, method)

    def cam(kit: Kit) -> Any:
        return np.asarray(recipe(classifier(kit), "layer4")(images(kit)))

    want = cam(oracle)
    assert want.shape == (2, 8, 8) and want.max() > 0
    for kit in others:
        _close(cam(kit), want, f"{kit.name} {method}")
