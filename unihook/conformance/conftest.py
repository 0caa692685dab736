"""The ``backend`` matrix: a test taking ``backend`` runs once per selected backend."""

from __future__ import annotations

import gc
import os
import warnings

# before any framework is imported: paddle's C++ INFO logging, its import-time ccache warning
os.environ.setdefault("GLOG_minloglevel", "2")
warnings.filterwarnings("ignore", message="No ccache found")

import pytest  # noqa: E402

from unihook.conformance import parametrize_backend  # noqa: E402

# the option, when pytest did not load it at start (PYTEST_DISABLE_PLUGIN_AUTOLOAD, a checkout
# without `pip install`): the name is the entry point's, so it is never registered twice
pytest_plugins: list[str] = ["unihook.conformance.plugin"]


def pytest_configure(config: pytest.Config) -> None:
    # a test importing paddle; paddle's BatchNorm at every training call
    for message in ("No ccache found", "When training, we now always track global mean"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}")


_file: list[object] = [None]  # the test file running


def pytest_runtest_setup(item: pytest.Item) -> None:
    # At the start of each test file, what lives (the frameworks, what earlier files made) is
    # never collected from here on: a full collection, the tests' own `gc.collect()` and the
    # interpreter's, scans only what came later (as tests/conftest.py does for tests/: this
    # suite ran first in `make test`'s MindSpore step, each collection 0.25 s there, two per
    # test of test_global_hooks). Objects still die by their reference counts; a test's own
    # cycles are all collectable.
    if item.path != _file[0]:
        _file[0] = item.path
        gc.collect()
        gc.freeze()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_backend(metafunc)
