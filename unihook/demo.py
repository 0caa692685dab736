"""`python -m unihook demo`: the same hook functions on the same model in every installed
framework, side by side, then the backend capability table.

The models are built through each backend's conformance kit, so this module stays free of
framework imports like the rest of the package.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from . import api
from ._plugins import plugin_manager
from .info import KINDS

# The seed model of ../shared/SEMANTICS.md §4 (torch layout: Linear weight is [out, in]).
W1 = [[1, 2, 3], [-4, -5, -6], [7, 8, 9], [-10, -11, -12]]
B1 = [1, 2, 3, 4]
W2 = [[1, 2, 3, 4]]
B2 = [1]


def _fmt(value: Any, kit: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_fmt(v, kit) for v in value) + ")"
    if kit.is_tensor(value):
        return str(kit.numpy(value).round(4).tolist())
    return repr(value)


def run_one(kit: Any) -> list[tuple[str, str]]:
    """Build the seed model, hook it, run forward and backward; return (event, value) rows."""
    seen: list[tuple[str, str]] = []
    model = kit.sequential(kit.linear(3, 4, W1, B1), kit.relu_module(), kit.linear(4, 1, W2, B2))
    names = {id(m): n or "model" for n, m in kit.named_modules(model)}

    def pre(module: Any, args: Any) -> Any:
        seen.append((f"forward_pre {names[id(module)]} args", _fmt(args, kit)))
        return None

    def post(module: Any, args: Any, output: Any) -> Any:
        seen.append((f"forward {names[id(module)]} output", _fmt(output, kit)))
        return None

    def backward(module: Any, grad_input: Any, grad_output: Any) -> Any:
        where = names[id(module)]
        seen.append((f"full_backward {where} grad_output", _fmt(grad_output, kit)))
        seen.append((f"full_backward {where} grad_input", _fmt(grad_input, kit)))
        return None

    def double(grad: Any) -> Any:
        seen.append(("tensor x grad (doubled)", _fmt(grad, kit)))
        return grad * 2

    handles = []
    for _, module in kit.named_modules(model):
        handles.append(api.register_forward_pre_hook(module, pre))
        handles.append(api.register_forward_hook(module, post))
        handles.append(api.register_full_backward_hook(module, backward))
    x = kit.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
    handles.append(api.register_tensor_hook(x, double))
    try:
        out = model(x)
        kit.backward(out.sum())
    finally:
        for handle in handles:
            handle.remove()
    seen.append(("output", _fmt(out, kit)))
    seen.append(("x.grad", str(kit.grad(x).tolist())))
    for name, param in model.named_parameters():
        seen.append((f"{name}.grad", str(_torch_layout(name, kit.grad(param), kit).tolist())))
    return seen


def _torch_layout(name: str, grad: Any, kit: Any) -> Any:
    # paddle's Linear weight is [in, out]: show every framework in torch's layout.
    return grad.T if kit.name == "paddle" and name.endswith("weight") else grad


def main() -> int:
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore", message="No ccache found")
    kits = sorted(
        (k for k in plugin_manager().hook.unihook_conformance_kit() if k is not None),
        key=lambda k: k.name != "torch",
    )
    if not kits:
        print("No framework installed: install unihook[torch] or unihook[paddle].")
        return 1
    runs = [run_one(kit) for kit in kits]
    events = [event for event, _ in runs[0]]
    width = max(len(e) for e in events)
    col = max(len(v) for run in runs for _, v in run)
    print("Seed model Linear(3,4) -> ReLU -> Linear(4,1), identical weights, the same hooks:\n")
    print(f"{'event':<{width}}  " + "  ".join(f"{k.name:<{col}}" for k in kits) + "  same")
    all_same = True
    for i, event in enumerate(events):
        values = [run[i][1] if i < len(run) else "-" for run in runs]
        same = all(v == values[0] for v in values)
        all_same &= same
        print(
            f"{event:<{width}}  "
            + "  ".join(f"{v:<{col}}" for v in values)
            + ("  yes" if same else "  NO")
        )
    print()
    print("Identical in every framework." if all_same else "The frameworks DIFFER (see NO rows).")
    print()
    _print_backends()
    return 0 if all_same else 1


def _print_backends() -> None:
    infos = api.backends()
    print("Backends:")
    header = f"  {'backend':<8} {'version':<12} " + " ".join(f"{k:<18}" for k in KINDS)
    print(header)
    for info in infos:
        version = info.version or "not installed"
        print(
            f"  {info.name:<8} {version:<12} " + " ".join(f"{info.support(k):<18}" for k in KINDS)
        )
