"""The ``--unihook-backend`` option, a pytest plugin (entry point ``pytest11``), so that
``pytest --pyargs unihook.conformance --unihook-backend NAME`` parses from any directory: the
suite's conftest is found only after the command line is parsed.

Kept cheap and inert for other projects' pytest runs: it adds the option and, when given,
sets `BACKEND_ENV`; the ``backend`` matrix lives in the suite's conftest.
"""

from __future__ import annotations

import os

import pytest

from . import BACKEND_ENV


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--unihook-backend",
        metavar="NAME",
        help=f"run unihook's conformance tests on this backend only (comma-separated names; "
        f"default: ${BACKEND_ENV}, else every installed backend)",
    )


def pytest_configure(config: pytest.Config) -> None:
    selected = config.getoption("unihook_backend", None)
    if selected:
        os.environ[BACKEND_ENV] = selected  # kits() reads it, here and in subprocesses
