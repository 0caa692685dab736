"""What `unihook.backends()` reports about each registered backend."""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal, Mapping, NamedTuple

__all__ = ["BackendInfo", "Support", "KINDS", "installed_version"]

Support = Literal["native", "emulated", "unsupported"]

#: Every hook kind of the spec, in the order tables list them: per object, then global.
KINDS: tuple[str, ...] = (
    "forward_pre",
    "forward",
    "tensor",
    "full_backward_pre",
    "full_backward",
    "module_forward_pre",
    "module_forward",
    "module_full_backward_pre",
    "module_full_backward",
    "parameter_registration",
    "buffer_registration",
    "module_registration",
)


class BackendInfo(NamedTuple):
    """A backend as `unihook.backends()` lists it."""

    name: str
    framework: str
    version: str | None
    kinds: Mapping[str, Support] = MappingProxyType({})

    @property
    def installed(self) -> bool:
        return self.version is not None

    def support(self, kind: str) -> Support:
        return self.kinds.get(kind, "unsupported")


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, read from its metadata (no import)."""
    import importlib.metadata  # lazily: it costs more than the rest of `import unihook`

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
