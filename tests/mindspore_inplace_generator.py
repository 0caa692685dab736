"""Generated programs: small MindSpore cells x in-place ops after them x output shapes (fresh,
views and reshape chains of the input or of a computed tensor, the input itself, the same
tensor twice, tuple outputs, an output the cell keeps and the caller reads later), each run
with module backward hooks (full, pre, both, global) and without; the oracle is MindSpore
without hooks: the same gradients (within 1e-6), or an error where it raises one.

    PYTHONPATH=.:backends .venv-mindspore/bin/python tests/mindspore_inplace_generator.py N SEED

prints one line per program that differs, then the counts per verdict:
- ``ok``: the same gradients; ``ok_error``: both raise (a RuntimeError);
- ``inplace_error``: MindSpore gives a gradient, the hooked run raises unihook's
  ``InPlaceError`` (a case the backend cannot make exact: refused, not wrong);
- ``WRONG_grad``: both give gradients, different ones; ``WRONG_no_error``: MindSpore raises,
  the hooked run gives a gradient; ``FALSE_error``: MindSpore gives a gradient, the hooked run
  raises something else; ``diff_error``: other exception types.
With a third argument ``inputs``, each program also changes a cell's input in place after the
call (``copy_``, from a detached value, ``h[0] = c``, ``h = h.copy_(...)``; right after the call
or after the whole chain; the caller's Python object alive at the backward or dropped), among
cells that also include ``x + 0.5`` (saves nothing), ``x * x``, a cell changing its input in
place then reading it, and a Dense inside a SequentialCell; those are drawn from a second
random stream, so the programs without ``inputs`` are the same as before.
Not collected by pytest (tests/test_mindspore_native.py has one regression test per shape).
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

import unihook

ms.set_context(mode=ms.PYNATIVE_MODE)

CELLS = [
    "dense", "sigmoid", "exp", "mul2", "identity", "view", "reshape", "slice",
    "sigreshape", "mulreshape", "dup", "dupsig", "tuple", "kept", "keptsig",
]  # fmt: skip
OPS = ["none", "copy", "copy", "sgcopy", "setitem", "iadd"]
SIDE = ["none", "copy", "sgcopy", "unused"]
KINDS = ["full", "pre", "full+pre", "global_full", "global_pre"]
INPUT_CELLS = ["dense", "sigmoid", "addb", "mulx", "attack", "seqdense", "identity", "mul2"]
INPUT_OPS = ["none", "copy", "copy", "sgcopy", "setitem", "rebind"]


class Fn(nn.Cell):
    """A cell running `fn(cell, x)`, with an optional Dense and a slot for a kept tensor."""

    def __init__(self, fn: Any, dense: Any = None) -> None:
        super().__init__()
        self.fn = fn
        self.dense = dense
        self.kept: Any = None

    def construct(self, x: Any) -> Any:
        return self.fn(self, x)


def keep(cell: Any, y: Any) -> Any:
    """`y`, kept by `cell` (a tensor the cell holds and returns)."""
    cell.kept = y
    return y


def attack(cell: Any, x: Any) -> Any:
    """A cell changing its input in place, then reading it (an attack's shape)."""
    x.copy_(ops.stop_gradient(x) * 2.0)
    return x * x


def make(kind: str, w: np.ndarray) -> Any:
    if kind == "seqdense":
        return nn.SequentialCell([make("dense", w)])
    if kind == "dense":
        d = nn.Dense(3, 3)
        d.weight.set_data(ms.Tensor(w))
        d.bias.set_data(ms.Tensor(w[0]))
        return d
    if kind == "sigmoid":
        return nn.Sigmoid()
    return Fn(
        {
            "exp": lambda s, x: ops.exp(x),
            "mul2": lambda s, x: x * 2,
            "identity": lambda s, x: x,
            "view": lambda s, x: x.view(3, 2),
            "reshape": lambda s, x: x.reshape(6).reshape(2, 3),
            "slice": lambda s, x: x[0:1],
            "sigreshape": lambda s, x: ops.sigmoid(x).reshape(6).reshape(2, 3),
            "mulreshape": lambda s, x: (x * 2).reshape(6).reshape(2, 3),
            "dup": lambda s, x: (lambda y: (y, y))(x * 2),
            "dupsig": lambda s, x: (lambda y: (y, y))(ops.sigmoid(x)),
            "tuple": lambda s, x: (ops.sigmoid(x), x * 2),
            "kept": lambda s, x: keep(s, x * 2),
            "keptsig": lambda s, x: keep(s, ops.exp(x)),
            "addb": lambda s, x: x + 0.5,
            "mulx": lambda s, x: x * x,
            "attack": attack,
        }[kind]
    )


def inplace(op: str, h: Any) -> Any:
    if op == "rebind":  # (`h = h.copy_(...)`: the caller's first Python object dies)
        return h.copy_(h * 3.0)
    if op == "copy":
        h.copy_(h * 3.0)
    elif op == "sgcopy":
        h.copy_(ops.stop_gradient(h) * 3.0)
    elif op == "setitem":
        h[0] = 0.5
    elif op == "iadd":
        h += 1.0
    return h


_alive: list[Any] = []  # the inputs kept alive until the backward is over (``inalive``)


def spec(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 3)
    s: dict[str, Any] = {
        "cells": [rng.choice(CELLS) for _ in range(n)],
        "ops": [rng.choice(OPS) for _ in range(n)],
        "side": [rng.choice(SIDE) for _ in range(n)],
        "hooked": [rng.random() < 0.7 for _ in range(n)],
        "kind": rng.choice(KINDS),
        "reuse": rng.random() < 0.3,
        "readkept": rng.random() < 0.6,
        "ws": [
            np.round(np.random.RandomState(rng.randrange(1 << 30)).randn(3, 3), 2) for _ in range(n)
        ],
        "x": np.round(np.random.RandomState(rng.randrange(1 << 30)).randn(2, 3), 2),
    }
    if not any(s["hooked"]):
        s["hooked"][rng.randrange(n)] = True
    if all(o == "none" for o in s["ops"]):
        s["ops"][rng.randrange(n)] = rng.choice(OPS[1:])
    return s


def input_spec(s: dict[str, Any], rng: random.Random) -> None:
    """In-place ops on the cells' inputs after their calls (the ``inputs`` argument)."""
    n = len(s["cells"])
    s["cells"] = [rng.choice(INPUT_CELLS) if rng.random() < 0.6 else c for c in s["cells"]]
    s["ops"] = [o if rng.random() < 0.5 else "none" for o in s["ops"]]
    s["inops"] = [rng.choice(INPUT_OPS) for _ in range(n)]
    if all(o == "none" for o in s["inops"]):
        s["inops"][rng.randrange(n)] = rng.choice(INPUT_OPS[1:])
    s["inlate"] = rng.random() < 0.3  # the ops after the whole chain
    s["inalive"] = rng.random() < 0.5  # the inputs' Python objects alive at the backward


def body(s: dict[str, Any], cells: list[Any], x: Any) -> Any:
    h = x * 1
    first = None
    side = []
    inops = s.get("inops", ["none"] * len(cells))
    late = []
    for cell, op, sop, iop in zip(cells, s["ops"], s["side"], inops):
        given = h
        h = cell(h)
        if iop != "none":
            if s["inlate"]:
                late.append((iop, given))
            else:
                given = inplace(iop, given)
                if s["inalive"]:
                    _alive.append(given)
        del given
        if isinstance(h, tuple):
            h, other = h
            if sop != "unused":
                inplace(sop, other)
                side.append(other)
        if h.shape != (2, 3):  # (a view of another shape, or a slice: back to (2, 3))
            h = h.reshape(2, 3) if h.size == 6 else ops.tile(h, (2, 1))
        if first is None:
            first = h
        inplace(op, h)
    for iop, given in late:
        given = inplace(iop, given)
        if s["inalive"]:
            _alive.append(given)
    del late
    out = h.sum()
    for o in side:
        out = out + (o * o).sum()
    if s["reuse"]:
        out = out + (first * first).sum()
    if s["readkept"]:
        for cell in cells:
            kept = getattr(cell, "kept", None)
            if kept is not None:
                out = out + (kept * kept).sum()
    return out


def hooks(s: dict[str, Any], cells: list[Any]) -> list[Any]:
    kind, handles = s["kind"], []
    if kind == "global_full":
        return [
            unihook.register_module_full_backward_hook(lambda m, gi, go: None, backend="mindspore")
        ]
    if kind == "global_pre":
        return [
            unihook.register_module_full_backward_pre_hook(lambda m, go: None, backend="mindspore")
        ]
    for cell, on in zip(cells, s["hooked"]):
        if on and "full" in kind:
            handles.append(unihook.register_full_backward_hook(cell, lambda m, gi, go: None))
        if on and "pre" in kind:
            handles.append(unihook.register_full_backward_pre_hook(cell, lambda m, go: None))
    return handles


def run(s: dict[str, Any], hooked: bool) -> tuple[str, Any]:
    cells = [make(c, w.astype(np.float32)) for c, w in zip(s["cells"], s["ws"])]
    handles = hooks(s, cells) if hooked else []
    try:
        params = [p for c in cells for p in c.get_parameters()]
        x = ms.Tensor(s["x"].astype(np.float32))
        f = lambda x: body(s, cells, x)  # noqa: E731
        if params:
            gx, gw = ms.grad(f, grad_position=0, weights=params)(x)
            return "grad", [gx.asnumpy()] + [g.asnumpy() for g in gw]
        return "grad", [ms.grad(f)(x).asnumpy()]
    except Exception as e:  # noqa: BLE001
        return "error", e
    finally:
        _alive.clear()
        for h in handles:
            h.remove()


def verdict(plain: tuple[str, Any], hooked: tuple[str, Any]) -> str:
    if plain[0] == "grad" and hooked[0] == "grad":
        same = all(
            np.allclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)
            for a, b in zip(plain[1], hooked[1])
        )
        return "ok" if same else "WRONG_grad"
    if plain[0] == "error" and hooked[0] == "error":
        return "ok_error" if isinstance(hooked[1], type(plain[1])) else "diff_error"
    if plain[0] == "error":
        return "WRONG_no_error"
    return "inplace_error" if isinstance(hooked[1], unihook.InPlaceError) else "FALSE_error"


def main() -> None:
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    inputs = sys.argv[3:4] == ["inputs"]
    rng = random.Random(seed)
    rng_inputs = random.Random(seed * 7919 + 1)
    counts: dict[str, int] = {}
    for i in range(n):
        s = spec(rng)
        if inputs:
            input_spec(s, rng_inputs)
        plain, hooked = run(s, False), run(s, True)
        v = verdict(plain, hooked)
        counts[v] = counts.get(v, 0) + 1
        if v not in ("ok", "ok_error"):
            what = lambda r: "grad" if r[0] == "grad" else type(r[1]).__name__  # noqa: E731
            print(
                i, v, s["cells"], s["ops"], s["side"], s.get("inops", ""),
                "inlate" if s.get("inlate") else "", "inalive" if s.get("inalive") else "",
                s["hooked"], s["kind"],
                "reuse" if s["reuse"] else "", "readkept" if s["readkept"] else "",
                "| plain", what(plain), "| hooked", what(hooked), flush=True,
            )  # fmt: skip
    print("SUMMARY", json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
