"""helper-60's attack on d259886 (tests/test_attack_h60.py): one scenario (a function below,
by name) on WORLD gloo CPU ranks; each rank pickles what happened to PREFIX.rank<r>.pkl.

    python tests/join_h60_child.py SCENARIO WORLD PREFIX
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys

import torch
import torch.nn as nn

ROWS = 4


def model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(rank: int, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(ROWS, 6, generator=g) for _ in range(count)]


class Branches(nn.Module):
    """A model whose submodules `p` and `q` run on some ranks only (data-dependent routing,
    mixture-of-experts style): `route` names the ones this forward runs, in that order."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.stem = nn.Linear(6, 6)
        self.p = nn.Linear(6, 6)
        self.q = nn.Linear(6, 6)
        self.route: tuple[str, ...] = ("p", "q")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for name in self.route:
            x = getattr(self, name)(x)
        return x


def routed_order(rank, world):
    """ActivationStats (synced) on a DDP model whose expert runs on one rank only: rank 0
    routes through `q`, rank 1 through `p`, then both ranks through both. The merged rows must
    be the same on every rank (same names, same order): they are the ranks' merged numbers."""
    from unihook.recipes import ActivationStats

    inner = Branches()
    ddp = nn.parallel.DistributedDataParallel(inner, find_unused_parameters=True)
    stats = ActivationStats(ddp)
    out = {"errors": []}
    try:
        for route in ((("q",), ("p",))[rank], ("p", "q")):
            inner.route = route
            ddp(batches(rank, 1)[0]).square().sum().backward()
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")
    out["order"] = [r["name"] for r in stats.rows()]
    stats.remove()
    return out


def _uneven_no_sync(wrapped, rank):
    """Steps of 2 micro-batches on rank 0, 3 on rank 1 (the earlier ones under no_sync)."""
    from unihook.recipes import ActivationStats, GradientMonitor
    from unihook.recipes._scope import RankMismatchError

    errors = []
    stats, monitor = ActivationStats(wrapped), GradientMonitor(wrapped)
    accumulate = 2 + rank
    xs = batches(rank, 2 * accumulate)
    for micro, x in enumerate(xs):
        last = micro % accumulate == accumulate - 1
        try:
            with contextlib.nullcontext() if last else wrapped.no_sync():
                wrapped(x).square().sum().backward()
        except RankMismatchError:
            errors.append(f"{micro}: RankMismatchError")
            break
        except Exception as e:
            errors.append(f"{micro}: {type(e).__name__}: {str(e)[:200]}")
            break
    stats.remove()
    monitor.remove()
    return errors


def no_sync_wrappers(rank, world):
    """Uneven accumulation under no_sync() of FSDP1 (use_orig_params both ways) and of a
    compiled DDP: the same RankMismatchError on every rank, at the same micro-batch."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = {"errors": []}
    for orig in (False, True):
        fsdp = FSDP(model(), device_id=torch.device("cpu"), use_orig_params=orig)
        out[f"fsdp1 orig={orig}"] = _uneven_no_sync(fsdp, rank)
    ddp = nn.parallel.DistributedDataParallel(model())
    out["ddp"] = _uneven_no_sync(ddp, rank)
    compiled = torch.compile(nn.parallel.DistributedDataParallel(model()), backend="eager")
    out["compiled ddp"] = _uneven_no_sync(compiled, rank)
    return out


def _uneven(rank: int) -> int:
    return 2 + rank


def one_process(world: int) -> list:
    """ActivationStats' history of one process over the ranks' uneven batches (the rows of the
    ranks that still had a batch, each iteration), twice (two epochs)."""
    from unihook.recipes import ActivationStats

    plain = model()
    stats = ActivationStats(plain)
    parts = [batches(r, _uneven(r)) for r in range(world)]
    for _ in range(2):
        for i in range(max(map(len, parts))):
            plain(torch.cat([p[i] for p in parts if i < len(p)])).square().sum().backward()
    return list(stats.history)


def _builders():
    import functools
    import threading

    from torch.distributed.algorithms.join import Join

    class SubJoin(Join):
        def __init__(self, joinables, **kwargs):
            super().__init__(joinables, **kwargs)

    def deep(n):
        def build(joinables):
            return Join(joinables) if n == 0 else deep(n - 1)(joinables)

        return build

    def threaded(joinables):
        box = []

        def run():
            try:
                box.append(Join(joinables))
            except BaseException as e:
                box.append(e)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    return {
        "plain": Join,
        "subclass": SubJoin,
        "partial": functools.partial(Join, enable=True),
        "comprehension": lambda js: [Join(js) for _ in range(1)][0],
        "deep": deep(15),
        "thread": threaded,
    }


def join_builders(rank, world):
    """Each way of building torch's Join (a subclass, functools.partial, a comprehension, 15
    calls deep, in a thread): Join([stats, ddp]) twice with uneven inputs gives one process's
    numbers; Join([ddp]) (the recipe left out) raises HookArgumentError on every rank, before
    any collective."""
    from unihook.errors import HookArgumentError
    from unihook.recipes import ActivationStats

    out = {"errors": []}
    cases = {f"build:{k}": (v, lambda d: d) for k, v in _builders().items()}
    only = os.environ.get("H60_CASE")
    for label, (build, wrap) in cases.items():
        if only and label != only:
            continue
        ddp = nn.parallel.DistributedDataParallel(model())
        stats = ActivationStats(ddp)
        got = {}
        try:
            for _ in range(2):
                with build([stats, wrap(ddp)]):
                    for x in batches(rank, _uneven(rank)):
                        ddp(x).square().sum().backward()
            got["history"] = list(stats.history)
        except Exception as e:
            got["with"] = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            with build([wrap(ddp)]):
                for x in batches(rank, _uneven(rank)):
                    ddp(x).square().sum().backward()
            got["without"] = "ran"
        except HookArgumentError:
            got["without"] = "refused"
        except Exception as e:
            got["without"] = f"{type(e).__name__}: {str(e)[:200]}"
        stats.remove()
        got["residue"] = "join_hook" in vars(ddp)
        out[label] = got
    return out


def lifecycle(rank, world):
    """Synced recipes built with bad arguments (raising), built and removed in every order,
    used as context managers, re-made between Joins: no `join_hook` left on the wrapper once
    none is left, the wrapper pickles again, and each Join runs (one process's numbers)."""
    import itertools

    from torch.distributed.algorithms.join import Join

    from unihook.recipes import ActivationStats, GradientMonitor

    out = {"errors": [], "residue": [], "pickle": []}
    kinds = {"s": ActivationStats, "g": GradientMonitor}
    ddp = nn.parallel.DistributedDataParallel(model())
    for kind in kinds.values():
        for bad in ({"every": 0}, {"every": "2"}, {"max_history": -1}):
            try:
                kind(ddp, **bad).remove()
                out["errors"].append(f"{kind.__name__}{bad} built")
            except Exception:
                pass
            if "join_hook" in vars(ddp):
                out["residue"].append(f"{kind.__name__}{bad}")
    for order in itertools.permutations("sgs"):
        made = [kinds[k](ddp) for k in order]
        for recipe in made[::-1] if order[0] == "g" else made:
            recipe.remove()
        if "join_hook" in vars(ddp):
            out["residue"].append("".join(order))
    with ActivationStats(ddp), GradientMonitor(ddp):
        pass
    if "join_hook" in vars(ddp):
        out["residue"].append("with")
    try:
        pickle.dumps(ddp)
    except Exception as e:
        out["pickle"].append(f"{type(e).__name__}: {str(e)[:200]}")
    histories = []
    for _ in range(2):  # a recipe per epoch: the last removed before the next is made
        stats = ActivationStats(ddp)
        try:
            with Join([stats, ddp]):
                for x in batches(rank, _uneven(rank)):
                    ddp(x).square().sum().backward()
        except Exception as e:
            out["errors"].append(f"epoch: {type(e).__name__}: {str(e)[:200]}")
        histories.extend(stats.history)
        stats.remove()
    out["history"] = histories
    out["after"] = "join_hook" in vars(ddp)
    return out


def _hook_count(module: nn.Module) -> int:
    kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, k)) for m in module.modules() for k in kinds)


def failed_construction(rank, world):
    """A synced recipe whose `where` matches no module raises HookArgumentError in its
    construction (the user fixes the pattern and goes on): it must leave nothing on the model,
    and the next recipe's Join with uneven inputs must give one process's numbers."""
    from torch.distributed.algorithms.join import Join

    from unihook.errors import HookArgumentError
    from unihook.recipes import ActivationStats, GradientMonitor

    out = {"errors": []}
    kind = {"s": ActivationStats, "g": GradientMonitor}[os.environ.get("H60_KIND", "s")]
    ddp = nn.parallel.DistributedDataParallel(model())
    try:
        kind(ddp, where="nomatch*")
        out["errors"].append("built")
    except HookArgumentError:
        pass
    out["left"] = _hook_count(ddp)
    stats = ActivationStats(ddp)
    try:
        for _ in range(2):
            with Join([stats, ddp]):
                for x in batches(rank, _uneven(rank)):
                    ddp(x).square().sum().backward()
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")
    out["history"] = list(stats.history)
    return out


def compiled_join(rank, world):
    """torch.compile(ddp) (as torch advises) in Join([stats, monitor, compiled]) and
    Join([stats, monitor, ddp]) with uneven inputs: one process's numbers; Join([compiled]),
    Join([ddp]), Join([monitor, compiled]) refused; nothing left after remove()."""
    from torch.distributed.algorithms.join import Join

    from unihook.errors import HookArgumentError
    from unihook.recipes import ActivationStats, GradientMonitor

    out = {"errors": []}
    ddp = nn.parallel.DistributedDataParallel(model())
    compiled = torch.compile(ddp, backend="eager")
    stats = ActivationStats(compiled)
    mon = GradientMonitor(compiled)
    for joined in ([stats, mon, compiled], [stats, mon, ddp]):
        try:
            with Join(joined):
                for x in batches(rank, _uneven(rank)):
                    compiled(x).square().sum().backward()
        except Exception as e:
            out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    out["history"] = list(stats.history)
    for joined in ([compiled], [ddp], [mon, compiled]):
        try:
            with Join(joined):
                for x in batches(rank, _uneven(rank)):
                    compiled(x).square().sum().backward()
            out.setdefault("without", []).append("ran")
        except HookArgumentError:
            out.setdefault("without", []).append("refused")
        except Exception as e:
            out.setdefault("without", []).append(f"{type(e).__name__}: {str(e)[:200]}")
    stats.remove()
    mon.remove()
    out["residue"] = "join_hook" in vars(ddp)
    return out


def nobatch_order(rank, world):
    """Rank 0 has no batch at all in Join; rank 1 routes q before p (the reverse of their
    registration): rank 0 files the rows in rank 1's call order."""
    from torch.distributed.algorithms.join import Join

    from unihook.recipes import ActivationStats

    inner = Branches()
    ddp = nn.parallel.DistributedDataParallel(inner, find_unused_parameters=True)
    stats = ActivationStats(ddp)
    out = {"errors": []}
    routes = [("q", "p"), ("q",), ("p", "q")]
    n = 0 if rank == 0 else 3
    try:
        with Join([stats, ddp]):
            for i, x in enumerate(batches(rank, n)):
                inner.route = routes[i]
                ddp(x).square().sum().backward()
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")
    out["order"] = [r["name"] for r in stats.rows()]
    out["calls"] = [r["calls"] for r in stats.rows()]
    return out


def every_refused(rank, world):
    """Join([stats every=2, monitor every=1, ddp]) refused (HookArgumentError), the monitor
    re-made with every=2: two epochs, then a Join nested in another of the same wrapper:
    one process's numbers (forwards 0, 2, 4... logged)."""
    from torch.distributed.algorithms.join import Join

    from unihook.errors import HookArgumentError
    from unihook.recipes import ActivationStats, GradientMonitor

    out = {"errors": [], "steps": []}
    ddp = nn.parallel.DistributedDataParallel(model())
    s2 = ActivationStats(ddp, every=2)
    g1 = GradientMonitor(ddp)
    try:
        Join([s2, g1, ddp])
        out["steps"].append("built")
    except HookArgumentError:
        out["steps"].append("refused")
    g1.remove()
    g2 = GradientMonitor(ddp, every=2)
    try:
        for _ in range(2):
            with Join([s2, g2, ddp]):
                for x in batches(rank, _uneven(rank)):
                    ddp(x).square().sum().backward()
        out["steps"].append("ran")
    except Exception as e:
        out["steps"].append(f"{type(e).__name__}: {str(e)[:200]}")
    # nested: an inner Join of the same wrapper inside the outer
    try:
        with Join([s2, g2, ddp]):
            with Join([s2, g2, ddp]):
                for x in batches(rank, _uneven(rank)):
                    ddp(x).square().sum().backward()
        out["steps"].append("nested ran")
    except HookArgumentError:
        out["steps"].append("nested refused")
    except Exception as e:
        out["steps"].append(f"nested {type(e).__name__}: {str(e)[:200]}")
    out["history"] = list(s2.history)
    out["mon"] = [dict(h) for h in g2.history]
    return out


def shallow_both(rank, world):
    """`shallow` without unihook (the reference), then with it."""
    return {"errors": [], "plain": shallow(rank, world, False), "hooked": shallow(rank, world)}


def shallow(rank, world, hooked=True):
    """copy.copy(ddp) (a shallow copy; torch allows it) made while a synced recipe watched
    the wrapper, the recipe then removed: Join([twin]) with uneven inputs must run as it does
    without unihook (`shallow_both`), and nothing of unihook's is left on either wrapper."""
    import copy

    from torch.distributed.algorithms.join import Join

    from unihook.recipes import ActivationStats

    out = {"errors": []}
    ddp = nn.parallel.DistributedDataParallel(model())
    stats = ActivationStats(ddp) if hooked else None
    twin = copy.copy(ddp)
    if stats is not None:
        stats.remove()
    out["residue"] = ("join_hook" in vars(ddp), "join_hook" in vars(twin))
    try:
        with Join([twin]):
            for x in batches(rank, _uneven(rank)):
                twin(x).square().sum().backward()
        out["ran"] = True
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    return out


def held(rank, world):
    """The attack's cases that held: `join_builders`, `lifecycle`, `no_sync_wrappers`,
    `nobatch_order`, `compiled_join`, `every_refused`."""
    return {
        "errors": [],
        "builders": join_builders(rank, world),
        "lifecycle": lifecycle(rank, world),
        "no_sync": no_sync_wrappers(rank, world),
        "nobatch": nobatch_order(rank, world),
        "compiled": compiled_join(rank, world),
        "every": every_refused(rank, world),
    }


def every_no_sync(rank, world):
    """Uneven accumulation under DDP's no_sync() (2 micro-batches per step on rank 0, 3 on
    rank 1), first without unihook (DDP runs, mixing silently), then with ActivationStats and
    GradientMonitor at every=2 (README: every rank raises the same RankMismatchError)."""
    from unihook.recipes import ActivationStats, GradientMonitor
    from unihook.recipes._scope import RankMismatchError

    out = {"errors": []}
    for label in ("plain", "every=2"):
        ddp = nn.parallel.DistributedDataParallel(model())
        made = []
        if label != "plain":
            made = [ActivationStats(ddp, every=2), GradientMonitor(ddp, every=2)]
        accumulate = 2 + rank
        got = out[label] = []
        for micro, x in enumerate(batches(rank, 2 * accumulate)):
            last = micro % accumulate == accumulate - 1
            try:
                with contextlib.nullcontext() if last else ddp.no_sync():
                    ddp(x).square().sum().backward()
            except RankMismatchError:
                got.append("RankMismatchError")
                break
            except Exception as e:
                got.append(f"{micro}: {type(e).__name__}: {str(e)[:150]}")
                break
        for recipe in made:
            recipe.remove()
    return out


if __name__ == "__main__":
    from children import start_ranks

    scenario, world, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # a collective waits 30 s (one rank compiling while the other waits, on a loaded host);
    # the tests of scenarios known to hang (strict xfails) set 5
    timeout = float(os.environ.get("COLLECTIVE_TIMEOUT", "30"))
    start_ranks(lambda rank: globals()[scenario](rank, world), world, prefix, timeout=timeout)
