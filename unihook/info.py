"""What `unihook.backends()` reports about each registered backend."""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple

from .kinds import KINDS, HookKind

__all__ = ["BackendInfo", "HookKind", "Support", "KINDS", "installed_version"]

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


@functools.cache  # metadata parsing costs milliseconds: global registrations ask every time
def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (no import), once per
    process."""
    import importlib.metadata  # lazily: it costs more than the rest of `import unihook`

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
