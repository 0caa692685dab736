"""A module that keeps the input forward got and returns it (a feature tap), inputs returned
unchanged, kept leaves, and what refusals keep, on paddle and MindSpore: helper-54's attack on
c7771a0 (every test failed there). Oracle: the same program without hooks (for the leaks,
8e424c3's). The limits README names are strict xfails."""

from __future__ import annotations

import gc
from typing import Any

import pytest

import unihook

# ---------------------------------------------------------------- paddle


def _paddle_run(program: Any, hooked: bool) -> Any:
    try:
        return program(hooked)
    except unihook.InPlaceError:
        return "InPlaceError"
    except ValueError as e:
        return "ValueError: " + str(e)[:40]


class _Handles:
    def __init__(self) -> None:
        self.hs: list[Any] = []

    def __enter__(self) -> "_Handles":
        return self

    def __exit__(self, *a: Any) -> None:
        for h in self.hs:
            h.remove()


def _keep_and_return() -> Any:
    paddle = pytest.importorskip("paddle")

    class Tap(paddle.nn.Layer):  # a feature tap: keeps what it saw, passes it on
        def forward(self, h: Any) -> Any:
            self.kept = h
            return h

    return Tap


@pytest.mark.parametrize("hook", ["full", "global"])
def test_paddle_tap_kept_changed_in_place_then_output_read(hook: str) -> None:
    # A silent wrong gradient on c7771a0 (not in the documented list): a layer that keeps its
    # input AND returns it (`self.kept = h; return h`). Without hooks h, m.kept and out are
    # one tensor; the caller scales m.kept in place and reads out. Native x.grad =
    # [-40.5, 81, -121.5, 162]; hooked (full, global) [-13.5, 27, -40.5, 54]: the output
    # alias's history misses the kept alias's in-place op, and nothing checks it
    # (check_kept_input puts checks on the kept alias and the caller's h, not on the output).
    # (a pre hook alone refuses it: InPlaceError is accepted here too.)
    import paddle

    Tap = _keep_and_return()

    def program(hooked: bool) -> Any:
        m = Tap()
        with _Handles() as hd:
            if hooked:
                if hook == "full":
                    hd.hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
                elif hook == "global":
                    hd.hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
                else:
                    hd.hs.append(unihook.register_full_backward_pre_hook(m, lambda *a: None))
            x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]], stop_gradient=False)
            h = x * 1.5  # (the caller's tensor alive: with `m(x * 1.5)` it passes)
            out = m(h)
            m.kept.scale_(3.0)
            (out * out).sum().backward()
            return x.grad.numpy().tolist()

    native, hooked = _paddle_run(program, False), _paddle_run(program, True)
    assert native == [[-40.5, 81.0, -121.5, 162.0]]
    assert hooked in (native, "InPlaceError")


_INPUT_READ_LIMIT = pytest.mark.xfail(
    strict=True,
    reason="known limit, README 'On paddle': the input read after an in-place op on the output "
    "(pre-hooks alone: the module keeps the caller's own tensor)",
)


@pytest.mark.parametrize("hook", ["full", "global", pytest.param("pre", marks=_INPUT_READ_LIMIT)])
def test_paddle_tap_output_changed_in_place_then_kept_read(hook: str) -> None:
    # A silent wrong gradient on c7771a0: the same tap; the caller scales the OUTPUT in place
    # and then reads m.kept (one tensor without hooks). Native [-40.5, 81, -121.5, 162];
    # hooked [-13.5, 27, -40.5, 54] for every hook kind. (The documented paddle limit is the
    # caller's own tensor read after an in-place op on the output; this is the kept alias.)
    import paddle

    Tap = _keep_and_return()

    def program(hooked: bool) -> Any:
        m = Tap()
        with _Handles() as hd:
            if hooked:
                if hook == "full":
                    hd.hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
                elif hook == "global":
                    hd.hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
                else:
                    hd.hs.append(unihook.register_full_backward_pre_hook(m, lambda *a: None))
            x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]], stop_gradient=False)
            h = x * 1.5  # (the caller's tensor alive: with `m(x * 1.5)` it passes)
            out = m(h)
            out.scale_(3.0)
            (m.kept * m.kept).sum().backward()
            return x.grad.numpy().tolist()

    native, hooked = _paddle_run(program, False), _paddle_run(program, True)
    assert native == [[-40.5, 81.0, -121.5, 162.0]]
    assert hooked in (native, "InPlaceError")


def test_paddle_tap_in_sequential_global_hook_kept_changed_then_output_read() -> None:
    # A silent wrong gradient on c7771a0: Sequential(Double, Tap) with a global hook
    # (Sequential, Double and Tap all hooked); m.kept scaled in place, the Sequential's
    # output read. Native [-162, 324, -486, 648]; hooked [-54, 108, -162, 216].
    import paddle

    Tap = _keep_and_return()

    class Double(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            return h * 2

    def program(hooked: bool) -> Any:
        tap = Tap()
        net = paddle.nn.Sequential(Double(), tap)
        with _Handles() as hd:
            if hooked:
                hd.hs.append(unihook.register_module_full_backward_hook(lambda *a: None))
            x = paddle.to_tensor([[-1.0, 2.0, -3.0, 4.0]], stop_gradient=False)
            h = x * 1.5
            out = net(h)
            tap.kept.scale_(3.0)
            (out * out).sum().backward()
            return x.grad.numpy().tolist()

    native, hooked = _paddle_run(program, False), _paddle_run(program, True)
    assert native == [[-162.0, 324.0, -486.0, 648.0]]
    assert hooked in (native, "InPlaceError")


@pytest.mark.xfail(
    strict=True, reason="known limit, README: a kept leaf changed in place, the leaf read"
)
def test_paddle_kept_alias_of_a_leaf_changed_in_place_then_the_leaf_read() -> None:
    # Accepted on c7771a0 what paddle refuses (README: "what the framework rejects without
    # hooks it rejects with them"): the caller passes a leaf, the layer keeps it, the caller
    # relu_s m.kept and reads only the leaf (not the kept alias, so the new leaf check never
    # runs). Native: ValueError "Leaf Var ... can't use inplace strategy"; hooked: the leaf's
    # values silently become relu(x) and backward gives [2, 6, 2, 10], the grads of a program
    # where relu_ had no history.
    import paddle

    class Keep(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            self.kept = h
            return h * 2

    def program(hooked: bool) -> Any:
        m = Keep()
        with _Handles() as hd:
            if hooked:
                hd.hs.append(unihook.register_full_backward_hook(m, lambda *a: None))
            x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
            out = m(x)
            paddle.nn.functional.relu_(m.kept)
            (out.sum() + (x * x).sum()).backward()
            return x.grad.numpy().tolist()

    native, hooked = _paddle_run(program, False), _paddle_run(program, True)
    assert native.startswith("ValueError")
    assert hooked == "InPlaceError" or str(hooked).startswith("ValueError")


@pytest.mark.parametrize("kind", ["identity", "keep"])
def test_paddle_refused_backward_keeps_nothing_alive(kind: str) -> None:
    # Leak on c7771a0: each backward that `check_returned_input` / `check_kept_input`
    # refuses (InPlaceError raised inside the identity node's backward) keeps the call's
    # graph alive: one _UnihookIdentity_backward, a dict, a method, weakrefs, and the
    # tensors (200 refused steps on 1000x1000 inputs: maxrss +810 MB). A training loop that
    # catches the error grows without bound. The graph must go with the error. (A strict
    # xfail until 2026-12-07, paddle keeping what a raising PyLayer backward was called
    # through and given: now given back, `_kept_by_paddle`.)
    import paddle

    class Ident(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            return h

    class Keep(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            self.kept = h
            return h * 2

    m = Ident() if kind == "identity" else Keep()
    hd = unihook.register_full_backward_hook(m, lambda *a: None)

    def step() -> None:
        x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
        h = x * 1.5
        out = m(h)
        h.scale_(2.0)
        loss = out.sum() if kind == "identity" else out.sum() + (m.kept * 2).sum()
        with pytest.raises(unihook.InPlaceError):
            loss.backward()

    def nodes() -> int:
        gc.collect()
        return sum(type(o).__name__ == "_UnihookIdentity_backward" for o in gc.get_objects())

    try:
        for _ in range(3):
            step()
        before = nodes()
        for _ in range(50):
            step()
        assert nodes() - before < 5
    finally:
        hd.remove()


@pytest.mark.xfail(
    strict=True,
    reason="known limit, README 'On paddle': the caller's tensor and the output both gone",
)
def test_paddle_returned_input_then_inplace_op_on_a_tensor_gone_before_the_backward() -> None:
    """The conformance case (`out = ident(h); relu_(h)`, then `out` read) inside a function
    that drops both `h` and `out` before the backward: the output node's check cannot tell
    whether the shared counter moved through `h` or through `out` (found in the pre-stop
    review): x.grad [1, 2, 3, 4] for [0, 2, 0, 4]."""
    paddle = pytest.importorskip("paddle")

    class Ident(paddle.nn.Layer):
        def forward(self, h: Any) -> Any:
            return h

    def loss(m: Any, x: Any) -> Any:
        h = x * 1
        out = m(h)
        paddle.nn.functional.relu_(h)
        return (out * paddle.to_tensor([1.0, 2.0, 3.0, 4.0])).sum()

    def grad(hooked: bool) -> Any:
        m = Ident()
        if hooked:
            unihook.register_full_backward_hook(m, lambda *a: None)
        x = paddle.to_tensor([-1.0, 2.0, -3.0, 4.0], stop_gradient=False)
        try:
            loss(m, x).backward()
        except unihook.InPlaceError:
            return "InPlaceError"
        return x.grad.tolist()

    assert grad(False) == [0.0, 2.0, 0.0, 4.0]
    assert grad(True) in ([0.0, 2.0, 0.0, 4.0], "InPlaceError")
