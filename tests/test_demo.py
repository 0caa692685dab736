"""`make demo` runs `python -m unihook demo`: it must show identical numbers everywhere. The
command line itself (help, version, exit codes) follows argparse's conventions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import unihook
from unihook.testing import kits


def test_demo_shows_identical_numbers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unihook", "demo", "--out", "pictures"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GLOG_minloglevel": "2"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if len(kits()) > 1:
        names = sorted((k.name for k in kits()), key=lambda n: n != "torch")
        ran = f"{', '.join(names[:-1])} and {names[-1]}"  # "torch and paddle", "a, b and c"
        assert f"Identical in every framework ({ran})." in done.stdout
    assert "No ccache found" not in done.stdout + done.stderr
    for kit in kits():
        assert kit.name in done.stdout
    # the seed model's numbers (SEMANTICS.md §4)
    assert "[[89.0]]" in done.stdout and "[[22.0, 26.0, 30.0]]" in done.stdout
    # the Grad-CAM picture, computed in every framework
    picture = tmp_path / "pictures" / "gradcam.png"
    assert "pictures/gradcam.png" in done.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the recipes' plot over training steps, next to it (issue 14)
    training = tmp_path / "pictures" / "training.png"
    assert "pictures/training.png" in done.stdout
    assert training.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if len(kits()) > 1:  # the frameworks' gradient norms over 30 SGD steps agree
        within = done.stdout.split("norms within ")[1].split(" relative")[0]
        assert float(within) < 1e-3
    assert "INFO" not in done.stdout + done.stderr


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unihook", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_usage() -> None:
    done = _cli()  # a command is required: argparse's usage error
    assert done.returncode == 2 and "usage: unihook" in done.stderr


def test_help_and_version_go_to_stdout() -> None:
    done = _cli("--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: unihook") and "demo" in done.stdout
    demo = _cli("demo", "--help")
    assert demo.returncode == 0 and "--out DIR" in demo.stdout and "./unihook-demo" in demo.stdout
    assert "Seed model" not in demo.stdout
    version = _cli("--version")
    assert (version.returncode, version.stdout) == (0, f"unihook {unihook.__version__}\n")


def test_no_framework_is_an_error_on_stderr_that_names_unihook_disable(tmp_path: Path) -> None:
    env = {"UNIHOOK_DISABLE": "torch,paddle,mindspore"}
    done = _cli("demo", "--out", "out", env=env, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "No framework to run the demo on: torch, paddle, mindspore disabled by UNIHOOK_DISABLE; "
        "unset UNIHOOK_DISABLE to use the disabled ones.\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_out_that_cannot_be_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    """Checked before the demo runs: one line on stderr, exit 2, no traceback."""
    file = tmp_path / "picture.png"
    file.write_text("not a directory")
    for out, problem in [
        (file, "exists and is not a directory"),
        (file / "sub" / "dir", f"cannot be created: {file} is not a directory"),
    ]:
        done = _cli("demo", "--out", str(out), cwd=tmp_path)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"unihook demo: error: --out {out}: {problem}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]


def test_out_check_creates_nothing_and_asks_the_file_system(tmp_path: Path) -> None:
    from unihook.__main__ import out_dir_problem

    locked = tmp_path / "locked"
    locked.mkdir()
    assert out_dir_problem(str(locked / "a" / "b")) is None  # nothing created to find out
    assert list(locked.iterdir()) == []
    problem = out_dir_problem("/proc/unihook-demo")  # no directory can be made in /proc
    if os.path.isdir("/proc/self"):
        assert problem is not None and problem.startswith("cannot be created in /proc: ")


def test_backend_table_says_not_installed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from unihook import api, demo
    from unihook.info import BackendInfo

    infos = [
        BackendInfo("paddle", "paddle", None),  # as unihook.backends() reports a missing one
        BackendInfo("torch", "torch", "2.13.0", {"forward": "native"}),
    ]
    monkeypatch.setattr(api, "backends", lambda: infos)
    demo._print_backends()
    rows = capsys.readouterr().out.splitlines()
    forward = next(r for r in rows if r.split()[0] == "forward")
    assert forward.split() == ["forward", "not", "installed", "native"]
    tensor = next(r for r in rows if r.split()[0] == "tensor")
    assert tensor.split() == ["tensor", "not", "installed", "unsupported"]
