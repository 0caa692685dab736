"""`import unihook` in a fresh interpreter, against a bare interpreter start measured the same way.

Both commands run once per round in shuffled order; the per-round difference is what unihook's
import costs. The first round (cold file cache) is discarded. Bytecode caching is on, as in a
normal install: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) and no
__pycache__, every run would compile unihook's sources and time the compiler instead.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass

from harness import Summary, Target

IMPORT_TARGET = Target(30.0, "< 30 ms")
COMMANDS = {
    "bare": "pass",
    "import unihook": "import unihook",
}
IGNORED_ENV = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}
# Run once, untimed: the measured import must not pull a framework in.
CHECK = "import sys, unihook; bad = {'torch', 'paddle'} & set(sys.modules); assert not bad, bad"


def _wall_ms(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return (time.perf_counter() - start) * 1e3


@dataclass
class ImportResult:
    runs: int
    times_ms: dict[str, Summary]  # per command: wall time of the whole interpreter run
    added_ms: Summary  # per round: "import unihook" - "bare"
    target: Target = IMPORT_TARGET


def measure(runs: int) -> ImportResult:
    env = {k: v for k, v in os.environ.items() if k not in IGNORED_ENV}
    subprocess.run([sys.executable, "-c", CHECK], env=env, check=True)  # also writes bytecode
    rng = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for index in range(runs + 1):
        order = list(COMMANDS.items())
        rng.shuffle(order)
        times = {name: _wall_ms(code, env) for name, code in order}
        if index > 0:
            for name, ms in times.items():
                samples[name].append(ms)
    added = Summary.of([u - b for u, b in zip(samples["import unihook"], samples["bare"])])
    return ImportResult(runs, {name: Summary.of(v) for name, v in samples.items()}, added)
