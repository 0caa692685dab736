"""Global all-module hooks and registration hooks: torch's semantics on every backend."""

from __future__ import annotations

import copy
import gc
import threading
from typing import Any

import numpy as np
import pytest

import unihook
from unihook.conformance import installed_kits, kits


@pytest.fixture(autouse=True)
def pristine(backend: Any) -> Any:
    """Every test leaves the framework exactly as it found it (hooks an earlier test left to
    the collector, and the guard they keep installed, are collected first)."""
    gc.collect()
    before = backend.native_state()
    yield
    gc.collect()
    assert backend.native_state() == before


def test_order_relative_to_module_hooks(backend: Any) -> None:
    log: list[str] = []
    m = backend.linear(2, 2)
    unihook.register_forward_pre_hook(m, lambda *a: log.append("L-pre"))
    unihook.register_forward_hook(m, lambda *a: log.append("L-fwd"))
    with (
        unihook.register_module_forward_pre_hook(
            lambda *a: log.append("G-pre"), backend=backend.name
        ),
        unihook.register_module_forward_hook(lambda *a: log.append("G-fwd"), backend=backend.name),
    ):
        m(backend.tensor([[1.0, 2.0]]))
    assert log == ["G-pre", "L-pre", "G-fwd", "L-fwd"]
    log.clear()
    m(backend.tensor([[1.0, 2.0]]))
    assert log == ["L-pre", "L-fwd"]


def test_global_hooks_chain_in_registration_order(backend: Any) -> None:
    log: list[str] = []
    handles = [
        unihook.register_module_forward_pre_hook(
            lambda *a, i=i: log.append(f"pre{i}"), backend=backend.name
        )
        for i in range(3)
    ]
    backend.relu_module()(backend.tensor([1.0]))
    assert log == ["pre0", "pre1", "pre2"]
    for h in handles:
        h.remove()


def test_replacement_returns(backend: Any) -> None:
    m = backend.linear(1, 1, [[2.0]], [0.0])
    double_input = unihook.register_module_forward_pre_hook(
        lambda mod, args: args[0] * 2 if mod is m else None, backend=backend.name
    )
    add_one = unihook.register_module_forward_hook(
        lambda mod, args, out: out + 1 if mod is m else None, backend=backend.name
    )
    with double_input, add_one:
        assert backend.numpy(m(backend.tensor([[3.0]]))).tolist() == [[13.0]]
    assert backend.numpy(m(backend.tensor([[3.0]]))).tolist() == [[6.0]]


def test_with_kwargs(backend: Any) -> None:
    seen: list[Any] = []
    m = backend.module(lambda self, x, scale=1.0: x * scale)

    def pre(mod: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "scale": 10.0}

    def post(mod: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        seen.append(kwargs["scale"])

    with (
        unihook.register_module_forward_pre_hook(pre, backend=backend.name, with_kwargs=True),
        unihook.register_module_forward_hook(post, backend=backend.name, with_kwargs=True),
    ):
        out = m(backend.tensor([2.0]), scale=3.0)
    assert backend.numpy(out).tolist() == [20.0] and seen == [10.0]


def test_bad_with_kwargs_return(backend: Any) -> None:
    m = backend.relu_module()
    with unihook.register_module_forward_pre_hook(
        lambda mod, args, kwargs: 3, backend=backend.name, with_kwargs=True
    ):
        with pytest.raises(unihook.HookReturnError) as info:
            m(backend.tensor([1.0]))
    assert "module_forward_pre" in str(info.value) and backend.name in str(info.value)


def test_always_call(backend: Any) -> None:
    seen: list[Any] = []

    def boom(self: Any, x: Any) -> Any:
        raise KeyError("forward failed")

    m = backend.module(boom)
    with unihook.register_module_forward_hook(
        lambda mod, args, out: seen.append(out), backend=backend.name, always_call=True
    ):
        with pytest.raises(KeyError, match="forward failed"):
            m(backend.tensor([1.0]))
    assert seen == [None]


def test_modules_created_after_registration(backend: Any) -> None:
    seen: list[str] = []
    with unihook.register_module_forward_hook(
        lambda mod, args, out: seen.append(backend.type_name(mod)), backend=backend.name
    ):
        model = backend.sequential(backend.linear(2, 3), backend.relu_module())
        model(backend.tensor([[1.0, 1.0]]))
    assert seen == ["linear", "relu", "sequential"]


def test_backend_filter(backend: Any) -> None:
    others = [k for k in installed_kits() if k.name != backend.name]
    seen: list[str] = []
    with unihook.register_module_forward_hook(
        lambda mod, args, out: seen.append("hit"), backend=backend.name
    ) as handle:
        assert handle.backend == backend.name and handle.kind == "module_forward"
        for other in others:
            other.relu_module()(other.tensor([1.0]))
        assert seen == []
        backend.relu_module()(backend.tensor([1.0]))
        assert seen == ["hit"]


def test_unknown_backend_name() -> None:
    with pytest.raises(
        ValueError, match=r"`backend` must be one of \{None, .*Received: backend='jax'"
    ):
        unihook.register_module_forward_hook(lambda *a: None, backend="jax")


def test_every_backend_by_default() -> None:
    seen: list[str] = []
    with unihook.register_module_forward_hook(lambda mod, a, o: seen.append("x")) as handle:
        assert handle.backend == ",".join(k.name for k in installed_kits())
        for kit in installed_kits():
            kit.relu_module()(kit.tensor([1.0]))
    assert len(seen) == len(installed_kits())


def test_hook_registering_a_hook_while_hooks_run(backend: Any) -> None:
    log: list[str] = []
    late: list[unihook.Handle] = []

    def first(mod: Any, args: Any) -> None:
        log.append("first")
        if not late:
            late.append(
                unihook.register_module_forward_pre_hook(
                    lambda *a: log.append("late"), backend=backend.name
                )
            )
            late.append(unihook.register_forward_pre_hook(mod, lambda *a: log.append("local")))

    m = backend.relu_module()
    with unihook.register_module_forward_pre_hook(first, backend=backend.name):
        m(backend.tensor([1.0]))
        assert log == ["first"]  # new hooks run from the next call, as torch
        m(backend.tensor([1.0]))
        assert log == ["first", "first", "late", "local"]
    for h in late:
        h.remove()


def test_thread_safe_registration(backend: Any) -> None:
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(50):
                h = unihook.register_module_forward_hook(lambda *a: None, backend=backend.name)
                r = unihook.register_module_buffer_registration_hook(
                    lambda *a: None, backend=backend.name
                )
                h.remove()
                r.remove()
        except BaseException as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_removal_is_idempotent(backend: Any) -> None:
    h = unihook.register_module_forward_pre_hook(lambda *a: None, backend=backend.name)
    h.remove()
    h.remove()
    assert h.removed


# -- registration hooks --------------------------------------------------------------------


def test_parameter_registration_on_every_path(backend: Any) -> None:
    seen: list[tuple[str, str]] = []
    with unihook.register_module_parameter_registration_hook(
        lambda mod, name, value: seen.append((backend.type_name(mod), name)), backend=backend.name
    ):
        backend.linear(2, 2)  # attribute assignment inside the framework's constructor
        holder = backend.module(lambda self, x: x)
        holder.p = backend.parameter([1.0])  # attribute assignment
        backend.register_parameter(holder, "q", backend.parameter([2.0]))  # explicit method
    assert seen[:2] == [("linear", "weight"), ("linear", "bias")]
    assert seen[2:] == [(seen[2][0], "p"), (seen[2][0], "q")]


def test_parameter_registration_replacement(backend: Any) -> None:
    replacement = backend.parameter([42.0])
    with unihook.register_module_parameter_registration_hook(
        lambda mod, name, value: replacement if name == "p" else None, backend=backend.name
    ):
        holder = backend.module(lambda self, x: x)
        holder.p = backend.parameter([1.0])
    assert holder.p is replacement
    assert any(p is replacement for p in backend.parameters(holder))


@pytest.mark.parametrize("path", ["setattr", "register_parameter", "constructor"])
def test_parameter_registration_returning_a_plain_tensor(backend: Any, path: str) -> None:
    """torch registers the tensor a hook returns for a parameter; so must paddle (which would
    otherwise file it under buffers and lose the parameter)."""
    with unihook.register_module_parameter_registration_hook(
        lambda mod, name, value: value * 2, backend=backend.name
    ):
        if path == "constructor":
            holder = backend.linear(1, 1, weight=[[3.0]], bias=[1.0])
            names = ["weight", "bias"]
        else:
            holder = backend.module(lambda self, x: x)
            if path == "setattr":
                holder.p = backend.parameter([1.5])
            else:
                backend.register_parameter(holder, "p", backend.parameter([1.5]))
            names = ["p"]
    params = dict(zip(names, backend.parameters(holder)))
    assert len(backend.parameters(holder)) == len(names)
    if path != "constructor":
        assert backend.numpy(params["p"]).tolist() == [3.0]
        assert backend.requires_grad(params["p"])


def test_buffer_registration_on_every_path(backend: Any) -> None:
    seen: list[str] = []
    with unihook.register_module_buffer_registration_hook(
        lambda mod, name, value: seen.append(name), backend=backend.name
    ):
        holder = backend.module(lambda self, x: x)
        backend.register_buffer(holder, "b", backend.tensor([1.0]))
        # re-assignment of a buffer name, with what the framework files as a buffer there
        holder.b = getattr(backend, "buffer", backend.tensor)([2.0])
    assert seen == ["b", "b"]
    assert backend.numpy(holder.b).tolist() == [2.0]


def test_buffer_registration_replacement(backend: Any) -> None:
    with unihook.register_module_buffer_registration_hook(
        lambda mod, name, value: value * 10, backend=backend.name
    ):
        holder = backend.module(lambda self, x: x)
        backend.register_buffer(holder, "b", backend.tensor([1.0]))
    assert backend.numpy(holder.b).tolist() == [10.0]


def test_module_registration_on_every_path(backend: Any) -> None:
    seen: list[tuple[str, str]] = []
    with unihook.register_module_module_registration_hook(
        lambda mod, name, value: seen.append((name, backend.type_name(value))), backend=backend.name
    ):
        backend.sequential(backend.linear(1, 1))  # the container's own registration path
        holder = backend.module(lambda self, x: x)
        holder.child = backend.relu_module()  # attribute assignment
        backend.add_module(holder, "other", backend.linear(1, 1))  # explicit method
    assert seen == [("0", "linear"), ("child", "relu"), ("other", "linear")]


def test_module_registration_replacement(backend: Any) -> None:
    relu = backend.relu_module()
    with unihook.register_module_module_registration_hook(
        lambda mod, name, value: relu if name == "child" else None, backend=backend.name
    ):
        holder = backend.module(lambda self, x: x)
        holder.child = backend.linear(1, 1)
    assert holder.child is relu
    out = holder.child(backend.tensor([-1.0]))
    assert np.allclose(backend.numpy(out), [0.0])


@pytest.mark.parametrize("what", ["parameter", "buffer", "module"])
def test_registration_hooks_changed_by_another_thread_while_a_registration_runs_them(
    backend: Any, what: str
) -> None:
    """A registration runs the registration hooks there were as it started, whatever another
    thread registers or removes meanwhile, unihook's or native (torch and MindSpore loop over
    their live dict: "OrderedDict mutated during iteration", the registration lost)."""
    register = getattr(unihook, f"register_module_{what}_registration_hook")
    native_kind = f"module_{what}_registration"
    has_native = native_kind in backend.native_kinds
    log: list[str] = []
    inside, resume = threading.Event(), threading.Event()

    def logging(tag: str) -> Any:
        return lambda mod, name, value: log.append(f"{tag} {name}")

    def first(mod: Any, name: str, value: Any) -> None:
        log.append(f"first {name}")
        if name == "a":
            inside.set()
            resume.wait(10)

    removers = [backend.native_hook(None, native_kind, logging("native"))] if has_native else []
    handles = [
        register(first, backend=backend.name),
        register(logging("second"), backend=backend.name),
    ]

    def other() -> None:
        inside.wait(10)
        handles.pop().remove()
        handles.append(register(logging("late"), backend=backend.name))
        if has_native:
            removers.append(backend.native_hook(None, native_kind, logging("native late")))
        resume.set()

    action, value = {
        "parameter": (backend.register_parameter, lambda: backend.parameter([1.0])),
        "buffer": (backend.register_buffer, lambda: backend.tensor([1.0])),
        "module": (backend.add_module, backend.relu_module),
    }[what]
    holder = backend.module(lambda self, x: x)
    thread = threading.Thread(target=other)
    thread.start()
    try:
        action(holder, "a", value())
        thread.join()
        action(holder, "b", value())
    finally:
        resume.set()
        thread.join()
        for handle in handles:
            handle.remove()
        for remove in removers:
            remove()
    native = ["native a"] * has_native
    after = ["native b"] * has_native
    late = ["native late b"] * has_native
    assert log == [*native, "first a", "second a", *after, "first b", "late b", *late]
    assert hasattr(holder, "a") and hasattr(holder, "b")


# -- global backward hooks -----------------------------------------------------------------


def seed_model(kit: Any) -> Any:
    return kit.sequential(
        kit.linear(3, 4, [[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]], [1, 2, 3, 4]),
        kit.relu_module(),
        kit.linear(4, 1, [[1, 2, 3, 4]], [1]),
    )


def test_global_backward_hooks_fire_before_module_hooks(backend: Any) -> None:
    log: list[tuple[str, str]] = []
    model = seed_model(backend)
    name = {id(m): n or "model" for n, m in backend.named_modules(model)}
    on = backend.name
    full = unihook.register_module_full_backward_hook(
        lambda m, gi, go: log.append(("G", name[id(m)])), backend=on
    )
    pre = unihook.register_module_full_backward_pre_hook(
        lambda m, go: log.append(("Gpre", name[id(m)])), backend=on
    )
    local = unihook.register_full_backward_hook(model[0], lambda m, gi, go: log.append(("L", "0")))
    local_pre = unihook.register_full_backward_pre_hook(
        model[0], lambda m, go: log.append(("Lpre", "0"))
    )
    with full, pre, local, local_pre:
        backend.backward(model(backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum())
    assert log == [
        ("Gpre", "model"),
        ("Gpre", "2"),
        ("G", "2"),
        ("Gpre", "1"),
        ("G", "1"),
        ("Gpre", "0"),
        ("Lpre", "0"),
        ("G", "0"),
        ("L", "0"),
        ("G", "model"),
    ]


def test_global_backward_hook_replaces_grad_input(backend: Any) -> None:
    model = seed_model(backend)
    x = backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
    with unihook.register_module_full_backward_hook(
        lambda m, gi, go: tuple(g * 2 for g in gi) if m is model[0] else None, backend=backend.name
    ):
        backend.backward(model(x).sum())
    assert backend.grad(x).tolist() == [[44.0, 52.0, 60.0]]


def test_global_backward_hook_covers_new_modules_and_goes_away(backend: Any) -> None:
    seen: list[str] = []
    with unihook.register_module_full_backward_pre_hook(
        lambda m, go: seen.append(backend.type_name(m)), backend=backend.name
    ):
        model = seed_model(backend)  # created after registration
        backend.backward(model(backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum())
    assert seen == ["sequential", "linear", "relu", "linear"]
    backend.backward(model(backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum())
    assert len(seen) == 4


def test_global_backward_hook_bad_return_names_the_module(backend: Any) -> None:
    model = seed_model(backend)
    with unihook.register_module_full_backward_hook(
        lambda m, gi, go: (gi[0], gi[0]), backend=backend.name
    ):
        with pytest.raises(unihook.HookReturnError) as info:
            backend.backward(model(backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum())
    message = str(info.value)
    linear = type(backend.linear(1, 1)).__name__  # Linear (MindSpore: Dense)
    assert "module_full_backward" in message and linear in message and backend.name in message


def test_global_backward_hooks_with_inplace_relu(backend: Any) -> None:
    grads = []
    for inplace in (False, True):
        model = backend.sequential(
            backend.linear(
                3, 4, [[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]], [1, 2, 3, 4]
            ),
            backend.relu_module(inplace=inplace),
            backend.linear(4, 1, [[1, 2, 3, 4]], [1]),
        )
        seen: list[Any] = []
        x = backend.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
        with unihook.register_module_full_backward_hook(
            lambda m, gi, go: seen.append(backend.numpy(go[0]).tolist()), backend=backend.name
        ):
            backend.backward(model(x).sum())
        grads.append((seen, backend.grad(x).tolist()))
    assert grads[0] == grads[1]
    assert grads[0][1] == [[22.0, 26.0, 30.0]]


def test_global_hooks_differential_on_a_cnn() -> None:
    """A global forward hook collecting (type name, output shape) over the same CNN in every
    framework, and a global backward hook collecting grad_output norms, give the same sequences."""
    if len(kits()) < 2:
        pytest.skip("needs two backends")
    runs = []
    for kit in kits():
        kit.seed(0)
        model = kit.sequential(
            kit.conv2d(3, 4, 3, padding=1),
            kit.batchnorm2d(4),
            kit.relu_module(),
            kit.conv2d(4, 2, 3),
            kit.relu_module(),
        )
        for i, p in enumerate([model[0].weight, model[0].bias, model[3].weight, model[3].bias]):
            size = int(np.prod(kit.numpy(p).shape))
            kit.set_value(p, np.linspace(-1, 1, size).reshape(kit.numpy(p).shape) * (i + 1) / 3)
        forward: list[tuple[str, list[int]]] = []
        backward: list[tuple[str, float]] = []
        x = kit.tensor(np.linspace(-2, 2, 2 * 3 * 6 * 6).reshape(2, 3, 6, 6), requires_grad=True)
        with (
            unihook.register_module_forward_hook(
                lambda m, a, o: forward.append((kit.type_name(m), list(o.shape))), backend=kit.name
            ),
            unihook.register_module_full_backward_hook(
                lambda m, gi, go: backward.append(
                    (kit.type_name(m), float(unihook.ops.norm(go[0])))
                ),
                backend=kit.name,
            ),
        ):
            kit.backward(model(x).sum())
        runs.append((forward, backward))
    (forward, backward), *others = runs
    assert [t for t, _ in forward] == [
        "conv2d",
        "batchnorm2d",
        "relu",
        "conv2d",
        "relu",
        "sequential",
    ]
    for other_forward, other_backward in others:
        assert other_forward == forward
        assert [t for t, _ in other_backward] == [t for t, _ in backward]
        assert np.allclose([n for _, n in other_backward], [n for _, n in backward], rtol=1e-4)


@pytest.mark.parametrize("where", ["forward_pre", "forward"])
def test_backward_hook_registered_during_the_call_leaves_it_to_the_global_hooks(
    backend: Any, where: str
) -> None:
    """A forward (pre-)hook that registers a backward hook on its own module (lazy set-up):
    as torch takes a call's backward hooks when it starts, the global hooks fire for that call
    (and the gradient they scale is right), the new hook from the next call on."""
    lin = backend.linear(2, 2, [[1.0, 2.0], [3.0, 4.0]], [0.0, 0.0])
    calls: list[str] = []

    def scale(module, grad_input, grad_output):  # type: ignore[no-untyped-def]
        calls.append("global")
        return tuple(None if g is None else g * 10 for g in grad_input)

    handles: list[Any] = []

    def lazy(module, *args):  # type: ignore[no-untyped-def]
        if not handles:
            handles.append(
                unihook.register_full_backward_hook(module, lambda *a: calls.append("own"))
            )

    register = getattr(unihook, f"register_{where}_hook")
    with (
        unihook.register_module_full_backward_hook(scale, backend=backend.name),
        register(lin, lazy),
    ):
        for expected in (["global"], ["global", "own"]):
            calls.clear()
            x = backend.tensor([[1.0, 1.0]], requires_grad=True)
            backend.backward(lin(x).sum())
            assert calls == expected
            np.testing.assert_allclose(backend.grad(x), [[40.0, 60.0]])
    handles[0].remove()


def test_a_deep_copy_under_global_hooks_fires_each_once_and_keeps_none(backend: Any) -> None:
    """A model copied while global forward and backward hooks are on (an EMA copy, a teacher):
    the copy's calls fire each global hook once, as the original's, and once the hooks are
    removed neither keeps anything of them (MindSpore's copy kept the global forward
    dispatchers the original's hook dicts held beside its own: twice, and for good)."""
    log: list[str] = []
    on = backend.name
    model = seed_model(backend)
    x = [[1.0, 1.0, 1.0]]
    handles = [
        unihook.register_module_forward_pre_hook(lambda m, a: log.append("pre"), backend=on),
        unihook.register_module_forward_hook(lambda m, a, o: log.append("post"), backend=on),
        unihook.register_module_full_backward_hook(lambda m, gi, go: log.append("bw"), backend=on),
    ]
    backend.backward(model(backend.tensor(x, requires_grad=True)).sum())
    expected = list(log)
    assert sorted(set(expected)) == ["bw", "post", "pre"]
    copied = copy.deepcopy(model)
    log.clear()
    backend.backward(copied(backend.tensor(x, requires_grad=True)).sum())
    assert log == expected
    for handle in handles:
        handle.remove()
    log.clear()
    for m in (model, copied):
        backend.backward(m(backend.tensor(x, requires_grad=True)).sum())
        for _, module in backend.named_modules(m):
            assert all(not hooks for hooks in backend.hook_dicts(module).values())
    assert log == []


@pytest.mark.parametrize("last", [False, True], ids=["another-left", "the-last"])
def test_a_global_forward_hook_removed_and_one_added_inside_a_call(
    backend: Any, last: bool
) -> None:
    """As torch, which reads its global forward hooks after forward: one removed during a
    call does not fire for it, one registered there does, also when the removed one was the
    last (MindSpore took its dispatcher out of the running cell then); the next call fires the
    new one only."""
    fired: list[str] = []
    on = backend.name
    module = backend.linear(3, 2)

    def hook(name: str) -> Any:
        return lambda m, args, out: fired.append(name)

    handles = [unihook.register_module_forward_hook(hook("removed"), backend=on)]
    if not last:
        handles.append(unihook.register_module_forward_hook(hook("kept"), backend=on))

    def swap(m: Any, args: Any) -> None:
        if "swap" not in fired:
            fired.append("swap")
            handles[0].remove()
            handles.append(unihook.register_module_forward_hook(hook("added"), backend=on))

    remove_swap = backend.native_hook(module, "forward_pre", swap)
    try:
        for _ in range(2):
            module(backend.tensor([[1.0, 2.0, 3.0]]))
            fired.append("call")
    finally:
        remove_swap()
        for handle in handles:
            handle.remove()
    kept = [] if last else ["kept"]
    assert fired == ["swap", *kept, "added", "call", *kept, "added", "call"]
    assert all(not hooks for hooks in backend.hook_dicts(module).values())


def test_a_global_forward_hook_registered_in_a_call_beside_a_global_backward_one(
    backend: Any,
) -> None:
    """A global backward hook on (torch's call then takes its hook path), a global forward
    hook registered inside forward fires for the running call too (torch reads its global
    forward hooks after forward), and for the child called after it."""
    fired: list[str] = []
    handles: list[Any] = []
    on = backend.name

    def forward(self: Any, x: Any) -> Any:
        if len(handles) == 1:
            handles.append(
                unihook.register_module_forward_hook(
                    lambda m, a, o: fired.append("outer" if m is model else "inner"), backend=on
                )
            )
        return self.inner(x)

    model = backend.module(forward, {"inner": backend.module(lambda self, x: x * 2.0)})
    handles.append(unihook.register_module_full_backward_pre_hook(lambda m, go: None, backend=on))
    try:
        model(backend.tensor([[1.0, 2.0]]))
    finally:
        for handle in handles:
            handle.remove()
    assert fired == ["inner", "outer"]
