"""`unihook demo`: the same hook functions on the same model in every installed framework, side
by side, then the backend capability table.

The models are built through each backend's conformance kit, so this module stays free of
framework imports like the rest of the package.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

from . import api
from ._plugins import DISABLE_ENV, disabled_backends, plugin_manager
from .kinds import KINDS

# The seed model of docs/SEMANTICS.md §4 (torch layout: Linear weight is [out, in]).
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
    for name, module in kit.named_modules(model):
        for attr in ("weight", "bias"):  # (the names the three frameworks' linear layers share)
            param = getattr(module, attr, None)
            if param is not None:
                grad = _torch_layout(attr, kit.grad(param), kit)
                seen.append((f"{name}.{attr}.grad", str(grad.tolist())))
    return seen


def _torch_layout(name: str, grad: Any, kit: Any) -> Any:
    # paddle's Linear weight is [in, out]: show every framework in torch's layout.
    return grad.T if kit.name == "paddle" and name.endswith("weight") else grad


def main(out: str) -> int:
    """Run the demo; write the Grad-CAM picture into directory `out`. 0 when every installed
    framework showed the same numbers."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore", message="No ccache found")
    kits = sorted(
        (k for k in plugin_manager().hook.unihook_conformance_kit() if k is not None),
        key=lambda k: k.name != "torch",
    )
    if not kits:
        print(f"No framework to run the demo on: {_left_out()}.", file=sys.stderr)
        return 1
    runs = [run_one(kit) for kit in kits]
    events = [event for event, _ in runs[0]]
    width = max(len(e) for e in events)
    col = max(len(v) for run in runs for _, v in run)
    compare = len(kits) > 1
    print("Seed model Linear(3,4) -> ReLU -> Linear(4,1), identical weights, the same hooks:\n")
    header = f"{'event':<{width}}  " + "  ".join(f"{k.name:<{col}}" for k in kits)
    print(header + ("  same" if compare else ""))
    all_same = True
    for i, event in enumerate(events):
        values = [run[i][1] if i < len(run) else "-" for run in runs]
        same = all(v == values[0] for v in values)
        all_same &= same
        mark = ("  yes" if same else "  NO") if compare else ""
        print(f"{event:<{width}}  " + "  ".join(f"{v:<{col}}" for v in values) + mark)
    print()
    ran = _names([k.name for k in kits])
    if not compare:
        # one framework: nothing was compared, say so instead of claiming agreement
        left_out = _left_out()
        others = f" ({left_out})" if left_out else ""
        print(f"Ran with {ran} only{others}: nothing to compare.")
    elif all_same:
        print(f"Identical in every framework ({ran}).")
    else:
        print(f"The frameworks DIFFER ({ran}; see NO rows).")
    print()
    _print_backends()
    print()
    picture = write_gradcam(kits, os.path.join(out, "gradcam.png"))
    if picture:
        print(f"Grad-CAM computed with {ran}: {picture}")
        training, title = write_training(kits, os.path.join(out, "training.png"))
        print(f"{title}: {training}")
    return 0 if all_same else 1


def _names(names: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def demo_image(size: int = 64) -> Any:
    """An RGB test picture: a warm disk and a cool square on a soft gradient, NCHW."""
    import numpy as np

    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.stack([0.3 * xx, 0.3 * yy, 0.2 * (1 - xx)], axis=0)
    disk = (yy - 0.35) ** 2 + (xx - 0.3) ** 2 < 0.02
    img[0][disk], img[1][disk] = 1.0, 0.6
    square = (np.abs(yy - 0.7) < 0.12) & (np.abs(xx - 0.7) < 0.12)
    img[2][square], img[1][square] = 1.0, 0.4
    return img[None].astype("float32")


def write_gradcam(kits: list[Any], path: str) -> str | None:
    """Grad-CAM of the same classifier in every framework, side by side, as a PNG."""
    try:
        import matplotlib

        # paddle sets the root logger to INFO: keep matplotlib's font-cache notice quiet.
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        print(f"matplotlib is not installed: pip install 'unihook[demo]' for {path}")
        return None
    from .recipes import GradCAM
    from .testing import classifier

    image = demo_image()
    maps = {}
    for kit in kits:
        with GradCAM(classifier(kit, seed=3, width=8), "layer4") as cam:
            maps[kit.name] = cam(kit.tensor(image))[0]
    names = list(maps)
    compare = len(names) > 1  # the difference panel only when there is something to compare
    panels = 1 + len(names) + compare
    fig, axes = plt.subplots(1, panels, figsize=(3.2 * panels, 3.6))
    picture = np.clip(image[0].transpose(1, 2, 0), 0, 1)
    axes[0].imshow(picture)
    axes[0].set_title("input")
    for ax, name in zip(axes[1:], names):
        ax.imshow(picture)
        ax.imshow(maps[name], cmap="jet", alpha=0.5, vmin=0, vmax=1)
        ax.set_title(f"Grad-CAM, {name}")
    if compare:
        # the largest difference from the first framework's map, pixel by pixel
        diff = np.max([np.abs(maps[names[0]] - maps[name]) for name in names[1:]], axis=0)
        axes[-1].imshow(diff, cmap="gray", vmin=0, vmax=1)
        others = "|, |".join(f"{names[0]} - {name}" for name in names[1:])
        axes[-1].set_title(f"max |{others}|: {float(diff.max()):.1e}", fontsize=9)
    for ax in axes:
        ax.axis("off")
    same = ", identical weights" if compare else ""
    fig.suptitle(f"unihook.recipes.GradCAM(model, 'layer4'): one recipe{same}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_training(kits: list[Any], path: str, steps: int = 30) -> tuple[str, str]:
    """The same classifier trained `steps` SGD steps in every framework under ActivationStats
    and GradientMonitor; the first framework's histories drawn by `unihook.recipes.plot`, and
    how far the other frameworks' numbers are from them in the title. Needs matplotlib."""
    import numpy as np

    from .recipes import ActivationStats, GradientMonitor, plot
    from .testing import classifier

    image = demo_image()
    rng = np.random.default_rng(0)
    batch = np.concatenate([image, image[..., ::-1], image[..., ::-1, :], image[..., ::-1, ::-1]])
    batch = (batch + rng.normal(0, 0.05, batch.shape)).astype("float32")
    target = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    runs = []
    for kit in kits:
        model = classifier(kit, seed=3, width=8)
        step = kit.sgd(model, 0.05)
        x, y = kit.tensor(batch), kit.tensor(target)
        with ActivationStats(model) as stats, GradientMonitor(model) as monitor:
            for _ in range(steps):
                step(((model(x) - y) ** 2).mean())
        runs.append((kit.name, stats, monitor))
    name, stats, monitor = runs[0]
    first = np.array([list(h.values()) for h in monitor.history])
    worst = (
        max(
            (float(np.max(np.abs(np.array([list(h.values()) for h in m.history]) / first - 1))))
            for _, _, m in runs[1:]
        )
        if len(runs) > 1
        else None
    )
    others = _names([f"{other}'s" for other, _, _ in runs[1:]])
    agree = f"; {others} norms within {worst:.1e} relative" if worst is not None else ""
    title = f"ActivationStats + GradientMonitor, {steps} SGD steps, {name}{agree}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    plot(stats=stats, monitor=monitor, path=path, title=title)
    return path, title


def _left_out() -> str:
    """The backends the demo cannot run and why: "paddle not installed", "torch disabled by
    UNIHOOK_DISABLE"; with the way out when no framework is there at all."""
    infos = api.backends()
    missing = [i.name for i in infos if not i.installed]
    disabled = disabled_backends()
    parts = []
    if disabled:
        parts.append(f"{', '.join(disabled)} disabled by {DISABLE_ENV}")
    if missing:
        parts.append(f"{', '.join(missing)} not installed")
    if not any(i.installed for i in infos):
        if missing:
            parts.append("pip install 'unihook[torch]', 'unihook[paddle]' or 'unihook[mindspore]'")
        if disabled:
            parts.append(f"unset {DISABLE_ENV} to use the disabled ones")
    return "; ".join(parts)


def _print_backends() -> None:
    infos = api.backends()
    print("Backends (unihook.backends()):")
    print(f"  {'hook kind':<26}" + "".join(f"{i.name:<14}" for i in infos))
    print(f"  {'framework version':<26}" + "".join(f"{i.version or '-':<14}" for i in infos))
    for kind in KINDS:
        row = (i.support(kind) if i.installed else "not installed" for i in infos)
        print(f"  {kind:<26}" + "".join(f"{cell:<14}" for cell in row))
