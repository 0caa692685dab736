"""Differential: the same small CNN in torch (the reference) and in each selected backend
(test ids ``[torch]``, ``[paddle]``, ``[mindspore]``), built through the backends' conformance
kits with copied weights and the same forward hooks registered through unihook on every layer,
gives the same outputs, the same input gradient and the same recorded hook sequence."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import unihook
from unihook.conformance import installed_kits
from unihook.testing import Kit

RNG = np.random.default_rng(0)
CONV_W = RNG.standard_normal((4, 3, 3, 3)).astype("float32")
CONV_B = RNG.standard_normal(4).astype("float32")
BN_W = RNG.uniform(0.5, 1.5, 4).astype("float32")
BN_B = RNG.standard_normal(4).astype("float32")
BN_MEAN = RNG.standard_normal(4).astype("float32")
BN_VAR = RNG.uniform(0.5, 2.0, 4).astype("float32")
FC_W = RNG.standard_normal((5, 16)).astype("float32")  # torch layout [out, in]
FC_B = RNG.standard_normal(5).astype("float32")
X = RNG.standard_normal((2, 3, 8, 8)).astype("float32")


def _reference() -> Kit:
    for kit in installed_kits():
        if kit.name == "torch":
            return kit
    pytest.skip("the reference is torch: torch is not installed")


def cnn(kit: Kit) -> Any:
    # [2,3,8,8] -> conv [2,4,6,6] -> max [2,4,3,3] -> avg [2,4,2,2] -> flatten 16 -> 5
    model = kit.sequential(
        kit.conv2d(3, 4, 3, weight=CONV_W, bias=CONV_B),
        kit.batchnorm2d(4, BN_W, BN_B, running_mean=BN_MEAN, running_var=BN_VAR),
        kit.relu_module(),
        kit.max_pool2d(2),
        kit.avg_pool2d(2, stride=1),
        kit.flatten(),
        kit.linear(16, 5, FC_W, FC_B),
    )
    kit.set_training(model, False)
    return model


def hooked_run(kit: Kit, net: Any, named: list[tuple[str, Any]], x: Any) -> tuple[list[Any], Any]:
    """Register the same hooks on every layer, run forward, return (record, output)."""
    record: list[Any] = []

    def pre(name: str) -> Any:
        def hook(module: Any, args: Any) -> Any:
            record.append(("pre", name, [tuple(int(d) for d in a.shape) for a in args]))
            return tuple(a * 0.5 for a in args)

        return hook

    def post(name: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> Any:
            total = float(kit.numpy(unihook.ops.sum(unihook.ops.detach(out))))
            record.append(("post", name, tuple(int(d) for d in out.shape), total))
            return out + 1

        return hook

    def kw_pre(module: Any, args: Any, kwargs: Any) -> Any:
        record.append(("kw_pre", sorted(kwargs)))
        return (args, kwargs)

    handles = [unihook.register_forward_pre_hook(net, kw_pre, with_kwargs=True, prepend=True)]
    for name, module in named:
        handles.append(unihook.register_forward_pre_hook(module, pre(name), name=name))
        handles.append(unihook.register_forward_hook(module, post(name), name=name))
    out = net(x)
    for h in handles:
        h.remove()
    return record, out


def test_same_outputs_and_hook_sequences(backend: Kit) -> None:
    ref = _reference()
    rnet, bnet = cnn(ref), cnn(backend)
    rx = ref.tensor(X, requires_grad=True)
    bx = backend.tensor(X, requires_grad=True)

    # without hooks the two nets agree
    np.testing.assert_allclose(ref.numpy(rnet(rx)), backend.numpy(bnet(bx)), rtol=1e-5, atol=1e-5)

    r_named = ref.named_modules(rnet)
    b_named = backend.named_modules(bnet)
    assert [n for n, _ in r_named] == [n for n, _ in b_named] == ["", *map(str, range(7))]

    r_record, r_out = hooked_run(ref, rnet, r_named, rx)
    b_record, b_out = hooked_run(backend, bnet, b_named, bx)
    np.testing.assert_allclose(ref.numpy(r_out), backend.numpy(b_out), rtol=1e-5, atol=1e-5)

    # compare the records: identical structure, sums equal within float tolerance
    assert len(r_record) == len(b_record) == 1 + 2 * 8
    for r_item, b_item in zip(r_record, b_record):
        assert r_item[:3] == b_item[:3]
        if r_item[0] == "post":
            assert np.isclose(r_item[3], b_item[3], rtol=1e-5, atol=1e-4)
    assert r_record[0] == ("kw_pre", [])
    assert r_record[1] == ("pre", "", [(2, 3, 8, 8)])
    assert r_record[2] == ("pre", "0", [(2, 3, 8, 8)])
    assert r_record[-1][:3] == ("post", "", (2, 5))
    order = [(kind, name) for kind, name, *_ in r_record[1:]]
    assert order == [("pre", "")] + [
        step for i in range(7) for step in (("pre", str(i)), ("post", str(i)))
    ] + [("post", "")]

    # hooked output: every layer's input scaled by 0.5, every output + 1
    ref.backward(unihook.ops.sum(r_out))
    backend.backward(unihook.ops.sum(b_out))
    np.testing.assert_allclose(ref.grad(rx), backend.grad(bx), rtol=1e-5, atol=1e-6)
    assert np.abs(ref.grad(rx)).sum() > 0

    # hooks removed: back to the unhooked outputs, no residue on either side
    np.testing.assert_allclose(ref.numpy(rnet(rx)), backend.numpy(bnet(bx)), rtol=1e-5, atol=1e-5)
    for (_, rm), (_, bm) in zip(r_named, b_named):
        assert not any(ref.hook_counts(rm).values())
        assert not any(backend.hook_counts(bm).values())
