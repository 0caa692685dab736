"""Differential: module backward hooks, with torch's NATIVE ``register_full_backward_hook`` /
``register_full_backward_pre_hook`` as the oracle.

Each scenario is built through the backends' conformance kits (`unihook.testing.Kit`) with the
same weights: torch with native hooks (the oracle, through the torch kit's ``native_hook``),
then each selected backend with unihook (test ids ``[torch]``, ``[paddle]``, ``[mindspore]``).
Every hook call (in order: module, kind, grad_input, grad_output) and every parameter and input
gradient must agree (rtol 1e-5, atol 1e-6). Parameter gradients come in torch's layout
(``Kit.parameter_grads``: paddle's Linear weight gradients transposed).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

import unihook
from unihook.conformance import installed_kits
from unihook.testing import Kit, creates_graph, native_kinds, retains_graph

RTOL, ATOL = 1e-5, 1e-6


def _oracle() -> Kit:
    """The torch kit, whose native module backward hooks are the oracle."""
    for kit in installed_kits():
        if kit.name == "torch" and {"full_backward", "full_backward_pre"} <= native_kinds(kit):
            return kit
    pytest.skip("the oracle is torch's native module backward hooks: torch is not installed")


# -- running a scenario: natively on the oracle, through unihook on a backend --------------------


Replace = Callable[..., Any]


class Recorder:
    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.calls: list[tuple[str, str, Any, Any]] = []

    def arrays(self, grads: Any) -> tuple[Any, ...]:
        return tuple(None if g is None else self.kit.numpy(g) for g in grads)

    def full(self, label: str, replace: Replace | None) -> Callable[..., Any]:
        def hook(module: Any, grad_input: Any, grad_output: Any) -> Any:
            self.calls.append((label, "full", self.arrays(grad_input), self.arrays(grad_output)))
            return None if replace is None else replace(grad_input, grad_output)

        return hook

    def pre(self, label: str, replace: Replace | None) -> Callable[..., Any]:
        def hook(module: Any, grad_output: Any) -> Any:
            self.calls.append((label, "pre", None, self.arrays(grad_output)))
            return None if replace is None else replace(grad_output)

        return hook


class Scenario:
    """build(kit) -> model; inputs: list of (array, requires_grad); loss(kit, model, tensors)
    -> loss. `full`/`pre`: module name -> replacement function or None (hook on that module)."""

    def __init__(
        self,
        build: Callable[[Kit], Any],
        inputs: list[tuple[Any, bool]],
        loss: Callable[[Kit, Any, list[Any]], Any],
        full: dict[str, Replace | None] | None = None,
        pre: dict[str, Replace | None] | None = None,
        passes: Callable[[Kit, Any, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.build = build
        self.inputs = inputs
        self.loss = loss
        self.full = full
        self.pre = pre
        # passes(kit, loss, tensors) -> arrays to compare; default: the loss's backward
        self.passes = passes

    def run(self, kit: Kit, native: bool) -> dict[str, Any]:
        """Through `kit`: its framework's native hooks (`native`: the oracle) or unihook's."""
        model = self.build(kit)
        rec = Recorder(kit)
        modules = dict(kit.named_modules(model))
        full = self.full if self.full is not None else {name: None for name in modules}
        pre = self.pre if self.pre is not None else {name: None for name in modules}
        for name, replace in pre.items():
            hook = rec.pre(name or "<root>", replace)
            if native:
                kit.native_hook(modules[name], "full_backward_pre", hook)
            else:
                unihook.register_full_backward_pre_hook(modules[name], hook)
        for name, replace in full.items():
            hook = rec.full(name or "<root>", replace)
            if native:
                kit.native_hook(modules[name], "full_backward", hook)
            else:
                unihook.register_full_backward_hook(modules[name], hook)
        tensors = [kit.tensor(data, requires_grad=rg) for data, rg in self.inputs]
        loss = self.loss(kit, model, tensors)
        extra = [] if self.passes is None else self.passes(kit, loss, tensors)
        if self.passes is None:
            kit.backward(loss)
        return {
            "extra": extra,
            "loss": kit.numpy(loss),
            "calls": rec.calls,
            "params": kit.parameter_grads(model),
            "inputs": [kit.grad(t) if rg else None for t, (_, rg) in zip(tensors, self.inputs)],
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


def backends(retain_graph: bool = False, create_graph: bool = False) -> list[Kit]:
    """The selected backends' kits that can run a scenario needing `retain_graph` (a second
    backward of one graph) or `create_graph` (a backward of a backward); skips naming why
    when none can."""
    from unihook.conformance import kits

    able, unable = [], []
    for kit in kits():
        if retain_graph and not retains_graph(kit):
            unable.append(f"{kit.name}: one backward per forward (retain_graph)")
        elif create_graph and not creates_graph(kit):
            unable.append(f"{kit.name}: no backward of a backward (create_graph)")
        else:
            able.append(kit)
    if not able:
        pytest.skip("; ".join(unable) or "no backend selected")
    return able


def check(scenario: Scenario, **needs: bool) -> dict[str, Any]:
    """The oracle's run, then unihook's on every selected backend (`backends(**needs)`)."""
    oracle_kit, kits = _oracle(), backends(**needs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        oracle = scenario.run(oracle_kit, native=True)
        assert oracle["calls"], "the oracle fired no hook: the scenario tests nothing"
        for kit in kits:
            assert_same(scenario.run(kit, native=False), oracle, f"unihook on {kit.name}")
    return oracle


# -- scenarios ------------------------------------------------------------------------------------

RNG = np.random.default_rng(1234)


def rand(*shape: int) -> Any:
    return RNG.standard_normal(shape).astype("float32")


W1 = np.array([[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]], dtype="float32")
B1 = np.array([1, 2, 3, 4], dtype="float32")
W2 = np.array([[1, 2, 3, 4]], dtype="float32")
B2 = np.array([1], dtype="float32")


def linear(kit: Kit, w: Any, b: Any) -> Any:
    return kit.linear(w.shape[1], w.shape[0], w, b)


def conv(kit: Kit, w: Any, b: Any, padding: int = 0) -> Any:
    return kit.conv2d(w.shape[1], w.shape[0], w.shape[2], padding=padding, weight=w, bias=b)


def bn(kit: Kit, w: Any, b: Any) -> Any:
    return kit.batchnorm2d(len(w), weight=w, bias=b)


def seed_model(kit: Kit) -> Any:
    return kit.sequential(linear(kit, W1, B1), kit.relu_module(), linear(kit, W2, B2))


def test_seed_model() -> None:
    oracle = check(Scenario(seed_model, [([[1, 1, 1]], True)], lambda k, m, xs: m(xs[0]).sum()))
    assert oracle["loss"] == 89
    np.testing.assert_allclose(oracle["inputs"][0], [[22, 26, 30]])


def test_seed_model_batch() -> None:
    check(Scenario(seed_model, [(rand(5, 3), True)], lambda k, m, xs: (m(xs[0]) ** 2).sum()))


CONV1_W, CONV1_B = rand(4, 3, 3, 3) * 0.5, rand(4)
BN1_W, BN1_B = RNG.uniform(0.5, 1.5, 4).astype("float32"), rand(4)
CONV2_W, CONV2_B = rand(2, 4, 3, 3) * 0.5, rand(2)
BN2_W, BN2_B = RNG.uniform(0.5, 1.5, 2).astype("float32"), rand(2)


def conv_stack(kit: Kit) -> Any:
    return kit.sequential(
        conv(kit, CONV1_W, CONV1_B, padding=1),
        bn(kit, BN1_W, BN1_B),
        kit.relu_module(),
        conv(kit, CONV2_W, CONV2_B),
        bn(kit, BN2_W, BN2_B),
        kit.relu_module(),
    )


def test_conv_batchnorm_relu_stack_train_mode() -> None:
    weights = rand(2, 2, 4, 4)
    check(
        Scenario(
            conv_stack,
            [(rand(2, 3, 6, 6), True)],
            lambda k, m, xs: (m(xs[0]) * k.tensor(weights)).sum(),
        )
    )


RES_C1_W, RES_C1_B = rand(3, 3, 3, 3) * 0.4, rand(3) * 0.1
RES_C2_W, RES_C2_B = rand(3, 3, 3, 3) * 0.4, rand(3) * 0.1
RES_BN_W, RES_BN_B = RNG.uniform(0.5, 1.5, 3).astype("float32"), rand(3)


def residual(kit: Kit, inplace: bool = False) -> Any:
    def forward(self: Any, x: Any) -> Any:
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.conv2(y)
        return self.relu2(y + x)

    return kit.module(
        forward,
        {
            "conv1": conv(kit, RES_C1_W, RES_C1_B, padding=1),
            "bn1": bn(kit, RES_BN_W, RES_BN_B),
            "relu1": kit.relu_module(inplace),
            "conv2": conv(kit, RES_C2_W, RES_C2_B, padding=1),
            "relu2": kit.relu_module(inplace),
        },
    )


RES_X = rand(2, 3, 5, 5)
RES_WEIGHTS = rand(2, 3, 5, 5)


def residual_loss(kit: Kit, m: Any, xs: list[Any]) -> Any:
    return (m(xs[0]) * kit.tensor(RES_WEIGHTS)).sum()


def test_residual_block() -> None:
    check(Scenario(residual, [(RES_X, True)], residual_loss))


TWO_W, TWO_B = rand(2, 3), rand(2)


def two_inputs(kit: Kit) -> Any:
    def forward(self: Any, a: Any, b: Any, k: float, *, shift: Any = None) -> Any:
        out = self.lin(a) * b * k
        return out if shift is None else out + shift

    return kit.sequential(kit.module(forward, {"lin": linear(kit, TWO_W, TWO_B)}))


def test_two_tensor_inputs_one_without_grad_and_a_non_tensor() -> None:
    def loss(kit: Kit, m: Any, xs: list[Any]) -> Any:
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


def tuple_output(kit: Kit) -> Any:
    def forward(self: Any, a: Any) -> Any:
        h = self.lin(a)
        return h, kit.relu(h) * 2, "tag"

    return kit.sequential(kit.module(forward, {"lin": linear(kit, TWO_W, TWO_B)}))


def test_tuple_output_with_unused_element() -> None:
    def loss(kit: Kit, m: Any, xs: list[Any]) -> Any:
        first, _unused, tag = m[0](xs[0])
        assert tag == "tag"
        return (first**2).sum()

    oracle = check(
        Scenario(tuple_output, [(rand(3, 3), True)], loss, full={"0": None}, pre={"0": None})
    )
    assert oracle["calls"][0][3][1] is None and oracle["calls"][0][3][2] is None


def test_tuple_output_all_used() -> None:
    def loss(kit: Kit, m: Any, xs: list[Any]) -> Any:
        first, second, _ = m[0](xs[0])
        return (first**2).sum() + (second * 3).sum()

    check(Scenario(tuple_output, [(rand(3, 3), True)], loss, full={"0": None}, pre={"0": None}))


SHARED_W, SHARED_B = rand(3, 3) * 0.7, rand(3)


def called_twice(kit: Kit) -> Any:
    def forward(self: Any, x: Any) -> Any:
        return self.lin(kit.relu(self.lin(x)) * 2)

    return kit.module(forward, {"lin": linear(kit, SHARED_W, SHARED_B)})


def test_module_called_twice_in_one_forward() -> None:
    oracle = check(
        Scenario(called_twice, [(rand(2, 3), True)], lambda k, m, xs: (m(xs[0]) ** 2).sum())
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
            lambda k, m, xs: (m(xs[0]) ** 2).sum(),
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
            lambda k, m, xs: m(xs[0]).sum(),
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
            lambda k, m, xs: m(xs[0]).sum(),
            full={"0": None, "2": None},
            pre={"0": None},
        )
    )


# -- several passes over one graph ------------------------------------------------------------


def test_repeated_grad_passes_then_backward() -> None:
    """grad(retain_graph=True) twice, then backward: every pass fires the hooks (paddle too:
    only a second pass after Tensor.backward is impossible there, see trap 7)."""

    def passes(kit: Kit, loss: Any, xs: list[Any]) -> list[Any]:
        first = kit.grad_wrt([loss], [xs[0]], retain_graph=True, create_graph=False)[0]
        second = kit.grad_wrt([loss], [xs[0]], retain_graph=True, create_graph=False)[0]
        kit.backward(loss)
        return [kit.numpy(first), kit.numpy(second)]

    oracle = check(
        Scenario(
            seed_model,
            [(rand(3, 3) * 0.1, True)],
            lambda k, m, xs: (m(xs[0]) ** 2).sum(),
            passes=passes,
        ),
        retain_graph=True,
    )
    assert len(oracle["calls"]) == 3 * 8


def test_double_backward() -> None:
    """grad(create_graph=True), then the backward of a function of that gradient."""

    def passes(kit: Kit, loss: Any, xs: list[Any]) -> list[Any]:
        [g] = kit.grad_wrt([loss], [xs[0]], retain_graph=True, create_graph=True)
        kit.backward((g * g).sum())
        return [kit.numpy(g)]

    def build(kit: Kit) -> Any:
        square = kit.module(lambda self, x: x * x, {})
        return kit.sequential(linear(kit, W1, B1), square, linear(kit, W2, B2))

    check(
        Scenario(
            build,
            [(rand(2, 3) * 0.1, True)],
            lambda k, m, xs: (m(xs[0]) ** 2).sum(),
            passes=passes,
        ),
        create_graph=True,
    )


# -- in-place after the hooked module ------------------------------------------------------------


def basic_block(kit: Kit, inplace: bool = False) -> Any:
    """torchvision's BasicBlock without BatchNorm: conv, ReLU(inplace), conv, + x, ReLU."""

    def forward(self: Any, x: Any) -> Any:
        y = self.relu1(self.conv1(x))
        return self.relu2(self.conv2(y) + x)

    return kit.module(
        forward,
        {
            "conv1": conv(kit, RES_C1_W, RES_C1_B, padding=1),
            "relu1": kit.relu_module(inplace),
            "conv2": conv(kit, RES_C2_W, RES_C2_B, padding=1),
            "relu2": kit.relu_module(inplace),
        },
    )


def test_native_torch_fails_with_inplace_relu_unihook_matches_plain() -> None:
    oracle, kits = _oracle(), backends()
    hooked = {"conv1": None, "conv2": None, "": None}
    with_inplace = Scenario(
        lambda kit: basic_block(kit, inplace=True), [(RES_X, True)], residual_loss, hooked, hooked
    )
    with pytest.raises(RuntimeError, match="inplace"):
        with_inplace.run(oracle, native=True)
    plain = Scenario(basic_block, [(RES_X, True)], residual_loss, hooked, hooked).run(
        oracle, native=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for kit in kits:
            what = f"unihook on {kit.name}, in-place"
            assert_same(with_inplace.run(kit, native=False), plain, what)


def test_native_torch_fails_with_inplace_add_unihook_matches_plain() -> None:
    oracle, kits = _oracle(), backends()

    def build(kit: Kit) -> Any:
        return kit.sequential(linear(kit, W1, B1), linear(kit, W2, B2))

    def loss(inplace: bool) -> Callable[..., Any]:
        def run(kit: Kit, m: Any, xs: list[Any]) -> Any:
            h = m[0](xs[0])
            if inplace:
                kit.add_(h, 1.0)
            else:
                h = h + 1.0
            return (m[1](h) ** 2).sum()

        return run

    hooked = {"0": None, "1": None}
    with_inplace = Scenario(build, [(rand(2, 3), True)], loss(True), hooked, hooked)
    with pytest.raises(RuntimeError, match="inplace"):
        with_inplace.run(oracle, native=True)
    plain = Scenario(build, [(rand(2, 3), True)], loss(False), hooked, hooked)
    # the same input data for both runs
    plain.inputs = with_inplace.inputs
    expected = plain.run(oracle, native=True)
    for kit in kits:
        assert_same(with_inplace.run(kit, native=False), expected, f"unihook on {kit.name}, add_")


def test_same_tensor_twice_and_a_detached_output() -> None:
    def build(kit: Kit) -> Any:
        def forward(self: Any, a: Any, b: Any) -> Any:
            h = self.lin(a * b)
            return h, unihook.ops.detach(h) * 2

        return kit.sequential(kit.module(forward, {"lin": linear(kit, TWO_W, TWO_B)}))

    def loss(kit: Kit, m: Any, xs: list[Any]) -> Any:
        h, d = m[0](xs[0], xs[0])
        return (h * h).sum() + d.sum()

    check(Scenario(build, [(rand(2, 3), True)], loss, full={"0": None}, pre={"0": None}))
