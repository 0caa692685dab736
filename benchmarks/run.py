"""unihook against native hooks (and optional peers), every variant in this one process.

    python benchmarks/run.py [--quick | --smoke] [--out PATH] [--cases GLOB]

See benchmarks/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Callable

# Single-threaded kernels, set before any framework is imported (they read these at load),
# unless `--threads default` keeps each framework's own: read here, before the imports.
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--threads", default="1")
if _early.parse_known_args()[0].threads == "1":
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_variable] = "1"

import cases  # noqa: E402
import compare_bench  # noqa: E402
import frameworks  # noqa: E402
import import_time  # noqa: E402
import models  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402
from harness import Case, CaseResult, Rounds, run_case  # noqa: E402
from models import Sizes  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


@dataclass(frozen=True)
class Mode:
    name: str
    # Short per-call samples over many rounds: machine drift cancels best within short rounds.
    per_call: Rounds
    calls: int  # per-call case: calls per sample
    forward: Rounds
    backward: Rounds  # the forward+backward cases, the slowest
    import_runs: int
    sizes: Sizes


MODES = {
    "full": Mode(
        "full", Rounds(100, 5, repeats=3), 500, Rounds(40, 4, repeats=3),
        Rounds(30, 3, repeats=3), 20, Sizes(),
    ),
    "quick": Mode(
        "quick", Rounds(20, 2, repeats=2), 500, Rounds(6, 1, repeats=2),
        Rounds(4, 1, repeats=2), 6, Sizes(),
    ),
    # The test suite's run: tiny models, 2 rounds (1 discarded), no meaningful numbers.
    "smoke": Mode(
        "smoke", Rounds(1, 1), 20, Rounds(1, 1), Rounds(1, 1), 1, Sizes.smoke(),
    ),
}  # fmt: skip


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer rounds (under 2 minutes)")
    speed.add_argument("--smoke", action="store_true", help="tiny sizes, 2 rounds (tests)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON record path")
    parser.add_argument(
        "--cases", metavar="GLOB", help="only the cases whose id matches, e.g. 'capture*'"
    )
    parser.add_argument(
        "--threads",
        choices=("1", "default"),
        default="1",
        help="1 (the default): every framework on one thread; default: the frameworks' own "
        "thread counts (where a library's thread pool can contend with theirs)",
    )
    return parser.parse_args(argv)


def single_thread(fws: list[frameworks.Framework]) -> dict[str, Any]:
    """Pin every framework to one thread; returns what each reports, for the record."""
    return {fw.name: fw.single_thread() for fw in fws}


def own_threads(fws: list[frameworks.Framework]) -> dict[str, Any]:
    """`--threads default`: each framework keeps its thread count; returns it, for the record."""
    return {fw.name: fw.own_threads() for fw in fws}


def build_cases(fws: list[frameworks.Framework], mode: Mode) -> list[tuple[Case, Rounds]]:
    s = mode.sizes
    planned = [(cases.per_call(fw, mode.calls), mode.per_call) for fw in fws]
    planned += [(cases.global_per_call(fw, mode.calls), mode.per_call) for fw in fws]
    if any(isinstance(fw, frameworks.Torch) for fw in fws):
        planned.append((cases.alias_ops(mode.calls), mode.per_call))
        planned.append((cases.beside_natives(mode.calls), mode.per_call))
    for label, build, make_input in (
        ("cnn", models.cnn, models.cnn_input),
        ("transformer", models.transformer, models.transformer_input),
    ):
        for fw in fws:
            fw.seed(0)
            planned.append(
                (cases.capture(fw, label, build(fw, s), make_input(fw, s)), mode.forward)
            )
        planned.append((cases.backward(fws, label, build, make_input, s), mode.backward))
    # figures without targets: the fixed cost of a hooked call, on layers cheaper than it
    planned.append(
        (cases.backward(fws, "small", models.small, models.small_input, s, False), mode.backward)
    )
    for fw in fws:
        fw.seed(0)
        model = models.cnn(fw, s, inplace=True)
        planned.append((cases.capture_inplace(fw, model, models.cnn_input(fw, s)), mode.forward))
    for register_in_timed in (False, True):
        planned.append((cases.tensor_hooks(fws, s, register_in_timed), mode.forward))
    compare_case = compare_bench.case(fws, s)  # None unless torch and paddle are loaded
    if compare_case is not None:
        planned.append((compare_case, compare_bench.rounds(mode.name)))
    planned.append((cases.recipes(fws, s), mode.backward))
    return planned


def peer_case(fws: list[frameworks.Framework], mode: Mode) -> tuple[Case | None, dict[str, Any]]:
    versions = peers.available()
    status = {
        name: {"status": "ok" if v else "skipped: not installed", "version": v}
        for name, v in versions.items()
    }
    torch = next((fw for fw in fws if isinstance(fw, frameworks.Torch)), None)
    if torch is None:
        return None, status
    torch.seed(0)
    model = models.cnn(torch, mode.sizes)
    return peers.case(torch, model, models.cnn_input(torch, mode.sizes), versions), status


def timed(label: str, action: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = action()
    print(f"   ({label}: {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return result


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    mode = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
    started = time.time()
    imports = timed("import", lambda: import_time.measure(mode.import_runs))
    report.print_import(imports)

    fws = frameworks.load()
    threads = single_thread(fws) if args.threads == "1" else own_threads(fws)
    # Both torch's native full backward hook and unihook's warn when no input of a module
    # requires grad (the first layer): same cost on both sides, silenced to keep output clean.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    planned = build_cases(fws, mode)
    peer, peer_status = peer_case(fws, mode)
    if peer is not None:
        planned.append((peer, mode.forward))
    if args.cases:
        planned = [(case, plan) for case, plan in planned if fnmatch(case.id, args.cases)]
    # Everything built so far lives for the whole run: keep it out of each sample's gc.collect.
    gc.collect()
    gc.freeze()

    results: list[CaseResult] = []
    for case, plan in planned:
        result = timed(case.id, lambda case=case, plan=plan: run_case(case, plan))
        report.print_case(result)
        results.append(result)
    report.print_skips(peer_status)

    record: dict[str, Any] = {
        "mode": mode.name,
        "plan": asdict(mode),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        **report.environment(threads),
        "cases": {r.case.id: report.case_record(r) for r in results},
        "import": report.import_record(imports),
        "peers": peer_status,
    }
    record["targets"] = report.targets(record)
    report.print_targets(record["targets"])
    report.write(record, args.out)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
