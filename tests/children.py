"""Programs a test runs in a fresh interpreter (what may crash, hang, or change a process for
good): this checkout's `unihook` and `backends/` on the path, paddle's and MindSpore's logs
quiet. `run_code` returns what happened; `last_value` reads the literal it printed last.
`run_ranks` runs a script of gloo CPU ranks (tests/join_*_child.py), which start them with
`start_ranks` (this file is on their path: a script's own folder is)."""

from __future__ import annotations

import ast
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_code(
    code: str, *, timeout: float = 300, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) run by `python` (this one by default), its output captured; a run
    past `timeout` seconds raises `subprocess.TimeoutExpired`."""
    path = [str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path)), "GLOG_minloglevel": "2"}
    return subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def last_value(done: subprocess.CompletedProcess[str]) -> Any:
    """The Python literal the program printed last; it must have exited with 0."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def run_ranks(
    script: Path,
    args: Sequence[str],
    world: int,
    out: Path,
    bound: float,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """What each of the `world` ranks of `script ARGS... PREFIX` pickled (`start_ranks`, PREFIX
    in `out`), the script in a session of its own: past `bound` seconds the whole session is
    killed (the forked ranks too: killing the launcher alone leaves them holding the gloo
    ports), a HANG; a rank that pickled nothing (gloo aborted it) is a CRASH."""
    import pytest  # (here: the ranks import this file, not pytest)

    path = [str(ROOT), str(ROOT / "backends"), str(script.parent), os.getenv("PYTHONPATH")]
    environ = {
        **os.environ,
        "GLOG_minloglevel": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        **(env or {}),
    }
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "case"
    log = out / "output.txt"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(script), *args, str(prefix)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
        )
    try:
        process.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"HANG: the ranks did not finish within {bound} s:\n{log.read_text()[-3000:]}")
    found = []
    for rank in range(world):
        try:
            with open(f"{prefix}.rank{rank}.pkl", "rb") as f:
                found.append(pickle.load(f))
        except (OSError, EOFError):
            pytest.fail(f"CRASH: rank {rank} reported nothing:\n{log.read_text()[-3000:]}")
    for rank, got in enumerate(found):
        assert "fatal" not in got, f"rank {rank}: {got['fatal']}"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(main: Callable[[int], Any], world: int, prefix: str, timeout: float) -> None:
    """`main(rank)` on `world` gloo CPU ranks (a collective waits `timeout` seconds), forked:
    they start with torch imported (spawn imports it again in each: seconds). Each rank pickles
    what `main` returned, or `{"fatal": ...}` for what it raised, to PREFIX.rank<r>.pkl."""
    import torch.multiprocessing as mp

    args = (main, world, prefix, timeout, free_port())
    mp.start_processes(_rank, args=args, nprocs=world, start_method="fork")


def _rank(
    rank: int, main: Callable[[int], Any], world: int, prefix: str, timeout: float, port: int
) -> None:
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )
    try:
        res = main(rank)
    except BaseException as e:
        res = {"fatal": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"}
    with open(f"{prefix}.rank{rank}.pkl", "wb") as f:
        pickle.dump(res, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
