"""capture() beside in-place ops and with structured outputs, on every backend.

A captured value is the module's output as it was returned (its args, its grad_output as they
were handed over), whatever in-place op runs later; where capture cannot know (a module learned
as left alone and then modified), reading raises `StaleCaptureError`, never a stale value.
Structured outputs come back as the type they were. The oracle is the frameworks' own forward
hooks storing a numpy copy of each output as it is returned.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import unihook
from unihook import StaleCaptureError


class Pair(NamedTuple):
    first: Any
    second: Any


@dataclasses.dataclass
class Out:
    hidden: Any
    extra: Any
    label: str = "out"


@dataclasses.dataclass(frozen=True)
class Frozen:
    hidden: Any


def row(kit: Any, *values: float) -> Any:
    return kit.tensor(np.asarray([values], dtype="float32"))


def linear(kit: Any) -> Any:
    """Linear(2, 2) with outputs of both signs on `row(kit, 1, -2)`."""
    return kit.linear(2, 2, weight=[[1.0, 2.0], [-1.0, 1.0]], bias=[0.5, -0.5])


def identity(kit: Any) -> Any:
    return kit.module(lambda self, x: x)


def add_inplace(kit: Any, value: float) -> Any:
    """A module modifying its input in place and returning it (paddle has no `+=` in place)."""
    return kit.module(lambda self, x: kit.add_(x, value))


Seen = dict[str, list[tuple[Any, Any]]]


def native_copies(kit: Any, model: Any) -> tuple[Seen, Callable[[], object]]:
    """The oracle: native forward hooks keeping numpy copies of every module call's first
    positional arg and output."""
    seen: Seen = collections.defaultdict(list)
    handles = []
    for name, module in kit.named_modules(model):

        def hook(module: Any, args: Any, output: Any, name: str = name) -> None:
            seen[name].append((kit.numpy(args[0]), kit.numpy(output)))

        handles.append(module.register_forward_hook(hook))
    return seen, lambda: [h.remove() for h in handles]


def assert_matches(kit: Any, cache: Any, seen: Seen, forwards: int, reuse: bool) -> None:
    """`cache` holds what `seen` does: every call (reuse: the last forward's) and the last
    call's args."""
    assert sorted(cache.keys()) == sorted(seen)
    for name, calls in seen.items():
        expected = calls[-len(calls) // forwards :] if reuse else calls
        got = [kit.numpy(t) for t in cache.calls(name)]
        assert len(got) == len(expected), name
        for g, (_, e) in zip(got, expected):
            np.testing.assert_array_equal(g, e, err_msg=name)
        np.testing.assert_array_equal(kit.numpy(cache.inputs[name][0]), calls[-1][0])


# -- in-place after the module returned ------------------------------------------------------


def test_inplace_by_the_following_module(backend: Any) -> None:
    model = backend.sequential(linear(backend), backend.relu_module(inplace=True))
    expected = [[-2.5, -3.5]]
    for _ in range(3):  # the first capture learns, later ones copy only what is modified
        with unihook.capture(model) as cache:
            model(row(backend, 1.0, -2.0))
            model(row(backend, 1.0, -2.0))
        for value in cache.calls("0"):
            np.testing.assert_array_equal(backend.numpy(value), expected)
        np.testing.assert_array_equal(backend.numpy(cache["1"]), [[0.0, 0.0]])


def test_inplace_in_the_parents_forward(backend: Any) -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.lin(x)
        h += 1.0  # in place in torch, a new tensor in paddle 3.3.1
        backend.add_(h, 10.0)
        return self.act(h)

    model = backend.module(
        forward, {"lin": linear(backend), "act": backend.relu_module(inplace=True)}
    )
    for _ in range(3):
        with unihook.capture(model, grads=True) as cache:
            model(row(backend, 1.0, -2.0))
        np.testing.assert_array_equal(backend.numpy(cache["lin"]), [[-2.5, -3.5]])
        np.testing.assert_array_equal(backend.numpy(cache["act"]), [[8.5, 7.5]])


def test_inplace_on_a_returned_input(backend: Any) -> None:
    def forward(self: Any, x: Any) -> Any:
        return self.bump(self.same(x))

    model = backend.module(forward, {"same": identity(backend), "bump": add_inplace(backend, 1.0)})
    for _ in range(3):
        x = row(backend, 1.0, -2.0)
        with unihook.capture(model, inputs=True) as cache:
            model(x)
        np.testing.assert_array_equal(backend.numpy(cache["same"]), [[1.0, -2.0]])
        np.testing.assert_array_equal(backend.numpy(cache.inputs["same"][0]), [[1.0, -2.0]])
        np.testing.assert_array_equal(backend.numpy(cache[""]), [[2.0, -1.0]])
        np.testing.assert_array_equal(backend.numpy(x), [[2.0, -1.0]])  # the caller's x moved


def test_inplace_on_the_base_of_a_returned_view(backend: Any) -> None:
    def forward(self: Any, x: Any) -> Any:
        row0 = self.first(x)
        backend.add_(x, 10.0)  # views share the version counter of their base
        return row0 * 1

    model = backend.module(forward, {"first": backend.module(lambda self, x: x[0])})
    for _ in range(3):
        with unihook.capture(model) as cache:
            model(backend.tensor([[1.0, 2.0], [3.0, 4.0]]))
        np.testing.assert_array_equal(backend.numpy(cache["first"]), [1.0, 2.0])


def test_a_module_called_twice(backend: Any) -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.inner(x)
        backend.add_(h, -1.0)
        return self.inner(h)

    model = backend.module(forward, {"inner": backend.relu_module(inplace=True)})
    for _ in range(3):
        with unihook.capture(model) as cache:
            model(row(backend, 3.0, -1.0))
        calls = [backend.numpy(t).tolist() for t in cache.calls("inner")]
        assert calls == [[[3.0, 0.0]], [[2.0, 0.0]]]


def test_reuse_and_inputs(backend: Any) -> None:
    model = backend.sequential(
        linear(backend), backend.relu_module(inplace=True), add_inplace(backend, 1.0)
    )
    with unihook.capture(model, reuse=True, inputs=True) as cache:
        for scale in (1.0, 2.0, 3.0):
            model(row(backend, scale, -2.0 * scale))
            lin = np.asarray([[-3 * scale + 0.5, -3 * scale - 0.5]])
            np.testing.assert_allclose(backend.numpy(cache["0"]), lin)
            np.testing.assert_allclose(backend.numpy(cache.inputs["0"][0]), [[scale, -2 * scale]])
            # the ReLU's input as its forward hook saw it: already rectified in place
            np.testing.assert_allclose(backend.numpy(cache.inputs["1"][0]), np.maximum(lin, 0))
            np.testing.assert_allclose(backend.numpy(cache["2"]), np.maximum(lin, 0) + 1)


def test_grads_beside_inplace(backend: Any) -> None:
    model = backend.sequential(linear(backend), backend.relu_module(inplace=True))
    for _ in range(2):
        x = backend.tensor([[1.0, 1.0]], requires_grad=True)
        with unihook.capture(model, grads=True) as cache:
            backend.backward(model(x).sum())
        np.testing.assert_array_equal(backend.numpy(cache["0"]), [[3.5, -0.5]])
        np.testing.assert_array_equal(backend.numpy(cache.grads["0"]), [[1.0, 0.0]])
        np.testing.assert_array_equal(backend.numpy(cache.grads["1"]), [[1.0, 1.0]])
        assert set(cache.grads) == {"", "0", "1"} and len(cache.grads) == 3


def _needs_versions(backend: Any) -> None:
    if unihook.ops.version(backend.tensor([1.0])) is None:
        pytest.skip(f"{backend.name}: no version counter for capture, which copies every value")


def test_a_learned_module_modified_later_raises(backend: Any) -> None:
    _needs_versions(backend)
    model = backend.sequential(linear(backend))
    for _ in range(2):  # learned: nothing modifies its output
        with unihook.capture(model) as cache:
            out = model(row(backend, 1.0, -2.0))
        assert cache._outputs["0"][0].copied is (_ == 0)
    backend.add_(out, 1.0)  # pyright: ignore[reportPossiblyUnboundVariable]
    with pytest.raises(StaleCaptureError, match=rf"output of module '0' \({backend.name}\)"):
        cache["0"]  # pyright: ignore[reportPossiblyUnboundVariable]
    with pytest.raises(unihook.UnihookError, match="modified in place"):
        cache.calls("")  # pyright: ignore[reportPossiblyUnboundVariable]
    with unihook.capture(model) as cache:  # copies from now on
        out = model(row(backend, 1.0, -2.0))
    backend.add_(out, 1.0)
    np.testing.assert_array_equal(backend.numpy(cache["0"]), [[-2.5, -3.5]])


def test_training_mode_is_learned_apart(backend: Any) -> None:
    def forward(self: Any, x: Any) -> Any:
        h = self.lin(x)
        if self.training:  # as Dropout(inplace=True) does
            backend.add_(h, 1.0)
        return h

    model = backend.module(forward, {"lin": linear(backend)})
    for training in (False, False, True, True, False):
        backend.set_training(model, training)
        with unihook.capture(model) as cache:
            model(row(backend, 1.0, -2.0))
        np.testing.assert_array_equal(backend.numpy(cache["lin"]), [[-2.5, -3.5]])


def test_inputs_learned_then_modified_raise(backend: Any) -> None:
    _needs_versions(backend)
    model = backend.sequential(linear(backend))
    x = row(backend, 1.0, -2.0)
    with unihook.capture(model, inputs=True):
        model(x)
    with unihook.capture(model, inputs=True) as cache:
        model(x)
    backend.add_(x, 1.0)
    with pytest.raises(StaleCaptureError, match="positional args of module '0'"):
        cache.inputs["0"]


# -- structured outputs ----------------------------------------------------------------------


def _structure(value: Any) -> Any:
    """Types and non-tensor leaves, tensors replaced by their values: what must survive."""
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        items = [(k, _structure(v)) for k, v in value.items()] if isinstance(value, dict) else []
        return (type(value), [(f.name, _structure(getattr(value, f.name))) for f in fields], items)
    if isinstance(value, dict):
        return (type(value), [(k, _structure(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value), [_structure(v) for v in value])
    if hasattr(value, "shape"):
        return np.asarray(value).tolist()
    return value


class _ModelOutput(collections.OrderedDict[str, Any]):
    """transformers' ModelOutput in short: a dataclass whose fields are also its items."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            dict.__setitem__(self, field.name, getattr(self, field.name))


@dataclasses.dataclass
class LMOut(_ModelOutput):
    logits: Any = None
    hidden: Any = None


STRUCTURED: dict[str, Callable[[Any], Any]] = {
    "model_output": lambda h: LMOut(h * 2, h),
    "namedtuple": lambda h: Pair(h, h * 2),
    "dict": lambda h: {"b": h, "a": [h * 2, None, 3]},
    "ordered": lambda h: collections.OrderedDict(z=h, y=(h * 2,)),
    "list": lambda h: [h, (h * 2, "tag")],
    "dataclass": lambda h: Out(h, Pair(h * 2, {"k": h})),
    "frozen": lambda h: Frozen([h]),
}


# torch's (and paddle's) backward hooks skip dict / list / dataclass outputs, with this warning
@pytest.mark.filterwarnings("ignore:For backward hooks to be called")
@pytest.mark.parametrize("kind", list(STRUCTURED))
@pytest.mark.parametrize("mode", ["keep", "reuse", "grads"])
def test_structured_outputs_keep_their_type(backend: Any, kind: str, mode: str) -> None:
    make = STRUCTURED[kind]

    def forward(self: Any, x: Any) -> Any:
        return make(self.act(self.lin(x)))

    def parent(self: Any, x: Any) -> Any:
        out = self.inner(x)
        # modify the returned tensors in place; with backward hooks through the output: act
        # returned its input, and that input changed in place would leave the output stale
        # (torch: an error, test_inplace_aliases_native.py)
        target = _first_tensor(backend, out) if mode == "grads" else self.inner.act.last
        backend.add_(target, 100.0)
        return out

    def act(self: Any, h: Any) -> Any:
        self.last = h
        return h

    inner = backend.module(forward, {"lin": linear(backend), "act": backend.module(act)})
    model = backend.module(parent, {"inner": inner})
    plain = make(row(backend, -2.5, -3.5))
    expected = _structure(_numpy_tree(backend, plain))
    for _ in range(2):
        x = backend.tensor([[1.0, -2.0]], requires_grad=mode == "grads")
        with unihook.capture(model, reuse=mode == "reuse", grads=mode == "grads") as cache:
            out = model(x)
            if mode == "grads":
                backend.backward(_first_tensor(backend, out).sum())
            if mode == "reuse":
                model(x)
        value = cache["inner"]
        assert type(value) is type(plain)
        assert _structure(_numpy_tree(backend, value)) == expected
    with unihook.capture(model, inputs=True) as cache:
        model(backend.tensor([[1.0, -2.0]]))
    assert type(cache.inputs["inner"]) is tuple


def _numpy_tree(kit: Any, value: Any) -> Any:
    if kit.is_tensor(value):
        return kit.numpy(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return dataclasses.replace(
            value, **{f.name: _numpy_tree(kit, getattr(value, f.name)) for f in fields}
        )
    if isinstance(value, Pair):
        return Pair(*(_numpy_tree(kit, v) for v in value))
    if isinstance(value, dict):
        return type(value)((k, _numpy_tree(kit, v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy_tree(kit, v) for v in value)
    return value


def _first_tensor(kit: Any, value: Any) -> Any:
    if kit.is_tensor(value):
        return value
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    items = value.values() if isinstance(value, dict) else value
    return next(_first_tensor(kit, v) for v in items if _has_tensor(kit, v))


def _has_tensor(kit: Any, value: Any) -> bool:
    if kit.is_tensor(value):
        return True
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(_has_tensor(kit, v) for v in value)


# -- generated models: capture against native hooks that copy --------------------------------

LAYERS = ("linear", "relu", "relu_inplace", "add_inplace", "identity", "scale", "twice")


def build(kit: Any, plan: list[tuple[str, bool]]) -> Any:
    """A Sequential of layers; `wrapped` ones sit in a parent whose forward then modifies the
    child's output in place (``out += 1`` in torchvision style: `add_` for paddle)."""

    def layer(kind: str) -> Any:
        if kind == "linear":
            return kit.linear(3, 3)
        if kind == "relu":
            return kit.relu_module()
        if kind == "relu_inplace":
            return kit.relu_module(inplace=True)
        if kind == "add_inplace":
            return add_inplace(kit, -0.5)
        if kind == "identity":
            return identity(kit)
        if kind == "twice":  # one module called twice, its first output modified in place
            return kit.module(
                lambda self, x: self.act(kit.add_(self.act(x), -0.25)),
                {"act": kit.relu_module(inplace=True)},
            )
        return kit.module(lambda self, x: x * 2)

    def bumped(self: Any, x: Any) -> Any:
        out = self.child(x)
        kit.add_(out, 1.0)
        return out

    kit.seed(0)
    layers = [kit.module(bumped, {"child": layer(k)}) if w else layer(k) for k, w in plan]
    return kit.sequential(*layers)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(st.tuples(st.sampled_from(LAYERS), st.booleans()), min_size=1, max_size=6),
    forwards=st.integers(1, 2),
    reuse=st.booleans(),
    grads=st.booleans(),  # module backward hooks hand the module's outputs through identities
    seed=st.integers(0, 2**16),
)
def test_generated_models_match_native_copies(
    backend: Any, plan: list[tuple[str, bool]], forwards: int, reuse: bool, grads: bool, seed: int
) -> None:
    model = build(backend, plan)
    rng = np.random.default_rng(seed)
    for _ in range(3):  # learning, then learned
        seen, remove = native_copies(backend, model)
        try:
            with unihook.capture(model, inputs=True, reuse=reuse, grads=grads) as cache:
                for _ in range(forwards):
                    model(backend.tensor(rng.standard_normal((2, 3))))
        finally:
            remove()
        assert_matches(backend, cache, seen, forwards, reuse)
