"""Global hooks against a framework's own global hooks and import order (the backend-neutral
tests are in unihook/conformance/test_global_hooks.py)."""

from __future__ import annotations

from typing import Any

import pytest
from test_core import run_python

import unihook
from unihook.conformance import kit as kit_of
from unihook.conformance import kits
from unihook.conformance.test_global_hooks import pristine, seed_model  # noqa: F401 (autouse)


def test_module_registration_returning_a_non_module_paddle() -> None:
    """paddle registers only Layers (its own check is a bare assert): a clear error instead."""
    kit_ = kit_of("paddle")
    with unihook.register_module_module_registration_hook(lambda mod, name, v: 5, backend="paddle"):
        with pytest.raises(unihook.HookReturnTypeError, match=r"paddle.*Layer to register as '0'"):
            kit_.sequential(kit_.relu_module())


def test_registering_before_the_framework_is_imported() -> None:
    """backend=None must not import a framework: the hook is installed when it gets imported."""
    out = run_python(
        """
        import sys, warnings, unihook
        warnings.filterwarnings("ignore", message="No ccache found")
        seen = []
        h = unihook.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
        print('torch' in sys.modules, 'paddle' in sys.modules)
        import torch
        torch.nn.ReLU()(torch.ones(1))
        import paddle
        paddle.nn.ReLU()(paddle.ones([1]))
        print(seen)
        h.remove()
        torch.nn.ReLU()(torch.ones(1))
        print(seen, [f for f in sys.meta_path if 'unihook' in type(f).__module__])
        """,
        env={"GLOG_minloglevel": "2"},
    )
    assert out.splitlines() == ["False False", "['ReLU', 'ReLU']", "['ReLU', 'ReLU'] []"]


def test_global_backward_matches_torch_native() -> None:
    """torch's native global full backward (pre-)hooks are the oracle."""
    torch = pytest.importorskip("torch")
    from torch.nn.modules import module as torch_module

    def run(register_full: Any, register_pre: Any, kit: Any) -> list[Any]:
        log: list[Any] = []
        full = register_full(
            lambda m, gi, go: log.append(
                (
                    "full",
                    type(m).__name__,
                    [None if g is None else kit.numpy(g).tolist() for g in gi],
                )
            )
        )
        pre = register_pre(
            lambda m, go: log.append(("pre", type(m).__name__, [kit.numpy(g).tolist() for g in go]))
        )
        try:
            model = seed_model(kit)
            kit.backward(model(kit.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum())
        finally:
            full.remove()
            pre.remove()
        return log

    torch_kit = kit_of("torch")
    oracle = run(
        torch_module.register_module_full_backward_hook,
        torch_module.register_module_full_backward_pre_hook,
        torch_kit,
    )
    for kit in kits():
        ours = run(
            lambda h, kit=kit: unihook.register_module_full_backward_hook(h, backend=kit.name),
            lambda h, kit=kit: unihook.register_module_full_backward_pre_hook(h, backend=kit.name),
            kit,
        )
        assert ours == oracle, kit.name
    assert torch is not None
