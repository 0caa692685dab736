"""helper-75's attack on d63b37e (paddle `PaddleOps.in_backward`: where paddle's one-bool
`_is_run_in_backward` flag is off and the tracer is not paddle's own, a `PyLayerBackward`
`ctx` in a frame named `backward` on the thread's stack) and 4457a7c (torch `TorchOps.derived`:
where the walk pruned by sequence number finds nothing, a second walk down to the arguments'
nodes, without the floor).

Oracles: the same model without recompute (ActivationStats rows, GradientMonitor norms,
GradCAM maps); for `ops.derived`, `torch.autograd.grad(b.sum(), a, allow_unused=True,
retain_graph=True) is not None` for some pair of outputs.

Tried (scripts not kept unless pinned below):

- paddle, a chain of Linear layers each plain (n), in a reentrant (r) or non-reentrant (u)
  `recompute`: rn, nr, rr, ru, uu (HELD: ActivationStats rows and GradientMonitor norms equal
  the plain chain); ur, uru, rur (FINDING 1: ActivationStats counts the non-reentrant
  segment's layers twice; GradientMonitor HELD; FINDING 2: GradCAM call=-1 "no gradient").
- nested recompute (a reentrant recompute inside each of two reentrant segments: HELD, rows
  and norms, with and without `dygraph.guard()`; inside two non-reentrant segments: rows HELD,
  norms 0.0 for the inner layers, but paddle's own parameter gradients are 0 there too (its
  bug, not unihook's: not pinned). `paddle.grad` inside a recomputed forward: paddle itself
  raises (non-reentrant: "only one pair of hooks", reentrant: "does not appear in the backward
  graph"): not unihook's.
- double backward (`paddle.grad(create_graph=True)` then `.backward()`) through a reentrant
  recompute: ActivationStats HELD; GradientMonitor norms differ from no recompute, but so
  do paddle's own parameter gradients (its PyLayer recompute has no second order): not
  pinned.
- legacy `paddle.base.dygraph.guard()` around everything, segments reentrant: HELD (pinned).
- a user PyLayer whose backward calls a Layer (a forward in backward), the model's later part
  in a reentrant recompute: FINDING 3 (the Layer's calls recorded as forwards).
- threads: a forward on a worker while the main thread is in a backward: FINDING 4 (the flag
  is process-wide; also before d63b37e; FIXED 2026-12-07: the thread's stack tells).
- cost (ActivationStats, 50 Linear(16, 16), per module call, best of 5x30 forwards, 2 shared
  cores): before/after d63b37e: plain 62/61 us; inside `dygraph.guard()` 63/65-66 us; inside
  `dygraph.guard()` called 300 frames deep 60/108-112 us (the stack walk, several times per
  module call, is O(depth)); 300 frames deep outside the guard 62/61 us.
- torch `ops.derived`: 529 random graphs (2-3 outputs among 1-8 ops on an argument, leaf or
  not, ~30% of the ops run on a thread-pool worker, sums of two): no wrong answer (HELD,
  pinned smaller); an argument changed in place on a worker thread: FINDING 5 (wrong False);
  two outputs with independent histories of n nodes each: 10/200/1500 nodes 9.7/132/997 us
  before 4457a7c, 25/384/2800 us after (~2.8x: every such call walks both histories); from
  ~2 x 2048 nodes it answers None (FINDING 6: a regression, the call left out of
  GradientMonitor). benchmarks/derived_walk.py (LSTM): walk/skipped 1.057x, skipped/plain
  1.359x.

FINDINGS (numbered as found; the report ranks them):
1. MEDIUM. paddle: a non-reentrant `recompute` segment before a reentrant one (`x =
   recompute(l0, x, use_reentrant=False); x = recompute(l1, x, use_reentrant=True)`):
   ActivationStats counts l0 twice per step (calls 4 for 2 steps), silently. The reentrant
   segment's backward runs first and its inner backward clears paddle's flag; the
   non-reentrant recomputation runs on paddle's own tracer (no `dygraph.guard()`), where
   `in_backward` answers False without looking at the stack. Expected: rows equal to no
   recompute. (backends/unihook_paddle/_ops.py `in_backward`)
2. MEDIUM. paddle, same model, GradCAM on l0 (call=-1): "no gradient reached the output"
   (the recomputed call passes for a second forward call). Expected: the no-recompute map.
3. LOW-MEDIUM. paddle: a user PyLayer whose backward calls a Layer, later layers in a
   reentrant recompute: the Layer's calls in the backward are recorded by ActivationStats as
   forwards (without recompute they are not). Expected: rows equal to no recompute.
4. FIXED 2026-12-07 (`ops.in_backward` asks, where paddle's flag is set, whether this
   thread's stack has a backward's entry point). LOW (also before d63b37e). paddle: a forward
   of a Layer on a worker thread while the main thread runs a backward: ActivationStats
   records nothing (paddle's flag is process-wide, the recipe takes it for a recomputation).
   Expected: one call recorded.
5. LOW. torch `ops.derived([o1, o2], [x])`: `o1 = x.sin()`, a worker thread runs
   `x.mul_(o1)`, `o2 = x * 3`: False, o2 is computed from o1. The second walk's stop is the
   argument's node read after the call (the in-place node, made during the call, on the path);
   the first walk prunes it (numbered on the worker). (backends/unihook_torch/_ops.py)
6. FIXED (the budget is 16384 nodes). LOW-MEDIUM (regression of 4457a7c). torch
   `ops.derived` of two outputs with independent histories of ~2100 nodes each inside the
   call: None (past 4096 nodes: the second walk walks both) where it answered False before;
   GradientMonitor leaves out a module unrolling two LSTMCells over 200 steps and returning
   both sequences (recorded before). README said torch walks "down to the earliest output's
   sequence number, at most 4096 nodes".

Run: PYTHONPATH=.:backends GLOG_minloglevel=2 .venv/bin/python -m pytest -q
tests/test_attack_h75.py
"""

from __future__ import annotations

import logging
import random
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import pytest

from unihook.recipes import ActivationStats, GradCAM, GradientMonitor

# --------------------------------------------------------------------------- paddle


def _paddle() -> Any:
    warnings.filterwarnings("ignore", message="No ccache found")
    paddle = pytest.importorskip("paddle")
    logging.getLogger("paddle").setLevel(logging.ERROR)
    return paddle


def _chain(modes: str) -> Any:
    """Linear layers, each plain (n), in a reentrant (r) or a non-reentrant (u) recompute."""
    paddle = _paddle()
    from paddle.distributed.fleet.utils import recompute

    class Chain(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.layers = paddle.nn.LayerList([paddle.nn.Linear(4, 4) for _ in modes])

        def forward(self, x: Any) -> Any:
            for mode, layer in zip(modes, self.layers):
                x = layer(x) if mode == "n" else recompute(layer, x, use_reentrant=mode == "r")
            return x

    paddle.seed(0)
    return Chain()


def _train(model: Any, make: Callable[[Any], Any], steps: int = 2) -> Any:
    paddle = _paddle()
    recipe = make(model)
    paddle.seed(1)
    for _ in range(steps):
        x = paddle.randn([3, 4])
        x.stop_gradient = False
        model(x).sum().backward()
    return recipe


def _norms(recipe: Any) -> list[dict[str, float]]:
    return [{k: round(v, 5) for k, v in entry.items()} for entry in recipe.history]


@pytest.mark.parametrize(
    "modes",
    [
        "rn",
        "nr",
        "rr",
        "ru",
        pytest.param("ur", marks=pytest.mark.xfail(strict=True, reason="FINDING 1")),
        pytest.param("rur", marks=pytest.mark.xfail(strict=True, reason="FINDING 1")),
    ],
)
def test_finding1_activation_stats_mixed_segments(modes: str) -> None:
    """FINDING 1 (ur, rur): a non-reentrant segment recomputed after a reentrant segment's
    inner backward cleared paddle's flag is counted as a forward; the rest HELD. Run in a
    fresh process: where unihook's autograd guard is in (a gradient hook of unihook's alive,
    also one another test left for the collector), the backward's own depth tells (below)."""
    _paddle()
    assert _fresh(f"_stats_as_plain({modes!r})") is True


def _stats_as_plain(modes: str, beside: bool = False) -> bool:
    """Whether ActivationStats' rows on a chain of `modes` equal the plain chain's; `beside`:
    with a GradientMonitor on each model too (unihook's autograd guard in)."""
    rows = []
    for chain in (_chain("n" * len(modes)), _chain(modes)):
        monitor = GradientMonitor(chain) if beside else None
        rows.append(_train(chain, ActivationStats).rows())
        del monitor
    return rows[0] == rows[1]


_FRESH = r"""
import paddle, sys
sys.path.insert(0, sys.argv[1])
import test_attack_h75 as case
print(repr(eval(sys.argv[2], vars(case))))
"""


def _fresh(expression: str) -> Any:
    """`expression` evaluated with this file's names in a fresh process (a fork of paddle's
    zygote): no hook of another test's alive."""
    import os

    from children import last_value, run_code

    return last_value(run_code(_FRESH, os.path.dirname(__file__), expression, timeout=120))


@pytest.mark.parametrize("modes", ["ur", "rur"])
def test_finding1_held_beside_a_gradient_hook(modes: str) -> None:
    """FINDING 1, fixed where unihook's autograd guard runs the backward (a GradientMonitor
    beside): the thread's own backward depth tells (2026-12-07)."""
    _paddle()
    assert _stats_as_plain(modes, beside=True)


@pytest.mark.parametrize("modes", ["ur", "rur"])
def test_gradient_monitor_mixed_segments_held(modes: str) -> None:
    """HELD: GradientMonitor's norms on mixed segments equal the plain chain's."""
    want = _train(_chain("n" * len(modes)), GradientMonitor)
    got = _train(_chain(modes), GradientMonitor)
    assert _norms(got) == _norms(want)


def _cam(modes: str, call: int) -> np.ndarray:
    paddle = _paddle()
    from paddle.distributed.fleet.utils import recompute

    class Net(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = paddle.nn.Conv2D(3, 4, 3, padding=1)
            self.c2 = paddle.nn.Conv2D(4, 4, 3, padding=1)
            self.fc = paddle.nn.Linear(4, 3)

        def forward(self, x: Any) -> Any:
            for mode, layer in zip(modes, (self.c1, self.c2)):
                x = layer(x) if mode == "n" else recompute(layer, x, use_reentrant=mode == "r")
                x = paddle.nn.functional.relu(x)
            return self.fc(x.mean(axis=[2, 3]))

    paddle.seed(0)
    model = Net()
    x = paddle.randn([2, 3, 6, 6])
    x.stop_gradient = False
    return GradCAM(model, model.c1, call=call)(x)


@pytest.mark.parametrize(
    "modes,call",
    [
        ("uu", -1),
        ("rr", -1),
        ("ur", 0),
        ("ur", -1),
    ],
)
def test_finding2_gradcam_mixed_segments(modes: str, call: int) -> None:
    """FINDING 2 (ur, call=-1): "no gradient reached the output" (fixed 2026-12-07: GradCAM's
    gradient hooks put unihook's autograd guard in, whose backward depth tells); the rest
    HELD."""
    np.testing.assert_allclose(_cam(modes, call), _cam("nn", call), atol=1e-6)


def _with_aux(reentrant_tail: bool) -> Any:
    paddle = _paddle()
    from paddle.autograd import PyLayer
    from paddle.distributed.fleet.utils import recompute

    class Aux(PyLayer):
        @staticmethod
        def forward(ctx: Any, x: Any, layer: Any) -> Any:
            ctx.layer = layer
            return x * 1.0

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            with paddle.no_grad():
                ctx.layer(dy)  # a forward in backward
            return dy

    class Net(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.a = paddle.nn.Linear(4, 4)
            self.b = paddle.nn.Linear(4, 4)
            self.aux = paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            x = Aux.apply(self.a(x), self.aux)
            return recompute(self.b, x, use_reentrant=True) if reentrant_tail else self.b(x)

    paddle.seed(0)
    return Net()


@pytest.mark.xfail(strict=True, reason="FINDING 3")
def test_finding3_py_layer_backward_calling_a_layer_after_a_reentrant_segment() -> None:
    """FINDING 3: the PyLayer backward's Layer call is recorded as a forward ('aux' rows)
    once a reentrant segment's inner backward cleared paddle's flag (in a fresh process, as
    FINDING 1)."""
    _paddle()
    assert _fresh("_aux_as_plain()") is True


def _aux_as_plain(beside: bool = False) -> bool:
    rows = []
    for model in (_with_aux(False), _with_aux(True)):
        monitor = GradientMonitor(model) if beside else None
        rows.append(_train(model, ActivationStats).rows())
        del monitor
    return "aux" not in [row["name"] for row in rows[0]] and rows[0] == rows[1]


def test_finding3_held_beside_a_gradient_hook() -> None:
    """FINDING 3, fixed where unihook's autograd guard runs the backward (as FINDING 1)."""
    _paddle()
    assert _aux_as_plain(beside=True)


def test_finding4_a_worker_forward_during_a_backward_is_recorded() -> None:
    """FINDING 4 (fixed): a forward on a worker thread while the main thread runs a backward
    was taken for a recomputation (paddle's flag is process-wide): nothing was recorded."""
    paddle = _paddle()
    from paddle.autograd import PyLayer

    other = paddle.nn.Linear(4, 4)
    stats = ActivationStats(other)
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        go.wait(10)
        other(paddle.randn([2, 4]))
        done.set()

    class Wait(PyLayer):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 1.0

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            go.set()
            done.wait(10)
            return dy

    thread = threading.Thread(target=worker)
    thread.start()
    x = paddle.randn([2, 4])
    x.stop_gradient = False
    Wait.apply(x).sum().backward()
    thread.join(10)
    stats.remove()
    assert [(row["name"], row["calls"]) for row in stats.rows()] == [("", 1)]


def test_legacy_dygraph_guard_nested_reentrant_recompute_held() -> None:
    """HELD: inside `dygraph.guard()`, two reentrant segments each holding a reentrant
    recompute: ActivationStats rows and GradientMonitor norms equal the plain model's."""
    paddle = _paddle()
    from paddle.distributed.fleet.utils import recompute

    class Inner(paddle.nn.Layer):
        def __init__(self, nested: bool) -> None:
            super().__init__()
            self.nested = nested
            self.a = paddle.nn.Linear(4, 4)
            self.b = paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            x = self.a(x)
            return recompute(self.b, x, use_reentrant=True) if self.nested else self.b(x)

    class Net(paddle.nn.Layer):
        def __init__(self, nested: bool) -> None:
            super().__init__()
            self.nested = nested
            self.i1, self.i2, self.h = Inner(nested), Inner(nested), paddle.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            if not self.nested:
                return self.h(self.i2(self.i1(x)))
            x = recompute(self.i1, x, use_reentrant=True)
            return self.h(recompute(self.i2, x, use_reentrant=True))

    def made(nested: bool) -> Any:
        paddle.seed(0)
        return Net(nested)

    with paddle.base.dygraph.guard():
        for make in (ActivationStats, GradientMonitor):
            want, got = _train(made(False), make, 3), _train(made(True), make, 3)
            if make is ActivationStats:
                assert got.rows() == want.rows()
            else:
                assert _norms(got) == _norms(want)


# --------------------------------------------------------------------------- torch derived


def _truth(outputs: list[Any]) -> bool:
    torch = pytest.importorskip("torch")
    for b in outputs:
        for a in outputs:
            if a is b or b.grad_fn is None or not a.requires_grad:
                continue
            found = torch.autograd.grad(b.sum(), a, allow_unused=True, retain_graph=True)[0]
            if found is not None:
                return True
    return False


def test_derived_random_graphs_with_worker_threads_held() -> None:
    """HELD: 150 random graphs (ops on a leaf or non-leaf argument, some on a worker thread,
    sums of two): `ops.derived` equals autograd's answer."""
    torch = pytest.importorskip("torch")
    from unihook import ops

    steps: list[Callable[[Any], Any]] = [
        lambda t: t * 2,
        lambda t: t.sin(),
        lambda t: t + 1,
        lambda t: t.exp(),
        lambda t: t[:2] if t.shape[0] > 2 else t * 3,
        lambda t: t.clone(),
    ]
    wrong = []
    with ThreadPoolExecutor(1) as pool:
        for seed in range(150):
            rnd = random.Random(seed)
            leaf = torch.randn(4, requires_grad=True)
            argument = leaf * 1.0 if rnd.random() < 0.5 else leaf
            made = [argument]
            for _ in range(rnd.randint(1, 8)):
                if rnd.random() < 0.2 and len(made) > 1:
                    a, b = rnd.sample(made, 2)
                    if a.shape == b.shape:
                        made.append(a + b)
                        continue
                step, source = rnd.choice(steps), rnd.choice(made)
                on_worker = rnd.random() < 0.3
                made.append(pool.submit(step, source).result() if on_worker else step(source))
            if len(made) < 3:
                continue
            outputs = rnd.sample(made[1:], min(len(made) - 1, rnd.randint(2, 3)))
            if ops.derived(outputs, [argument]) is not _truth(outputs):
                wrong.append(seed)
    assert wrong == []


@pytest.mark.xfail(strict=True, reason="FINDING 5")
def test_finding5_derived_argument_changed_in_place_on_a_worker() -> None:
    """FINDING 5: the argument changed in place on a worker (its new node numbered below the
    floor, and the second walk's stop): a wrong False."""
    torch = pytest.importorskip("torch")
    from unihook import ops

    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: None).result()
        w = torch.randn(4, requires_grad=True)
        x = w * 1.0
        o1 = x.sin()
        pool.submit(lambda: x.mul_(o1)).result()
        o2 = x * 3
    assert _truth([o1, o2])
    assert ops.derived([o1, o2], [x]) is True


def test_derived_argument_changed_in_place_on_the_same_thread_held() -> None:
    """HELD: the same on the call's thread: True (the first walk finds it)."""
    torch = pytest.importorskip("torch")
    from unihook import ops

    w = torch.randn(4, requires_grad=True)
    x = w * 1.0
    o1 = x.sin()
    x.mul_(o1)
    o2 = x * 3
    assert ops.derived([o1, o2], [x]) is True


def test_finding6_derived_two_long_independent_histories() -> None:
    """FINDING 6: two outputs of ~2100 nodes each, independent: None (past the budget) since
    4457a7c, False before (the first walk from the later output stops at the earlier one's
    sequence number). FIXED (2026-12-01: the budget is 16384 nodes)."""
    torch = pytest.importorskip("torch")
    from unihook import ops

    x = torch.randn(4, requires_grad=True) * 1.0
    a = b = x
    for _ in range(2100):
        a = a + 1
    for _ in range(2100):
        b = b * 1.0
    assert ops.derived([a, b], [x]) is False


def test_finding6_gradient_monitor_leaves_out_two_unrolled_lstm_cells() -> None:
    """FINDING 6 as the monitor shows it: a module unrolling two LSTMCells over 200 steps and
    returning both sequences (neither computed from the other) is left out (kept before)."""
    torch = pytest.importorskip("torch")

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = torch.nn.LSTMCell(8, 8), torch.nn.LSTMCell(8, 8)

        def run(self, cell: Any, x: Any) -> Any:
            h = c = torch.zeros(x.shape[0], 8)
            outs = []
            for t in range(x.shape[1]):
                h, c = cell(x[:, t], (h, c))
                outs.append(h)
            return torch.stack(outs, 1)

        def forward(self, x: Any) -> Any:
            return self.run(self.c1, x), self.run(self.c2, x)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = Two(), torch.nn.Linear(8, 1)

        def forward(self, x: Any) -> Any:
            a, b = self.rnn(x)
            return self.head(a).sum() + b.sum()

    torch.manual_seed(0)
    model = Net()
    monitor = GradientMonitor(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.randn(2, 200, 8, requires_grad=True)).backward()
    monitor.remove()
    assert "rnn" in monitor.history[-1]
