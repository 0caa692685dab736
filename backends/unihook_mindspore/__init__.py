"""unihook backend for MindSpore (PyNative mode).

Claims an object only when ``mindspore`` is already in ``sys.modules`` and the object is a
``mindspore.nn.Cell`` or ``mindspore.Tensor``; MindSpore is never imported here at module level.
Forward hooks are MindSpore's own (in snapshot-iterating dicts, see ``_forward``); tensor hooks
get a thin wrapper absorbing MindSpore's failure modes; module backward hooks run the core's
emulation (``_backward``: MindSpore's native ones differ from torch's contract); global and
registration hooks patch ``mindspore.nn.Cell`` while needed (``_global``).
"""

from __future__ import annotations

import sys
import threading
import weakref
from functools import partial
from typing import Any, Callable, cast

from unihook.backend import (
    Site,
    check_grad,
    checked_kwargs_pre_hook,
    global_label,
    imported,
    install_when_imported,
    kwargs_post_hook,
    type_name,
    undo_if_unfinished,
)
from unihook.errors import BackendStateError, NoGradError, TargetKindError
from unihook.handles import Handle
from unihook.info import BackendInfo, installed_version
from unihook.spec import hookimpl

from ._serial import exclusive

NAME = "mindspore"


def _types() -> tuple[type, type] | None:
    nn = imported("mindspore.nn")  # (another thread importing it: not yet)
    ms = imported("mindspore")
    if nn is None or ms is None:
        return None
    return nn.Cell, ms.Tensor


def _owns(obj: object) -> bool:
    types = _types()
    return types is not None and isinstance(obj, types)


def _cell(obj: object, kind: str, name: str | None) -> Any:
    """`obj` if it is a Cell; None if MindSpore does not own it; raises for a MindSpore object
    that is not a Cell."""
    types = _types()
    if types is None or not isinstance(obj, types):
        return None
    if not isinstance(obj, types[0]):
        raise Site.of(kind, NAME, obj, name).error(
            TargetKindError, "a mindspore.nn.Cell", type_name(obj)
        )
    _check_pynative(kind, obj, name)
    return obj


def _check_pynative(kind: str, obj: object, name: str | None) -> None:
    """Hooks are Python calls: GRAPH_MODE compiles the cells and skips them silently (MindSpore's
    own hooks too), or fails in its graph parser (docs/MINDSPORE.md). Refused here instead.
    (A function under ``@mindspore.jit`` in PyNative mode is compiled the same way: not seen
    at registration; README, MindSpore.)"""
    ms = sys.modules["mindspore"]
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise Site.of(kind, NAME, obj, name).error(
            BackendStateError,
            "PyNative mode (mindspore.set_context(mode=mindspore.PYNATIVE_MODE)), where "
            "MindSpore runs Python hooks",
            "GRAPH_MODE, which compiles the cell and skips every Python hook",
        )


@hookimpl
def unihook_backend_info() -> BackendInfo:
    return BackendInfo(
        NAME,
        "mindspore",
        installed_version("mindspore"),
        {
            "forward_pre": "native",
            "forward": "native",
            "tensor": "native",
            # native Cell backward hooks exist but differ from torch's contract (see _backward)
            "full_backward_pre": "emulated",
            "full_backward": "emulated",
            "module_forward_pre": "emulated",
            "module_forward": "emulated",
            "module_full_backward_pre": "emulated",
            "module_full_backward": "emulated",
            "parameter_registration": "emulated",
            "buffer_registration": "native",
            "module_registration": "emulated",
        },
    )


@hookimpl
def unihook_backend_of(obj: object) -> str | None:
    return NAME if _owns(obj) else None


# First: MindSpore 2.10 cannot be imported once paddle 3.3 is (their oneDNN builds clash:
# "undefined symbol: dnnl_threadpool_interop_stream_create"); the other way round both work
@hookimpl(tryfirst=True)
def unihook_conformance_kit() -> object | None:
    if installed_version("mindspore") is None:
        return None
    from .testkit import MindSporeKit

    return MindSporeKit()


def _forward_handle(cell: Any, kind: str, added: tuple[int, Callable[[], None]]) -> Handle:
    from ._forward import remove_hook

    cell_ref = weakref.ref(cell)
    hook_id, orphaned = added

    def remove() -> None:
        live = cell_ref()
        if live is not None:
            remove_hook(live, hook_id, pre=kind == "forward_pre")
        else:  # (from the dicts a shallow copy of it shares, as MindSpore's handle)
            orphaned()

    return Handle(NAME, kind, remove)


@hookimpl
def unihook_register_forward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, with_kwargs: bool, name: str | None
) -> Handle | None:
    cell = _cell(module, "forward_pre", name)
    if cell is None:
        return None
    from ._forward import add_hook

    if with_kwargs:
        # MindSpore raises a bare RuntimeError for a bad (args, kwargs) return
        hook = checked_kwargs_pre_hook(hook, Site.of("forward_pre", NAME, cell, name))
    added = add_hook(cell, hook, pre=True, prepend=prepend, with_kwargs=with_kwargs)
    return _forward_handle(cell, "forward_pre", added)


@hookimpl
def unihook_register_forward_hook(
    module: object,
    hook: Callable[..., Any],
    prepend: bool,
    with_kwargs: bool,
    always_call: bool,
    name: str | None,
) -> Handle | None:
    cell = _cell(module, "forward", name)
    if cell is None:
        return None
    from ._forward import add_hook

    if with_kwargs:
        hook = kwargs_post_hook(hook)  # flags are read live: see kwargs_post_hook
    added = add_hook(
        cell, hook, pre=False, prepend=prepend, with_kwargs=with_kwargs, always_call=always_call
    )
    return _forward_handle(cell, "forward", added)


# Removing a tensor hook while a backward runs segfaults MindSpore 2.10 (a hook removing
# itself), and MindSpore runs a tensor's native hooks from the live list (a hook added by an
# earlier one runs in the same pass; torch snapshots them). unihook's hooks of one tensor sit
# behind one native hook, `_TensorHooks`, which runs a snapshot (torch's) and is removed
# natively only outside any hook: at the next registration or removal outside a hook, or the
# tape's next backward. (Queueing the removal with
# `_pynative_executor.queue_backward_final_callback` aborted the process after earlier
# backwards had raised.)
# running unihook tensor hooks, on any thread: a native removal from another thread while a
# backward runs in one crashes as well (docs §10)
_running = [0]
_deferred: list[Callable[[], None]] = []
_deferred_lock = threading.Lock()


def _depth() -> int:
    return _running[0]


def flush_removals() -> None:
    """Run the native removals deferred by `remove` during a backward (none may run now).
    Each stays listed until it ran: one a Ctrl-C cut short runs again (they are idempotent)."""
    if _deferred and not _depth():
        with exclusive:  # (no native call while another thread's graph runs: docs §10)
            for native_remove in _deferred[:]:
                native_remove()
                with _deferred_lock:
                    _deferred.remove(native_remove)


class _TensorHooks:
    """The native hook of a tensor with unihook hooks: runs them in registration order."""

    __slots__ = ("entries", "native", "seq", "like", "site", "cuts", "__weakref__")

    def __init__(self, seq: int | None, like: tuple[Any, Any], site: Site) -> None:
        from . import _backward

        self.entries: list[Callable[[Any], Any]] = []
        # MindSpore's id of it, while registered: put in and taken out by C code (`add_native`,
        # `drop_native`), where no Ctrl-C lands between the native change and the record's
        self.native: list[int] = []
        # the sequence number of the tensor's grad node (None: a leaf), its shape and dtype,
        # and where its first hook was registered: `_backward._emulate` calls these hooks
        # where MindSpore's engine left the node out after a None
        self.seq, self.like, self.site = seq, like, site
        self.cuts = _backward.at_end

    def __call__(self, grad: Any) -> Any:
        if self.cuts and self.seq is not None:
            # the calls a None left out that torch's engine makes before this tensor's node
            self.cuts.emulate_after(self.seq, self)
        return self.run(grad)

    def run(self, grad: Any) -> Any:
        """Run the hooks: what they changed `grad` to, or None."""
        changed = False
        with _deferred_lock:
            _running[0] += 1
        try:
            # a snapshot, taken when this tensor's hooks start: torch's
            for run in tuple(self.entries):
                result = run(grad)
                if result is not None:
                    grad, changed = result, True  # a later hook sees it (torch chains)
        finally:
            with _deferred_lock:
                _running[0] -= 1
        return grad if changed else None

    def add_native(self, tensor: Any) -> None:
        """Register this object as `tensor`'s native hook, unless it is."""
        if not self.native:
            # (MindSpore's Tensor.register_hook makes its handle after the C call)
            self.native.extend(map(_native().register_hook, (tensor,), (self,)))
            _changed()

    def drop_native(self) -> None:
        """Remove the native hook if no unihook hook came back since (idempotent: MindSpore
        ignores an id removed already)."""
        if not self.entries and self.native:
            _native().remove_hook(self.native[0])
            self.native.clear()
            _changed()


def _native() -> Any:
    """MindSpore's C tensor class, which registers and removes tensor hooks by id."""
    from mindspore._c_expression import TensorPy

    return TensorPy


def _changed() -> None:
    """What MindSpore's Parameter.register_hook and its handle's removal do after the native
    call (a graph compiled with the hooks of before is not reused); harmless for a Tensor."""
    from mindspore.common.hook_handle import _update_hook_version

    _update_hook_version()


@hookimpl
def unihook_register_tensor_hook(
    tensor: object, hook: Callable[..., Any], name: str | None
) -> Handle | None:
    if not _owns(tensor):
        return None
    ms = sys.modules["mindspore"]
    site = Site.of("tensor", NAME, tensor, name)
    if not isinstance(tensor, ms.Tensor):
        raise site.error(TargetKindError, "a mindspore.Tensor", type_name(tensor))
    _check_pynative("tensor", tensor, name)
    # MindSpore accepts a hook on any tensor (it never fires); torch raises. A tensor needs
    # grad when it is a Parameter or was recorded under a grad session.
    with exclusive:  # (reading a Parameter while another thread's backward runs segfaults)
        needs_grad = cast(Any, tensor)._requires_grad  # (MindSpore's annotations lack it)
    if not needs_grad:
        raise site.error(
            NoGradError, "a tensor that requires grad", "a tensor recorded by no grad session"
        )
    Tensor = ms.Tensor

    def is_tensor(obj: object) -> bool:
        return isinstance(obj, Tensor)

    def run(grad: Any) -> Any:
        # MindSpore takes a wrong shape or dtype silently: checked here
        return check_grad(hook(grad), grad, is_tensor, site)

    with exclusive:  # (no native call while another thread's graph runs: docs §10)
        flush_removals()
        hooks = _hooks_of(tensor, site)
        remove = partial(_remove_tensor_hook, hooks, run)
        # (a registration cut short by a Ctrl-C is undone: see unihook._locks)
        undo_if_unfinished(remove)
        with _deferred_lock:
            hooks.entries.append(run)
            hooks.add_native(tensor)
    return Handle(NAME, "tensor", remove)


def _hooks_of(tensor: Any, site: Site) -> _TensorHooks:
    """The hooks of `tensor`'s present history. MindSpore binds a native tensor hook to the
    history the tensor object has when it is registered: `t[i] = v` (setitem) and
    `ops.assign` give the same object a new one, and a hook registered after fires with the
    gradient of the new history, one registered before with the old one's (torch's too: a
    tensor hook goes on the grad node it has). One native hook per history, then: a hook of
    an object changed since the native hook went on joins none of the old history's."""
    table: dict[object, _TensorHooks] | None = getattr(tensor, "_unihook_hooks", None)
    if table is None:
        table = tensor._unihook_hooks = {}  # (an attribute: not copied)
    key = _history(tensor)
    hooks = table.get(key)
    if hooks is None:
        for old in [k for k, h in table.items() if not h.entries and not h.native]:
            del table[old]  # (an older history's, all its hooks removed)
        seq = key[1] if isinstance(key, tuple) else None
        hooks = table[key] = _TensorHooks(seq, (tuple(tensor.shape), tensor.dtype), site)
        if isinstance(key, tuple):
            hooks.cuts.tensor_hooks[key] = hooks
    return hooks


def _history(tensor: Any) -> object:
    """What names `tensor`'s history: its grad node's `_unique_id`, and for an op's output
    its sequence number (counted per process: a node's id is its address, which a later
    node takes) and output index; None without a node."""
    from mindspore.graph.api import _pynative_executor

    _pynative_executor.sync()  # (an in-place op gives the tensor its node in the pipeline)
    try:
        node = tensor._grad_node
    except RuntimeError:  # a freed custom function's ("ctx has been freed"): no op since
        return ...
    if node is None:
        return None
    if node.is_leaf():
        return node._unique_id()
    return (node._unique_id(), int(node._sequence_nr()), int(tensor._output_index))


def _remove_tensor_hook(hooks: _TensorHooks, run: Callable[[Any], Any]) -> None:
    """Idempotent: also undoes a registration cut short and finishes a removal cut short."""
    # out of the list at once: a tensor whose hooks have not started runs it no more; one
    # whose hooks run now still runs it in this pass (its snapshot), as torch
    with _deferred_lock:
        if run in hooks.entries:
            hooks.entries.remove(run)
        if hooks.entries or not hooks.native:
            return
        if _depth():
            _deferred.append(hooks.drop_native)
            return
    with exclusive:
        hooks.drop_native()
        flush_removals()


@hookimpl
def unihook_register_full_backward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    cell = _cell(module, "full_backward_pre", name)
    if cell is None:
        return None
    from ._backward import register

    return register(cell, "full_backward_pre", hook, prepend, name)


@hookimpl
def unihook_register_full_backward_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    cell = _cell(module, "full_backward", name)
    if cell is None:
        return None
    from ._backward import register

    return register(cell, "full_backward", hook, prepend, name)


@hookimpl
def unihook_register_global_hook(
    kind: str,
    hook: Callable[..., Any],
    with_kwargs: bool,
    always_call: bool,
    backend: str | None,
) -> Handle | None:
    if backend not in (None, NAME) or installed_version("mindspore") is None:
        return None

    def install() -> Callable[[], None]:
        from ._global import add

        return add(kind, hook, with_kwargs, always_call)

    return Handle(NAME, global_label(kind), install_when_imported("mindspore", install))


@hookimpl
def unihook_ops(obj: object) -> object | None:
    if not _owns(obj):
        return None
    from ._ops import MindSporeOps

    return MindSporeOps()
