"""`make demo` runs `python -m unihook demo`: it must show identical numbers everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import KITS


def test_demo_shows_identical_numbers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unihook", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GLOG_minloglevel": "2"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Identical in every framework." in done.stdout
    assert "No ccache found" not in done.stdout + done.stderr
    for kit in KITS:
        assert kit.name in done.stdout
    # the seed model's numbers (SEMANTICS.md §4)
    assert "[[89.0]]" in done.stdout and "[[22.0, 26.0, 30.0]]" in done.stdout


def test_usage() -> None:
    done = subprocess.run([sys.executable, "-m", "unihook"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
