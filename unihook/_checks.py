"""Return-value rules shared by every adapter. Each raises HookReturnError naming the site:
HookReturnTypeError (also a TypeError) for a value of the wrong type, where torch raises
TypeError; plain HookReturnError (a RuntimeError) for a wrong length, shape or dtype, as torch."""

from __future__ import annotations

import sys
from functools import partial
from types import FrameType
from typing import Any, Callable

from ._describe import Site, type_name
from ._entries import eager_entry
from .errors import HookReturnError, HookReturnTypeError

__all__ = [
    "check_grad",
    "check_grad_like",
    "check_grad_tuple",
    "check_pre_kwargs_result",
    "checked_kwargs_pre_hook",
    "kwargs_post_hook",
    "shape_of",
    "show_value",
]


def shape_of(tensor: Any) -> tuple[int, ...]:
    """A tensor's shape as a tuple of ints (torch.Size and paddle's list compare equal so)."""
    return tuple(tensor.shape)


@partial(eager_entry, callees_too=True)
def check_pre_kwargs_result(result: object, site: Site) -> Any:
    """A with_kwargs forward pre-hook returns None or `(args, kwargs)`."""
    if result is None:
        return None
    expected = "None or a tuple (new_args, new_kwargs) with args a tuple and kwargs a dict"
    # torch: RuntimeError unless a 2-tuple, then TypeError from forward(*args, **kwargs)
    # (a __len__ that raises propagates, as in torch: it is the hook's own error)
    if not isinstance(result, tuple) or len(result) != 2:
        raise site.error(HookReturnError, expected, show_value(result))
    if not isinstance(result[0], (tuple, list)) or not isinstance(result[1], dict):
        raise site.error(HookReturnTypeError, expected, show_value(result))
    return result


def check_grad(result: object, grad: Any, is_tensor: Callable[[object], bool], site: Site) -> Any:
    """A gradient a hook returned in place of `grad`: None, or a tensor of its shape and dtype."""
    if grad is None:
        # torch calls a tensor's hooks with None for an output of its node that nothing used
        if result is None:
            return None
        raise site.error(
            HookReturnError,
            "None, as the gradient is None (nothing used this output of its node; torch "
            "cannot replace a None gradient)",
            show_value(result),
        )
    return check_grad_like(result, shape_of(grad), grad.dtype, _qualified(grad), is_tensor, site)


def check_grad_like(
    result: object,
    shape: tuple[int, ...],
    dtype: Any,
    tensor_type: str,
    is_tensor: Callable[[object], bool],
    site: Site,
) -> Any:
    """`check_grad` for a slot whose gradient is None: against its tensor's shape and dtype."""
    if result is None:
        return None
    if not is_tensor(result):
        wanted = f"None or a {tensor_type} like the gradient"
        raise site.error(HookReturnTypeError, wanted, show_value(result))
    if shape_of(result) != tuple(shape):
        raise site.error(
            HookReturnError,
            f"a gradient of shape {list(shape)}",
            f"shape {list(shape_of(result))}",
        )
    if result.dtype != dtype:  # type: ignore[attr-defined]
        raise site.error(
            HookReturnError,
            f"a gradient of dtype {dtype}",
            f"dtype {result.dtype}",  # type: ignore[attr-defined]
        )
    return result


def check_grad_tuple(
    result: object, expected: int, what: str, site: Site
) -> tuple[Any, ...] | None:
    """A backward hook returns None or a tuple/list replacing `what` (grad_input/grad_output)."""
    if result is None:
        return None
    wanted = f"None or a tuple of {expected} gradients replacing {what}"
    if not isinstance(result, (tuple, list)):
        raise site.error(HookReturnTypeError, wanted, show_value(result))
    if len(result) != expected:
        raise site.error(HookReturnError, wanted, f"a {type_name(result)} of length {len(result)}")
    return tuple(result)


def _qualified(value: object) -> str:
    """`torch.Tensor`, `paddle.Tensor`, `float`: the type with its framework (users mix them)."""
    package = type(value).__module__.split(".")[0]
    return type_name(value) if package == "builtins" else f"{package}.{type_name(value)}"


def show_value(value: object) -> str:
    """What a message says a hook returned: `float 1.5`, `torch.Tensor tensor([...`."""
    try:
        text = repr(value)
    except Exception as error:  # noqa: BLE001 (the error about the value must not fail)
        text = f"<repr raised {type_name(error)}>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{_qualified(value)} {text}"


def _kwargs_in(frame: FrameType | None) -> dict[str, Any]:
    """The call's kwargs, from the frame of the framework's hook loop (torch's `_call_impl`,
    paddle's and MindSpore's call functions name them `kwargs`), else empty."""
    found = None if frame is None else frame.f_locals.get("kwargs")
    return found if isinstance(found, dict) else {}


# Torch, paddle and MindSpore iterate a snapshot of a module's hooks but read the with_kwargs
# flags live: a with_kwargs hook removed during a call, by an earlier hook of the call, is
# still called for it (as any hook removed mid-call), without kwargs (torch's own then raises
# a TypeError). The wrappers below run it as registered, with the call's kwargs.


def checked_kwargs_pre_hook(hook: Callable[..., Any], site: Site) -> Callable[..., Any]:
    """Wrap a with_kwargs forward pre-hook so a bad return raises HookReturnError (and see
    above: called without kwargs, it gets a copy of them, and may replace the args only).
    A partial, not a closure: ``copy.deepcopy`` of the module copies it with `hook` (a bound
    method's object copied, as torch copies its own hooks), where it takes a function as it
    is (a deep copy's hook called the original's object: helper-107's FINDING 4)."""
    wrapper = partial(_kwargs_pre_hook, hook, site)
    wrapper.__wrapped__ = hook  # type: ignore[attr-defined]
    return wrapper


@eager_entry
def _kwargs_pre_hook(
    hook: Callable[..., Any], site: Site, module: Any, args: Any, *rest: Any
) -> Any:
    if rest:
        return check_pre_kwargs_result(hook(module, args, *rest), site)
    kwargs = _kwargs_in(sys._getframe(1))
    result = hook(module, args, dict(kwargs))
    if result is None:
        return None
    new_args, new_kwargs = check_pre_kwargs_result(result, site)
    if new_kwargs != kwargs:
        # the framework takes a plain pre-hook's return as the args; the call's kwargs dict
        # may be one a user's hook returned (changing it would change theirs)
        raise site.error(
            HookReturnError,
            "the call's kwargs back: removed during the call by an earlier hook, the hook "
            "still runs for it, as a plain pre-hook (the framework reads the with_kwargs "
            "flag live), whose return replaces the args only",
            f"other kwargs: {show_value(new_kwargs)}",
        )
    return new_args


def kwargs_post_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a with_kwargs forward hook (see above; a partial, as `checked_kwargs_pre_hook`)."""
    wrapper = partial(_kwargs_post_hook, hook)
    wrapper.__wrapped__ = hook  # type: ignore[attr-defined]
    return wrapper


@eager_entry
def _kwargs_post_hook(hook: Callable[..., Any], module: Any, args: Any, *rest: Any) -> Any:
    if len(rest) == 1:
        rest = (_kwargs_in(sys._getframe(1)), rest[0])
    return hook(module, args, *rest)
