"""The conformance kit for MindSpore (``unihook.testing.Kit``): used only by the test suite.

MindSpore's autograd is functional; the kit's imperative backward runs on ``_tape`` (one
recording session open at all times). A tensor that requires grad is a Parameter (see there).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, cast

import mindspore
import numpy as np
from mindspore import nn, ops
from mindspore.graph.api import _pynative_executor

from unihook.testing import Kit

from . import _tape

# (MindSpore's annotation says it may return None: it returns a tensor)
_detached: Callable[[Any], Any] = ops.stop_gradient

_sync = _pynative_executor.sync

mindspore.set_context(mode=mindspore.PYNATIVE_MODE)


class _Cell(nn.Cell):
    def __init__(self, forward: Callable[..., Any], children: dict[str, Any] | None) -> None:
        super().__init__()
        self._fn = forward
        for name, child in (children or {}).items():
            self.insert_child_to_cell(name, child)

    def construct(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self, *args, **kwargs)


class _InplaceReLU(nn.Cell):
    # nn.ReLU has no inplace flag, and mint's functional relu_ raises "The kernel InplaceReLU
    # unregistered" on CPU: copy_ is an in-place op autograd records
    def construct(self, x: Any) -> Any:
        out = x.copy_(ops.relu(x))
        _sync()  # (see MindSporeKit.add_)
        return out


# framework-neutral class names (the kit's `type_name`)
_NEUTRAL = {"dense": "linear", "sequentialcell": "sequential", "_inplacerelu": "relu"}


def _f32(data: Any) -> Any:
    return mindspore.Tensor(np.asarray(data, dtype="float32"))


def _set(param: Any, data: Any) -> None:
    if data is not None:
        param.set_data(_f32(data))


# BatchNorm's parameter names as torch spells them (the kit's `parameter_grads`)
_BATCHNORM_NAMES = {"gamma": "weight", "beta": "bias"}


# `replace_hook_dict`'s names: Cell's properties
_HOOK_DICTS = {
    "forward_pre": "_forward_pre_hook",
    "forward": "_forward_hook",
    "always_called": "_forward_hook_always_called",
}


class MindSporeKit(Kit):
    name = "mindspore"
    module_class = "mindspore.nn.Cell"  # as the backend's TargetKindError spells it
    retain_graph = False  # one backward per forward: the tape raises BackendStateError (_tape)
    # MindSpore's higher-order gradients nest mindspore.grad, which an imperative tape cannot
    # express; it differentiates with respect to Parameters only (tests/test_mindspore_native.py
    # covers both the framework's way)
    create_graph = False
    grad_non_leaves = False

    # (its Cell backward hooks have another contract)
    native_kinds = frozenset({"tensor", "module_buffer_registration"})

    def __init__(self) -> None:
        self._taped = True  # (until `native_autograd`)
        _tape.start()

    def native_autograd(self) -> None:
        """Close the tape for good (`unihook.testing.native_autograd`): MindSpore's own
        autograd (``value_and_grad``) from now on, the kit's imperative members refused."""
        self._taped = False
        _tape.stop()

    def _tape_on(self, what: str) -> None:
        if not self._taped:
            raise RuntimeError(
                f"{what} [kit mindspore]: expected the kit's tape. Received: a kit switched to "
                "MindSpore's own autograd (native_autograd); differentiate with "
                "mindspore.value_and_grad"
            )

    def _track(self, cell: Any) -> Any:
        if self._taped:
            for p in cell.get_parameters():
                _tape.track(p)
        # a Cell starts in inference mode, a torch Module in training mode: as torch
        cell.set_train(True)
        return cell

    def tensor(self, data: Any, requires_grad: bool = False, dtype: str = "float32") -> Any:
        array = np.asarray(data, dtype=dtype)
        if requires_grad:
            self._tape_on("tensor(requires_grad=True)")
            return _tape.leaf(array)
        if self._taped:
            _tape.start()  # (again after an error: see _tape.start)
        return mindspore.Tensor(array)

    def numpy(self, tensor: Any) -> Any:
        return np.array(_detached(tensor).asnumpy())

    def grad(self, tensor: Any) -> Any:
        return _tape.grad(tensor)

    def requires_grad(self, tensor: Any) -> bool:
        return bool(tensor._requires_grad)

    def add_(self, tensor: Any, value: float) -> Any:
        # Tensor.add_ leaves the tensor unchanged on CPU (it returns a new one): copy_ is in place.
        # MindSpore raises a refused in-place op (a leaf's) in its async pipeline, at some
        # later op: the kit waits for it here, so the error comes from the op, as in torch.
        tensor.copy_(tensor + value)
        _sync()
        return tensor

    def relu(self, tensor: Any) -> Any:
        return ops.relu(tensor)

    def cast(self, tensor: Any, dtype: str) -> Any:
        return tensor.astype(getattr(mindspore, dtype))

    def cat(self, tensors: Sequence[Any], axis: int) -> Any:
        return ops.cat(list(tensors), axis=axis)

    def zeros_like(self, tensor: Any) -> Any:
        return ops.zeros_like(tensor)

    def is_tensor(self, obj: object) -> bool:
        return isinstance(obj, mindspore.Tensor)

    def backward(self, tensor: Any, retain_graph: bool = False) -> None:
        self._tape_on("backward")
        _tape.backward(tensor)

    def autograd_grad(
        self, outputs: Sequence[Any], inputs: Sequence[Any], create_graph: bool = False
    ) -> list[Any]:
        return self.grad_wrt(outputs, inputs, create_graph=create_graph)

    def grad_wrt(
        self,
        outputs: Sequence[Any],
        inputs: Sequence[Any],
        retain_graph: bool = False,
        create_graph: bool = False,
        allow_unused: bool = False,
    ) -> list[Any]:
        if create_graph:
            raise NotImplementedError(
                "create_graph=True: the MindSpore kit cannot record a backward"
            )
        self._tape_on("grad_wrt")
        if not all(isinstance(t, mindspore.Parameter) for t in inputs):
            raise NotImplementedError("the MindSpore kit differentiates w.r.t. Parameters only")
        return _tape.grad_wrt(outputs, inputs)

    def no_grad(self) -> Any:
        return mindspore._no_grad()

    def linear(self, n_in: int, n_out: int, weight: Any = None, bias: Any = None) -> Any:
        # weight [out, in], as torch's (cast: MindSpore's lazy `nn` annotates Dense as optional)
        m = cast(Any, nn).Dense(n_in, n_out)
        _set(m.weight, weight)
        _set(m.bias, bias)
        return self._track(m)

    def relu_module(self, inplace: bool = False) -> Any:
        return self._track(_InplaceReLU() if inplace else nn.ReLU())

    def sequential(self, *modules: Any) -> Any:
        return self._track(nn.SequentialCell(*modules))

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
        pad_mode = "pad" if padding else "valid"  # (its default is "same"; no bias by default)
        m = nn.Conv2d(
            c_in, c_out, k, stride=stride, pad_mode=pad_mode, padding=padding, has_bias=True
        )
        _set(m.weight, weight)  # (MindSpore's layout is torch's)
        _set(m.bias, bias)
        return self._track(m)

    def batchnorm2d(
        self,
        c: int,
        weight: Any = None,
        bias: Any = None,
        running_mean: Any = None,
        running_var: Any = None,
    ) -> Any:
        # eps 1e-5 as torch's; MindSpore's momentum 0.9 weighs the old running value, as
        # paddle's: torch's 0.1. The affine scale and shift are `gamma` and `beta`, the running
        # statistics `moving_mean` and `moving_variance`
        m = nn.BatchNorm2d(c)
        _set(m.gamma, weight)
        _set(m.beta, bias)
        _set(m.moving_mean, running_mean)
        _set(m.moving_variance, running_var)
        return self._track(m)

    # (MindSpore's pooling stride defaults to 1, torch's to the window)
    def max_pool2d(self, k: int, stride: int | None = None) -> Any:
        return self._track(nn.MaxPool2d(k, stride=k if stride is None else stride))

    def avg_pool2d(self, k: int, stride: int | None = None) -> Any:
        return self._track(nn.AvgPool2d(k, stride=k if stride is None else stride))

    def flatten(self) -> Any:
        return self._track(nn.Flatten())

    def module(self, forward: Callable[..., Any], children: dict[str, Any] | None = None) -> Any:
        return self._track(_Cell(forward, children))

    def parameters(self, module: Any) -> list[Any]:
        return [_tape.track(p) for p in module.get_parameters()]

    def trainable_parameters(self, module: Any) -> dict[str, Any]:
        # BatchNorm's gamma and beta are torch's weight and bias; its moving statistics are
        # parameters that need no grad
        batchnorms = {
            name for name, cell in module.cells_and_names() if isinstance(cell, nn.BatchNorm2d)
        }
        params = {}
        for name, p in module.parameters_and_names():
            if not p.requires_grad:
                continue
            owner, _, attr = name.rpartition(".")
            if owner in batchnorms and attr in _BATCHNORM_NAMES:
                name = f"{owner}.{_BATCHNORM_NAMES[attr]}" if owner else _BATCHNORM_NAMES[attr]
            params[name] = _tape.track(p)
        return params

    def clear_grads(self, module: Any) -> None:
        for p in module.get_parameters():
            _tape.set_grad(p, None)

    def parameter_grads(self, module: Any) -> dict[str, Any]:
        return {n: _tape.grad(p) for n, p in self.trainable_parameters(module).items()}

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.cells_and_names())

    def set_training(self, module: Any, training: bool) -> None:
        module.set_train(training)

    def seed(self, seed: int) -> None:
        mindspore.set_seed(seed)

    def hook_counts(self, module: Any) -> dict[str, int]:
        # Cell.__call__ takes its no-hook path when these dicts are empty
        names = (
            "_forward_pre_hook",
            "_forward_pre_hook_with_kwargs",
            "_forward_hook",
            "_forward_hook_with_kwargs",
            "_forward_hook_always_called",
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
            register = target.register_forward_hook
        elif kind == "module_buffer_registration":
            import mindspore.nn.cell as cell_module

            register = cell_module.register_cell_buffer_registration_hook
        else:
            raise NotImplementedError(f"native_hook [kit mindspore]: no native {kind!r} hook")
        return register(hook, **options).remove  # type: ignore[no-any-return]

    def replace_hook_dict(self, module: Any, which: str, new: Callable[[Any], Any]) -> Any:
        # the dicts live in `_lazy_*` attributes behind Cell's read-only properties (which
        # create one on first read); Cell.__setattr__ would file an OrderedDict elsewhere
        name = _HOOK_DICTS[which]
        old = getattr(module, name)
        object.__setattr__(module, "_lazy" + name, new(old))
        return old

    def state_dict_roundtrip(self, module: Any) -> None:
        mindspore.load_param_into_net(module, module.parameters_dict())

    def native_state(self) -> object:
        import mindspore.nn.cell as cell_module

        methods = {k: v for k, v in vars(nn.Cell).items() if callable(v)}
        return (methods, dict(cell_module._global_buffer_registration_hooks))

    def buffer(self, data: Any) -> Any:
        # assigning a plain Tensor to a buffer's name raises TypeError ("Buffer 'b' already
        # exists in network") in MindSpore 2.10; a _Buffer (its port of torch.nn.Buffer) is
        # filed through register_buffer, which runs the registration hooks
        from mindspore.common.parameter import _Buffer

        return _Buffer(self.tensor(data))

    def parameter(self, data: Any) -> Any:
        self._tape_on("parameter")
        return _tape.leaf(np.asarray(data, dtype="float32"))

    def register_parameter(self, module: Any, name: str, param: Any) -> None:
        module.insert_param_to_cell(name, param)

    def register_buffer(self, module: Any, name: str, tensor: Any) -> None:
        module.register_buffer(name, tensor)

    def add_module(self, module: Any, name: str, child: Any) -> None:
        module.insert_child_to_cell(name, child)

    def type_name(self, module: Any) -> str:
        name = type(module).__name__.lower()
        return _NEUTRAL.get(name, name)

    def set_value(self, tensor: Any, data: Any) -> None:
        tensor.set_data(_f32(data))

    def sgd(self, module: Any, lr: float) -> Callable[[Any], None]:
        self._tape_on("sgd")
        params = [_tape.track(p) for p in module.trainable_params()]

        def step(loss: Any) -> None:
            _tape.backward(loss)
            for p in params:
                g = _tape.grad(p)
                if g is not None:
                    p.set_data(_f32(p.asnumpy() - lr * g))
                    p.grad = None

        return step
