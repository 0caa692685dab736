"""Differential: the same small CNN in torch and paddle, with copied weights and the same
forward hooks registered through unihook on every layer, gives the same outputs, the same
input gradient and the same recorded hook sequence."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message="No ccache found")
paddle = pytest.importorskip("paddle")

import unihook  # noqa: E402

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


def torch_net() -> Any:
    nn = torch.nn
    # [2,3,8,8] -> conv [2,4,6,6] -> max [2,4,3,3] -> avg [2,4,2,2] -> flatten 16 -> 5
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AvgPool2d(2, stride=1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(CONV_W))
        net[0].bias.copy_(torch.from_numpy(CONV_B))
        net[1].weight.copy_(torch.from_numpy(BN_W))
        net[1].bias.copy_(torch.from_numpy(BN_B))
        net[1].running_mean.copy_(torch.from_numpy(BN_MEAN))
        net[1].running_var.copy_(torch.from_numpy(BN_VAR))
        net[6].weight.copy_(torch.from_numpy(FC_W))
        net[6].bias.copy_(torch.from_numpy(FC_B))
    net.eval()
    return net


def paddle_net() -> Any:
    nn = paddle.nn
    net = nn.Sequential(
        nn.Conv2D(3, 4, 3),
        nn.BatchNorm2D(4),
        nn.ReLU(),
        nn.MaxPool2D(2),
        nn.AvgPool2D(2, stride=1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )
    net[0].weight.set_value(CONV_W)
    net[0].bias.set_value(CONV_B)
    net[1].weight.set_value(BN_W)
    net[1].bias.set_value(BN_B)
    net[1]._mean.set_value(BN_MEAN)
    net[1]._variance.set_value(BN_VAR)
    net[6].weight.set_value(FC_W.T.copy())  # paddle's Linear weight is [in, out]
    net[6].bias.set_value(FC_B)
    net.eval()
    return net


def hooked_run(net: Any, named: list[tuple[str, Any]], x: Any) -> tuple[list[Any], Any]:
    """Register the same hooks on every layer, run forward, return (record, output)."""
    record: list[Any] = []

    def pre(name: str) -> Any:
        def hook(module: Any, args: Any) -> Any:
            record.append(("pre", name, [tuple(int(d) for d in a.shape) for a in args]))
            return tuple(a * 0.5 for a in args)

        return hook

    def post(name: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> Any:
            record.append(
                ("post", name, tuple(int(d) for d in out.shape), float(out.detach().sum()))
            )
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


def test_same_outputs_and_hook_sequences() -> None:
    tnet, pnet = torch_net(), paddle_net()
    tx = torch.tensor(X, requires_grad=True)
    px = paddle.to_tensor(X, stop_gradient=False)

    # without hooks the two nets agree
    np.testing.assert_allclose(tnet(tx).detach().numpy(), pnet(px).numpy(), rtol=1e-5, atol=1e-5)

    t_named = list(tnet.named_modules())
    p_named = list(pnet.named_sublayers(include_self=True))
    assert [n for n, _ in t_named] == [n for n, _ in p_named] == ["", *map(str, range(7))]

    t_record, t_out = hooked_run(tnet, t_named, tx)
    p_record, p_out = hooked_run(pnet, p_named, px)
    np.testing.assert_allclose(t_out.detach().numpy(), p_out.numpy(), rtol=1e-5, atol=1e-5)

    # compare the records: identical structure, sums equal within float tolerance
    assert len(t_record) == len(p_record) == 1 + 2 * 8
    for t_item, p_item in zip(t_record, p_record):
        assert t_item[:3] == p_item[:3]
        if t_item[0] == "post":
            assert np.isclose(t_item[3], p_item[3], rtol=1e-5, atol=1e-4)
    assert t_record[0] == ("kw_pre", [])
    assert t_record[1] == ("pre", "", [(2, 3, 8, 8)])
    assert t_record[2] == ("pre", "0", [(2, 3, 8, 8)])
    assert t_record[-1][:3] == ("post", "", (2, 5))
    order = [(kind, name) for kind, name, *_ in t_record[1:]]
    assert order == [("pre", "")] + [
        step for i in range(7) for step in (("pre", str(i)), ("post", str(i)))
    ] + [("post", "")]

    # hooked output: every layer's input scaled by 0.5, every output + 1
    t_out.sum().backward()
    p_out.sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(tx.grad.numpy()).sum() > 0

    # hooks removed: back to the unhooked outputs, no residue on either side
    np.testing.assert_allclose(tnet(tx).detach().numpy(), pnet(px).numpy(), rtol=1e-5, atol=1e-5)
    for (_, tm), (_, pm) in zip(t_named, p_named):
        assert not tm._forward_pre_hooks and not tm._forward_hooks
        assert not pm._forward_pre_hooks and not pm._forward_post_hooks
