"""Optional peers on the torch CNN: nnsight and transformer-lens, each recording every module's
output. A peer that does not import is reported as skipped, never an error.

Neither peer has persistent hooks: nnsight builds its interventions per `trace`, and
transformer-lens' `run_with_cache` adds and removes its hooks per call, so their set-up is
inside the timed forward by design. unihook's capture is registered outside it, as elsewhere.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Callable

from cases import hooked, unhooked
from frameworks import Remover, Torch
from harness import Body, Case, Metric, Variant, ratio

import unihook

PEERS = {"nnsight": "nnsight", "transformer-lens": "transformer_lens"}


def available() -> dict[str, str | None]:
    """Each peer's version, or None when it does not import."""
    versions: dict[str, str | None] = {}
    for dist, module in PEERS.items():
        try:
            __import__(module)
            versions[dist] = importlib.metadata.version(dist)
        except Exception:  # any import failure (missing, broken against this torch) = skip
            versions[dist] = None
    return versions


def _nnsight_trace(model: Any, x: Any, torch: Any) -> Body:
    from nnsight import NNsight

    traced = NNsight(model)
    envoys = list(traced.modules())  # children before parents: the order outputs complete in

    def body() -> None:
        # nnsight compiles the `with` body and runs it elsewhere: results leave via a list.
        saved: list[Any] = []
        with torch.no_grad(), traced.trace(x):
            saved.extend(envoy.output.save() for envoy in envoys)
        assert len(saved) == len(envoys)

    return body


def _lens_model(model: Any, torch: Any) -> Any:
    """`model` with a HookPoint after every module (same module objects, same weights)."""
    from transformer_lens import HookedRootModule
    from transformer_lens.hook_points import HookPoint

    class Point(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.hook_out = HookPoint()

        def forward(self, x: Any) -> Any:
            return self.hook_out(self.inner(x))

    def wrap(module: Any) -> Any:
        if isinstance(module, torch.nn.Sequential):
            return Point(torch.nn.Sequential(*(wrap(child) for child in module)))
        return Point(module)

    class Root(HookedRootModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = wrap(model)
            self.setup()

        def forward(self, x: Any) -> Any:
            return self.net(x)

    return Root()


def case(fw: Torch, model: Any, x: Any, versions: dict[str, str | None]) -> Case | None:
    """The CNN forward with every module's output recorded, by each installed peer."""
    if not any(versions.values()):
        return None
    torch = fw.t
    fw.set_training(model, False)
    n_modules = len(fw.named_modules(model))

    def forward(net: Any = model) -> Callable[[], None]:
        def body() -> None:
            with torch.no_grad():
                net(x)

        return body

    def keep() -> list[Remover]:
        return [unihook.capture(model).remove]

    variants = [
        Variant("plain", unhooked(forward())),
        Variant("unihook capture", hooked(forward(), keep)),
    ]
    metrics: list[Metric] = [ratio("unihook capture", "plain")]
    if versions["nnsight"]:
        variants.append(Variant("nnsight trace", unhooked(_nnsight_trace(model, x, torch))))
        metrics += [ratio("nnsight trace", "plain"), ratio("unihook capture", "nnsight trace")]
    if versions["transformer-lens"]:
        lens = _lens_model(model, torch)

        def run_with_cache() -> None:
            with torch.no_grad():
                _, cache = lens.run_with_cache(x)
            assert len(cache) == n_modules

        variants += [
            Variant("lens forward", unhooked(forward(lens))),
            Variant("lens run_with_cache", unhooked(run_with_cache)),
        ]
        metrics += [
            ratio("lens forward", "plain"),
            ratio("lens run_with_cache", "plain"),
            ratio("unihook capture", "lens run_with_cache"),
        ]
    return Case(
        "peers/cnn/torch",
        f"torch: cnn forward (eval, no_grad), every module's output ({n_modules} modules), peers",
        "ms",
        1e3,
        variants,
        metrics,
        "lens forward: the HookPoint-wrapped model without hooks (its structural cost)",
    )
