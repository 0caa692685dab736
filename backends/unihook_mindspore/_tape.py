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

from ._serial import exclusive

__all__ = ["backward", "grad", "grad_wrt", "leaf", "set_grad", "start", "stop", "track"]


class _Session:
    """The key MindSpore files a recording session under (it must be hashable)."""


_lock = threading.RLock()
_session: _Session | None = None
_session_thread: int | None = None  # the thread that opened it (its grad flag is its own)
_window = threading.local()  # .open: this thread holds `exclusive` until its backward
_keys: list[_Session] = []
_leaves: dict[int, weakref.ref[Any]] = {}
# The leaves `leaf` made while the session is open, held until it ends, as torch's graph holds
# its leaves: a MindSpore Parameter is in a cycle with its ParamInfo (``param_info.obj``), so
# one nobody else holds dies at the collector's next run, and a backward after that left it
# out (its input side pruned: module full hooks not called; the intermittent failure of
# docs/MINDSPORE.md section 9)
_held: list[Any] = []
_counter = [0]
_op = GradOperation(get_by_list=True)
_NOTHING = mindspore.Tensor(np.float32(0))  # the output a dropped session ends at


def start() -> None:
    """Open the recording session if none is open."""
    global _session, _session_thread
    with _lock:
        if _session is not None and not executor.requires_grad():
            # MindSpore drops the recording when an op raises inside it (a refused in-place
            # op): start another, as torch keeps recording after an error
            _session = None
            _held.clear()
        if _session is None:
            executor.set_grad_flag(True)
            _session = _Session()
            # MindSpore files a recording under its key object: keys stay alive so that a new
            # one never takes a finished one's id (a precaution; keys are tiny)
            _keys.append(_session)
            executor.new_graph(_session)
            _session_thread = threading.get_ident()


def stop() -> None:
    """Close the recording session, if one is open, and the grad flag `start` set: what runs
    next records nothing (as without the tape) until `start` opens another. The kit's
    ``native_autograd``: code differentiating with MindSpore's own ``value_and_grad`` (the
    benchmarks) must not have every op recorded for a backward that never comes, nor
    ``unihook.ops.forward_backward`` take the tape's path."""
    global _session, _session_thread
    with _lock:
        if _session is None:
            return
        session, _session, _session_thread = _session, None, None
        _held.clear()
        if executor.requires_grad():  # (not after an error dropped the recording)
            executor.end_graph(session, _NOTHING)
        executor.set_grad_flag(False)


def _enter() -> None:
    """Open this thread's recording window: MindSpore records one graph per process, on one
    thread at a time (docs/MINDSPORE.md §10), so the window holds `exclusive` until this
    thread's backward. The session another thread left open (idle) is dropped: a grad flag
    is per thread, the graph being recorded is per process."""
    global _session
    if getattr(_window, "open", False):
        return
    exclusive.acquire()
    _window.open = True
    with _lock:
        if _session is not None and _session_thread != threading.get_ident():
            stale, _session = _session, None
            _held.clear()
            executor.end_graph(stale, _NOTHING)  # (closed from here: measured to work)
        start()


def _leave() -> None:
    if getattr(_window, "open", False):
        _window.open = False
        exclusive.release()


def track(tensor: Any) -> Any:
    """Remember `tensor` (a Parameter) as a leaf whose gradient a backward computes."""
    with _lock:
        _leaves[id(tensor)] = weakref.ref(tensor)
        if not hasattr(tensor, "grad"):
            tensor.grad = None  # as a torch leaf before its first backward
    return tensor


def leaf(array: Any, dtype: Any = None) -> Any:
    """A new leaf that requires grad, holding `array`."""
    _enter()  # this thread's forward starts here (a leaf is the first thing it records)
    start()  # (again after an error: see `start`)
    _counter[0] += 1
    tensor = mindspore.Tensor(np.asarray(array), dtype=dtype)
    param = track(mindspore.Parameter(tensor, name=f"unihook_leaf_{_counter[0]}"))
    with _lock:
        _held.append(param)
    return param


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

    if not getattr(_window, "open", False):
        # no leaf made on this thread since its last backward: its graph is in the session
        # only if it opened that one (another thread's window dropped it otherwise)
        exclusive.acquire()
        _window.open = True
        if _session is not None and _session_thread != threading.get_ident():
            _leave()
            raise RuntimeError(
                "backward [backend mindspore]: expected a graph recorded in this thread's "
                "session. Received: one recorded while another thread's was open (MindSpore "
                "2.10 records one graph per process): make a leaf (kit.tensor(..., "
                "requires_grad=True)) on this thread before its forward"
            )
    try:
        flush_removals()  # outside any backward: the tensor hooks' deferred native removals
        return _differentiate(outputs, inputs)
    finally:
        _leave()  # the next session (opened on this thread) stays open, idle


def _differentiate(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
    global _session
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
            _held.clear()  # (the leaves in `inputs` stay alive until the grads are read)
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


def _consume(outputs: Sequence[Any]) -> None:
    """MindSpore frees a recorded graph at its first backward, also one a hook raised in, and
    no API takes retain_graph (docs/MINDSPORE.md §5): a second backward raises "Try to backward
    the graph twice", "Can not find top cell" or, through a custom function, "ctx has been
    freed". The outputs are marked: a second backward from them raises BackendStateError."""
    from unihook.errors import BackendStateError

    if any(getattr(t, "_unihook_differentiated", False) for t in outputs):
        raise BackendStateError(
            "backward [backend mindspore]: expected a graph not differentiated yet (MindSpore "
            "frees it at its first backward, even one a hook raised in, and has no "
            "retain_graph). Received: a second backward through it; run the forward again"
        )
    for t in outputs:
        if isinstance(t, mindspore.Tensor):
            t._unihook_differentiated = True


def backward(tensor: Any) -> None:
    """``tensor.backward()``: gradients of every leaf the graph reaches, accumulated into its
    ``.grad`` (an attribute the tape gives Parameters, as torch's and paddle's tensors have)."""
    _consume([tensor])
    with exclusive:  # (reading a Parameter while another thread's backward runs segfaults)
        reached = _reachable([tensor])
        leaves = [t for t in _live_leaves() if t._grad_node._unique_id() in reached]
        grads = _run([tensor], leaves)
        with _lock:
            for t, g in zip(leaves, grads):
                old = getattr(t, "grad", None)
                t.grad = g if old is None else old + g


def grad_wrt(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[Any]:
    """``autograd.grad``: gradients of `outputs` with respect to leaves `inputs`."""
    _consume(outputs)
    return _run(list(outputs), list(inputs))


def grad(tensor: Any) -> Any:
    """The accumulated gradient of a leaf, as numpy, or None."""
    value = getattr(tensor, "grad", None)
    if value is None:
        return None
    with exclusive:
        return value.asnumpy().copy()


def set_grad(tensor: Any, value: Any) -> None:
    tensor.grad = value
