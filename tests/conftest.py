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


def pytest_collection_finish(session: pytest.Session) -> None:
    # What the collection imported (the frameworks: millions of objects) is never collected
    # from here on: a full collection, the tests' own `gc.collect()` and the interpreter's,
    # scans only what came later (about 70 ms each with three frameworks loaded, otherwise).
    # Objects still die by their reference counts; a test's own cycles are all collectable.
    gc.collect()
    gc.freeze()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_backend(metafunc)
