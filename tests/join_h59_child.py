"""helper-59's attack on the Join check of 36abfd8 (tests/test_attack_h59.py): one scenario (a
function below, by name) on WORLD gloo CPU ranks; each rank pickles what happened (the
recipes' history, or the error it raised) to PREFIX.rank<r>.pkl.

    python tests/join_h59_child.py SCENARIO WORLD PREFIX
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join, Joinable

ROWS = 4


def model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(rank: int, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(ROWS, 6, generator=g) for _ in range(count)]


def train(ddp: nn.Module, xs: list[torch.Tensor]) -> None:
    for x in xs:
        ddp(x).square().sum().backward()


def uneven(rank: int) -> int:
    return 2 + rank  # rank 0 runs out first


def one_process(world: int) -> list:
    """ActivationStats' history of one process over the batches the ranks ran with `uneven`
    counts: each iteration on the rows of the ranks that still had a batch."""
    from unihook.recipes import ActivationStats

    plain = model()
    stats = ActivationStats(plain)
    parts = [batches(r, uneven(r)) for r in range(world)]
    for i in range(max(map(len, parts))):
        train(plain, [torch.cat([p[i] for p in parts if i < len(p)])])
    return list(stats.history)


class _Raises(Joinable):
    """A joinable whose hook raises (another library's, misconfigured): the Join is not built."""

    def __init__(self) -> None:
        super().__init__()

    def join_hook(self, **kwargs):
        raise RuntimeError("this joinable refuses on purpose")

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


def failed_join_then_join_without(rank, world):
    """Join([stats, ddp, bad]) fails (another joinable's hook raises) on every rank; the user
    goes on with Join([ddp]), the recipe left out: must be refused like any Join without it."""
    from unihook.recipes import ActivationStats

    ddp = nn.parallel.DistributedDataParallel(model())
    stats = ActivationStats(ddp)
    out = {"errors": []}
    try:
        Join([stats, ddp, _Raises()])
    except RuntimeError as e:
        out["errors"].append(f"first: {type(e).__name__}: {e}")
    try:
        with Join([ddp]):
            train(ddp, batches(rank, uneven(rank)))
    except Exception as e:
        out["errors"].append(f"second: {type(e).__name__}: {str(e)[:200]}")
    out["history"] = list(stats.history)
    return out


def recipe_made_inside_join(rank, world):
    """A recipe built inside `with Join([ddp])` (no recipe existed when the Join was built): it
    merges in that Join, which does not have it: a clear error on every rank, or right numbers."""
    from unihook.recipes import ActivationStats

    ddp = nn.parallel.DistributedDataParallel(model())
    out = {"errors": []}
    stats = None
    try:
        with Join([ddp]):
            stats = ActivationStats(ddp)
            train(ddp, batches(rank, uneven(rank)))
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    out["history"] = list(stats.history) if stats is not None else None
    return out


def second_wrapper(rank, world):
    """The model wrapped again (a new DDP, e.g. after loading a checkpoint) while a recipe given
    the first wrapper still watches it: a Join of the new wrapper without the recipe."""
    from unihook.recipes import ActivationStats

    inner = model()
    first = nn.parallel.DistributedDataParallel(inner)
    stats = ActivationStats(first)
    second = nn.parallel.DistributedDataParallel(inner)
    out = {"errors": []}
    try:
        with Join([second]):
            train(second, batches(rank, uneven(rank)))
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    out["history"] = list(stats.history)
    return out


def _steps(ddp: nn.Module, xs: list[torch.Tensor]) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for x in xs:
        ddp(x).square().sum().backward()
        opt.step()
        opt.zero_grad()


def _spread(module: nn.Module) -> float:
    """The largest difference of `module`'s parameters between the ranks (0: in sync)."""
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    found = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(found, flat)
    return max(float((f - found[0]).abs().max()) for f in found)


def deepcopied_twin(rank, world, unihook=True):
    """A DDP wrapper deep-copied while a recipe watched it (the recipe then removed), the copy
    trained in its own Join with uneven inputs: DDP's join post-hook must bring the copy's
    ranks back in sync, as it does where no recipe ever watched the original."""
    from unihook.recipes import ActivationStats

    ddp = nn.parallel.DistributedDataParallel(model())
    stats = ActivationStats(ddp) if unihook else None
    twin = copy.deepcopy(ddp)
    if stats is not None:
        stats.remove()
    out = {"errors": [], "own_attr": "join_hook" in vars(twin)}
    try:
        with Join([twin]):
            _steps(twin, batches(rank, uneven(rank)))
    except Exception as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    out["spread"] = _spread(twin)
    return out


def deepcopied_twin_original_gone(rank, world):
    """As `deepcopied_twin`, the original wrapper deleted before the copy's Join."""
    import gc

    from unihook.recipes import ActivationStats

    ddp = nn.parallel.DistributedDataParallel(model())
    stats = ActivationStats(ddp)
    twin = copy.deepcopy(ddp)
    stats.remove()
    del ddp, stats
    gc.collect()
    out = {"errors": []}
    try:
        with Join([twin]):
            _steps(twin, batches(rank, uneven(rank)))
    except BaseException as e:
        out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
    out["spread"] = _spread(twin)
    return out


def join_orders(rank, world):
    """Every list of up to four of {two synced recipes, one sync=False, one removed, the DDP
    wrapper}, in every order, each built as a Join (not entered): refused exactly where a synced,
    not removed recipe is missing or after the wrapper (README "Uneven inputs")."""
    import itertools

    from unihook.errors import HookArgumentError
    from unihook.recipes import ActivationStats, GradientMonitor

    ddp = nn.parallel.DistributedDataParallel(model())
    items = {
        "s": ActivationStats(ddp),
        "g": GradientMonitor(ddp),
        "n": ActivationStats(ddp, sync=False),
        "r": ActivationStats(ddp),
        "D": ddp,
    }
    items["r"].remove()
    out = {"errors": [], "wrong": [], "tried": 0}
    for k in range(1, 5):
        for names in itertools.permutations("sgnrD", k):
            if "D" not in names:
                continue
            listed = [items[n] for n in names]
            at = names.index("D")
            want = all(n in names[:at] for n in "sg")
            try:
                Join(listed)
                got = True
            except HookArgumentError:
                got = False
            except Exception as e:
                got = f"{type(e).__name__}: {str(e)[:100]}"
            out["tried"] += 1
            if got != want:
                out["wrong"].append(("".join(names), want, got))
    return out


def _fsdp_units(use_orig_params: bool) -> nn.Module:

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({nn.Linear})
    return FSDP(
        model(),
        auto_wrap_policy=policy,
        device_id=torch.device("cpu"),
        use_orig_params=use_orig_params,
    )


def fsdp_units_summary(rank, world):
    """summary of an FSDP1 model with a unit per Linear (the units left out of the rows since
    36abfd8): each row's parameter count must be the plain model's, not a rank's flat shard."""
    from unihook.recipes import summary

    out = {"errors": []}
    x = torch.randn(2, 6)
    want = [(r.name, r.params) for r in summary(model(), x).rows]
    for orig in (False, True):
        try:
            got = [(r.name, r.params) for r in summary(_fsdp_units(orig), x).rows]
        except Exception as e:
            got = f"{type(e).__name__}: {str(e)[:200]}"
        out[f"use_orig_params={orig}"] = (got, want)
    return out


def fsdp_units_copy_weights(rank, world):
    """copy_weights from a plain model into an FSDP1 model with units, and back: every tensor
    paired, the numbers the plain model's (or a clear error), never a tensor silently left."""
    from unihook.recipes import copy_weights

    out = {"errors": []}
    for orig in (False, True):
        fsdp = _fsdp_units(orig)
        source = model()
        with torch.no_grad():
            for p in source.parameters():
                p.add_(1.0)
        try:
            pairs = copy_weights(source, fsdp)
        except Exception as e:
            out[f"orig={orig}"] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        x = torch.randn(2, 6)
        out[f"orig={orig}"] = (pairs, float((fsdp(x) - source(x)).abs().max()))
    return out


def _wrapped_kinds(kind: str) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    def linear(m: nn.Module) -> bool:
        return isinstance(m, nn.Linear)

    if kind.startswith("fsdp1"):
        wrapped = _fsdp_units("orig" in kind)
        apply_activation_checkpointing(wrapped, check_fn=linear)
        return wrapped
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        inner = model()
        inner[0] = checkpoint_wrapper(inner[0])
        fully_shard(inner[0])
        inner[2] = torch.compile(inner[2], backend="eager")
        return fully_shard(inner)
    inner = model()
    inner[0] = checkpoint_wrapper(torch.compile(inner[0], backend="eager"))
    inner[2] = torch.compile(checkpoint_wrapper(inner[2]), backend="eager")
    return nn.parallel.DistributedDataParallel(inner)


KINDS = ("fsdp1-flat", "fsdp1-orig", "fsdp2", "ddp")


def wrapped_parts_recipes(rank, world):
    """ActivationStats and GradientMonitor (synced) on sharded / data-parallel models whose
    parts are checkpoint-wrapped and compiled: one forward+backward of each rank's batch."""
    from unihook.recipes import ActivationStats, GradientMonitor

    out = {"errors": []}
    for kind in KINDS:
        try:
            wrapped = _wrapped_kinds(kind)
            stats, monitor = ActivationStats(wrapped), GradientMonitor(wrapped)
            for x in batches(rank, 2):
                wrapped(x).square().sum().backward()
            out[kind] = (list(stats.history), [dict(h) for h in monitor.history])
        except Exception as e:
            out[kind] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def wrapped_parts_reference(world: int) -> tuple[list, list]:
    from unihook.recipes import ActivationStats, GradientMonitor

    plain = model()
    stats, monitor = ActivationStats(plain), GradientMonitor(plain)
    parts = [batches(r, 2) for r in range(world)]
    for i in range(2):
        plain(torch.cat([p[i] for p in parts])).square().sum().backward()
    return list(stats.history), [dict(h) for h in monitor.history]


def removed_then_raised_then_plain_join(rank, world, unihook=True, fresh=False, remove=True):
    """The recipe first in a Join removed inside it, then an exception on every rank leaves
    that Join (no post-hook); the next epoch's Join([ddp]) has no recipe left: it must run as
    plain DDP's (README: the removed recipe keeps telling "until the next Join is built")."""
    from unihook.recipes import ActivationStats

    ddp = nn.parallel.DistributedDataParallel(model())
    stats = ActivationStats(ddp) if unihook else None
    out = {"errors": []}
    try:
        with Join([stats, ddp] if unihook else [ddp]):
            for i, x in enumerate(batches(rank, 3)):
                if i == 1 and stats is not None and remove:
                    stats.remove()
                if i == 2:
                    raise KeyError("stop the epoch on every rank")
                ddp(x).square().sum().backward()
    except KeyError as e:
        out["errors"].append(f"first: {e}")
    fresh_stats = ActivationStats(ddp) if fresh else None
    try:
        listed = [fresh_stats] if fresh else [] if remove else [stats]
        with Join([*listed, ddp]):
            _steps(ddp, batches(rank, uneven(rank)))
    except Exception as e:
        out["errors"].append(f"second: {type(e).__name__}: {str(e)[:200]}")
    out["spread"] = _spread(ddp)
    return out


def removed_then_raised_then_recipe_join(rank, world):
    """As above, the next Join with a recipe made after the exception."""
    return removed_then_raised_then_plain_join(rank, world, fresh=True)


def raised_kept_then_same_join(rank, world):
    """As above, the recipe not removed: the next epoch's Join has it again."""
    return removed_then_raised_then_plain_join(rank, world, remove=False)


def raised_plain_control(rank, world):
    """`removed_then_raised_then_plain_join` without unihook (the reference)."""
    return removed_then_raised_then_plain_join(rank, world, unihook=False)


def deepcopied_twins(rank, world):
    """`deepcopied_twin` without unihook (the reference), then with it."""
    return {
        "errors": [],
        "plain": deepcopied_twin(rank, world, unihook=False),
        "hooked": deepcopied_twin(rank, world),
    }


def held(rank, world):
    """The attack's cases that held: `join_orders`, `wrapped_parts_recipes`,
    `fsdp_unit_targets`."""
    return {
        "errors": [],
        "orders": join_orders(rank, world),
        "parts": wrapped_parts_recipes(rank, world),
        "cams": fsdp_unit_targets(rank, world),
    }


def cnn() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    )


def fsdp_unit_targets(rank, world):
    """GradCAM on FSDP1 units (one per Conv2d, flat and use_orig_params), its target given as
    the unit, its name, or the module inside: each rank's map is the plain model's on its
    input."""
    import numpy as np
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from unihook.recipes import GradCAM

    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(rank))
    want = GradCAM(cnn(), "2")(x)
    out = {"errors": []}
    for orig in (False, True):
        fsdp = FSDP(
            cnn(),
            auto_wrap_policy=ModuleWrapPolicy({nn.Conv2d}),
            device_id=torch.device("cpu"),
            use_orig_params=orig,
        )
        unit = fsdp.module[2]
        for label, target in (("unit", unit), ("name", "2"), ("inner", unit.module)):
            try:
                got = GradCAM(fsdp, target)(x)
                out[f"{orig}-{label}"] = float(np.abs(got - want).max())
            except Exception as e:
                out[f"{orig}-{label}"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


if __name__ == "__main__":
    from children import start_ranks

    scenario, world, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # a collective waits 30 s (one rank compiling while the other waits, on a loaded host);
    # the tests of scenarios known to hang (strict xfails) set 5
    timeout = float(os.environ.get("COLLECTIVE_TIMEOUT", "30"))
    start_ranks(lambda rank: globals()[scenario](rank, world), world, prefix, timeout=timeout)
