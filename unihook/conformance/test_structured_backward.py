"""Structured outputs through module backward hooks keep their type (issue 11, class 6).

Torch's BackwardHook traverses a tuple output (namedtuples and ``torch.return_types``
included) and gives each tensor a grad_output slot; anything else is one value. Whatever the
hooks do, the caller gets back the type the module returned.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

import unihook


class Pair(NamedTuple):
    values: Any
    scale: Any


KINDS = ["full_backward", "full_backward_pre"]


def _register(kind: str, module: Any, seen: list[Any]) -> unihook.Handle:
    if kind == "full_backward":
        return unihook.register_full_backward_hook(module, lambda m, gi, go: seen.append(go))
    return unihook.register_full_backward_pre_hook(module, lambda m, go: seen.append(go))


@pytest.mark.parametrize("kind", KINDS)
def test_namedtuple_output_keeps_its_type(backend: Any, kind: str) -> None:
    m = backend.module(lambda self, x: Pair(x * 2, 3))
    seen: list[Any] = []
    handle = _register(kind, m, seen)
    x = backend.tensor([1.0, 2.0], requires_grad=True)
    out = m(x)
    assert type(out) is Pair and out.scale == 3
    backend.backward(unihook.ops.sum(out.values))
    handle.remove()
    assert len(seen) == 1 and len(seen[0]) == 2 and seen[0][1] is None
    np.testing.assert_array_equal(backend.numpy(seen[0][0]), [1.0, 1.0])
    np.testing.assert_array_equal(backend.grad(x), [2.0, 2.0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("container", ["list", "dict", "nested_tuple"])
def test_other_containers_come_back_unchanged(backend: Any, kind: str, container: str) -> None:
    build = {
        "list": lambda x: [x * 2, x],
        "dict": lambda x: {"a": x * 2},
        "nested_tuple": lambda x: (x * 2, (x * 3, x * 4)),
    }[container]
    m = backend.module(lambda self, x: build(x))
    handle = _register(kind, m, [])
    x = backend.tensor([1.0, 2.0], requires_grad=True)
    if container == "nested_tuple":
        out = m(x)
    else:
        with pytest.warns(UserWarning, match="module output should be a Tensor or a tuple"):
            out = m(x)
    handle.remove()
    assert type(out) is type(build(x))
    if container == "nested_tuple":
        assert type(out[1]) is tuple and len(out[1]) == 2
