"""The conformance matrix: every test that takes `backend` runs once per installed backend.

`backend` is that backend's conformance kit (``unihook.testing.Kit``), supplied by the backend
plugin itself, so the same suite runs against a third-party backend.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's C++ INFO logging
warnings.filterwarnings("ignore", message="No ccache found")

import pytest  # noqa: E402

from unihook._plugins import plugin_manager  # noqa: E402

KITS = [kit for kit in plugin_manager().hook.unihook_conformance_kit() if kit is not None]
KITS.sort(key=lambda kit: kit.name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", KITS, ids=[kit.name for kit in KITS])


def kit(name: str):  # type: ignore[no-untyped-def]
    """The kit of one backend, for differential tests (skips when it is not installed)."""
    for k in KITS:
        if k.name == name:
            return k
    pytest.skip(f"backend {name!r} is not installed")
