"""helper-77's attack on d7138d7 / 6c049af / edef0ac: GradientMonitor leaving out an EARLIER
call of the forward whose output tensor a later call returns again (`_unhook_earlier`), and a
call returning a tensor made before it (`ops.history_mark` / `ops.made_before`).

Oracle: torch's native ``register_full_backward_pre_hook`` on a deep copy of the model, the
square root of the sum of squares of its grad_output. The promise: a module's entry equals
that norm (rel 1e-5), or the module is absent from the step with the RuntimeWarning naming
it; never a silently wrong number.

HELD (pinned below):

- A memoising module (``if self.cache is None: self.cache = self.fc(x) * 1.0; return
  self.cache``) called 1, 2 or 3 times in one forward, plain, wrapped in a container
  (``nn.Sequential(memo)``: the container shares the child's `names`) or in a parent that
  returns the last call, with several loss weightings: every entry is the native norm or
  absent with a warning naming the module (the third call finds the list already cleared:
  no crash, no number).
- A kept state read back by a later module call (``r.forward: return k.out``): both `k` and
  `r` are left out, with warnings naming them; also a state returned again by two later
  modules (the third finding the list cleared), by a module inside a sibling container
  (``nn.Sequential(nn.Identity(), reader)``), by a module called inside the keeper's
  parent: native norm or left out with the warning for every module.
- Two monitors on one model (one with ``where=`` over the memo and its Linear), and
  ``every=2`` over four steps: each leaves the memo out and records its Linear (native).
- Clearing `names` breaks nothing: ``on_nonfinite="raise"`` still raises on a NaN reaching a
  module recorded beside a cleared hook; a NaN reaching only the cleared hook raises nothing
  (its modules are left out); two backwards with ``retain_graph`` keep the leave-out.
- Ordinary models lose nothing (every module recorded, equal to the native norm): a shared
  block applied twice with fresh outputs, a residual CNN with in-place ReLU, an LSTM, a
  TransformerEncoder layer, weight-tied embedding / head (no "made before" / "later call"
  warning; the oracle skips BatchNorm and in-place ReLU modules, which torch's own full
  backward hook cannot watch: "Output 0 of BackwardHookFunction is a view and is being
  modified inplace").
- Leaks: after a monitored step and ``monitor.remove()``, the model's output and
  intermediate activations are freed (weak references dead): `step.hooked` keeps weak
  references only.

FINDINGS (strict xfails below), by severity:

1. FIXED (`monitor._kept`: a module keeping its output, as an attribute or in a dict
   attribute, is left out with the warning from its first call; a container returning that
   output too). (medium: silently wrong norm) ``where=`` selecting the module that keeps its
   output but not the later module that returns it again: ``a = self.k(x); b = self.r(x)`` with
   ``k.forward: self.out = self.fc(x) * 1.0; return self.out`` and ``r.forward: return
   k.out``, loss ``a.sum() + 3 * b.sum()``, ``GradientMonitor(model, where=["k"])``: 'k'
   recorded 11.31 (4 x sqrt(8)) where the native grad_output norm is 2.83 (sqrt(8)), no
   warning. With every module selected, both are left out (held). `r` is not hooked, so its
   call never reaches `_unhook_earlier`. Expected: 'k' left out with the warning, or 2.83.
2. FIXED (as 1). (medium: silently wrong norm; the same root as helper-76's unpinned note under its
   FINDING 2, still open after d7138d7 and not in README) the caller reading the kept output
   directly, with no later module call: ``a = self.k(x); return a.sum() + 3 *
   self.k.out.sum()``: 'k' recorded 11.31 where native is 2.83, no warning. README's
   paragraph names only "a later call" returning it again. Expected: left out, or README
   listing it among what is left.
3. FIXED (`_unhook_earlier` also looks at the hooks of earlier forwards still alive,
   `GradientMonitor._earlier`). (low-medium: an earlier history entry rewritten) a module
   memoising ACROSS forwards
   (``if self.cache is None: self.cache = self.fc(x) * 1.0; return self.cache``), two steps
   with ``backward(retain_graph=True)``: step 2's call is left out (made before), but
   `_unhook_earlier` only looks in step 2's `hooked`, so step 1's hook on the cached tensor
   fires in step 2's backward and adds to step 1's entry, already in `history`:
   ``history[0]['m']`` goes from 2.83 (the native first call's norm, correct right after
   backward 1) to 6.32 (sqrt(8 + 32)) after backward 2; step 2 has no entry at all. The
   native hook of the first call does not fire in the second backward. Expected:
   ``history[0]['m']`` stays 2.83 (or is removed with a warning).
4. FIXED (`_gradient` returns before logging for a cleared hook). (low: an empty history
   entry) when every hook of a backward was cleared by
   `_unhook_earlier`, `_gradient` still logs the step (`_merge_at_end` runs before the
   ``if not names`` return): ``GradientMonitor(model, where=["inner"])`` on a memo called
   twice gives ``history == [{}]`` (an entry naming no module), where a module
   left out before its hook is placed (an nn.Identity under the same `where`) gives
   ``history == []``; the distributed merge pops such an empty entry "as one process".
   Expected: no entry.
5. FIXED (`GradientMonitor._inner_output`: a call returning the output of a call inside it
   that is not the last one hooked is left out with the warning). (low: silently wrong norm;
   README narrower than the fault, same root as helper-61's pinned
   xfail) a container returning a child's output that it also fed to a LATER child
   (``h = self.a(x); self.aux = self.b(h); return h``; caller ``2 * p(x).sum() + 5 *
   p.aux.sum()``): `h` is not the last child's output, so 'p' gets a hook of its own, which
   sums b's use inside the call: 'p' recorded 8.66 where native is 5.66, no warning.
   README describes this only for "a container returning its last child's output [that]
   shares that child's hook". Expected: left out, or README covering any child's output.

Not covered for lack of time: threads calling one module concurrently (`_started` is one
counter for every thread; reasoning found no wrong exemption: a later call on another thread
returning an earlier one's tensor is already compared by per-thread numbers, helper-76's
FINDING 1), paddle and MindSpore (no `made_before` there), distributed merges.
"""

from __future__ import annotations

import gc
import math
import warnings
import weakref
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import broken, monitored, native_norms  # noqa: E402

from unihook.recipes import GradientMonitor  # noqa: E402
from unihook.recipes.monitor import NonFiniteGradientError  # noqa: E402

Loss = Callable[[Any], Any]


def _clear_states(model: Any) -> None:
    for module in model.modules():
        for attr in ("out", "cache"):
            if attr in module.__dict__:
                module.__dict__[attr] = None


def _cleared(model: Any) -> Callable[[], None]:
    _clear_states(model)
    return lambda: _clear_states(model)


def _native_norms(model: Any, names: list[str], x: Any, loss: Loss) -> dict[str, float]:
    _clear_states(model)
    return native_norms(model, names, x, lambda _, out: loss(out), _cleared)


def _monitored(model: Any, x: Any, loss: Loss, **kwargs: Any) -> tuple[dict[str, float], list]:
    return monitored(model, x, lambda _, out: loss(out), _cleared, **kwargs)


def _broken(model: Any, names: list[str], x: Any, loss: Loss, **kwargs: Any) -> list[str]:
    _clear_states(model)
    return broken(model, names, x, lambda _, out: loss(out), _cleared, **kwargs)


def _names(model: Any) -> list[str]:
    return [name for name, _ in model.named_modules()]


class _Memo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cache = None

    def forward(self, x: Any) -> Any:
        if self.cache is None:
            self.cache = self.fc(x) * 1.0
        return self.cache


class _MemoUser(nn.Module):
    def __init__(self, calls: int, wrap: str, weights: tuple[float, ...]) -> None:
        super().__init__()
        memo = _Memo()
        self.inner = nn.Sequential(memo) if wrap == "sequential" else memo
        self.calls = calls
        self.wrap = wrap
        self.weights = weights

    def forward(self, x: Any) -> Any:
        outs = [self.inner(x) for _ in range(self.calls)]
        total = sum(w * o.sum() for w, o in zip(self.weights, outs))
        if self.wrap == "returned":
            return total, outs[-1]
        return total


class _Keep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = None

    def forward(self, x: Any) -> Any:
        self.out = self.fc(x) * 1.0
        return self.out


class _Read(nn.Module):
    def __init__(self, source: Any) -> None:
        super().__init__()
        self.__dict__["source"] = source  # (not a child: no second path in named_modules)

    def forward(self, x: Any) -> Any:
        return self.source.out


class _KeepRead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Keep()
        self.r = _Read(self.k)

    def forward(self, x: Any) -> Any:
        return self.k(x).sum() + 3 * self.r(x).sum()


class _KeepDirect(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Keep()

    def forward(self, x: Any) -> Any:
        a = self.k(x)
        return a.sum() + 3 * self.k.out.sum()


def _loss_of(out: Any) -> Any:
    return out[0] + 0.5 * out[1].sum() if isinstance(out, tuple) else out


# ---------------------------------------------------------------------------- HELD


@pytest.mark.parametrize("calls", [1, 2, 3])
@pytest.mark.parametrize("wrap", ["plain", "sequential", "returned"])
@pytest.mark.parametrize("weights", [(1.0, 2.0, 3.0), (0.0, 1.0, -2.0), (5.0, 0.0, 0.0)])
def test_memo_called_again_is_native_or_left_out(calls: int, wrap: str, weights: tuple) -> None:
    torch.manual_seed(calls)
    model = _MemoUser(calls, wrap, weights)
    x = torch.randn(2, 4)
    assert _broken(model, _names(model), x, _loss_of) == []


def test_kept_state_read_by_a_later_call_leaves_both_out() -> None:
    torch.manual_seed(0)
    model = _KeepRead()
    x = torch.randn(2, 4)
    assert _broken(model, _names(model), x, lambda out: out) == []
    step, said = _monitored(model, x, lambda out: out)
    assert "k" not in step and "r" not in step
    # (since the FINDINGS 1 and 2 fix 'k' goes as the module keeping its output, first)
    assert any("'k'" in s and ("later call" in s or "also keeps" in s) for s in said)


def test_nonfinite_still_raises_beside_a_cleared_hook() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.memo = _Memo()
            self.head = nn.Linear(4, 1)

        def forward(self, x: Any) -> Any:
            a = self.memo(x)
            b = self.memo(x)
            return self.head(a + b) * float("nan")

    torch.manual_seed(0)
    model = M()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model, on_nonfinite="raise"):
            with pytest.raises(NonFiniteGradientError):
                model(torch.randn(2, 4)).sum().backward()


def test_nan_reaching_only_the_cleared_hook_raises_nothing_for_it() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.memo = _Memo()

        def forward(self, x: Any) -> Any:
            a = self.memo(x)
            b = self.memo(x)
            return (a * float("nan")).sum() + b.sum()

    torch.manual_seed(0)
    model = M()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model, on_nonfinite="raise")
        try:
            model(torch.randn(2, 4)).backward()
        except NonFiniteGradientError as error:
            assert error.module not in ("memo",)  # (only a module whose hook was kept)
        finally:
            monitor.remove()
    assert all("memo" not in entry for entry in monitor.history)


def test_retain_graph_two_backwards_keep_the_leave_out() -> None:
    torch.manual_seed(0)
    model = _MemoUser(2, "plain", (1.0, 2.0, 0.0))
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model) as monitor:
            out = model(x)
            out.backward(retain_graph=True)
            out.backward()
    _clear_states(model)
    assert "inner" not in monitor.history[-1]
    assert all(math.isfinite(v) for v in monitor.history[-1].values())


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.out = nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        return self.out(self.block(self.block(x)) + x).sum()


class _Res(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: Any) -> Any:
        h = self.relu(self.bn(self.conv(x)))
        return self.relu(self.conv2(h) + x)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: Any) -> Any:
        return self.head(torch.tanh(self.emb(x))).pow(2).sum()


def _ordinary() -> list[tuple[str, Any, Any, Loss]]:
    torch.manual_seed(0)
    return [
        ("shared", _Shared(), torch.randn(2, 4), lambda out: out),
        ("cnn", nn.Sequential(_Res(), _Res()), torch.randn(2, 3, 5, 5), lambda o: o.pow(2).sum()),
        ("lstm", nn.LSTM(4, 5, num_layers=2), torch.randn(3, 2, 4), lambda o: o[0].pow(2).sum()),
        (
            "encoder",
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
            torch.randn(3, 2, 8),
            lambda o: o.pow(2).sum(),
        ),
        ("tied", _Tied(), torch.tensor([[1, 2, 3], [4, 5, 6]]), lambda out: out),
    ]


@pytest.mark.parametrize("case", range(5))
def test_ordinary_models_lose_nothing(case: int) -> None:
    label, model, x, loss = _ordinary()[case]
    # (torch's own hook cannot watch an output an in-place ReLU then changes, nor the ReLU)
    names = [name for name in _names(model) if not name.endswith(("bn", "relu"))]
    native = _native_norms(model, names, x, loss)
    step, said = _monitored(model, x, loss)
    assert [s for s in said if "later call" in s or "made before" in s] == [], label
    for name, want in native.items():
        if name in step:
            assert step[name] == pytest.approx(want, rel=1e-5), (label, name)
    # nothing left out by the new checks: whatever is absent is absent for an older reason
    assert all(name in step or "" == name or name in " ".join(said) for name in native), label


def test_activations_freed_after_step_and_remove() -> None:
    torch.manual_seed(0)
    model = _MemoUser(2, "sequential", (1.0, 2.0, 0.0))
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        monitor = GradientMonitor(model)
        out = model(x)
        cached = weakref.ref(model.inner[0].cache)
        held = weakref.ref(out)
        out.backward()
        del out
        _clear_states(model)
        monitor.remove()
    gc.collect()
    assert cached() is None and held() is None


class _Three(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Keep()
        self.r1 = _Read(self.k)
        self.r2 = nn.Sequential(_Read(self.k))

    def forward(self, x: Any) -> Any:
        return self.k(x).sum() + 2 * self.r1(x).sum() + 3 * self.r2(x).sum()


class _InBox(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Keep()
        self.box = nn.Sequential(nn.Identity(), _Read(self.k))

    def forward(self, x: Any) -> Any:
        return self.k(x).sum() + 2 * self.box(x).sum()


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = _Keep()
        self.r = _Read(self.k)

    def forward(self, x: Any) -> Any:
        return (self.k(x) * 2 + self.r(x)).pow(2).sum()


@pytest.mark.parametrize("kind", [_Three, _InBox, _Outer])
def test_returned_again_by_other_modules(kind: Any) -> None:
    torch.manual_seed(0)
    model = kind()
    assert _broken(model, _names(model), torch.randn(2, 4), lambda out: out) == []


def test_two_monitors_and_every_two() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    model = _MemoUser(2, "sequential", (1.0, 2.0, 0.0))
    native = _native_norms(model, _names(model), x, lambda out: out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a = GradientMonitor(model)
        b = GradientMonitor(model, where=["inner", "inner.0.fc"])
        model(x).backward()
        a.remove()
        b.remove()
    _clear_states(model)
    for monitor in (a, b):
        entry = monitor.history[-1]
        assert "inner" not in entry and "inner.0" not in entry
        assert entry["inner.0.fc"] == pytest.approx(native["inner.0.fc"], rel=1e-5)
    model = _MemoUser(2, "plain", (1.0, 2.0, 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model, every=2) as monitor:
            for i in range(4):
                _clear_states(model)
                model(x * (i + 1)).backward()
    _clear_states(model)
    assert len(monitor.history) == 2
    assert all("inner" not in entry and "inner.fc" in entry for entry in monitor.history)


# ------------------------------------------------------------------------- FINDINGS


def test_where_without_the_later_module_records_the_sum() -> None:
    torch.manual_seed(0)
    model = _KeepRead()
    x = torch.randn(2, 4)
    assert _broken(model, ["k"], x, lambda out: out, where=["k"]) == []


def test_kept_output_read_directly_records_the_sum() -> None:
    torch.manual_seed(0)
    model = _KeepDirect()
    x = torch.randn(2, 4)
    assert _broken(model, ["k"], x, lambda out: out) == []


def test_memo_across_steps_rewrites_the_earlier_entry() -> None:
    class P(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = _Memo()

        def forward(self, x: Any) -> Any:
            return self.m(x)

    torch.manual_seed(0)
    model = P()
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        monitor = GradientMonitor(model)
        model(x).sum().backward(retain_graph=True)
        first = monitor.history[0].get("m")
        (2 * model(x)).sum().backward(retain_graph=True)
        monitor.remove()
    _clear_states(model)
    if first is None:  # (since the FINDINGS 1 and 2 fix: a module keeping its output goes)
        assert all("m" not in entry for entry in monitor.history)
        assert any("'m'" in str(w.message) for w in caught)
    else:
        assert first == pytest.approx(math.sqrt(8.0), rel=1e-5)  # native: sqrt(2 * 4)
        assert monitor.history[0]["m"] == pytest.approx(first, rel=1e-5)


def test_cleared_hooks_only_log_an_empty_entry() -> None:
    torch.manual_seed(0)
    model = _MemoUser(2, "plain", (1.0, 2.0, 0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with GradientMonitor(model, where=["inner"]) as monitor:
            model(torch.randn(2, 4)).backward()
    _clear_states(model)
    # as a module left out before its hook is placed (nn.Identity): no entry at all
    assert list(monitor.history) == []


class _ReadsChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)
        self.aux = None

    def forward(self, x: Any) -> Any:
        h = self.a(x)
        self.aux = self.b(h)  # (the last call is b's: `a`'s output is not shared via `_last`)
        return h


class _AuxTop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = _ReadsChild()

    def forward(self, x: Any) -> Any:
        out = 2 * self.p(x).sum() + 5 * self.p.aux.sum()
        self.p.aux = None
        return out


def test_container_returning_a_non_last_childs_output_it_read() -> None:
    torch.manual_seed(0)
    model = _AuxTop()
    assert _broken(model, ["p"], torch.randn(2, 4), lambda out: out) == []
