"""Registration on a backend's objects: ownership, argument checks, and the backends table
telling the truth about every hook kind."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import unihook
from unihook.info import KINDS
from unihook.kinds import HookKind


def test_hook_must_be_callable(backend: Any) -> None:
    m = backend.linear(2, 2)
    with pytest.raises(TypeError, match="callable"):
        unihook.register_forward_hook(m, "not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize("when", ["training", 3])
def test_when_outside_the_allowed_set(backend: Any, when: Any) -> None:
    m = backend.linear(2, 2)
    with pytest.raises(ValueError, match=r"`when` must be one of \{None, 'train', 'eval'\}"):
        unihook.register_forward_hook(m, lambda *a: None, when=when)


def test_backend_of(backend: Any) -> None:
    assert unihook.backend_of(backend.linear(2, 2)) == backend.name
    assert unihook.backend_of(backend.tensor([1.0])) == backend.name


def test_backends_table_is_truthful(backend: Any) -> None:
    """Every kind a backend reports as native or emulated registers on its objects."""
    info = next(i for i in unihook.backends() if i.name == backend.name)
    module, tensor = backend.linear(2, 2), backend.tensor([1.0], requires_grad=True)
    registrations: dict[HookKind, Callable[[], unihook.Handle]] = {
        "forward_pre": lambda: unihook.register_forward_pre_hook(module, lambda *a: None),
        "forward": lambda: unihook.register_forward_hook(module, lambda *a: None),
        "tensor": lambda: unihook.register_tensor_hook(tensor, lambda g: None),
        "full_backward_pre": lambda: unihook.register_full_backward_pre_hook(
            module, lambda *a: None
        ),
        "full_backward": lambda: unihook.register_full_backward_hook(module, lambda *a: None),
    }
    for kind, register in registrations.items():
        if info.support(kind) == "unsupported":
            with pytest.raises(unihook.UnsupportedHookError):
                register()
        else:
            handle = register()
            assert (handle.backend, handle.kind) == (backend.name, kind)
            handle.remove()
    for kind in KINDS[len(registrations) :]:
        function = getattr(
            unihook,
            f"register_module_{kind}_hook"
            if kind.endswith("_registration")
            else f"register_{kind}_hook",
        )
        with function(lambda *a: None, backend=backend.name) as handle:
            assert handle.backend == backend.name and info.support(kind) != "unsupported"
