"""Imperative backward for MindSpore's functional autograd: what the conformance kit needs.

MindSpore 2.10 has no ``Tensor.backward`` and no ``.grad``: gradients come from
``mindspore.grad(fn, ...)`` which runs `fn` inside a recording session ("top graph"). The tape
keeps one session open at all times (``_pynative_executor.new_graph`` on a key object); a
backward closes it (``end_graph``), asks for the gradients with respect to every live leaf
(``grad(..., weights=leaves)``: only Parameters can be differentiated by identity, so a leaf
that requires grad is a Parameter), accumulates them into each leaf's ``.grad`` and opens the
next session. Tensors computed in an earlier session are constants in the next: one backward
per forward (no retain_graph).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Sequence

import mindspore
import numpy as np
from mindspore.graph.api import _pynative_executor as executor
from mindspore.ops.composite import GradOperation

__all__ = ["backward", "grad", "grad_wrt", "leaf", "set_grad", "start", "track"]


class _Session:
    """The key MindSpore files a recording session under (it must be hashable)."""


_lock = threading.RLock()
_session: _Session | None = None
_keys: list[_Session] = []
_leaves: dict[int, weakref.ref[Any]] = {}
_counter = [0]
_op = GradOperation(get_by_list=True)


def start() -> None:
    """Open the recording session if none is open."""
    global _session
    with _lock:
        if _session is None:
            executor.set_grad_flag(True)
            _session = _Session()
            # MindSpore files a recording under its key object: keys stay alive so that a new
            # one never takes a finished one's id (a precaution; keys are tiny)
            _keys.append(_session)
            executor.new_graph(_session)


def track(tensor: Any) -> Any:
    """Remember `tensor` (a Parameter) as a leaf whose gradient a backward computes."""
    with _lock:
        _leaves[id(tensor)] = weakref.ref(tensor)
        if not hasattr(tensor, "grad"):
            tensor.grad = None  # as a torch leaf before its first backward
    return tensor


def leaf(array: Any, dtype: Any = None) -> Any:
    """A new leaf that requires grad, holding `array`."""
    _counter[0] += 1
    tensor = mindspore.Tensor(np.asarray(array), dtype=dtype)
    return track(mindspore.Parameter(tensor, name=f"unihook_leaf_{_counter[0]}"))


def _live_leaves() -> list[Any]:
    live = []
    for key, ref in list(_leaves.items()):
        t = ref()
        if t is None:
            del _leaves[key]
        elif t.requires_grad:
            live.append(t)
    return live


def _run(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
    """Close the session at `outputs` (their gradients are ones: summed), differentiate with
    respect to `inputs`, open the next session."""
    global _session
    from . import flush_removals

    flush_removals()  # outside any backward: the tensor hooks' deferred native removals
    with _lock:
        start()
        session = _session
        _session = None
        out = outputs[0] if len(outputs) == 1 else tuple(outputs)
        try:
            executor.end_graph(session, out)
            grads = executor.grad(session, _op, list(inputs), None, False) if inputs else ()
            # MindSpore may run kernels asynchronously: the backward is complete on return
            executor.sync()
        finally:
            start()
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    return list(grads)


def _reachable(outputs: Sequence[Any]) -> set[int]:
    """The ids of the leaf nodes the outputs' graph reaches (``_grad_node.next_functions``,
    as torch's ``grad_fn``). MindSpore runs the hooks of every Parameter it is asked to
    differentiate, with a zero gradient for one outside the graph (torch runs none): only the
    reached leaves are asked for."""
    todo = [t._grad_node for t in outputs if isinstance(t, mindspore.Tensor)]
    seen: set[int] = set()
    leaves: set[int] = set()
    while todo:
        node = todo.pop()
        if node is None:
            continue
        key = node._unique_id()
        if key in seen:
            continue
        seen.add(key)
        if node.is_leaf():
            leaves.add(key)
        todo.extend(edge[0] for edge in node.next_functions)
    return leaves


def backward(tensor: Any) -> None:
    """``tensor.backward()``: gradients of every leaf the graph reaches, accumulated into its
    ``.grad`` (an attribute the tape gives Parameters, as torch's and paddle's tensors have)."""
    reached = _reachable([tensor])
    leaves = [t for t in _live_leaves() if t._grad_node._unique_id() in reached]
    grads = _run([tensor], leaves)
    with _lock:
        for t, g in zip(leaves, grads):
            old = getattr(t, "grad", None)
            t.grad = g if old is None else old + g


def grad_wrt(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
    """``autograd.grad``: gradients of `outputs` with respect to leaves `inputs`."""
    return _run(list(outputs), list(inputs))


def grad(tensor: Any) -> Any:
    """The accumulated gradient of a leaf, as numpy, or None."""
    value = getattr(tensor, "grad", None)
    return None if value is None else value.asnumpy().copy()


def set_grad(tensor: Any, value: Any) -> None:
    tensor.grad = value
