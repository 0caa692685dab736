"""A BaseException (a Ctrl-C) cut a hooked call short: frameworks run no always-call hook for
it, so the call's per-thread entries of unihook's backward dispatchers stay behind, keyed by
the id of the call's arguments. The next call's arguments may get that id once the dead ones
are freed (CPython reuses addresses at once): the entries must not be taken for the running
call's. A global forward pre-hook, which runs before the dispatchers, gives the stale entries
the running call's id here: the address reuse that otherwise comes by chance."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import unihook
from unihook._module_backward import _globals, _states
from unihook.conformance import kit

FRAMEWORKS = ["torch", "paddle"]


def _model(fw: str) -> Any:
    if fw == "torch":
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2)
        )
    import paddle

    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 2))


def _input(fw: str, requires_grad: bool) -> Any:
    if fw == "torch":
        import torch

        return torch.arange(6.0).reshape(2, 3).requires_grad_(requires_grad) / 7
    import paddle

    x = paddle.arange(6, dtype="float32").reshape([2, 3]) / 7
    x.stop_gradient = not requires_grad
    return x


def _stale_entries_take_the_id(model: Any, args: tuple[Any, ...]) -> None:
    """Give every entry left for `model` the id of `args` (the running call's)."""
    states = [_globals[name] for name in FRAMEWORKS if name in _globals]
    own = _states.get(model)
    states += [] if own is None else [own]
    for state in states:
        stack = getattr(state.local, "stack", None) or []
        for k, (_, ref, call, frame) in enumerate(stack):
            if ref() is model:
                stack[k] = (id(args), ref, call, frame)


def _calls(fw: str, cut: bool, input_grad: bool) -> Counter[tuple[str, str]]:
    model = _model(fw)
    named = list(
        model.named_modules() if fw == "torch" else model.named_sublayers(include_self=True)
    )
    names = {id(m): name or "model" for name, m in named}
    first = named[1][1]
    calls: Counter[tuple[str, str]] = Counter()
    handles = []
    for _, m in named:  # own hooks first: their dispatchers come first in the module's dicts
        handles.append(unihook.register_forward_pre_hook(m, lambda m, args: None))
        handles.append(
            unihook.register_full_backward_pre_hook(
                m, lambda m, go: calls.update([("own pre", names[id(m)])])
            )
        )
    handles += [
        unihook.register_module_full_backward_hook(
            lambda m, gi, go: calls.update([("global", names[id(m)])]), backend=fw
        ),
        unihook.register_module_full_backward_pre_hook(
            lambda m, go: calls.update([("global pre", names[id(m)])]), backend=fw
        ),
    ]
    armed = [cut]

    def pre_hook(module: Any, args: tuple[Any, ...]) -> None:
        if module is first and armed[0]:
            armed[0] = False
            raise KeyboardInterrupt("cut short")
        if module is model and fw == "paddle":
            _stale_entries_take_the_id(model, args)

    handles.append(unihook.register_module_forward_pre_hook(pre_hook, backend=fw))
    if fw == "torch":  # (torch's hook loop gets another args tuple than its global pre-hooks)
        native = model.register_forward_pre_hook(_stale_entries_take_the_id, prepend=True)
        handles.append(unihook.Handle("torch", "forward_pre", native.remove))
    try:
        if cut:
            try:
                model(_input(fw, input_grad)).sum().backward()
            except KeyboardInterrupt:
                pass
            assert not armed[0]
        calls.clear()
        model(_input(fw, input_grad)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return calls


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("input_grad", [True, False], ids=["input_grad", "data"])
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_call_after_a_cut_one_fires_every_backward_hook_once(fw: str, input_grad: bool) -> None:
    """Every module and global backward hook fires once per module, as in a model whose first
    call was not cut (the outer module's global hooks did not fire: its own dispatchers and
    the global ones each took a stale entry for the other's claim on the call)."""
    pytest.importorskip(fw)
    expected = _calls(fw, cut=False, input_grad=input_grad)
    assert set(expected.values()) == {1} and len(expected) == 12
    assert _calls(fw, cut=True, input_grad=input_grad) == expected


def _keyword_only_calls(fw: str, cut: bool) -> list[str]:
    """The hook calls of one backward through a module called with keyword arguments only
    (its args are `()`, one object, each call), after a call of it a KeyboardInterrupt cut."""
    if fw == "torch":
        import torch

        base: Any = torch.nn.Module
        linear = torch.nn.Linear(2, 2)
    else:
        import paddle

        base = paddle.nn.Layer
        linear = paddle.nn.Linear(2, 2)

    class KeywordOnly(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = linear
            self.cut = cut

        def forward(self, x: Any = None) -> Any:
            if self.cut:
                self.cut = False
                raise KeyboardInterrupt("cut short")
            return self.lin(x)

    model = KeywordOnly()
    calls: list[str] = []
    handles = [
        unihook.register_full_backward_hook(model, lambda *args: calls.append("own")),
        unihook.register_full_backward_pre_hook(model, lambda *args: calls.append("own pre")),
        unihook.register_module_full_backward_hook(
            lambda m, gi, go: calls.append(f"global {type(m).__name__}"), backend=fw
        ),
    ]
    try:
        if cut:
            with pytest.raises(KeyboardInterrupt):
                model(x=_input(fw, True)[:, :2])
        model(x=_input(fw, True)[:, :2]).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return calls


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_a_keyword_only_call_after_a_cut_one_fires_every_backward_hook_once(fw: str) -> None:
    """Its args are the cut call's (`()`) and hold no tensor: only the entry's own record of its
    call tells them apart (own and global hooks fired twice: the global post-dispatcher ended
    the stale call of the module's own dispatchers too)."""
    pytest.importorskip(fw)
    expected = _keyword_only_calls(fw, cut=False)
    assert sorted(expected) == ["global KeywordOnly", "global Linear", "own", "own pre"]
    assert _keyword_only_calls(fw, cut=True) == expected


def _removed_inside_a_call(fw: str, kind: str) -> tuple[Any, Any]:
    """A module with one backward hook (its own, or a global one): a call cut short by a
    KeyboardInterrupt, then a call whose forward removes that last hook. Returns the module
    and a weak reference to the dispatchers' state, if one was left."""
    import weakref

    if fw == "torch":
        import torch

        base: Any = torch.nn.Module
        linear = torch.nn.Linear(3, 2)
    else:
        import paddle

        base = paddle.nn.Layer
        linear = paddle.nn.Linear(3, 2)
    handles: list[Any] = []

    class Cut(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = linear
            self.cut = True

        def forward(self, x: Any) -> Any:
            if self.cut:
                self.cut = False
                raise KeyboardInterrupt("cut short")
            for handle in handles:
                handle.remove()  # the last hook, inside the call
            return self.lin(x)

    model = Cut()
    if kind == "own":
        handles.append(unihook.register_full_backward_hook(model, lambda *args: None))
        state = weakref.ref(_states[model])
    else:
        handles.append(unihook.register_module_full_backward_hook(lambda *args: None, backend=fw))
        state = weakref.ref(_globals[fw])
    with pytest.raises(KeyboardInterrupt):
        model(_input(fw, True))
    model(_input(fw, True)).sum().backward()
    return model, state


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["own", "global"])
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_last_hook_removed_inside_a_call_after_a_cut_one_leaves_nothing(
    fw: str, kind: str
) -> None:
    """The cut call's entry stays on the thread; the later call, whose forward removes the
    last hook, ends with the dispatchers taken out all the same (they stayed for good, and
    paddle's patch of every layer's call with them: the entry was dropped only at a removal
    made outside any module call)."""
    import gc

    pytest.importorskip(fw)
    native = kit(fw).native_state()
    model, state = _removed_inside_a_call(fw, kind)
    gc.collect()
    assert state() is None or state().dispatchers is None
    assert kit(fw).native_state() == native
    assert all(not hooks for hooks in kit(fw).hook_dicts(model).values())


def _cut_inner_call_run(native: bool) -> tuple[list[tuple[float, float]], float]:
    """A module calls itself; a BaseException cuts the inner call short and forward catches
    it; torch's own full backward hook sits beside (its BackwardHook replaces the args, so
    the outer call's entry is found by module, past the cut inner call's)."""
    import torch

    class Stop(BaseException):
        pass

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([2.0]))

        def forward(self, x: Any, depth: int = 0) -> Any:
            if depth == 1:
                raise Stop()
            try:
                self(x * 3, 1)
            except Stop:
                pass
            return x * self.w

    model = Net()
    log: list[tuple[float, float]] = []

    def hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        log.append((grad_input[0].item(), grad_output[0].item()))

    model.register_full_backward_hook(lambda *a: None)
    if native:
        model.register_full_backward_hook(hook)
    else:
        unihook.register_full_backward_hook(model, hook)
    x = torch.ones(1, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None
    return log, x.grad.item()


def test_a_call_cut_inside_its_outer_one_beside_a_native_hook_leaves_the_outer_one_whole() -> None:
    pytest.importorskip("torch")
    assert _cut_inner_call_run(False) == _cut_inner_call_run(True) == ([(2.0, 1.0)], 2.0)
