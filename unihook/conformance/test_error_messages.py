"""Every error unihook raises, read (issue 12, class 6).

Each test triggers one error path on every backend where it exists and checks the exception
type (the unihook class and the builtin type torch and paddle raise for the same misuse, see
``unihook.errors``) and that the message names the hook kind, the module (its qualified name
where given), the backend, what was expected and what was received.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

import unihook

NAME = "enc.0"  # the qualified name passed as name=, which messages must show


def _raises(run: Callable[[], object], cls: type[Exception], builtin: type[Exception]) -> Exception:
    with pytest.raises(cls) as info:
        run()
    assert isinstance(info.value, unihook.UnihookError)
    assert isinstance(info.value, builtin)
    return info.value


def _names(error: Exception, kind: str, module: str, backend: str, expected: str) -> None:
    message = str(error)
    assert f"{kind} hook on" in message, message
    assert module in message, message
    assert f"[backend {backend}]" in message, message
    assert expected in message, message
    assert "Received: " in message, message


def _x(backend: Any) -> Any:
    return backend.tensor([[1.0, 2.0, 3.0]], requires_grad=True)


# -- arguments --------------------------------------------------------------------------------


def test_no_backend() -> None:
    error = _raises(
        lambda: unihook.register_forward_hook(object(), lambda *a: None),
        unihook.NoBackendError,
        TypeError,
    )
    assert "register_forward_hook: expected a module or tensor" in str(error)
    assert "Received: object" in str(error)


@pytest.mark.parametrize("kind", ["forward_pre", "forward", "full_backward_pre", "full_backward"])
def test_hook_not_callable(backend: Any, kind: str) -> None:
    register = getattr(unihook, f"register_{kind}_hook")
    m = backend.linear(3, 2)
    error = _raises(lambda: register(m, 5, name=NAME), unihook.HookArgumentError, TypeError)
    _names(error, kind, f"'{NAME}'", backend.name, "`hook` must be callable")
    # `when` wraps the hook: still checked
    _raises(lambda: register(m, 5, when="train"), unihook.HookArgumentError, TypeError)


def test_tensor_hook_not_callable(backend: Any) -> None:
    error = _raises(
        lambda: unihook.register_tensor_hook(_x(backend), 5, name="x"),  # type: ignore[arg-type]
        unihook.HookArgumentError,
        TypeError,
    )
    _names(error, "tensor", "'x'", backend.name, "`hook` must be callable")


def test_when_invalid(backend: Any) -> None:
    m = backend.linear(3, 2)
    error = _raises(
        lambda: unihook.register_forward_hook(m, lambda *a: None, when="often", name=NAME),  # type: ignore[arg-type]
        unihook.HookArgumentError,
        ValueError,
    )
    _names(error, "forward", f"'{NAME}'", backend.name, "`when` must be one of")


@pytest.mark.parametrize(
    ("kind", "flag"),
    [
        ("forward_pre", "prepend"),
        ("forward_pre", "with_kwargs"),
        ("forward", "prepend"),
        ("forward", "with_kwargs"),
        ("forward", "always_call"),
        ("full_backward_pre", "prepend"),
        ("full_backward", "prepend"),
    ],
)
@pytest.mark.parametrize("value", ["no", None, 2])
def test_flag_not_a_bool(backend: Any, kind: str, flag: str, value: object) -> None:
    """torch takes any value by its truth (``prepend="no"`` went first): a flag is a bool (or
    0 / 1), and nothing is registered when it is not."""
    register = getattr(unihook, f"register_{kind}_hook")
    m = backend.linear(3, 2)
    error = _raises(
        lambda: register(m, lambda *a: None, name=NAME, **{flag: value}),
        unihook.HookArgumentError,
        TypeError,
    )
    _names(error, kind, f"'{NAME}'", backend.name, f"`{flag}` must be a bool")
    assert f"{flag}={value!r}" in str(error)
    assert not any(backend.hook_counts(m).values())
    register(m, lambda *a: None, **{flag: 1}).remove()  # (0 and 1 pass)


@pytest.mark.parametrize("flag", ["with_kwargs", "always_call"])
def test_global_flag_not_a_bool(backend: Any, flag: str) -> None:
    options: dict[str, Any] = {flag: "yes"}
    error = _raises(
        lambda: unihook.register_module_forward_hook(
            lambda *a: None, backend=backend.name, **options
        ),
        unihook.HookArgumentError,
        TypeError,
    )
    _names(error, "module_forward", "every module", backend.name, f"`{flag}` must be a bool")


def test_global_hook_not_callable(backend: Any) -> None:
    error = _raises(
        lambda: unihook.register_module_forward_hook(5, backend=backend.name),  # type: ignore[arg-type]
        unihook.HookArgumentError,
        TypeError,
    )
    _names(error, "module_forward", "every module", backend.name, "`hook` must be callable")


def test_global_backend_unknown() -> None:
    error = _raises(
        lambda: unihook.register_module_forward_hook(lambda *a: None, backend="jax"),
        unihook.HookArgumentError,
        ValueError,
    )
    _names(error, "module_forward", "every module", "jax", "`backend` must be one of")


def test_attach_kind_invalid(backend: Any) -> None:
    model = backend.sequential(backend.linear(3, 2))
    error = _raises(
        lambda: unihook.attach(model, lambda *a: None, kind="backward"),  # type: ignore[call-overload]
        unihook.HookArgumentError,
        ValueError,
    )
    message = str(error)
    assert "backward hooks by attach on" in message and f"[backend {backend.name}]" in message
    assert "`kind` must be one of" in message and "Received: kind='backward'" in message


def test_attach_where_matches_nothing(backend: Any) -> None:
    model = backend.sequential(backend.linear(3, 2))
    error = _raises(
        lambda: unihook.attach(model, lambda *a: None, where="layer9"),
        unihook.HookArgumentError,
        ValueError,
    )
    message = str(error)
    assert "forward hooks by attach on" in message and f"[backend {backend.name}]" in message
    assert "`where` must match" in message and "Received: pattern 'layer9'" in message


# -- targets ----------------------------------------------------------------------------------


def _module_class(kit: Any) -> str:
    """The framework's module base class, spelled as in messages (an optional kit attribute,
    ``module_class``; torch's and paddle's kits predate it)."""
    known = {"torch": "torch.nn.Module", "paddle": "paddle.nn.Layer"}
    return getattr(kit, "module_class", None) or known[kit.name]


def test_module_hook_on_tensor(backend: Any) -> None:
    x = _x(backend)
    error = _raises(
        lambda: unihook.register_forward_hook(x, lambda *a: None),
        unihook.TargetKindError,
        AttributeError,  # what `tensor.register_forward_hook` raises in both frameworks
    )
    assert isinstance(error, unihook.HookTargetError) and isinstance(error, TypeError)
    # the framework's module base class, as the message spells it (torch.nn.Module, ...)
    _names(error, "forward", type(x).__name__, backend.name, f"expected a {_module_class(backend)}")


def test_tensor_hook_on_module(backend: Any) -> None:
    m = backend.linear(3, 2)
    error = _raises(
        lambda: unihook.register_tensor_hook(m, lambda g: None),
        unihook.TargetKindError,
        AttributeError,
    )
    # the class's own name (Linear; MindSpore's is Dense)
    _names(error, "tensor", type(m).__name__, backend.name, f"expected a {backend.name}.Tensor")


def test_tensor_hook_needs_grad(backend: Any) -> None:
    error = _raises(
        lambda: unihook.register_tensor_hook(backend.tensor([1.0]), lambda g: None, name="x"),
        unihook.NoGradError,
        RuntimeError,  # torch and paddle both raise RuntimeError here
    )
    assert isinstance(error, unihook.HookTargetError)
    _names(error, "tensor", "'x'", backend.name, "expected a tensor that requires grad")


# -- returns ----------------------------------------------------------------------------------


def _tensor_hook_returning(backend: Any, make: Callable[[Any], Any]) -> Callable[[], None]:
    def run() -> None:
        x = _x(backend)
        y = x * 2
        unihook.register_tensor_hook(y, lambda g: make(g), name="y")
        backend.backward(y.sum())

    return run


def test_tensor_hook_returns_non_tensor(backend: Any) -> None:
    run = _tensor_hook_returning(backend, lambda g: 1.5)
    error = _raises(run, unihook.HookReturnTypeError, TypeError)  # torch: TypeError
    assert isinstance(error, RuntimeError)
    _names(error, "tensor", "'y'", backend.name, f"expected None or a {backend.name}.Tensor")
    assert "Received: float 1.5" in str(error)


def test_tensor_hook_returns_wrong_shape(backend: Any) -> None:
    run = _tensor_hook_returning(backend, lambda g: g.sum())
    error = _raises(run, unihook.HookReturnError, RuntimeError)
    _names(error, "tensor", "'y'", backend.name, "expected a gradient of shape [1, 3]")


def test_tensor_hook_returns_wrong_dtype(backend: Any) -> None:
    run = _tensor_hook_returning(backend, lambda g: backend.tensor([[1, 2, 3]], dtype="float64"))
    error = _raises(run, unihook.HookReturnError, RuntimeError)
    _names(error, "tensor", "'y'", backend.name, "expected a gradient of dtype")


@pytest.mark.parametrize(
    ("returned", "cls", "builtin"),
    [
        (5, unihook.HookReturnError, RuntimeError),  # not a 2-tuple: RuntimeError in both
        ((None, {}), unihook.HookReturnTypeError, TypeError),  # forward(*None): TypeError
    ],
    ids=["not-a-pair", "args-none"],
)
@pytest.mark.parametrize("scope", ["module", "global"])
def test_kwargs_pre_hook_returns(
    backend: Any, returned: Any, cls: type[Exception], builtin: type[Exception], scope: str
) -> None:
    m = backend.linear(3, 2)

    def hook(module: Any, args: Any, kwargs: Any) -> Any:
        return returned if module is m else None

    if scope == "module":
        handle = unihook.register_forward_pre_hook(m, hook, with_kwargs=True, name=NAME)
        where, kind = f"'{NAME}'", "forward_pre"
    else:
        register = unihook.register_module_forward_pre_hook
        handle = register(hook, with_kwargs=True, backend=backend.name)
        where, kind = type(m).__name__, "module_forward_pre"  # Linear (MindSpore: Dense)
    with handle:
        error = _raises(lambda: m(_x(backend)), cls, builtin)
    _names(error, kind, where, backend.name, "expected None or a tuple (new_args, new_kwargs)")


@pytest.mark.parametrize("kind", ["full_backward_pre", "full_backward"])
@pytest.mark.parametrize(
    ("returned", "cls", "builtin", "expected"),
    [
        (1.5, unihook.HookReturnTypeError, TypeError, "expected None or a tuple of 1"),
        ((None, None), unihook.HookReturnError, RuntimeError, "expected None or a tuple of 1"),
        ("shape", unihook.HookReturnError, RuntimeError, "expected a gradient of shape [1, 2]"),
    ],
    ids=["not-a-tuple", "wrong-length", "wrong-shape"],
)
def test_backward_hook_returns(
    backend: Any,
    kind: str,
    returned: Any,
    cls: type[Exception],
    builtin: type[Exception],
    expected: str,
) -> None:
    m = backend.linear(3, 2)

    def hook(module: Any, *grads: Any) -> Any:
        if returned == "shape":
            return (grads[-1][0].sum(),) if kind == "full_backward_pre" else (grads[0][0].sum(),)
        return returned

    unihook.__dict__[f"register_{kind}_hook"](m, hook, name=NAME)
    error = _raises(lambda: backend.backward(m(_x(backend)).sum()), cls, builtin)
    if returned == "shape" and kind == "full_backward":
        expected = "expected a gradient of shape [1, 3]"
    _names(error, kind, f"'{NAME}'", backend.name, expected)


def test_backward_pre_hook_fills_unused_output(backend: Any) -> None:
    """A value for the None slot of an unused output: checked against that output."""
    m = backend.module(lambda self, x: (x * 2, x * 3))
    unihook.register_full_backward_pre_hook(m, lambda mod, go: (go[0], 1.5), name=NAME)
    run = lambda: backend.backward(m(_x(backend))[0].sum())  # noqa: E731
    error = _raises(run, unihook.HookReturnTypeError, TypeError)
    _names(error, "full_backward_pre", f"'{NAME}'", backend.name, "expected None or a")


def test_full_hook_returns_without_grad_inputs(backend: Any) -> None:
    m = backend.linear(3, 2)
    unihook.register_full_backward_hook(m, lambda mod, gi, go: (go[0],), name=NAME)
    run = lambda: backend.backward(m(backend.tensor([[1.0, 2.0, 3.0]])).sum())  # noqa: E731
    with pytest.warns(UserWarning):
        error = _raises(run, unihook.HookReturnError, RuntimeError)
    _names(error, "full_backward", f"'{NAME}'", backend.name, "expected None (no input")


def test_module_registration_returns_non_module(backend: Any) -> None:
    handle = unihook.register_module_module_registration_hook(
        lambda mod, name, sub: 5, backend=backend.name
    )
    with handle:
        error = _raises(
            lambda: backend.add_module(
                backend.module(lambda self: None), "sub", backend.linear(1, 1)
            ),
            unihook.HookReturnTypeError,
            TypeError,  # torch's add_module of a non-Module
        )
    _names(error, "module_registration", "", backend.name, "expected None or a")
    assert "Received: int 5" in str(error)
