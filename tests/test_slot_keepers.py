"""A module keeping its output in a ``__slots__`` attribute (not in ``__dict__``) keeps it as one
keeping it in ``__dict__`` does: GradientMonitor leaves its output out (or records torch's
native norm), where until 2026-12-04 it recorded the sum of every use of the output (helper-95's
FINDING 10). `unihook.ops.slot_values` reads the slots, which every backend's
`attribute_values` adds."""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any

import pytest
from monitor_oracle import broken, names

from unihook.ops import slot_values

torch = pytest.importorskip("torch")
nn = torch.nn


class _Base(nn.Module):
    __slots__ = ("kept_in_base",)


def _keeper(where: str) -> Any:
    """A block whose forward keeps its output in the slot `where` names ("list": in a list in a
    slot; "unset": keeps nothing, its slot never set)."""

    class Keeper(_Base):
        __slots__ = ("out", "__private", "holder")

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            y = self.fc(x) * 1.0
            if where == "slot":
                self.out = y
            elif where == "private":
                self.__private = y
            elif where == "base":
                self.kept_in_base = y
            elif where == "list":
                self.holder = [y]
            return y

        def kept(self) -> Any:
            return {
                "slot": lambda: self.out,
                "private": lambda: self.__private,
                "base": lambda: self.kept_in_base,
                "list": lambda: self.holder[0],
            }[where]()

    return Keeper()


class _Net(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.k = _keeper(where)
        self.b = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.b(torch.tanh(self.k(x)))


@pytest.mark.parametrize("where", ["slot", "private", "base", "list", "unset"])
def test_an_output_kept_in_a_slot_is_seen(where: str) -> None:
    torch.manual_seed(0)
    model = _Net(where)

    def loss(model: Any, out: Any) -> Any:
        extra = 0.0 if where == "unset" else 3 * (model.k.kept() ** 2).sum()
        return (out * out).sum() + extra

    assert broken(model, names(model), torch.randn(3, 4), loss) == []


def test_slot_values_reads_set_slots_only_and_runs_no_property() -> None:
    class A:
        __slots__ = "single"

    class B(A):
        __slots__ = ("__hidden", "unset", "__weakref__")

        def __init__(self) -> None:
            self.single = 1
            self.__hidden = 2

    class C(B):
        @property
        def unset(self) -> Any:  # (a property over a base's slot: not run)
            raise AssertionError("ran")

    assert sorted(slot_values(C())) == [1, 2]
    assert slot_values(object()) == [] and slot_values(nn.Linear(1, 1)) == []


def test_slot_values_finds_slots_however_declared_and_keeps_no_class() -> None:
    """Slots given as an iterator (consumed as the class is made), a private one of a class
    named with underscores only (not mangled), ``__slots__`` reassigned after: read from the
    classes' descriptors (helper-121's FINDING 5). The table keeps no class alive (its
    FINDING 4)."""
    import gc
    import weakref

    class Iterated:
        __slots__ = iter(("a", "b"))

    class ___:
        __slots__ = ("__p",)

        def __init__(self) -> None:
            self.__p = "private"

    class Reassigned:
        __slots__ = ("c",)

    Reassigned.__slots__ = ()  # type: ignore[misc]

    class Deleted:
        __slots__ = ("d",)

    del Deleted.__slots__  # (its slot lives on: helper-124's FINDING 6, until 2026-12-04 unread)

    class OverPartial(functools.partial):  # (a C type's members are no slots: not read)
        __slots__ = ("e",)

    first, second, third, fourth = Iterated(), ___(), Reassigned(), Deleted()
    first.a, first.b, third.c, fourth.d = 1, 2, 3, 4  # type: ignore[attr-defined]
    assert sorted(slot_values(first)) == [1, 2]
    assert slot_values(second) == ["private"] and slot_values(third) == [3]
    assert slot_values(fourth) == [4]
    over = OverPartial(print, 5)
    over.e = 6
    assert slot_values(over) == [6]
    gone = weakref.ref(Iterated)
    del Iterated, first
    gc.collect()
    assert gone() is None


def test_paddle_a_slot_keeper_is_told_as_a_dict_keeper() -> None:
    paddle = pytest.importorskip("paddle")
    from unihook.recipes import GradientMonitor

    def run(in_slot: bool) -> tuple[Any, list[str]]:
        class Keeper(paddle.nn.Layer):
            __slots__ = ("out",) if in_slot else ()

            def __init__(self) -> None:
                super().__init__()
                self.fc = paddle.nn.Linear(4, 4)

            def forward(self, x: Any) -> Any:
                y = self.fc(x) * 1.0
                self.out = [y]  # (a tensor attribute paddle files among its buffers)
                return y

        paddle.seed(0)
        model = paddle.nn.Sequential(Keeper(), paddle.nn.Tanh(), paddle.nn.Linear(4, 4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with GradientMonitor(model) as monitor:
                out = model(paddle.ones([3, 4]))
                assert ("out" in vars(model[0])) is not in_slot
                ((out * out).sum() + 3 * (model[0].out[0] ** 2).sum()).backward()
        said = [str(w.message) for w in caught if "GradientMonitor" in str(w.message)]
        entry = {k: round(v, 5) for k, v in monitor.history[-1].items()}
        return entry, said

    assert run(True) == run(False)


def test_slot_values_after_the_bases_change_and_with_a_foreign_descriptor() -> None:
    """A mixin put into a class's bases after its first call moves its base's slot in the
    MRO: still found (helper-122's FINDING 2: it was skipped, the output's norm wrong); a
    descriptor of another class's put under a slot's name is not read (no TypeError: its
    FINDING 3); a C type's members are not slots (its FINDING 4)."""
    import functools

    class Base:
        __slots__ = ("out",)

    class Keeper(Base):
        pass

    class Mixin:
        pass

    class Other:
        __slots__ = ("out",)

    keeper = Keeper()
    keeper.out = "kept"  # type: ignore[attr-defined]
    assert slot_values(keeper) == ["kept"]
    Keeper.__bases__ = (Mixin, Base)
    assert slot_values(keeper) == ["kept"]
    type.__setattr__(Base, "out", vars(Other)["out"])
    assert slot_values(keeper) == []

    class Partial(functools.partial):  # type: ignore[type-arg]
        pass

    assert slot_values(Partial(print, 1)) == []


def test_slot_values_beyond_its_table_of_live_types() -> None:
    """More live types with slots than the table keeps: each still read right, the table
    bounded (helper-122's FINDING 1: a full table of live types was rescanned at every call
    of a type left out, 1.8 ms a call)."""
    from unihook import ops

    made = []
    for i in range(ops._SLOTS_KEPT + 50):
        cls = type(f"Slotted{i}", (), {"__slots__": ("v",)})
        obj = cls()
        obj.v = i
        made.append(obj)
        assert slot_values(obj) == [i]
        assert len(ops._slots) <= ops._SLOTS_KEPT
    assert [slot_values(obj) for obj in made[:3]] == [[0], [1], [2]]


def _swapped_keeper() -> tuple[Any, type]:
    """A keeper whose class, read once with base Old, is given base New (both with slot
    ``out``), and Old."""

    class Old:
        __slots__ = ("out",)

    class New:
        __slots__ = ("out",)

    class Keeper(Old):
        pass

    keeper = Keeper()
    keeper.out = "kept"  # type: ignore[attr-defined]
    assert slot_values(keeper) == ["kept"]
    Keeper.__bases__ = (New,)
    return keeper, Old


def test_slot_values_after_a_base_swapped_out_is_gone() -> None:
    """A class given other bases after its first call, the old base then collected: its slot
    (the same storage, now the new base's) is still read (helper-123's FINDING 3)."""
    import gc

    keeper, old = _swapped_keeper()
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None
    assert slot_values(keeper) == [keeper.out]


def test_slot_values_after_a_base_swapped_out_lives_on() -> None:
    """The same with the old base alive (another class, a module, still refers to it): its
    descriptor no longer applies to the keeper, and the slot is found again in the new base
    (helper-124's FINDING 2: nothing was read, and GradientMonitor recorded the sum)."""
    keeper, old = _swapped_keeper()  # (`old` held to the end)
    keeper.out = "kept again"
    assert slot_values(keeper) == ["kept again"]
    assert slot_values(keeper) == ["kept again"]  # (the table rescanned once)
    assert old.__slots__ == ("out",)
