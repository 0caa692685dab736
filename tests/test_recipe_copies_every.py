"""A deep copy of a model carrying a recipe with ``every`` > 1 (torch's ``AveragedModel``, an
EMA copy, "keep the best model"): the copy's recipe records the copy's forwards that ``every``
picks, counting on from the original's count at the copy, and the original records its own,
on either framework (helper-107's FINDING 1: the copy's builder placed its hooks on the
original; then the copy recorded no forward, or, copied while the hooks were placed, every
one).

The oracle is the same run with ``every=1`` recipes (whose copies record every forward of the
copy, each on its own): each history must be that run's entries at the forwards ``every``
picks. Generated runs: forwards of the original and of the copy interleaved at random, the
copy made after 0 to 5 forwards (the hooks placed for the next forward or not), each run in a
child process per framework.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from children import last_value, run_code

CHILD = r"""
import copy, gc, random, sys
framework, runs = sys.argv[1], eval(sys.argv[2])
if framework == "torch":
    import torch as fw, torch.nn as nn
    def seed(n): fw.manual_seed(n)
    def batch(n):
        fw.manual_seed(1000 + n); return fw.randn(3, 4)
else:
    import paddle as fw, paddle.nn as nn
    def seed(n): fw.seed(n)
    def batch(n):
        fw.seed(1000 + n); return fw.randn([3, 4])
from unihook.recipes import ActivationStats, GradientMonitor

def plain(entry):
    if isinstance(entry, dict):
        return {k: plain(v) for k, v in entry.items()}
    if isinstance(entry, float):
        return float(f"{entry:.6g}")
    return entry

def run(kind, every, before, steps):
    # steps: "o" a step of the original, "c" one of the copy (made after `before` steps)
    cls = {"stats": ActivationStats, "grad": GradientMonitor}[kind]
    seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    r = cls(m, every=every)
    n = 0
    def step(model):
        nonlocal n
        model(batch(n)).sum().backward(); n += 1
    for _ in range(before):
        step(m)
    m2 = copy.deepcopy(m)
    # (the copy's recipe: nothing else refers to it but the copy's hooks)
    found = [o for o in gc.get_objects() if isinstance(o, cls) and o._model is m2]
    assert len(found) == 1, found
    r2 = found[0]
    counts = {"o": before, "c": before}  # the forwards each recipe counted
    picked = {"o": list(range(before)), "c": list(range(before))}  # timeline ids per model
    for who in steps:
        step(m if who == "o" else m2)
        picked[who].append(n - 1)
    hist = {"o": [plain(e) for e in r.history], "c": [plain(e) for e in r2.history]}
    r.remove(); r2.remove()
    return picked, hist

out = []
for kind, every, before, steps in runs:
    _, hist = run(kind, every, before, steps)
    picked, oracle = run(kind, 1, before, steps)
    expected = {}
    for who in "oc":
        # each model's own forward number i (the copy's counting on from the original's)
        expected[who] = [e for i, e in enumerate(oracle[who]) if i % every == 0]
    out.append([hist["o"] == expected["o"], hist["c"] == expected["c"],
                len(hist["o"]), len(expected["o"]), len(hist["c"]), len(expected["c"])])
print(out)
"""


def _runs(framework: str) -> list[tuple[str, int, int, str]]:
    rng = random.Random(f"copies-{framework}")
    runs = []
    for kind in ("stats", "grad"):
        for every in (2, 3):
            for before in range(6):
                steps = "".join(rng.choice("oc") for _ in range(rng.randint(3, 8)))
                runs.append((kind, every, before, steps))
    return runs


@functools.cache
def _results(framework: str) -> list[Any]:
    runs = _runs(framework)
    return last_value(run_code(CHILD, framework, repr(runs), timeout=600))


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@pytest.mark.parametrize("index", range(24))
def test_a_deep_copys_recipe_with_every_records_the_forwards_every_picks(
    framework: str, index: int
) -> None:
    pytest.importorskip(framework)
    run = _runs(framework)[index]
    got = _results(framework)[index]
    assert got[:2] == [True, True], (run, got)
