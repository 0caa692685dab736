"""MindSpore's asynchronous pipeline under backward hooks: a training loop's throughput.

    python benchmarks/mindspore_pipeline.py [--rounds 6] [--steps 30]

`benchmarks/run.py` syncs MindSpore after every timed step (`Framework.synced`), which times
each step's latency and takes away the overlap of Python with the queued kernels. A training
loop that does not read its loss every step keeps that overlap; a unihook sync inside the
backward (the version counters move in the pipeline, docs/MINDSPORE.md section 11) takes it
away again. This measures it: 5 x (Dense(16, 16) + Sigmoid), `value_and_grad` with respect to
the weights, no sync between steps; plain and hooked (a no-op full backward hook on every
cell) rounds alternate in one process. Prints hooked / plain per round and their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # (read when MindSpore loads)

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

import unihook  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cells = [c for _ in range(5) for c in (ms.nn.Dense(16, 16), ms.nn.Sigmoid())]
    net = ms.nn.SequentialCell(cells)
    x = ms.Tensor(np.ones((8, 16), np.float32))
    step = ms.value_and_grad(lambda x: net(x).sum(), None, net.trainable_params())

    def seconds_per_step() -> float:
        for _ in range(3):
            step(x)
        start = time.perf_counter()
        for _ in range(args.steps):
            step(x)
        return (time.perf_counter() - start) / args.steps

    ratios = []
    for _ in range(args.rounds):
        plain = seconds_per_step()
        handles = [unihook.register_full_backward_hook(c, lambda *a: None) for c in cells]
        ratios.append(seconds_per_step() / plain)
        for handle in handles:
            handle.remove()
        print(f"hooked / plain {ratios[-1]:.3f}  (plain {plain * 1e3:.2f} ms per step)")
    print(f"median hooked / plain {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
