"""The conformance kit for torch (``unihook.testing.Kit``): used only by the test suite."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from unihook.testing import Kit


class _Module(torch.nn.Module):
    def __init__(self, forward: Callable[..., Any], children: dict[str, Any] | None) -> None:
        super().__init__()
        self._fn = forward
        for name, child in (children or {}).items():
            self.add_module(name, child)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self, *args, **kwargs)


# `replace_hook_dict`'s names
_HOOK_DICTS = {
    "forward_pre": "_forward_pre_hooks",
    "forward": "_forward_hooks",
    "always_called": "_forward_hooks_always_called",
}

# `native_hook`'s registrations: Module's methods, torch.nn.modules.module's functions
_MODULE_NATIVE = {
    "forward_pre": "register_forward_pre_hook",
    "forward": "register_forward_hook",
    "full_backward_pre": "register_full_backward_pre_hook",
    "full_backward": "register_full_backward_hook",
}
_GLOBAL_NATIVE = {
    "module_forward_pre": "register_module_forward_pre_hook",
    "module_forward": "register_module_forward_hook",
    "module_parameter_registration": "register_module_parameter_registration_hook",
    "module_buffer_registration": "register_module_buffer_registration_hook",
    "module_module_registration": "register_module_module_registration_hook",
}


def _copy(param: Any, data: Any) -> None:
    if data is not None:
        with torch.no_grad():
            param.copy_(torch.tensor(np.asarray(data, dtype="float32")))


class TorchKit(Kit):
    name = "torch"
    native_kinds = frozenset({"tensor", *_MODULE_NATIVE, *_GLOBAL_NATIVE})

    def tensor(self, data: Any, requires_grad: bool = False, dtype: str = "float32") -> Any:
        return torch.tensor(np.asarray(data, dtype=dtype), requires_grad=requires_grad)

    def numpy(self, tensor: Any) -> Any:
        return tensor.detach().cpu().numpy().copy()

    def grad(self, tensor: Any) -> Any:
        return None if tensor.grad is None else self.numpy(tensor.grad)

    def requires_grad(self, tensor: Any) -> bool:
        return bool(tensor.requires_grad)

    def add_(self, tensor: Any, value: float) -> Any:
        return tensor.add_(value)

    def relu(self, tensor: Any) -> Any:
        return torch.relu(tensor)

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.to(getattr(torch, dtype))

    def cat(self, tensors: Sequence[Any], axis: int) -> Any:
        return torch.cat(list(tensors), dim=axis)

    def zeros_like(self, tensor: Any) -> Any:
        return torch.zeros_like(tensor)

    def is_tensor(self, obj: object) -> bool:
        return torch.is_tensor(obj)

    def backward(self, tensor: Any, retain_graph: bool = False) -> None:
        tensor.backward(retain_graph=retain_graph)

    def autograd_grad(
        self, outputs: Sequence[Any], inputs: Sequence[Any], create_graph: bool = False
    ) -> list[Any]:
        return list(torch.autograd.grad(list(outputs), list(inputs), create_graph=create_graph))

    def grad_wrt(
        self,
        outputs: Sequence[Any],
        inputs: Sequence[Any],
        retain_graph: bool = False,
        create_graph: bool = False,
        allow_unused: bool = False,
    ) -> list[Any]:
        return list(
            torch.autograd.grad(
                list(outputs),
                list(inputs),
                retain_graph=retain_graph or None,
                create_graph=create_graph,
                allow_unused=allow_unused,
            )
        )

    def no_grad(self) -> Any:
        return torch.no_grad()

    def linear(self, n_in: int, n_out: int, weight: Any = None, bias: Any = None) -> Any:
        m = torch.nn.Linear(n_in, n_out)
        _copy(m.weight, weight)
        _copy(m.bias, bias)
        return m

    def relu_module(self, inplace: bool = False) -> Any:
        return torch.nn.ReLU(inplace=inplace)

    def sequential(self, *modules: Any) -> Any:
        return torch.nn.Sequential(*modules)

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
        m = torch.nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding)
        _copy(m.weight, weight)
        _copy(m.bias, bias)
        return m

    def batchnorm2d(
        self,
        c: int,
        weight: Any = None,
        bias: Any = None,
        running_mean: Any = None,
        running_var: Any = None,
    ) -> Any:
        m = torch.nn.BatchNorm2d(c)
        _copy(m.weight, weight)
        _copy(m.bias, bias)
        _copy(m.running_mean, running_mean)
        _copy(m.running_var, running_var)
        return m

    def max_pool2d(self, k: int, stride: int | None = None) -> Any:
        return torch.nn.MaxPool2d(k, stride)

    def avg_pool2d(self, k: int, stride: int | None = None) -> Any:
        return torch.nn.AvgPool2d(k, stride)

    def flatten(self) -> Any:
        return torch.nn.Flatten()

    def module(self, forward: Callable[..., Any], children: dict[str, Any] | None = None) -> Any:
        return _Module(forward, children)

    def parameters(self, module: Any) -> list[Any]:
        return list(module.parameters())

    def trainable_parameters(self, module: Any) -> dict[str, Any]:
        return {n: p for n, p in module.named_parameters() if p.requires_grad}

    def clear_grads(self, module: Any) -> None:
        module.zero_grad(set_to_none=True)

    def parameter_grads(self, module: Any) -> dict[str, Any]:
        return {n: self.grad(p) for n, p in self.trainable_parameters(module).items()}

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_modules())

    def set_training(self, module: Any, training: bool) -> None:
        module.train(training)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def hook_counts(self, module: Any) -> dict[str, int]:
        names = (
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
        )
        return {name: len(getattr(module, name)) for name in names}

    def hook_dicts(self, module: Any) -> dict[str, Any]:
        return {name: getattr(module, name) for name in self.hook_counts(module)}

    def native_hook(
        self, target: Any, kind: str, hook: Callable[..., Any], **options: Any
    ) -> Callable[[], None]:
        if kind == "tensor":
            return target.register_hook(hook).remove  # type: ignore[no-any-return]
        if kind in _MODULE_NATIVE:
            register = getattr(target, _MODULE_NATIVE[kind])
        elif kind in _GLOBAL_NATIVE:
            import torch.nn.modules.module as m

            register = getattr(m, _GLOBAL_NATIVE[kind])
        else:
            raise NotImplementedError(f"native_hook [kit torch]: no native {kind!r} hook here")
        return register(hook, **options).remove  # type: ignore[no-any-return]

    def replace_hook_dict(self, module: Any, which: str, new: Callable[[Any], Any]) -> Any:
        name = _HOOK_DICTS[which]
        old = getattr(module, name)
        setattr(module, name, new(old))
        return old

    def state_dict_roundtrip(self, module: Any) -> None:
        module.load_state_dict(module.state_dict())

    def native_state(self) -> object:
        import torch.nn.modules.module as m

        registries = (
            "_global_forward_pre_hooks",
            "_global_forward_hooks",
            "_global_forward_hooks_always_called",
            "_global_forward_hooks_with_kwargs",
            "_global_backward_pre_hooks",
            "_global_backward_hooks",
            "_global_parameter_registration_hooks",
            "_global_buffer_registration_hooks",
            "_global_module_registration_hooks",
        )
        methods = {k: v for k, v in vars(torch.nn.Module).items() if callable(v)}
        return (methods, {r: dict(getattr(m, r)) for r in registries})

    def parameter(self, data: Any) -> Any:
        return torch.nn.Parameter(torch.tensor(np.asarray(data, dtype="float32")))

    def register_parameter(self, module: Any, name: str, param: Any) -> None:
        module.register_parameter(name, param)

    def register_buffer(self, module: Any, name: str, tensor: Any) -> None:
        module.register_buffer(name, tensor)

    def add_module(self, module: Any, name: str, child: Any) -> None:
        module.add_module(name, child)

    def type_name(self, module: Any) -> str:
        return type(module).__name__.lower()

    def set_value(self, tensor: Any, data: Any) -> None:
        with torch.no_grad():
            tensor.copy_(torch.tensor(np.asarray(data, dtype="float32")))

    def sgd(self, module: Any, lr: float) -> Callable[[Any], None]:
        optimizer = torch.optim.SGD(module.parameters(), lr=lr)

        def step(loss: Any) -> None:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        return step
