"""The shipped conformance suite runs from any directory: ``pytest --pyargs
unihook.conformance`` with ``--unihook-backend NAME`` or ``UNIHOOK_CONFORMANCE_BACKEND``
selecting the backends, as a third-party backend's repository runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from unihook.conformance import BACKEND_ENV, kit


def _pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`python -m pytest --pyargs unihook.conformance ARGS` in `cwd`: exit status and output."""
    clean = {k: v for k, v in os.environ.items() if k not in (BACKEND_ENV, "PYTEST_ADDOPTS")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "unihook.conformance",
            "-p",
            "no:cacheprovider",
        ]
        + list(args),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**clean, **(env or {})},
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def test_the_option_selects_one_backend_from_any_directory(tmp_path: Path) -> None:
    kit("torch")
    out = _pytest(tmp_path, "--unihook-backend", "torch", "-v", "-k", "test_backend_of")
    assert out.startswith("exit 0\n"), out
    assert "test_registration.py::test_backend_of[torch] PASSED" in out
    assert "[paddle]" not in out and "1 passed" in out


def test_the_environment_selects_and_an_unknown_backend_is_named(tmp_path: Path) -> None:
    kit("torch")
    out = _pytest(
        tmp_path, "-q", "--collect-only", "-k", "test_backend_of", env={BACKEND_ENV: "torch"}
    )
    assert out.startswith("exit 0\n") and "test_backend_of[torch]" in out, out
    assert "[paddle]" not in out
    out = _pytest(tmp_path, "-q", "--unihook-backend", "jax", "-k", "test_backend_of")
    assert not out.startswith("exit 0\n")
    assert "names jax, not an installed backend (installed: " in out, out
