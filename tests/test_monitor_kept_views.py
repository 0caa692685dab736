"""GradientMonitor where a module keeps, as its call ends, not its output itself but a view of
it (``y[:]``, ``y.view(-1)``, a transpose, a chunk), a value made from it (``y * 2``), another
tensor object of it (``y.as_subclass``), or the output in a namespace or a dataclass
attribute, and the model reads that before the forward ends (helper-178's FINDING 2,
helper-179's FINDING 4).

The reads reach the output, whose gradient hook sums them, where torch's hook on the call sees
what comes through the output returned only: the entry is left out, warned (until 2026-12-07
'blk' recorded 36.36 where torch's hook sees 6.78, silently). What a module keeps that was made
before its output (an attention map, its input) or detached is no keep: its entry stays,
torch's number. The oracle: torch's own hooks (tests/monitor_oracle.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from monitor_oracle import broken, monitored, names, square  # noqa: E402


class _Sub(torch.Tensor):
    pass


@dataclasses.dataclass
class _Cache:
    out: Any


# what the keeper keeps of its output y, and how the model reads it back as y's shape
_MADE: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "slice": (lambda y: y[:], lambda k: k),
    "view": (lambda y: y.view(-1), lambda k: k.view(3, 4)),
    "transpose": (lambda y: y.t(), lambda k: k.t()),
    "chunk": (lambda y: y.chunk(2, dim=1), lambda k: torch.cat(k, dim=1)),
    "made_from": (lambda y: y * 2.0, lambda k: k),
    "subclass": (lambda y: y.as_subclass(_Sub), lambda k: k.as_subclass(torch.Tensor)),
    "namespace": (lambda y: SimpleNamespace(out=y), lambda k: k.out),
    "dataclass": (lambda y: _Cache(y), lambda k: k.out),
    "view_in_a_list": (lambda y: [y[:, :2], y[:, 2:]], lambda k: torch.cat(k, dim=1)),
}


class _Keeper(nn.Module):
    def __init__(self, made: Callable[[Any], Any]) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.made = made

    def forward(self, x: Any) -> Any:
        y = self.fc(x) * 1.0
        self.out = self.made(y)
        return y


class _Blk(nn.Module):
    def __init__(self, made: Callable[[Any], Any]) -> None:
        super().__init__()
        self.k = _Keeper(made)

    def forward(self, x: Any) -> Any:
        return self.k(x)


class _Model(nn.Module):
    def __init__(self, keep: str) -> None:
        super().__init__()
        self.blk = _Blk(_MADE[keep][0])
        self.head = nn.Linear(4, 4)
        self.read = _MADE[keep][1]

    def forward(self, x: Any) -> Any:
        out = self.head(torch.tanh(self.blk(x))) + 3 * self.read(self.blk.k.out)
        self.blk.k.out = None
        return out


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("where", ["listed", "all"])
@pytest.mark.parametrize("keep", sorted(_MADE))
def test_a_kept_view_or_value_made_from_the_output_leaves_the_entry_out(
    keep: str, where: str, every: int
) -> None:
    torch.manual_seed(0)
    model = _Model(keep)
    x = torch.randn(3, 4)
    chosen = ["blk", "head"] if where == "listed" else names(model)
    kwargs: dict[str, Any] = {"every": every}
    if where == "listed":
        kwargs["where"] = chosen
    assert broken(model, chosen, x, square, **kwargs) == []
    step, said = monitored(model, x, square, **kwargs)
    assert "blk" not in step and any("'blk'" in s for s in said), (step, said)
    assert "head" in step


class _NoKeep(nn.Module):
    """Keeps what it made before its output (an attention-like map, its input, a detached
    copy): reads of those do not reach its output."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.v = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        attention = torch.softmax(self.q(x) @ x.t(), dim=-1)
        self.attention = attention
        self.seen = SimpleNamespace(input=x, scores=attention[:, :2])
        y = attention @ self.v(x)
        self.copy = y.detach()
        return y


class _ReadsBack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blk = _NoKeep()
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        out = self.head(self.blk(x))
        return out + self.blk.attention.sum() + self.blk.seen.scores.sum() * self.blk.copy.sum()


@pytest.mark.parametrize("where", ["listed", "all"])
def test_what_a_module_made_before_its_output_is_no_keep(where: str) -> None:
    torch.manual_seed(0)
    model = _ReadsBack()
    x = torch.randn(3, 4, requires_grad=True)
    chosen = ["blk", "head"] if where == "listed" else names(model)
    kwargs: dict[str, Any] = {"where": chosen} if where == "listed" else {}
    assert broken(model, chosen, x, square, **kwargs) == []
    step, said = monitored(model, x, square, **kwargs)
    assert not said and "blk" in step and "head" in step, (step, said)


class _Tap(nn.Module):
    def forward(self, y: Any) -> Any:
        self.kept = y * 2.0
        return y.sum() * 0.0


class _Tapped(nn.Module):
    """Calls a tap on its output before returning it: the tap keeps a value made from it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.tap = _Tap()

    def forward(self, x: Any) -> Any:
        y = self.lin(x) * 1.0
        self.tap(y)
        return y


class _ReadsTheTap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = _Tapped()
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        y = self.p(x)
        out = self.head(y + self.p.tap.kept)
        self.p.tap.kept = None
        return out


@pytest.mark.parametrize("where", ["listed_with_the_tap", "all"])
def test_a_monitored_tap_keeping_a_value_made_from_its_callers_output(where: str) -> None:
    """The tap is monitored itself, so the look at its caller's call skips its insides: the
    tap's own look now says its argument is kept, and the caller returning it is left out
    (until 2026-12-07 'p' recorded 15.06 where torch's hook sees 5.02: helper-191's
    FINDING 2)."""
    torch.manual_seed(0)
    model = _ReadsTheTap()
    x = torch.randn(3, 4)
    chosen = ["p", "p.tap", "head"] if where != "all" else names(model)
    kwargs: dict[str, Any] = {"where": chosen} if where != "all" else {}
    assert broken(model, chosen, x, square, **kwargs) == []
    step, said = monitored(model, x, square, **kwargs)
    assert "p" not in step and any("'p'" in s for s in said), (step, said)


class _Proxy:
    """A lazy proxy: reading its class raises until it is resolved."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:  # noqa: PLW3201
        raise RuntimeError("not resolved yet")


@pytest.mark.parametrize("held", ["proxy", "mock"])
def test_odd_objects_a_module_holds_are_passed(held: str) -> None:
    """An object whose ``__class__`` raises, and a ``Mock(spec=torch.Tensor)``, held as
    attributes: the look tells tensors by type (until 2026-12-07 the forward raised from the
    look: helper-191's FINDING 4)."""
    from unittest import mock

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[0].__dict__["held"] = _Proxy() if held == "proxy" else mock.Mock(spec=torch.Tensor)
    step, said = monitored(model, torch.randn(3, 4), square)
    assert not said and {"0", "1"} <= set(step), (step, said)


class _TapReturningIt(nn.Module):
    def forward(self, y: Any) -> Any:
        self.kept = y * 2.0
        return y


class _Wrapping(nn.Module):
    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return self.inner(*args)


class _TappedBy(nn.Module):
    def __init__(self, tap: Any) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.tap = tap

    def forward(self, x: Any) -> Any:
        y = self.fc(x)  # (hooked where fc is monitored: the tap's argument was returned before)
        self.tap(y)
        return y


class _ReadsWhatWasKept(nn.Module):
    def __init__(self, tap: Any) -> None:
        super().__init__()
        self.p = _TappedBy(tap)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        out = self.head(self.p(x))
        kept = [m.kept for m in self.modules() if getattr(m, "kept", None) is not None]
        for m in self.modules():
            m.__dict__.pop("kept", None)
        return out + sum(k.sum() for k in kept)


@pytest.mark.parametrize(
    ("tap", "where"),
    [
        *[("returning_it", w) for w in (None, ["p"], ["p", "p.fc"], ["p", "p.tap"])],
        *[("wrapped", w) for w in (None, ["p"], ["p", "p.tap"], ["p", "p.tap.inner"])],
    ],
)
def test_a_tap_keeping_an_argument_an_earlier_call_returned(
    tap: str, where: list[str] | None
) -> None:
    """``y = self.fc(x); self.tap(y); return y``: fc's hook counts the tap's reads (torch's
    too), p's does not (torch's sees what comes through p's output): p is left out, warned
    (until 2026-12-07 where=None, fc monitored, or the tap one module down recorded 20.30
    where torch's hook sees 0.77: helper-193's FINDINGS 1 and 2)."""
    torch.manual_seed(2)
    inner = _TapReturningIt()
    model = _ReadsWhatWasKept(inner if tap == "returning_it" else _Wrapping(inner))
    x = torch.randn(3, 4)
    chosen = names(model) if where is None else where
    kwargs: dict[str, Any] = {} if where is None else {"where": where}
    assert broken(model, chosen, x, square, **kwargs) == []
    step, said = monitored(model, x, square, **kwargs)
    assert "p" not in step and any("'p'" in s for s in said), (step, said)


class _TwoArguments(nn.Module):
    def forward(self, q: Any, k: Any) -> Any:
        self.kept = q * 2.0
        return q.sum() * 0.0


class _ReturnsTheOther(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fq = nn.Linear(4, 4)
        self.fk = nn.Linear(4, 4)
        self.tap = _TwoArguments()

    def forward(self, x: Any) -> Any:
        q, k = self.fq(x) * 1.0, self.fk(x) * 1.0
        self.tap(q, k)
        return k


def test_a_tap_keeping_one_argument_leaves_the_call_returning_another() -> None:
    """The tap keeps a value made from q, not from k, which its caller returns: the caller
    keeps its entry, torch's number (until 2026-12-07 it was left out: every argument was
    taken for kept, helper-193's FINDING 3)."""
    torch.manual_seed(2)
    model = nn.Sequential(_ReturnsTheOther(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    assert broken(model, names(model), x, square) == []
    step, said = monitored(model, x, square)
    assert "0" in step, (step, said)


class _Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, h: Any) -> Any:
        self.logits = self.fc(h)  # (kept for an auxiliary loss)
        return self.logits.detach()


_GIVEN: dict[str, Callable[[Any], Any]] = {
    "slice": lambda y: y[:, :4],
    "row": lambda y: y[0],
    "mean": lambda y: y.mean(0, keepdim=True),
    "made_from": lambda y: y * 2.0,
}


class _Probed(nn.Module):
    def __init__(self, given: Callable[[Any], Any]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.probe = _Probe()
        self.given = given

    def forward(self, x: Any) -> Any:
        y = self.lin(x) * 1.0
        self.probe(self.given(y))
        return y


class _AuxiliaryLoss(nn.Module):
    def __init__(self, given: Callable[[Any], Any]) -> None:
        super().__init__()
        self.p = _Probed(given)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        out = self.head(self.p(x))
        aux, self.p.probe.logits = self.p.probe.logits, None
        return out + aux.sum()


@pytest.mark.parametrize("given", sorted(_GIVEN))
def test_a_probe_given_a_view_or_value_of_the_output_keeping_its_logits(given: str) -> None:
    """The auxiliary-head pattern, every module monitored: a probe given ``y[:, :4]``,
    ``y[0]``, ``y.mean(0)`` or ``y * 2`` keeps its logits, read by the loss. p is left out
    (until 2026-12-07 it recorded 93.78 where torch's hook sees 6.50: helper-195's
    FINDING 1)."""
    torch.manual_seed(0)
    model = _AuxiliaryLoss(_GIVEN[given])
    x = torch.randn(3, 4)
    assert broken(model, names(model), x, square) == []
    step, said = monitored(model, x, square)
    assert "p" not in step and any("'p'" in s for s in said), (step, said)
