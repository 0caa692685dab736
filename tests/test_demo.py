"""`make demo` runs `python -m unihook demo`: it must show identical numbers everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import KITS


def test_demo_shows_identical_numbers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unihook", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GLOG_minloglevel": "2"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Identical in every framework." in done.stdout
    assert "No ccache found" not in done.stdout + done.stderr
    for kit in KITS:
        assert kit.name in done.stdout
    # the seed model's numbers (SEMANTICS.md §4)
    assert "[[89.0]]" in done.stdout and "[[22.0, 26.0, 30.0]]" in done.stdout
    # the Grad-CAM picture, computed in every framework
    picture = tmp_path / "demo-out" / "gradcam.png"
    assert "demo-out/gradcam.png" in done.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "INFO" not in done.stdout + done.stderr


def test_usage() -> None:
    done = subprocess.run([sys.executable, "-m", "unihook"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
