"""What unihook walks to find tensors (`unihook.backend.walk_tensors`, `items_of`: the
arguments' check and torch's `_held_in`), attacked by helper-51 on 8ec6f1a: budgets, mapping
wrappers, mangled slots, namedtuple subclasses, `functools.partial`, a raising
`__getattribute__`.

Rule (README "Forward gets one alias per argument", `watch_inputs`): the same program without
unihook hooks gives the same x.grad, or unihook raises `InPlaceError`; never a silently
different number, and never an exception from unihook's own machinery.

Each test here failed on 8ec6f1a. The `args_replaced` count (torch's own backward hooks
before / during the call, global ones, legacy, forward pre-hooks returning new args,
`with_kwargs`, nested modules, keyword and two-tensor calls: 1780 combinations) held.
"""

from __future__ import annotations

import collections
import functools
import sys
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import unihook  # noqa: E402

# (torch's `_held_in` runs after reference counts measured on Python 3.11 only)
ON_311 = sys.version_info[:2] == (3, 11)

X = [1.0, -2.0, 3.0]
EXACT = [8.0, -16.0, 24.0]  # x.grad of `a.mul_(2); return a * other` with other = a's tensor


class _Shared(torch.nn.Module):
    """forward changes its first argument in place, then reads the same tensor found in
    `holder` (by `getter`): exact without hooks; with them the alias's change misses it."""

    def forward(self, a: Any, filler: Any, holder: Any, getter: Any) -> Any:  # noqa: D102
        a.mul_(2)
        return a * getter(holder)


def _grad_or_refused(x: Any, m: Any, hooked: bool, run: Callable[[], Any]) -> Any:
    """x.grad after `run()` (a forward and backward of `m`, hooked or not), or "InPlaceError"."""
    handle = unihook.register_full_backward_hook(m, lambda *a: None) if hooked else None
    try:
        run()
        return x.grad.tolist()
    except unihook.InPlaceError:
        return "InPlaceError"
    finally:
        if handle is not None:
            handle.remove()


def _shared_grad(make_holder: Any, getter: Any, filler: Any = (), hooked: bool = True) -> Any:
    x = torch.tensor(X, requires_grad=True)
    h = x * 1
    m = _Shared()
    return _grad_or_refused(
        x, m, hooked, lambda: m(h, filler, make_holder(h), getter).sum().backward()
    )


def _check_shared(make_holder: Any, getter: Any, filler: Any = ()) -> None:
    assert _shared_grad(make_holder, getter, filler, hooked=False) == EXACT
    assert _shared_grad(make_holder, getter, filler) == "InPlaceError"


def test_walk_read_budget_used_up_by_an_earlier_list_of_ints() -> None:
    """`m(h, list(range(5000)), [h])`: the ints (not queued, but read) use up `_READ` (4096)
    before the later argument `[h]` is expanded: `_walk` is breadth first so that one large
    container does not blind the others, yet here it does.
    Expected InPlaceError (as with 100 ints); got x.grad [6, -12, 18] (silent, exact is
    [8, -16, 24]). A list of token ids beside a dict of tensors is a common call."""
    _check_shared(lambda h: [h], lambda o: o[0], filler=list(range(5000)))


def test_walk_chainmap_of_userdict() -> None:
    """README names UserDict and ChainMap among the mappings looked in; a ChainMap over a
    UserDict costs 3 levels (`maps` list, the UserDict, its `data`) and the tensor is past
    `levels` = 3. Expected InPlaceError; got [6, -12, 18] (silent)."""
    _check_shared(lambda h: collections.ChainMap(collections.UserDict(k=h)), lambda o: o["k"])


def test_walk_name_mangled_slot() -> None:
    """`__slots__ = ("__h",)` stores `_Priv__h`; `items_of` reads `__h`, gets
    AttributeError and skips it. Expected InPlaceError; got [6, -12, 18] (silent)."""

    class Priv:
        __slots__ = ("__h",)

        def __init__(self, h: Any) -> None:
            self.__h = h

        def get(self) -> Any:
            return self.__h

    _check_shared(Priv, lambda o: o.get())


def test_walk_namedtuple_subclass_extra_attribute() -> None:
    """A namedtuple subclass without `__slots__` has a `__dict__`: items_of returns only its
    tuple items. Expected InPlaceError; got [6, -12, 18] (silent)."""
    base = collections.namedtuple("Base", "a b")

    class NT(base):
        pass

    def make(h: Any) -> Any:
        o = NT(1, 2)
        o.extra = h
        return o

    _check_shared(make, lambda o: o.extra)


def test_walk_functools_partial() -> None:
    """A `functools.partial` argument holding the tensor (`args`/`keywords` are C fields,
    not in `__dict__`). Expected InPlaceError; got [6, -12, 18] (silent). Low severity."""
    _check_shared(lambda h: functools.partial(print, h), lambda o: o.args[0])


def test_walk_object_raising_in_getattribute_raises_from_unihook() -> None:
    """An argument whose `__getattribute__` raises (forward never touches it): without hooks
    the call works; with them the torch backend's `is_tensor`
    (`torch.Tensor.__instancecheck__`) reads its `__class__` inside `_nested` and the
    RuntimeError escapes from unihook's machinery. Expected InPlaceError (the tensor is in
    the same list); got RuntimeError('attribute read: __class__'). Low severity."""

    class Hostile:
        def __getattribute__(self, name: Any) -> Any:
            raise RuntimeError("attribute read: " + name)

    _check_shared(lambda h: [h, Hostile()], lambda o: o[0])


class _KeepsView(torch.nn.Module):
    def __init__(self, vocab: Any) -> None:
        super().__init__()
        self.vocab = vocab  # a large plain attribute, set before the cache below
        self.cache = None

    def forward(self, h: Any) -> Any:  # noqa: D102
        self.cache = [h[:2]]
        return h * 2


def _kept_view_grad(vocab: Any, hooked: Any = True) -> Any:
    x = torch.tensor(X, requires_grad=True)
    h = x * 1
    m = _KeepsView(vocab)

    def run() -> None:
        out = m(h)
        h.mul_(2)
        (out.sum() + (m.cache[0] * 3).sum()).backward()

    return _grad_or_refused(x, m, hooked, run)


@pytest.mark.parametrize(
    "vocab",
    [list(range(9000)), [[i] for i in range(2000)]],
    ids=["9000-ints", "2000-lists"],
)
@pytest.mark.skipif(not ON_311, reason="reference counts measured on Python 3.11 only")
def test_held_in_budget_used_up_by_an_earlier_attribute(vocab: Any) -> None:
    """torch `_held_in`: a module attribute `self.vocab` (9000 ints: `_READ` 8192; or 2000
    small lists: `_LOOKED` 1024) set before `self.cache = [h[:2]]` uses up the budget when
    read first, so the kept view in `cache` is not found (with 100 ints it is). Expected
    InPlaceError; got x.grad [5, 5, 2] (silent, exact [8, 8, 2])."""
    assert _kept_view_grad(vocab, hooked=False) == [8.0, 8.0, 2.0]
    assert _kept_view_grad(vocab) == "InPlaceError"


def _paddle_grad(filler: Any, make_holder: Any, getter: Any, hooked: Any = True) -> Any:
    paddle = pytest.importorskip("paddle")

    class M(paddle.nn.Layer):
        def forward(self, a: Any, filler: Any, holder: Any) -> Any:  # noqa: D102
            a.multiply_(paddle.to_tensor(2.0))
            return a * getter(holder)

    x = paddle.to_tensor(X, stop_gradient=False)
    h = x * 1
    m = M()
    return _grad_or_refused(x, m, hooked, lambda: m(h, filler, make_holder(h)).sum().backward())


@pytest.mark.parametrize(
    "case",
    ["ints-before", "chainmap-userdict", "partial"],
)
def test_paddle_walk_misses(case: Any) -> None:
    """paddle, the same `_walk` misses: expected InPlaceError; got [6, -12, 18] (silent)."""
    filler, make, get = {
        "ints-before": (list(range(5000)), lambda h: [h], lambda o: o[0]),
        "chainmap-userdict": (
            [1],
            lambda h: collections.ChainMap(collections.UserDict(k=h)),
            lambda o: o["k"],
        ),
        "partial": ([1], lambda h: functools.partial(print, h), lambda o: o.args[0]),
    }[case]
    assert _paddle_grad(filler, make, get, hooked=False) == EXACT
    assert _paddle_grad(filler, make, get) == "InPlaceError"
