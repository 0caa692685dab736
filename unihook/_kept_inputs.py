"""The input aliases a module keeps (`self.inp = h`), for a backend whose in-place ops cannot
be seen (paddle, MindSpore): module backward hooks hand forward an alias of the caller's
tensor, with a history of its own, so an in-place op on one after the call does not reach the
other's history, and a later use of the other would give a wrong gradient (without hooks they
are one tensor). Such a use raises `InPlaceError` instead, as torch's own backward hook does
(torch's backend carries the op: ``unihook_torch._alias``).

A backend's optional `Autograd.watch_inputs` finds the kept aliases (`kept_inputs`) and puts a
check in front of the later uses of each side (`check_kept_input`); its optional `watch` has
the output identity of an input returned unchanged check the caller's tensor
(`check_returned_input`)."""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Callable, Collection, Hashable, Iterator, Sequence

from ._describe import Site
from ._module_backward import held_tensors
from .errors import InPlaceError

__all__ = ["check_kept_input", "check_returned_input", "kept_inputs", "note_changes"]

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
    module: Any,
    autograd: Any,
    own_weakrefs: type[weakref.ref[Any]] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """(alias, the caller's tensor) for each input alias something holds after forward (an
    attribute, a container, a closure, a submodule, a weak reference): a reference beyond the
    frames'. One forward returned (`returned`), whose count the output's references raise, is
    looked for among the module's attributes and containers instead (`held_tensors`).
    `autograd`: the backend's (`requires_grad`, `is_tensor`); the framework's own layers
    keep no input, but a forward hook on them may (a feature cache: `inp[0]`), so they are
    counted too. `own_weakrefs`: the `weakref.ref` subclass the backend makes its own weak
    references to tensors with (an identity's output, the input an inner hooked call got):
    those are not counted."""
    if not _COUNTS_MEASURED:
        return
    held: set[int] | None = None
    for k, i in enumerate(tensor_idx):
        alias, original = args[i], originals[k]
        if original is None or alias is original or not autograd.requires_grad(alias):
            continue
        inner = _kept_for.get(id(alias)) if _kept_for else None
        if inner:
            # a hooked call inside this one kept an alias of this call's alias: this call
            # keeps it too, for the caller's tensor (`m.inner.kept`, read beside `h`)
            for ref in list(inner):
                kept = ref()
                if kept is not None:
                    yield kept, original
        if k in returned:
            if held is None:
                # (the framework's own layers hold no tensor of the call: not looked through)
                own = getattr(autograd, "own_modules", None)
                framework = own is not None and type(module).__module__.startswith(own)
                held = (
                    set()
                    if framework
                    else {id(t) for _, t in held_tensors(module, autograd.is_tensor)}
                )
            if id(alias) in held:
                yield alias, original
        elif sys.getrefcount(alias) > _FREE_INPUT or _foreign_weakrefs(alias, own_weakrefs):
            yield alias, original


def _foreign_weakrefs(tensor: Any, own: type[weakref.ref[Any]] | None) -> bool:
    """Whether something other than the backend holds a weak reference to `tensor`."""
    count = weakref.getweakrefcount(tensor)
    if count and own is not None:
        count -= sum(isinstance(ref, own) for ref in weakref.getweakrefs(tensor))
    return count > 0


def check_kept_input(
    alias: Any,
    original: Any,
    site: Site,
    *,
    identity: Callable[..., Sequence[Any]],
    rebase: Callable[[Any, Any, Site], Any],
    node_of: Callable[[Any], Hashable],
    version: Callable[[Any], int],
    counter_of: Callable[[Any], Any] | None,
    caller_side: bool,
    leaf: bool = False,
) -> None:
    """Later uses of the kept `alias` run through a check that raises when the caller's tensor
    `original` was changed in place since; with `caller_side`, later uses of `original` through
    one that raises when the alias was. Each side takes a check node's history in place
    (`identity`, then `rebase`, which must leave the version counter as it was); the values,
    memory and counter stay its own.

    `node_of(t)`: what identifies `t`'s grad node (an in-place op on `t` gives it another; so
    do these checks, which `_Unchanged` tells apart), or `...` where it cannot be read because
    it is one of these checks' that already ran in this backward. `counter_of(t)`: a tensor
    sharing `t`'s version counter but not its history (no cycle), read by `version`: with it a
    check raises only once the counter moved, and, the caller's tensor gone, when the kept
    one's own node did not move (the counter moved through another); None, where the
    framework has none: a gone caller's tensor is then not refused (nothing tells what changed
    it).

    `leaf`: `original` is a leaf that requires grad, which no in-place op with a history may
    change (the framework refuses it on the leaf): the alias's check raises when the alias
    itself took one instead (the caller's leaf cannot, and has no side to check)."""
    if leaf:
        check = _Unchanged(alias, alias, False, _leaf_written(site), node_of, version, counter_of)
        checks = [(alias, check)]
    else:
        check = _Unchanged(original, alias, True, _kept_read(site), node_of, version, counter_of)
        checks = [(alias, check)]
        if caller_side:
            other = _Unchanged(
                alias, original, False, _caller_read(site), node_of, version, counter_of
            )
            checks.append((original, other))
    if caller_side:
        _note_kept(original, alias)
    for user, check in checks:
        before = node_of(user)
        # (`materialize`: as the input side's, whose node keeps nothing of its outputs; an
        # output side's kept handles on MindSpore, a cycle through C++, one per call)
        rebase(user, identity([user], check, True, site)[0], site)
        _ours(node_of(user), before, check)
    for _, check in checks:
        check.settle()


def check_returned_input(
    output: Any,
    original: Any,
    site: Site,
    *,
    node_of: Callable[[Any], Hashable],
    version: Callable[[Any], int],
    counter_of: Callable[[Any], Any] | None,
    kept: bool = False,
) -> Callable[[Grads], Grads]:
    """The check for the backward of an output that is, without hooks, the caller's tensor
    `original` (forward returned its input unchanged: an identity, eval-mode Dropout): it
    raises when `original` was changed in place since, as `check_kept_input`'s for a kept
    alias. The backend runs it where the gradients of the output's uses arrive (its output
    identity: they are all after the call) and the output's slot has one. (The other way, the
    caller's tensor read after an in-place op on the output, is not checked: that op's own
    read of the caller's tensor, `out += x` in a residual, would be refused.) `kept`:
    `original` is the input alias forward got and the module keeps (`self.kept = h; return
    h`), a third name of the one tensor; gone, it was not kept."""
    error = _output_after_kept(site) if kept else _output_read(site)
    check = _Unchanged(original, output, not kept, error, node_of, version, counter_of)
    check.settle()
    return check


# The aliases hooked calls kept, by the id of the tensor each stands for (the caller's): an
# enclosing hooked call that got that tensor as its own input alias keeps them as well
# (`kept_inputs`); an entry goes with that tensor.
_kept_for: dict[int, list[weakref.ref[Any]]] = {}


def _note_kept(original: Any, alias: Any) -> None:
    key = id(original)
    refs = _kept_for.get(key)
    if refs is None:
        refs = _kept_for[key] = []
        weakref.finalize(original, _kept_for.pop, key, None)
    refs.append(weakref.ref(alias))


# A grad node these checks gave a tensor -> the node it had: a tensor taking a check again (the
# same one given twice, to two modules keeping it) has not changed for the checks before. An
# entry lives as long as the check that made it (the node's own life, about).
_rebased: dict[Hashable, Hashable] = {}


def _ours(new: Hashable, old: Hashable, check: _Unchanged) -> None:
    if new is not None and new != old:
        _rebased[new] = old
        weakref.finalize(check, _rebased.pop, new, None)


def _same_node(now: Hashable, then: Hashable) -> bool:
    """Whether grad node `now` is `then`, or one only these checks put above it (`...`: the
    backend cannot read it, a node of these checks that already ran in this backward)."""
    if now is ...:
        return True
    seen = 0
    while now != then:
        now = _rebased.get(now)
        seen += 1
        if now is None or seen > 64:
            return False
    return True


class _Group:
    """The checks of one thread whose other side is one tensor, settled at one grad node of it:
    one read tells them all whether it moved."""

    __slots__ = ("other", "node", "node_of", "checks", "limit")

    def __init__(self, other: Any, node: Hashable, node_of: Callable[[Any], Hashable]) -> None:
        self.other, self.node, self.node_of = weakref.ref(other), node, node_of
        self.checks: list[weakref.ref[_Unchanged]] = []
        self.limit = 64  # (the dead ones go when the list reaches it: a parameter's lives long)

    def add(self, check: _Unchanged) -> None:
        checks = self.checks
        if len(checks) >= self.limit:
            checks[:] = [ref for ref in checks if ref() is not None]
            self.limit = max(64, 2 * len(checks))
        checks.append(weakref.ref(check))


class _Watched(threading.local):
    def __init__(self) -> None:
        # this thread's checks whose other side lived at the last `note_changes` and had not
        # moved, by (the id of that side, its grad node when they settled); the groups of dead
        # sides also go when the dict reaches `limit` (a backend that never calls it: MindSpore)
        self.groups: dict[tuple[int, Hashable], _Group] = {}
        self.limit = 64


_watched = _Watched()


def note_changes() -> None:
    """Where a backend can (each hooked call's end: a call's locals die there, and an enclosing
    hooked call hands its caller aliases of what its forward returns, so the tensors forward
    passed on die there too): each check whose other side lives notes whether that side took
    an in-place op since the call. Its backward reads that once the side is gone, which tells
    nothing then of what changed it (`_Unchanged`); a side that dies later, changed after the
    last such point, is not told. One read per tensor some live check watches (the checks
    of one tensor grouped: a parameter that many identity calls return is one read); a group
    goes once its tensor died or moved."""
    groups = _watched.groups
    if not groups:
        return
    for key, group in list(groups.items()):
        other = group.other()
        if other is not None and _same_node(group.node_of(other), group.node):
            continue
        del groups[key]
        if other is not None:  # moved
            for ref in group.checks:
                check = ref()
                if check is not None:
                    check.moved = True


class _Unchanged:
    """The backward check of one side (`user`, whose history it is in): whether `other` was
    changed in place since `settle` (`moved`: seen so by `note_changes` while it lived)."""

    __slots__ = (
        "other",
        "user",
        "counter",
        "version",
        "node",
        "user_node",
        "gone_changed",
        "error",
        "node_of",
        "read",
        "moved",
        "__weakref__",
    )

    def __init__(
        self,
        other: Any,
        user: Any,
        gone_changed: bool,
        error: Callable[[], InPlaceError],
        node_of: Callable[[Any], Hashable],
        version: Callable[[Any], int],
        counter_of: Callable[[Any], Any] | None,
    ) -> None:
        self.other, self.user = weakref.ref(other), weakref.ref(user)
        self.counter = None if counter_of is None else counter_of(other)
        self.gone_changed = gone_changed
        self.error = error
        self.node_of, self.read = node_of, version
        self.version: int | None = None
        self.node: Hashable = None
        self.user_node: Hashable = None
        self.moved = False

    def settle(self) -> None:
        """From now on: once both sides took their checks (a rebase moves a grad node)."""
        if self.counter is not None:
            self.version = self.read(self.counter)
        other = self.other()
        self.node = self.node_of(other)
        self.user_node = self.node_of(self.user())
        watched = _watched
        groups, key = watched.groups, (id(other), self.node)
        group = groups.get(key)
        if group is None or group.other() is not other:
            if len(groups) >= watched.limit:
                for dead in [k for k, g in groups.items() if g.other() is None]:
                    del groups[dead]
                watched.limit = max(64, 2 * len(groups))
            group = groups[key] = _Group(other, self.node, self.node_of)
        group.add(self)

    def __call__(self, grads: Grads) -> Grads:
        if self.counter is not None and self.read(self.counter) == self.version:
            return grads  # (the same list: no copies)
        other = self.other()
        if other is not None:
            changed = not _same_node(self.node_of(other), self.node)
        else:
            # gone: refused where it moved while it lived, or where the counter moved and not
            # through `user` itself
            user = self.user()
            changed = self.moved or (
                self.gone_changed
                and self.counter is not None
                and user is not None
                and _same_node(self.node_of(user), self.user_node)
            )
        if changed:
            raise self.error()
        return grads


_KEPT = "the module kept the input its forward got (`self.inp = h`, in a list, a closure)"
_RETURNED = "the module returned its input unchanged (an identity, an eval-mode Dropout)"
_ONE = "Without hooks the two are one tensor, which has the change; with backward hooks"


def _refusal(site: Site, what: str, then: str, alias: str, fix: str) -> Callable[[], InPlaceError]:
    """The `InPlaceError` a check raises: what the module did, what happened after the call,
    why the alias cannot carry it on this framework, what to do instead."""
    return lambda: InPlaceError(f"{site}: {what}, {then}. {_ONE} {alias}. {fix}")


def _kept_read(site: Site) -> Callable[[], InPlaceError]:
    return _refusal(
        site,
        _KEPT,
        "and the kept tensor was used after the caller changed its own in place",
        "the kept one is an alias whose history cannot take it on this framework (torch's "
        "own backward hook raises here too)",
        "Keep a copy (`self.inp = h.clone()`), or change a copy of the tensor after the call",
    )


def _caller_read(site: Site) -> Callable[[], InPlaceError]:
    return _refusal(
        site,
        _KEPT,
        "the kept tensor was changed in place after the call, and the caller's tensor was "
        "then used",
        "the kept one is an alias whose change cannot reach the caller's history on this framework",
        "Keep a copy (`self.inp = h.clone()`), or change a copy",
    )


def _leaf_written(site: Site) -> Callable[[], InPlaceError]:
    return lambda: InPlaceError(
        f"{site}: {_KEPT}, a leaf tensor that requires grad, and the kept tensor was changed "
        "in place with a history, then used. Without hooks it is the leaf, on which the "
        "framework refuses such an op; with backward hooks it is an alias, which took it (the "
        "leaf's values changed). Change a copy (`self.inp = h.clone()`), or change it under "
        "no_grad"
    )


def _output_read(site: Site) -> Callable[[], InPlaceError]:
    return _refusal(
        site,
        _RETURNED,
        "the caller changed its own tensor in place after the call, and the output was then used",
        "the output is an alias whose history cannot take it on this framework (torch's own "
        "backward hook raises here too)",
        "Use the output, not the input, after the call, or pass a copy (`module(x.clone())`)",
    )


def _output_after_kept(site: Site) -> Callable[[], InPlaceError]:
    return _refusal(
        site,
        "the module kept the input its forward got and returned it unchanged (`self.kept = "
        "h; return h`)",
        "the kept tensor was changed in place after the call, and the output was then used",
        "the output is an alias whose history cannot take it on this framework",
        "Keep a copy (`self.kept = h.clone()`)",
    )
