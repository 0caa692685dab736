"""Differential check, torch against MindSpore (issue 16, a development script, not API).

The same MLP and CNN in both frameworks with identical weights; every hook kind registered
through unihook on every module (and globally); prints, per model, the largest absolute
difference of the outputs, the input gradients, the parameter gradients and each hook kind's
arguments. Run in a venv holding both frameworks: ``python -m unihook_mindspore._differential``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

import unihook
from unihook.testing import Kit, classifier, images


def _mlp(kit: Kit) -> Any:
    rng = np.random.default_rng(7)
    sizes = [(3, 8), (8, 4), (4, 2)]
    layers: list[Any] = []
    for i, (n_in, n_out) in enumerate(sizes):
        w, b = rng.normal(0, 0.7, (n_out, n_in)), rng.normal(0, 0.2, (n_out,))
        layers.append(kit.linear(n_in, n_out, w, b))
        if i < len(sizes) - 1:
            layers.append(kit.relu_module())
    return kit.sequential(*layers)


def _arrays(kit: Kit, value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(kit, v)]
    return [None if value is None else kit.numpy(value)]


def _run(kit: Kit, model: Any, x_data: Any) -> dict[str, list[Any]]:
    log: dict[str, list[Any]] = defaultdict(list)

    def rec(key: str, *values: Any) -> None:
        log[key].append([a for v in values for a in _arrays(kit, v)])
        log["order"].append([key])  # (a list of one name: compared for equality below)

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
        x = kit.tensor(x_data, requires_grad=True)
        unihook.register_tensor_hook(x, lambda g: rec("tensor x", g))
        out = model(x)
        unihook.register_tensor_hook(out, lambda g: rec("tensor out", g))
        kit.backward((out * out).sum())
        log["output"].append([kit.numpy(out)])
        log["x.grad"].append([kit.grad(x)])
        log["param grads"].append([kit.grad(p) for p in kit.parameters(model)])
    finally:
        for h in handles:
            h.remove()
    return log


def _compare(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, float]:
    diffs: dict[str, float] = {}
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for key in a:
        assert len(a[key]) == len(b[key]), (key, len(a[key]), len(b[key]))
        worst = 0.0
        for ca, cb in zip(a[key], b[key]):
            assert len(ca) == len(cb), (key, len(ca), len(cb))
            for xa, xb in zip(ca, cb):
                assert (xa is None) == (xb is None), key
                if isinstance(xa, str):
                    assert xa == xb, (key, xa, xb)
                elif xa is not None:
                    worst = max(worst, float(np.max(np.abs(xa - xb), initial=0.0)))
        if key == "order":
            continue
        kind = key.split(" ")[0]
        diffs[kind] = max(diffs.get(kind, 0.0), worst)
        diffs[f"calls {kind}"] = diffs.get(f"calls {kind}", 0) + len(a[key])
    return diffs


def _grad_cam(kit: Kit) -> Any:
    """Grad-CAM and Grad-CAM++ maps of the CNN's layer4. The recipes call ``score.backward()``,
    which MindSpore lacks: the tape stands in for it while they run."""
    from unihook.recipes import GradCAM, GradCAMPlusPlus

    patched = kit.name == "mindspore"
    if patched:
        import mindspore

        from . import _tape

        mindspore.Tensor.backward = _tape.backward  # type: ignore[attr-defined]
    try:
        model = classifier(kit)
        return [recipe(model, "layer4")(images(kit)) for recipe in (GradCAM, GradCAMPlusPlus)]
    finally:
        if patched:
            del mindspore.Tensor.backward  # type: ignore[attr-defined]


def main() -> None:
    from unihook_torch.testkit import TorchKit

    from unihook_mindspore.testkit import MindSporeKit

    kits: list[Kit] = [TorchKit(), MindSporeKit()]
    rng = np.random.default_rng(3)
    cases = {
        "MLP": (_mlp, rng.normal(0, 1, (5, 3))),
        "CNN": (classifier, np.asarray(images(kits[0])).copy()),
    }
    for title, (build, x_data) in cases.items():
        logs = [_run(kit, build(kit), x_data) for kit in kits]
        print(f"{title}: torch vs mindspore, max |difference| (calls)")
        diffs = _compare(*logs)
        print(f"  hook order identical: {len(logs[0]['order'])} calls")
        for kind in sorted(k for k in diffs if not k.startswith("calls")):
            print(f"  {kind:12} {diffs[kind]:.3g} ({int(diffs['calls ' + kind])})")
    cams = [_grad_cam(kit) for kit in kits]
    for name, a, b in zip(("GradCAM", "GradCAM++"), *cams):
        print(f"{name} maps {a.shape}: max |difference| {float(np.max(np.abs(a - b))):.3g}")


if __name__ == "__main__":
    main()
