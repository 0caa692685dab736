"""``torch.jit.script`` of modules with unihook hooks (helper-178's FINDING 4).

torch scripts a module's forward hooks from their source, taking each one's ``__name__``
first, and the module it makes runs no Python hook (its own backward hooks are dropped,
silently). unihook's backward-hook dispatchers, a capture's hooks, the wrappers of with_kwargs
hooks and of a pre-hook registered during a call have no source: torch failed on them with
"'EagerUnderCompile' object has no attribute '__name__'". Each but the with_kwargs wrappers
(plain partials: torch's AttributeError still, see README) now raises `ScriptedHookError` (a
RuntimeError, torch's type for a hook it cannot script) naming the hook; a plain forward hook
of unihook's is the user's function, scripted as torch's own, and once unihook's hooks are
removed the module scripts as it did.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import unihook  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


def _model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _any(*args: Any, **kwargs: Any) -> None:
    return None


def _register(kind: str, model: Any) -> Iterator[Any]:
    """The handles of `kind` on `model` (`kind` is what the message names on its first line)."""
    target = model[2]
    if kind == "full_backward":
        yield unihook.register_full_backward_hook(target, _any)
    elif kind == "full_backward_pre":
        yield unihook.register_full_backward_pre_hook(target, _any)
    elif kind == "beside_native":
        target.register_full_backward_hook(_any)
        yield unihook.register_full_backward_hook(target, _any)
    elif kind in ("capture", "capture_grads"):
        yield unihook.capture(model, grads=kind == "capture_grads")


_NAMED = {
    "full_backward": "full_backward hook on Linear",
    "full_backward_pre": "full_backward_pre hook on Linear",
    "beside_native": "full_backward hook on Linear",
    "capture": "forward hook on Sequential",
    "capture_grads": "forward hook on Sequential",
}


@pytest.mark.parametrize("kind", list(_NAMED))
def test_a_module_with_unihook_hooks_is_refused_by_name(kind: str) -> None:
    model = _model()
    handles = list(_register(kind, model))
    with pytest.raises(unihook.ScriptedHookError, match=r"jit\.script") as caught:
        torch.jit.script(model)
    assert isinstance(caught.value, RuntimeError)
    assert isinstance(caught.value, unihook.UnsupportedHookError)
    assert f"{_NAMED[kind]} [backend torch]" in str(caught.value)
    # no made-up name anywhere else: hasattr stays False, as for any object without one
    placed = [*model[2]._forward_hooks.values(), *model[2]._forward_pre_hooks.values()]
    placed += [*model._forward_hooks.values()]
    assert not any(hasattr(hook, "__name__") for hook in placed if hook is not _any)
    for handle in handles:
        handle.remove()
    x = torch.randn(2, 3)
    assert torch.equal(torch.jit.script(model)(x), model(x))


def test_the_hooks_still_run_on_the_original_after_a_refusal() -> None:
    model, reference = _model(), _model()
    calls: list[Any] = []
    seen: list[Any] = []
    unihook.register_full_backward_hook(model[2], lambda m, gi, go: calls.append(go[0].clone()))
    reference[2].register_full_backward_hook(lambda m, gi, go: seen.append(go[0].clone()))
    with pytest.raises(unihook.ScriptedHookError):
        torch.jit.script(model)
    x = torch.randn(2, 3)
    model(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    assert len(calls) == len(seen) == 1 and torch.equal(calls[0], seen[0])


def test_a_plain_unihook_forward_hook_is_scripted_as_torchs_own() -> None:
    def double(module: Any, args: tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
        return output * 2

    model, reference = _model(), _model()
    unihook.register_forward_hook(model[2], double)
    reference[2].register_forward_hook(double)
    x = torch.randn(2, 3)
    assert torch.equal(torch.jit.script(model)(x), torch.jit.script(reference)(x))


def test_a_pre_hook_unihook_kept_out_of_a_running_call_is_refused() -> None:
    # a global forward pre-hook registering a module pre-hook: torch keeps it out of the call
    # that runs, unihook in a wrapper (`module._forward_pre_hooks[id]` is not the hook)
    model = _model()
    added: list[Any] = []

    def register_once(module: Any, args: Any) -> None:
        if module is model[2] and not added:
            added.append(model[2].register_forward_pre_hook(_any))

    handle = unihook.register_module_forward_pre_hook(register_once)
    model(torch.randn(2, 3))
    handle.remove()
    assert added and next(iter(model[2]._forward_pre_hooks.values())) is not _any
    with pytest.raises(unihook.ScriptedHookError, match="forward_pre hook on Linear"):
        torch.jit.script(model)
    added[0].remove()
    assert isinstance(torch.jit.script(model), torch.jit.ScriptModule)


def test_an_error_of_the_users_own_forward_hook_stays_torchs() -> None:
    # torch's own refusal of a hook it cannot script (no return annotation) is untouched
    def pre(module: Any, args: tuple[torch.Tensor]):  # type: ignore[no-untyped-def]
        return None

    model = _model()
    unihook.register_forward_pre_hook(model[2], pre)
    with pytest.raises(RuntimeError, match="return annotation") as caught:
        torch.jit.script(model)
    assert not isinstance(caught.value, unihook.UnihookError)


class _ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def test_dispatchers_a_fusion_carried_over_go_and_the_next_script_works() -> None:
    """fuse_modules carries the BatchNorm's forward hooks, unihook's dispatchers among them,
    to the fused conv, where they do nothing and go at its first call. Scripted before it, the
    refusal says so and takes them out (helper-168's FINDING 3: after the hook's removal, the
    fused model never scripted: torch's AttributeError)."""
    from torch.ao.quantization import fuse_modules

    model = _ConvBnRelu().eval()
    handle = unihook.register_full_backward_hook(model.bn, _any)
    fused = fuse_modules(model, [["conv", "bn"]], inplace=True)
    handle.remove()
    assert list(fused.conv._forward_hooks.values())  # (the carried dispatcher)
    with pytest.raises(unihook.ScriptedHookError, match="taken out now") as caught:
        torch.jit.script(fused)
    assert "hook on Conv2d [backend torch]" in str(caught.value)  # (the fused one)
    assert not fused.conv._forward_hooks
    x = torch.randn(1, 2, 5, 5)
    assert torch.equal(torch.jit.script(fused)(x), fused(x))


@pytest.mark.parametrize("fused_names", [["conv", "bn"], ["conv", "bn", "relu"]])
def test_a_fusion_of_hooked_modules_is_refused_for_its_copied_hooks_once_carried_ones_went(
    fused_names: list[str],
) -> None:
    """fuse_modules deep-copies the conv (its hooks copied, as torch copies its own: live,
    reached by no handle) and carries the other modules' forward hooks to the fused one,
    unihook's dispatchers among them: inert there, placeholders where unihook holds the dict.
    The refusals take those out, all of a module's at once, and then name the copied hooks
    (until 2026-12-07 the placeholders stayed for good, torch failed on them with
    "'_Carried' object has no attribute '__name__'", and each refusal dropped one state's
    dispatchers: helper-180's FINDING 1)."""
    from torch.ao.quantization import fuse_modules

    model = _ConvBnRelu().eval()
    handles = [
        unihook.register_full_backward_hook(module, _any)
        for module in (model.conv, model.bn, model.relu)
    ]
    fused = fuse_modules(model, [fused_names], inplace=True)
    for handle in handles:
        handle.remove()
    said = []
    for _ in range(4):
        with pytest.raises(unihook.ScriptedHookError) as caught:
            torch.jit.script(fused)
        said.append(str(caught.value))
    assert sum("taken out now" in message for message in said) <= len(fused_names) - 1
    assert "deep-copied from a hooked one" in said[-1] and "deep-copied" in said[-2]
    for module in fused.modules():
        placed = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
        assert "_Carried" not in {type(hook).__name__ for hook in placed}


@pytest.mark.parametrize("prepend", [False, True])
def test_a_library_carrying_dispatchers_keeps_its_handles_and_reads(prepend: bool) -> None:
    """A library registering another module's hooks on `b` (``register_forward_hook(h,
    prepend=...)``, as fuse_modules) gets its handle and reads back what it put (a first
    version left carried dispatchers out: ``move_to_end`` raised KeyError, helper-181's
    FINDING 1); a refusal takes the placeholders out, the library's handle then removes
    nothing else, and b scripts once its own hook is removed."""
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    calls: list[str] = []
    unihook.register_full_backward_hook(a, lambda m, gi, go: calls.append("a"))
    own = unihook.register_full_backward_hook(b, lambda m, gi, go: calls.append("b"))
    carried = []
    for hook in list(a._forward_hooks.values()):
        carried.append(b.register_forward_hook(hook, prepend=prepend))
        assert b._forward_hooks[carried[-1].id] is not None
    with pytest.raises(unihook.ScriptedHookError):
        torch.jit.script(b)
    for handle in carried:
        handle.remove()
    x = torch.ones(1, 2, requires_grad=True)
    b(a(x)).sum().backward()
    assert calls == ["b", "a"]
    own.remove()
    assert torch.equal(torch.jit.script(b)(x), b(x))


def test_a_deep_copy_made_in_a_captures_scope_is_refused_for_its_inert_hooks() -> None:
    """README "Compilers": a deep copy made while a capture records (an EMA, AveragedModel)
    keeps the capture's hooks inert, and torch.jit.script refuses it by name."""
    import copy

    model = _model()
    with unihook.capture(model):
        twin = copy.deepcopy(model)
    with pytest.raises(unihook.ScriptedHookError, match="a capture's hooks"):
        torch.jit.script(twin)
    x = torch.randn(2, 3)
    assert torch.equal(torch.jit.script(model)(x), model(x))  # (the original has none left)
