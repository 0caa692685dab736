"""The `__name__` of the objects unihook places in a module's hook dicts.

A compiler that compiles a module's hooks from their source (torch.jit.script) reads each
hook's ``__name__`` first. The module it makes runs no Python hook: unihook's would be skipped
silently, and an object of unihook's without a name made the compiler fail with "'EagerUnderCompile'
object has no attribute '__name__'" (helper-178's FINDING 4). A backend names such a
compiler's reader (`add_hook_compiler`); read from there, a `HookName` raises
`ScriptedHookError` naming the hook, and from anywhere else there is none, as before (an
AttributeError: ``hasattr`` stays False, a debugger shows no made-up name).
"""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any, Callable, NamedTuple

from ._describe import Site
from .errors import ScriptedHookError

__all__ = ["HookName", "add_hook_compiler"]


class _Compiler(NamedTuple):
    name: str  # as messages say it
    module_local: str  # the reader's local variable that holds the module it compiles
    backend: str


_readers: dict[CodeType, _Compiler] = {}


def add_hook_compiler(reader: CodeType, compiler: str, module_local: str, backend: str) -> None:
    """`reader` (a code object) reads the name of each hook of the module in its local
    `module_local` to compile it with `compiler` ("torch.jit.script")."""
    _readers[reader] = _Compiler(compiler, module_local, backend)


class HookName:
    """``__name__ = HookName(refusal)`` in the class of an object placed as a hook:
    `refusal(obj, module, backend)` is the hook the error names and what it says was received
    ("a module with <that>", and what to do)."""

    __slots__ = ("refusal",)
    refusal: Callable[[Any, Any, str], tuple[Site, str]]

    def __init__(self, refusal: Callable[[Any, Any, str], tuple[Site, str]]) -> None:
        self.refusal = refusal

    def __get__(self, obj: Any, owner: type | None = None) -> str:
        # (read on the class, type's own `__name__` answers: this is reached for instances)
        frame = sys._getframe(1)
        compiler = _readers.get(frame.f_code)
        if compiler is None:
            raise AttributeError(f"'{type(obj).__name__}' object has no attribute '__name__'")
        module = frame.f_locals.get(compiler.module_local)
        site, received = self.refusal(obj, module, compiler.backend)
        raise site.error(
            ScriptedHookError,
            f"a module without unihook hooks when {compiler.name} compiles it: the module it "
            "makes runs no Python hook",
            f"{compiler.name} of a module with {received}",
        )
