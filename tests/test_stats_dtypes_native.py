"""ActivationStats on torch's quantized outputs (an eager-quantized model: QuantStub, quantized
convolutions return quint8 tensors): the row is of their real values, `dequantize()`'s (until
2026-12-04 the model's forward raised inside the recipe's hook: helper-125's FINDING 4)."""

from __future__ import annotations

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
