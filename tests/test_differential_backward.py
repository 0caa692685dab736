"""Differential: module backward hooks, with torch's NATIVE ``register_full_backward_hook`` /
``register_full_backward_pre_hook`` as the oracle.

Each scenario is built three times with the same weights: torch with native hooks, torch with
unihook, paddle with unihook. Every hook call (in order: module, kind, grad_input, grad_output)
and every parameter and input gradient must agree (rtol 1e-5, atol 1e-6). Torch's Linear weight
is [out, in], paddle's [in, out]: paddle's Linear weight gradients are transposed to compare.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message="No ccache found")
paddle = pytest.importorskip("paddle")

import unihook  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


# -- one small model API over both frameworks ----------------------------------------------------


class Torch:
    name = "torch"
    nn = torch.nn

    @staticmethod
    def tensor(data: Any, requires_grad: bool = False) -> Any:
        return torch.tensor(np.asarray(data, dtype="float32"), requires_grad=requires_grad)

    @staticmethod
    def numpy(t: Any) -> Any:
        return t.detach().numpy().copy()

    @staticmethod
    def grad(t: Any) -> Any:
        return None if t.grad is None else t.grad.numpy().copy()

    @staticmethod
    def linear(w: Any, b: Any) -> Any:
        m = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(w))
            m.bias.copy_(torch.from_numpy(b))
        return m

    @staticmethod
    def conv(w: Any, b: Any, padding: int = 0) -> Any:
        m = torch.nn.Conv2d(w.shape[1], w.shape[0], w.shape[2], padding=padding)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(w))
            m.bias.copy_(torch.from_numpy(b))
        return m

    @staticmethod
    def bn(w: Any, b: Any) -> Any:
        m = torch.nn.BatchNorm2d(len(w), eps=1e-5, momentum=0.1)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(w))
            m.bias.copy_(torch.from_numpy(b))
        return m

    @staticmethod
    def relu(inplace: bool = False) -> Any:
        return torch.nn.ReLU(inplace=inplace)

    @staticmethod
    def seq(*modules: Any) -> Any:
        return torch.nn.Sequential(*modules)

    @staticmethod
    def module(forward: Callable[..., Any], children: dict[str, Any]) -> Any:
        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                for name, child in children.items():
                    self.add_module(name, child)

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return forward(self, *args, **kwargs)

        return M()

    @staticmethod
    def named_modules(model: Any) -> list[tuple[str, Any]]:
        return list(model.named_modules())

    @staticmethod
    def param_grads(model: Any) -> dict[str, Any]:
        return {
            name: None if p.grad is None else p.grad.numpy().copy()
            for name, p in model.named_parameters()
        }

    @staticmethod
    def relu_fn(t: Any) -> Any:
        return torch.relu(t)

    @staticmethod
    def autograd_grad(out: Any, inputs: list[Any], retain: bool, create: bool) -> list[Any]:
        return list(torch.autograd.grad(out, inputs, retain_graph=retain, create_graph=create))


class Paddle:
    name = "paddle"

    @staticmethod
    def tensor(data: Any, requires_grad: bool = False) -> Any:
        return paddle.to_tensor(np.asarray(data, dtype="float32"), stop_gradient=not requires_grad)

    @staticmethod
    def numpy(t: Any) -> Any:
        return t.detach().numpy().copy()

    @staticmethod
    def grad(t: Any) -> Any:
        return None if t.grad is None else t.grad.numpy().copy()

    @staticmethod
    def linear(w: Any, b: Any) -> Any:
        m = paddle.nn.Linear(w.shape[1], w.shape[0])
        m.weight.set_value(w.T.copy())
        m.bias.set_value(b)
        return m

    @staticmethod
    def conv(w: Any, b: Any, padding: int = 0) -> Any:
        m = paddle.nn.Conv2D(w.shape[1], w.shape[0], w.shape[2], padding=padding)
        m.weight.set_value(w)
        m.bias.set_value(b)
        return m

    @staticmethod
    def bn(w: Any, b: Any) -> Any:
        # paddle's momentum is the weight of the old running value: torch's 0.1 is paddle's 0.9
        m = paddle.nn.BatchNorm2D(len(w), epsilon=1e-5, momentum=0.9)
        m.weight.set_value(w)
        m.bias.set_value(b)
        return m

    @staticmethod
    def relu(inplace: bool = False) -> Any:
        if not inplace:
            return paddle.nn.ReLU()
        return Paddle.module(lambda self, x: paddle.nn.functional.relu_(x), {})

    @staticmethod
    def seq(*modules: Any) -> Any:
        return paddle.nn.Sequential(*modules)

    @staticmethod
    def module(forward: Callable[..., Any], children: dict[str, Any]) -> Any:
        class M(paddle.nn.Layer):
            def __init__(self) -> None:
                super().__init__()
                for name, child in children.items():
                    self.add_sublayer(name, child)

            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return forward(self, *args, **kwargs)

        return M()

    @staticmethod
    def named_modules(model: Any) -> list[tuple[str, Any]]:
        return list(model.named_sublayers(include_self=True))

    @staticmethod
    def param_grads(model: Any) -> dict[str, Any]:
        out = {}
        linears = {
            f"{name}.weight" if name else "weight"
            for name, m in model.named_sublayers(include_self=True)
            if isinstance(m, paddle.nn.Linear)
        }
        for name, p in model.named_parameters():
            if p.stop_gradient:  # BatchNorm's running statistics: buffers in torch
                continue
            g = None if p.grad is None else p.grad.numpy().copy()
            out[name] = g.T.copy() if g is not None and name in linears else g
        return out

    @staticmethod
    def relu_fn(t: Any) -> Any:
        return paddle.nn.functional.relu(t)

    @staticmethod
    def autograd_grad(out: Any, inputs: list[Any], retain: bool, create: bool) -> list[Any]:
        return list(paddle.grad(out, inputs, retain_graph=retain, create_graph=create))


# -- running a scenario three ways -----------------------------------------------------------------


def to_numpy(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return t.detach().numpy().copy()
    return t.detach().numpy().copy()


Replace = Callable[..., Any]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, Any]] = []

    def full(self, label: str, replace: Replace | None) -> Callable[..., Any]:
        def hook(module: Any, grad_input: Any, grad_output: Any) -> Any:
            self.calls.append(
                (
                    label,
                    "full",
                    tuple(to_numpy(g) for g in grad_input),
                    tuple(to_numpy(g) for g in grad_output),
                )
            )
            return None if replace is None else replace(grad_input, grad_output)

        return hook

    def pre(self, label: str, replace: Replace | None) -> Callable[..., Any]:
        def hook(module: Any, grad_output: Any) -> Any:
            self.calls.append((label, "pre", None, tuple(to_numpy(g) for g in grad_output)))
            return None if replace is None else replace(grad_output)

        return hook


class Scenario:
    """build(F) -> (model, inputs: list of (array, requires_grad), call(model, *tensors) -> loss).
    `full`/`pre`: module name -> replacement function or None (hook on that module)."""

    def __init__(
        self,
        build: Callable[[Any], Any],
        inputs: list[tuple[Any, bool]],
        loss: Callable[[Any, Any, list[Any]], Any],
        full: dict[str, Replace | None] | None = None,
        pre: dict[str, Replace | None] | None = None,
        passes: Callable[[Any, Any, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.build = build
        self.inputs = inputs
        self.loss = loss
        self.full = full
        self.pre = pre
        # passes(F, loss, tensors) -> arrays to compare; default: loss.backward()
        self.passes = passes

    def run(self, F: Any, native: bool) -> dict[str, Any]:
        model = self.build(F)
        rec = Recorder()
        modules = dict(F.named_modules(model))
        full = self.full if self.full is not None else {name: None for name in modules}
        pre = self.pre if self.pre is not None else {name: None for name in modules}
        for name, replace in pre.items():
            hook = rec.pre(name or "<root>", replace)
            if native:
                modules[name].register_full_backward_pre_hook(hook)
            else:
                unihook.register_full_backward_pre_hook(modules[name], hook)
        for name, replace in full.items():
            hook = rec.full(name or "<root>", replace)
            if native:
                modules[name].register_full_backward_hook(hook)
            else:
                unihook.register_full_backward_hook(modules[name], hook)
        tensors = [F.tensor(data, requires_grad=rg) for data, rg in self.inputs]
        loss = self.loss(F, model, tensors)
        extra = [] if self.passes is None else self.passes(F, loss, tensors)
        if self.passes is None:
            loss.backward()
        return {
            "extra": extra,
            "loss": F.numpy(loss),
            "calls": rec.calls,
            "params": F.param_grads(model),
            "inputs": [F.grad(t) if rg else None for t, (_, rg) in zip(tensors, self.inputs)],
        }


def assert_same(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    np.testing.assert_allclose(actual["loss"], expected["loss"], rtol=RTOL, atol=ATOL)
    assert len(actual["extra"]) == len(expected["extra"]), what
    for i, (a, e) in enumerate(zip(actual["extra"], expected["extra"])):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what}: result {i}")
    order = [(label, kind) for label, kind, _, _ in actual["calls"]]
    expected_order = [(label, kind) for label, kind, _, _ in expected["calls"]]
    assert order == expected_order, f"{what}: hook call order"
    for i, (a, e) in enumerate(zip(actual["calls"], expected["calls"])):
        for slot, (ga, ge) in enumerate(((a[2], e[2]), (a[3], e[3]))):
            label = f"{what}: call {i} {e[0]} {e[1]} {'grad_input' if slot == 0 else 'grad_output'}"
            if ge is None:
                assert ga is None, label
                continue
            assert ga is not None and len(ga) == len(ge), label
            for j, (x, y) in enumerate(zip(ga, ge)):
                if y is None:
                    assert x is None, f"{label}[{j}]"
                else:
                    assert x is not None, f"{label}[{j}]"
                    np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"{label}[{j}]")
    assert actual["params"].keys() == expected["params"].keys(), what
    for name, g in expected["params"].items():
        if g is None:
            assert actual["params"][name] is None, f"{what}: {name}"
        else:
            np.testing.assert_allclose(
                actual["params"][name], g, rtol=RTOL, atol=ATOL, err_msg=f"{what}: {name}.grad"
            )
    for i, (a, e) in enumerate(zip(actual["inputs"], expected["inputs"])):
        if e is None:
            assert a is None, f"{what}: input {i}"
        else:
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what}: input {i}")


def check(scenario: Scenario) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        oracle = scenario.run(Torch, native=True)
        assert oracle["calls"], "the oracle fired no hook: the scenario tests nothing"
        assert_same(scenario.run(Torch, native=False), oracle, "unihook on torch")
        assert_same(scenario.run(Paddle, native=False), oracle, "unihook on paddle")
    return oracle


# -- scenarios ------------------------------------------------------------------------------------

RNG = np.random.default_rng(1234)


def rand(*shape: int) -> Any:
    return RNG.standard_normal(shape).astype("float32")


W1 = np.array([[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]], dtype="float32")
B1 = np.array([1, 2, 3, 4], dtype="float32")
W2 = np.array([[1, 2, 3, 4]], dtype="float32")
B2 = np.array([1], dtype="float32")


def seed_model(F: Any) -> Any:
    return F.seq(F.linear(W1, B1), F.relu(), F.linear(W2, B2))


def test_seed_model() -> None:
    oracle = check(Scenario(seed_model, [([[1, 1, 1]], True)], lambda F, m, xs: m(xs[0]).sum()))
    assert oracle["loss"] == 89
    np.testing.assert_allclose(oracle["inputs"][0], [[22, 26, 30]])


def test_seed_model_batch() -> None:
    check(Scenario(seed_model, [(rand(5, 3), True)], lambda F, m, xs: (m(xs[0]) ** 2).sum()))


CONV1_W, CONV1_B = rand(4, 3, 3, 3) * 0.5, rand(4)
BN1_W, BN1_B = RNG.uniform(0.5, 1.5, 4).astype("float32"), rand(4)
CONV2_W, CONV2_B = rand(2, 4, 3, 3) * 0.5, rand(2)
BN2_W, BN2_B = RNG.uniform(0.5, 1.5, 2).astype("float32"), rand(2)


def conv_stack(F: Any) -> Any:
    return F.seq(
        F.conv(CONV1_W, CONV1_B, padding=1),
        F.bn(BN1_W, BN1_B),
        F.relu(),
        F.conv(CONV2_W, CONV2_B),
        F.bn(BN2_W, BN2_B),
        F.relu(),
    )


def test_conv_batchnorm_relu_stack_train_mode() -> None:
    weights = rand(2, 2, 4, 4)
    check(
        Scenario(
            conv_stack,
            [(rand(2, 3, 6, 6), True)],
            lambda F, m, xs: (m(xs[0]) * F.tensor(weights)).sum(),
        )
    )


RES_C1_W, RES_C1_B = rand(3, 3, 3, 3) * 0.4, rand(3) * 0.1
RES_C2_W, RES_C2_B = rand(3, 3, 3, 3) * 0.4, rand(3) * 0.1
RES_BN_W, RES_BN_B = RNG.uniform(0.5, 1.5, 3).astype("float32"), rand(3)


def residual(F: Any, inplace: bool = False) -> Any:
    def forward(self: Any, x: Any) -> Any:
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.conv2(y)
        return self.relu2(y + x)

    return F.module(
        forward,
        {
            "conv1": F.conv(RES_C1_W, RES_C1_B, padding=1),
            "bn1": F.bn(RES_BN_W, RES_BN_B),
            "relu1": F.relu(inplace),
            "conv2": F.conv(RES_C2_W, RES_C2_B, padding=1),
            "relu2": F.relu(inplace),
        },
    )


RES_X = rand(2, 3, 5, 5)
RES_WEIGHTS = rand(2, 3, 5, 5)


def residual_loss(F: Any, m: Any, xs: list[Any]) -> Any:
    return (m(xs[0]) * F.tensor(RES_WEIGHTS)).sum()


def test_residual_block() -> None:
    check(Scenario(residual, [(RES_X, True)], residual_loss))


TWO_W, TWO_B = rand(2, 3), rand(2)


def two_inputs(F: Any) -> Any:
    def forward(self: Any, a: Any, b: Any, k: float, *, shift: Any = None) -> Any:
        out = self.lin(a) * b * k
        return out if shift is None else out + shift

    return F.seq(F.module(forward, {"lin": F.linear(TWO_W, TWO_B)}))


def test_two_tensor_inputs_one_without_grad_and_a_non_tensor() -> None:
    def loss(F: Any, m: Any, xs: list[Any]) -> Any:
        inner = m[0]
        return (inner(xs[0], xs[1], 3.0, shift=xs[2]) ** 2).sum()

    oracle = check(
        Scenario(
            two_inputs,
            [(rand(4, 3), True), (rand(4, 2), False), (rand(4, 2), True)],
            loss,
            full={"0": None, "0.lin": None},
            pre={"0": None, "0.lin": None},
        )
    )
    # the oracle itself: 3 slots for the outer module, a zero tensor for b, None for k
    [outer_full] = [c for c in oracle["calls"] if c[0] == "0" and c[1] == "full"]
    assert len(outer_full[2]) == 3 and outer_full[2][2] is None
    assert not outer_full[2][1].any()


def tuple_output(F: Any) -> Any:
    def forward(self: Any, a: Any) -> Any:
        h = self.lin(a)
        return h, F.relu_fn(h) * 2, "tag"

    return F.seq(F.module(forward, {"lin": F.linear(TWO_W, TWO_B)}))


def test_tuple_output_with_unused_element() -> None:
    def loss(F: Any, m: Any, xs: list[Any]) -> Any:
        first, _unused, tag = m[0](xs[0])
        assert tag == "tag"
        return (first**2).sum()

    oracle = check(
        Scenario(tuple_output, [(rand(3, 3), True)], loss, full={"0": None}, pre={"0": None})
    )
    assert oracle["calls"][0][3][1] is None and oracle["calls"][0][3][2] is None


def test_tuple_output_all_used() -> None:
    def loss(F: Any, m: Any, xs: list[Any]) -> Any:
        first, second, _ = m[0](xs[0])
        return (first**2).sum() + (second * 3).sum()

    check(Scenario(tuple_output, [(rand(3, 3), True)], loss, full={"0": None}, pre={"0": None}))


SHARED_W, SHARED_B = rand(3, 3) * 0.7, rand(3)


def called_twice(F: Any) -> Any:
    def forward(self: Any, x: Any) -> Any:
        return self.lin(F.relu_fn(self.lin(x)) * 2)

    return F.module(forward, {"lin": F.linear(SHARED_W, SHARED_B)})


def test_module_called_twice_in_one_forward() -> None:
    oracle = check(
        Scenario(called_twice, [(rand(2, 3), True)], lambda F, m, xs: (m(xs[0]) ** 2).sum())
    )
    assert [c[:2] for c in oracle["calls"]].count(("lin", "full")) == 2


def test_hooks_replace_grad_input_and_grad_output() -> None:
    full = {
        "0": lambda gi, go: ((gi[0] + gi[0].abs()) / 2,),  # clamp at 0
        "1": lambda gi, go: (gi[0] * 3,),
        "2": None,
        "": lambda gi, go: None,
    }
    pre = {
        "2": lambda go: (go[0] * -2,),
        "1": None,
        "": lambda go: None,
    }
    oracle = check(
        Scenario(
            seed_model,
            [(rand(4, 3), True)],
            lambda F, m, xs: (m(xs[0]) ** 2).sum(),
            full=full,
            pre=pre,
        )
    )
    assert len(oracle["calls"]) == 7


def test_pre_hook_feeds_full_hook_on_same_module() -> None:
    check(
        Scenario(
            seed_model,
            [(rand(2, 3), True)],
            lambda F, m, xs: m(xs[0]).sum(),
            full={"0": lambda gi, go: (gi[0] - 1,), "2": None},
            pre={"0": lambda go: (go[0] * 0.5,), "2": lambda go: (go[0] + 1,)},
        )
    )


def test_input_without_grad_fires_at_output() -> None:
    """No input needs grad: torch fires the full hook with grad_input all None."""
    check(
        Scenario(
            seed_model,
            [(rand(2, 3), False)],
            lambda F, m, xs: m(xs[0]).sum(),
            full={"0": None, "2": None},
            pre={"0": None},
        )
    )


# -- several passes over one graph ------------------------------------------------------------


def test_repeated_grad_passes_then_backward() -> None:
    """grad(retain_graph=True) twice, then backward: every pass fires the hooks (paddle too:
    only a second pass after Tensor.backward is impossible there, see trap 7)."""

    def passes(F: Any, loss: Any, xs: list[Any]) -> list[Any]:
        first = F.autograd_grad(loss, [xs[0]], retain=True, create=False)[0]
        second = F.autograd_grad(loss, [xs[0]], retain=True, create=False)[0]
        loss.backward()
        return [F.numpy(first), F.numpy(second)]

    oracle = check(
        Scenario(
            seed_model,
            [(rand(3, 3) * 0.1, True)],
            lambda F, m, xs: (m(xs[0]) ** 2).sum(),
            passes=passes,
        )
    )
    assert len(oracle["calls"]) == 3 * 8


def test_double_backward() -> None:
    """grad(create_graph=True), then the backward of a function of that gradient."""

    def passes(F: Any, loss: Any, xs: list[Any]) -> list[Any]:
        [g] = F.autograd_grad(loss, [xs[0]], retain=True, create=True)
        (g * g).sum().backward()
        return [F.numpy(g)]

    def build(F: Any) -> Any:
        return F.seq(F.linear(W1, B1), F.module(lambda self, x: x * x, {}), F.linear(W2, B2))

    check(
        Scenario(
            build,
            [(rand(2, 3) * 0.1, True)],
            lambda F, m, xs: (m(xs[0]) ** 2).sum(),
            passes=passes,
        )
    )


# -- in-place after the hooked module ------------------------------------------------------------


def basic_block(F: Any, inplace: bool = False) -> Any:
    """torchvision's BasicBlock without BatchNorm: conv, ReLU(inplace), conv, + x, ReLU."""

    def forward(self: Any, x: Any) -> Any:
        y = self.relu1(self.conv1(x))
        return self.relu2(self.conv2(y) + x)

    return F.module(
        forward,
        {
            "conv1": F.conv(RES_C1_W, RES_C1_B, padding=1),
            "relu1": F.relu(inplace),
            "conv2": F.conv(RES_C2_W, RES_C2_B, padding=1),
            "relu2": F.relu(inplace),
        },
    )


def test_native_torch_fails_with_inplace_relu_unihook_matches_plain() -> None:
    hooked = {"conv1": None, "conv2": None, "": None}
    with_inplace = Scenario(
        lambda F: basic_block(F, inplace=True), [(RES_X, True)], residual_loss, hooked, hooked
    )
    with pytest.raises(RuntimeError, match="inplace"):
        with_inplace.run(Torch, native=True)
    plain = Scenario(basic_block, [(RES_X, True)], residual_loss, hooked, hooked).run(
        Torch, native=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert_same(with_inplace.run(Torch, native=False), plain, "unihook on torch, in-place")
        assert_same(with_inplace.run(Paddle, native=False), plain, "unihook on paddle, in-place")


def test_native_torch_fails_with_inplace_add_unihook_matches_plain() -> None:
    def build(F: Any) -> Any:
        return F.seq(F.linear(W1, B1), F.linear(W2, B2))

    def loss(inplace: bool) -> Callable[..., Any]:
        def run(F: Any, m: Any, xs: list[Any]) -> Any:
            h = m[0](xs[0])
            if inplace:
                h.add_(F.tensor(1.0)) if F is Paddle else h.add_(1.0)
            else:
                h = h + 1.0
            return (m[1](h) ** 2).sum()

        return run

    hooked = {"0": None, "1": None}
    with_inplace = Scenario(build, [(rand(2, 3), True)], loss(True), hooked, hooked)
    with pytest.raises(RuntimeError, match="inplace"):
        with_inplace.run(Torch, native=True)
    plain = Scenario(build, [(rand(2, 3), True)], loss(False), hooked, hooked)
    # the same input data for both runs
    plain.inputs = with_inplace.inputs
    expected = plain.run(Torch, native=True)
    assert_same(with_inplace.run(Torch, native=False), expected, "unihook on torch, add_")
    assert_same(with_inplace.run(Paddle, native=False), expected, "unihook on paddle, add_")


def test_same_tensor_twice_and_a_detached_output() -> None:
    def build(F: Any) -> Any:
        def forward(self: Any, a: Any, b: Any) -> Any:
            h = self.lin(a * b)
            return h, h.detach() * 2

        return F.seq(F.module(forward, {"lin": F.linear(TWO_W, TWO_B)}))

    def loss(F: Any, m: Any, xs: list[Any]) -> Any:
        h, d = m[0](xs[0], xs[0])
        return (h * h).sum() + d.sum()

    check(Scenario(build, [(rand(2, 3), True)], loss, full={"0": None}, pre={"0": None}))
