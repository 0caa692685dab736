"""Which module of one model stands for which module of its port.

By qualified name when the two models share names (most hand ports and PaConvert's keep them),
then the modules left on both sides by order; else all by call order and module type: the
called modules of each side, in order of completion, are matched as a longest common
subsequence of their type names (``Conv2d`` and paddle's ``Conv2D`` are one type), so a wrapper
with no counterpart on the other side is skipped. The models themselves ("") always pair.
`layer_map` pairs modules by hand before either rule.
"""

from __future__ import annotations

import difflib
from typing import Mapping, Sequence

__all__ = ["align", "parent", "type_key"]


def type_key(type_name: str) -> str:
    """A class name as both frameworks spell it: torch's ``BatchNorm2d`` is paddle's
    ``BatchNorm2D``, ``MultiheadAttention`` is ``MultiHeadAttention``."""
    return type_name.lower()


def _check(names: Sequence[str], wanted: list[str], side: str) -> None:
    known = set(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(
            f"`layer_map` names modules that did not run in the {side} model: "
            f"{', '.join(map(repr, unknown))}; modules that ran: "
            f"{', '.join(map(repr, list(names)[:12]))}..."
        )


def align(
    called_a: Sequence[tuple[str, str]],
    called_b: Sequence[tuple[str, str]],
    layer_map: Mapping[str, str] | None = None,
) -> tuple[list[tuple[str, str]], str]:
    """(name in a, name in b) pairs, in a's order, and the rule used ("name" or "order").
    `called_a` / `called_b`: (qualified name, class name) of each module that ran, in order of
    its first completion."""
    manual = dict(layer_map or {})
    _check([n for n, _ in called_a], list(manual), "first")
    _check([n for n, _ in called_b], list(manual.values()), "second")
    twice = sorted({n for n in manual.values() if list(manual.values()).count(n) > 1})
    if twice:
        raise ValueError(
            "`layer_map` must pair each module of the second model at most once. Received: "
            + ", ".join(f"{[a for a, b in manual.items() if b == n]} -> {n!r}" for n in twice)
        )
    rest_a = [(n, t) for n, t in called_a if n not in manual]
    taken_b = set(manual.values())
    rest_b = [(n, t) for n, t in called_b if n not in taken_b]
    names_b = {n for n, _ in rest_b}
    shared = {n for n, _ in rest_a if n in names_b}
    pairs = dict(manual)
    if len(shared) * 2 >= min(len(rest_a), len(rest_b)):
        rule = "name"
        pairs.update((n, n) for n in shared)
        _renamed(
            [(n, t) for n, t in rest_a if n not in shared],
            [(n, t) for n, t in rest_b if n not in shared],
            pairs,
        )
    else:
        rule = "order"
        if "" in names_b and any(n == "" for n, _ in rest_a):
            pairs[""] = ""
            rest_a = [(n, t) for n, t in rest_a if n]
            rest_b = [(n, t) for n, t in rest_b if n]
        _by_order(rest_a, rest_b, pairs)
    order = {n: i for i, (n, _) in enumerate(called_a)}
    return sorted(pairs.items(), key=lambda p: order[p[0]]), rule


Called = Sequence[tuple[str, str]]


def _by_order(called_a: Called, called_b: Called, pairs: dict[str, str]) -> None:
    """Pair the longest common subsequence of the two lists' type names."""
    keys_a = [type_key(t) for _, t in called_a]
    keys_b = [type_key(t) for _, t in called_b]
    matcher = difflib.SequenceMatcher(None, keys_a, keys_b, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            pairs[called_a[block.a + k][0]] = called_b[block.b + k][0]


def parent(name: str) -> str:
    """The qualified name of the module holding `name` ("" for the model's children)."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def _renamed(rest_a: Called, rest_b: Called, pairs: dict[str, str]) -> None:
    """The modules a port renamed (torch's `downsample` as `shortcut`), by order and type among
    the children of paired parents only (shallowest first, so a renamed module's children
    follow it): a module with no counterpart elsewhere in the model stays unpaired."""
    kids_a: dict[str, list[tuple[str, str]]] = {}
    kids_b: dict[str, list[tuple[str, str]]] = {}
    for name, kind in rest_a:
        kids_a.setdefault(parent(name), []).append((name, kind))
    for name, kind in rest_b:
        kids_b.setdefault(parent(name), []).append((name, kind))
    for holder in sorted(kids_a, key=lambda n: n.count(".") + bool(n)):
        if holder in pairs:
            _by_order(kids_a[holder], kids_b.get(pairs[holder], []), pairs)
