"""The input aliases a module keeps (`self.inp = h`), for a backend whose in-place ops cannot
be seen (paddle, MindSpore): module backward hooks hand forward an alias of the caller's
tensor, with a history of its own, so an in-place op on one after the call does not reach the
other's history, and a later use of the other would give a wrong gradient (without hooks they
are one tensor). Such a use raises `InPlaceError` instead, as torch's own backward hook does
(torch's backend carries the op: ``unihook_torch._alias``).

A backend's optional `Autograd.watch_inputs` finds the kept aliases (`kept_inputs`) and puts a
check in front of the later uses of each side (`check_kept_input`)."""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Collection, Iterator, Sequence

from ._describe import Site
from .errors import InPlaceError

__all__ = ["check_kept_input", "kept_inputs"]

Grads = Sequence[Any]

# An input alias's references in `watch_inputs` when nothing keeps it: the args, the
# generator's local, getrefcount's argument (a C++ reference, a grad node saving it, a view of
# it, counts none on paddle and MindSpore). Python 3.11's: on another version none is told.
_FREE_INPUT = 3
_COUNTS_MEASURED = sys.version_info[:2] == (3, 11)


def kept_inputs(
    args: Sequence[Any],
    tensor_idx: Sequence[int],
    originals: Sequence[Any],
    returned: Collection[int],
    requires_grad: Callable[[Any], bool],
) -> Iterator[tuple[Any, Any]]:
    """(alias, the caller's tensor) for each input alias something holds after forward (an
    attribute, a container, a closure, a submodule, a weak reference): a reference beyond the
    frames'. Not those forward returned (`returned`: the output's references count too)."""
    if not _COUNTS_MEASURED:
        return
    for k, i in enumerate(tensor_idx):
        alias, original = args[i], originals[k]
        if original is None or alias is original or k in returned or not requires_grad(alias):
            continue
        if sys.getrefcount(alias) > _FREE_INPUT or weakref.getweakrefcount(alias):
            yield alias, original


def check_kept_input(
    alias: Any,
    original: Any,
    site: Site,
    *,
    identity: Callable[..., Sequence[Any]],
    rebase: Callable[[Any, Any], Any],
    node_of: Callable[[Any], object],
    version: Callable[[Any], int],
    counter_of: Callable[[Any], Any] | None,
    caller_side: bool,
) -> None:
    """Later uses of the kept `alias` run through a check that raises when the caller's tensor
    `original` was changed in place since; with `caller_side`, later uses of `original` through
    one that raises when the alias was. Each side takes a check node's history in place
    (`identity`, then `rebase`, which must leave the version counter as it was); the values,
    memory and counter stay its own.

    `node_of(t)`: what identifies `t`'s grad node (an in-place op on `t` gives it another).
    `counter_of(t)`: a tensor sharing `t`'s version counter but not its history (no cycle), read
    by `version`; with it a check raises only once the counter moved, and where the other side
    is gone (what changed it cannot be told) only for the alias's check. None: the framework
    has none; then a gone caller's tensor is refused."""
    checks = [(alias, _Unchanged(original, True, _kept_read(site), node_of, version, counter_of))]
    if caller_side:
        checks.append(
            (original, _Unchanged(alias, False, _caller_read(site), node_of, version, counter_of))
        )
    for user, check in checks:
        rebase(user, identity([user], check, False, site)[0])
    for _, check in checks:
        check.settle()


class _Unchanged:
    """The backward check of one side: whether `other` was changed in place since `settle`."""

    __slots__ = ("other", "counter", "version", "node", "gone_changed", "error", "node_of", "read")

    def __init__(
        self,
        other: Any,
        gone_changed: bool,
        error: Callable[[], InPlaceError],
        node_of: Callable[[Any], object],
        version: Callable[[Any], int],
        counter_of: Callable[[Any], Any] | None,
    ) -> None:
        self.other = weakref.ref(other)
        self.counter = None if counter_of is None else counter_of(other)
        self.gone_changed = gone_changed
        self.error = error
        self.node_of, self.read = node_of, version
        self.version: int | None = None
        self.node: object = None

    def settle(self) -> None:
        """From now on: once both sides took their checks (a rebase moves a grad node)."""
        if self.counter is not None:
            self.version = self.read(self.counter)
        self.node = self.node_of(self.other())

    def __call__(self, grads: Grads) -> Grads:
        if self.counter is not None and self.read(self.counter) == self.version:
            return grads  # (the same list: no copies)
        other = self.other()
        if self.gone_changed if other is None else self.node_of(other) != self.node:
            raise self.error()
        return grads


def _kept_read(site: Site) -> Callable[[], InPlaceError]:
    return lambda: InPlaceError(
        f"{site}: the module kept the input its forward got (`self.inp = h`, in a list, a "
        "closure), and the kept tensor was used after the caller changed its own in place. "
        "Without hooks the two are one tensor, which has the change; with backward hooks the "
        "kept one is an alias whose history cannot take it on this framework (torch's own "
        "backward hook raises here too). Keep a copy (`self.inp = h.clone()`), or change a "
        "copy of the tensor after the call"
    )


def _caller_read(site: Site) -> Callable[[], InPlaceError]:
    return lambda: InPlaceError(
        f"{site}: the module kept the input its forward got (`self.inp = h`, in a list, a "
        "closure), the kept tensor was changed in place after the call, and the caller's "
        "tensor was then used. Without hooks the two are one tensor, which has the change; "
        "with backward hooks the kept one is an alias whose change cannot reach the caller's "
        "history on this framework. Keep a copy (`self.inp = h.clone()`), or change a copy"
    )
