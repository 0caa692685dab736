"""The public API as a type checker sees it: tests/typing/attach_calls.py holds calls of
`unihook.attach` that pyright must accept and calls it must flag (``# pyright: ignore`` with
reportUnnecessaryTypeIgnoreComment on: a call no longer flagged is an error too)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import get_args

import pytest

import unihook
from unihook.kinds import KIND_INFO, MODULE_KINDS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PYRIGHT = Path(sys.executable).parent / "pyright"  # requirements-dev.txt (`make lint`)


def test_pyright_accepts_and_flags_what_attach_calls_expects() -> None:
    if not PYRIGHT.exists():
        pytest.skip("pyright is not installed (requirements-dev.txt has it; the test extra not)")
    sample = HERE / "attach_calls.py"
    expected = sample.read_text().count("# pyright: ignore")
    assert expected >= 10
    done = subprocess.run(
        [str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable, str(sample)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    report = json.loads(done.stdout)
    problems = [
        f"line {d['range']['start']['line'] + 1}: {d['message']}"
        for d in report["generalDiagnostics"]
    ]
    assert report["summary"]["filesAnalyzed"] == 1, done.stdout + done.stderr
    assert problems == [], "\n".join(problems)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is 3.11+")
def test_attach_overloads_follow_the_kind_table() -> None:
    """Each kind has overloads, and their option parameters are exactly the kind's options in
    unihook.kinds.KIND_INFO (the table the run-time check reads)."""
    options_of: dict[str, set[str]] = {}
    for overload in typing.get_overloads(unihook.attach):
        hints = typing.get_type_hints(overload, globalns=vars(sys.modules["unihook.compose"]))
        (kind,) = get_args(hints["kind"])
        names = set(inspect.signature(overload).parameters) - {
            "model",
            "hook",
            "kind",
            "where",
            "when",
        }
        options_of.setdefault(kind, set()).update(names)
    assert options_of == {k: set(KIND_INFO[k].options) for k in MODULE_KINDS}
    implementation = inspect.signature(unihook.attach).parameters
    for option in ("prepend", "with_kwargs", "always_call"):
        assert implementation[option].kind is inspect.Parameter.KEYWORD_ONLY
