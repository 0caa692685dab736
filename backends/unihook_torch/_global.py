"""Global hooks for torch.

Forward post-hooks and registration hooks are torch's own. Global forward pre-hooks are not:
torch decides whether to pass kwargs to a global pre-hook by looking the hook's id up in each
*module's* with_kwargs set, so a global with_kwargs pre-hook cannot exist natively. While any
unihook global pre-hook is registered, ``Module._call_impl`` is wrapped to run them first (in
registration order, before the module's own pre-hooks, as torch runs global ones); removing
the last one puts torch's function back.
"""

from __future__ import annotations

import threading
from itertools import count
from typing import Any, Callable

import torch.nn.modules.module as torch_module

from unihook._checks import check_pre_kwargs_result
from unihook._describe import Site

from . import NAME

Hook = Callable[..., Any]

_lock = threading.Lock()
_ids = count()
_pre_hooks: dict[int, tuple[Hook, bool]] = {}
_pre_snapshot: tuple[tuple[Hook, bool], ...] = ()
_original_call_impl: Callable[..., Any] | None = None


def _call_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
    own = self._forward_pre_hooks
    keys = tuple(own)
    for hook, with_kwargs in _pre_snapshot:
        if with_kwargs:
            result = hook(self, args, kwargs)
            if result is not None:
                site = Site.of("module_forward_pre", NAME, self)
                args, kwargs = check_pre_kwargs_result(result, site)
        else:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    assert _original_call_impl is not None
    if tuple(own) == keys:
        return _original_call_impl(self, *args, **kwargs)
    return _call_hiding_new_pre_hooks(self, own, keys, args, kwargs)


def _call_hiding_new_pre_hooks(
    self: Any, own: dict[int, Hook], keys: tuple[int, ...], args: Any, kwargs: Any
) -> Any:
    """A global pre-hook registered a pre-hook on this module: torch iterates a snapshot
    taken before any pre-hook runs, so the new one waits for the next call."""
    order = list(own)
    hidden = {k: own.pop(k) for k in order if k not in keys}
    try:
        assert _original_call_impl is not None
        return _original_call_impl(self, *args, **kwargs)
    finally:
        now = dict(own)
        now.update(hidden)
        own.clear()
        own.update((k, now.pop(k)) for k in order if k in now)
        own.update(now)


def add_forward_pre(hook: Hook, with_kwargs: bool) -> Callable[[], None]:
    global _pre_snapshot, _original_call_impl
    key = next(_ids)
    with _lock:
        _pre_hooks[key] = (hook, with_kwargs)
        _pre_snapshot = tuple(_pre_hooks.values())
        if _original_call_impl is None:
            _original_call_impl = torch_module.Module._call_impl
            torch_module.Module._call_impl = _call_impl

    def remove() -> None:
        global _pre_snapshot, _original_call_impl
        with _lock:
            if _pre_hooks.pop(key, None) is None:
                return
            _pre_snapshot = tuple(_pre_hooks.values())
            if not _pre_hooks and _original_call_impl is not None:
                torch_module.Module._call_impl = _original_call_impl
                _original_call_impl = None

    return remove


def add(kind: str, hook: Hook, with_kwargs: bool, always_call: bool) -> Callable[[], None]:
    """Install a global hook of `kind`; return its remover."""
    if kind == "forward_pre":
        return add_forward_pre(hook, with_kwargs)
    if kind == "forward":
        native = torch_module.register_module_forward_hook(
            hook, with_kwargs=with_kwargs, always_call=always_call
        )

        def remove() -> None:
            native.remove()
            # torch's handle forgets its entry in the with_kwargs table: no residue.
            torch_module._global_forward_hooks_with_kwargs.pop(native.id, None)

        return remove
    elif kind in ("full_backward_pre", "full_backward"):
        from ._backward import add_global

        return add_global(kind, hook)
    else:
        register = getattr(torch_module, f"register_module_{kind}_hook")
        native = register(hook)
    return native.remove
