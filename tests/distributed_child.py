"""Two CPU ranks (gloo) of torch DistributedDataParallel or paddle.DataParallel running unihook's
hooks and recipes, for tests/test_distributed.py; also the single-process scenarios it compares
them with.

    python tests/distributed_child.py {torch|paddle} OUTDIR [fail]
    python tests/distributed_child.py torch OUTDIR join

Each rank pickles what it saw to OUTDIR/rank<r>.pkl. `fail`: rank 1 raises before the recipes'
first collective (the launcher must end both ranks promptly). `join`: the ranks' batches are
uneven, the recipes in torch's Join (`join_scenario`), and a rank waits 20 s at most in a
collective (a hang fails the run then).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

import unihook
from unihook import HookArgumentError, ops
from unihook.recipes import (
    ActivationStats,
    GradientMonitor,
    NonFiniteGradientError,
    RankMismatchError,
    dump,
)

WORLD = 2
BATCH = 8  # global batch; each rank takes BATCH // WORLD rows
LR = 0.1
STEPS = 2
# the model: Linear(6, 8), ReLU, Sequential(Linear(8, 8), Tanh), Linear(8, 3)
SHAPES = [(8, 6), (8,), (8, 8), (8,), (3, 8), (3,)]  # torch layout (out, in)
# a rank waiting for a dead peer gives up after this: longer than the tests' bound, so that
# only the launcher can end a run with a failed rank in time
TIMEOUT = timedelta(seconds=300)


def weights() -> list[np.ndarray]:
    rng = np.random.default_rng(17)
    return [rng.normal(0, 0.5, shape).astype(np.float32) for shape in SHAPES]


def batch() -> tuple[np.ndarray, np.ndarray]:
    """The global batch and the loss coefficients: loss = sum(output * coefficients)."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (BATCH, 6)).astype(np.float32)
    return x, rng.normal(0, 1, (BATCH, 3)).astype(np.float32)


def rows(rank: int | None) -> slice:
    if rank is None:
        return slice(0, BATCH)
    part = BATCH // WORLD
    return slice(rank * part, (rank + 1) * part)


class Framework:
    """The few calls the scenarios make, per framework."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import torch

            self.t = torch
        else:
            import paddle

            self.p = paddle

    def model(self, values: list[np.ndarray]) -> Any:
        if self.name == "torch":
            nn = self.t.nn
            model = nn.Sequential(
                nn.Linear(6, 8),
                nn.ReLU(),
                nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
                nn.Linear(8, 3),
            )
            with self.t.no_grad():
                for param, value in zip(model.parameters(), values):
                    param.copy_(self.t.from_numpy(value))
            return model
        nn = self.p.nn
        model = nn.Sequential(
            nn.Linear(6, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3)
        )
        for param, value in zip(model.parameters(), values):
            param.set_value(value.T if value.ndim == 2 else value)  # paddle's weight is [in, out]
        return model

    def fill(self, model: Any, rng: np.random.Generator, scale: float = 0.5) -> None:
        """Every parameter of `model` drawn from N(0, `scale`) by `rng`, in its order."""
        for param in model.parameters():
            value = rng.normal(0, scale, tuple(param.shape)).astype(np.float32)
            if self.name == "torch":
                with self.t.no_grad():
                    param.copy_(self.t.from_numpy(value))
            else:
                param.set_value(value)

    def tensor(self, array: np.ndarray, grad: bool = False) -> Any:
        if self.name == "torch":
            return self.t.tensor(array, requires_grad=grad)
        t = self.p.to_tensor(array)
        t.stop_gradient = not grad
        return t

    def no_grad(self) -> Any:
        return self.t.no_grad() if self.name == "torch" else self.p.no_grad()

    def optimizer(self, model: Any, lr: float) -> Any:
        if self.name == "torch":
            return self.t.optim.SGD(model.parameters(), lr=lr)
        optimizer = self.p.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
        if type(model).__name__ == "ShardingParallel":
            from paddle.distributed import fleet

            return fleet.distributed_optimizer(optimizer)  # each rank updates its shard
        return optimizer

    def zero_grad(self, optimizer: Any) -> None:
        if self.name == "torch":
            optimizer.zero_grad()
        else:
            optimizer.clear_grad()

    def grads(self, model: Any) -> list[np.ndarray]:
        """The parameters' gradients in torch's layout."""
        found = []
        for param in model.parameters():
            grad = ops.to_numpy(param.grad)
            found.append(grad.T if self.name == "paddle" and grad.ndim == 2 else grad)
        return found

    def extra_module(self, model: Any) -> None:
        """A module more in `model`'s tree, with no parameters and not called by forward: a
        tree DistributedDataParallel accepts on one rank only (it compares parameters)."""
        if self.name == "torch":
            model.add_module("extra", self.t.nn.ReLU())
        else:
            model.add_sublayer("extra", self.p.nn.ReLU())

    def swap_activation(self, model: Any) -> None:
        """`model`'s module "1" a Tanh instead of a ReLU: a tree DDP accepts on one rank only."""
        nn = self.t.nn if self.name == "torch" else self.p.nn
        if self.name == "torch":
            model.add_module("1", nn.Tanh())
        else:
            model.add_sublayer("1", nn.Tanh())

    def own_groups(self) -> list[Any]:
        """A process group per rank holding that rank alone (every rank creates every group)."""
        if self.name == "torch":
            import torch.distributed as dist

            return [dist.new_group([rank]) for rank in range(WORLD)]
        import paddle.distributed as pdist

        return [pdist.new_group([rank]) for rank in range(WORLD)]

    def wrap(self, model: Any, how: str = "ddp", group: Any = None) -> Any:
        """`model` in DistributedDataParallel / paddle.DataParallel (`ddp`, over `group`, the
        default one when None), or sharded: torch's FSDP (`fsdp1`: one FullyShardedDataParallel
        unit; `fsdp1-units`: one unit per Linear by `auto_wrap_policy`; `fsdp2`: fully_shard on
        each Linear and the model), paddle's fleet sharding (`sharding`: sharding_degree 2)."""
        if how == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            return FullyShardedDataParallel(model, device_id=self.t.device("cpu"))
        if how == "fsdp1-units":
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            policy = ModuleWrapPolicy({self.t.nn.Linear})
            cpu = self.t.device("cpu")
            return FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=cpu)
        if how == "hsdp1":  # hybrid sharding: shard groups [0] / [1], replicate group [0, 1]
            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

            shard = self.own_groups()[int(self.t.distributed.get_rank())]
            replicate = self.t.distributed.new_group(list(range(WORLD)))
            return FullyShardedDataParallel(
                model,
                process_group=(shard, replicate),
                sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                device_id=self.t.device("cpu"),
            )
        if how == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for module in model.modules():
                if isinstance(module, self.t.nn.Linear):
                    fully_shard(module)
            return fully_shard(model)
        if how == "sharding":
            from paddle.distributed import fleet

            return fleet.distributed_model(model)
        if self.name == "torch":
            return self.t.nn.parallel.DistributedDataParallel(model, process_group=group)
        return self.p.DataParallel(model, group=group)


def _array(value: Any) -> Any:
    return None if value is None else ops.to_numpy(value)


def hook_scenario(fw: Framework, model: Any, rank: int | None) -> dict[str, Any]:
    """One forward and backward of `model` (a wrapper or the bare model) on the rank's rows with
    every hook kind on the inner model's modules, the global hooks, and (wrapped) hooks on the
    wrapper. Returns the hook calls in order and the parameters' gradients."""
    inner = ops.unwrap(model)
    names = {id(m): name for name, m in ops.named_modules(inner)}
    calls: list[tuple[str, str, list[Any]]] = []

    def label(module: Any) -> str:
        return names.get(id(module), "<wrapper>")

    def pre(module: Any, args: Any) -> None:
        calls.append(("forward_pre", label(module), [_array(args[0])]))

    def post(module: Any, args: Any, output: Any) -> None:
        calls.append(("forward", label(module), [_array(output)]))
        where = label(module)
        unihook.register_tensor_hook(output, lambda g: calls.append(("tensor", where, [_array(g)])))

    def backward_pre(module: Any, grad_output: Any) -> None:
        calls.append(("full_backward_pre", label(module), [_array(grad_output[0])]))

    def backward(module: Any, grad_input: Any, grad_output: Any) -> None:
        calls.append(
            ("full_backward", label(module), [_array(grad_input[0]), _array(grad_output[0])])
        )

    def global_post(module: Any, args: Any, output: Any) -> None:
        calls.append(("global_forward", label(module), [_array(output)]))

    def global_backward(module: Any, grad_input: Any, grad_output: Any) -> None:
        calls.append(("global_full_backward", label(module), [_array(grad_output[0])]))

    group = unihook.HookGroup()
    for name, module in ops.named_modules(inner):
        group.add(name, unihook.register_forward_pre_hook(module, pre))
        group.add(name, unihook.register_forward_hook(module, post))
        group.add(name, unihook.register_full_backward_pre_hook(module, backward_pre))
        group.add(name, unihook.register_full_backward_hook(module, backward))
    if model is not inner:  # on the wrapper too
        group.add("<wrapper>", unihook.register_forward_hook(model, post))
        group.add("<wrapper>", unihook.register_full_backward_hook(model, backward))
    group.add("", unihook.register_module_forward_hook(global_post))
    group.add("", unihook.register_module_full_backward_hook(global_backward))
    x, coefficients = batch()
    with group:
        out = model(fw.tensor(x[rows(rank)], grad=True))
        (out * fw.tensor(coefficients[rows(rank)])).sum().backward()
    return {"calls": calls, "grads": fw.grads(inner)}


class Writer:
    """A SummaryWriter that only counts what it is given."""

    def __init__(self) -> None:
        self.scalars = 0

    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = None) -> None:
        self.scalars += 1

    def add_histogram(self, tag: str, values: Any, global_step: int | None = None) -> None:
        pass


def recipe_scenario(
    fw: Framework, model: Any, rank: int | None, lr: float, inner: bool = False
) -> dict[str, Any]:
    """`STEPS` SGD steps of `model` on the rank's rows with ActivationStats and GradientMonitor,
    merged across ranks (`sync`, the default) and per rank (`sync=False`), given `model` or
    (`inner`) the model inside its wrapper."""
    x, coefficients = batch()
    x, coefficients = fw.tensor(x[rows(rank)]), fw.tensor(coefficients[rows(rank)])
    optimizer = fw.optimizer(model, lr)
    watched = ops.unwrap(model) if inner else model
    with (
        ActivationStats(watched) as stats,
        GradientMonitor(watched) as monitor,
        ActivationStats(watched, sync=False) as local_stats,
        GradientMonitor(watched, sync=False) as local_monitor,
    ):
        for _ in range(STEPS):
            (model(x) * coefficients).sum().backward()
            optimizer.step()
            fw.zero_grad(optimizer)
        writer, every_rank = Writer(), Writer()
        written = (stats.write(writer, 0), monitor.write(writer, 0))
        stats.write(every_rank, 0, all_ranks=True)
        monitor.write(every_rank, 0, all_ranks=True)
        return {
            "stats": stats.history,
            "rows": stats.rows(),
            "monitor": list(monitor.history),
            "local_stats": local_stats.history,
            "local_monitor": list(local_monitor.history),
            "written": written,
            "scalars": (writer.scalars, every_rank.scalars),
        }


def evaluation_between_scenario(
    fw: Framework, model: Any, rank: int, within: bool = False
) -> dict[str, Any]:
    """`recipe_scenario`'s steps with rank 0 alone evaluating the wrapper under no_grad before
    each (`within`: between each forward and its backward): the synced recipes must neither
    record nor count those forwards (nor wait in a collective for the other rank), so they
    report `recipe_scenario`'s numbers; `every=2` records step 0 only."""
    x, coefficients = batch()
    x, coefficients = fw.tensor(x[rows(rank)]), fw.tensor(coefficients[rows(rank)])
    optimizer = fw.optimizer(model, LR)

    def evaluate() -> None:
        if rank == 0:
            with fw.no_grad():
                model(x)

    with (
        ActivationStats(model) as stats,
        GradientMonitor(model) as monitor,
        ActivationStats(model, every=2) as sparse_stats,
        GradientMonitor(model, every=2) as sparse_monitor,
    ):
        for _ in range(STEPS):
            if not within:
                evaluate()
            out = model(x)
            if within:
                evaluate()
            (out * coefficients).sum().backward()
            optimizer.step()
            fw.zero_grad(optimizer)
        return {
            "stats": stats.history,
            "monitor": list(monitor.history),
            "sparse_stats": sparse_stats.history,
            "sparse_monitor": list(sparse_monitor.history),
        }


def removed_between_scenario(fw: Framework, model: Any, rank: int) -> list[Any]:
    """A GradientMonitor removed between a forward and its backward, rank 1 backpropagating
    the dummy loss of an empty batch: it records and merges nothing (no rank waits)."""
    x, coefficients = batch()
    monitor = GradientMonitor(model)
    out = model(fw.tensor(x[rows(rank)]))
    monitor.remove()
    if rank == 1:
        loss = sum(p.sum() for p in ops.unwrap(model).parameters()) * 0
    else:
        loss = (out * fw.tensor(coefficients[rows(rank)])).sum()
    loss.backward()
    return list(monitor.history)


def nonfinite_scenario(fw: Framework, model: Any, rank: int) -> dict[str, Any]:
    """A NaN in the loss coefficients of rank 1 only: every rank must raise the same error at
    the end of backward (rank 0 saw only finite gradients) and then train on."""
    x, coefficients = batch()
    bad = coefficients[rows(rank)].copy()
    if rank == 1:
        bad[1, 2] = np.nan
    messages = []
    with GradientMonitor(model) as monitor:
        for c in (bad, coefficients[rows(rank)]):
            try:
                (model(fw.tensor(x[rows(rank)])) * fw.tensor(c)).sum().backward()
            except NonFiniteGradientError as e:
                messages.append((str(e), e.module, e.rank, e.ranks))
        after = dict(monitor.history[-1])
    with GradientMonitor(model, on_nonfinite="warn"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        (model(fw.tensor(x[rows(rank)])) * fw.tensor(bad)).sum().backward()
    warned = [str(warning.message) for warning in w if warning.category is RuntimeWarning]
    return {
        "errors": messages,
        "after": after,
        "warned": warned,
        "stats": nan_stats(fw, model, rank),
    }


def dummy_loss_scenario(
    fw: Framework, model: Any, rank: int, monitor: Any = None
) -> dict[str, Any]:
    """Rank 1 has no samples and backpropagates the usual dummy loss (its parameters times 0),
    which reaches no module output: GradientMonitor must still take part in the merge, also
    one built (`monitor`, on the model inside `model`) before the process group was."""
    x, coefficients = batch()
    monitor = monitor if monitor is not None else GradientMonitor(model)
    with monitor, GradientMonitor(model, sync=False) as local, GradientMonitor(model, every=2):
        for _ in range(2):
            out = model(fw.tensor(x[rows(rank)]))
            if rank == 1:
                loss = sum(p.sum() for p in ops.unwrap(model).parameters()) * 0
            else:
                loss = (out * fw.tensor(coefficients[rows(rank)])).sum()
            loss.backward()
        return {"merged": list(monitor.history), "local": list(local.history)}


def evaluation_first_scenario(fw: Framework, model: Any, rank: int) -> list[dict[str, Any]]:
    """Rank 0 evaluates the inner model on its own before the first training forward: the
    merged rows count the training forwards only, the same on every rank."""
    x, coefficients = batch()
    with ActivationStats(model) as stats:
        if rank == 0:
            ops.unwrap(model)(fw.tensor(x[rows(rank)]))
        (model(fw.tensor(x[rows(rank)])) * fw.tensor(coefficients[rows(rank)])).sum().backward()
        return stats.rows()


def mismatch_scenario(fw: Framework, rank: int) -> dict[str, str]:
    """Rank 1's model has a module more (`extra`), or a Tanh where rank 0's has a ReLU
    (`types`), both with no parameters, so DDP accepts them; or rank 1 makes either change
    after the first merge (`late`, `late_types`, with every=2, which places its hooks anew on
    the modules it chose first): each synced recipe must raise RankMismatchError on every rank
    where the ranks watch different modules (not `late`: the module added is not watched),
    not hang, abort or merge the two."""
    x, coefficients = batch()
    found = {}
    for recipe in (ActivationStats, GradientMonitor):
        for case in ("extra", "types", "late", "late_types"):
            model = fw.model(weights())
            if rank == 1 and case == "extra":
                fw.extra_module(model)
            if rank == 1 and case == "types":
                fw.swap_activation(model)
            wrapped = fw.wrap(model)
            with recipe(wrapped, every=2 if case.startswith("late") else 1):
                try:
                    for step in range(3):
                        if rank == 1 and case == "late" and step == 1:
                            fw.extra_module(model)
                        if rank == 1 and case == "late_types" and step == 1:
                            fw.swap_activation(model)
                        out = wrapped(fw.tensor(x[rows(rank)]))
                        (out * fw.tensor(coefficients[rows(rank)])).sum().backward()
                except RankMismatchError as e:
                    found[f"{recipe.__name__} {case}"] = str(e)
    return found


def evaluation_with_grad_scenario(fw: Framework, rank: int) -> dict[str, Any]:
    """Rank 0 alone runs an evaluation-mode forward with gradients enabled (`model.eval()`
    without no_grad) between two training steps: its merge pairs with rank 1's next training
    forward, whose numbers must not mix with it. Both ranks raise the same RankMismatchError
    in that collective, then train on with their merges paired again."""
    x, coefficients = batch()
    wrapped = fw.wrap(fw.model(weights()))
    x, coefficients = fw.tensor(x[rows(rank)]), fw.tensor(coefficients[rows(rank)])
    errors = []
    with ActivationStats(wrapped) as stats:
        for step in range(3):
            try:
                if rank == 0 and step == 1:
                    wrapped.eval()
                    wrapped(x)
                    wrapped.train()
                (wrapped(x) * coefficients).sum().backward()
            except RankMismatchError as e:
                errors.append((step, str(e)))
                wrapped.train()
        return {"errors": errors, "rows": stats.rows()}


def accumulation_scenario(fw: Framework, rank: int) -> dict[str, Any]:
    """Gradient accumulation under the wrapper's `no_sync()`: a step of 2 micro-batches on
    both ranks (their merges pair: no error, as one process), then one of 2 on rank 0 and 3 on
    rank 1, whose second micro-batch (synced on rank 0, not on rank 1) would mix their numbers:
    the same RankMismatchError on both ranks there."""
    x, coefficients = batch()
    wrapped = fw.wrap(fw.model(weights()))
    x, coefficients = fw.tensor(x[rows(rank)]), fw.tensor(coefficients[rows(rank)])
    errors: list[tuple[int, str]] = []
    with ActivationStats(wrapped) as stats, GradientMonitor(wrapped) as monitor:
        for micro in range(2 + (2 + rank)):
            last = micro in (1, 3 + rank)
            try:
                with contextlib.nullcontext() if last else wrapped.no_sync():
                    (wrapped(x) * coefficients).sum().backward()
            except RankMismatchError as e:
                errors.append((micro, str(e)))
                break
        return {"errors": errors, "stats": len(stats.history), "monitor": len(monitor.history)}


def empty_where_scenario(fw: Framework, rank: int) -> dict[str, Any]:
    """Synced recipes watching no module: nothing recorded, as in one process."""
    x, coefficients = batch()
    wrapped = fw.wrap(fw.model(weights()))
    with (
        ActivationStats(wrapped, where=lambda name, module: False) as stats,
        GradientMonitor(wrapped, where=lambda name, module: False) as monitor,
    ):
        (wrapped(fw.tensor(x[rows(rank)])) * fw.tensor(coefficients[rows(rank)])).sum().backward()
        return {"rows": stats.rows(), "stats": stats.history, "monitor": list(monitor.history)}


def own_group_scenario(fw: Framework, rank: int) -> dict[str, Any]:
    """Each rank's wrapper runs over a group of its own (torch: compiled, as torch advises for
    DDP): the recipes merge over that group, that is not at all (so each rank keeps its own
    numbers, as with sync=False, and a NaN raises at its module as in one process), and each
    rank, its group's rank 0, writes."""
    own = fw.own_groups()[rank]
    if fw.name == "torch":
        wrapped = fw.t.compile(fw.wrap(fw.model(weights()), group=own), backend="eager")
    else:
        # paddle 3.3.1's DataParallel segfaults building its reducer over a one-rank gloo
        # group: the wrapper reduces over the default group, and says it runs over `own`
        wrapped = fw.wrap(fw.model(weights()))
        wrapped.group = own
    result = {"world": ops.world(wrapped), **recipe_scenario(fw, wrapped, rank, LR)}
    x, coefficients = batch()
    bad = coefficients[rows(rank)].copy()
    bad[0, 0] = np.nan
    with GradientMonitor(wrapped):
        try:
            (wrapped(fw.tensor(x[rows(rank)])) * fw.tensor(bad)).sum().backward()
        except NonFiniteGradientError as e:
            result["nan"] = (e.module, e.rank, e.ranks)
    return result


def nan_input() -> np.ndarray:
    """The global batch with a NaN in the first row of rank 1's part."""
    x = batch()[0].copy()
    x[rows(1).start, 4] = np.nan
    return x


def nan_stats(fw: Framework, model: Any, rank: int | None) -> dict[str, Any]:
    """ActivationStats of one forward of `model` on `nan_input`'s rows: the NaN spreads through
    that sample's activations (counted as non-finite, left out of the other statistics)."""
    with ActivationStats(model) as stats:
        model(fw.tensor(nan_input()[rows(rank)]))
        return stats.history[0]


def sharded_views(fw: Framework, model: Any) -> dict[str, Any]:
    """What hooks on the first Linear see of its weight under FSDP: per hook kind (and outside
    any call) the weight's type, its local shape and whether its storage holds values."""
    linear = dict(ops.named_modules(ops.unwrap(model)))["0"]
    seen: dict[str, Any] = {}

    def view(where: str) -> None:
        weight = linear.weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        seen[where] = (
            type(weight).__name__,
            tuple(local.shape),
            local.untyped_storage().size() > 0,
        )

    view("outside")
    x, coefficients = batch()
    with unihook.HookGroup() as group:
        group.add("0", unihook.register_forward_pre_hook(linear, lambda m, a: view("forward_pre")))
        group.add("0", unihook.register_forward_hook(linear, lambda m, a, o: view("forward")))
        group.add(
            "0", unihook.register_full_backward_hook(linear, lambda m, i, o: view("backward"))
        )
        (model(fw.tensor(x[rows(None)])) * fw.tensor(coefficients)).sum().backward()
    return seen


# Models whose outputs are not all per sample (README "Data parallel", unihook/recipes/_shared.py):
# per configuration, the rows each rank gets, each rank's sequence length, and what the model has.
SHARED_CONFIGS: dict[str, dict[str, Any]] = {
    "positional": {},  # a positional table [1, S, D], a per-sample copy, a tuple, calls twice
    "batch1": {"batches": (1, 1), "copy": False},  # one row per rank
    "uneven": {"batches": (3, 5)},
    "seq_first": {"seq": True, "copy": False},  # [S, B, D], a GRU (output, h_n [1, B, H])
    "lengths": {"lengths": (5, 7), "stats": False},  # each rank its own padded length
    "same_inputs": {"same": True},  # every rank gets the same rows
    "loss_inside": {"loss": True},  # the model returns its loss (a scalar)
    "infinite_table": {"infinite": True, "steps": 1},  # an Inf in the shared table
}
FEATURES, WIDTH = 4, 6


def shared_config(name: str) -> dict[str, Any]:
    found = {"batches": (4, 4), "lengths": (5, 5), "seq": False, "copy": True, "same": False}
    found.update(loss=False, stats=True, infinite=False, steps=STEPS)
    found.update(SHARED_CONFIGS[name])
    return found


def shared_model(fw: Framework, config: dict[str, Any]) -> Any:
    """embed (per sample), pos (a table slice shared by every sample), cls (a learned token
    repeated per sample), mix (a Linear on the table: shared, computed), act (called on
    per-sample rows, then on mix's output), pair (a tuple: per sample, shared), seq-first a GRU,
    head; the loss inside with `loss`."""
    seq, torch_ = config["seq"], fw.name == "torch"
    nn = fw.t.nn if torch_ else fw.p.nn
    base = nn.Module if torch_ else nn.Layer
    # one position more than the longest: paddle's slice of a parameter over its whole range is
    # the parameter itself, whose gradient sums the module's two calls
    longest = max(config["lengths"]) + 1

    def parameter(owner: Any, shape: tuple[int, ...]) -> Any:
        if torch_:
            return fw.t.nn.Parameter(fw.t.zeros(shape))
        return owner.create_parameter(list(shape))

    class Pos(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.table = parameter(self, (longest, 1, WIDTH) if seq else (1, longest, WIDTH))

        def forward(self, x: Any) -> Any:
            return self.table[: x.shape[0]] if seq else self.table[:, : x.shape[1]]

    class Cls(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.token = parameter(self, (1, 1, WIDTH))

        def forward(self, x: Any) -> Any:
            shape = (x.shape[0], 1, WIDTH)
            return self.token.expand(*shape) if torch_ else self.token.expand(list(shape))

    class Pair(base):  # type: ignore[misc, valid-type]
        def forward(self, a: Any, b: Any) -> Any:
            return a * 1.5, b * 0.5

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(FEATURES, WIDTH)
            self.pos = Pos()
            self.cls = Cls() if config["copy"] else None
            self.mix = nn.Linear(WIDTH, WIDTH)
            self.act = nn.Tanh()
            self.pair = Pair()
            if seq:
                self.rnn = nn.GRU(WIDTH, WIDTH) if torch_ else nn.GRU(WIDTH, WIDTH, time_major=True)
            self.head = nn.Linear(WIDTH, 3)

        def forward(self, x: Any, coefficients: Any = None) -> Any:
            h = self.embed(x) + self.pos(x)
            if self.cls is not None:
                h = h + self.cls(x)
            a, b = self.pair(self.act(h), self.act(self.mix(self.pos(x))))
            h = a + b
            if seq:
                out, last = self.rnn(h)
                h = out + last
            out = self.head(h)
            return out if coefficients is None else (out * coefficients).sum()

    model = Net()
    rng = np.random.default_rng(29)
    for param in model.parameters():
        value = rng.normal(0, 0.5, tuple(param.shape)).astype(np.float32)
        if config["infinite"] and tuple(param.shape) == tuple(model.pos.table.shape):
            value.reshape(-1)[3] = np.inf
        if torch_:
            with fw.t.no_grad():
                param.copy_(fw.t.from_numpy(value))
        else:
            param.set_value(value)
    return model


def shared_batch(config: dict[str, Any], rank: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, loss coefficients) of `rank`, or the global batch (None): the ranks' rows side
    by side, padded to the longest length with coefficients 0 (a padded position adds
    nothing to the loss). Seq-first: [S, B, ...]."""
    batches, lengths = config["batches"], config["lengths"]
    rng = np.random.default_rng(5)
    total, longest = sum(batches), max(lengths)
    x = rng.normal(0, 1, (total, longest, FEATURES)).astype(np.float32)
    c = rng.normal(0, 1, (total, longest, 3)).astype(np.float32)
    if config["same"]:
        x[batches[0] :], c[batches[0] :] = x[: batches[0]], c[: batches[0]]
    return rank_rows(x, c, batches, lengths, rank, config["seq"])


def rank_rows(
    x: np.ndarray, c: np.ndarray, batches: Any, lengths: Any, rank: int | None, seq: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The global batch's inputs and coefficients (the ranks' rows side by side): each rank's
    rows zeroed past its length (padding adds nothing to the loss), then `rank`'s rows cut to
    its length (None: all of them), seq-first with `seq`."""
    starts = np.cumsum([0, *batches])
    for r, length in enumerate(lengths):
        x[starts[r] : starts[r + 1], length:] = 0
        c[starts[r] : starts[r + 1], length:] = 0
    if rank is not None:
        part = slice(starts[rank], starts[rank + 1])
        x, c = x[part, : lengths[rank]], c[part, : lengths[rank]]
    if seq:
        x, c = x.transpose(1, 0, 2).copy(), c.transpose(1, 0, 2).copy()
    return x, c


def _kinds(recipe: Any) -> dict[Any, int]:
    """What the ranks decided of each output (unihook/recipes/_shared.py)."""
    slots = getattr(recipe, "_slots", None)
    return {} if slots is None else dict(slots.kinds)


def shared_scenario(fw: Framework, name: str, rank: int | None, how: str = "ddp") -> dict[str, Any]:
    """`SHARED_CONFIGS[name]`'s model trained with both recipes on the rank's rows (wrapped as
    `how` says: see `Framework.wrap`), or on the global batch (`rank` None: one process, the
    learning rate over the ranks)."""
    config = shared_config(name)
    model = shared_model(fw, config)
    wrapped = model if rank is None else fw.wrap(model, how)
    optimizer = fw.optimizer(wrapped, LR if rank is not None else LR / WORLD)
    x, c = shared_batch(config, rank)
    with ActivationStats(wrapped) as stats, GradientMonitor(wrapped) as monitor:
        for _ in range(config["steps"]):
            if config["loss"]:
                loss = wrapped(fw.tensor(x), fw.tensor(c))
            else:
                loss = (wrapped(fw.tensor(x)) * fw.tensor(c)).sum()
            loss.backward()
            optimizer.step()
            fw.zero_grad(optimizer)
        return {
            "stats": stats.history,
            "monitor": list(monitor.history),
            "kinds": (_kinds(stats), _kinds(monitor)),
        }


def branches_scenario(fw: Framework, rank: int | None) -> dict[str, Any]:
    """Two GradientMonitors watching different modules (`a`, `b` / `a`, `c`) of a model whose
    branch depends on the data (rank 0's rows go through `b`, rank 1's through `c`): each
    rank's hooks fire in another order, the monitors' merges must still pair. One process
    (`rank` None) runs the ranks' rows side by side, rank 0's through b, the others' through c."""
    torch_ = fw.name == "torch"
    nn = fw.t.nn if torch_ else fw.p.nn

    class Net(nn.Module if torch_ else nn.Layer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: Any, split: int) -> Any:  # rows before `split` through b
            h = self.a(x)
            loss = self.b(h[:split]).sum() if split else 0.0
            return loss + self.c(h[split:]).sum() if split < len(x) else loss

    model = Net()
    rng = np.random.default_rng(41)
    fw.fill(model, rng)
    if rank is None:
        wrapped = model
    elif torch_:
        wrapped = fw.t.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    else:
        wrapped = fw.p.DataParallel(model, find_unused_parameters=True)
    data = [rng.normal(0, 1, (2, 3)).astype(np.float32) for _ in range(WORLD)]
    with (
        GradientMonitor(wrapped, where=["a", "b"]) as first,
        GradientMonitor(wrapped, where=["a", "c"]) as second,
    ):
        if rank is None:
            model(fw.tensor(np.concatenate(data)), len(data[0])).backward()
        else:
            wrapped(fw.tensor(data[rank]), len(data[0]) if rank == 0 else 0).backward()
        return {"first": dict(first.history[-1]), "second": dict(second.history[-1])}


def skipped_loss_scenario(fw: Framework, rank: int | None, skipped: int) -> list[Any]:
    """Two forwards of the model (two views, a labeled and an unlabeled batch), one backward;
    rank 1 leaves forward `skipped`'s loss term out (no rows for it this step): that forward's
    outputs get no gradient there. With `skipped` 1, the last forward, its parameters' merge
    it there, and the ranks' two merges must pair in the same order (autograd runs the later
    forward's graph first). One process (`rank` None): each forward on the rows whose loss
    counts. (`skipped` 0 hangs: README, known limits.)"""
    torch_ = fw.name == "torch"
    nn = fw.t.nn if torch_ else fw.p.nn
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    rng = np.random.default_rng(43)
    fw.fill(model, rng)
    wrapped = model if rank is None else fw.wrap(model)
    data = [[rng.normal(0, 1, (2, d)).astype(np.float32) for d in (3, 3, 2)] for _ in range(WORLD)]
    with GradientMonitor(wrapped) as monitor:
        if rank is None:
            loss = None
            for forward in (0, 1):
                counted = [r for r in range(WORLD) if not (r == 1 and forward == skipped)]
                x = np.concatenate([data[r][forward] for r in counted])
                co = np.concatenate([data[r][2] for r in counted])
                term = (model(fw.tensor(x)) * fw.tensor(co)).sum()
                loss = term if loss is None else loss + term
        else:
            outs = [wrapped(fw.tensor(data[rank][forward])) for forward in (0, 1)]
            terms = [
                (out * fw.tensor(data[rank][2])).sum()
                for forward, out in enumerate(outs)
                if not (rank == 1 and forward == skipped)
            ]
            loss = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        loss.backward()
        return sorted(sorted(entry.items()) for entry in monitor.history)


def rank_main(rank: int, framework: str, out: str, port: int, fail: bool) -> None:
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore")
    fw = Framework(framework)
    early_model = fw.model(weights())
    early_monitor = GradientMonitor(early_model)  # before the process group exists
    if framework == "torch":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=TIMEOUT,
        )
    else:
        from paddle.distributed import fleet

        # fleet's groups for the sharding scenario; the default group (DataParallel) is all ranks
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "sharding_degree": WORLD}
        fleet.init(is_collective=True, strategy=strategy)
    assert ops.world(fw.tensor(np.zeros(1, np.float32))) == (rank, WORLD)
    result: dict[str, Any] = {"rank": rank}
    if fail:
        if rank == 1:  # (when: the test bounds the time from here to the launcher's end)
            Path(out, "failed_at").write_text(repr(time.time()))
            raise RuntimeError("rank 1 fails on purpose")
        recipe_scenario(fw, fw.wrap(fw.model(weights())), rank, LR)  # waits for rank 1
    result["hooks"] = hook_scenario(fw, fw.wrap(fw.model(weights())), rank)
    result["recipes"] = recipe_scenario(fw, fw.wrap(fw.model(weights())), rank, LR)
    result["nonfinite"] = nonfinite_scenario(fw, fw.wrap(fw.model(weights())), rank)
    result["dummy_loss"] = dummy_loss_scenario(fw, fw.wrap(fw.model(weights())), rank)
    result["dummy_loss_early"] = dummy_loss_scenario(fw, fw.wrap(early_model), rank, early_monitor)
    result["evaluation_first"] = evaluation_first_scenario(fw, fw.wrap(fw.model(weights())), rank)
    result["inner_recipes"] = recipe_scenario(fw, fw.wrap(fw.model(weights())), rank, LR, True)
    result["mismatch"] = mismatch_scenario(fw, rank)
    result["empty_where"] = empty_where_scenario(fw, rank)
    result["evaluation_with_grad"] = evaluation_with_grad_scenario(fw, rank)
    result["accumulation"] = accumulation_scenario(fw, rank)
    # `dump` per rank (README: the model inside the wrapper, one file per rank). The wrapper
    # must outlive it: paddle segfaults in a backward through the layers of a DataParallel
    # already freed (its reducer's hooks stay on their parameters), without unihook too
    x, _ = batch()
    wrapped = fw.wrap(fw.model(weights()))
    dump(ops.unwrap(wrapped), fw.tensor(x[rows(rank)]), Path(out) / f"dump{rank}.npz")
    result["evaluation_between"] = evaluation_between_scenario(
        fw, fw.wrap(fw.model(weights())), rank
    )
    result["evaluation_within"] = evaluation_between_scenario(
        fw, fw.wrap(fw.model(weights())), rank, within=True
    )
    result["removed_between"] = removed_between_scenario(fw, fw.wrap(fw.model(weights())), rank)
    result["own_group"] = own_group_scenario(fw, rank)
    result["shared"] = {name: shared_scenario(fw, name, rank) for name in SHARED_CONFIGS}
    result["branches"] = branches_scenario(fw, rank)
    result["skipped_loss"] = skipped_loss_scenario(fw, rank, 1)
    for how in (
        ("fsdp1", "fsdp1-units", "hsdp1", "fsdp2") if framework == "torch" else ("sharding",)
    ):
        result[f"{how}_recipes"] = recipe_scenario(fw, fw.wrap(fw.model(weights()), how), rank, LR)
        if how in ("fsdp1", "fsdp2"):
            result[f"{how}_views"] = sharded_views(fw, fw.wrap(fw.model(weights()), how))
        if how != "hsdp1":  # (see test_recipes_report_the_global_batch)
            result[f"{how}_shared"] = shared_scenario(fw, "positional", rank, how)
    with open(Path(out) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    if framework == "torch":
        close_torch_rank()


# torch's Join: each rank's batches (of 4 rows): rank 0 runs out first
JOIN_BATCHES = (3, 5)


def join_batches(rank: int, counts: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`counts[rank]` batches of (inputs, loss coefficients), 4 rows each."""
    rng = np.random.default_rng(40 + rank)
    return [
        (rng.normal(0, 1, (4, 6)).astype(np.float32), rng.normal(0, 1, (4, 3)).astype(np.float32))
        for _ in range(counts[rank])
    ]


def join_scenario(
    fw: Framework,
    rank: int | None,
    order: str = "recipes",
    counts: tuple[int, ...] = JOIN_BATCHES,
    throw: bool = False,
    accumulate: int = 1,
    every: int = 1,
    buffer: bool = False,
) -> dict[str, Any]:
    """torch: the ranks' `counts` batches in ``Join`` with ActivationStats and GradientMonitor
    (`order`: the recipes before the model, the monitor first, or the model first), an SGD step
    every `accumulate` batches (the others under DDP's no_sync), then (unless `throw`, which
    ends the Join when rank 0 runs out) one step of the global batch outside the Join;
    `buffer`: the model has a buffer (unused), which DDP broadcasts before each forward (the
    rank that ran out: in its join hook). `rank` None: one process, each iteration on the rows
    of the ranks that still had a batch."""
    model = fw.model(weights())
    if buffer:
        model.register_buffer("unused", fw.t.zeros(1))
    wrapped = model if rank is None else fw.wrap(model)
    optimizer = fw.optimizer(wrapped, LR / WORLD if rank is None else LR)
    if rank is None:
        parts = [join_batches(r, counts) for r in range(WORLD)]
        count = min(counts) if throw else max(counts)
        iterations = [
            (np.concatenate([p[i][0] for p in parts if i < len(p)]),
             np.concatenate([p[i][1] for p in parts if i < len(p)]))
            for i in range(count)
        ]  # fmt: skip
    else:
        iterations = join_batches(rank, counts)
    result: dict[str, Any] = {}
    with (
        ActivationStats(wrapped, every=every) as stats,
        GradientMonitor(wrapped, every=every) as monitor,
    ):
        joinables = {
            "recipes": [stats, monitor, wrapped],
            "monitor": [monitor, stats, wrapped],
            "model": [wrapped, stats, monitor],
        }[order]
        joined: Any = contextlib.nullcontext()
        try:
            if rank is not None:  # (a misuse is refused here, when the Join is built)
                from torch.distributed.algorithms.join import Join

                joined = Join(joinables, throw_on_early_termination=throw)
            with joined:
                for i, (x, coefficients) in enumerate(iterations):
                    step = (i + 1) % accumulate == 0
                    skip = rank is not None and not step
                    with wrapped.no_sync() if skip else contextlib.nullcontext():
                        (wrapped(fw.tensor(x)) * fw.tensor(coefficients)).sum().backward()
                    if step:
                        optimizer.step()
                        fw.zero_grad(optimizer)
        except (RuntimeError, HookArgumentError) as error:
            result["error"] = f"{type(error).__name__}: {error}"
        if not throw and "error" not in result:
            x, coefficients = batch()
            out = wrapped(fw.tensor(x[rows(rank)]))
            (out * fw.tensor(coefficients[rows(rank)])).sum().backward()
        result.update(stats=stats.history, rows=stats.rows(), monitor=list(monitor.history))
    return result


# the Join scenarios: join_scenario's arguments
JOIN_SCENARIOS: dict[str, dict[str, Any]] = {
    "recipes_first": {},
    "monitor_first": {"order": "monitor"},
    "every": {"every": 2},
    "no_sync": {"accumulate": 2, "counts": (4, 6)},
    # rank 0 runs out after its first batch: DDP rebuilds its buckets at the second forward
    "early_buffer": {"counts": (1, 3), "buffer": True},
    "throw": {"throw": True},
    "model_first": {"order": "model"},
}


def join_main(rank: int, out: str, port: int) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=20),
    )
    fw = Framework("torch")
    result = {name: join_scenario(fw, rank, **kw) for name, kw in JOIN_SCENARIOS.items()}
    with open(Path(out) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    close_torch_rank()


def close_torch_rank() -> None:
    """End a torch rank whose results are written: the group destroyed once both ranks are
    done, then the process gone without the interpreter's finalization. There gloo's worker
    threads may still hold finished work and its tensors, whose release then aborts the
    process now and then ("terminate called without an active exception", SIGABRT; seen once
    in CI: pytorch/pytorch#179291 describes it)."""
    import torch.distributed as dist

    dist.barrier()  # no rank closes its connections while the other still uses them
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _paddle_rank(framework: str, out: str, port: int, fail: bool) -> None:
    import paddle.distributed as pdist

    rank_main(pdist.get_rank(), framework, out, port, fail)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_port() -> int:
    """The first of the ports this run's ranks listen on: the test's (`UNIHOOK_TEST_PORT`, a
    block no other run started beside it picks), else a free one."""
    return int(os.environ.get("UNIHOOK_TEST_PORT") or 0) or free_port()


def spawn(fn: Any, args: tuple[Any, ...], framework: str, port: int, world: int = WORLD) -> None:
    """`fn(rank, *args)` on `world` ranks: torch's spawn, or paddle's with its trainers on
    ports `port`, `port + 1`, ... (paddle's own pick, free ports found by binding and closing
    them, raced the other runs' ranks starting at the same time: a store aborted)."""
    if framework == "torch":
        import torch.multiprocessing as mp

        # a rank that raises makes it terminate the others and raise here; forked, the ranks
        # start with torch imported (spawned, each imported it again: about 3 s of CPU each)
        mp.start_processes(fn, args=args, nprocs=world, start_method="fork")
    else:
        import paddle.distributed as pdist

        pdist.spawn(fn, args=args, nprocs=world, backend="gloo", started_port=port)


def main(argv: list[str]) -> None:
    framework, out = argv[0], argv[1]
    fail = argv[2:] == ["fail"]
    port = run_port()
    if argv[2:] == ["join"]:
        spawn(join_main, (out, port), framework, port)
    else:
        try:
            if framework == "torch":
                spawn(rank_main, (framework, out, port, fail), framework, port)
            else:
                spawn(_paddle_rank, (framework, out, 0, fail), framework, port)
        finally:  # (when the launcher let go of its ranks: see failed_at)
            Path(out, "ended_at").write_text(repr(time.time()))


if __name__ == "__main__":
    main(sys.argv[1:])
