"""The measured cases. Hooks are registered in a variant's setup, outside the timed body, and
removed in its cleanup, so every variant starts a sample from the same, unhooked, model."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import models
from frameworks import Framework, Hook, Remover
from harness import Body, Case, Cleanup, Metric, Setup, Target, Variant, ratio
from harness import added_per_hook as added
from models import Sizes

import unihook

PER_HOOK_TARGET = Target(0.15, "<= 0.15 us")
REUSE_TARGET = Target(1.10, "< 1.10x")
SAME_AS_HANDWRITTEN = Target(1.02, "<= 1.02x")
CAPTURE_TARGET = Target(1.05, "<= 1.05x")
NO_WORSE = Target(1.0, "<= 1.00")


# -- no-op hooks: the same function objects go to the native and the unihook registration --


def noop_pre(module: Any, args: Any) -> None:
    return None


def noop_post(module: Any, args: Any, output: Any) -> None:
    return None


def noop_backward(module: Any, grad_input: Any, grad_output: Any) -> None:
    return None


def noop_grad(grad: Any) -> None:
    return None


def hooked(
    body: Body, register: Callable[[], list[Remover]], after: Cleanup | None = None
) -> Setup:
    """A setup that registers hooks, times `body`, then removes them (and runs `after`)."""

    def setup() -> tuple[Body, Cleanup]:
        removers = register()

        def cleanup() -> None:
            for remove in removers:
                remove()
            if after is not None:
                after()

        return body, cleanup

    return setup


def unhooked(body: Body, after: Cleanup | None = None) -> Setup:
    return hooked(body, list, after)


# -- 1. per call: no-op forward pre/post hooks on Linear(8, 8), 1 x 8 input --


def per_call(fw: Framework, calls: int) -> Case:
    fw.seed(0)
    layer, x = fw.kit.linear(8, 8), fw.randn(1, 8)

    @fw.synced
    def loop() -> None:
        with fw.no_grad():
            for _ in range(calls):
                layer(x)

    native = {"pre": ("forward_pre", noop_pre), "post": ("forward", noop_post)}
    ours = {"pre": unihook.register_forward_pre_hook, "post": unihook.register_forward_hook}
    variants = [Variant("unhooked", unhooked(loop))]
    metrics: list[Metric] = []
    for kind, (native_kind, hook) in native.items():
        register_ours = ours[kind]
        for n in (1, 10):

            def by_native(
                native_kind: str = native_kind, hook: Any = hook, n: int = n
            ) -> list[Remover]:
                return [fw.native_hook(layer, native_kind, hook) for _ in range(n)]

            def by_unihook(
                register: Any = register_ours, hook: Any = hook, n: int = n
            ) -> list[Remover]:
                return [register(layer, hook).remove for _ in range(n)]

            nat, uni = f"native {kind} x{n}", f"unihook {kind} x{n}"
            variants += [
                Variant(nat, hooked(loop, by_native)),
                Variant(uni, hooked(loop, by_unihook)),
            ]
            metrics += [
                ratio(nat, "unhooked"),
                ratio(uni, "unhooked"),
                added(uni, nat, n, PER_HOOK_TARGET),
            ]
    return Case(
        f"per_call/{fw.name}",
        f"{fw.name}: Linear(8,8), 1x8, no-op forward hooks, per call",
        "us/call",
        1e6 / calls,
        variants,
        metrics,
        f"{calls} calls per sample, under no_grad",
    )


# -- 1b. per call: one global no-op forward hook (every module), the same Linear(8, 8) --


def global_per_call(fw: Framework, calls: int) -> Case:
    """unihook's global hooks against torch's native ones; paddle and MindSpore have none
    natively, so their reference is a hook registered on the layer itself."""
    fw.seed(0)
    layer, x = fw.kit.linear(8, 8), fw.randn(1, 8)

    @fw.synced
    def loop() -> None:
        with fw.no_grad():
            for _ in range(calls):
                layer(x)

    def ours(register: Any, hook: Hook) -> Callable[[], list[Remover]]:
        return lambda: [register(hook, backend=fw.name).remove]

    variants = [
        Variant("unhooked", unhooked(loop)),
        Variant(
            "unihook global pre",
            hooked(loop, ours(unihook.register_module_forward_pre_hook, noop_pre)),
        ),
        Variant(
            "unihook global post",
            hooked(loop, ours(unihook.register_module_forward_hook, noop_post)),
        ),
    ]
    metrics = [ratio("unihook global pre", "unhooked"), ratio("unihook global post", "unhooked")]
    if fw.native("module_forward_pre") and fw.native("module_forward"):
        reference = "native global"
        variants += [
            Variant(
                "native global pre",
                hooked(loop, lambda: [fw.native_hook(None, "module_forward_pre", noop_pre)]),
            ),
            Variant(
                "native global post",
                hooked(loop, lambda: [fw.native_hook(None, "module_forward", noop_post)]),
            ),
        ]
    else:
        reference = "native local"
        variants += [
            Variant(
                "native local pre",
                hooked(loop, lambda: [fw.native_hook(layer, "forward_pre", noop_pre)]),
            ),
            Variant(
                "native local post",
                hooked(loop, lambda: [fw.native_hook(layer, "forward", noop_post)]),
            ),
        ]
    for kind in ("pre", "post"):
        metrics += [
            ratio(f"{reference} {kind}", "unhooked"),
            added(f"unihook global {kind}", f"{reference} {kind}", 1),
        ]
    return Case(
        f"global_per_call/{fw.name}",
        f"{fw.name}: Linear(8,8), 1x8, one global no-op forward hook, per call",
        "us/call",
        1e6 / calls,
        variants,
        metrics,
        f"{calls} calls per sample, under no_grad; paddle and mindspore have no native global "
        "hooks: their reference is a hook on the layer itself",
    )


# -- 1c. torch: ops on the output of a hooked module that returned its input --


def alias_ops(calls: int, ops: int = 10) -> Case:
    """What watching an output that is the module's input costs on torch (`_alias.InputAlias`,
    README "Module backward hooks"): an `nn.Identity` with a no-op full backward hook, called
    alone and followed by `ops` ops on its output; torch's native hook against unihook's."""
    import torch

    torch.manual_seed(0)
    identity = torch.nn.Identity()
    x = torch.randn(8, 8, requires_grad=True) * 1  # (not a leaf: a leaf's alias is guarded)

    def call() -> None:
        for _ in range(calls):
            identity(x)

    def call_and_ops() -> None:
        for _ in range(calls):
            out = identity(x)
            for _ in range(ops):
                out.mul(2)

    def native() -> list[Remover]:
        return [identity.register_full_backward_hook(noop_backward).remove]

    def ours() -> list[Remover]:
        return [unihook.register_full_backward_hook(identity, noop_backward).remove]

    variants = [
        Variant("native call", hooked(call, native)),
        Variant("unihook call", hooked(call, ours)),
        Variant(f"native call + {ops} ops", hooked(call_and_ops, native)),
        Variant(f"unihook call + {ops} ops", hooked(call_and_ops, ours)),
    ]
    nat, uni = f"native call + {ops} ops", f"unihook call + {ops} ops"
    per_op = Metric(
        f"(({uni}) - (unihook call) - ({nat}) + (native call)) / {ops} ops",
        lambda t: ((t[uni] - t["unihook call"]) - (t[nat] - t["native call"])) / ops,
        "us",
        None,
        {uni, nat, "unihook call", "native call"},
    )
    return Case(
        "alias_ops/torch",
        f"torch: nn.Identity with a no-op full backward hook, then {ops} ops on its output",
        "us/call",
        1e6 / calls,
        variants,
        [added("unihook call", "native call", 1), per_op, ratio(uni, nat)],
        f"{calls} calls per sample, with grad, no backward; the input is not a leaf",
    )


def beside_natives(calls: int) -> Case:
    """What a call of a module with a no-op full backward hook costs beside n native forward
    hooks, torch's hook against unihook's: unihook's hook dict compares the framework's dict
    (the native hooks) with its own at each call (README "Threads"), so the added cost grows
    with n; under no_grad, where the backward hooks themselves do nothing."""
    import torch

    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 8), torch.randn(1, 8)

    def loop() -> None:
        with torch.no_grad():
            for _ in range(calls):
                layer(x)

    variants: list[Variant] = []
    metrics: list[Metric] = []
    for n in (0, 1, 5):

        def native(n: int = n) -> list[Remover]:
            hooks = [layer.register_forward_hook(noop_post) for _ in range(n)]
            return [h.remove for h in hooks] + [
                layer.register_full_backward_hook(noop_backward).remove
            ]

        def ours(n: int = n) -> list[Remover]:
            hooks = [layer.register_forward_hook(noop_post) for _ in range(n)]
            backward = unihook.register_full_backward_hook(layer, noop_backward)
            return [backward.remove] + [h.remove for h in hooks]

        nat, uni = f"native backward + {n} forward", f"unihook backward + {n} forward"
        variants += [Variant(nat, hooked(loop, native)), Variant(uni, hooked(loop, ours))]
        metrics.append(added(uni, nat, 1))
    return Case(
        "beside_natives/torch",
        "torch: Linear(8,8), 1x8, a no-op full backward hook beside n native forward hooks",
        "us/call",
        1e6 / calls,
        variants,
        metrics,
        f"{calls} calls per sample, under no_grad",
    )


# -- 2a. forward capture of every module, eval mode, no_grad --


def _output_recorders(
    fw: Framework, model: Any, store: Callable[[], dict[str, Any]]
) -> list[Remover]:
    """Native forward hooks on every module writing ``store()[name] = output.detach()``."""

    def recorder(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            store()[name] = fw.detach(output)

        return hook

    return [fw.native_hook(m, "forward", recorder(n)) for n, m in fw.named_modules(model)]


def _copying_recorders(fw: Framework, model: Any) -> list[Remover]:
    """Native forward hooks on every module copying the output into a buffer kept per module:
    the hand-written equivalent of ``capture(reuse=True)``."""
    buffers: dict[str, Any] = {}

    def recorder(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            buffer = buffers.get(name)
            if buffer is None or buffer.shape != output.shape:
                buffers[name] = fw.clone(output)
            else:
                fw.copy_(buffer, output)

        return hook

    return [fw.native_hook(m, "forward", recorder(n)) for n, m in fw.named_modules(model)]


def capture(fw: Framework, label: str, model: Any, x: Any) -> Case:
    fw.set_training(model, False)
    n_modules = len(fw.named_modules(model))

    @fw.synced
    def forward() -> None:
        with fw.no_grad():
            model(x)

    def overwrite() -> list[Remover]:
        record: dict[str, Any] = {}
        return _output_recorders(fw, model, lambda: record)

    def new_dict_per_call() -> list[Remover]:
        current: list[dict[str, Any]] = [{}]

        def fresh(module: Any, args: Any) -> None:
            current[0] = {}

        return [
            fw.native_hook(model, "forward_pre", fresh),
            *_output_recorders(fw, model, lambda: current[0]),
        ]

    def keep() -> list[Remover]:
        return [unihook.capture(model).remove]

    def primed(register: Callable[[], list[Remover]]) -> Callable[[], list[Remover]]:
        """Reuse is for repeated forwards: one untimed forward allocates the buffers, the timed
        one refills them."""

        def register_and_fill() -> list[Remover]:
            removers = register()
            forward()
            return removers

        return register_and_fill

    def reuse() -> list[Remover]:
        cache = unihook.capture(model, reuse=True)
        return [cache.remove]

    _check_capture_complete(model, forward, n_modules)
    return Case(
        f"capture/{label}/{fw.name}",
        f"{fw.name}: {label} forward (eval, no_grad), every module's output ({n_modules} modules)",
        "ms",
        1e3,
        [
            Variant("plain", unhooked(forward)),
            Variant("native dict", hooked(forward, overwrite)),
            Variant("native new dict/call", hooked(forward, new_dict_per_call)),
            Variant("unihook capture", hooked(forward, keep)),
            Variant("native copy", hooked(forward, primed(lambda: _copying_recorders(fw, model)))),
            Variant("unihook reuse", hooked(forward, primed(reuse))),
        ],
        [
            ratio("native dict", "plain"),
            ratio("native new dict/call", "plain"),
            ratio("unihook capture", "plain"),
            ratio("unihook capture", "native dict", SAME_AS_HANDWRITTEN),
            ratio("native copy", "plain"),
            ratio("unihook reuse", "plain", REUSE_TARGET if label == "cnn" else None),
            ratio("unihook reuse", "native copy", SAME_AS_HANDWRITTEN),
        ],
        "one forward per sample; each sample registers a fresh capture / dict (outside the "
        "timed forward), so keep mode holds exactly one forward's outputs, as the native dict "
        "does; reuse and native copy time the second forward after registration",
    )


def _check_capture_complete(model: Any, forward: Body, n_modules: int) -> None:
    """The comparison is only fair if capture records every module, as the native hooks do."""
    with unihook.capture(model) as cache:
        forward()
    assert len(cache.keys()) == n_modules, (len(cache.keys()), n_modules)


# -- 2a'. forward capture beside in-place ops: the CNN with ReLU(inplace=True) --


def capture_inplace(fw: Framework, model: Any, x: Any) -> Case:
    """Every BatchNorm output is overwritten by the in-place ReLU after it: native hooks that
    keep detached aliases record wrong values there. The exact hand-written equivalents copy
    every output, or only the outputs an in-place op will touch (picked by hand: BatchNorm);
    capture learns the latter from its first forward (``unihook first capture``: that forward
    copies everything)."""
    fw.set_training(model, False)
    named = fw.named_modules(model)
    overwritten = {n for n, m in named if "BatchNorm" in type(m).__name__}

    @fw.synced
    def forward() -> None:
        with fw.no_grad():
            model(x)

    def recorders(copied: set[str]) -> Callable[[], list[Remover]]:
        def register() -> list[Remover]:
            record: dict[str, Any] = {}

            def recorder(name: str) -> Callable[..., None]:
                if name in copied:

                    def hook(module: Any, args: Any, output: Any) -> None:
                        record[name] = fw.clone(output)

                else:

                    def hook(module: Any, args: Any, output: Any) -> None:
                        record[name] = fw.detach(output)

                return hook

            return [fw.native_hook(m, "forward", recorder(n)) for n, m in named]

        return register

    def keep() -> list[Remover]:
        return [unihook.capture(model).remove]

    def first() -> list[Remover]:
        # what capture learned about this model (private: a benchmark-only reset)
        learned = importlib.import_module("unihook.capture")._learned
        for _, module in named:
            learned.pop(module, None)
        return keep()

    _check_capture_exact(fw, model, forward, overwritten)
    return Case(
        f"capture_inplace/cnn/{fw.name}",
        f"{fw.name}: cnn with in-place ReLU, forward (eval, no_grad), every module's output "
        f"({len(named)} modules, {len(overwritten)} overwritten in place)",
        "ms",
        1e3,
        [
            Variant("plain", unhooked(forward)),
            Variant("native dict (stale)", hooked(forward, recorders(set()))),
            Variant("native copy all", hooked(forward, recorders({n for n, _ in named}))),
            Variant("native copy picked", hooked(forward, recorders(overwritten))),
            Variant("unihook capture", hooked(forward, keep)),
            Variant("unihook first capture", hooked(forward, first)),
        ],
        [
            ratio("native dict (stale)", "plain"),
            ratio("native copy all", "plain"),
            ratio("native copy picked", "plain"),
            ratio("unihook capture", "plain"),
            ratio("unihook capture", "native copy picked", CAPTURE_TARGET),
            ratio("unihook capture", "native copy all"),
            ratio("unihook capture", "native dict (stale)"),
            ratio("unihook first capture", "native copy all"),
        ],
        "one forward per sample, a fresh capture / dict each (registered untimed); `unihook "
        "capture` has learned the model in an earlier sample, `unihook first capture` forgets "
        "it first; `native dict (stale)` holds wrong BatchNorm outputs",
    )


def _check_capture_exact(fw: Framework, model: Any, forward: Body, overwritten: set[str]) -> None:
    """capture keeps the BatchNorm outputs as returned, not as the in-place ReLU left them."""
    for _ in range(2):  # learning, then learned
        with unihook.capture(model) as cache:
            forward()
        for name in overwritten:
            assert unihook.ops.to_numpy(cache[name]).min() < 0, name


# -- 2b. forward + backward with a no-op full backward hook on every leaf module --


def backward(
    fws: list[Framework],
    label: str,
    build: Callable[..., Any],
    make_input: Callable[..., Any],
    sizes: Sizes,
    targets: bool = True,
) -> Case:
    variants: list[Variant] = []
    for fw in fws:
        fw.seed(0)
        model, x = build(fw, sizes), make_input(fw, sizes)
        fw.set_training(model, True)
        leaves = [m for _, m in models.leaves(fw, model)]
        step = fw.train_step(model, model, x)

        def clear(fw: Framework = fw, model: Any = model) -> None:
            fw.clear_grads(model)

        def ours(leaves: list[Any] = leaves) -> list[Remover]:
            return [unihook.register_full_backward_hook(m, noop_backward).remove for m in leaves]

        variants.append(Variant(f"{fw.name} plain", unhooked(step, clear)))
        if fw.native("full_backward"):

            def native(fw: Framework = fw, leaves: list[Any] = leaves) -> list[Remover]:
                return [fw.native_hook(m, "full_backward", noop_backward) for m in leaves]

            variants.append(Variant(f"{fw.name} native", hooked(step, native, clear)))
        variants.append(Variant(f"{fw.name} unihook", hooked(step, ours, clear)))
    names = {v.name for v in variants}
    metrics = [
        ratio("torch native", "torch plain"),
        ratio("torch unihook", "torch plain"),
        ratio("torch unihook", "torch native", SAME_AS_HANDWRITTEN if targets else None),
    ]
    for p in ("paddle", "mindspore"):  # no native full backward hook to compare with
        metrics += [
            ratio(f"{p} unihook", f"{p} plain"),
            _overhead_vs(
                f"{p} unihook",
                f"{p} plain",
                "torch native",
                "torch plain",
                NO_WORSE if targets else None,
            ),
        ]
    return Case(
        f"backward/{label}",
        f"{label} forward+backward (train), no-op full backward hook on every leaf module",
        "ms",
        1e3,
        variants,
        [m for m in metrics if m.needs <= names],
        "loss = output.sum(); gradients cleared (untimed) after each sample; mindspore: "
        "value_and_grad of the loss with respect to the weights (its training idiom)",
    )


def _overhead_vs(
    ours: str, our_base: str, theirs: str, their_base: str, target: Target | None
) -> Metric:
    """(ours / our_base) / (theirs / their_base): one framework's overhead against another's."""
    return Metric(
        f"({ours} / {our_base}) / ({theirs} / {their_base})",
        lambda t: (t[ours] / t[our_base]) / (t[theirs] / t[their_base]),
        "x",
        target,
        {ours, our_base, theirs, their_base},
    )


# -- 2c. tensor gradient hooks on every activation of an MLP --


def _activations(fw: Framework, model: Any, x: Any) -> list[Any]:
    acts = []
    for layer in fw.children(model):
        x = layer(x)
        acts.append(x)
    return acts


def tensor_hooks(fws: list[Framework], sizes: Sizes, register_in_timed: bool) -> Case:
    """No-op gradient hooks on every Linear and ReLU output. `register_in_timed`: the sample is
    forward + registration + backward (tensor hooks are per forward by nature); else the
    forward and registration are untimed and the sample is the backward alone, which only the
    imperative frameworks have (MindSpore records the forward inside its `value_and_grad`)."""
    variants: list[Variant] = []
    metrics: list[Metric] = []
    skipped = [fw.name for fw in fws if not register_in_timed and not hasattr(fw, "backward")]
    for fw in fws:
        if fw.name in skipped:
            continue
        fw.seed(0)
        model, x = models.mlp(fw, sizes), models.mlp_input(fw, sizes)
        registrations: dict[str, Callable[[Any], Remover] | None] = {
            "plain": None,
            "native": lambda t, fw=fw: fw.native_hook(t, "tensor", noop_grad),
            "unihook": lambda t: unihook.register_tensor_hook(t, noop_grad).remove,
        }
        for kind, register in registrations.items():
            make = _fwd_reg_bwd if register_in_timed else _bwd_only
            variants.append(Variant(f"{fw.name} {kind}", make(fw, model, x, register)))
        p = fw.name
        metrics += [
            ratio(f"{p} native", f"{p} plain"),
            ratio(f"{p} unihook", f"{p} plain"),
            ratio(f"{p} unihook", f"{p} native"),
        ]
    scope = "forward+register+backward" if register_in_timed else "backward (registered untimed)"
    skip = f"not run on {', '.join(skipped)}: functional autograd, no backward alone"
    return Case(
        f"tensor_hooks/{'fwd_bwd' if register_in_timed else 'bwd'}",
        f"MLP {sizes.mlp_depth}x(Linear({sizes.mlp_width})+ReLU), batch {sizes.mlp_batch}: "
        f"no-op grad hook on every activation, timed {scope}",
        "ms",
        1e3,
        variants,
        metrics,
        skip if skipped else "",
    )


def _fwd_reg_bwd(
    fw: Framework, model: Any, x: Any, register: Callable[[Any], Remover] | None
) -> Setup:
    removers: list[Remover] = []

    def forward() -> Any:
        acts = _activations(fw, model, x)
        if register is not None:
            removers.extend(register(a) for a in acts)
        return acts[-1]

    body = fw.train_step(model, forward)

    def cleanup() -> None:
        for remove in removers:
            remove()
        removers.clear()
        fw.clear_grads(model)

    return lambda: (body, cleanup)


def _bwd_only(
    fw: Framework, model: Any, x: Any, register: Callable[[Any], Remover] | None
) -> Setup:
    def setup() -> tuple[Body, Cleanup]:
        acts = _activations(fw, model, x)
        removers = [register(a) for a in acts] if register is not None else []
        out = acts[-1]

        def cleanup() -> None:
            for remove in removers:
                remove()
            fw.clear_grads(model)

        return (lambda: fw.backward(out)), cleanup  # type: ignore[union-attr]

    return setup


# -- 3. recipes in a training loop: forward + backward + SGD step on the CNN --


class _Removed:
    """Native hooks as a recipe: `remove()` removes them all (`recipes`' floors)."""

    def __init__(self, removers: list[Remover]) -> None:
        self.removers = removers

    def remove(self) -> None:
        for remove in self.removers:
            remove()


STATS_TARGET = Target(1.10, "<= 1.10x")
MONITOR_TARGET = Target(1.05, "<= 1.05x")
OFF_STEP_TARGET = Target(1.01, "<= 1.01x")
EVERY = 10


def _floor(fw: Framework, model: Any, kind: str) -> Callable[[], list[Remover]]:
    """The recipes' arithmetic alone, in native hooks on every module: `unihook.ops.moments`
    of each output ("stats"), or `unihook.ops.sum_squares` of each output's gradient, in a
    tensor hook each forward hook places ("monitor"). What a recipe can cost at least,
    whatever its bookkeeping: the floor its target is measured against."""
    from unihook import ops

    def moments(module: Any, args: Any, output: Any) -> None:
        if ops.is_tensor(output):
            ops.moments(ops.detach(output))

    def squares(grad: Any) -> None:
        ops.sum_squares(grad)

    def gradient(module: Any, args: Any, output: Any) -> None:
        if ops.is_tensor(output):
            ops.on_grad(output, squares)  # (the framework's own tensor hook)

    hook = moments if kind == "stats" else gradient
    return lambda: [fw.native_hook(m, "forward", hook) for _, m in fw.named_modules(model)]


def recipes(fws: list[Framework], sizes: Sizes) -> Case:
    """ActivationStats and GradientMonitor on every module of the CNN against the bare step,
    logging every step, and on the steps `every=10` skips. Each sample creates the recipe and
    runs one untimed step (the logged forward 0) first: the timed step is a steady-state logged
    step (every=1) or an off-step (every=10); `plain` also runs its untimed step first. The
    floors (`_floor`, where the framework has native tensor hooks) time the same arithmetic in
    native hooks, without the recipes' bookkeeping."""
    from unihook.recipes import ActivationStats, GradientMonitor

    variants: list[Variant] = []
    metrics: list[Metric] = []
    for fw in fws:
        fw.seed(0)
        model, x = models.cnn(fw, sizes), models.cnn_input(fw, sizes)
        fw.set_training(model, True)
        step = fw.train_step(model, model, x, lr=1e-4)

        def clear(fw: Framework = fw, model: Any = model) -> None:
            fw.clear_grads(model)

        def with_recipe(
            make: Callable[[], Any] | None, step: Body = step, clear: Cleanup = clear
        ) -> Setup:
            def setup() -> tuple[Body, Cleanup]:
                recipe = make() if make is not None else None
                step()  # every variant, plain too, times a step right after an untimed one
                clear()

                def cleanup() -> None:
                    if recipe is not None:
                        recipe.remove()
                    clear()

                return step, cleanup

            return setup

        p = fw.name
        if fw.name != "mindspore":  # (MindSpore's autograd is functional: no backward here)
            for kind in ("stats", "monitor"):
                place = _floor(fw, model, kind)

                def floor(place: Callable[[], list[Remover]] = place) -> Any:
                    removers = place()
                    return _Removed(removers)

                variants.append(Variant(f"{p} {kind} floor", with_recipe(floor)))
                metrics.append(ratio(f"{p} {kind} floor", f"{p} plain"))
        variants += [
            Variant(f"{p} plain", with_recipe(None)),
            Variant(f"{p} stats", with_recipe(lambda m=model: ActivationStats(m))),
            Variant(f"{p} monitor", with_recipe(lambda m=model: GradientMonitor(m))),
            Variant(
                f"{p} stats off-step",
                with_recipe(lambda m=model: ActivationStats(m, every=EVERY)),
            ),
            Variant(
                f"{p} monitor off-step",
                with_recipe(lambda m=model: GradientMonitor(m, every=EVERY)),
            ),
        ]
        metrics += [
            ratio(f"{p} stats", f"{p} plain", STATS_TARGET),
            ratio(f"{p} monitor", f"{p} plain", MONITOR_TARGET),
            ratio(f"{p} stats off-step", f"{p} plain", OFF_STEP_TARGET),
            ratio(f"{p} monitor off-step", f"{p} plain", OFF_STEP_TARGET),
        ]
    n_modules = len(fws[0].named_modules(models.cnn(fws[0], sizes))) if fws else 0
    return Case(
        "recipes/cnn",
        f"cnn training step (forward + backward + SGD), recipes on all {n_modules} modules",
        "ms",
        1e3,
        variants,
        metrics,
        "loss = mean(output ** 2), SGD lr 1e-4; the recipe is created (untimed) and one untimed "
        f"step runs before the timed one; off-step: every={EVERY}, the timed step is not recorded; "
        "mindspore: value_and_grad with respect to the weights, then nn.SGD",
    )
