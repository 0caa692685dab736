"""The handle every registration returns."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Callable, TypeVar, cast

from ._plugins import escaped
from .kinds import KINDS, HookKind

_R = TypeVar("_R", bound="Removable")

__all__ = ["Handle", "Removable"]

_KINDS = frozenset(KINDS)
_removing = threading.Lock()  # two threads removing one handle: only one runs its remover


class Removable:
    """Something that removes hooks: `remove()`, and `with it:` removes on exit."""

    __slots__ = ()

    def remove(self) -> None:
        """Remove every hook this object placed."""
        raise NotImplementedError

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class Handle(Removable):
    """Removes one registered hook. `remove()` is idempotent; `with handle:` removes on exit.

    `backend` and `kind` say where the hook lives ("torch", "forward_pre"). A handle holds no
    strong reference to the hooked module or tensor (adapters pass a remover that uses weak
    references), so dropping the model frees it.
    """

    __slots__ = ("backend", "kind", "_remover", "__weakref__")

    #: The backend(s) the hook lives in: "torch", "paddle"; a global hook's: "paddle,torch".
    backend: str
    #: The kind of hook: "forward_pre", ..., "module_forward", "buffer_registration", ...
    kind: HookKind

    def __init__(self, backend: str, kind: str, remover: Callable[[], object]) -> None:
        if kind not in _KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}. Received: kind={kind!r}.")
        self.backend = backend
        self.kind = cast(HookKind, kind)  # checked above; backends pass plain strings
        self._remover: Callable[[], object] | None = remover

    @property
    def removed(self) -> bool:
        """Whether `remove()` has run."""
        return self._remover is None

    def remove(self) -> None:
        """Remove the hook; later calls do nothing. Cut short (a Ctrl-C), the removal still
        finishes before the KeyboardInterrupt goes on."""
        # Inside a compiled function the removal runs outside the compiler, as a registration
        # does (`add_compiler_escape`): traced, its lock and process-wide changes would be
        # traced side effects.
        escaped("removal", self._remove)

    def _remove(self) -> None:
        remover = None
        try:
            with _removing:
                remover, self._remover = self._remover, None
            if remover is not None:
                remover()
        except BaseException:
            if remover is not None:
                # Removers are idempotent and a second run finishes what the first left. If
                # that one is cut short too, the handle stays active: remove() again.
                self._remover = remover
                remover()
                self._remover = None
            raise

    def __repr__(self) -> str:
        state = "removed" if self.removed else "active"
        return f"<unihook.Handle {self.backend} {self.kind} {state}>"
