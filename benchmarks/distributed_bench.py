"""What merging the recipes' numbers across ranks costs per training step: ActivationStats and
GradientMonitor on every module of the CNN, and of a transformer whose learned positional
table [1, seq, d_model] is shared by every sample (its gradient sent whole), under torch's
DistributedDataParallel / paddle's DataParallel, 2 CPU ranks (gloo), with ``sync=True`` (one
all_gather at the end of each forward and one at the end of each backward) against
``sync=False`` (each rank's own numbers, no collective) and against the bare step. Both ranks
run the same variants in the same order (the harness's shuffle is seeded), so their
collectives pair up; rank 0's times are reported.

    python benchmarks/distributed_bench.py [--quick | --smoke] [--framework torch|paddle]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

WORLD = 2
ROUNDS = {"full": (20, 2, 3), "quick": (6, 1, 2), "smoke": (1, 1, 1)}  # rounds, warmup, repeats


def positional(fw: Any, sizes: Any) -> Any:
    """A learned positional table (a module returning its slice [1, seq, d_model], shared by
    every sample) added to the input of the benchmarks' transformer."""
    import models

    blocks = models.transformer(fw, sizes)
    shape = [1, sizes.seq, sizes.d_model]

    class Table(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            if fw.name == "torch":
                self.table = fw.t.nn.Parameter(fw.t.randn(*shape) * 0.02)
            else:
                self.table = self.create_parameter(shape)

        def forward(self, x: Any) -> Any:
            return self.table[:, : x.shape[1]]

    class Model(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.pos = Table()
            self.blocks = blocks

        def forward(self, x: Any) -> Any:
            return self.blocks(x + self.pos(x))

    return Model()


def case(fw: Any, model: Any, x: Any, sizes: Any, name: str = "cnn") -> Any:
    import numpy as np
    from harness import Body, Case, Cleanup, Metric, Setup, Variant, ratio

    from unihook import ops
    from unihook.recipes import ActivationStats, GradientMonitor

    update = fw.sgd(model, 1e-4)

    def step() -> None:
        fw.backward(model(x))
        update()

    def clear() -> None:
        fw.clear_grads(model)

    def with_recipes(sync: bool | None) -> Setup:
        def setup() -> tuple[Body, Cleanup]:
            recipes = [] if sync is None else [ActivationStats(model, sync=sync),
                                               GradientMonitor(model, sync=sync)]  # fmt: skip
            step()  # every variant times a step right after an untimed one
            clear()

            def cleanup() -> None:
                for recipe in recipes:
                    recipe.remove()
                clear()

            return step, cleanup

        return setup

    # what the merges of a step send, as the recipes send them: the vectors of the last of two
    # untimed synced steps (the first decides what is shared)
    modules = len(ops.named_modules(ops.unwrap(model)))
    sent: list[int] = []
    gather = ops.all_gather

    def record(vector: Any, like: Any) -> Any:
        sent.append(len(vector))
        return gather(vector, like)

    ops.all_gather = record  # type: ignore[assignment]
    try:
        with ActivationStats(model), GradientMonitor(model):
            step()
            sent.clear()
            step()
    finally:
        ops.all_gather = gather  # type: ignore[assignment]
    clear()
    vectors = [np.zeros(size) for size in sent]

    def gathers() -> tuple[Body, Cleanup]:
        return lambda: [ops.all_gather(v, like=model) for v in vectors], lambda: None

    p = f"{fw.name} {name}"
    synced, local = f"{p} recipes sync=True", f"{p} recipes sync=False"
    variants = [
        Variant(f"{p} plain", with_recipes(None)),
        Variant(f"{p} recipes sync=False", with_recipes(False)),
        Variant(f"{p} recipes sync=True", with_recipes(True)),
        Variant(f"{p} the all_gathers alone ({' + '.join(map(str, sent))} float64)", gathers),
    ]
    metrics = [
        Metric(f"{synced} - {local}", lambda t: t[synced] - t[local], "ms", None, {synced, local}),
        ratio(synced, local),
        ratio(synced, f"{p} plain"),
    ]
    shape = "x".join(str(n) for n in x.shape)
    return Case(
        f"distributed/{fw.name}/{name}",
        f"{fw.name}, 2 CPU ranks (gloo, data parallel): {name} training step, ActivationStats "
        f"and GradientMonitor on every module, merged across ranks or not",
        "ms",
        1e3,
        variants,
        metrics,
        f"per rank: input {shape}, {modules} modules, loss = output.sum(), SGD lr 1e-4; "
        f"rank 0's times",
    )


def rank_main(rank: int, framework: str, port: int, mode: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import frameworks
    import models
    import report
    from harness import Rounds, run_case

    fw: Any
    if framework == "torch":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
        )
        [fw] = frameworks.load(["torch"])
        fw.t.set_num_threads(1)
        wrap: Callable[[Any], Any] = fw.t.nn.parallel.DistributedDataParallel
    else:
        import paddle.distributed as pdist

        pdist.init_parallel_env()
        rank = pdist.get_rank()
        [fw] = frameworks.load(["paddle"])
        wrap = fw.p.DataParallel
    sizes = models.Sizes.smoke() if mode == "smoke" else models.Sizes()
    rounds, warmup, repeats = ROUNDS[mode]
    for name, build, make_input in (
        ("cnn", models.cnn, models.cnn_input),
        ("positional transformer", positional, models.transformer_input),
    ):
        fw.seed(rank)  # the ranks' own batches; DDP broadcasts rank 0's weights
        model = wrap(build(fw, sizes))
        fw.set_training(model, True)
        built = case(fw, model, make_input(fw, sizes), sizes, name)
        result = run_case(built, Rounds(rounds, warmup, repeats))
        if rank == 0:
            report.print_case(result)
    if framework == "torch":
        dist.barrier()
        dist.destroy_process_group()


def _paddle_rank(framework: str, port: int, mode: str) -> None:
    rank_main(-1, framework, port, mode)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true")
    speed.add_argument("--smoke", action="store_true")
    parser.add_argument("--framework", choices=["torch", "paddle"], action="append")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    for framework in args.framework or ["torch", "paddle"]:
        if framework == "torch":
            import torch.multiprocessing as mp

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(rank_main, args=(framework, port, mode), nprocs=WORLD)
        else:
            import paddle.distributed as pdist

            pdist.spawn(_paddle_rank, args=(framework, 0, mode), nprocs=WORLD, backend="gloo")
    return 0


if __name__ == "__main__":
    # Single-threaded kernels, set before any framework is imported (they read these at load).
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = "1"
    sys.exit(main(sys.argv[1:]))
