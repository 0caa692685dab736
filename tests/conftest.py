"""The tests here that take `backend` run once per installed backend, as the shipped
conformance suite (``unihook/conformance``, also on `testpaths`) does; ``--unihook-backend
NAME`` or ``UNIHOOK_CONFORMANCE_BACKEND=NAME`` selects for both.
"""

from __future__ import annotations

import gc
import os
import warnings

os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO logging
warnings.filterwarnings("ignore", message="No ccache found")

import pytest  # noqa: E402

from unihook.conformance import parametrize_backend  # noqa: E402

pytest_plugins: list[str] = ["unihook.conformance.plugin"]  # the option, in a checkout


_file: list[object] = [None]  # the test file running


def pytest_runtest_setup(item: pytest.Item) -> None:
    # At the start of each test file, what lives (the frameworks the collection imported, and
    # what earlier files imported lazily: dynamo, FSDP, paddle's jit, 300k objects by the
    # conformance suite) is never collected from here on: a full collection, the tests' own
    # `gc.collect()` and the interpreter's, scans only what came later (0.5 s each by the end
    # of the dev suite otherwise, twice per test in the conformance suite's global hooks).
    # Objects still die by their reference counts; a test's own cycles are all collectable.
    if item.path != _file[0]:
        _file[0] = item.path
        gc.collect()
        gc.freeze()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_backend(metafunc)
