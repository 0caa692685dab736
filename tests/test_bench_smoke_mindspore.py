"""The benchmark's MindSpore rows (`make bench-mindspore`): `run.py --smoke` in the venv that
has MindSpore beside torch and paddle runs every case on MindSpore that MindSpore can run, with
finite times. No timing is asserted (smoke numbers mean nothing); `make test-mindspore` runs
this file."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OTHERS = [name for name in ("torch", "paddle") if importlib.util.find_spec(name) is not None]
# the cases of one framework, and those that compare the frameworks in the same rounds
OWN = ["per_call", "global_per_call", "capture/cnn", "capture/transformer", "capture_inplace/cnn"]
SHARED = {
    "backward/cnn": {"plain", "unihook"},
    "backward/transformer": {"plain", "unihook"},
    "tensor_hooks/fwd_bwd": {"plain", "native", "unihook"},
    "recipes/cnn": {"plain", "stats", "monitor", "stats off-step", "monitor off-step"},
}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mindspore") is None, reason="mindspore is not installed"
)


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


def _finite(summary: dict) -> bool:
    return all(math.isfinite(v) for v in summary["values"])


def test_mindspore_is_recorded(record: dict) -> None:
    assert record["versions"]["mindspore"]
    assert record["machine"]["threads"]["mindspore"] == "threads_num(1), launch_blocking()"


def test_mindspore_cases_ran(record: dict) -> None:
    cases = record["cases"]
    for case in OWN:
        variants = cases[f"{case}/mindspore"]["variants"]
        assert variants and all(_finite(s) and s["median"] > 0 for s in variants.values()), case
        for fw in OTHERS:  # side by side with the other frameworks, in one process
            assert f"{case}/{fw}" in cases
    for case, kinds in SHARED.items():
        variants = cases[case]["variants"]
        for kind in kinds:
            summary = variants[f"mindspore {kind}"]
            assert _finite(summary) and summary["median"] > 0, (case, kind)
        metrics = {n: m for n, m in cases[case]["metrics"].items() if "mindspore" in n}
        assert metrics and all(_finite(m) for m in metrics.values()), case


def test_backward_alone_is_skipped_with_its_reason(record: dict) -> None:
    case = record["cases"]["tensor_hooks/bwd"]
    assert not [n for n in case["variants"] if n.startswith("mindspore")]
    assert "not run on mindspore: functional autograd" in case["notes"]


def test_mindspore_targets_are_recorded(record: dict) -> None:
    rows = [r for r in record["targets"] if "mindspore" in r["case"] + r["metric"]]
    expected = {
        ("per_call/mindspore", "(unihook post x10 - native post x10) / 10 hooks"),
        ("capture/cnn/mindspore", "unihook capture / native dict"),
        ("backward/cnn", "(mindspore unihook / mindspore plain) / (torch native / torch plain)"),
        ("recipes/cnn", "mindspore monitor / mindspore plain"),
    }
    if "torch" not in OTHERS:
        expected = {row for row in expected if "torch" not in row[1]}
    assert expected <= {(r["case"], r["metric"]) for r in rows}
