"""unihook backend for PaddlePaddle.

Claims an object only when ``paddle`` is already in ``sys.modules`` and the object is a
``paddle.nn.Layer`` or ``paddle.Tensor``; paddle is never imported here at module level.
Forward hooks are paddle's own (in snapshot-iterating dicts, see ``_forward``); tensor hooks get a
thin wrapper that absorbs paddle's failure modes (see ``unihook_register_tensor_hook``); module
backward hooks, which paddle 3.3.1 lacks, are emulated (``_backward``).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

from unihook.backend import (
    Site,
    add_compiler_escape,
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
from unihook.info import BackendInfo, installed_version, older_than
from unihook.spec import hookimpl

NAME = "paddle"


def _lone_refs() -> int:
    value = object()
    return sys.getrefcount(value)


_LONE_REFS = _lone_refs()  # sys.getrefcount of an object that one local variable holds


def _paddle() -> Any:
    return imported("paddle")  # (another thread importing it: not yet)


def _outside_compiler(call: Callable[[], Any], doing: str) -> Any:
    """paddle.jit.to_static's SOT: unihook's pluggy calls run outside it (see
    `_static.sot_escape`; `add_compiler_escape`: the same way whatever it is `doing`)."""
    from ._static import sot_escape

    return sot_escape(call)


_sot_tracing: list[Callable[[], bool]] = []  # `_static.sot_tracing`, once imported


def _converting() -> bool:
    """Whether SOT translates or simulates Python now (`add_compiler_escape`). Without paddle
    nothing is converted; with it, `_static` is imported at the first call (it imports
    paddle's SOT)."""
    if not _sot_tracing:
        if _paddle() is None:
            return False
        from ._static import sot_tracing

        _sot_tracing.append(sot_tracing)
    return _sot_tracing[0]()


add_compiler_escape(_outside_compiler, _converting)


#: The lowest paddle the suite has passed on: pyproject.toml's ``paddlepaddle>=`` bound (a test
#: checks that they agree). Older paddle is an error: 3.0-3.2 lack `always_call` and
#: `with_kwargs` on forward post-hooks and fail about half the suite (README "Supported
#: versions"), in the middle of a forward.
MIN_VERSION = "3.3"
_version_checked = False


def _owns(obj: object) -> bool:
    paddle = _paddle()
    if paddle is None or not isinstance(obj, (paddle.nn.Layer, paddle.Tensor)):
        return False
    if not _version_checked:
        _check_version(str(getattr(paddle, "__version__", "")))
    return True


def _check_version(installed: str) -> None:
    """Raise, at every claim until paddle is upgraded, if it is older than MIN_VERSION."""
    global _version_checked
    # a source build of paddle's develop branch says 0.0.0: let it through
    if older_than(installed, MIN_VERSION):
        raise BackendStateError(
            f"paddle backend: expected paddlepaddle>={MIN_VERSION}, the lowest version unihook's "
            f"tests pass on (3.0-3.2 lack always_call and with_kwargs on forward post-hooks). "
            f"Received: paddle {installed}. Upgrade paddle: pip install "
            f"'paddlepaddle>={MIN_VERSION}' (or paddlepaddle-gpu, your CUDA build)."
        )
    _version_checked = True


def _layer(obj: object, kind: str, name: str | None) -> Any:
    """`obj` if it is a paddle Layer; None if paddle does not own it; raises for a paddle
    object that is not a Layer."""
    if not _owns(obj):
        return None
    if not isinstance(obj, _paddle().nn.Layer):
        raise Site.of(kind, NAME, obj, name).error(
            TargetKindError, "a paddle.nn.Layer", type_name(obj)
        )
    return obj


@hookimpl
def unihook_backend_info() -> BackendInfo:
    return BackendInfo(
        NAME,
        "paddle",
        installed_version("paddlepaddle") or installed_version("paddlepaddle-gpu"),
        {
            "forward_pre": "native",
            "forward": "native",
            "tensor": "native",
            "full_backward_pre": "emulated",
            "full_backward": "emulated",
            # paddle 3.3.1 has no global hooks at all: paddle.nn.Layer is patched while needed.
            "module_forward_pre": "emulated",
            "module_forward": "emulated",
            "module_full_backward_pre": "emulated",
            "module_full_backward": "emulated",
            "parameter_registration": "emulated",
            "buffer_registration": "emulated",
            "module_registration": "emulated",
        },
    )


@hookimpl
def unihook_backend_of(obj: object) -> str | None:
    return NAME if _owns(obj) else None


@hookimpl
def unihook_conformance_kit() -> object | None:
    if installed_version("paddlepaddle") is None and installed_version("paddlepaddle-gpu") is None:
        return None
    from .testkit import PaddleKit

    return PaddleKit()


def _add_forward_hook(layer: Any, kind: str, hook: Callable[..., Any], **options: Any) -> Handle:
    """The hook in `layer`'s own dicts (``_forward``); its removal recorded first."""
    from ._forward import add_hook, id_for, remove_hook

    pre = kind == "forward_pre"
    if options["with_kwargs"]:
        # paddle raises a bare RuntimeError for a bad (args, kwargs) return, and reads the
        # kwargs flags live: a call in flight may call a removed hook without kwargs.
        if pre:
            hook = checked_kwargs_pre_hook(hook, Site.of(kind, NAME, layer, options["name"]))
        else:
            hook = kwargs_post_hook(hook)
    del options["name"]
    hook_id = id_for(layer, pre)
    layer_ref = weakref.ref(layer)
    orphaned: list[Callable[[], None]] = []  # (its removal once the layer died)

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        live = layer_ref()
        if live is not None:
            remove_hook(live, hook_id, pre=pre)
        elif orphaned:  # (from the dicts a shallow copy of it shares, as paddle's handle)
            orphaned[0]()

    undo_if_unfinished(remove)
    orphaned.append(add_hook(layer, hook_id, hook, pre=pre, **options))
    return Handle(NAME, kind, remove)


@hookimpl
def unihook_register_forward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, with_kwargs: bool, name: str | None
) -> Handle | None:
    layer = _layer(module, "forward_pre", name)
    if layer is None:
        return None
    return _add_forward_hook(
        layer, "forward_pre", hook, prepend=prepend, with_kwargs=with_kwargs, name=name
    )


@hookimpl
def unihook_register_forward_hook(
    module: object,
    hook: Callable[..., Any],
    prepend: bool,
    with_kwargs: bool,
    always_call: bool,
    name: str | None,
) -> Handle | None:
    layer = _layer(module, "forward", name)
    if layer is None:
        return None
    return _add_forward_hook(
        layer,
        "forward",
        hook,
        prepend=prepend,
        with_kwargs=with_kwargs,
        always_call=always_call,
        name=name,
    )


@hookimpl
def unihook_register_tensor_hook(
    tensor: Any, hook: Callable[..., Any], name: str | None
) -> Handle | None:
    paddle = _paddle()
    if paddle is not None and isinstance(tensor, paddle.pir.Value):
        # a symbolic value of paddle.jit.to_static(full_graph=True)'s program build
        from ._static import full_graph_error

        raise full_graph_error("tensor", tensor)
    if paddle is None or not _owns(tensor):
        return None
    site = Site.of("tensor", NAME, tensor, name)
    if not isinstance(tensor, paddle.Tensor):
        raise site.error(TargetKindError, "a paddle.Tensor", type_name(tensor))
    if tensor.stop_gradient:
        raise site.error(
            NoGradError, "a tensor that requires grad", "a tensor with stop_gradient=True"
        )
    from . import _autograd_guard as guard
    from ._ops import _is_tensor as is_tensor

    no_grad = paddle.no_grad
    leaf = tensor.is_leaf
    getrefcount = sys.getrefcount
    live = [True]
    token = guard.token()
    tensor_serial = guard.serial(tensor)
    # torch snapshots a tensor's hooks when they start to run: one registered by a hook of the
    # same tensor runs from the next backward. Paddle would run it at once: skip it until then.
    waiting = [True]
    guard.after_firing(tensor, lambda: waiting.__setitem__(0, False))

    def tensor_hook(grad: Any) -> Any:
        if not live[0] or waiting[0]:
            return None
        guard.fired(token, tensor_serial)
        try:
            refs = getrefcount(grad)
            if guard.building_graph():
                result = hook(grad)
            else:
                # An in-place edit of `grad` changes the gradient in torch; in paddle it
                # raises ("Leaf Var ... can't use inplace strategy") unless done under no_grad.
                with no_grad():
                    result = hook(grad)
            # Checked here: paddle accepts a wrong shape silently and segfaults on a float.
            result = check_grad(result, grad, is_tensor, site)
            # (None: where no gradient reaches the leaf, `guard._unless_gone`; a refcount of
            # None's own passed the check and None.clone() raised: helper-207's FINDING 1)
            if leaf and grad is not None and guard.in_tensor_backward():
                # What a leaf's hook gives back becomes x.grad, into which paddle adds later
                # gradients in place: a tensor the hook kept would change with it. Torch's
                # AccumulateGrad copies a gradient referenced elsewhere; so do we, by refcount.
                if result is None:
                    if getrefcount(grad) > refs:
                        return grad.clone()
                elif getrefcount(result) > (refs + 1 if result is grad else _LONE_REFS):
                    return result.clone()
            return result
        except BaseException as error:
            guard.stash(error)
            raise

    # paddle's own TensorHookRemoveHelper holds the tensor strongly: use a weak reference.
    tensor_ref = weakref.ref(tensor)
    hook_ids: list[int] = []  # paddle's, once registered

    def native_remove() -> None:
        owner = tensor_ref()
        if owner is not None:
            for hook_id in hook_ids:
                owner._remove_grad_hook(hook_id)  # (False for one removed already)

    def remove() -> None:
        # idempotent: also undoes a registration cut short (a Ctrl-C, see unihook._locks)
        owner = tensor_ref()
        if owner is None:
            live[0] = False
        else:
            # torch snapshots a tensor's hooks when they start to run: one removed while they
            # run (by one of them, or by another thread) still runs in this backward
            guard.after_firing(owner, lambda: live.__setitem__(0, False))
        guard.untrack(tensor_ref, token)
        # Removing a tensor hook while a backward runs, in any thread, segfaults paddle:
        # wait until none runs (the hook is already silent).
        guard.after_all_backwards(native_remove)
        guard.sweep()

    undo_if_unfinished(remove)
    guard.register_hook(tensor, tensor_hook, hook_ids)
    guard.hold(tensor_hook)
    # paddle.grad skips leaf-tensor hooks: the guard runs them for its inputs.
    guard.track(tensor, token, tensor_hook)
    return Handle(NAME, "tensor", remove)


@hookimpl
def unihook_register_full_backward_pre_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    layer = _layer(module, "full_backward_pre", name)
    if layer is None:
        return None
    from ._backward import register

    return register(layer, "full_backward_pre", hook, prepend, name)


@hookimpl
def unihook_register_full_backward_hook(
    module: object, hook: Callable[..., Any], prepend: bool, name: str | None
) -> Handle | None:
    layer = _layer(module, "full_backward", name)
    if layer is None:
        return None
    from ._backward import register

    return register(layer, "full_backward", hook, prepend, name)


@hookimpl
def unihook_register_global_hook(
    kind: str,
    hook: Callable[..., Any],
    with_kwargs: bool,
    always_call: bool,
    backend: str | None,
) -> Handle | None:
    if backend not in (None, NAME) or unihook_backend_info().version is None:
        return None

    def install() -> Callable[[], None]:
        from ._global import add

        return add(kind, hook, with_kwargs, always_call)

    return Handle(NAME, global_label(kind), install_when_imported("paddle", install))


@hookimpl
def unihook_ops(obj: object) -> object | None:
    if not _owns(obj):
        return None
    from ._ops import PaddleOps

    return PaddleOps()
