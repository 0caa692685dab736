"""paddle against torch on generated models (helper-203's generator): nested layers of one
to three outputs, ops between them (concat, stack, split, slices, a ReLU dead everywhere, a
multiply by 0), outputs the loss leaves out, layers returning an input as it is or called
twice, and random module backward hooks (global full and pre-hooks, full and pre-hooks on
random layers, hooks returning None). What each hook sees (None, zeros, values), each
parameter's .grad and x's, and a plain backward after the hooks are removed, against torch
with unihook's hooks (torch's own). Seeds 0-799, the differences README documents left out:
164 models differed on c802303, 4 (the known ones below) on b9419eb and 3b72a18.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from test_paddle_unused_outputs_vs_torch import _Paddle, _Torch  # noqa: E402

import unihook  # noqa: E402
from unihook.errors import BackendStateError  # noqa: E402

OPS1 = ["mul", "relu", "dead", "sqrt", "roll"]
OPS2 = ["add", "catsplit", "catslice", "stacksum", "stackidx"]


# ---------------------------------------------------------------- spec generation
def gen_module(rng, depth, n_in, n_out, ctr):
    """A spec: ("lin", seed) for a Linear (n_in == n_out == 1), or a composite."""
    if n_in == 1 and n_out == 1 and (depth == 0 or rng.rand() < 0.3) and depth < 3:
        ctr[0] += 1
        return {"t": "lin", "seed": ctr[0]}
    nch = rng.randint(1, 4)
    children = []
    for _ in range(nch):
        if depth >= 2:
            ci = 1 if rng.rand() < 0.8 else 2
            co = int(rng.choice([1, 1, 2, 2, 3]))
            children.append(gen_module(rng, depth - 1, ci, co, ctr))
        else:
            ctr[0] += 1
            children.append({"t": "lin", "seed": ctr[0]})
    nvals = n_in
    prog = []
    calls = list(range(nch))
    # make sure every child is called; some twice
    extra = [c for c in range(nch) if rng.rand() < 0.2]
    sched = calls + extra
    rng.shuffle(sched)

    def pick():
        # bias toward recent values
        if nvals == 1 or rng.rand() < 0.5:
            return nvals - 1 - int(min(rng.geometric(0.5) - 1, nvals - 1))
        return int(rng.randint(nvals))

    for c in sched:
        # some ops before the call
        for _ in range(rng.randint(0, 3)):
            if rng.rand() < 0.5:
                op = str(rng.choice(OPS1))
                a = pick()
                arg = float(rng.choice([0.0, 2.0, -1.0, 0.5])) if op == "mul" else None
                prog.append(("op", op, [a], arg))
                nvals += 1
            else:
                op = str(rng.choice(OPS2))
                a, b = pick(), pick()
                prog.append(("op", op, [a, b], None))
                nvals += 2 if op == "catsplit" else 1
        ci = children[c]["n_in"] if children[c]["t"] != "lin" else 1
        co = children[c]["n_out"] if children[c]["t"] != "lin" else 1
        args = [pick() for _ in range(ci)]
        prog.append(("call", c, args, None))
        nvals += co
    for _ in range(rng.randint(0, 3)):
        op = str(rng.choice(OPS1 + OPS2))
        if op in OPS1:
            arg = float(rng.choice([0.0, 2.0, -1.0, 0.5])) if op == "mul" else None
            prog.append(("op", op, [pick()], arg))
            nvals += 1
        else:
            prog.append(("op", op, [pick(), pick()], None))
            nvals += 2 if op == "catsplit" else 1
    outs = []
    for _ in range(n_out):
        if rng.rand() < 0.08:
            outs.append(int(rng.randint(n_in)))  # an input unchanged
        else:
            outs.append(pick())
    return {
        "t": "comp",
        "n_in": n_in,
        "n_out": n_out,
        "children": children,
        "prog": prog,
        "outs": outs,
    }


def gen_leafcomp(rng, n_in, n_out, ctr):
    return gen_module(rng, 1, n_in, n_out, ctr)


def gen_model(seed):
    rng = np.random.RandomState(seed)
    ctr = [0]
    depth = int(rng.randint(1, 4))
    spec = gen_module(rng, depth, 1, int(rng.randint(1, 4)), ctr)
    n_out = spec["n_out"] if spec["t"] == "comp" else 1
    used = [i for i in range(n_out) if rng.rand() < 0.5]
    if not used:
        used = [int(rng.randint(n_out))]
    # hooks
    hooks = {
        "gfull": rng.rand() < 0.5,
        "gpre": rng.rand() < 0.3,
        "gpre_none": rng.rand() < 0.3,
        "per": [],  # (module index among named modules, kind) decided after build
        "per_seed": int(rng.randint(1 << 30)),
        "retain": rng.rand() < 0.25,
    }
    return {"spec": spec, "used": used, "hooks": hooks}


# ---------------------------------------------------------------- frameworks
class FT:
    name = "torch"
    Module = torch.nn.Module

    linear = _Torch.linear  # (the same weights in both)

    @staticmethod
    def op(op, xs, arg):
        a = xs[0]
        if op == "mul":
            return [a * arg]
        if op == "relu":
            return [torch.relu(a)]
        if op == "dead":
            return [torch.relu(a - 100.0)]
        if op == "sqrt":
            return [torch.sqrt(torch.abs(a) + 1.0)]
        if op == "roll":
            p, q = torch.split(a, [1, 2], 1)
            return [torch.cat([q, p], 1)]
        b = xs[1]
        if op == "add":
            return [a + b]
        if op == "catsplit":
            return list(torch.chunk(torch.cat([a, b], 1), 2, 1))
        if op == "catslice":
            return [torch.cat([a, b], 1)[:, :3]]
        if op == "stacksum":
            return [torch.stack([a, b], 0).sum(0)]
        if op == "stackidx":
            return [torch.stack([a, b], 0)[1]]
        raise ValueError(op)

    named = staticmethod(lambda m: list(m.named_modules()))
    x = staticmethod(lambda: torch.tensor([[1.0, -2.0, 0.5]], requires_grad=True))

    @staticmethod
    def clear(model):
        for p in model.parameters():
            p.grad = None


class FP:
    name = "paddle"
    Module = paddle.nn.Layer

    linear = _Paddle.linear

    @staticmethod
    def op(op, xs, arg):
        F = paddle.nn.functional
        a = xs[0]
        if op == "mul":
            return [a * arg]
        if op == "relu":
            return [F.relu(a)]
        if op == "dead":
            return [F.relu(a - 100.0)]
        if op == "sqrt":
            return [paddle.sqrt(paddle.abs(a) + 1.0)]
        if op == "roll":
            p, q = paddle.split(a, [1, 2], 1)
            return [paddle.concat([q, p], 1)]
        b = xs[1]
        if op == "add":
            return [a + b]
        if op == "catsplit":
            return list(paddle.chunk(paddle.concat([a, b], 1), 2, 1))
        if op == "catslice":
            return [paddle.concat([a, b], 1)[:, :3]]
        if op == "stacksum":
            return [paddle.stack([a, b], 0).sum(0)]
        if op == "stackidx":
            return [paddle.stack([a, b], 0)[1]]
        raise ValueError(op)

    named = staticmethod(lambda m: list(m.named_sublayers(include_self=True)))
    x = staticmethod(lambda: paddle.to_tensor([[1.0, -2.0, 0.5]], stop_gradient=False))

    @staticmethod
    def clear(model):
        for p in model.parameters():
            p.clear_gradient(False)


def build(fw, spec):
    if spec["t"] == "lin":
        return fw.linear(spec["seed"])

    class Comp(fw.Module):
        def __init__(self):
            super().__init__()
            self.kids = []
            for i, c in enumerate(spec["children"]):
                m = build(fw, c)
                setattr(self, f"c{i}", m)
                self.kids.append(f"c{i}")

        def forward(self, *xs):
            vals = list(xs)
            for kind, what, args, arg in spec["prog"]:
                ins = [vals[i] for i in args]
                if kind == "op":
                    vals.extend(fw.op(what, ins, arg))
                else:
                    r = getattr(self, self.kids[what])(*ins)
                    vals.extend(list(r) if isinstance(r, (tuple, list)) else [r])
            outs = [vals[i] for i in spec["outs"]]
            return outs[0] if len(outs) == 1 else tuple(outs)

    return Comp()


def kind(g):
    if g is None:
        return None
    a = g.detach().numpy() if isinstance(g, torch.Tensor) else g.numpy()
    a = a.astype(np.float64)
    if np.isnan(a).any():
        return "NaN"
    if not a.any():
        return "Z"
    return float(np.abs(a).sum())


PARAMETERS = "parameters"  # (`by_grad`: w.r.t. the parameters alone, x left out)


def run(fw, model_spec, retain=False, by_grad=False):
    spec, used, hk = model_spec["spec"], model_spec["used"], model_spec["hooks"]
    model = build(fw, spec)
    named = fw.named(model)
    names = {id(m): n or "<top>" for n, m in named}
    seen = []
    handles = []
    prng = np.random.RandomState(hk["per_seed"])

    def logf(tag):
        def f(m, gi, go):
            seen.append((names[id(m)], tag, [kind(g) for g in go], [kind(g) for g in gi]))

        return f

    def logp(tag, none):
        def f(m, go):
            seen.append((names[id(m)], tag, [kind(g) for g in go], []))
            if none:
                return tuple(None for _ in go)

        return f

    def fullnone(tag):
        def f(m, gi, go):
            seen.append((names[id(m)], tag, [kind(g) for g in go], [kind(g) for g in gi]))
            return tuple(None for _ in gi)

        return f

    if hk["gfull"]:
        handles.append(unihook.register_module_full_backward_hook(logf("G"), backend=fw.name))
    if hk["gpre"]:
        handles.append(
            unihook.register_module_full_backward_pre_hook(
                logp("GP", hk["gpre_none"]), backend=fw.name
            )
        )
    explicit = hk.get("explicit")
    assigned = []
    for n, m in named:
        r = prng.rand()
        if explicit is not None:
            r = {"F": 0.1, "FN": 0.2, "P": 0.25, "PN": 0.35}.get(explicit.get(n or "<top>"), 0.9)
        if r < 0.15:
            handles.append(unihook.register_full_backward_hook(m, logf("F")))
            assigned.append((m, "F"))
        elif r < 0.22:
            handles.append(unihook.register_full_backward_hook(m, fullnone("FN")))
            assigned.append((m, "FN"))
        elif r < 0.30:
            handles.append(unihook.register_full_backward_pre_hook(m, logp("P", False)))
            assigned.append((m, "P"))
        elif r < 0.38:
            handles.append(unihook.register_full_backward_pre_hook(m, logp("PN", True)))
            assigned.append((m, "PN"))
    res = {"assigned": {names[id(m)]: t for (m, t) in assigned}}
    x = fw.x()
    try:
        out = model(x)
        outs = list(out) if isinstance(out, tuple) else [out]
        loss = None
        for i in used:
            s = outs[i].sum()
            loss = s if loss is None else loss + s
        if by_grad:  # (x's and the parameters' gradients by paddle.grad / torch.autograd.grad)
            params = dict(model.named_parameters())
            grad = torch.autograd.grad if fw is FT else paddle.grad
            inputs = list(params.values()) if by_grad == PARAMETERS else [x, *params.values()]
            got = grad([loss], inputs, allow_unused=True)
        elif retain:
            loss.backward(retain_graph=True)
            try:
                loss.backward()
                res["second"] = "ok"
            except BackendStateError:
                res["second"] = "BSE"
        else:
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    res["hooks"] = seen
    if by_grad:
        grads = dict(zip(list(params) if by_grad == PARAMETERS else ["x", *params], map(kind, got)))
    else:
        grads = {n: kind(p.grad) for n, p in model.named_parameters()}
        grads["x"] = kind(x.grad)
    res["grads"] = grads
    # after removal: plain backward again
    fw.clear(model)
    x2 = fw.x()
    out = model(x2)
    outs = list(out) if isinstance(out, tuple) else [out]
    loss = None
    for i in used:
        s = outs[i].sum()
        loss = s if loss is None else loss + s
    loss.backward()
    g2 = {n: kind(p.grad) for n, p in model.named_parameters()}
    g2["x"] = kind(x2.grad)
    res["after"] = g2
    return res


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=2e-3, abs_tol=1e-4)
    return bool(a == b)


def _hook_key(h: Any) -> Any:
    def sk(v: Any) -> Any:
        return ("v", round(v, 2)) if isinstance(v, float) else (str(v), 0)

    return (h[0], h[1], [sk(v) for v in h[2]], [sk(v) for v in h[3]])


def _differences(t: Any, p: Any, documented: bool) -> list[str]:
    """What differs; `documented`: a full hook returned None for an input, below which a leaf
    unihook cannot map (x, a parameter of a layer with no backward hook) gets zeros where
    torch leaves None (README)."""
    diffs = []
    th, ph = sorted(t["hooks"], key=_hook_key), sorted(p["hooks"], key=_hook_key)
    if len(th) != len(ph) or not all(
        a[:2] == b[:2]
        and len(a[2]) == len(b[2])
        and all(map(_close, a[2], b[2]))
        and len(a[3]) == len(b[3])
        and all(map(_close, a[3], b[3]))
        for a, b in zip(th, ph)
    ):
        diffs.append("hooks")
    for section in ("grads", "after"):
        for name, want in t[section].items():
            got = p[section].get(name, "missing")
            # (documented: the input's zeros below a full hook's None, where torch has None;
            # the parameters' are listed in `_KNOWN`)
            if _close(want, got) or (documented and want is None and got == "Z" and name == "x"):
                continue
            diffs.append(f"{section}:{name}")
    return diffs


def _mismatches(seeds: range, by_grad: bool | str = False) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for seed in seeds:
        spec = gen_model(seed)
        retain = spec["hooks"]["retain"] and not by_grad
        t = run(FT, spec, retain, by_grad)
        p = run(FP, spec, retain, by_grad)
        diffs = _differences(t, p, "FN" in p["assigned"].values())
        if retain and p.get("second") == "BSE":  # (documented: one backward per forward)
            diffs = [d for d in diffs if d.startswith("after")]
        if diffs:
            found[seed] = diffs
    return found


# known: a layer returning one tensor several times, one of them reached by exact zeros
# through an op, another unused: paddle's hook sees None for it where torch's sees zeros
# (helper-203's FINDING 2, open); the layers before a full hook's None, with no hook of their
# own, get zeros where torch's .grad is None (open: see `_none_again`)
_KNOWN = {
    274: ["hooks"],
    569: ["hooks"],
    575: ["hooks"],
    642: ["hooks"],
    309: [f"grads:c1.c{i}.{p}" for i in range(3) for p in ("weight", "bias")],
}


@pytest.mark.parametrize("start", range(0, 800, 200))
def test_generated_models_as_torch(start: int) -> None:
    seeds = range(start, start + 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = _mismatches(seeds)
    assert found == {s: d for s, d in _KNOWN.items() if s in seeds}


# by paddle.grad, besides: a hook of a layer of several outputs, one of which only an unused
# output reaches through an op (of `TELLING`), sees zeros where torch's sees None: paddle.grad
# runs copies of the nodes, which take no post hook to tell them (open); the gradients are
# torch's. On 81ad128, 272 of 800 differed: hooks seeing zeros in 260, gradients in 96 (the
# parameters of a layer only an unused output reaches: zeros, torch's None).
# In two, besides, a layer before a full hook's None gets zeros as paddle.grad's result for
# its parameters, torch's None (open, as under Tensor.backward: seed 309 in `_KNOWN`).
_KNOWN_BY_GRAD = {
    **dict.fromkeys(
        (70, 73, 108, 193, 232, 274, 410, 451, 465, 475, 481, 569, 575, 592, 623, 799),
        ["hooks"],
    ),
    697: ["hooks", "grads:c1.c0.weight", "grads:c1.c0.bias"],
    743: ["hooks", "grads:c0.c2.c1.weight", "grads:c0.c2.c1.bias"],
}


# by paddle.grad w.r.t. the parameters alone: torch runs no node from which none of them is
# reached, a module's input side taking the model's input (its full hook does not fire); until
# 2026-12-07 paddle's did (50 of seeds 0-299: helper-207's FINDING 6). Left: the hooks of
# `_KNOWN_BY_GRAD`'s kind.
_KNOWN_BY_PARAMETERS = dict.fromkeys((70, 108, 193, 232, 274), ["hooks"])


@pytest.mark.parametrize(
    ("by_grad", "start"),
    [("all", start) for start in range(0, 800, 200)]
    + [(PARAMETERS, start) for start in range(0, 400, 200)],
)
def test_generated_models_by_paddle_grad_as_torch(by_grad: str, start: int) -> None:
    """paddle.grad w.r.t. x and the parameters ("all"), or the parameters alone."""
    known = _KNOWN_BY_PARAMETERS if by_grad == PARAMETERS else _KNOWN_BY_GRAD
    seeds = range(start, start + 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = _mismatches(seeds, by_grad=by_grad)
    assert found == {s: d for s, d in known.items() if s in seeds}
