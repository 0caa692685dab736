"""Conformance: forward pre- and post-hooks (SEMANTICS.md §1-2), torch's semantics on every
backend. Every test takes `backend` (a ``unihook.testing.Kit``) and uses only kit operations."""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any

import numpy as np
import pytest

import unihook


def recorder(kit: Any) -> tuple[Any, list[Any]]:
    """A module whose forward records (args, kwargs) of each call and returns args."""
    calls: list[Any] = []

    def forward(_self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return args

    return kit.module(forward), calls


def no_residue(kit: Any, module: Any) -> None:
    counts = kit.hook_counts(module)
    assert counts and all(n == 0 for n in counts.values()), counts


# ---------------------------------------------------------------------------------------------
# forward pre-hooks


def test_pre_hook_sees_positional_args_only(backend: Any) -> None:
    m, calls = recorder(backend)
    t = backend.tensor([1.0, 2.0])
    seen = []
    h = unihook.register_forward_pre_hook(m, lambda mod, args: seen.append((mod, args)))
    m(t, 3, scale=2)
    assert len(seen) == 1
    assert seen[0][0] is m
    args = seen[0][1]
    assert type(args) is tuple and len(args) == 2 and args[0] is t and args[1] == 3
    assert calls[0][1] == {"scale": 2}  # kwargs reach forward untouched
    h.remove()


def test_pre_hook_none_keeps_args(backend: Any) -> None:
    m, calls = recorder(backend)
    t = backend.tensor([1.0])
    unihook.register_forward_pre_hook(m, lambda mod, args: None)
    out = m(t, 7)
    assert calls[0][0][0] is t and calls[0][0][1] == 7
    assert out[0] is t


@pytest.mark.parametrize("value", ["tensor", 5, [1, 2]], ids=["tensor", "int", "list"])
def test_pre_hook_single_value_wrapped_into_1_tuple(backend: Any, value: Any) -> None:
    m, calls = recorder(backend)
    replacement = backend.tensor([9.0, 9.0]) if value == "tensor" else value
    unihook.register_forward_pre_hook(m, lambda mod, args: replacement)
    m(backend.tensor([1.0]), 2, 3)
    args = calls[0][0]
    assert len(args) == 1  # wrapped, a list is not unpacked
    assert args[0] is replacement


def test_pre_hook_tuple_replaces_args(backend: Any) -> None:
    m, calls = recorder(backend)
    a, b = backend.tensor([1.0]), backend.tensor([2.0])
    h = unihook.register_forward_pre_hook(m, lambda mod, args: (b, a, 4))
    m(a)
    assert len(calls[0][0]) == 3
    assert calls[0][0][0] is b and calls[0][0][1] is a and calls[0][0][2] == 4
    h.remove()
    unihook.register_forward_pre_hook(m, lambda mod, args: ())
    m(a, b)
    assert calls[1][0] == ()  # () means no args


def test_pre_hook_with_kwargs(backend: Any) -> None:
    m, calls = recorder(backend)
    t = backend.tensor([1.0, 2.0])
    seen = []

    def hook(mod: Any, args: Any, kwargs: Any) -> Any:
        seen.append((args, dict(kwargs)))
        return (args + (5,), {**kwargs, "extra": True})

    unihook.register_forward_pre_hook(m, hook, with_kwargs=True)
    m(t, flag=1)
    assert seen[0][0][0] is t and seen[0][1] == {"flag": 1}
    args, kwargs = calls[0]
    assert args[0] is t and args[1] == 5 and len(args) == 2
    assert kwargs == {"flag": 1, "extra": True}


def test_pre_hook_with_kwargs_none_keeps(backend: Any) -> None:
    m, calls = recorder(backend)
    unihook.register_forward_pre_hook(m, lambda mod, args, kwargs: None, with_kwargs=True)
    m(1, k=2)
    assert calls[0] == ((1,), {"k": 2})


@pytest.mark.parametrize(
    "bad",
    ["tensor", (1, 2, 3), ((1,), [("k", 1)]), (None, {})],
    ids=["tensor", "3-tuple", "kwargs-not-dict", "args-none"],
)
def test_pre_hook_with_kwargs_bad_return(backend: Any, bad: Any) -> None:
    m, calls = recorder(backend)
    value = backend.tensor([1.0]) if bad == "tensor" else bad
    unihook.register_forward_pre_hook(m, lambda mod, args, kwargs: value, with_kwargs=True)
    with pytest.raises(unihook.HookReturnError) as info:
        m(1)
    msg = str(info.value)
    assert "forward_pre" in msg
    assert type(m).__name__ in msg
    assert f"backend {backend.name}" in msg
    package = type(value).__module__.split(".")[0]
    received = type(value).__name__ if package == "builtins" else f"{package}.Tensor"
    assert f"Received: {received}" in msg
    assert "(new_args, new_kwargs)" in msg
    assert isinstance(info.value, RuntimeError)  # the frameworks' own error type, too
    assert calls == []  # forward did not run


def test_error_message_uses_qualified_name(backend: Any) -> None:
    m, _ = recorder(backend)
    unihook.register_forward_pre_hook(
        m, lambda mod, args, kwargs: 1, with_kwargs=True, name="encoder.0"
    )
    with pytest.raises(unihook.HookReturnError, match=r"forward_pre hook on 'encoder\.0'"):
        m(1)


def test_pre_hooks_chain_in_registration_order(backend: Any) -> None:
    m, calls = recorder(backend)
    order = []

    def make(tag: str) -> Any:
        def hook(mod: Any, args: Any) -> Any:
            order.append((tag, args))
            return args + (tag,)

        return hook

    unihook.register_forward_pre_hook(m, make("a"))
    unihook.register_forward_pre_hook(m, make("b"))
    unihook.register_forward_pre_hook(m, make("first"), prepend=True)
    m(0)
    assert order == [("first", (0,)), ("a", (0, "first")), ("b", (0, "first", "a"))]
    assert calls[0][0] == (0, "first", "a", "b")


class HookFailure(Exception):
    pass


def test_pre_hook_exception_propagates(backend: Any) -> None:
    m, calls = recorder(backend)
    ran = []

    def bad(mod: Any, args: Any) -> None:
        raise HookFailure("boom in pre-hook")

    unihook.register_forward_pre_hook(m, bad)
    unihook.register_forward_pre_hook(m, lambda mod, args: ran.append("later"))
    with pytest.raises(HookFailure, match="boom in pre-hook"):
        m(1)
    assert ran == [] and calls == []


def test_handle_remove_twice_and_context_manager(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    h = unihook.register_forward_pre_hook(m, lambda mod, args: seen.append("pre"))
    assert h.backend == backend.name and h.kind == "forward_pre" and not h.removed
    m(1)
    assert h.remove() is None
    assert h.removed
    h.remove()  # harmless
    m(1)
    assert seen == ["pre"]
    with unihook.register_forward_hook(m, lambda mod, args, out: seen.append("post")) as h2:
        assert h2.backend == backend.name and h2.kind == "forward"
        m(1)
    m(1)
    assert seen == ["pre", "post"]
    assert h2.removed
    no_residue(backend, m)


# ---------------------------------------------------------------------------------------------
# forward post-hooks


def test_post_hook_gets_args_after_pre_hooks_and_output(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    unihook.register_forward_pre_hook(m, lambda mod, args: args + ("pre",))
    unihook.register_forward_hook(m, lambda mod, args, out: seen.append((mod, args, out)))
    out = m(1, k=2)
    assert seen[0][0] is m
    assert seen[0][1] == (1, "pre")
    assert seen[0][2] is out and out == (1, "pre")


def test_post_hook_none_keeps_value_replaces(backend: Any) -> None:
    lin = backend.linear(2, 1, weight=[[1.0, 2.0]], bias=[0.5])
    x = backend.tensor([[1.0, 1.0]])
    unihook.register_forward_hook(lin, lambda mod, args, out: None)
    np.testing.assert_allclose(backend.numpy(lin(x)), [[3.5]])
    h = unihook.register_forward_hook(lin, lambda mod, args, out: out * 2)
    np.testing.assert_allclose(backend.numpy(lin(x)), [[7.0]])
    h.remove()
    sentinel = object()
    unihook.register_forward_hook(lin, lambda mod, args, out: sentinel)
    assert lin(x) is sentinel  # any non-None value replaces the output


def test_post_hook_with_kwargs(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []

    def hook(mod: Any, args: Any, kwargs: Any, out: Any) -> Any:
        seen.append((args, dict(kwargs), out))
        return "replaced"

    unihook.register_forward_hook(m, hook, with_kwargs=True)
    assert m(1, k=2) == "replaced"
    assert seen == [((1,), {"k": 2}, (1,))]


def test_post_hooks_chain_and_prepend(backend: Any) -> None:
    m = backend.module(lambda _self, x: [x])
    order = []

    def make(tag: str) -> Any:
        def hook(mod: Any, args: Any, out: Any) -> Any:
            order.append((tag, list(out)))
            return out + [tag]

        return hook

    unihook.register_forward_hook(m, make("a"))
    unihook.register_forward_hook(m, make("b"))
    unihook.register_forward_hook(m, make("first"), prepend=True)
    assert m(0) == [0, "first", "a", "b"]
    assert order == [("first", [0]), ("a", [0, "first"]), ("b", [0, "first", "a"])]


def test_post_hook_exception_propagates(backend: Any) -> None:
    m, calls = recorder(backend)
    ran = []

    def bad(mod: Any, args: Any, out: Any) -> None:
        raise HookFailure("boom in post-hook")

    unihook.register_forward_hook(m, bad)
    unihook.register_forward_hook(m, lambda mod, args, out: ran.append("later"))
    with pytest.raises(HookFailure, match="boom in post-hook"):
        m(1)
    assert calls == [((1,), {})] and ran == []


def test_always_call_runs_when_forward_raises(backend: Any) -> None:
    def forward(_self: Any, x: Any) -> Any:
        raise ZeroDivisionError("forward failed")

    m = backend.module(forward)
    seen = []
    unihook.register_forward_hook(
        m, lambda mod, args, out: seen.append(("always", args, out)), always_call=True
    )
    unihook.register_forward_hook(m, lambda mod, args, out: seen.append(("plain", args, out)))
    with pytest.raises(ZeroDivisionError, match="forward failed"):
        m(3)
    assert seen == [("always", (3,), None)]


def test_always_call_runs_when_pre_hook_raises(backend: Any) -> None:
    m, calls = recorder(backend)
    seen = []

    def bad(mod: Any, args: Any) -> None:
        raise HookFailure("pre failed")

    unihook.register_forward_pre_hook(m, bad)
    unihook.register_forward_hook(
        m,
        lambda mod, args, kwargs, out: seen.append((args, kwargs, out)),
        always_call=True,
        with_kwargs=True,
    )
    with pytest.raises(HookFailure, match="pre failed"):
        m(3, k=1)
    assert calls == [] and seen == [((3,), {"k": 1}, None)]


def test_always_call_hook_raising_after_forward_failed_warns(backend: Any) -> None:
    def forward(_self: Any, x: Any) -> Any:
        raise KeyError("forward failed")

    m = backend.module(forward)

    def bad(mod: Any, args: Any, out: Any) -> None:
        raise HookFailure("hook failed too")

    unihook.register_forward_hook(m, bad, always_call=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError, match="forward failed"):
            m(1)
    assert any(
        issubclass(w.category, UserWarning) and "hook failed too" in str(w.message) for w in caught
    )


def test_always_call_hook_runs_once_on_success(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    unihook.register_forward_hook(m, lambda mod, args, out: seen.append(out), always_call=True)
    m(1)
    assert seen == [(1,)]


def test_register_forward_post_hook_alias() -> None:
    assert unihook.register_forward_post_hook is unihook.register_forward_hook


def test_when_train_eval(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    unihook.register_forward_pre_hook(m, lambda mod, args: seen.append("train"), when="train")
    unihook.register_forward_hook(m, lambda mod, args, out: seen.append("eval"), when="eval")
    backend.set_training(m, True)
    m(1)
    backend.set_training(m, False)
    m(1)
    assert seen == ["train", "eval"]
    with pytest.raises(ValueError, match="when"):
        unihook.register_forward_hook(m, lambda *a: None, when="sometimes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# hooks changing hooks while hooks run (paddle natively: "OrderedDict mutated during iteration")


def test_pre_hook_registering_a_hook_runs_it_from_next_call(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []

    def adder(mod: Any, args: Any) -> None:
        seen.append("adder")
        unihook.register_forward_pre_hook(mod, lambda mod, args: seen.append("new-pre"))
        unihook.register_forward_hook(mod, lambda mod, args, out: seen.append("new-post"))

    h = unihook.register_forward_pre_hook(m, adder)
    m(1)
    assert seen == ["adder", "new-post"]  # post-hooks are read after the pre-hooks ran
    h.remove()
    seen.clear()
    m(1)
    assert seen == ["new-pre", "new-post"]


def test_post_hook_registering_a_hook_runs_it_from_next_call(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []

    def adder(mod: Any, args: Any, out: Any) -> None:
        seen.append("adder")
        if len(seen) == 1:
            unihook.register_forward_hook(mod, lambda mod, args, out: seen.append("new"))

    unihook.register_forward_hook(m, adder)
    m(1)
    assert seen == ["adder"]
    m(1)
    assert seen == ["adder", "adder", "new"]


def test_one_shot_hooks_remove_themselves(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    handles: dict[str, Any] = {}

    def once_pre(mod: Any, args: Any) -> Any:
        seen.append("pre")
        handles["pre"].remove()
        return args + ("once",)

    def once_post(mod: Any, args: Any, out: Any) -> Any:
        seen.append("post")
        handles["post"].remove()
        return "post-once"

    handles["pre"] = unihook.register_forward_pre_hook(m, once_pre)
    handles["post"] = unihook.register_forward_hook(m, once_post)
    unihook.register_forward_hook(m, lambda mod, args, out: seen.append(("tail", out)))
    assert m(1) == "post-once"
    assert m(2) == (2,)
    assert seen == ["pre", "post", ("tail", "post-once"), ("tail", (2,))]


def test_hook_removing_a_later_hook(backend: Any) -> None:
    m, _ = recorder(backend)
    seen = []
    handles: dict[str, Any] = {}

    def remover(mod: Any, args: Any) -> None:
        seen.append("remover")
        handles["later"].remove()
        handles["later_kw"].remove()
        handles["post"].remove()
        handles["post_kw"].remove()

    unihook.register_forward_pre_hook(m, remover)
    handles["later"] = unihook.register_forward_pre_hook(m, lambda mod, a: seen.append("later"))
    handles["later_kw"] = unihook.register_forward_pre_hook(
        m, lambda mod, a, kw: seen.append("later_kw"), with_kwargs=True
    )
    handles["post"] = unihook.register_forward_hook(m, lambda mod, a, o: seen.append("post"))
    handles["post_kw"] = unihook.register_forward_hook(
        m, lambda mod, a, kw, o: seen.append("post_kw"), with_kwargs=True
    )
    assert m(1) == (1,)
    # torch's reference: the running call iterates a snapshot of the pre-hooks, so a pre-hook
    # removed mid-call still runs once, a with_kwargs one with the call's kwargs (torch itself
    # would call it without them and fail); post-hooks are read after the pre-hooks.
    assert seen == ["remover", "later", "later_kw"]
    seen.clear()
    m(1)
    assert seen == ["remover"]


# ---------------------------------------------------------------------------------------------
# targets, residue, lifetime


def test_no_residue_after_removing_every_hook(backend: Any) -> None:
    lin = backend.linear(2, 2, weight=[[1.0, 0.0], [0.0, 1.0]], bias=[0.0, 0.0])
    x = backend.tensor([[1.0, 2.0]])
    before = backend.numpy(lin(x))
    no_residue(backend, lin)
    handles = [
        unihook.register_forward_pre_hook(lin, lambda m, a: (a[0] * 3,)),
        unihook.register_forward_pre_hook(
            lin, lambda m, a, k: None, with_kwargs=True, prepend=True
        ),
        unihook.register_forward_hook(lin, lambda m, a, o: o + 1),
        unihook.register_forward_hook(lin, lambda m, a, k, o: None, with_kwargs=True),
        unihook.register_forward_hook(lin, lambda m, a, o: None, always_call=True),
    ]
    counts = backend.hook_counts(lin)
    assert sum(counts.values()) >= 5 and not all(n == 0 for n in counts.values())
    np.testing.assert_allclose(backend.numpy(lin(x)), [[4.0, 7.0]])
    for h in handles:
        h.remove()
    no_residue(backend, lin)
    np.testing.assert_allclose(backend.numpy(lin(x)), before)


def test_forward_hook_on_tensor_is_a_target_error(backend: Any) -> None:
    t = backend.tensor([1.0])
    with pytest.raises(unihook.HookTargetError) as info:
        unihook.register_forward_hook(t, lambda m, a, o: None)
    assert "forward" in str(info.value) and backend.name in str(info.value)
    with pytest.raises(unihook.HookTargetError):
        unihook.register_forward_pre_hook(t, lambda m, a: None)
    assert isinstance(info.value, TypeError)


def test_plain_object_has_no_backend() -> None:
    class NotAModule:
        def __call__(self, x: Any) -> Any:
            return x

    with pytest.raises(unihook.NoBackendError) as info:
        unihook.register_forward_hook(NotAModule(), lambda m, a, o: None)
    assert isinstance(info.value, TypeError)
    assert "NotAModule" in str(info.value)
    with pytest.raises(unihook.NoBackendError):
        unihook.register_forward_pre_hook(object(), lambda m, a: None)
    with pytest.raises(TypeError, match="callable"):
        unihook.register_forward_hook(NotAModule(), "not a hook")  # type: ignore[arg-type]


def test_handle_does_not_keep_module_alive(backend: Any) -> None:
    lin = backend.linear(3, 2)
    handles = [
        unihook.register_forward_pre_hook(lin, lambda m, a: None),
        unihook.register_forward_pre_hook(lin, lambda m, a, k: None, with_kwargs=True),
        unihook.register_forward_hook(lin, lambda m, a, o: None, always_call=True),
    ]
    lin(backend.tensor([[1.0, 2.0, 3.0]]))
    ref = weakref.ref(lin)
    del lin
    gc.collect()
    assert ref() is None
    for h in handles:
        h.remove()  # removing after the module died is harmless
        assert h.removed


def test_hooks_fire_under_no_grad(backend: Any) -> None:
    lin = backend.linear(2, 1, weight=[[1.0, 1.0]], bias=[0.0])
    seen = []
    unihook.register_forward_pre_hook(lin, lambda m, a: seen.append("pre"))
    unihook.register_forward_hook(lin, lambda m, a, o: seen.append("post"))
    with backend.no_grad():
        lin(backend.tensor([[1.0, 2.0]]))
    assert seen == ["pre", "post"]


@pytest.mark.parametrize("where", ["module", "global"])
def test_a_with_kwargs_hook_removed_by_an_earlier_one_runs_once_with_the_kwargs(
    backend: Any, where: str
) -> None:
    """Removed during the call by an earlier hook, a with_kwargs hook runs for that call (the
    call's snapshot holds it, as any hook's) with the call's kwargs, and its returns apply:
    the frameworks read the flags live and would call it without them (torch's own module
    hook raises a TypeError then; its global one gets them)."""
    seen: list[Any] = []
    handles: dict[str, Any] = {}

    def forward(module: Any, x: Any, scale: float = 1.0) -> Any:
        return module.lin(x) * scale

    model = backend.module(forward, {"lin": backend.linear(2, 2)})
    on = backend.name

    def remover(key: str) -> Any:
        def remove(mod: Any, args: Any, *out: Any) -> None:
            handle = handles.pop(key, None) if mod is model else None
            if handle is not None:
                handle.remove()

        return remove

    def pre_kw(mod: Any, args: Any, kwargs: Any) -> Any:
        seen.append(("pre", dict(kwargs)))
        return (args[0] * 10.0,), kwargs

    def post_kw(mod: Any, args: Any, kwargs: Any, out: Any) -> Any:
        if mod is not model:
            return None
        seen.append(("post", dict(kwargs)))
        return out * 0.0 + 1.0

    if where == "module":
        removers = [
            unihook.register_forward_pre_hook(model, remover("pre_kw")),
            unihook.register_forward_hook(model, remover("post_kw")),
        ]
        handles["pre_kw"] = unihook.register_forward_pre_hook(model, pre_kw, with_kwargs=True)
        handles["post_kw"] = unihook.register_forward_hook(model, post_kw, with_kwargs=True)
    else:
        removers = [unihook.register_module_forward_hook(remover("post_kw"), backend=on)]
        handles["post_kw"] = unihook.register_module_forward_hook(
            post_kw, backend=on, with_kwargs=True
        )
    x = backend.tensor([[1.0, 2.0]])
    try:
        out = backend.numpy(model(x, scale=2.0))
        again = backend.numpy(model(x, scale=2.0))
    finally:
        for handle in [*removers, *handles.values()]:
            handle.remove()
    if where == "module":  # the pre-hook's args applied, then the post-hook's output
        assert seen == [("pre", {"scale": 2.0}), ("post", {"scale": 2.0})]
    else:
        assert seen == [("post", {"scale": 2.0})]
    np.testing.assert_allclose(out, [[1.0, 1.0]])
    assert not np.allclose(again, 1.0)


def test_a_with_kwargs_pre_hook_removed_by_an_earlier_one_cannot_replace_the_kwargs(
    backend: Any,
) -> None:
    """Run for the call as a plain pre-hook (the framework read its flag after its removal),
    it cannot replace the kwargs: the error names it, and no dict of the caller's changes."""
    defaults = {"scale": 2.0}
    handles: list[Any] = []

    def first(mod: Any, args: Any, kwargs: Any) -> Any:
        if handles:
            handles.pop().remove()
        return args, defaults

    model = backend.module(lambda self, x, scale=1.0: x * scale)
    remove_first = unihook.register_forward_pre_hook(model, first, with_kwargs=True)
    handles.append(
        unihook.register_forward_pre_hook(
            model, lambda m, a, k: (a, {"scale": 10.0}), with_kwargs=True, name="late"
        )
    )
    try:
        with pytest.raises(unihook.HookReturnError) as info:
            model(backend.tensor([1.0]))
        assert "late" in str(info.value) and "kwargs" in str(info.value)
        assert defaults == {"scale": 2.0}
        np.testing.assert_allclose(backend.numpy(model(backend.tensor([1.0]))), [2.0])
    finally:
        remove_first.remove()


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def pre(self, module: Any, args: Any, kwargs: Any) -> None:
        self.calls += 1

    def post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        self.calls += 1


def test_a_deep_copy_copies_a_with_kwargs_hooks_object(backend: Any) -> None:
    """As torch copies its own hooks: a deep copy of the module calls a copy of a bound method
    hook's object, with_kwargs too (until 2026-12-03 unihook's wrapper, a closure, which a
    deep copy keeps as it is, called the original's: helper-107's FINDING 4)."""
    import copy

    kit = backend
    counter = _Counter()
    m = kit.linear(3, 2)
    unihook.register_forward_pre_hook(m, counter.pre, with_kwargs=True)
    unihook.register_forward_hook(m, counter.post, with_kwargs=True)
    twin = copy.deepcopy(m)
    twin(kit.tensor([[1.0, 2.0, 3.0]]))
    assert counter.calls == 0
    copies = [hook.__self__ for hook in _bound_hooks(kit, twin)]
    assert copies and all(c is not counter and c.calls == 2 for c in copies)
    m(kit.tensor([[1.0, 2.0, 3.0]]))
    assert counter.calls == 2


def _bound_hooks(kit: Any, module: Any) -> list[Any]:
    """The bound methods of `_Counter` among `module`'s forward hooks (through unihook's
    wrappers: ``__wrapped__``)."""
    found = []
    for hooks in kit.hook_dicts(module).values():
        for hook in list(getattr(hooks, "values", lambda: hooks)()):
            hook = getattr(hook, "__wrapped__", hook)
            if isinstance(getattr(hook, "__self__", None), _Counter):
                found.append(hook)
    return found
