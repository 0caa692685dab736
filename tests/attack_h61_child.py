"""helper-61's attack on the recipes across torch, paddle and MindSpore: the programs
`tests/test_attack_h61.py` runs in child processes. `python attack_h61_child.py PART` prints one
JSON line (NaN allowed) with what PART measured; PART is "kits" (every installed framework
through its conformance kit, MindSpore imported first when installed) or "mindspore" (MindSpore
with its own autograd, `mindspore.value_and_grad` / `mindspore.grad`, beside torch as the
oracle)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from typing import Any

warnings.filterwarnings("ignore")

if importlib.util.find_spec("mindspore") is not None:
    import mindspore  # noqa: F401  (before paddle: the other order fails to load MindSpore)

import numpy as np  # noqa: E402

from unihook import ops  # noqa: E402


# -- generated small CNNs, the same weights in every framework ---------------------------------
def make_spec(rng: Any) -> dict[str, Any]:
    """A random architecture: conv / conv-BN-ReLU blocks, residual blocks (one ReLU called
    twice, in place on torch), a conv called twice, pools; then global average and a Linear."""
    blocks: list[dict[str, Any]] = []
    c, size = 3, 8
    for _ in range(int(rng.integers(1, 4))):
        kind = str(rng.choice(["conv", "convbn", "res", "pool", "twice"]))
        if kind == "pool" and size < 4:
            kind = "conv"
        if kind in ("conv", "convbn"):
            co = int(rng.integers(2, 6))
            blocks.append(dict(kind=kind, c_in=c, c_out=co, inplace=bool(rng.integers(2))))
            c = co
        elif kind == "res":
            blocks.append(dict(kind="res", c=c, inplace=bool(rng.integers(2))))
        elif kind == "twice":
            blocks.append(dict(kind="twice", c=c))
        else:
            blocks.append(dict(kind="pool", avg=bool(rng.integers(2))))
            size //= 2
    return dict(
        blocks=blocks, c=c, classes=int(rng.integers(2, 5)), seed=int(rng.integers(1 << 30))
    )


def build(kit: Any, spec: dict[str, Any], inplace_ok: bool = True) -> Any:
    rng = np.random.default_rng(spec["seed"])

    def conv(ci: int, co: int) -> Any:
        layer = kit.conv2d(ci, co, 3, padding=1)
        kit.set_value(layer.weight, rng.normal(0, 0.5, (co, ci, 3, 3)))
        kit.set_value(layer.bias, rng.normal(0, 0.1, (co,)))
        return layer

    def bn(c: int) -> Any:
        return kit.batchnorm2d(
            c,
            rng.normal(1, 0.2, c),
            rng.normal(0, 0.1, c),
            rng.normal(0, 0.1, c),
            rng.uniform(0.5, 1.5, c),
        )

    children: dict[str, Any] = {}
    for i, b in enumerate(spec["blocks"]):
        k = b["kind"]
        inplace = inplace_ok and b.get("inplace", False)
        if k == "conv":
            children[f"b{i}"] = kit.sequential(
                conv(b["c_in"], b["c_out"]), kit.relu_module(inplace)
            )
        elif k == "convbn":
            children[f"b{i}"] = kit.sequential(
                conv(b["c_in"], b["c_out"]), bn(b["c_out"]), kit.relu_module(inplace)
            )
        elif k == "res":
            c = b["c"]
            children[f"b{i}"] = kit.module(
                lambda self, x: self.relu(
                    self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + x
                ),
                {
                    "conv1": conv(c, c),
                    "bn1": bn(c),
                    "relu": kit.relu_module(inplace),
                    "conv2": conv(c, c),
                    "bn2": bn(c),
                },
            )
        elif k == "twice":
            children[f"b{i}"] = kit.module(
                lambda self, x: self.conv(self.conv(x)), {"conv": conv(b["c"], b["c"])}
            )
        else:
            children[f"b{i}"] = kit.avg_pool2d(2) if b["avg"] else kit.max_pool2d(2)
    classes = spec["classes"]
    children["fc"] = kit.linear(
        spec["c"], classes, rng.normal(0, 0.5, (classes, spec["c"])), rng.normal(0, 0.1, classes)
    )
    n = len(spec["blocks"])

    def forward(self: Any, x: Any) -> Any:
        for i in range(n):
            x = getattr(self, f"b{i}")(x)
        return self.fc(ops.mean(x, axis=(2, 3)))

    return kit.module(forward, children)


def four_d_names(spec: dict[str, Any]) -> list[str]:
    """The modules with NCHW outputs (GradCAM's possible target layers), from a torch twin."""
    import torch

    from unihook.testing import kits

    probe = build(kits(["torch"])[0], spec)
    dims: dict[str, int] = {}
    hooks = [
        m.register_forward_hook(lambda _m, _a, o, n=n: dims.__setitem__(n, o.dim()))
        for n, m in probe.named_modules()
        if n
    ]
    probe(torch.zeros(1, 3, 8, 8))
    for h in hooks:
        h.remove()
    return sorted(n for n, d in dims.items() if d == 4)


def first_kit_of(name: str) -> Any:
    from unihook.testing import kits

    return {k.name: k for k in kits()}[name]


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


# -- what the kits part measures ----------------------------------------------------------------
def kits_part() -> dict[str, Any]:
    import torch

    from unihook import capture, recipes
    from unihook.testing import kits

    K = {k.name: k for k in kits()}
    out: dict[str, Any] = {"frameworks": sorted(K)}

    # HELD: GradCAM / GradCAM++ maps on generated CNNs equal torch's (targets None, int, list,
    # callable; both conventions; call 0 / -1; several layers; train and eval)
    rng = np.random.default_rng(11)
    cam_worst: dict[str, float] = {n: 0.0 for n in K}
    cam_cases = 0
    while cam_cases < 6:
        spec = make_spec(rng)
        names = four_d_names(spec)
        n = int(rng.integers(2, 4))  # (batch 1 in train mode: BatchNorm over one sample,
        # ill-conditioned in float32 on every framework alike; not compared here)
        x = np.random.default_rng(cam_cases).normal(0, 1, (n, 3, 8, 8)).astype("float32")
        layers = list(
            rng.choice(names, size=min(len(names), int(rng.integers(1, 3))), replace=False)
        )
        if not layers or spec["blocks"][0]["kind"] == "pool":
            continue  # (a layer before any parameter: see the GradCAM finding)
        method = ["GradCAM", "GradCAMPlusPlus"][cam_cases % 2]
        target = [
            None,
            1,
            [int(v) for v in rng.integers(0, spec["classes"], n)],
            recipes.ClassifierOutputTarget(0),
        ][cam_cases % 4]
        convention = ["unihook", "pytorch-grad-cam"][(cam_cases // 2) % 2]
        call, train = [-1, 0][cam_cases % 2], bool(cam_cases % 3)
        maps = {}
        for name, kit in K.items():
            m = build(kit, spec)
            kit.set_training(m, train)
            cam = getattr(recipes, method)(m, layers, call=call, convention=convention)
            maps[name] = np.asarray(cam(kit.tensor(x), target=target))
            cam.remove()
        for name in K:
            cam_worst[name] = max(cam_worst[name], float(np.abs(maps[name] - maps["torch"]).max()))
        cam_cases += 1
    out["cam_worst"] = cam_worst

    # HELD: ActivationStats rows, GradientMonitor norms (every=1, 2) and capture(grads=True,
    # reuse) on generated CNNs: each framework against torch's native hooks on a copy without
    # in-place ops
    rng = np.random.default_rng(12)
    worst = {n: {"stats": 0.0, "norms": 0.0, "capture": 0.0, "grads": 0.0} for n in K}
    shape_errors: list[str] = []
    for case in range(4):
        spec = make_spec(rng)
        every = 1 + case % 2
        xs = [
            np.random.default_rng(10 * case + s)
            .normal(0, 1, (2 + s % 2, 3, 8, 8))
            .astype("float32")
            for s in range(3)
        ]
        om = build(K["torch"], spec, inplace_ok=False)
        want_out: list[dict[str, Any]] = []
        want_grad: list[dict[str, Any]] = []
        for x in xs:
            rec: dict[str, Any] = {}
            gr: dict[str, Any] = {}
            hs = [
                m.register_forward_hook(
                    lambda _m, _a, o, n=n: rec.setdefault(n, []).append(o.detach().clone())
                )
                for n, m in om.named_modules()
            ]
            hs += [
                m.register_full_backward_pre_hook(
                    lambda _m, go, n=n: gr.setdefault(n, []).append(go[0].detach().clone())
                )
                for n, m in om.named_modules()
            ]
            o = om(torch.tensor(x))
            (o * o).sum().backward()
            for h in hs:
                h.remove()
            want_out.append(rec)
            want_grad.append(gr)
        for name, kit in K.items():
            m = build(kit, spec)
            st = recipes.ActivationStats(m, every=every)
            gm = recipes.GradientMonitor(m, every=every)
            with capture(m, grads=True, reuse=bool(case % 2)) as cache:
                for s, x in enumerate(xs):
                    o = m(kit.tensor(x))
                    kit.backward((o * o).sum())
                    for k, calls in want_out[s].items():
                        got = kit.numpy(cache[k])
                        if got.shape != calls[-1].shape:
                            shape_errors.append(f"{name} {k} {got.shape}")
                            continue
                        d = float(np.abs(got - calls[-1].numpy()).max())
                        worst[name]["capture"] = max(worst[name]["capture"], d)
                    for k, calls in want_grad[s].items():
                        got = kit.numpy(cache.grads[k])
                        # the last backward hook call is the first call's (backward order)
                        ref = calls[-1].numpy()
                        d = float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))
                        worst[name]["grads"] = max(worst[name]["grads"], d)
            # the oracle's statistics over the recorded forwards
            recorded = [s for s in range(len(xs)) if s % every == 0]
            rows = {r["name"]: r for r in st.rows()}
            for k in want_out[0]:
                values = [
                    np.concatenate([c.numpy().ravel() for c in want_out[s][k]]) for s in recorded
                ]
                allv = np.concatenate(values).astype(np.float64)
                want = dict(
                    mean=allv.mean(),
                    std=allv.std(),
                    min=allv.min(),
                    max=allv.max(),
                    zeros=float((allv == 0).mean()),
                )
                for key, w in want.items():
                    d = abs(rows[k][key] - w) / max(1.0, abs(w))
                    worst[name]["stats"] = max(worst[name]["stats"], d)
            history = list(gm.history)
            assert len(history) == len(recorded), (name, len(history), len(recorded))
            for h, s in zip(history, recorded):
                for k, calls in want_grad[s].items():
                    w = math.sqrt(sum(float((c.double() ** 2).sum()) for c in calls))
                    d = abs(h[k] - w) / max(1.0, w)
                    worst[name]["norms"] = max(worst[name]["norms"], d)
            st.remove()
            gm.remove()
    out["recipes_worst"] = worst
    out["shape_errors"] = shape_errors

    # HELD: ActivationStats of edge values against numpy (finite values only; zeros over all)
    edge = {
        "f32": np.random.default_rng(0).normal(0, 1, (3, 5)).astype("float32"),
        "f64_1e5": (1e5 + np.random.default_rng(1).normal(0, 1e-3, (4, 50))).astype("float64"),
        "nan_inf": np.array([[1.0, np.nan, np.inf, -np.inf, 0.0, 2.0]], "float32"),
        "all_nan": np.full((2, 2), np.nan, "float32"),
        "const": np.full((2, 3), 3.5, "float32"),
        "tiny": np.random.default_rng(2).normal(0, 1e-30, (3, 5)).astype("float32"),
        "big": np.random.default_rng(3).normal(0, 1e30, (3, 5)).astype("float32"),
    }
    edge_out: dict[str, Any] = {}
    for case, a in edge.items():
        f = a.astype(np.float64).ravel()
        f = f[np.isfinite(f)]
        want = (
            dict(
                mean=f.mean(),
                std=f.std(),
                min=f.min(),
                max=f.max(),
                zeros=float((f == 0).sum() / a.size),
                nonfinite=a.size - f.size,
            )
            if f.size
            else dict(nonfinite=a.size)
        )
        for name, kit in K.items():
            m = kit.module(lambda self, x, v=a: x * 0 + kit.tensor(v, dtype=str(v.dtype)))
            st = recipes.ActivationStats(m)
            with kit.no_grad():
                m(kit.tensor(np.zeros(a.shape, a.dtype), dtype=str(a.dtype)))
            row = st.rows()[0]
            st.remove()
            bad = []
            for key, w in want.items():
                scale = abs(w) if case in ("tiny", "big") else max(1.0, abs(w))
                tol = (
                    1e-6 * edge["f64_1e5"].std()
                    if (case == "f64_1e5" and key == "mean")
                    else 1e-5 * scale
                )
                if key == "std" and case == "f64_1e5":
                    tol = 1e-6 * w
                if not abs(row[key] - w) <= tol:
                    bad.append((key, row[key], float(w)))
            edge_out[f"{name} {case}"] = bad
    out["edge"] = edge_out

    # HELD: removing every recipe restores the modules' hook dicts, with a native hook beside
    spec = make_spec(np.random.default_rng(5))
    restored = {}
    for name, kit in K.items():
        m = build(kit, spec)
        native = kit.native_hook(m, "forward", lambda _m, _a, _o: None)
        before = {n: kit.hook_counts(mod) for n, mod in kit.named_modules(m)}
        recs = [
            recipes.ActivationStats(m, every=2),
            recipes.GradientMonitor(m, every=3),
            recipes.GradCAM(m, four_d_names(spec)[:1]),
        ]
        for _ in range(3):
            o = m(kit.tensor(np.ones((2, 3, 8, 8))))
            kit.backward((o * o).sum())
        for r in recs:
            r.remove()
            r.remove()
        after = {n: kit.hook_counts(mod) for n, mod in kit.named_modules(m)}
        native()
        restored[name] = after == before
    out["restored"] = restored

    # FINDING (paddle): two forwards under one backward (a siamese loss m(a) * m(b)): the
    # history's entries come in the order the backward reaches them, not in forward order
    from unihook.testing import classifier

    a = np.random.default_rng(0).normal(0, 1, (2, 3, 8, 8)).astype("float32")
    b = a[::-1].copy() * 0.5
    siamese: dict[str, Any] = {}
    for name, kit in K.items():
        model = classifier(kit)
        gm = recipes.GradientMonitor(model)
        kit.backward((model(kit.tensor(a)) * model(kit.tensor(b))).sum())
        siamese[name] = [h[""] for h in gm.history]
        gm.remove()
    out["siamese"] = siamese

    # FINDING: a GuidedBackprop object clamps the ReLUs' gradients of every backward of the
    # model while it lives (its hooks are placed at construction), not only its own
    alive: dict[str, float] = {}
    for name, kit in K.items():
        model = classifier(kit)
        xs = kit.tensor(np.random.default_rng(1).normal(0, 1, (2, 3, 8, 8)))

        def train_grads(model: Any = model, kit: Any = kit, xs: Any = xs) -> dict[str, Any]:
            kit.clear_grads(model)
            o = model(xs)
            kit.backward((o * o).sum())
            return kit.parameter_grads(model)

        before = train_grads()
        gb = recipes.GuidedBackprop(model)
        gb(kit.tensor(a))  # a saliency map, e.g. for a figure during training
        after = train_grads()  # a later training step, the object still alive
        gb.remove()
        alive[name] = max(
            float(np.abs(np.asarray(after[k]) - np.asarray(before[k])).max()) for k in before
        )
    out["guided_alive"] = alive

    # FINDING: a module whose every output in a forward is empty (an MoE expert given no token,
    # an empty batch): rows() / history / report() raise ZeroDivisionError
    empty: dict[str, str] = {}
    for name, kit in K.items():
        m = kit.sequential(kit.linear(3, 2, np.ones((2, 3)), np.zeros(2)))
        st = recipes.ActivationStats(m)
        with kit.no_grad():
            m(kit.tensor(np.zeros((0, 3))))
        try:
            rows = st.rows()
            _ = st.history
            st.report()
            empty[name] = f"ok {[(r['name'], r['calls'], r['nonfinite']) for r in rows]}"
        except Exception as e:
            empty[name] = err(e)
        st.remove()
    out["empty"] = empty

    # FINDING: GradientMonitor of a module returning its input unchanged (an Identity used as a
    # disabled norm in a pre-norm residual) whose input is also read elsewhere: the norm of the
    # input's whole gradient, not of the module's grad_output (torch's full backward hook)
    rng = np.random.default_rng(0)
    W = [rng.normal(0, 1, (4, 3)), rng.normal(0, 1, (4, 4)), rng.normal(0, 1, (2, 4))]
    X = rng.normal(0, 1, (5, 3)).astype("float32")

    def residual(self: Any, x: Any) -> Any:
        h = self.fc1(x)
        return self.head(h + self.fc2(self.norm(h)))

    identity_norms: dict[str, Any] = {}
    for name, kit in K.items():
        m = kit.module(
            residual,
            {
                "fc1": kit.linear(3, 4, W[0], np.zeros(4)),
                "norm": kit.module(lambda self, h: h),
                "fc2": kit.linear(4, 4, W[1], np.zeros(4)),
                "head": kit.linear(4, 2, W[2], np.zeros(2)),
            },
        )
        gm = recipes.GradientMonitor(m)
        with warnings.catch_warnings():  # (its first call is left out, and said so: README)
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(2):
                o = m(kit.tensor(X))
                kit.backward((o * o).sum())
        identity_norms[name] = dict(gm.history[-1])
        gm.remove()
    tm = build_residual_torch(W)
    native: dict[str, float] = {}
    hs = [
        mod.register_full_backward_hook(
            lambda _m, _gi, go, n=n: native.__setitem__(n, float(go[0].double().norm()))
        )
        for n, mod in tm.named_modules()
    ]
    o = tm(torch.tensor(X))
    (o * o).sum().backward()
    for h in hs:
        h.remove()
    identity_norms["native"] = native
    out["identity"] = identity_norms

    # FINDING (same cause): a container returning its child's output after reading it for an
    # auxiliary loss: the container's norm includes the auxiliary gradient
    aux_norms: dict[str, Any] = {}
    for name, kit in K.items():
        held: list[Any] = []

        def block_forward(self: Any, x: Any, held: list[Any] = held) -> Any:
            y = self.fc(x)
            held.append((y * y).mean())
            return y

        block = kit.module(block_forward, {"fc": kit.linear(3, 4, W[0], np.zeros(4))})
        m = kit.module(
            lambda self, x: self.head(self.block(x)),
            {"block": block, "head": kit.linear(4, 2, W[2], np.zeros(2))},
        )
        gm = recipes.GradientMonitor(m)
        o = m(kit.tensor(X))
        kit.backward((o * o).sum() + held[-1] * 10.0)
        aux_norms[name] = dict(gm.history[-1])
        gm.remove()
    ta = build_aux_torch(W)
    native = {}
    hs = [
        mod.register_full_backward_hook(
            lambda _m, _gi, go, n=n: native.__setitem__(n, float(go[0].double().norm()))
        )
        for n, mod in ta.named_modules()
    ]
    o = ta(torch.tensor(X))
    ((o * o).sum() + ta.block.aux * 10.0).backward()
    for h in hs:
        h.remove()
    aux_norms["native"] = native
    out["aux"] = aux_norms

    # FINDING (torch): GradientMonitor on a model returning a tuple whose second output the loss
    # does not use, with a full backward hook on the model (torch's own, or unihook's, or a
    # capture(grads=True)): the tensor hook on that output gets None, NoBackendError
    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(3, 4)
            self.a = torch.nn.Linear(4, 2)
            self.b = torch.nn.Linear(4, 2)

        def forward(self, x: Any) -> Any:
            h = self.body(x)
            return self.a(h), self.b(h)

    tuple_out: dict[str, str] = {}
    for how in ["none", "native", "unihook"]:
        torch.manual_seed(0)
        m = Heads()
        gm = recipes.GradientMonitor(m)
        handle: Any = None
        if how == "native":
            handle = m.register_full_backward_hook(lambda _m, _gi, _go: None)
        elif how == "unihook":
            import unihook

            handle = unihook.register_full_backward_hook(m, lambda _m, _gi, _go: None)
        try:
            oa, _ = m(torch.ones(5, 3))
            (oa * oa).sum().backward()
            tuple_out[how] = f"ok {sorted(gm.history[-1])}"
        except Exception as e:
            tuple_out[how] = err(e)
        gm.remove()
        if handle is not None:
            handle.remove()
    out["tuple_unused"] = tuple_out

    # FINDING (paddle): capture(grads=True) of a whole model whose second head the loss does not
    # use: the body, called once per head, gets the unused call's zeros as its grad_output
    if "paddle" in K:
        W2 = [rng.normal(0, 1, (4, 3)), rng.normal(0, 1, (2, 4)), rng.normal(0, 1, (2, 4))]
        unused: dict[str, Any] = {}
        for name in ("torch", "paddle"):
            kit = K[name]
            m = kit.module(
                lambda self, x: (self.a(self.body(x)), self.b(self.body(x))),
                {
                    "body": kit.linear(3, 4, W2[0], np.zeros(4)),
                    "a": kit.linear(4, 2, W2[1], np.zeros(2)),
                    "b": kit.linear(4, 2, W2[2], np.zeros(2)),
                },
            )
            with capture(m, grads=True) as cache:
                oa, _ = m(kit.tensor(X))
                kit.backward((oa * oa).sum())
                unused[name] = {
                    k: (
                        None
                        if cache.grads.get(k) is None
                        else float(np.linalg.norm(kit.numpy(cache.grads[k])))
                    )
                    for k in ("body", "a", "b")
                }
        out["unused_branch"] = unused
    return out


def build_aux_torch(W: list[Any]) -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 4)

        def forward(self, x: Any) -> Any:
            y = self.fc(x)
            self.aux = (y * y).mean()
            return y

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.head = torch.nn.Linear(4, 2)
            with torch.no_grad():
                for layer, w in zip([self.block.fc, self.head], [W[0], W[2]]):
                    layer.weight.copy_(torch.tensor(w))
                    layer.bias.zero_()

        def forward(self, x: Any) -> Any:
            return self.head(self.block(x))

    return Net()


def build_residual_torch(W: list[Any]) -> Any:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(3, 4)
            self.norm = torch.nn.Identity()
            self.fc2 = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 2)
            with torch.no_grad():
                for layer, w in zip([self.fc1, self.fc2, self.head], W):
                    layer.weight.copy_(torch.tensor(w))
                    layer.bias.zero_()

        def forward(self, x: Any) -> Any:
            h = self.fc1(x)
            return self.head(h + self.fc2(self.norm(h)))

    return Net()


# -- what the mindspore part measures -----------------------------------------------------------
def mindspore_part() -> dict[str, Any]:
    import mindspore as ms
    import torch
    from mindspore import Tensor, nn

    from unihook import recipes
    from unihook.testing import kits

    ms.set_context(mode=ms.PYNATIVE_MODE)
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    W = rng.normal(0, 1, (4, 3)).astype("float32")
    B = rng.normal(0, 1, 4).astype("float32")
    X = rng.normal(0, 1, (5, 3)).astype("float32")

    # FINDING: a container changing its child's output in place where MindSpore's version counter
    # does not move (`y[:, 0] = 5.0`, setitem; also `ops.assign`) then returning it: the
    # container's ActivationStats row and GradientMonitor norm are the child's
    class MBlock(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(3, 4)
            self.fc.weight.set_data(Tensor(W))
            self.fc.bias.set_data(Tensor(B))

        def construct(self, x: Any) -> Any:
            y = self.fc(x)
            y[:, 0] = 5.0
            return y

    m = MBlock()
    m.set_train(True)
    st = recipes.ActivationStats(m)
    with ms._no_grad():
        y = m(Tensor(X)).asnumpy()
    rows = {r["name"]: r for r in st.rows()}
    st.remove()
    out["setitem_stats"] = {
        "row": {k: rows[""][k] for k in ("mean", "min", "max")},
        "numpy": {
            "mean": float(y.astype(np.float64).mean()),
            "min": float(y.min()),
            "max": float(y.max()),
        },
    }
    gm = recipes.GradientMonitor(m)

    def loss(x: Any) -> Any:
        o = m(x)
        return (o * o).sum()

    ms.value_and_grad(loss, None, m.trainable_params())(Tensor(X))
    got = dict(gm.history[-1])
    gm.remove()
    # the loss (o * o).sum(): the container's grad_output is 2 y, the Dense's 2 y with the
    # overwritten column zeroed
    want = {
        "": float(np.linalg.norm(2.0 * y.astype(np.float64))),
        "fc": float(np.linalg.norm(2.0 * y[:, 1:].astype(np.float64))),
    }
    out["setitem_norms"] = {"mindspore": got, "want": want}

    # FINDING: complex outputs and gradients on MindSpore: the imaginary parts are dropped
    # (README: "A complex output counts its real and imaginary parts as values"; "Complex
    # gradients count |z|^2")
    class MC(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(3, 4, has_bias=False)
            self.fc.weight.set_data(Tensor(W))

        def construct(self, x: Any) -> Any:
            h = self.fc(x)
            return ms.ops.Complex()(h, h * 2)

    class TC(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 4, bias=False)
            with torch.no_grad():
                self.fc.weight.copy_(torch.tensor(W))

        def forward(self, x: Any) -> Any:
            h = self.fc(x)
            return torch.complex(h, h * 2)

    mc = MC()
    st = recipes.ActivationStats(mc)
    with ms._no_grad():
        z = mc(Tensor(X)).asnumpy()
    row = st.rows()[0]
    st.remove()
    parts = np.concatenate([z.real.ravel(), z.imag.ravel()]).astype(np.float64)
    out["complex_stats"] = {
        "row": {k: row[k] for k in ("mean", "std", "max")},
        "numpy": {"mean": parts.mean(), "std": parts.std(), "max": parts.max()},
    }
    gm = recipes.GradientMonitor(mc)

    def closs(x: Any) -> Any:
        zz = mc(x)
        return (ms.ops.real(zz) ** 2 + ms.ops.imag(zz) ** 2).sum()

    ms.grad(closs, None, mc.trainable_params())(Tensor(X))
    ms_norm = gm.history[-1][""]
    gm.remove()
    tc = TC()
    gmt = recipes.GradientMonitor(tc)
    zt = tc(torch.tensor(X))
    (zt.real**2 + zt.imag**2).sum().backward()
    out["complex_norms"] = {"mindspore": ms_norm, "torch": gmt.history[-1][""]}
    gmt.remove()

    # FINDING: summary of a Cell: NotImplementedError (the backend has no own_parameters)
    kit_ms = {k.name: k for k in kits(["mindspore", "torch"])}
    spec = dict(
        blocks=[
            dict(kind="convbn", c_in=3, c_out=4, inplace=False),
            dict(kind="res", c=4, inplace=False),
        ],
        c=4,
        classes=3,
        seed=5,
    )
    tables: dict[str, Any] = {}
    for name, kit in kit_ms.items():
        model = build(kit, spec)
        try:
            with kit.no_grad():
                s = recipes.summary(model, kit.tensor(np.zeros((2, 3, 8, 8))))
            tables[name] = [
                [r.name, r.call, r.output_shapes, r.params, r.trainable] for r in s.rows
            ] + [s.total_params, s.trainable_params]
        except Exception as e:
            tables[name] = err(e)
    out["summary"] = tables

    # FINDING (wrong error): copy_weights / compare with a MindSpore model: AttributeError
    try:
        recipes.copy_weights(build(kit_ms["torch"], spec), build(kit_ms["mindspore"], spec))
        out["copy_weights"] = "ok"
    except Exception as e:
        out["copy_weights"] = err(e)

    # FIXED (error vs map): GradCAM of a layer before any parameter (a pool on the input):
    # torch and paddle raised "no gradient reached"; MindSpore, which differentiates the input,
    # returned a map. GradCAM differentiates a floating input too now (captum's way)
    pool_spec = dict(
        blocks=[dict(kind="pool", avg=True), dict(kind="conv", c_in=3, c_out=4, inplace=False)],
        c=4,
        classes=3,
        seed=7,
    )
    kit_ms["mindspore"].native_autograd()  # (MindSpore's own autograd from here on)
    cams: dict[str, Any] = {}
    image = np.random.default_rng(3).normal(0, 1, (2, 3, 8, 8))
    for name, kit in kit_ms.items():
        model = build(kit, pool_spec)
        cam = recipes.GradCAM(model, "b0")
        try:
            cams[name] = np.asarray(cam(kit.tensor(image)), np.float64).tolist()
        except Exception as e:
            cams[name] = err(e)
        cam.remove()
    out["cam_before_parameters"] = cams

    # FINDING: GradientMonitor(every=N) counts MindSpore's evaluations (a forward under
    # `mindspore._no_grad()`, or outside any grad session) as logged steps: MindSporeOps has no
    # grad_enabled (True by default). torch and paddle count the forwards with gradients only.
    from unihook.testing import classifier

    def alternate(kit: Any, name: str) -> tuple[list[Any], list[Any]]:
        model = classifier(kit)
        every_step = recipes.GradientMonitor(model)
        monitor = recipes.GradientMonitor(model, every=2)
        for s in range(5):
            x = kit.tensor(np.random.default_rng(s).normal(0, 1, (2, 3, 8, 8)))
            with kit.no_grad():
                model(x)  # an evaluation
            if name == "mindspore":

                def f(xx: Any, model: Any = model) -> Any:
                    return model(xx).sum()

                ms.value_and_grad(f, None, model.trainable_params())(x)
            else:
                kit.backward(model(x).sum())
        every_step.remove()
        monitor.remove()
        return [h[""] for h in every_step.history], [h[""] for h in monitor.history]

    out["every_with_evaluations"] = {name: alternate(kit, name) for name, kit in kit_ms.items()}

    # FINDING: MindSpore's activation recomputation (`Cell.recompute()`, PyNative): the cells
    # inside are counted twice by ActivationStats (the recomputation in backward is taken for a
    # forward) and get no GradientMonitor norm; torch's checkpoint (both kinds) is documented
    # and tested to record each forward once and to log the recomputed cells' gradients
    rng = np.random.default_rng(3)
    Wr = [rng.normal(0, 1, (4, 3)), rng.normal(0, 1, (4, 4)), rng.normal(0, 1, (2, 4))]

    class MR(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Dense(3, 4)
            self.b = nn.SequentialCell(nn.Dense(4, 4), nn.ReLU())
            self.c = nn.Dense(4, 2)
            for layer, w in zip([self.a, self.b[0], self.c], Wr):
                layer.weight.set_data(Tensor(w.astype("float32")))
                layer.bias.set_data(Tensor(np.zeros(w.shape[0], "float32")))
            self.b.recompute()

        def construct(self, x: Any) -> Any:
            return self.c(self.b(self.a(x)))

    class TR(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 4)
            self.b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
            self.c = torch.nn.Linear(4, 2)
            with torch.no_grad():
                for layer, w in zip([self.a, self.b[0], self.c], Wr):
                    layer.weight.copy_(torch.tensor(w))
                    layer.bias.zero_()

        def forward(self, x: Any) -> Any:
            from torch.utils.checkpoint import checkpoint

            return self.c(checkpoint(self.b, self.a(x), use_reentrant=False))

    xr = np.random.default_rng(4).normal(0, 1, (5, 3)).astype("float32")
    mr = MR()
    mr.set_train(True)
    st, gm = recipes.ActivationStats(mr), recipes.GradientMonitor(mr)
    ms.value_and_grad(lambda x: (mr(x) ** 2).sum(), None, mr.trainable_params())(Tensor(xr))
    recomputed = {"mindspore": ({r["name"]: r["calls"] for r in st.rows()}, dict(gm.history[-1]))}
    st.remove()
    gm.remove()
    tr = TR()
    st, gm = recipes.ActivationStats(tr), recipes.GradientMonitor(tr)
    (tr(torch.tensor(xr)) ** 2).sum().backward()
    recomputed["torch"] = ({r["name"]: r["calls"] for r in st.rows()}, dict(gm.history[-1]))
    st.remove()
    gm.remove()
    out["recompute"] = recomputed

    # FINDING: GradientMonitor of a cell returning its own Parameter (a positional table):
    # MindSporeOps has no is_leaf, so the tensor hook put on the Parameter is never removed and
    # adds every later backward's gradient to the earlier steps' entries
    P0 = np.arange(6, dtype=np.float32).reshape(2, 3) / 10

    class Pos(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.table = ms.Parameter(Tensor(P0), name="table")

        def construct(self) -> Any:
            return self.table

    class MP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.pos = Pos()
            self.fc = nn.Dense(3, 3)

        def construct(self, x: Any) -> Any:
            return self.fc(x + self.pos())

    class TPos(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.tensor(P0))

        def forward(self) -> Any:
            return self.table

    class TP(torch.nn.Module):
        def __init__(self, w: Any, b: Any) -> None:
            super().__init__()
            self.pos = TPos()
            self.fc = torch.nn.Linear(3, 3)
            with torch.no_grad():
                self.fc.weight.copy_(torch.tensor(w))
                self.fc.bias.copy_(torch.tensor(b))

        def forward(self, x: Any) -> Any:
            return self.fc(x + self.pos())

    mp = MP()
    tp = TP(mp.fc.weight.asnumpy(), mp.fc.bias.asnumpy())
    gm_ms, gm_t = recipes.GradientMonitor(mp), recipes.GradientMonitor(tp)
    for step in range(3):
        xp = np.random.default_rng(step).normal(0, 1, (2, 3)).astype("float32") * (step + 1)
        ms.value_and_grad(lambda xx: (mp(xx) ** 2).sum(), None, mp.trainable_params())(Tensor(xp))
        (tp(torch.tensor(xp)) ** 2).sum().backward()
    out["parameter_output"] = {
        "mindspore": [h["pos"] for h in gm_ms.history],
        "torch": [h["pos"] for h in gm_t.history],
    }
    gm_ms.remove()
    gm_t.remove()

    # HELD: with MindSpore's own autograd (value_and_grad over the weights), ActivationStats,
    # GradientMonitor and GradCAM on generated CNNs give torch's numbers
    grng = np.random.default_rng(21)
    worst = {"stats": 0.0, "norms": 0.0, "cam": 0.0}
    for case in range(4):
        spec = make_spec(grng)
        x = np.random.default_rng(case).normal(0, 1, (3, 3, 8, 8)).astype("float32")
        res: dict[str, Any] = {}
        for name, kit in kit_ms.items():
            model = build(kit, spec)
            st = recipes.ActivationStats(model)
            gm = recipes.GradientMonitor(model)
            if name == "mindspore":

                def f(xx: Any, model: Any = model) -> Any:
                    o = model(xx)
                    return (o * o).sum()

                ms.value_and_grad(f, None, model.trainable_params())(kit.tensor(x))
            else:
                o = model(kit.tensor(x))
                kit.backward((o * o).sum())
            rows = {r["name"]: r for r in st.rows()}
            norms = dict(gm.history[-1])
            st.remove()
            gm.remove()
            layers = [n for n in four_d_names(spec) if spec["blocks"][0]["kind"] != "pool"][:2]
            cam_map = None
            if layers:
                cam = (
                    recipes.GradCAMPlusPlus(model, layers)
                    if case % 2
                    else recipes.GradCAM(model, layers)
                )
                cam_map = np.asarray(cam(kit.tensor(x), target=[0, 1, 0]))
                cam.remove()
            res[name] = (rows, norms, cam_map)
        (rm, nm, cm), (rt, nt, ct) = res["mindspore"], res["torch"]
        assert sorted(rm) == sorted(rt) and sorted(nm) == sorted(nt), (
            sorted(rm),
            sorted(rt),
            sorted(nm),
            sorted(nt),
        )
        for k in rt:
            for key in ("mean", "std", "min", "max", "zeros"):
                worst["stats"] = max(
                    worst["stats"], abs(rm[k][key] - rt[k][key]) / max(1.0, abs(rt[k][key]))
                )
        for k in nt:
            worst["norms"] = max(worst["norms"], abs(nm[k] - nt[k]) / max(1.0, nt[k]))
        if ct is not None:
            worst["cam"] = max(worst["cam"], float(np.abs(cm - ct).max()))
    out["native_worst"] = worst
    return out


if __name__ == "__main__":
    part = sys.argv[1]
    result = kits_part() if part == "kits" else mindspore_part()
    print(json.dumps(result, default=float))
