"""The conformance kit protocol: what a backend supplies so the conformance suite can build
models and run autograd on its framework without framework-specific code in the tests.

A backend returns its kit from the ``unihook_conformance_kit`` hook. Arrays cross the boundary
as numpy arrays; weights use torch's layout (Linear ``[out, in]``), the kit transposes as its
framework needs. Only the test suites import this module (the shipped one is
``unihook.conformance``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, Sequence

from . import ops

__all__ = [
    "FORWARD_NATIVE_KINDS",
    "Kit",
    "classifier",
    "creates_graph",
    "grads_non_leaves",
    "images",
    "kits",
    "native_autograd",
    "native_kinds",
    "retains_graph",
]

#: The kinds every kit's `Kit.native_hook` takes: the framework's own forward pre- and post-hooks.
FORWARD_NATIVE_KINDS: frozenset[str] = frozenset({"forward_pre", "forward"})


class Kit:
    """The base class of a backend's conformance kit facet (its ``unihook_conformance_kit``
    returns an instance of a subclass): the methods without a default raise
    NotImplementedError naming the facet and the method. With defaults: ``retain_graph``,
    ``create_graph`` and ``grad_non_leaves`` (True: see `retains_graph`, `creates_graph` and
    `grads_non_leaves`), ``native_kinds`` (none beyond the forward ones: see `native_kinds`),
    ``native_autograd()`` (nothing to switch: see `native_autograd`), ``buffer(data)`` (a
    tensor that attribute assignment files as a buffer: ``tensor(data)``). Optional, read with
    ``getattr``: ``module_class``, the framework's module base class as unihook's messages
    spell it (default: torch.nn.Module, paddle.nn.Layer).

    Besides the conformance suite, the project's differential tests
    (``tests/test_differential_*.py``) and its benchmarks (``benchmarks/frameworks.py``) build
    their models, tensors and native hooks through the kits."""

    name: str
    retain_graph: bool = True
    create_graph: bool = True
    grad_non_leaves: bool = True
    native_kinds: frozenset[str] = frozenset()

    def _missing(self, method: str) -> NotImplementedError:
        return NotImplementedError(
            f"unihook.testing: the backend's conformance kit ({type(self).__name__}) must "
            f"implement `{method}`; it has no default."
        )

    def native_autograd(self) -> None:
        """See `native_autograd`: nothing to switch off by default."""

    def buffer(self, data: Any) -> Any:
        """A tensor that attribute assignment files as a buffer: ``tensor(data)`` by
        default."""
        return self.tensor(data)

    # tensors
    def tensor(self, data: Any, requires_grad: bool = False, dtype: str = "float32") -> Any:
        raise self._missing("tensor")

    def numpy(self, tensor: Any) -> Any:
        """A numpy copy of `tensor` (detached)."""
        raise self._missing("numpy")

    def grad(self, tensor: Any) -> Any:
        """The accumulated gradient of a leaf as numpy, or None."""
        raise self._missing("grad")

    def requires_grad(self, tensor: Any) -> bool:
        raise self._missing("requires_grad")

    def add_(self, tensor: Any, value: float) -> Any:
        """In-place add of a scalar."""
        raise self._missing("add_")

    def relu(self, tensor: Any) -> Any:
        raise self._missing("relu")

    def cat(self, tensors: Sequence[Any], axis: int) -> Any:
        raise self._missing("cat")

    def cast(self, tensor: Any, dtype: str) -> Any:
        """`tensor` as `dtype` ("int32", "bool", "float64", ...), differentiably where the
        framework is."""
        raise self._missing("cast")

    def zeros_like(self, tensor: Any) -> Any:
        raise self._missing("zeros_like")

    def is_tensor(self, obj: object) -> bool:
        raise self._missing("is_tensor")

    # autograd
    def backward(self, tensor: Any, retain_graph: bool = False) -> None:
        raise self._missing("backward")

    def autograd_grad(
        self, outputs: Sequence[Any], inputs: Sequence[Any], create_graph: bool = False
    ) -> list[Any]:
        raise self._missing("autograd_grad")

    def grad_wrt(
        self,
        outputs: Sequence[Any],
        inputs: Sequence[Any],
        retain_graph: bool = False,
        create_graph: bool = False,
        allow_unused: bool = False,
    ) -> list[Any]:
        """``autograd.grad`` / ``paddle.grad`` with these options (default retain_graph: the
        framework's, i.e. create_graph)."""
        raise self._missing("grad_wrt")

    def no_grad(self) -> AbstractContextManager[Any]:
        raise self._missing("no_grad")

    # modules (weights in torch layout, as numpy)
    def linear(self, n_in: int, n_out: int, weight: Any = None, bias: Any = None) -> Any:
        raise self._missing("linear")

    def relu_module(self, inplace: bool = False) -> Any:
        raise self._missing("relu_module")

    def sequential(self, *modules: Any) -> Any:
        raise self._missing("sequential")

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
        """A 2-D convolution with a bias, `k` x `k` kernels; `weight` ``[c_out, c_in, k, k]``
        and `bias` as numpy, else the framework's initialisation."""
        raise self._missing("conv2d")

    def batchnorm2d(
        self,
        c: int,
        weight: Any = None,
        bias: Any = None,
        running_mean: Any = None,
        running_var: Any = None,
    ) -> Any:
        """torch's ``BatchNorm2d(c)`` (eps 1e-5, running statistics moved 0.1 of the way to the
        batch's); `weight` and `bias` (the affine scale and shift) and the running statistics
        (what evaluation mode normalises with) as numpy, else ones, zeros, zeros and ones."""
        raise self._missing("batchnorm2d")

    def max_pool2d(self, k: int, stride: int | None = None) -> Any:
        """torch's ``MaxPool2d(k, stride)``: `k` x `k` windows, `stride` defaulting to `k`, no
        padding."""
        raise self._missing("max_pool2d")

    def avg_pool2d(self, k: int, stride: int | None = None) -> Any:
        """torch's ``AvgPool2d(k, stride)``: `k` x `k` windows, `stride` defaulting to `k`, no
        padding."""
        raise self._missing("avg_pool2d")

    def flatten(self) -> Any:
        """torch's ``Flatten()``: a module flattening every axis after the first into one."""
        raise self._missing("flatten")

    def module(self, forward: Callable[..., Any], children: dict[str, Any] | None = None) -> Any:
        """A module whose forward is ``forward(self, *args, **kwargs)``, holding `children`."""
        raise self._missing("module")

    def parameters(self, module: Any) -> list[Any]:
        raise self._missing("parameters")

    def trainable_parameters(self, module: Any) -> dict[str, Any]:
        """Each of `module`'s parameters that require grad, by qualified name as torch spells
        it (the names of `parameter_grads`), the framework's own tensors (in its layout:
        paddle's Linear weight is ``[in, out]``)."""
        raise self._missing("trainable_parameters")

    def clear_grads(self, module: Any) -> None:
        """Drop the accumulated gradients of `module`'s parameters (torch's
        ``zero_grad(set_to_none=True)``): after the next backward they hold its gradients
        alone."""
        raise self._missing("clear_grads")

    def parameter_grads(self, module: Any) -> dict[str, Any]:
        """The accumulated gradient (numpy, or None) of each of `module`'s parameters that
        require grad, by qualified name as torch spells it (``"0.weight"``; BatchNorm's scale
        and shift are ``weight`` and ``bias``, its running statistics are not parameters), in
        torch's layout (a Linear weight's ``[out, in]``)."""
        raise self._missing("parameter_grads")

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        raise self._missing("named_modules")

    def set_training(self, module: Any, training: bool) -> None:
        raise self._missing("set_training")

    def seed(self, seed: int) -> None:
        raise self._missing("seed")

    def hook_counts(self, module: Any) -> dict[str, int]:
        """How many entries each of the module's native forward-hook containers holds (hooks and
        their flag tables: with_kwargs, always_call), keyed by the container's name. All zero
        means no hook residue: the framework is back to its no-hook call path."""
        raise self._missing("hook_counts")

    def hook_dicts(self, module: Any) -> dict[str, Any]:
        """The containers `hook_counts` counts, themselves (their type and identity matter)."""
        raise self._missing("hook_dicts")

    def native_hook(
        self, target: Any, kind: str, hook: Callable[..., Any], **options: Any
    ) -> Callable[[], None]:
        """Register `hook` on `target` with the framework's own registration of `kind` (a
        `unihook.HookKind`), passing `options` (prepend, with_kwargs, always_call); return the
        native handle's remove. Every kit takes "forward_pre" (``register_forward_pre_hook``)
        and "forward" (the forward post-hook) on a module; the others `native_kinds` lists:
        "tensor" (`target` a tensor), "full_backward" and "full_backward_pre" (a module),
        "module_forward_pre", "module_forward" and "module_{parameter,buffer,module}_registration"
        (global: `target` None). A kind the
        framework has no registration for with torch's contract raises `NotImplementedError`."""
        raise self._missing("native_hook")

    def replace_hook_dict(self, module: Any, which: str, new: Callable[[Any], Any]) -> Any:
        """Do what a library does that assigns the module a new hook container instead of
        clearing it (``m._forward_hooks = OrderedDict()``): the container `which` ("forward_pre",
        "forward", or "always_called", the forward hooks' always_call flag table) becomes
        ``new(old)``, by the framework's own attribute assignment. Returns the old one (a
        library that puts it back later keeps it)."""
        raise self._missing("replace_hook_dict")

    def state_dict_roundtrip(self, module: Any) -> None:
        """Load the module's own state dict back into it."""
        raise self._missing("state_dict_roundtrip")

    # global and registration hooks
    def native_state(self) -> object:
        """A comparable snapshot of the framework's hook machinery (patched class methods,
        global hook registries): equal before any unihook hook and after removing them all."""
        raise self._missing("native_state")

    def parameter(self, data: Any) -> Any:
        """A new trainable parameter holding `data`."""
        raise self._missing("parameter")

    def register_parameter(self, module: Any, name: str, param: Any) -> None:
        raise self._missing("register_parameter")

    def register_buffer(self, module: Any, name: str, tensor: Any) -> None:
        raise self._missing("register_buffer")

    def add_module(self, module: Any, name: str, child: Any) -> None:
        raise self._missing("add_module")

    def type_name(self, module: Any) -> str:
        """The module's class name in a framework-neutral spelling (lower case)."""
        raise self._missing("type_name")

    def set_value(self, tensor: Any, data: Any) -> None:
        """Overwrite a parameter or tensor with `data` (same layout in every framework)."""
        raise self._missing("set_value")

    def sgd(self, module: Any, lr: float) -> Callable[[Any], None]:
        """A training step for `module`'s parameters: ``step(loss)`` runs backward, one plain
        SGD update and clears the gradients."""
        raise self._missing("sgd")


def retains_graph(kit: Kit) -> bool:
    """Whether `kit`'s framework can differentiate one recorded graph twice (torch's
    retain_graph, a retry after a hook raised). A kit whose framework cannot (MindSpore 2.10:
    one backward per forward) sets ``retain_graph = False`` and raises
    `unihook.BackendStateError` naming retain_graph at the second backward."""
    return bool(kit.retain_graph)


def creates_graph(kit: Kit) -> bool:
    """Whether `kit`'s imperative backward can record the backward itself for a further one
    (torch's create_graph). A kit over a functional autograd (MindSpore 2.10: higher-order
    gradients nest ``mindspore.grad``) sets ``create_graph = False``; the tests needing it are
    skipped and the backend's own tests cover double backward the framework's way."""
    return bool(kit.create_graph)


def grads_non_leaves(kit: Kit) -> bool:
    """Whether `kit`'s ``autograd_grad`` / ``grad_wrt`` take tensors computed in the graph as
    inputs (torch does; MindSpore 2.10 differentiates with respect to Parameters and the
    function's arguments only: ``grad_non_leaves = False``)."""
    return bool(kit.grad_non_leaves)


def native_kinds(kit: Kit) -> frozenset[str]:
    """The hook kinds `kit`'s ``native_hook`` registers with its framework's own API (its
    ``native_kinds`` attribute): `FORWARD_NATIVE_KINDS` at least. torch's kit takes the
    module backward hooks and the global forward hooks too (the differential tests' oracle,
    the benchmarks' native references); paddle and MindSpore have no module backward hooks
    with torch's contract and no global forward hooks."""
    return FORWARD_NATIVE_KINDS | frozenset(kit.native_kinds)


def native_autograd(kit: Kit) -> None:
    """From now on, differentiate `kit`'s framework its own way only. A kit that emulates an
    imperative backward over a functional autograd (MindSpore's: a tape whose recording
    session, open at all times, records every op run outside ``no_grad`` and makes
    ``unihook.ops.forward_backward`` run on it) closes it (its ``native_autograd()``), so that
    code using the framework's own autograd (``mindspore.value_and_grad``: the benchmarks) runs
    as it does without the kit; that kit's ``backward``, ``grad``, ``autograd_grad``,
    ``grad_wrt``, ``sgd``, ``parameter`` and tensors that require grad raise after. Nothing to
    do for an imperative framework (torch, paddle): the default does nothing."""
    kit.native_autograd()


def kits(names: Iterable[str] | None = None) -> list[Kit]:
    """The conformance kit of every installed backend (not disabled by ``UNIHOOK_DISABLE``),
    sorted by backend name; given `names` (entry-point names), only theirs: a kit imports its
    framework, the others' stay unimported."""
    from ._plugins import plugin_manager

    caller = plugin_manager().hook.unihook_conformance_kit
    if names is None:
        made: list[Any] = caller()
    else:
        wanted = set(names)  # (called in pluggy's order, as `caller()` calls them)
        impls = reversed(caller.get_hookimpls())
        made = [i.function() for i in impls if i.plugin_name in wanted]
    found: list[Kit] = [k for k in made if k is not None]
    return sorted(found, key=lambda k: k.name)


def classifier(kit: Kit, seed: int = 0, classes: int = 3, width: int = 6) -> Any:
    """The same small CNN classifier in any framework: layer1 (conv 3->4, ReLU) -> layer4
    (conv 4->`width`, ReLU) -> global average -> fc, weights drawn once in numpy and copied."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def conv(c_in: int, c_out: int) -> Any:
        layer = kit.conv2d(c_in, c_out, 3, padding=1)
        kit.set_value(layer.weight, rng.normal(0, 0.4, (c_out, c_in, 3, 3)))
        kit.set_value(layer.bias, rng.normal(0, 0.1, (c_out,)))
        return layer

    layer1 = kit.sequential(conv(3, 4), kit.relu_module())
    layer4 = kit.sequential(conv(4, width), kit.relu_module())
    fc = kit.linear(
        width, classes, rng.normal(0, 0.5, (classes, width)), rng.normal(0, 0.1, (classes,))
    )
    return kit.module(
        lambda self, x: self.fc(ops.mean(self.layer4(self.layer1(x)), axis=(2, 3))),
        {"layer1": layer1, "layer4": layer4, "fc": fc},
    )


def images(kit: Kit, n: int = 2, size: int = 8, requires_grad: bool = False) -> Any:
    """A fixed batch of random NCHW images."""
    import numpy as np

    rng = np.random.default_rng(42)
    return kit.tensor(rng.normal(0, 1, (n, 3, size, size)), requires_grad=requires_grad)
