"""Programs a test runs in a fresh interpreter (what may crash, hang, or change a process for
good), or in a fork of a zygote that imported the frameworks they import first (`preloads`,
`Forked`): this checkout's `unihook` and `backends/` on the path, paddle's and MindSpore's
logs quiet. `run_code` returns what happened; `last_value` reads the literal it printed last.
`run_ranks` runs a script of gloo CPU ranks (tests/join_*_child.py), which start them with
`start_ranks` (this file is on their path: a script's own folder is)."""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_code(
    code: str,
    *args: str,
    timeout: float = 300,
    python: str = sys.executable,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) run by `python` (this one by default) as ``python -c code ARGS...``,
    its output captured; a run past `timeout` seconds raises `subprocess.TimeoutExpired`. Code
    that imports torch or paddle before doing anything else (`preloads`) runs in a fork of a
    zygote that imported them once (`Forked`; torch's import takes about 3 s of CPU), unless
    `fresh`."""
    env = child_env()
    code = textwrap.dedent(code)
    preloaded = () if fresh else preloads(code)
    if preloaded:
        with tempfile.TemporaryDirectory() as out:
            forked = Forked(
                preloaded, ["-c", *args], env, Path(out, "stdout"), Path(out, "stderr"),
                code=code, python=python,
            )  # fmt: skip
            try:
                forked.wait(timeout)
            except subprocess.TimeoutExpired:
                forked.kill()
                raise
            return subprocess.CompletedProcess(
                ["-c", code, *args],
                forked.wait(),
                Path(out, "stdout").read_text(errors="replace"),
                Path(out, "stderr").read_text(errors="replace"),
            )
    return subprocess.run(
        [python, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


# what a zygote may import ahead of a program, in the program's own order (not MindSpore:
# importing paddle first breaks its import, and its import was not tried in a fork)
_PRELOADABLE = ("numpy", "torch", "paddle")
# and the modules of theirs a zygote imports too where a program does (torch._dynamo's import
# takes about 2 s of CPU beside torch's 3); not others, which give a zygote of their own each
_PRELOADABLE_MODULES = ("torch._dynamo",)


def preloads(code: str) -> tuple[str, ...]:
    """The frameworks `code` imports before running anything else (and ``torch._dynamo`` where
    it imports that there): its leading import statements, read up to the first module that is
    neither the standard library's nor preloadable (a zygote importing those first gives the
    program the state its own imports would). A call ignoring every warning among them
    (``warnings.filterwarnings("ignore")``, or ``simplefilter``) is read past: the program's
    stderr shows none of what the imports warn either way (the zygote's imports warn on its own
    stderr), and its filters end with "ignore" first, the filters the imports added (none that
    raises) after it."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return ()
    found: list[str] = []
    for statement in body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # (a docstring)
        if _ignores_warnings(statement):
            continue
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            names = [statement.module]
        else:
            break
        for name in names:
            top = name.partition(".")[0]
            if top in _PRELOADABLE:
                # the framework, and dynamo where the program imports it there (in its order)
                heavy = [m for m in _PRELOADABLE_MODULES if f"{name}.".startswith(f"{m}.")]
                for module in (top, *heavy):
                    if module not in found:
                        found.append(module)
            elif top not in sys.stdlib_module_names:
                return tuple(found)
    return tuple(found)


def _ignores_warnings(statement: ast.stmt) -> bool:
    """`statement` is ``warnings.filterwarnings("ignore")`` or ``warnings.simplefilter("ignore")``
    exactly."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "warnings"
        and call.func.attr in ("filterwarnings", "simplefilter")
        and not call.keywords
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == "ignore"
    )


def child_env() -> dict[str, str]:
    """A child's environment: this checkout's `unihook` and `backends/` on its path, paddle's
    and MindSpore's logs quiet."""
    path = [str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")]
    joined = os.pathsep.join(filter(None, path))
    return {**os.environ, "PYTHONPATH": joined, "GLOG_minloglevel": "2"}


class Forked:
    """A program run in a fork of a zygote (tests/zygote.py) that imported `preloaded`: like
    ``subprocess.Popen([python, "-c", code])`` (`argv` ``["-c"]``) or ``Popen([python, FILE,
    ...])`` (`argv` ``[FILE, ...]``, no `code`), output to the files given, in a session of its
    own with `session`. One zygote per interpreter, modules and environment, for the whole
    test session."""

    _zygotes: dict[tuple[Any, ...], subprocess.Popen[bytes]] = {}

    def __init__(
        self,
        preloaded: Sequence[str],
        argv: Sequence[str],
        env: Mapping[str, str],
        stdout: Path,
        stderr: Path,
        *,
        code: str | None = None,
        python: str = sys.executable,
        session: bool = False,
    ) -> None:
        # (not pytest's name of the test running, which changes at each test: a zygote per
        # test, its imports paid again; no program reads it)
        env = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}
        key = (python, tuple(preloaded), tuple(sorted(env.items())))
        zygote = self._zygotes.get(key)
        if zygote is None or zygote.poll() is not None:
            zygote = self._zygotes[key] = subprocess.Popen(
                [python, str(ROOT / "tests" / "zygote.py"), ",".join(preloaded)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        self._zygote = zygote
        self._session = session
        self._buffer = b""
        request = {
            "argv": list(argv),
            "code": code,
            "filename": None if code is not None else argv[0],
            "cwd": os.getcwd(),
            "stdout": str(stdout),
            "stderr": str(stderr),
            "session": session,
        }
        assert zygote.stdin is not None
        zygote.stdin.write((json.dumps(request) + "\n").encode())
        zygote.stdin.flush()
        self.pid: int = self._message(None)["pid"]
        self.returncode: int | None = None

    def _message(self, timeout: float | None) -> dict[str, Any]:
        fd = self._zygote.stdout.fileno()  # type: ignore[union-attr]
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired(["zygote", str(self.pid)], timeout or 0.0)
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the zygote ended ({self._zygote.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (minus the signal's number for a signal, as Popen's); past `timeout`
        seconds `subprocess.TimeoutExpired`."""
        if self.returncode is None:
            self.returncode = int(self._message(timeout)["status"])
        return self.returncode

    @classmethod
    def end_zygotes(cls) -> None:
        """At exit: each zygote ends at the end of its input (a zombie no more)."""
        for zygote in cls._zygotes.values():
            with contextlib.suppress(OSError):
                zygote.stdin.close()  # type: ignore[union-attr]
            try:
                zygote.wait(10)
            except subprocess.TimeoutExpired:
                zygote.kill()
                zygote.wait()

    def kill(self) -> None:
        """SIGKILL to its session (with `session`) or to it, then wait."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if self._session else os.kill)(self.pid, signal.SIGKILL)
            self.wait()


atexit.register(Forked.end_zygotes)


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
    argv = [str(script), *args, str(prefix)]
    # (the scripts import torch first: forked from a zygote that did, see run_code)
    process = Forked(preloads(script.read_text()), argv, environ, log, log, session=True)
    try:
        process.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        process.kill()
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
