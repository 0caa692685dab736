"""Paddle's backward entry points, made safe for Python hooks.

While any unihook gradient hook is alive, ``core.eager.run_backward`` and
``run_partial_grad`` (what ``Tensor.backward``, ``paddle.autograd.backward`` and ``paddle.grad``
call) are wrapped so that:

- an exception raised in a hook comes out with its own type: paddle's C++ turns it into
  ``OSError "(External) ..."``, so the hook wrapper stashes the original and we re-raise it;
- a hook removed while backward runs is removed when backward returns: removing a tensor hook
  during backward segfaults paddle 3.3.1;
- hooks know whether the backward builds a graph (``paddle.grad(create_graph=True)``).

The wrappers go away when the last hook does (``finalize`` on each hook function), restoring
paddle's functions exactly.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from paddle.base import core

__all__ = ["hold", "stash", "after_backward", "building_graph", "in_backward", "installed"]


class _State(threading.local):
    depth = 0
    create_graph = False
    pending: BaseException | None = None

    def __init__(self) -> None:
        self.deferred: list[Callable[[], object]] = []


_state = _State()
_lock = threading.Lock()
_live = 0
_originals: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def installed() -> bool:
    return _originals is not None


def hold(hook_function: Callable[..., Any]) -> None:
    """Keep the guard installed while `hook_function` (held by paddle's graph) is alive."""
    global _live, _originals
    with _lock:
        _live += 1
        if _originals is None:
            _originals = (core.eager.run_backward, core.eager.run_partial_grad)
            core.eager.run_backward = _run_backward
            core.eager.run_partial_grad = _run_partial_grad
    weakref.finalize(hook_function, _release)


def _release() -> None:
    global _live, _originals
    with _lock:
        _live -= 1
        if _live == 0 and _originals is not None:
            core.eager.run_backward, core.eager.run_partial_grad = _originals
            _originals = None


def stash(error: BaseException) -> None:
    """Remember the exception a hook raised, for the entry point to re-raise."""
    if _state.pending is None:
        _state.pending = error


def in_backward() -> bool:
    return _state.depth > 0


def building_graph() -> bool:
    return _state.create_graph


def after_backward(action: Callable[[], object]) -> None:
    """Run `action` now, or when the running backward returns."""
    if _state.depth > 0:
        _state.deferred.append(action)
    else:
        action()


def _run_backward(*args: Any, **kwargs: Any) -> Any:
    assert _originals is not None
    return _guarded(_originals[0], False, args, kwargs)


def _run_partial_grad(*args: Any, **kwargs: Any) -> Any:
    assert _originals is not None
    # (outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
    create_graph = bool(args[4] if len(args) > 4 else kwargs.get("create_graph", False))
    return _guarded(_originals[1], create_graph, args, kwargs)


def _guarded(run: Callable[..., Any], create_graph: bool, args: Any, kwargs: Any) -> Any:
    state = _state
    outer_graph = state.create_graph
    state.create_graph = create_graph
    state.depth += 1
    try:
        return run(*args, **kwargs)
    except OSError:
        pending, state.pending = state.pending, None
        if pending is not None:
            raise pending from None
        raise
    finally:
        state.depth -= 1
        state.create_graph = outer_graph
        if state.depth == 0:
            state.pending = None
            deferred, state.deferred = state.deferred, []
            for action in deferred:
                action()
