"""ActivationStats on torch's quantized outputs (an eager-quantized model: QuantStub, quantized
convolutions return quint8 tensors): the row is of their real values, `dequantize()`'s (until
2026-12-04 the model's forward raised inside the recipe's hook: helper-125's FINDING 4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unihook.recipes import ActivationStats  # noqa: E402


class _Quantize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.quantize_per_tensor(x, 0.05, 10, torch.quint8)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_outputs_give_their_real_values() -> None:
    model = torch.nn.Sequential(_Quantize())
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    with ActivationStats(model) as stats:
        out = model(x)
    real = out.dequantize().double().numpy()
    rows = {row["name"]: row for row in stats.rows()}
    row = rows[""]
    assert row["mean"] == pytest.approx(real.mean(), rel=1e-6)
    assert row["std"] == pytest.approx(real.std(), rel=1e-5)
    assert (row["min"], row["max"]) == (pytest.approx(real.min()), pytest.approx(real.max()))
    assert row["zeros"] == pytest.approx(np.mean(real == 0))


def test_a_container_row_after_a_write_no_version_counter_sees() -> None:
    """torch: a clipping hook on a block's last layer, ``o.data.clamp_`` (the version counter
    stands still): the block's row is of what it returned (until 2026-12-04 the layer's
    unclipped numbers were reused: helper-125's FINDING 2)."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8))
    model = torch.nn.Sequential(block, torch.nn.ReLU())
    returned = []

    def clip(module: Any, args: Any, output: Any) -> None:
        output.data.clamp_(-0.1, 0.1)

    with ActivationStats(model) as stats:
        # (after the recipe's: its hook on the layer reads the output before the clamp)
        block[1].register_forward_hook(clip)
        block.register_forward_hook(lambda m, a, o: returned.append(o.detach().clone()))
        model(torch.randn(16, 4) * 10)
    row = {r["name"]: r for r in stats.rows()}["0"]
    real = returned[0].double().numpy()
    assert (row["min"], row["max"]) == (pytest.approx(real.min()), pytest.approx(real.max()))
    assert row["mean"] == pytest.approx(real.mean(), rel=1e-6)


def test_paddle_a_container_row_after_copy_() -> None:
    """paddle: a layer writing its child's output with ``copy_`` (which leaves
    ``inplace_version`` at 0): the row is of what it returned."""
    paddle = pytest.importorskip("paddle")

    class Block(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.lin = paddle.nn.Linear(4, 8)

        def forward(self, x: Any) -> Any:
            y = self.lin(x)
            y.copy_(paddle.full_like(y, 10.0), False)
            return y

    block = Block()
    with ActivationStats(block) as stats:
        block(paddle.randn([16, 4]))
    row = {r["name"]: r for r in stats.rows()}[""]
    assert (row["mean"], row["std"], row["min"], row["max"]) == (10.0, 0.0, 10.0, 10.0)
