"""The conformance suite: torch's hook semantics, checked on every installed backend.

Run it from any directory (it needs pytest and hypothesis: ``pip install "unihook[test]"``)::

    pytest --pyargs unihook.conformance                          # every installed backend
    pytest --pyargs unihook.conformance --unihook-backend NAME   # one, or several: a,b

``UNIHOOK_CONFORMANCE_BACKEND=NAME`` selects as ``--unihook-backend`` does. A test that takes
the ``backend`` fixture runs once per selected backend (test id ``[NAME]``) with that backend's
conformance kit (`unihook.testing.Kit`, from its ``unihook_conformance_kit`` hookimpl); a test
comparing backends uses `kits`, and skips with fewer than two. ``import unihook`` never imports
this package.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from .. import testing
from ..testing import Kit

if TYPE_CHECKING:
    import pytest

__all__ = ["BACKEND_ENV", "installed_kits", "kit", "kits", "parametrize_backend"]

#: Comma-separated backend names the suite runs on (default: every installed backend).
BACKEND_ENV = "UNIHOOK_CONFORMANCE_BACKEND"


def kits() -> list[Kit]:
    """The kits of the selected backends, sorted by name; `LookupError` names a selected
    backend that is not installed."""
    return list(_selected(os.environ.get(BACKEND_ENV, "")))


def installed_kits() -> list[Kit]:
    """Every installed backend's kit, whatever is selected: what a hook registered for every
    backend (a global hook's default) reaches."""
    return list(_selected(""))


@functools.lru_cache(maxsize=None)
def _selected(names: str) -> tuple[Kit, ...]:
    # one kit object per backend for the whole run, as its tests expect
    every = _installed()
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    missing = wanted - {k.name for k in every}
    if missing:
        raise LookupError(
            f"{BACKEND_ENV}/--unihook-backend names {', '.join(sorted(missing))}, not an "
            f"installed backend (installed: {', '.join(k.name for k in every) or 'none'})"
        )
    return tuple(k for k in every if not wanted or k.name in wanted)


@functools.lru_cache(maxsize=None)
def _installed() -> tuple[Kit, ...]:
    return tuple(testing.kits())


def kit(name: str) -> Kit:
    """The kit of backend `name`; skips the calling test when that backend is not selected."""
    import pytest

    for k in kits():
        if k.name == name:
            return k
    pytest.skip(f"backend {name!r} is not installed or not selected")


def parametrize_backend(metafunc: pytest.Metafunc) -> None:
    """``pytest_generate_tests`` of a suite whose tests take ``backend`` (this one's conftest,
    a project's own): one run per selected backend, its name as the test id."""
    if "backend" not in metafunc.fixturenames:
        return
    import pytest

    try:
        selected = kits()
    except LookupError as error:
        pytest.fail(str(error), pytrace=False)
    metafunc.parametrize("backend", selected, ids=[k.name for k in selected])
