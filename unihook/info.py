"""What `unihook.backends()` reports about each registered backend."""

from __future__ import annotations

import functools
import re
from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple

from .kinds import KINDS, HookKind

__all__ = ["BackendInfo", "HookKind", "Support", "KINDS", "installed_version", "older_than"]

Support = Literal["native", "emulated", "unsupported"]


class BackendInfo(NamedTuple):
    """A backend as `unihook.backends()` lists it."""

    name: str
    framework: str
    version: str | None
    kinds: Mapping[HookKind, Support] = MappingProxyType({})

    @property
    def installed(self) -> bool:
        """Whether the framework is installed (its version is known)."""
        return self.version is not None

    def support(self, kind: HookKind) -> Support:
        """How this backend runs hooks of `kind`."""
        return self.kinds.get(kind, "unsupported")


def older_than(installed: str, minimum: str) -> bool:
    """Whether version `installed` ("2.12.1+cpu", "3.2.0.post1") is below `minimum`; False when
    either has no release number or `installed` is a source build's 0.0.0."""
    found, least = _release(installed), _release(minimum)
    return found is not None and least is not None and any(found) and found < least


def _release(version: str) -> tuple[int, ...] | None:
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else None


@functools.cache  # metadata parsing costs milliseconds: global registrations ask every time
def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (no import), once per
    process."""
    import importlib.metadata  # lazily: it costs more than the rest of `import unihook`

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
