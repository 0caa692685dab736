"""The benchmarks' view of a framework: its backend's conformance kit, and a thin layer over it.

What a kit offers comes from the kit (`unihook.testing.Kit`, the one the conformance suite and
the differential tests use; `load` takes every installed backend's): the layers it builds
(`kit.linear`, `conv2d`, `batchnorm2d`, `relu_module`, `max_pool2d`, `flatten`, `sequential`),
tensors (`kit.tensor`), `seed`, `named_modules`, `set_training`, `no_grad`, `clear_grads`, and
the native hook registrations unihook is compared with (`kit.native_hook`; the kinds a
framework has natively, `unihook.testing.native_kinds`). Each framework's class here adds only
what the benchmarks alone need: the layers no kit builds (`layer_norm`, `gelu`, a `Module` base
class to subclass with a torch-style `forward`), the transformer's tensor ops, the
hand-written recorders' `detach` / `clone` / `copy_`, the timed training step and the thread
settings. A timed body calls these, and the kit's members it uses (`no_grad`,
`native_hook`), as bound attributes: no Python call over the framework's own.

MindSpore (PyNative mode) has functional autograd: every framework builds its training step
(`train_step`), and only the imperative ones (torch, paddle) have `backward` alone. Its kit is
switched to MindSpore's own autograd (`unihook.testing.native_autograd`): the kit's tape would
record every op of the timed bodies.
"""

from __future__ import annotations

import importlib.util
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable

import numpy as np

from unihook.testing import Kit, kits, native_autograd, native_kinds

Hook = Callable[..., Any]
Remover = Callable[[], None]
Step = Callable[[], None]


class Framework:
    """A backend's kit (`kit`) and the members every framework's benchmark layer shares."""

    name: str
    Module: type  # subclassed by the models, with a torch-style `forward`
    detach: Callable[[Any], Any]  # (in hand-written recorders: timed)

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.name = kit.name
        self._rng = np.random.default_rng(0)
        # the kit's, bound once: timed bodies call `no_grad` and (tensor hooks) `native_hook`
        self.no_grad: Callable[[], AbstractContextManager[Any]] = kit.no_grad
        self.native_hook: Callable[..., Remover] = kit.native_hook
        self.named_modules = kit.named_modules
        self.set_training = kit.set_training

    def seed(self, seed: int) -> None:
        """Seed the framework (layers' initial weights) and the inputs' generator."""
        self.kit.seed(seed)
        self._rng = np.random.default_rng(seed)

    def randn(self, *shape: int) -> Any:
        return self.kit.tensor(self._rng.standard_normal(shape))

    def native(self, kind: str) -> bool:
        """Whether the framework has `kind` natively, with torch's contract (the reference)."""
        return kind in native_kinds(self.kit)

    def relu_inplace(self) -> Any:
        return self.kit.relu_module(inplace=True)

    # what only the benchmarks need, per framework
    def layer_norm(self, d: int) -> Any:
        raise NotImplementedError

    def gelu(self) -> Any:
        raise NotImplementedError

    def softmax(self, x: Any) -> Any:
        raise NotImplementedError

    def matmul(self, a: Any, b: Any, transpose_b: bool = False) -> Any:
        raise NotImplementedError

    def split_heads(self, x: Any, heads: int) -> Any:
        raise NotImplementedError

    def merge_heads(self, x: Any) -> Any:
        raise NotImplementedError

    def chunk3(self, x: Any) -> tuple[Any, Any, Any]:
        raise NotImplementedError

    def clone(self, t: Any) -> Any:
        raise NotImplementedError

    def copy_(self, buffer: Any, t: Any) -> None:
        raise NotImplementedError

    def children(self, model: Any) -> Iterable[Any]:
        raise NotImplementedError

    def clear_grads(self, model: Any) -> None:
        """Drop the gradients the last training step accumulated (the kit's)."""
        self.kit.clear_grads(model)

    def train_step(self, model: Any, fn: Callable[..., Any], *args: Any, lr: float = 0) -> Step:
        """`fn(*args)`, the backward of its output's sum into `model`'s parameters' gradients
        and, given `lr`, one SGD update (of the mean square of the output instead: SGD on the
        sum drove the outputs to 1e17 over a full run, and on into the recipes' overflow
        paths): the timed body of the training cases."""
        raise NotImplementedError

    def synced(self, body: Step) -> Step:
        """`body`, returning once the ops it queued have run."""
        return body  # (CPU ops have run when they return)

    def single_thread(self) -> Any:
        """Pin the framework to one thread; what it reports, for the record."""
        raise NotImplementedError

    def own_threads(self) -> Any:
        """The framework's own thread count (`--threads default`), for the record."""
        raise NotImplementedError


class _Imperative(Framework):
    """torch and paddle: gradients accumulate into the parameters by `loss.backward()`."""

    def sgd(self, model: Any, lr: float) -> Step:
        """One plain SGD update of `model`'s parameters from their gradients (the kit's `sgd`
        also runs the backward and clears the gradients: more than the timed step does)."""
        raise NotImplementedError

    def backward(self, out: Any) -> None:
        out.sum().backward()

    def train_step(self, model: Any, fn: Callable[..., Any], *args: Any, lr: float = 0) -> Step:
        if not lr:
            return lambda: fn(*args).sum().backward()
        update = self.sgd(model, lr)

        def step_and_update() -> None:
            _mean_square(fn(*args)).backward()
            update()

        return step_and_update

    def children(self, model: Any) -> Iterable[Any]:
        return model.children()  # type: ignore[no-any-return]


class Torch(_Imperative):
    def __init__(self, kit: Kit) -> None:
        super().__init__(kit)
        import torch

        self.t = torch
        self.Module = torch.nn.Module
        self.detach = torch.Tensor.detach  # (the same C call as `t.detach()`)

    def layer_norm(self, d: int) -> Any:
        return self.t.nn.LayerNorm(d)

    def gelu(self) -> Any:
        return self.t.nn.GELU()

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

    def copy_(self, buffer: Any, t: Any) -> None:
        # detach(): no graph even when grad is enabled, at a fraction of no_grad()'s cost.
        buffer.copy_(t.detach())

    def sgd(self, model: Any, lr: float) -> Step:
        return self.t.optim.SGD(model.parameters(), lr=lr).step

    def single_thread(self) -> Any:
        self.t.set_num_threads(1)
        self.t.set_num_interop_threads(1)
        return self.t.get_num_threads()

    def own_threads(self) -> Any:
        return self.t.get_num_threads()


class Paddle(_Imperative):
    def __init__(self, kit: Kit) -> None:
        super().__init__(kit)
        import paddle

        self.p = paddle
        self.Module = paddle.nn.Layer
        self.detach = paddle.Tensor.detach

    def layer_norm(self, d: int) -> Any:
        return self.p.nn.LayerNorm(d)

    def gelu(self) -> Any:
        return self.p.nn.GELU()

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

    def copy_(self, buffer: Any, t: Any) -> None:
        # Tensor.copy_ rather than paddle.assign: same result, a sixth of the per-call cost.
        buffer.copy_(t.detach(), True)

    def sgd(self, model: Any, lr: float) -> Step:
        return self.p.optimizer.SGD(learning_rate=lr, parameters=model.parameters()).step

    def single_thread(self) -> Any:
        # paddle has no public setter; its private one exists in 3.x, else the env rules.
        setter = getattr(self.p.base.core, "set_num_threads", None)
        if setter is not None:
            setter(1)
        return "set_num_threads(1)" if setter else "OMP_NUM_THREADS only"

    def own_threads(self) -> Any:
        getter = getattr(self.p.base.core, "get_num_threads", None)
        return getter() if getter is not None else "its default"


class MindSpore(Framework):
    """PyNative mode. Autograd is functional (docs/MINDSPORE.md §5): a training step is
    `mindspore.value_and_grad` with respect to the weights, which returns the gradients; there
    is no backward alone and nothing to clear. Ops run asynchronously: a timed body waits for
    them (`synced`)."""

    def __init__(self, kit: Kit) -> None:
        native_autograd(kit)  # (the kit's tape off: see the module's docstring)
        super().__init__(kit)
        import mindspore
        from mindspore import nn, ops
        from mindspore.graph.api import _pynative_executor

        self.ms, self.ops, self._sync = mindspore, ops, _pynative_executor.sync
        self.detach = ops.stop_gradient  # (what unihook's MindSpore ops detach with)

        class Module(nn.Cell):  # a Cell written the torch way: `forward`
            def construct(self, *args: Any) -> Any:
                return self.forward(*args)  # type: ignore[attr-defined]

        class ReLUInplace(nn.Cell):
            # no inplace flag, and mint's relu_ has no CPU kernel: copy_ is in place. (The
            # kit's also waits for the op, for an error MindSpore raises later: a sync per
            # call that the timed forward must not pay.)
            def construct(self, x: Any) -> Any:
                return x.copy_(ops.relu(x))

        self.Module, self._relu_inplace = Module, ReLUInplace

    def relu_inplace(self) -> Any:
        return self._relu_inplace()

    def layer_norm(self, d: int) -> Any:
        return self.ms.nn.LayerNorm((d,), epsilon=1e-5)  # (torch's eps)

    def gelu(self) -> Any:
        return self.ms.nn.GELU(approximate=False)  # torch's default: erf, not tanh

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

    def copy_(self, buffer: Any, t: Any) -> None:
        buffer.copy_(self.ops.stop_gradient(t))

    def children(self, model: Any) -> Iterable[Any]:
        return model.cells()  # type: ignore[no-any-return]

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
        grad = self.ms.value_and_grad(lambda *a: _mean_square(fn(*a)), None, weights)
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

    def single_thread(self) -> Any:
        # its kernels on one thread, and ops run on the calling thread: PyNative's
        # asynchronous pipeline has threads of its own, which contend with everything else
        self.ms.device_context.cpu.op_tuning.threads_num(1)
        self.ms.runtime.launch_blocking()
        return "threads_num(1), launch_blocking()"

    def own_threads(self) -> Any:
        return "its default, asynchronous pipeline"


ORDER = ("torch", "paddle", "mindspore")  # of the cases and their variants
LAYERS: dict[str, Callable[[Kit], Framework]] = {
    "torch": Torch,
    "paddle": Paddle,
    "mindspore": MindSpore,
}


def load(names: Iterable[str] = ORDER) -> list[Framework]:
    """The installed frameworks among `names`, in `ORDER`: each backend's kit
    (`unihook.testing.kits`, which imports only these frameworks) in its benchmark layer."""
    wanted = [name for name in ORDER if name in set(names)]
    if "mindspore" in wanted and importlib.util.find_spec("mindspore") is not None:
        # `import paddle` then `import mindspore` fails (their oneDNN builds clash)
        import mindspore  # noqa: F401
    found = {kit.name: kit for kit in kits(wanted)}
    return [LAYERS[name](found[name]) for name in wanted if name in found]


def _mean_square(out: Any) -> Any:
    """The training cases' loss, which SGD drives to 0 (see `Framework.train_step`)."""
    return (out * out).mean()
