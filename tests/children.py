"""Programs a test runs in a fresh interpreter (what may crash, hang, or change a process for
good): this checkout's `unihook` and `backends/` on the path, paddle's and MindSpore's logs
quiet. `run_code` returns what happened; `last_value` reads the literal it printed last."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
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
