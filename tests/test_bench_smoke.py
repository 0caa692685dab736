"""The benchmark runs end to end and writes a complete record. No timing is asserted: the smoke
mode's tiny sizes and two rounds give meaningless numbers by design."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = [name for name in ("torch", "paddle") if importlib.util.find_spec(name) is not None]
SUMMARY_KEYS = {"median", "q1", "q3", "min", "max", "values"}

pytestmark = pytest.mark.skipif(not FRAMEWORKS, reason="neither torch nor paddle is installed")


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "latest.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "GLOG_minloglevel": "2"},
        check=True,
        timeout=120,
        capture_output=True,
    )
    return json.loads(out.read_text())


def test_environment_is_recorded(record: dict) -> None:
    assert record["mode"] == "smoke"
    assert {"python", "torch", "paddlepaddle", "unihook", "numpy"} <= set(record["versions"])
    assert {"platform", "cpu_count", "cpu_model", "threads"} <= set(record["machine"])
    assert record["machine"]["threads"]["OMP_NUM_THREADS"] == "1"


def test_every_case_is_recorded(record: dict) -> None:
    expected = {"backward/cnn", "backward/transformer", "tensor_hooks/bwd", "tensor_hooks/fwd_bwd"}
    for fw in FRAMEWORKS:
        expected |= {f"per_call/{fw}", f"capture/cnn/{fw}", f"capture/transformer/{fw}"}
    assert expected <= set(record["cases"])
    for case in record["cases"].values():
        assert {"title", "unit", "variants", "metrics"} <= set(case)
        assert case["variants"] and case["metrics"]
        for summary in [*case["variants"].values(), *case["metrics"].values()]:
            assert SUMMARY_KEYS <= set(summary)


def test_targets_import_and_peers_are_recorded(record: dict) -> None:
    assert SUMMARY_KEYS <= set(record["import"]["added_ms"])
    assert set(record["peers"]) == {"nnsight", "transformer-lens"}
    for peer in record["peers"].values():
        assert peer["status"] == "ok" or peer["status"].startswith("skipped")
    assert record["targets"]
    for row in record["targets"]:
        assert {"case", "metric", "median", "target", "met"} <= set(row)
        assert isinstance(row["met"], bool)


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch is not installed")
def test_frameworks_own_threads(tmp_path: Path) -> None:
    """`--threads default` leaves each framework its own thread count (where a library's
    thread pool can contend with it) and records it; the default run pins one thread."""
    out = tmp_path / "threads.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--smoke",
            "--threads",
            "default",
            "--cases",
            "recipes*",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**env, "GLOG_minloglevel": "2"},
        check=True,
        timeout=120,
        capture_output=True,
    )
    # (the recorded OMP_NUM_THREADS may say 1: importing paddle sets it, after torch read it)
    threads = json.loads(out.read_text())["machine"]["threads"]
    own = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert threads["torch"] == int(own.stdout.split()[-1])
