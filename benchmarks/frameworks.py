"""The few framework differences the benchmarks need, behind one small adapter per framework.

Each adapter exposes the framework's layer classes under torch's names and the native hook
calls the benchmarks compare unihook against, so the models and cases are written once.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Union

Hook = Callable[..., Any]
Remover = Callable[[], None]


class Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.t = torch
        nn = torch.nn
        self.Module = nn.Module
        self.Sequential, self.Linear, self.Conv2d = nn.Sequential, nn.Linear, nn.Conv2d
        self.BatchNorm2d, self.MaxPool2d, self.Flatten = nn.BatchNorm2d, nn.MaxPool2d, nn.Flatten
        self.LayerNorm, self.GELU = nn.LayerNorm, nn.GELU
        # Non-inplace: torch's native full backward hook raises on an in-place op after a module.
        self.ReLU = lambda: nn.ReLU(inplace=False)
        self.ReLUInplace = lambda: nn.ReLU(inplace=True)

    def seed(self, seed: int) -> None:
        self.t.manual_seed(seed)

    def randn(self, *shape: int) -> Any:
        return self.t.randn(*shape)

    def no_grad(self) -> AbstractContextManager[Any]:
        return self.t.no_grad()

    def softmax(self, x: Any) -> Any:
        return self.t.softmax(x, dim=-1)

    def matmul(self, a: Any, b: Any, transpose_b: bool = False) -> Any:
        return self.t.matmul(a, b.transpose(-2, -1) if transpose_b else b)

    def split_heads(self, x: Any, heads: int) -> Any:
        b, s, d = x.shape
        return x.reshape(b, s, heads, d // heads).permute(0, 2, 1, 3)

    def merge_heads(self, x: Any) -> Any:
        b, h, s, dh = x.shape
        return x.permute(0, 2, 1, 3).reshape(b, s, h * dh)

    def chunk3(self, x: Any) -> tuple[Any, Any, Any]:
        return tuple(x.chunk(3, dim=-1))  # type: ignore[return-value]

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_modules())

    def set_training(self, model: Any, training: bool) -> None:
        model.train(training)

    def clear_grads(self, model: Any) -> None:
        model.zero_grad(set_to_none=True)

    def backward(self, out: Any) -> None:
        out.sum().backward()

    def sgd(self, model: Any, lr: float) -> Callable[[], None]:
        """One plain SGD update of `model`'s parameters from their gradients."""
        return self.t.optim.SGD(model.parameters(), lr=lr).step

    def copy_(self, buffer: Any, t: Any) -> None:
        # detach(): no graph even when grad is enabled, at a fraction of no_grad()'s cost.
        buffer.copy_(t.detach())

    def native_pre_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_pre_hook(hook).remove

    def native_post_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_hook(hook).remove

    def native_tensor_hook(self, tensor: Any, hook: Hook) -> Remover:
        return tensor.register_hook(hook).remove

    def native_full_backward_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_full_backward_hook(hook).remove

    def native_global_pre_hook(self, hook: Hook) -> Remover:
        from torch.nn.modules.module import register_module_forward_pre_hook

        return register_module_forward_pre_hook(hook).remove

    def native_global_post_hook(self, hook: Hook) -> Remover:
        from torch.nn.modules.module import register_module_forward_hook

        return register_module_forward_hook(hook).remove


class Paddle:
    name = "paddle"

    def __init__(self) -> None:
        import paddle

        self.p = paddle
        nn = paddle.nn
        self.Module = nn.Layer
        self.Sequential, self.Linear, self.Conv2d = nn.Sequential, nn.Linear, nn.Conv2D
        self.BatchNorm2d, self.MaxPool2d, self.Flatten = nn.BatchNorm2D, nn.MaxPool2D, nn.Flatten
        self.LayerNorm, self.GELU, self.ReLU = nn.LayerNorm, nn.GELU, nn.ReLU

        class ReLUInplace(nn.Layer):  # paddle's ReLU layer has no inplace flag
            def forward(self, x: Any) -> Any:
                return paddle.nn.functional.relu_(x)

        self.ReLUInplace = ReLUInplace

    def seed(self, seed: int) -> None:
        self.p.seed(seed)

    def randn(self, *shape: int) -> Any:
        return self.p.randn(list(shape))

    def no_grad(self) -> AbstractContextManager[Any]:
        return self.p.no_grad()

    def softmax(self, x: Any) -> Any:
        return self.p.nn.functional.softmax(x, axis=-1)

    def matmul(self, a: Any, b: Any, transpose_b: bool = False) -> Any:
        return self.p.matmul(a, b, transpose_y=transpose_b)

    def split_heads(self, x: Any, heads: int) -> Any:
        b, s, d = x.shape
        return x.reshape([b, s, heads, d // heads]).transpose([0, 2, 1, 3])

    def merge_heads(self, x: Any) -> Any:
        b, h, s, dh = x.shape
        return x.transpose([0, 2, 1, 3]).reshape([b, s, h * dh])

    def chunk3(self, x: Any) -> tuple[Any, Any, Any]:
        return tuple(self.p.chunk(x, 3, axis=-1))  # type: ignore[return-value]

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_sublayers(include_self=True))

    def set_training(self, model: Any, training: bool) -> None:
        if training:
            model.train()
        else:
            model.eval()

    def clear_grads(self, model: Any) -> None:
        model.clear_gradients(set_to_zero=False)

    def backward(self, out: Any) -> None:
        out.sum().backward()

    def sgd(self, model: Any, lr: float) -> Callable[[], None]:
        """One plain SGD update of `model`'s parameters from their gradients."""
        return self.p.optimizer.SGD(learning_rate=lr, parameters=model.parameters()).step

    def copy_(self, buffer: Any, t: Any) -> None:
        # Tensor.copy_ rather than paddle.assign: same result, a sixth of the per-call cost.
        buffer.copy_(t.detach(), True)

    def native_pre_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_pre_hook(hook).remove

    def native_post_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_post_hook(hook).remove

    def native_tensor_hook(self, tensor: Any, hook: Hook) -> Remover:
        return tensor.register_hook(hook).remove


Framework = Union[Torch, Paddle]


def load() -> list[Framework]:
    """An adapter for each framework that imports (torch first)."""
    loaded: list[Framework] = []
    for adapter in (Torch, Paddle):
        try:
            loaded.append(adapter())
        except ImportError:
            continue
    return loaded
