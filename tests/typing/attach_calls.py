"""Calls of `unihook.attach` that a type checker (an editor) must accept, and calls it must flag.

Not run: tests/typing/test_typing.py runs pyright on this file. Each call that must be flagged
carries ``# pyright: ignore``; with reportUnnecessaryTypeIgnoreComment on, a call that is
no longer flagged (a looser signature) is an error too, so pyright reports nothing exactly when
every expectation holds.
"""

# pyright: standard, reportUnnecessaryTypeIgnoreComment=true

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

from unihook import HookGroup, ModuleKind, attach

model: Any = object()


def forward(module: Any, args: tuple[Any, ...], output: Any) -> None: ...
def forward_named(module: Any, args: tuple[Any, ...], output: Any, *, name: str) -> None: ...
def forward_kwargs(module: Any, args: tuple[Any, ...], kw: dict[str, Any], out: Any) -> None: ...
def pre(module: Any, args: tuple[Any, ...]) -> None: ...
def pre_named(module: Any, args: tuple[Any, ...], *, name: str) -> None: ...
def pre_kwargs(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...
def backward_pre(module: Any, grad_output: tuple[Any, ...]) -> None: ...
def backward(module: Any, grad_input: tuple[Any, ...], grad_output: tuple[Any, ...]) -> None: ...
def backward_named(module: Any, gi: tuple[Any, ...], go: tuple[Any, ...], *, name: str) -> None: ...
def anything(*args: Any, **kwargs: Any) -> None: ...


# -- accepted ---------------------------------------------------------------------------------
assert_type(attach(model, forward), HookGroup)
attach(model, forward_named, where="layer*.conv1", when="train")
attach(model, forward, kind="forward", prepend=True, always_call=True)
attach(model, forward_kwargs, with_kwargs=True)
attach(model, pre, kind="forward_pre", prepend=True)
attach(model, pre_named, kind="forward_pre", with_kwargs=False)
attach(model, pre_kwargs, kind="forward_pre", with_kwargs=True)
attach(model, backward_pre, kind="full_backward_pre", prepend=True)
attach(model, backward, kind="full_backward", when=lambda m: True)
attach(model, backward_named, kind="full_backward")
attach(model, lambda m, a, o: None)
attach(model, lambda m, a, o, *, name: print(name))
attach(model, lambda m, gi, go: None, kind="full_backward")
attach(model, anything, kind="forward_pre")


def kind_known_at_run_time(kind: ModuleKind, with_kwargs: bool) -> None:
    attach(model, anything, kind=kind)  # a hook that fits every kind
    attach(model, anything, with_kwargs=with_kwargs)


# -- flagged: a hook of the wrong arity for its kind ------------------------------------------
attach(model, pre)  # pyright: ignore
attach(model, forward, kind="forward_pre")  # pyright: ignore
attach(model, forward, kind="full_backward_pre")  # pyright: ignore
attach(model, backward_pre, kind="full_backward")  # pyright: ignore
attach(model, forward, with_kwargs=True)  # pyright: ignore
attach(model, forward_kwargs)  # pyright: ignore
attach(model, lambda m, a: None)  # pyright: ignore

# -- flagged: a misspelled option, an option the kind does not take, an unknown kind ------------
attach(model, forward, prepnd=True)  # pyright: ignore
attach(model, forward, alwayscall=True)  # pyright: ignore
attach(model, pre, kind="forward_pre", always_call=True)  # pyright: ignore
attach(model, backward, kind="full_backward", with_kwargs=False)  # pyright: ignore
attach(model, backward_pre, kind="full_backward_pre", always_call=True)  # pyright: ignore
attach(model, anything, kind="backward")  # pyright: ignore
attach(model, forward, when="training")  # pyright: ignore
