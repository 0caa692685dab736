"""unihook.recipes.compare on a ResNet-style torch model and its paddle port, against the same
job done with hand-written native hooks (and PaDiff's ``auto_diff`` when it is installed).

Every variant does the whole job from the same two models with copied weights: hook every
module of both, run forward and backward (loss = output.sum()) on the same input, bring each
module call's output, grad_output and grad_input to numpy, compare them module by module and
name the first divergence. Hand-written: torch's native forward and full backward hooks; paddle
has no module backward hooks, so its grad_output and grad_input come from tensor hooks placed
on each layer's output and input in a forward post-hook (what one writes by hand there).

    python benchmarks/compare_bench.py [--quick | --smoke]   # this case alone
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
from typing import Any, Callable

import numpy as np
from frameworks import Framework
from harness import Body, Case, Cleanup, Rounds, Setup, Variant, ratio
from models import Sizes

ROUNDS = {"full": Rounds(10, 1, repeats=3), "quick": Rounds(4, 1, repeats=2), "smoke": Rounds(1, 1)}


def rounds(mode: str) -> Rounds:
    """compare runs two models forward and backward: fewer rounds than the per-call cases."""
    return ROUNDS[mode]


def resnet(fw: Framework, s: Sizes) -> Any:
    """A stem and three stages of two BasicBlocks (conv-BN-ReLU-conv-BN, identity or 1x1
    downsample, add, ReLU), global average pool, linear. Out-of-place: torch's native full
    backward hook, used by the hand-written variant, raises on an in-place op."""

    kit = fw.kit

    class Block(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.conv1 = kit.conv2d(c_in, c_out, 3, stride=stride, padding=1)
            self.bn1 = kit.batchnorm2d(c_out)
            self.relu = kit.relu_module()
            self.conv2 = kit.conv2d(c_out, c_out, 3, padding=1)
            self.bn2 = kit.batchnorm2d(c_out)
            self.downsample = (
                kit.sequential(kit.conv2d(c_in, c_out, 1, stride=stride), kit.batchnorm2d(c_out))
                if stride != 1 or c_in != c_out
                else None
            )

        def forward(self, x: Any) -> Any:
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(fw.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            w = s.width
            self.stem = kit.sequential(
                kit.conv2d(3, w, 3, padding=1), kit.batchnorm2d(w), kit.relu_module()
            )
            stages, c_in = [], w
            for i in range(3):
                c_out = w * 2**i
                stages.append(kit.sequential(Block(c_in, c_out, 1 if i == 0 else 2),
                                            Block(c_out, c_out, 1)))  # fmt: skip
                c_in = c_out
            self.stages = kit.sequential(*stages)
            self.flatten = kit.flatten()
            self.fc = kit.linear(c_in, 10)

        def forward(self, x: Any) -> Any:
            return self.fc(self.flatten(self.stages(self.stem(x)).mean((2, 3), keepdim=True)))

    return ResNet()


# -- the hand-written job ------------------------------------------------------------------------


def _numpy(t: Any) -> np.ndarray:
    return np.array(t.detach().cpu().numpy() if hasattr(t, "cpu") else t.detach().numpy())


def _torch_trace(fw: Framework, model: Any, x: np.ndarray) -> dict[str, list[Any]]:
    torch = fw.t  # type: ignore[attr-defined]
    out: dict[str, list[Any]] = {"forward": [], "backward": []}
    handles = []
    for name, module in model.named_modules():

        def forward(m: Any, args: Any, output: Any, name: str = name) -> None:
            out["forward"].append((name, [_numpy(output)]))

        def backward(m: Any, gin: Any, gout: Any, name: str = name) -> None:
            arrays = [None if g is None else _numpy(g) for g in (*gout, *gin)]
            out["backward"].append((name, arrays))

        handles.append(module.register_forward_hook(forward))
        handles.append(module.register_full_backward_hook(backward))
    try:
        model(torch.tensor(x, requires_grad=True)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return out


def _paddle_trace(fw: Framework, model: Any, x: np.ndarray) -> dict[str, list[Any]]:
    paddle = fw.p  # type: ignore[attr-defined]
    out: dict[str, list[Any]] = {"forward": [], "backward": []}
    handles = []
    for name, layer in model.named_sublayers(include_self=True):

        def forward(m: Any, args: Any, output: Any, name: str = name) -> None:
            out["forward"].append((name, [_numpy(output)]))
            grads: list[Any] = []  # grad_output, then each input's gradient
            targets = [output] + [a for a in args if isinstance(a, paddle.Tensor)]
            for t in targets:
                if not t.stop_gradient:
                    t.register_hook(lambda g, grads=grads: grads.append(_numpy(g)))
            out["backward"].append((name, grads))

        handles.append(layer.register_forward_post_hook(forward))
    try:
        x_p = paddle.to_tensor(x, stop_gradient=False)
        model(x_p).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return out


def _first(a: list[Any], b: list[Any], rtol: float) -> str | None:
    """The first (name, arrays) of `a` whose arrays differ from `b`'s entry of the same name and
    occurrence, beyond max|a - b| <= rtol * max|a|."""
    seen: dict[str, int] = {}
    others: dict[str, list[list[Any]]] = {}
    for name, arrays in b:
        others.setdefault(name, []).append(arrays)
    for name, arrays in a:
        k = seen[name] = seen.get(name, -1) + 1
        candidates = others.get(name, [])
        if k >= len(candidates):
            continue
        for x, y in zip(arrays, candidates[k]):
            if x is not None and y is not None and x.shape == y.shape:
                if np.abs(x - y).max() > rtol * np.abs(x).max():
                    return name
    return None


def hand_written(torch_fw: Framework, paddle_fw: Framework, pair: tuple[Any, Any], x: Any) -> Any:
    a = _torch_trace(torch_fw, pair[0], x)
    b = _paddle_trace(paddle_fw, pair[1], x)
    return _first(a["forward"], b["forward"], 5e-5), _first(a["backward"], b["backward"], 5e-5)


# -- the case ------------------------------------------------------------------------------------


def _padiff(torch_fw: Framework, paddle_fw: Framework, pair: tuple[Any, Any], x: Any) -> Any:
    from padiff import auto_diff

    torch, paddle = torch_fw.t, paddle_fw.p  # type: ignore[attr-defined]
    inputs = ({"x": paddle.to_tensor(x)}, {"x": torch.tensor(x)})
    with contextlib.redirect_stdout(io.StringIO()):  # it logs every stage
        return auto_diff(pair[1], pair[0], inputs, auto_weights=False, options={"atol": 1e-4})


def case(fws: list[Framework], sizes: Sizes) -> Case | None:
    """None unless torch and paddle are both loaded."""
    by_name = {fw.name: fw for fw in fws}
    if not {"torch", "paddle"} <= set(by_name):
        return None
    from unihook.recipes import compare, copy_weights

    torch_fw, paddle_fw = by_name["torch"], by_name["paddle"]
    torch_fw.seed(0)
    pair = (resnet(torch_fw, sizes), resnet(paddle_fw, sizes))
    copy_weights(*pair)
    x = np.random.default_rng(0).standard_normal((sizes.batch, 3, sizes.image, sizes.image))
    x = x.astype(np.float32)

    def clear() -> None:
        for fw, model in zip((torch_fw, paddle_fw), pair):
            fw.clear_grads(model)

    def variant(job: Callable[[], Any]) -> Setup:
        def setup() -> tuple[Body, Cleanup]:
            return job, clear

        return setup

    variants = [
        Variant("compare", variant(lambda: compare(pair[0], pair[1], x))),
        Variant(
            "compare, no reference",
            variant(lambda: compare(pair[0], pair[1], x, reference=False)),
        ),
        Variant("hand-written", variant(lambda: hand_written(torch_fw, paddle_fw, pair, x))),
    ]
    metrics = [
        ratio("compare", "hand-written"),
        ratio("compare, no reference", "hand-written"),
        ratio("compare", "compare, no reference"),
    ]
    padiff = importlib.util.find_spec("padiff") is not None
    if padiff:
        variants.append(Variant("padiff", variant(lambda: _padiff(torch_fw, paddle_fw, pair, x))))
        metrics.append(ratio("compare", "padiff"))
    n = len(list(pair[0].named_modules()))
    return Case(
        "compare/resnet",
        f"compare torch vs paddle ResNet-style port ({n} modules, train mode), forward+backward",
        "ms",
        1e3,
        variants,
        metrics,
        "the whole job per sample: hooks, both runs, numpy, per-module comparison; "
        + ("PaDiff auto_diff (auto_weights=False)" if padiff else "padiff: not installed"),
    )


def main(argv: list[str]) -> int:
    import frameworks
    import report
    from harness import run_case

    mode = "smoke" if "--smoke" in argv else "quick" if "--quick" in argv else "full"
    sizes = Sizes.smoke() if mode == "smoke" else Sizes()
    found = case(frameworks.load(), sizes)
    if found is None:
        print("compare needs both torch and paddle")
        return 1
    report.print_case(run_case(found, rounds(mode)))
    return 0


if __name__ == "__main__":
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")
    sys.exit(main(sys.argv[1:]))
