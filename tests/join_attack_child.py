"""helper-57's attack on the recipes in torch's Join (tests/test_attack_h57.py): one case (a JSON
dict) on its gloo CPU ranks, each rank pickling what its recipes reported to PREFIX.rank<r>.pkl;
`run(case, None)` is the single-process reference over the batches actually run (each iteration
on the rows of the ranks that still had a batch).

    python tests/join_attack_child.py CASE_JSON PREFIX
"""

from __future__ import annotations

import contextlib
import json
import pickle
import sys

import numpy as np
import torch
import torch.nn as nn

ROWS = 4
LR = 0.1


class ChunkBN(nn.BatchNorm2d):
    chunk = None

    def forward(self, x):
        if self.chunk and x.shape[0] > self.chunk:
            return torch.cat([super(ChunkBN, self).forward(p) for p in x.split(self.chunk)])
        return super().forward(x)


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x), torch.tanh(self.b(x))


class Twice(nn.Module):
    def __init__(self, act="relu"):
        super().__init__()
        self.l1 = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.act = nn.ReLU() if act == "relu" else nn.Tanh()
        self.pair = Pair()
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.act(self.l1(x))
        h = self.act(self.shared(h))
        h = self.shared(h)
        a, b = self.pair(h)
        return self.out(a + b)


class CNN(nn.Module):
    def __init__(self, act="relu"):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = ChunkBN(4)
        self.act = nn.ReLU() if act == "relu" else nn.Tanh()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.bn(self.conv(x)))).flatten(1))


class Pos(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 6, 6) * 0.5)

    def forward(self, x):
        return self.table[:, : x.shape[1]]


class PosNet(nn.Module):
    def __init__(self, act="relu"):
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.pos = Pos()
        self.head = nn.Linear(6, 3)
        self.act = nn.Tanh() if act == "relu" else nn.ReLU()

    def forward(self, x):
        return self.head(self.act(self.embed(x) + self.pos(x)).mean(1))


def mlp(act="relu"):
    return nn.Sequential(
        nn.Linear(6, 8),
        nn.ReLU() if act == "relu" else nn.Tanh(),
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
        nn.Linear(8, 3),
    )


def build(kind, act="relu"):
    torch.manual_seed(5)
    return {"mlp": mlp, "twice": Twice, "cnn": CNN, "pos": PosNet}[kind](act)


def batches(case, rank, epoch):
    rng = np.random.default_rng(1000 * epoch + 40 + (0 if case.get("same") else rank))
    shape = (
        (ROWS, 3, 8, 8)
        if case["model"] == "cnn"
        else (ROWS, 5, 4)
        if case["model"] == "pos"
        else (ROWS, 6)
    )
    out = []
    for _ in range(case_counts(case, epoch)[rank]):
        out.append(
            (
                rng.normal(0, 1, shape).astype(np.float32),
                rng.normal(0, 1, (ROWS, 3)).astype(np.float32),
            )
        )
    return out


def case_counts(case, epoch):
    c = case["counts"]
    return c[epoch] if isinstance(c[0], list) else c


COUNT = {"all_gather": 0, "all_reduce": 0, "broadcast": 0, "new_group": 0}


def wrap_counts():
    import torch.distributed as dist

    for name in ("all_gather", "all_reduce", "broadcast", "new_group"):
        orig = getattr(dist, name)

        def w(*a, _o=orig, _n=name, **k):
            COUNT[_n] += 1
            return _o(*a, **k)

        setattr(dist, name, w)
        if name != "new_group":
            import torch.distributed.distributed_c10d as c10d

            setattr(c10d, name, w)


def make_recipes(case, model):
    from unihook.recipes import ActivationStats, GradientMonitor

    out = []
    for spec in case["recipes"]:
        kind, every = spec[0], spec[1]
        mh = case.get("max_history", 1000)
        if kind == "stats":
            out.append(
                ActivationStats(
                    model,
                    every=every,
                    max_history=mh,
                    sync=spec[2] if len(spec) > 2 else True,
                    **(
                        {"where": case["where"]}
                        if case.get("where")
                        else {"where": spec[3]}
                        if len(spec) > 3
                        else {}
                    ),
                )
            )
        else:
            out.append(
                GradientMonitor(
                    model,
                    every=every,
                    max_history=mh,
                    on_nonfinite=spec[2] if len(spec) > 2 else "raise",
                )
            )
    return out


def run(case, rank):
    """rank None: the single-process reference."""
    world = case["world"]
    model = build(case["model"], "tanh" if case.get("differ") and rank == 1 else "relu")
    if rank is None and case["model"] == "cnn":
        model.bn.chunk = ROWS
    if rank is None:
        wrapped = model
    else:
        wrapped = nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=bool(case.get("unused"))
        )
        if case.get("compile"):
            wrapped = torch.compile(wrapped, backend="eager")
    ddp = wrapped
    divide = case.get("divide", True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    acc = case.get("accumulate", 1)
    recipes = [] if case.get("late") or case.get("late_partial") else make_recipes(case, wrapped)
    if case.get("late_partial"):
        recipes = make_recipes({**case, "recipes": case["recipes"][:1]}, wrapped)
    interrupt = {"now": False}
    if case.get("kbi"):

        def _raise(module, args, output):
            if interrupt["now"]:
                interrupt["now"] = False
                raise KeyboardInterrupt("interrupted on purpose")

        list(model.children())[-2].register_forward_hook(_raise)
    res = {"errors": [], "counts": []}
    epochs = case.get("epochs", 1)
    for epoch in range(epochs):
        if case.get("late") and epoch == 1:
            recipes = make_recipes(case, wrapped)
        if case.get("late_partial") and epoch == 1:
            recipes = recipes + make_recipes({**case, "recipes": case["recipes"][1:]}, wrapped)
        counts = case_counts(case, epoch)
        if rank is None:
            parts = [batches(case, r, epoch) for r in range(world)]
            n = min(counts) if case.get("throw") else max(counts)
            its = [[p[i] for p in parts if i < len(p)] for i in range(n)]
        else:
            its = [[b] for b in batches(case, rank, epoch)]
        order = case.get("order", "recipes")
        if rank is not None and not case.get("nojoin"):
            from torch.distributed.algorithms.join import Join

            listed = list(recipes)
            if case.get("rev") or case.get("rev_epoch") and epoch >= 1:
                listed = listed[::-1]
            if case.get("listed") is not None:
                listed = [recipes[k] for k in case["listed"]]
            if case.get("later_without") and epoch >= 1:
                listed = []
            if case.get("drop_removed") and case.get("remove"):
                listed = [r for r in listed if not getattr(r, "_removed", False)]
            js = listed + [wrapped] if order == "recipes" else [wrapped] + listed
            if case.get("join_model_only"):
                js = [wrapped]
            kw = {} if divide else {"divide_by_initial_world_size": False}
            try:
                joined = Join(js, throw_on_early_termination=case.get("throw", False), **kw)
            except Exception as e:  # (a misuse refused when the Join is built)
                res["errors"].append((epoch, f"{type(e).__name__}: {str(e)[:300]}"))
                break
        else:
            joined = contextlib.nullcontext()
        c0 = dict(COUNT)
        try:
            with joined:
                for i, parts in enumerate(its):
                    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
                    co = torch.from_numpy(np.concatenate([p[1] for p in parts]))
                    active = len(parts) if rank is None else None
                    for key in ("remove",):
                        spec = case.get(key)
                        if (
                            spec
                            and spec[0] == epoch
                            and spec[1] == i
                            and (rank is None or rank in spec[3])
                        ):
                            recipes[spec[2]].remove()
                    ev = case.get("eval_nograd")
                    if (
                        ev
                        and ev[0] == epoch
                        and ev[1] == i
                        and (rank == ev[2] or rank is None and False)
                    ):
                        with torch.no_grad():
                            wrapped(x)
                    eg = case.get("eval_grad")
                    if eg and eg[0] == epoch and eg[1] == i and rank == eg[2]:
                        model.eval()
                    kb = case.get("kbi")
                    interrupt["now"] = bool(
                        kb and kb[0] == epoch and kb[1] == i and (rank is None or rank in kb[2])
                    )
                    rf = case.get("raise_fwd")
                    if rf and rf[0] == epoch and rf[1] == i and rank == rf[2]:
                        raise RuntimeError("forward raised on purpose")
                    step = (i + 1) % acc == 0
                    skip = rank is not None and not step
                    with ddp.no_sync() if skip else contextlib.nullcontext():
                        out = wrapped(x)
                        if (
                            case.get("nan")
                            and case["nan"][0] == epoch
                            and case["nan"][1] == i
                            and (rank in (None, case["nan"][2]))
                        ):
                            co = co.clone()
                            co[0, 0] = float("nan")
                        (out * co).sum().backward()
                    model.train()
                    res.setdefault("per_it", []).append(COUNT["all_gather"])
                    if step:
                        if rank is None:
                            scale = 1.0 / (world if divide else active)
                            for g in opt.param_groups:
                                g["lr"] = LR * scale
                        opt.step()
                        opt.zero_grad()
        except BaseException as e:
            res["errors"].append((epoch, f"{type(e).__name__}: {str(e)[:300]}"))
            if case.get("stop_on_error", True):
                break
        res["counts"].append({k: COUNT[k] - c0[k] for k in COUNT})
    res["recipes"] = []
    for r, spec in zip(recipes, case["recipes"]):
        if spec[0] == "stats":
            res["recipes"].append({"history": r.history, "rows": r.rows()})
        else:
            res["recipes"].append({"history": [dict(h) for h in r.history]})
    import unihook_torch._ops as _o

    res["own_groups"] = len(_o._own_groups)
    res["params"] = [p.detach().numpy().copy() for p in model.parameters()]
    return res


if __name__ == "__main__":
    case = json.loads(sys.argv[1])
    out = sys.argv[2]
    if sys.argv[3:] == ["ref"]:
        res = run(case, None)
        with open(f"{out}.ref.pkl", "wb") as f:
            pickle.dump(res, f)
    else:
        from children import start_ranks

        def rank_main(rank):
            wrap_counts()  # (the process group is up: its collectives are counted)
            return run(case, rank)

        start_ranks(rank_main, case["world"], out, timeout=case.get("timeout", 15))
