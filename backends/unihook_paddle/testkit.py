"""The conformance kit for paddle (``unihook.testing.Kit``): used only by the test suite."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import paddle

from unihook.testing import Kit


class _Layer(paddle.nn.Layer):
    def __init__(self, forward: Callable[..., Any], children: dict[str, Any] | None) -> None:
        super().__init__()
        self._fn = forward
        for name, child in (children or {}).items():
            self.add_sublayer(name, child)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self, *args, **kwargs)


class _InplaceReLU(paddle.nn.Layer):
    # paddle's ReLU has no inplace flag: a layer calling the in-place functional
    def forward(self, x: Any) -> Any:
        return paddle.nn.functional.relu_(x)


# framework-neutral class names (the kit's `type_name`)
_NEUTRAL = {"_inplacerelu": "relu"}


# `replace_hook_dict`'s names
_HOOK_DICTS = {
    "forward_pre": "_forward_pre_hooks",
    "forward": "_forward_post_hooks",
    "always_called": "_forward_post_hooks_always_called",
}


def _set(param: Any, data: Any) -> None:
    if data is not None:
        param.set_value(np.asarray(data, dtype="float32"))


class PaddleKit(Kit):
    name = "paddle"
    native_kinds = frozenset({"tensor"})  # (no module backward hooks, no global hooks)

    def tensor(self, data: Any, requires_grad: bool = False, dtype: str = "float32") -> Any:
        return paddle.to_tensor(np.asarray(data, dtype=dtype), stop_gradient=not requires_grad)

    def numpy(self, tensor: Any) -> Any:
        return tensor.detach().numpy().copy()

    def grad(self, tensor: Any) -> Any:
        return None if tensor.grad is None else self.numpy(tensor.grad)

    def requires_grad(self, tensor: Any) -> bool:
        return not tensor.stop_gradient

    def add_(self, tensor: Any, value: float) -> Any:
        return tensor.add_(paddle.full([], value, dtype=tensor.dtype))

    def relu(self, tensor: Any) -> Any:
        return paddle.nn.functional.relu(tensor)

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.astype(dtype)

    def cat(self, tensors: Sequence[Any], axis: int) -> Any:
        return paddle.concat(list(tensors), axis=axis)

    def zeros_like(self, tensor: Any) -> Any:
        return paddle.zeros_like(tensor)

    def is_tensor(self, obj: object) -> bool:
        return paddle.is_tensor(obj)

    def backward(self, tensor: Any, retain_graph: bool = False) -> None:
        tensor.backward(retain_graph=retain_graph)

    def autograd_grad(
        self, outputs: Sequence[Any], inputs: Sequence[Any], create_graph: bool = False
    ) -> list[Any]:
        return list(paddle.grad(list(outputs), list(inputs), create_graph=create_graph))

    def grad_wrt(
        self,
        outputs: Sequence[Any],
        inputs: Sequence[Any],
        retain_graph: bool = False,
        create_graph: bool = False,
        allow_unused: bool = False,
    ) -> list[Any]:
        return list(
            paddle.grad(
                list(outputs),
                list(inputs),
                retain_graph=retain_graph or None,
                create_graph=create_graph,
                allow_unused=allow_unused,
            )
        )

    def no_grad(self) -> Any:
        return paddle.no_grad()

    def linear(self, n_in: int, n_out: int, weight: Any = None, bias: Any = None) -> Any:
        m = paddle.nn.Linear(n_in, n_out)
        if weight is not None:  # paddle's Linear weight is [in, out]: torch's transposed
            m.weight.set_value(np.asarray(weight, dtype="float32").T.copy())
        _set(m.bias, bias)
        return m

    def relu_module(self, inplace: bool = False) -> Any:
        return _InplaceReLU() if inplace else paddle.nn.ReLU()

    def sequential(self, *modules: Any) -> Any:
        return paddle.nn.Sequential(*modules)

    def conv2d(
        self,
        c_in: int,
        c_out: int,
        k: int,
        padding: int = 0,
        stride: int = 1,
        weight: Any = None,
        bias: Any = None,
    ) -> Any:
        m = paddle.nn.Conv2D(c_in, c_out, k, stride=stride, padding=padding)
        _set(m.weight, weight)  # (paddle's layout is torch's)
        _set(m.bias, bias)
        return m

    def batchnorm2d(
        self,
        c: int,
        weight: Any = None,
        bias: Any = None,
        running_mean: Any = None,
        running_var: Any = None,
    ) -> Any:
        # paddle's momentum is the weight of the old running value: torch's 0.1 is paddle's
        # default 0.9; epsilon 1e-5 as torch's
        m = paddle.nn.BatchNorm2D(c)
        _set(m.weight, weight)
        _set(m.bias, bias)
        _set(m._mean, running_mean)  # (paddle's names for the running statistics)
        _set(m._variance, running_var)
        return m

    def max_pool2d(self, k: int, stride: int | None = None) -> Any:
        return paddle.nn.MaxPool2D(k, stride)

    def avg_pool2d(self, k: int, stride: int | None = None) -> Any:
        return paddle.nn.AvgPool2D(k, stride)

    def flatten(self) -> Any:
        return paddle.nn.Flatten()

    def module(self, forward: Callable[..., Any], children: dict[str, Any] | None = None) -> Any:
        return _Layer(forward, children)

    def parameters(self, module: Any) -> list[Any]:
        return list(module.parameters())

    def trainable_parameters(self, module: Any) -> dict[str, Any]:
        # paddle's names are torch's; its running statistics are parameters that need no grad
        return {n: p for n, p in module.named_parameters() if not p.stop_gradient}

    def clear_grads(self, module: Any) -> None:
        module.clear_gradients(set_to_zero=False)  # (None, as torch's set_to_none)

    def parameter_grads(self, module: Any) -> dict[str, Any]:
        linears = {
            f"{name}.weight" if name else "weight"
            for name, m in module.named_sublayers(include_self=True)
            if isinstance(m, paddle.nn.Linear)
        }
        grads = {}
        for name, p in self.trainable_parameters(module).items():
            g = self.grad(p)
            grads[name] = g.T.copy() if g is not None and name in linears else g
        return grads

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_sublayers(include_self=True))

    def set_training(self, module: Any, training: bool) -> None:
        module.train() if training else module.eval()

    def seed(self, seed: int) -> None:
        paddle.seed(seed)

    def hook_counts(self, module: Any) -> dict[str, int]:
        # Layer.__call__ takes its no-hook fast path when the two hook dicts are empty.
        names = (
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs_flag",
            "_forward_post_hooks",
            "_forward_post_hooks_with_kwargs_flag",
            "_forward_post_hooks_always_called",
        )
        return {name: len(getattr(module, name)) for name in names}

    def hook_dicts(self, module: Any) -> dict[str, Any]:
        return {name: getattr(module, name) for name in self.hook_counts(module)}

    def native_hook(
        self, target: Any, kind: str, hook: Callable[..., Any], **options: Any
    ) -> Callable[[], None]:
        if kind == "tensor":
            return target.register_hook(hook).remove  # type: ignore[no-any-return]
        if kind == "forward_pre":
            register = target.register_forward_pre_hook
        elif kind == "forward":
            register = target.register_forward_post_hook
        else:
            raise NotImplementedError(f"native_hook [kit paddle]: no native {kind!r} hook")
        return register(hook, **options).remove  # type: ignore[no-any-return]

    def replace_hook_dict(self, module: Any, which: str, new: Callable[[Any], Any]) -> Any:
        name = _HOOK_DICTS[which]
        old = getattr(module, name)
        setattr(module, name, new(old))
        return old

    def state_dict_roundtrip(self, module: Any) -> None:
        module.set_state_dict(module.state_dict())

    def native_state(self) -> object:
        from paddle.base import core

        methods = {k: v for k, v in vars(paddle.nn.Layer).items() if callable(v)}
        return (methods, core.eager.run_backward, core.eager.run_partial_grad)

    def parameter(self, data: Any) -> Any:
        array = np.asarray(data, dtype="float32")
        param = paddle.create_parameter(list(array.shape), "float32")
        param.set_value(array)
        return param

    def register_parameter(self, module: Any, name: str, param: Any) -> None:
        module.add_parameter(name, param)

    def register_buffer(self, module: Any, name: str, tensor: Any) -> None:
        module.register_buffer(name, tensor)

    def add_module(self, module: Any, name: str, child: Any) -> None:
        module.add_sublayer(name, child)

    def type_name(self, module: Any) -> str:
        name = type(module).__name__.lower()
        return _NEUTRAL.get(name, name)

    def set_value(self, tensor: Any, data: Any) -> None:
        tensor.set_value(np.asarray(data, dtype="float32"))

    def sgd(self, module: Any, lr: float) -> Callable[[Any], None]:
        optimizer = paddle.optimizer.SGD(learning_rate=lr, parameters=module.parameters())

        def step(loss: Any) -> None:
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()

        return step
