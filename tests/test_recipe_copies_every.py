"""A deep copy of a model carrying a recipe with ``every`` > 1 (torch's ``AveragedModel``, an
EMA copy, "keep the best model"): the copy's recipe records the copy's forwards that ``every``
picks, counting on from the original's count at the copy, and the original records its own,
on either framework (helper-107's FINDING 1: the copy's builder placed its hooks on the
original; then the copy recorded no forward, or, copied while the hooks were placed, every
one).

Pickled too (``torch.save(model)``, ``pickle``): until 2026-12-04 that raised (helper-115's
FINDING 4).

The oracle is the same run with ``every=1`` recipes (whose copies record every forward of the
copy, each on its own): each history must be that run's entries at the forwards ``every``
picks, also with a forward hook registered on both after the copy (the hooks placed anew
go back to their places, the copy's too). Generated runs: forwards of the original and of
the copy interleaved at random, the copy made after 0 to 5 forwards (the hooks placed for the
next forward or not), each run in a child process per framework.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from children import last_value, run_code

CHILD = r"""
import copy, gc, io, pickle, random, sys
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

def copied(m, copier):
    if copier == "deepcopy":
        return copy.deepcopy(m)
    if copier == "pickle":
        return pickle.loads(pickle.dumps(m))
    buf = io.BytesIO()  # torch.save: the whole model
    fw.save(m, buf)
    buf.seek(0)
    return fw.load(buf, weights_only=False)

def run(kind, every, before, steps, copier):
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
    m2 = copied(m, copier)
    for model in (m, m2):  # (after the recipe: its hooks run before it, whatever `every` is)
        last = model[2]
        getattr(last, "register_forward_hook", getattr(last, "register_forward_post_hook", None))(
            lambda module, args, out: out * 3)
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
for kind, every, before, steps, copier in runs:
    _, hist = run(kind, every, before, steps, copier)
    picked, oracle = run(kind, 1, before, steps, copier)
    expected = {}
    for who in "oc":
        # each model's own forward number i (the copy's counting on from the original's)
        expected[who] = [e for i, e in enumerate(oracle[who]) if i % every == 0]
    out.append([hist["o"] == expected["o"], hist["c"] == expected["c"],
                len(hist["o"]), len(expected["o"]), len(hist["c"]), len(expected["c"])])
print(out)
"""


def _runs(framework: str) -> list[tuple[str, int, int, str, str]]:
    rng = random.Random(f"copies-{framework}")
    runs = []
    for kind in ("stats", "grad"):
        for every in (2, 3):
            for before in range(6):
                steps = "".join(rng.choice("oc") for _ in range(rng.randint(3, 8)))
                runs.append((kind, every, before, steps, "deepcopy"))
    # pickled (``torch.save(model)``; until 2026-12-04 it raised, helper-115's FINDING 4)
    copiers = ["pickle", "save"] if framework == "torch" else ["pickle"]
    for kind in ("stats", "grad"):
        for every in (1, 2, 3):
            for before in (0, 1, 2, 4):
                steps = "".join(rng.choice("oc") for _ in range(rng.randint(3, 8)))
                runs.append((kind, every, before, steps, rng.choice(copiers)))
    return runs


@functools.cache
def _results(framework: str) -> list[Any]:
    runs = _runs(framework)
    return last_value(run_code(CHILD, framework, repr(runs), timeout=600))


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@pytest.mark.parametrize("index", range(48))
def test_a_deep_copys_recipe_with_every_records_the_forwards_every_picks(
    framework: str, index: int
) -> None:
    pytest.importorskip(framework)
    run = _runs(framework)[index]
    got = _results(framework)[index]
    assert got[:2] == [True, True], (run, got)


PREDICATE = r"""
import copy, gc, sys
import torch, torch.nn as nn
from unihook.recipes import ActivationStats, GradientMonitor

out = []
for cls in (ActivationStats, GradientMonitor):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    recipe = cls(model, every=2, where=lambda name, module: module is model[0])
    ema = copy.deepcopy(model)
    copied = next(o for o in gc.get_objects() if isinstance(o, cls) and o._model is ema)
    for _ in range(4):
        ema(torch.randn(3, 4)).sum().backward()
    out.append([len(copied.history), [sorted(entry) for entry in copied.history]])
print(out)
"""


def test_a_copys_recipe_picks_the_modules_a_predicate_picked() -> None:
    """A `where` predicate may pick modules by identity (``module is model[0]``), which a deep
    copy leaves pointing at the original's: the copy's builder matched nothing and the copy
    recorded its first forward only, silently (helper-115's FINDING 1). The copy takes the
    names the predicate picked."""
    pytest.importorskip("torch")
    got = last_value(run_code(PREDICATE, timeout=120))
    assert got == [[2, [["0"], ["0"]]]] * 2


REMOVED_COPY = r"""
import copy, gc, sys
import torch, torch.nn as nn
from unihook.recipes import ActivationStats, GradientMonitor

out = []
for cls in (ActivationStats, GradientMonitor):
    for every in (1, 2):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        recipe = cls(m, every=every)
        m2 = copy.deepcopy(m)
        copied = next(o for o in gc.get_objects() if isinstance(o, cls) and o._model is m2)
        copied.remove()
        for _ in range(4):
            m2(torch.randn(3, 4)).sum().backward()
        out.append(len(copied.history))
print(out)
"""


def test_a_removed_copys_recipe_records_nothing() -> None:
    """The copy's `remove()` has no handle to take the copied hooks away; they must do
    nothing from then on (ActivationStats with every=1 kept recording: helper-115's FINDING
    2)."""
    pytest.importorskip("torch")
    assert last_value(run_code(REMOVED_COPY, timeout=120)) == [0, 0, 0, 0]


COMPILED_EVERY = r"""
import os, warnings
import torch, torch.nn as nn
from torch._dynamo import convert_frame
from unihook.recipes import ActivationStats, GradientMonitor
warnings.simplefilter("ignore")

out = []
for cls in (ActivationStats, GradientMonitor):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    recipe = cls(m, every=2)
    cm = torch.compile(m, backend="eager")
    for _ in range(12):
        cm(torch.randn(3, 4)).sum().backward()
    compiled = {
        (code.co_name, os.path.basename(code.co_filename))
        for weak in convert_frame.input_codes.seen
        if (code := weak()) is not None and os.sep + "unihook" in code.co_filename
    }
    # `every`'s counting and placing, and the wrapper of what it placed
    eager = {("_enter", "_scope.py"), ("_count", "_scope.py"), ("_count_locked", "_scope.py"),
             ("_advance", "_scope.py"), ("_place", "stats.py"), ("_place", "monitor.py"),
             ("__call__", "_scope.py"), ("_insert", "__init__.py"), ("_watched", "__init__.py")}
    out.append([len(recipe.history), sorted(compiled & eager)])
    recipe.remove()
print(out)
"""


def test_every_under_torch_compile_counts_and_places_eagerly() -> None:
    """Under ``torch.compile``, `every`'s counting hooks (which place and remove hooks) and the
    wrapper of the hooks they place (`_Placed`) run eagerly where torch calls them on its own:
    dynamo compiled them as frames of their own, and the registration code under them, up to
    its recompile limit, with its warning (helper-115's FINDING 3; the registration's before
    it). (The recipe's own hooks are compiled as a user's are.)"""
    pytest.importorskip("torch")
    assert last_value(run_code(COMPILED_EVERY, timeout=300)) == [[6, []], [6, []]]


PART = r"""
import copy, gc, sys, types
framework = sys.argv[1]
if framework == "torch":
    import torch as fw, torch.nn as nn
    Module = nn.Module
    def batch(n):
        fw.manual_seed(1000 + n); return fw.randn(3, 4)
else:
    import paddle as fw, paddle.nn as nn
    Module = nn.Layer
    def batch(n):
        fw.seed(1000 + n); return fw.randn([3, 4])
from unihook.recipes import ActivationStats, GradientMonitor

SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.FrameType)

def modules_reached(start):
    seen, todo, found = {id(start)}, [start], []
    while todo:
        obj = todo.pop()
        if isinstance(obj, Module):
            found.append(obj)
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, SKIP):
                seen.add(id(ref)); todo.append(ref)
    return found

out = []
for cls in (ActivationStats, GradientMonitor):
    for every in (1, 2):
        for part in ("submodule", "recipe"):
            fw.seed(0) if framework == "paddle" else fw.manual_seed(0)
            m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1000))
            r = cls(m, every=every)
            before = 3 if every == 1 else 4  # (every=2: the hooks placed for the next one)
            for n in range(before):
                m(batch(n)).sum().backward()
            history = list(r.history)
            if part == "submodule":
                alive = {id(o) for o in gc.get_objects() if isinstance(o, cls)}
                head = copy.deepcopy(m[0])
                copies = [o for o in gc.get_objects() if isinstance(o, cls) and id(o) not in alive]
                assert len(copies) == 1, copies
                r2 = copies[0]
                parts = head.sublayers(True) if framework == "paddle" else head.modules()
                own = {id(x) for x in parts}
                strays = [x for x in modules_reached(head) if id(x) not in own]
                for n in range(4):  # the part's copied hooks do nothing
                    head(batch(10 + n)).sum().backward()
            else:
                r2 = copy.deepcopy(r)
                strays = modules_reached(r2)
            for n in range(before, before + 2):
                m(batch(n)).sum().backward()
            out.append([type(strays[0]).__name__ if strays else None,
                        list(r2.history) == history, r2._removed,
                        len(r.history) == len(history) + (2 if every == 1 else 1)])
            r.remove()
print(out)
"""


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_a_copy_of_a_part_of_the_model_carries_none_of_the_rest(framework: str) -> None:
    """``copy.deepcopy(model[0])`` (a head, an EMA of ``ddp.module``) or of the recipe alone
    copied the whole model with the recipe the part's hooks are bound to (helper-115's
    FINDING 5): the copy is the recipe's numbers so far, removed, holding no module; the part's
    hooks do nothing, and the original records on."""
    pytest.importorskip(framework)
    got = last_value(run_code(PART, framework, timeout=300))
    assert got == [[None, True, True, True]] * 8


PADDLE_PICKLED = r"""
import pickle, paddle, paddle.nn as nn
from unihook.recipes import ActivationStats
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
r = ActivationStats(m, every=2)
for _ in range(2):
    m(paddle.randn([3, 4])).sum().backward()
m2 = pickle.loads(pickle.dumps(m))
for _ in range(4):
    m2(paddle.randn([3, 4])).sum().backward()
print(True)
"""


def test_a_pickled_paddle_layers_recipe_with_every_places_its_hooks() -> None:
    """A pickled layer's hook dicts came back as plain OrderedDicts, which paddle iterates
    live: the copy's recipe placing hooks (every > 1) from inside that loop raised
    "OrderedDict mutated during iteration" (found 2026-12-04). They come back as
    `SnapshotDict`s where the framework iterates live."""
    pytest.importorskip("paddle")
    assert last_value(run_code(PADDLE_PICKLED, timeout=120)) is True


ORDERS = r"""
import copy, gc, io, pickle, signal, torch, torch.nn as nn
from unihook.recipes import ActivationStats

def calls(r):
    return [row["calls"] for row in r.rows()]

def copies_of(model):
    return [o for o in gc.get_objects() if isinstance(o, ActivationStats) and o._model is model]

out = []
# (helper-116's FINDING 2) the recipe or a submodule reached before the model in a container
for order in ("model first", "recipe first", "head first", "object"):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    s = ActivationStats(m)
    m(torch.randn(3, 4))
    if order == "model first":
        m2 = copy.deepcopy([m, s])[0]
    elif order == "recipe first":
        m2 = copy.deepcopy({"stats": s, "model": m})["model"]
    elif order == "head first":
        m2 = copy.deepcopy({"head": m[0], "model": m})["model"]
    else:
        class Trainer: pass
        t = Trainer(); t.stats, t.model = s, m
        m2 = copy.deepcopy(t).model
    for _ in range(2):
        m2(torch.randn(3, 4))
    out.append([calls(r) for r in copies_of(m2)])
    s.remove()
# (helper-117's FINDING 3) a submodule holding its model: its deep copy copies the model
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
s = ActivationStats(m)
object.__setattr__(m[0], "owner", [m])
m2 = copy.deepcopy(m[0]).owner[0]
m2(torch.randn(3, 4))
out.append([calls(r) for r in copies_of(m2)])
s.remove()
# (helper-117's FINDING 2) every > 1: a submodule called between forwards of a copy
for every in (2, 3):
    for how in ("deepcopy", "pickle", "fresh"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        s = ActivationStats(m, every=every)
        if how == "deepcopy":
            m, s = (lambda d: (d["m"], d["s"]))(copy.deepcopy({"m": m, "s": s}))
        elif how == "pickle":
            m, s = (lambda d: (d["m"], d["s"]))(pickle.loads(pickle.dumps({"m": m, "s": s})))
        for _ in range(every + 1):
            m(torch.randn(3, 4)); m[0](torch.randn(3, 4))
        out.append(calls(s))
# (helper-116's FINDING 1) calls outside a forward of the model are the copies' numbers too
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
s = ActivationStats(m)
m(torch.randn(3, 4)); m[0](torch.randn(3, 4))
buf = io.BytesIO(); torch.save(m, buf); buf.seek(0)
loaded = torch.load(buf, weights_only=False)
out.append([calls(s), calls(copy.deepcopy(s)), calls(copies_of(copy.deepcopy(m))[0]),
            calls(copies_of(loaded)[0])])
# (helper-118's FINDING 1) a part holding much plain data (a vocabulary) is copied alone
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
s = ActivationStats(m)
m[0].vocab = {str(i): i for i in range(300_000)}
sequentials = lambda: sum(type(o) is nn.Sequential for o in gc.get_objects())
before = sequentials()
head = copy.deepcopy(m[0])
out.append(sequentials() == before)
s.remove()
# (helper-116's FINDING 4) rows() from a signal handler while a call holds the step's lock
seen = []
signal.signal(signal.SIGALRM, lambda *_: seen.append(len(s.rows())))
signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
for _ in range(2000):
    m[0](torch.randn(3, 4))
signal.setitimer(signal.ITIMER_REAL, 0)
out.append(bool(seen))
print(out)
"""


def test_copies_made_through_containers_and_outside_calls() -> None:
    """Where the deep copy reaches the recipe (or a submodule) before the model, in a dict or
    an object holding both, the copied model's recipe records it (helper-116's FINDING 2: it
    was a removed copy); calls of modules outside a forward of the model are in every copy's
    rows (FINDING 1); ``rows()`` from a signal handler does not wait for the lock the
    interrupted call holds (FINDING 4: a hang). A submodule holding its model copies the model,
    whose recipe records (helper-117's FINDING 3); with `every` > 1 a submodule called between
    a copy's forwards is not recorded, as by the original (its FINDING 2). A part holding much
    plain data (a vocabulary) is copied alone (helper-118's FINDING 1: the walk's budget went
    on its entries, and the model was copied)."""
    pytest.importorskip("torch")
    got = last_value(run_code(ORDERS, timeout=300))
    assert got[:4] == [[[3, 3, 3, 3]]] * 4
    assert got[4] == [[1, 1, 1, 1]]  # (live: an inert copy has no rows; helper-117 FINDING 3)
    assert got[5:11] == [[2, 2, 2, 2]] * 6  # (recorded: forwards 0 and `every`)
    assert got[11] == [[1, 2, 1, 1]] * 4
    assert got[12] is True  # (a part holding a vocabulary: no model copied with it)
    assert got[13] is True
