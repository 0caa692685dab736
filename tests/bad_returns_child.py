"""Child process of tests/test_bad_returns.py: runs bad-return cases, one JSON line each.

Reads a JSON list of cases ``[kind, runner, spec]`` on stdin. ``runner`` is "native" (torch's
own hook API: the oracle), "torch" or "paddle" (unihook on that backend). Each result line is
written and flushed before the next case starts, so when paddle crashes the parent knows which
case did it.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any, Callable

os.environ.setdefault("GLOG_minloglevel", "2")
warnings.simplefilter("ignore")

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import torch  # noqa: E402
import torch.nn.modules.module as torch_module  # noqa: E402

import unihook  # noqa: E402

W = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


class BadLen(tuple):  # type: ignore[type-arg]
    """A tuple whose __len__ raises."""

    def __len__(self) -> int:
        raise ZeroDivisionError("no length")


class BadRepr:
    def __repr__(self) -> str:
        raise ZeroDivisionError("no repr")


class Fw:
    """One framework's primitives: tensors, an echo module, a registering container."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lib: Any = torch if name == "torch" else paddle
        self.module_type = torch.nn.Module if name == "torch" else paddle.nn.Layer

    def tensor(self, data: Any, grad: bool = False, dtype: str = "float32") -> Any:
        array = np.asarray(data, dtype=dtype)
        if self.name == "torch":
            return torch.tensor(array, requires_grad=grad)
        return paddle.to_tensor(array, stop_gradient=not grad)

    def is_tensor(self, obj: object) -> bool:
        return bool(self.lib.is_tensor(obj))

    def module(self, forward: Callable[..., Any]) -> Any:
        class Echo(self.module_type):  # type: ignore[misc, valid-type]
            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return forward(*args, **kwargs)

        return Echo()

    def linear(self) -> Any:
        return torch.nn.Linear(2, 2) if self.name == "torch" else paddle.nn.Linear(2, 2)

    def parameter(self) -> Any:
        if self.name == "torch":
            return torch.nn.Parameter(torch.ones(2, 3))
        return paddle.create_parameter(
            [2, 3], "float32", default_initializer=paddle.nn.initializer.Constant(1.0)
        )

    def backward(self, value: Any) -> None:
        value.backward()


FW = {"torch": Fw("torch"), "paddle": Fw("paddle")}
_handles: list[Any] = []  # the running case's hooks


def make(spec: Any, ref: Any, fw: Fw) -> Any:
    """The value `spec` describes; `ref` is what the hook was given (the tensor or tuple it
    would return unchanged)."""
    tag, *rest = spec
    other = FW["paddle" if fw.name == "torch" else "torch"]
    like = _tensor_of(ref, fw)
    if tag == "same":
        return ref
    if tag == "none":
        return None
    if tag in ("int", "float", "bool", "str"):
        return rest[0]
    if tag == "numpy":
        return np.ones(_shape(like) if rest[0] else (), "float32")
    if tag == "tensor":
        shape, dtype = rest
        shapes = {"same": _shape(like), "0d": (), "flat": (int(np.prod(_shape(like))),)}
        base = fw.tensor(np.full(shapes.get(shape, (*_shape(like), 1)), 2.0), dtype="float32")
        return (
            base
            if dtype == "same"
            else base.astype(dtype)
            if fw.name == "paddle"
            else (base.to(getattr(torch, dtype)))
        )
    if tag == "foreign":
        return other.tensor(np.full(_shape(like), 2.0))
    if tag == "module":
        return fw.linear()
    if tag == "foreign_module":
        return other.linear()
    if tag in ("tuple", "list"):
        items = [make(s, _item(ref, i), fw) for i, s in enumerate(rest[0])]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        return {"a": make(rest[0], ref, fw)}
    if tag == "gen":
        return (make(s, _item(ref, i), fw) for i, s in enumerate(rest[0]))
    if tag == "badlen":
        return BadLen(make(s, _item(ref, i), fw) for i, s in enumerate(rest[0]))
    if tag == "badrepr":
        return BadRepr()
    if tag == "kwpair":  # a with_kwargs pre-hook's (args, kwargs)
        return make(rest[0], ref[0], fw), make(rest[1], ref[1], fw)
    raise AssertionError(spec)


def _item(ref: Any, i: int) -> Any:
    if isinstance(ref, (tuple, list)) and ref:
        return ref[i] if i < len(ref) else ref[0]
    return ref


def _tensor_of(ref: Any, fw: Fw) -> Any:
    """A tensor like the one the hook got (a None slot stands for a [2, 3] gradient)."""
    if isinstance(ref, (tuple, list)):
        for item in ref:
            if fw.is_tensor(item):
                return item
        return None
    return ref if fw.is_tensor(ref) else None


def _shape(t: Any) -> tuple[int, ...]:
    return (2, 3) if t is None else tuple(t.shape)


def show(value: Any, fw: Fw) -> Any:
    """A JSON summary that compares equal across frameworks: a tensor is "own" (the running
    framework's) or "foreign"."""
    for name, lib in FW.items():
        if lib.is_tensor(value):
            array = value.detach().numpy() if name == "torch" else value.numpy()
            dtype = str(value.dtype).replace("torch.", "").replace("paddle.", "")
            owner = "own" if name == fw.name else "foreign"
            return ["T", owner, list(array.shape), dtype, np.round(array, 4).tolist()]
    if isinstance(value, (torch.nn.Module, paddle.nn.Layer)):
        return ["M", "own" if isinstance(value, fw.module_type) else "foreign"]
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return [type(value).__name__, [show(v, fw) for v in value]]
    if isinstance(value, dict):
        return ["dict", sorted([k, show(v, fw)] for k, v in value.items())]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return ["obj", type(value).__name__]


def run_case(kind: str, runner: str, spec: Any) -> Any:
    fw = FW["torch" if runner == "native" else runner]
    native = runner == "native"
    glob = kind.startswith("module_") and not kind.endswith("_registration")
    base = kind.removeprefix("module_") if glob else kind

    def returning(ref: Any) -> Any:
        return make(spec, ref, fw)

    if base in ("tensor", "tensor_leaf"):
        x = fw.tensor(W, grad=True)
        y = x * 2 if base == "tensor" else x
        target = y

        def hook(g: Any) -> Any:
            return returning(g)

        if native:
            target.register_hook(hook)
        else:
            unihook.register_tensor_hook(target, hook)
        fw.backward((y * fw.tensor(W)).sum())
        return show(x.grad, fw)

    if base.startswith("forward"):
        with_kwargs = base.endswith("_kwargs")
        pre = base.startswith("forward_pre")
        m = fw.module(lambda *a, **k: (a, k))

        def forward_hook(mod: Any, *rest: Any) -> Any:
            if mod is not m:
                return None
            if pre:
                return returning((rest[0], rest[1]) if with_kwargs else rest[0])
            return returning(rest[-1])

        kind = "forward_pre" if pre else "forward"
        _register(fw, native, glob, kind, m, forward_hook, with_kwargs)
        return show(m(fw.tensor(W), scale=2.0), fw)

    if base in ("full_backward_pre", "full_backward"):
        # two outputs, one unused (a None slot); an int argument (a None grad_input slot)
        m = fw.module(lambda x, k: (x * 3, x * k))
        pre = base == "full_backward_pre"

        def backward_hook(mod: Any, *grads: Any) -> Any:
            return returning(grads[0]) if mod is m else None

        _register(fw, native, glob, base, m, backward_hook, False)
        x = fw.tensor(W, grad=True)
        out = m(x, 4)
        fw.backward((out[0] * fw.tensor(W)).sum())
        return show(x.grad, fw)

    # registration hooks
    what = base.removesuffix("_registration")

    def registration_hook(mod: Any, name: str, value: Any) -> Any:
        return returning(value)

    if native:
        _handles.append(getattr(torch_module, f"register_module_{base}_hook")(registration_hook))
    else:
        register = getattr(unihook, f"register_module_{base}_hook")
        _handles.append(register(registration_hook, backend=fw.name))
    container = fw.module(lambda: None)
    if what == "parameter":
        container.p = fw.parameter()
    elif what == "buffer":
        container.register_buffer("b", fw.tensor(np.ones((2, 3))))
    else:
        container.sub = fw.linear()
    own = container.__dict__
    children = own["_modules" if fw.name == "torch" else "_sub_layers"]
    return [
        sorted([k, show(v, fw)] for k, v in own["_parameters"].items()),
        sorted([k, show(v, fw)] for k, v in own["_buffers"].items()),
        sorted([k, show(v, fw)] for k, v in children.items()),
    ]


def _register(
    fw: Fw, native: bool, glob: bool, kind: str, m: Any, hook: Any, with_kwargs: bool
) -> None:
    options = {"with_kwargs": True} if with_kwargs else {}
    if not native:
        if glob:
            register = getattr(unihook, f"register_module_{kind}_hook")
            _handles.append(register(hook, backend=fw.name, **options))
        else:
            _handles.append(getattr(unihook, f"register_{kind}_hook")(m, hook, **options))
    elif glob and not (kind == "forward_pre" and with_kwargs):
        # (torch has no global with_kwargs pre-hook: its per-module one is the oracle)
        register = getattr(torch_module, f"register_module_{kind}_hook")
        _handles.append(register(hook, **options))
    else:
        _handles.append(getattr(m, f"register_{kind}_hook")(hook, **options))


def main() -> None:
    for kind, runner, spec in json.load(sys.stdin):
        try:
            line = {"ok": run_case(kind, runner, spec)}
        except Exception as error:  # noqa: BLE001 (the outcome is the data)
            line = {
                "raised": type(error).__name__,
                "builtins": [c.__name__ for c in type(error).__mro__ if c.__module__ == "builtins"],
                "unihook": isinstance(error, unihook.UnihookError),
                "message": str(error)[:300],
            }
        finally:
            while _handles:  # a case's hooks end with it, also when it raised
                _handles.pop().remove()
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
