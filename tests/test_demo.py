"""`make demo` runs `python -m unihook demo`: it must show identical numbers everywhere. The
command line itself (help, version, exit codes) follows argparse's conventions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import KITS

import unihook


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
    if len(KITS) > 1:
        ran = " and ".join(sorted((k.name for k in KITS), key=lambda n: n != "torch"))
        assert f"Identical in every framework ({ran})." in done.stdout
    assert "No ccache found" not in done.stdout + done.stderr
    for kit in KITS:
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
    if len(KITS) > 1:  # the frameworks' gradient norms over 30 SGD steps agree
        within = done.stdout.split("norms within ")[1].split(" relative")[0]
        assert float(within) < 1e-3
    assert "INFO" not in done.stdout + done.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unihook", *args], capture_output=True, text=True, timeout=60
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
