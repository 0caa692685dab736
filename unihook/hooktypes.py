"""The types of the public API: one Protocol per hook signature, and the `when` values.

The parameters are positional-only, so a hook may name its own as it likes; a type checker (an
editor) flags a hook of the wrong arity. Module, tensor and gradient types are `Any`: the same
hook runs on every framework. A return value of None keeps what the hook saw; the return rules
of each kind are in the README's spec table.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Protocol, Union

from .kinds import HookKind, ModuleKind

__all__ = [
    "BackwardHook",
    "BackwardPreHook",
    "ForwardHook",
    "ForwardHookWithKwargs",
    "ForwardPreHook",
    "ForwardPreHookWithKwargs",
    "HookKind",
    "ModuleKind",
    "NamedBackwardHook",
    "NamedBackwardPreHook",
    "NamedForwardHook",
    "NamedForwardHookWithKwargs",
    "NamedForwardPreHook",
    "NamedForwardPreHookWithKwargs",
    "RegistrationHook",
    "TensorHook",
    "When",
]

#: Checked at every call: None (always), "train" / "eval" (the module's mode), or a predicate.
When = Union[Literal["train", "eval"], Callable[[Any], bool], None]


class ForwardPreHook(Protocol):
    """``hook(module, args) -> None | new args`` (a non-tuple is wrapped into a 1-tuple)."""

    def __call__(self, module: Any, args: tuple[Any, ...], /) -> object: ...


class ForwardPreHookWithKwargs(Protocol):
    """``hook(module, args, kwargs) -> None | (new args, new kwargs)`` (``with_kwargs=True``)."""

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], /) -> object: ...


class ForwardHook(Protocol):
    """``hook(module, args, output) -> None | new output``."""

    def __call__(self, module: Any, args: tuple[Any, ...], output: Any, /) -> object: ...


class ForwardHookWithKwargs(Protocol):
    """``hook(module, args, kwargs, output) -> None | new output`` (``with_kwargs=True``)."""

    def __call__(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, /
    ) -> object: ...


class TensorHook(Protocol):
    """``hook(grad) -> None | new grad`` (same shape and dtype)."""

    def __call__(self, grad: Any, /) -> object: ...


class BackwardPreHook(Protocol):
    """``hook(module, grad_output) -> None | new grad_output`` (a tuple of the same length)."""

    def __call__(self, module: Any, grad_output: tuple[Any, ...], /) -> object: ...


class BackwardHook(Protocol):
    """``hook(module, grad_input, grad_output) -> None | new grad_input`` (same length)."""

    def __call__(
        self, module: Any, grad_input: tuple[Any, ...], grad_output: tuple[Any, ...], /
    ) -> object: ...


# `attach` passes the module's qualified name to a hook that takes a keyword parameter `name`
# (``def hook(module, args, output, *, name): ...``): these are the hooks above with it.


class NamedForwardPreHook(Protocol):
    """`ForwardPreHook` taking the qualified name: ``hook(module, args, *, name)`` (attach)."""

    def __call__(self, module: Any, args: tuple[Any, ...], /, *, name: str) -> object: ...


class NamedForwardPreHookWithKwargs(Protocol):
    """`ForwardPreHookWithKwargs` taking the qualified name (attach, ``with_kwargs=True``)."""

    def __call__(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], /, *, name: str
    ) -> object: ...


class NamedForwardHook(Protocol):
    """`ForwardHook` taking the qualified name: ``hook(module, args, output, *, name)``."""

    def __call__(
        self, module: Any, args: tuple[Any, ...], output: Any, /, *, name: str
    ) -> object: ...


class NamedForwardHookWithKwargs(Protocol):
    """`ForwardHookWithKwargs` taking the qualified name (attach, ``with_kwargs=True``)."""

    def __call__(
        self,
        module: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        /,
        *,
        name: str,
    ) -> object: ...


class NamedBackwardPreHook(Protocol):
    """`BackwardPreHook` taking the qualified name: ``hook(module, grad_output, *, name)``."""

    def __call__(self, module: Any, grad_output: tuple[Any, ...], /, *, name: str) -> object: ...


class NamedBackwardHook(Protocol):
    """`BackwardHook` taking the qualified name: ``hook(module, grad_input, grad_output, *,
    name)``."""

    def __call__(
        self,
        module: Any,
        grad_input: tuple[Any, ...],
        grad_output: tuple[Any, ...],
        /,
        *,
        name: str,
    ) -> object: ...


class RegistrationHook(Protocol):
    """``hook(module, name, value) -> None | replacement`` (a parameter, buffer or submodule)."""

    def __call__(self, module: Any, name: str, value: Any, /) -> object: ...
