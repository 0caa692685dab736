"""How errors name a hook: kind, target, backend. Shared by the core and every adapter."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

_E = TypeVar("_E", bound=Exception)

__all__ = ["Site", "type_name"]


def type_name(obj: object) -> str:
    """`Linear`, `Tensor`, `float`: the short type name users recognise."""
    return type(obj).__name__


class Site(NamedTuple):
    """Where a hook sits: what error messages say about it.

    `name` is the qualified module name when the caller knows it (attach by pattern), else None
    and messages use the type name. `owner` names the framework for a hook registered through
    the framework's own API that a backend runs among unihook's (torch's module backward
    hooks), else None: a unihook hook.
    """

    kind: str
    backend: str
    target_type: str
    name: str | None = None
    owner: str | None = None

    @classmethod
    def of(cls, kind: str, backend: str, target: object, name: str | None = None) -> Site:
        return cls(kind, backend, type_name(target), name)

    def __str__(self) -> str:
        target = f"'{self.name}' ({self.target_type})" if self.name else self.target_type
        whose = f"{self.owner}'s own " if self.owner else ""
        return f"{whose}{self.kind} hook on {target} [backend {self.backend}]"

    def error(self, cls: type[_E], expected: str, received: str) -> _E:
        """`cls` with the standard message: site, what was expected, what was received."""
        return cls(f"{self}: expected {expected}. Received: {received}.")
