"""The few framework differences the benchmarks need, behind one small adapter per framework.

Each adapter exposes the framework's layer classes under torch's names and the native hook
calls the benchmarks compare unihook against, so the models and cases are written once.
MindSpore (PyNative mode) has functional autograd: every adapter builds its training step
(`train_step`), and only the imperative ones (torch, paddle) have `backward` alone.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, Union

Hook = Callable[..., Any]
Remover = Callable[[], None]
Step = Callable[[], None]


class _Imperative:
    """torch and paddle: gradients accumulate into the parameters by `loss.backward()`."""

    def sgd(self, model: Any, lr: float) -> Step:
        """One plain SGD update of `model`'s parameters from their gradients."""
        raise NotImplementedError

    def backward(self, out: Any) -> None:
        out.sum().backward()

    def train_step(self, model: Any, fn: Callable[..., Any], *args: Any, lr: float = 0) -> Step:
        """`fn(*args)`, the backward of its output's sum into `model`'s parameters' gradients
        and, given `lr`, one SGD update: the timed body of the training cases."""
        if not lr:
            return lambda: fn(*args).sum().backward()
        update = self.sgd(model, lr)

        def step_and_update() -> None:
            fn(*args).sum().backward()
            update()

        return step_and_update

    def synced(self, body: Step) -> Step:
        return body  # (CPU ops have run when they return)


class Torch(_Imperative):
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
        self.detach = torch.Tensor.detach  # (the same C call as `t.detach()`)

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

    def clone(self, t: Any) -> Any:
        return t.detach().clone()

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_modules())

    def children(self, model: Any) -> Iterable[Any]:
        return model.children()

    def set_training(self, model: Any, training: bool) -> None:
        model.train(training)

    def clear_grads(self, model: Any) -> None:
        model.zero_grad(set_to_none=True)

    def sgd(self, model: Any, lr: float) -> Step:
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


class Paddle(_Imperative):
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
        self.detach = paddle.Tensor.detach

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

    def clone(self, t: Any) -> Any:
        return t.detach().clone()

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.named_sublayers(include_self=True))

    def children(self, model: Any) -> Iterable[Any]:
        return model.children()

    def set_training(self, model: Any, training: bool) -> None:
        if training:
            model.train()
        else:
            model.eval()

    def clear_grads(self, model: Any) -> None:
        model.clear_gradients(set_to_zero=False)

    def sgd(self, model: Any, lr: float) -> Step:
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


class MindSpore:
    """PyNative mode. Autograd is functional (docs/MINDSPORE.md §5): a training step is
    `mindspore.value_and_grad` with respect to the weights, which returns the gradients; there
    is no backward alone and nothing to clear. Ops run asynchronously: a timed body waits for
    them (`synced`)."""

    name = "mindspore"

    def __init__(self) -> None:
        import mindspore
        from mindspore import nn, ops
        from mindspore.graph.api import _pynative_executor

        mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
        self.ms, self.ops, self._sync = mindspore, ops, _pynative_executor.sync
        self.Sequential, self.Linear, self.Flatten = nn.SequentialCell, nn.Dense, nn.Flatten
        self.BatchNorm2d, self.ReLU = nn.BatchNorm2d, nn.ReLU
        self.GELU = lambda: nn.GELU(approximate=False)  # torch's default: erf, not tanh
        self.detach = ops.stop_gradient  # (what unihook's MindSpore ops detach with)

        class Module(nn.Cell):  # a Cell written the torch way: `forward`
            def construct(self, *args: Any) -> Any:
                return self.forward(*args)  # type: ignore[attr-defined]

        class ReLUInplace(nn.Cell):
            # no inplace flag, and mint's relu_ has no CPU kernel: copy_ is in place
            def construct(self, x: Any) -> Any:
                return x.copy_(ops.relu(x))

        self.Module, self.ReLUInplace = Module, ReLUInplace

    def Conv2d(self, c_in: int, c_out: int, k: int, stride: int = 1, padding: int = 0) -> Any:
        pad_mode = "pad" if padding else "valid"  # (its default is "same"; no bias by default)
        return self.ms.nn.Conv2d(
            c_in, c_out, k, stride=stride, pad_mode=pad_mode, padding=padding, has_bias=True
        )

    def MaxPool2d(self, k: int) -> Any:
        return self.ms.nn.MaxPool2d(k, stride=k)  # (its stride defaults to 1)

    def LayerNorm(self, d: int) -> Any:
        return self.ms.nn.LayerNorm((d,), epsilon=1e-5)  # (torch's eps)

    def seed(self, seed: int) -> None:
        self.ms.set_seed(seed)

    def randn(self, *shape: int) -> Any:
        return self.ops.randn(*shape)

    def no_grad(self) -> AbstractContextManager[Any]:
        return self.ms._no_grad()  # (no public name in 2.10)

    def softmax(self, x: Any) -> Any:
        return self.ops.softmax(x, axis=-1)

    def matmul(self, a: Any, b: Any, transpose_b: bool = False) -> Any:
        return self.ops.matmul(a, b.swapaxes(-2, -1) if transpose_b else b)

    def split_heads(self, x: Any, heads: int) -> Any:
        b, s, d = x.shape
        return x.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)

    def merge_heads(self, x: Any) -> Any:
        b, h, s, dh = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, s, h * dh)

    def chunk3(self, x: Any) -> tuple[Any, Any, Any]:
        return tuple(self.ops.chunk(x, 3, axis=-1))  # type: ignore[return-value]

    def clone(self, t: Any) -> Any:
        return self.ops.stop_gradient(t).copy()

    def named_modules(self, model: Any) -> list[tuple[str, Any]]:
        return list(model.cells_and_names())

    def children(self, model: Any) -> Iterable[Any]:
        return model.cells()

    def set_training(self, model: Any, training: bool) -> None:
        model.set_train(training)

    def clear_grads(self, model: Any) -> None:
        return None  # (value_and_grad returns the gradients: nothing accumulates)

    def train_step(self, model: Any, fn: Callable[..., Any], *args: Any, lr: float = 0) -> Step:
        """`fn(*args)` and the gradients of its output's sum with respect to `model`'s weights
        (the data passed as arguments, as in MindSpore's training idiom) and, given `lr`, one
        SGD update with them."""
        weights = model.trainable_params()
        grad = self.ms.value_and_grad(lambda *a: fn(*a).sum(), None, weights)
        if not lr:

            def step() -> None:
                grad(*args)
                self._sync()

            return step
        update = self.ms.nn.SGD(weights, learning_rate=lr)

        def step_and_update() -> None:
            update(grad(*args)[1])
            self._sync()

        return step_and_update

    def synced(self, body: Step) -> Step:
        def body_then_sync() -> None:
            body()
            self._sync()

        return body_then_sync

    def copy_(self, buffer: Any, t: Any) -> None:
        buffer.copy_(self.ops.stop_gradient(t))

    def native_pre_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_pre_hook(hook).remove

    def native_post_hook(self, module: Any, hook: Hook) -> Remover:
        return module.register_forward_hook(hook).remove

    def native_tensor_hook(self, tensor: Any, hook: Hook) -> Remover:
        return tensor.register_hook(hook).remove


Framework = Union[Torch, Paddle, MindSpore]
ORDER = (Torch, Paddle, MindSpore)  # of the cases and their variants
# `import paddle` then `import mindspore` fails (their oneDNN builds clash): MindSpore first.
IMPORT_ORDER = (Torch, MindSpore, Paddle)


def load() -> list[Framework]:
    """An adapter for each framework that imports, in `ORDER`."""
    loaded: dict[type, Framework] = {}
    for adapter in IMPORT_ORDER:
        try:
            loaded[adapter] = adapter()
        except ImportError:
            continue
    return [loaded[adapter] for adapter in ORDER if adapter in loaded]
