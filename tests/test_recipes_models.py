"""The recipes on the reference architectures (issue 14): torch and paddle twins with the same
weights, against references computed here with torch's native hooks and numpy."""

from __future__ import annotations

import collections
import math
import warnings
from typing import Any, Callable

import numpy as np
import paddle
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_ref import ARCHS, build

from unihook import HookArgumentError, HookTargetError, ops
from unihook.conformance import kit
from unihook.recipes import ActivationStats, DropHook, GradCAM, GradientMonitor
from unihook.recipes.cam import _resize_bilinear
from unihook.testing import classifier, images

RESNET = ARCHS["resnet18"]


@pytest.fixture(scope="module")
def resnet() -> tuple[torch.nn.Module, paddle.nn.Layer]:
    model, _, twin = build(RESNET)
    return model, twin


def batch(shape: tuple[int, ...] = (2, 3, 64, 64)) -> np.ndarray:
    return np.random.default_rng(7).normal(0, 1, shape).astype(np.float32)


def reference_cams(model: torch.nn.Module, layer: str, x: np.ndarray) -> list[np.ndarray]:
    """One Grad-CAM per call of `layer`, each call's output with that output's gradient
    (torch's native forward hook and tensor hooks, as pytorch-grad-cam records them)."""
    records: list[list[Any]] = []

    def hook(module: Any, args: Any, output: torch.Tensor) -> None:
        record = [output.detach().clone(), None]
        records.append(record)
        output.register_hook(lambda g: record.__setitem__(1, g.detach().clone()))

    handle = dict(model.named_modules())[layer].register_forward_hook(hook)
    try:
        logits = model(torch.tensor(x))
        logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
    finally:
        handle.remove()
    maps = []
    for activation, grad in records:
        weights = grad.double().mean((2, 3), keepdim=True)
        cam = np.maximum((weights * activation.double()).sum(1).numpy(), 0)
        cam = _resize_bilinear(cam, *x.shape[2:])
        low, high = cam.min((1, 2), keepdims=True), cam.max((1, 2), keepdims=True)
        maps.append((cam - low) / np.where(high > low, high - low, 1))
    return maps


def test_grad_cam_pairs_each_call_with_its_gradient(resnet: Any) -> None:
    """layer4.1.relu runs twice per forward (torchvision's BasicBlock): call=0 and call=-1 give
    the first and last call's map; both frameworks match the native-hook reference."""
    model, twin = resnet
    x = batch()
    first, last = reference_cams(model, "layer4.1.relu", x)
    assert np.abs(first - last).max() > 0.3  # the choice matters
    for net, tensor in ((model, torch.tensor(x)), (twin, paddle.to_tensor(x))):
        for call, want in ((0, first), (1, last), (-1, last), (-2, first)):
            with GradCAM(net, "layer4.1.relu", call=call) as cam:
                got = cam(tensor)
            np.testing.assert_allclose(got, want, atol=2e-4, err_msg=f"{type(net)} {call}")
    with GradCAM(model, "layer4.1.relu", call=2) as cam:
        with pytest.raises(HookArgumentError, match="ran 2 time"):
            cam(torch.tensor(x))


def test_grad_cam_modules_names_and_lists(resnet: Any) -> None:
    model, twin = resnet
    x = batch()
    (want,) = reference_cams(model, "layer4", x)
    (third,) = reference_cams(model, "layer3", x)
    both = (want + third) / 2
    both = (both - both.min((1, 2), keepdims=True)) / np.ptp(both, (1, 2), keepdims=True)
    for net, tensor in ((model, torch.tensor(x)), (twin, paddle.to_tensor(x))):
        for target in (net.layer4, "layer4", [net.layer4]):
            with GradCAM(net, target) as cam:
                np.testing.assert_allclose(cam(tensor), want, atol=2e-4)
        with GradCAM(net, [net.layer3, "layer4"]) as cam:
            np.testing.assert_allclose(cam(tensor), both, atol=2e-4)
        assert no_hooks(net)


def no_hooks(net: Any) -> bool:
    k = kit("torch" if isinstance(net, torch.nn.Module) else "paddle")
    return all(sum(k.hook_counts(m).values()) == 0 for _, m in k.named_modules(net))


def test_targets_rejected_with_a_clear_error(resnet: Any) -> None:
    model, twin = resnet
    stranger = torch.nn.Linear(2, 2)
    for make, what in (
        (lambda t: GradCAM(model, t), "target_layers"),
        (lambda t: DropHook(model, t, 0.1), "targets"),
    ):
        with pytest.raises(HookArgumentError, match=f"`{what}` must be a module of `model`.*3"):
            make(3)
        with pytest.raises(HookArgumentError, match="Received: Linear .not a submodule"):
            make(stranger)
        with pytest.raises(HookArgumentError, match="'layer9', which matches no module"):
            make(["layer4", "layer9"])
        with pytest.raises(HookArgumentError, match="Received: BasicBlock"):
            make(twin.layer4[0])  # a module of the paddle twin, not of this model
    for make in (ActivationStats, GradientMonitor):
        with pytest.raises(HookArgumentError, match="`where` must be None, a glob.*Received: 3"):
            make(model, [model.layer4, 3])
        with pytest.raises(HookArgumentError, match="not a submodule"):
            make(model, stranger)
    assert no_hooks(model)


def test_where_takes_modules(resnet: Any) -> None:
    model, _ = resnet
    x = torch.tensor(batch())
    with ActivationStats(model, model.layer4) as stats:
        with torch.no_grad():  # a forward-only recipe works without gradients
            model(x)
    assert [r["name"] for r in stats.rows()] == ["layer4"]
    with ActivationStats(model, [model.layer4[1].relu, "fc"]) as stats:
        model(x)
    assert [(r["name"], r["calls"]) for r in stats.rows()] == [("layer4.1.relu", 2), ("fc", 1)]
    with GradientMonitor(model, model.fc) as monitor:
        model(x).sum().backward()
    assert [list(step) for step in monitor.history] == [["fc"]]
    model.zero_grad()


def native_stats(model: torch.nn.Module, x: np.ndarray) -> dict[str, dict[str, float]]:
    """Every module's outputs as returned (before later in-place ops), stats in numpy float64."""
    seen: dict[str, list[np.ndarray]] = collections.defaultdict(list)
    handles = [
        m.register_forward_hook(
            lambda m, a, out, name=name: seen[name].append(out.detach().double().numpy().copy())
        )
        for name, m in model.named_modules()
    ]
    with torch.no_grad():
        model(torch.tensor(x))
    for h in handles:
        h.remove()
    out = {}
    for name, arrays in seen.items():
        v = np.concatenate([a.ravel() for a in arrays])
        out[name] = {"calls": len(arrays), "mean": v.mean(), "std": v.std(), "min": v.min()}
        out[name].update(max=v.max(), zeros=(v == 0).mean())
    return out


def test_activation_stats_on_resnet(resnet: Any) -> None:
    """In-place ReLUs called twice, `out += identity`: each call counted as returned, the same
    rows on both frameworks and as numpy's float64 on the outputs."""
    model, twin = resnet
    x = batch()
    want = native_stats(model, x)
    rows = {}
    for net, tensor in ((model, torch.tensor(x)), (twin, paddle.to_tensor(x))):
        with ActivationStats(net) as stats:
            net(tensor)
        rows["torch" if net is model else "paddle"] = {r["name"]: r for r in stats.rows()}
    assert rows["torch"]["layer1.0.relu"]["calls"] == 2
    for name, ref in want.items():
        for side in ("torch", "paddle"):
            if name not in rows[side]:
                continue  # paddle names a few wrapper layers differently
            got = rows[side][name]
            for key, value in ref.items():
                assert np.isclose(got[key], value, rtol=2e-5, atol=1e-5), (side, name, key)
    assert len(set(rows["torch"]) & set(rows["paddle"])) >= 40


def test_activation_stats_stable_variance(backend) -> None:  # type: ignore[no-untyped-def]
    """float64 activations of 1e5 +- 1e-3 over two calls: the std of the values (E[x^2] -
    mean^2 gives 0), the exact mean; a namedtuple output counts both its tensors."""
    pair = collections.namedtuple("pair", "a b")
    layer = backend.module(lambda self, x: pair(x, x + 0.0))
    rng = np.random.default_rng(0)
    chunks = [1e5 + rng.uniform(-1e-3, 1e-3, (3, 500)) for _ in range(2)]
    with ActivationStats(layer) as stats:
        for chunk in chunks:
            layer(backend.tensor(chunk, dtype="float64"))
    (row,) = stats.rows()
    values = np.concatenate([c.ravel() for c in chunks] * 2)
    assert row["calls"] == 2
    assert row["mean"] == pytest.approx(values.mean(), rel=1e-15)
    assert row["std"] == pytest.approx(values.std(), rel=1e-6)
    assert (row["min"], row["max"]) == (values.min(), values.max())


def test_gradient_monitor_norms_agree_across_frameworks() -> None:
    """conv1's grad_output has 4 * 64 * 56 * 56 = 802,816 elements, where float32 norms differ
    by 1e-4 between the frameworks; the float64 ones agree to 1e-5 and with numpy's. Eval mode:
    in train mode the twins' gradients themselves differ by 3e-5 (batch statistics)."""
    model, _, twin = build(RESNET)
    model.eval()
    twin.eval()
    x = batch((4, 3, 112, 112))
    grads = {}
    h = model.conv1.register_full_backward_hook(
        lambda m, gi, go: grads.__setitem__("conv1", go[0].double().numpy().copy())
    )
    histories = []
    for net, tensor in ((model, torch.tensor(x)), (twin, paddle.to_tensor(x))):
        with GradientMonitor(net) as monitor:
            out = net(tensor)
            (out * out).sum().backward()
        histories.append(monitor.history[-1])
    h.remove()
    torch_norms, paddle_norms = histories
    assert grads["conv1"].size == 802_816
    # float32 row sums added in float64 (`unihook.ops.cpu_sum_squares`): 1e-9 off here
    assert torch_norms["conv1"] == pytest.approx(np.linalg.norm(grads["conv1"]), rel=1e-8)
    common = [n for n in torch_norms if n in paddle_norms]
    assert len(common) >= 40
    worst = max(abs(torch_norms[n] / paddle_norms[n] - 1) for n in common)
    assert worst < 1e-5, worst


def test_gradient_monitor_sums_the_calls_of_a_module(backend) -> None:  # type: ignore[no-untyped-def]
    relu = backend.relu_module()
    model = backend.module(lambda self, x: self.relu(self.relu(x) * 2), {"relu": relu})
    x = backend.tensor([[1.0, -1.0, 2.0]], requires_grad=True)
    with GradientMonitor(model) as monitor:
        backend.backward((model(x) * 3).sum())
    # grad_output of the second call is 3 on every element, of the first 3 * 2 where kept
    assert monitor.history[-1]["relu"] == pytest.approx(np.sqrt(3 * 9 + 2 * 36))


def test_gradient_monitor_on_a_module_returning_its_parameter(backend) -> None:  # type: ignore[no-untyped-def]
    """A module whose output is its own parameter (a positional table): a gradient hook on it
    would stay on the parameter and fire in every later backward, adding each to the earlier
    steps' entries. Each entry holds its own backward's gradient, and stays as recorded."""
    table = backend.module(lambda self: self.table)
    backend.register_parameter(table, "table", backend.parameter(np.ones((2, 3), np.float32)))
    model = backend.module(lambda self, x: x * self.pos(), {"pos": table})
    with GradientMonitor(model) as monitor:
        for scale in (1.0, 2.0, 3.0):
            backend.backward(model(backend.tensor(np.full((2, 3), scale, np.float32))).sum())
            entries = [entry["pos"] for entry in monitor.history]  # the table's gradient is x
            assert entries == pytest.approx([math.sqrt(6) * s for s in range(1, int(scale) + 1)])


def test_gradient_monitor_leaves_out_a_module_returning_its_parameter_twice(backend) -> None:  # type: ignore[no-untyped-def]
    """A module called twice in a forward, returning its parameter both times: a hook on the
    parameter sees the sum of both calls' uses, neither call's own (until 2026-12-08 that sum
    was recorded twice, helper-222's FINDING 2): the module is left out, said, and the model's
    own norm stays."""
    table = backend.module(lambda self: self.table)
    backend.register_parameter(table, "table", backend.parameter(np.ones((2, 3), np.float32)))
    model = backend.module(lambda self, x: x * self.pos() + self.pos(), {"pos": table})
    with warnings.catch_warnings(record=True) as said, GradientMonitor(model) as monitor:
        warnings.simplefilter("always")
        backend.backward(model(backend.tensor(np.full((2, 3), 2.0, np.float32))).sum())
    assert dict(monitor.history[-1]) == pytest.approx({"": math.sqrt(6)})
    assert [w for w in said if "'pos' returned a tensor that a later call" in str(w.message)]


def test_every_n_and_bounded_history(backend) -> None:  # type: ignore[no-untyped-def]
    """every=3: forwards 0, 3, 6 recorded; between them no hook of the recipe but the model's
    counter. max_history keeps the last backwards."""
    model = classifier(backend)
    x = images(backend)
    leaves = [m for name, m in backend.named_modules(model) if name]

    def hooks_on_children() -> int:
        return sum(sum(backend.hook_counts(m).values()) for m in leaves)

    with ActivationStats(model, every=3) as stats:
        counts = []
        for _ in range(7):
            counts.append(hooks_on_children())
            model(x)
    assert counts == [counts[0], 0, 0, counts[0], 0, 0, counts[0]] and counts[0] > 0
    assert {r["calls"] for r in stats.rows()} == {3}
    assert hooks_on_children() == 0

    every_step = GradientMonitor(model)
    with GradientMonitor(model, every=2, max_history=2) as monitor:
        for _ in range(6):
            backend.backward(model(x).sum())
    every_step.remove()
    assert len(every_step.history) == 6 and len(monitor.history) == 2  # steps 2 and 4
    assert list(monitor.history) == [every_step.history[2], every_step.history[4]]
    with pytest.raises(HookArgumentError, match="`every` must be a positive int"):
        GradientMonitor(model, every=0)
    with pytest.raises(HookArgumentError, match="`max_history` must be"):
        GradientMonitor(model, max_history=0)
    assert all(sum(backend.hook_counts(m).values()) == 0 for m in [model, *leaves])


def test_every_n_counts_the_forwards_with_gradients(backend) -> None:  # type: ignore[no-untyped-def]
    """GradientMonitor's `every` counts the forwards that record gradients: an evaluation under
    no_grad between training steps does not take a logged slot (it has no gradient to log);
    a single process's ActivationStats counts and records it (it has activations)."""
    model = classifier(backend)
    x = images(backend)
    every_step = GradientMonitor(model)
    with (
        GradientMonitor(model, every=2) as monitor,
        ActivationStats(model, every=2) as stats,
    ):
        for _ in range(5):
            with backend.no_grad():
                model(x)
            backend.backward(model(x).sum())
    every_step.remove()
    assert len(every_step.history) == 5
    assert list(monitor.history) == [every_step.history[i] for i in (0, 2, 4)]
    assert len(stats.history) == 5  # forwards 0, 2, ..., 8 of 10: the evaluations


@pytest.mark.parametrize("size", [7, 14, 28, 56])
def test_drop_block_drops_p(backend, size: int) -> None:  # type: ignore[no-untyped-def]
    """The measured dropped fraction is p +- 0.03 for every map and block size up to the map
    (a block larger than the map is clamped to it); kept values are rescaled."""
    layer = backend.relu_module()
    backend.set_training(layer, True)
    backend.seed(size)  # deterministic; the sampling error is ~0.01 at most below
    for block in sorted({1, 3, 7, size, size + 5}):
        # a block as large as the map drops whole channels: more of them for the same error
        channels = 2048 if size - min(block, size) < 2 else 256
        ones = backend.tensor(np.ones((16, channels // 16, size, size)))
        for p in (0.1, 0.3):
            with DropHook(layer, [layer], p, mode="dropblock", block_size=block):
                out = backend.numpy(layer(ones))
            dropped = (out == 0).mean()
            assert abs(dropped - p) < 0.03, (size, block, p, dropped)
            assert np.allclose(out[out != 0], 1 / (1 - dropped))


def test_drop_block_unchanged_shape_and_gradient_flow(backend) -> None:  # type: ignore[no-untyped-def]
    x = backend.tensor(np.ones((2, 3, 5, 9)), requires_grad=True)
    out = ops.drop_block(x, 0.3, 7, training=True)  # block clamped to 5 on a 5 x 9 map
    assert backend.numpy(out).shape == (2, 3, 5, 9)
    backend.backward(out.sum())
    assert np.isfinite(backend.grad(x)).all()


def test_recipes_names_resolved_once(backend) -> None:  # type: ignore[no-untyped-def]
    model = classifier(backend)
    with DropHook(model, {"layer1": 0.2, model.layer4: 0.3}) as drop:
        assert drop._hooks.names == ["layer1", "layer4"]
    with pytest.raises(HookArgumentError, match="`p` must be None"):
        DropHook(model, {"layer1": 0.2}, 0.1)
    with pytest.raises(HookArgumentError, match="`p` must be a probability"):
        DropHook(model, "layer1")


# OpenBLAS runs a dot over more than 10,000 values (a gemv over more than 9,216) on its own
# thread pool, whose spinning threads contend with the framework's intra-op threads: one float64
# ddot per gradient made a torch training step 16x slower at torch's default 2 threads.
OPENBLAS_SINGLE_THREAD = 9_216


def test_recipes_reduce_without_threaded_blas(monkeypatch, resnet) -> None:  # type: ignore[no-untyped-def]
    """ActivationStats and GradientMonitor on the ResNet twins (activations of 2 * 64 * 32 * 32
    = 131,072 values) call numpy's BLAS on at most one thread's worth of values at a time."""
    sizes: list[tuple[str, int]] = []
    for name in ("dot", "vecdot", "matmul", "inner"):
        original = getattr(np, name, None)
        if original is None:
            continue

        def record(*arrays: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            a, b = np.asarray(arrays[0]), np.asarray(arrays[1])
            # values per BLAS call: a dot's length, a gemv's matrix, vecdot's last axis, one
            # matrix of a matmul's stack (numpy calls BLAS once per matrix)
            if _name == "vecdot" or b.ndim > 1:
                per_call = a.shape[-1]
            elif _name == "matmul" and a.ndim > 2:
                per_call = a.shape[-2] * a.shape[-1]
            else:
                per_call = a.size
            sizes.append((_name, int(per_call)))
            return _original(*arrays, **kw)

        monkeypatch.setattr(np, name, record)
    for net, tensor in zip(resnet, (torch.tensor(batch()), paddle.to_tensor(batch()))):
        with ActivationStats(net) as stats, GradientMonitor(net) as monitor:
            net(tensor).sum().backward()
        assert stats.rows() and monitor.history[-1]
    assert sizes, "the recipes' numpy reductions were not reached"
    assert max(size for _, size in sizes) <= OPENBLAS_SINGLE_THREAD, max(sizes, key=lambda s: s[1])


# A norm's worst case: 256 float32 roundings per row of positive squares (1.5e-5 of the sum),
# halved by the square root.
NORM_BOUND = 7.7e-6


def exact_norm(values: np.ndarray) -> float:
    return math.sqrt(math.fsum(float(v) ** 2 for v in values.astype(np.float64).ravel()))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.integers(1, 3000),
    st.floats(-30, 30),
    st.sampled_from(["normal", "one_large_per_row", "ramp"]),
    st.integers(0, 2**16),
)
def test_sum_squares_bound(backend, size: int, exponent: float, shape: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The norms GradientMonitor reports stay within NORM_BOUND of the exact one, at every
    scale float32 holds (1e-30 to 1e30: under and past float32's range of squares the sum is
    redone in float64) and for rows where one large value meets many small ones."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 1, size)
    if shape == "one_large_per_row":
        values = np.where(np.arange(size) % 256 == 0, 1e3, 1e-3 * values)
    elif shape == "ramp":
        values = np.linspace(1, 1e4, size)
    values = (values * 10.0**exponent).astype(np.float32)
    want = exact_norm(values)
    got = math.sqrt(ops.sum_squares(backend.tensor(values)))
    assert got == pytest.approx(want, rel=NORM_BOUND, abs=0), (got, want)


def test_sum_squares_tiny_and_huge_exact(backend) -> None:  # type: ignore[no-untyped-def]
    """Squares under float32's normal range (vanishing gradients) or past its maximum
    (exploding ones) are summed in float64: the norm is exact, not 0 or inf."""
    rng = np.random.default_rng(3)
    for scale in (1e-25, 1e-20, 1e20, 1e25):
        values = (rng.normal(0, 1, 5000) * scale).astype(np.float32)
        got = math.sqrt(ops.sum_squares(backend.tensor(values)))
        assert got == pytest.approx(exact_norm(values), rel=1e-12, abs=0), scale


def test_moments_of_tiny_values(backend) -> None:  # type: ignore[no-untyped-def]
    """ActivationStats' moments of float32 values whose squares fall under float32's normal
    range are taken in float64: the std is not 1e-3 off."""
    values = (np.random.default_rng(0).normal(0, 1, 5000) * 1e-22).astype(np.float32)
    n, mean, m2, *_ = ops.moments(backend.tensor(values))
    wide = values.astype(np.float64)
    assert n == 5000
    assert mean == pytest.approx(wide.mean(), rel=1e-7, abs=0)
    assert math.sqrt(m2 / n) == pytest.approx(wide.std(), rel=1e-7, abs=0)


def as_tensor(framework: str, values: np.ndarray, dtype: str | None = None) -> Any:
    t = torch.tensor(values) if framework == "torch" else paddle.to_tensor(values)
    if dtype is None:
        return t
    return t.to(getattr(torch, dtype)) if framework == "torch" else t.astype(dtype)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_reductions_of_other_dtypes(framework: str) -> None:
    """What the attack on the reductions found: a complex gradient's norm counts its imaginary
    part (paddle dropped it); bfloat16 values under float32's range of squares keep their std
    (torch gave 0); a value of 1e-20 is not a zero (paddle's float64 `==` said it was);
    `to_numpy` gives bfloat16's values (torch raised, paddle gave the raw bits)."""
    half = as_tensor(framework, np.array([1.5, -2.25], np.float32), "bfloat16")
    assert ops.to_numpy(half).tolist() == [1.5, -2.25]
    z = np.array([3 + 4j, 1 - 2j], np.complex64)
    assert ops.sum_squares(as_tensor(framework, z)) == pytest.approx(30.0)
    tiny = np.random.default_rng(0).normal(0, 1e-25, 1000).astype(np.float32)
    t = as_tensor(framework, tiny, "bfloat16")
    wide = np.asarray(ops.to_numpy(t), np.float64)
    n, _, m2, *_ = ops.moments(t)
    assert math.sqrt(m2 / n) == pytest.approx(wide.std(), rel=1e-6, abs=0)
    values = np.array([1e-20, 0.0, 0.0, 0.0, 1.0], np.float32)
    assert ops.moments(as_tensor(framework, values, "bfloat16"))[5] == 3


def test_moments_near_constant_float32(backend) -> None:  # type: ignore[no-untyped-def]
    """Values a few float32 ulps apart: the two-pass deviations from the mean rounded to
    float32 are corrected by their own mean (the std was 41 % off)."""
    one = np.float32(1.0)
    cases = [
        np.array([one] * 500 + [np.nextafter(one, np.float32(2))] * 500, np.float32),
        (1 + np.random.default_rng(0).normal(0, 1e-7, 10_000)).astype(np.float32),
    ]
    for values in cases:
        n, mean, m2, *_ = ops.moments(backend.tensor(values))
        wide = values.astype(np.float64)
        assert mean == pytest.approx(wide.mean(), rel=1e-12)
        assert math.sqrt(m2 / n) == pytest.approx(wide.std(), rel=1e-6)


def test_torch_reductions_of_views_and_sparse_tensors() -> None:
    """A tensor with the negative bit (a conjugate's imaginary part) and sparse gradients
    (`Embedding(sparse=True)`): numbers, not numpy's or vector_norm's errors."""
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()
    assert ops.sum_squares(z.imag) == pytest.approx(5.0)
    assert ops.moments(z.imag)[1] == pytest.approx(-0.5)
    sparse = torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3))
    assert ops.sum_squares(sparse) == pytest.approx(50.0)
    assert ops.moments(sparse)[:3] == (6, pytest.approx(2.0), pytest.approx(26.0))
    assert ops.moments(sparse)[5] == 3


@pytest.mark.parametrize(
    "layout",
    [
        lambda x: x.contiguous(memory_format=torch.channels_last),
        lambda x: x.permute(3, 1, 0, 2),
        lambda x: x.flatten(1).T,
    ],
    ids=["channels_last", "permute", "transpose"],
)
def test_torch_reductions_read_permuted_memory_in_place(layout: Any) -> None:
    """A tensor whose values fill one block of memory in another order than C's (channels_last
    activations and gradients) is reduced where it lies: the same numbers as its contiguous
    copy, and no copy of its values (a `reshape(-1)` copied it: 2.8x the moments' time, 8x the
    sum of squares')."""
    import tracemalloc

    x = torch.randn(4, 8, 32, 32)
    x[0, 0, :4] = 0.0
    permuted = layout(x)
    assert not permuted.is_contiguous()
    plain = permuted.contiguous()
    ops.moments(plain), ops.sum_squares(plain)  # (the per-thread scratch buffers, once)
    tracemalloc.start()
    try:
        got = ops.moments(permuted), ops.sum_squares(permuted)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    want = ops.moments(plain), ops.sum_squares(plain)
    assert peak < plain.numel(), peak  # a quarter of its bytes: a copy would be all of them
    (count, mean, m2, low, high, zeros, nonfinite), squares = got
    assert (count, low, high, zeros, nonfinite) == (*want[0][:1], *want[0][3:])
    assert mean == pytest.approx(want[0][1], rel=1e-6, abs=1e-7)
    assert m2 == pytest.approx(want[0][2], rel=1e-6)
    assert squares == pytest.approx(want[1], rel=1e-6)


@pytest.mark.parametrize(
    "layout",
    [
        lambda z: z[::2],
        lambda z: z[::-1],
        lambda z: z.reshape(4, 2)[:, :1],
        lambda z: z.reshape(4, 2).T,
    ],
    ids=["step", "reversed", "column", "transpose"],
)
def test_cpu_reductions_of_strided_complex_arrays(layout: Any) -> None:
    """A complex numpy array that is not contiguous (the backends' CPU reductions take numpy
    arrays): its real and imaginary parts' statistics, not numpy's "last axis must be
    contiguous" (a column of a reshape raised once `_flat` ran first, helper-43)."""
    z = (np.arange(8) + 1j * np.arange(8)[::-1]).astype(np.complex64)
    a = layout(z)
    parts = np.ascontiguousarray(a).view(np.float32).astype(np.float64)
    count, mean, m2, low, high, zeros, nonfinite = ops.cpu_moments(a)
    assert (count, low, high, zeros, nonfinite) == (
        parts.size,
        parts.min(),
        parts.max(),
        int((parts == 0).sum()),
        0,
    )
    assert mean == pytest.approx(parts.mean()) and m2 == pytest.approx(
        ((parts - parts.mean()) ** 2).sum()
    )
    assert ops.cpu_sum_squares(a) == pytest.approx(float((parts**2).sum()))


@pytest.mark.parametrize(
    ("make", "received"),
    [
        (lambda x: (x * 10).long(), "dtype torch.int64"),
        (lambda x: x > 0, "dtype torch.bool"),
        (lambda x: torch.complex(x, x), "dtype torch.complex64"),
        (lambda x: x.to_sparse(), "a sparse tensor"),
    ],
)
@pytest.mark.parametrize("mode", ["dropout", "dropblock"])
def test_drop_hook_on_an_output_it_cannot_drop_names_the_module(
    make: Callable[[torch.Tensor], torch.Tensor], received: str, mode: str
) -> None:
    # (helper-135's FINDING 2: torch's own error, naming no module)
    class Head(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return make(x)

    model = torch.nn.Sequential(torch.nn.Identity(), Head())
    with DropHook(model, "1", 0.3, mode=mode):
        with pytest.raises(HookTargetError, match=f"module '1' .*Received: {received}"):
            model(torch.randn(2, 3, 4, 4))
