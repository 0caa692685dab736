"""Which module of one model stands for which module of its port.

By qualified name when the two models share names (most hand ports and PaConvert's keep them),
a shared name whose two modules are of different types (a port that inserted a module into a
`Sequential`, shifting the indices after it) left to the next rule; then the modules left on
both sides by order among the children of modules already paired; else all by call order and
module type. By order: the called modules of each side, in order of completion, are matched
as a longest common subsequence of their type names (``Conv2d`` and paddle's ``Conv2D`` are
one type), so a wrapper with no counterpart on the other side is skipped, and the modules left
between two matches pair in order where both sides left as many, one type for one type, with
the same output shapes (a torch ``Flatten`` and the port's own ``Flat``; a block class each
framework names its own way). The models themselves ("") always pair. `layer_map` pairs
modules by hand before either rule; a name in it that did not run (a ``ModuleList``) pairs the
modules under it by their names below it.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Signatures", "align", "parent", "type_key"]

Called = Sequence[tuple[str, str]]
# per qualified name, the shapes of the tensors its first call returned (None: unknown)
Signatures = Mapping[str, object]

# Above this many cells (modules left in a times modules left in b) the longest common
# subsequence's table (2 bytes a cell) is not built: difflib's longest runs instead, with a
# warning (layer_map or shared names pair such models).
LCS_CELLS = 100_000_000


def type_key(type_name: str) -> str:
    """A class name as both frameworks spell it: torch's ``BatchNorm2d`` is paddle's
    ``BatchNorm2D``, ``MultiheadAttention`` is ``MultiHeadAttention``."""
    return type_name.lower()


def parent(name: str) -> str:
    """The qualified name of the module holding `name` ("" for the model's children)."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def _check(names: Sequence[str], wanted: list[str], side: str) -> None:
    known = set(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(
            f"`layer_map` names modules that did not run in the {side} model: "
            f"{', '.join(map(repr, unknown))}; modules that ran: "
            f"{', '.join(map(repr, list(names)[:12]))}..."
        )


def _expand(manual: dict[str, str], called_a: Called, called_b: Called) -> None:
    """Entries naming a module that did not run on either side (a ``ModuleList``: torch's
    ``layers`` as the port's ``blocks``) pair the modules that ran under it by their names
    below it, where the other side has each of them on a module of the same type; where
    one differs (an index shift in the list) the entry is left to the rules, which pair
    such lists (until 2026-12-04 the names were paired across the shift: helper-134's
    FINDING 4)."""
    types_a, types_b = dict(called_a), dict(called_b)
    for name_a, name_b in list(manual.items()):
        if name_a in types_a or name_b in types_b:
            continue
        below = [n for n in types_a if n.startswith(name_a + ".")]
        found = {n: name_b + n[len(name_a) :] for n in below}
        if not found:
            continue  # (`_check` names it)
        del manual[name_a]
        if all(type_key(types_a[n]) == type_key(types_b.get(m, "")) for n, m in found.items()):
            for n, m in found.items():
                manual.setdefault(n, m)


def align(
    called_a: Called,
    called_b: Called,
    layer_map: Mapping[str, str] | None = None,
    signatures: tuple[Signatures, Signatures] | None = None,
    weights: tuple[Signatures, Signatures] | None = None,
) -> tuple[list[tuple[str, str]], str]:
    """(name in a, name in b) pairs, in a's order, and the rule used ("name" or "order").
    `called_a` / `called_b`: (qualified name, class name) of each module that ran, in order of
    its first completion; `signatures`: each side's output shapes by name; `weights`: each
    side's own parameters' shapes by name (each shape's dimensions sorted: torch's Linear
    weight is paddle's transposed), a module without parameters left out."""
    manual = dict(layer_map or {})
    names_a, names_b = [n for n, _ in called_a], [n for n, _ in called_b]
    _expand(manual, called_a, called_b)
    _check(names_a, list(manual), "first")
    _check(names_b, list(manual.values()), "second")
    twice = sorted({n for n in manual.values() if list(manual.values()).count(n) > 1})
    if twice:
        raise ValueError(
            "`layer_map` must pair each module of the second model at most once. Received: "
            + ", ".join(f"{[a for a, b in manual.items() if b == n]} -> {n!r}" for n in twice)
        )
    order = _Order(signatures, weights)
    rest_a = [(n, t) for n, t in called_a if n not in manual]
    taken_b = set(manual.values())
    rest_b = [(n, t) for n, t in called_b if n not in taken_b]
    types_b = dict(rest_b)
    shared = {n for n, _ in rest_a if n in types_b}
    pairs = dict(manual)
    if len(shared) * 2 >= min(len(rest_a), len(rest_b)):
        rule = "name"
        same = _by_name(rest_a, types_b, shared, (set(names_a), set(names_b)))
        pairs.update((n, n) for n in same)
        order.renamed(
            [(n, t) for n, t in rest_a if n not in same],
            [(n, t) for n, t in rest_b if n not in same],
            pairs,
            (set(names_a), set(names_b)),
        )
        taken = set(pairs.values())
        pairs.update((n, n) for n, _ in rest_a if n in shared and n not in pairs and n not in taken)
    else:
        rule = "order"
        if "" in types_b and any(n == "" for n, _ in rest_a):
            pairs[""] = ""
            rest_a = [(n, t) for n, t in rest_a if n]
            rest_b = [(n, t) for n, t in rest_b if n]
        order.pair(rest_a, rest_b, pairs)
    position = {n: i for i, n in enumerate(names_a)}
    return sorted(pairs.items(), key=lambda p: position[p[0]]), rule


def _by_name(
    rest_a: Called, types_b: Mapping[str, str], shared: set[str], ran: tuple[set[str], set[str]]
) -> set[str]:
    """The shared names that pair by name, shallowest first. Not: a name on modules of
    different types (left to the order of the children of its parent; where that pairs
    neither, the name pairs them after all: each framework's own class for one module);
    the indexed children of a module where one index holds modules of different types (the
    port inserted a Dropout into a Sequential or a ModuleList: the indices after it shifted,
    onto modules of the same type too); a name whose closest ancestor that ran does not pair
    by its name on both sides (``1.fc`` under a's ``1``, paired with b's ``2``)."""
    types_a = dict(rest_a)

    def alike(name: str) -> bool:
        return type_key(types_a[name]) == type_key(types_b[name])

    shifted = {parent(n) for n in shared if n.rpartition(".")[2].isdigit() and not alike(n)}
    taken: set[str] = set()
    for name in sorted(shared, key=lambda n: n.count(".") + bool(n)):
        if not name:
            taken.add(name)  # (the models themselves)
            continue
        holder = _holder(name, ran[0])
        if (
            alike(name)
            and parent(name) not in shifted
            and holder == _holder(name, ran[1])
            and (holder in taken or holder not in shared)
        ):
            taken.add(name)
    return taken


class _Order:
    """Pairing by call order and type (`signatures`: each side's output shapes by name;
    `weights`: its parameters' shapes)."""

    def __init__(
        self,
        signatures: tuple[Signatures, Signatures] | None,
        weights: tuple[Signatures, Signatures] | None = None,
    ) -> None:
        self._shapes = signatures or ({}, {})
        self._weights = weights or ({}, {})

    def pair(self, called_a: Called, called_b: Called, pairs: dict[str, str]) -> None:
        """Pair a longest common subsequence of the two lists' modules of one type (and,
        where both have parameters, of the same parameter shapes: a 3x3 conv is no 1x1
        conv), then the gaps between its matches that correspond one to one (`_alike`),
        then the modules left whose type, parameter and output shapes no other module left
        on either side shares (a port that runs a block's shortcut before its main branch:
        the pairs cross)."""
        weights_a, weights_b = (
            [self._weights[k].get(n) for n, _ in called]
            for k, called in enumerate((called_a, called_b))
        )
        matches = _lcs(
            [type_key(t) for _, t in called_a],
            [type_key(t) for _, t in called_b],
            (weights_a, weights_b),
        )
        for i, j in matches:
            pairs[called_a[i][0]] = called_b[j][0]
        bounds = [(-1, -1), *matches, (len(called_a), len(called_b))]
        for (i0, j0), (i1, j1) in zip(bounds, bounds[1:]):
            gap_a, gap_b = called_a[i0 + 1 : i1], called_b[j0 + 1 : j1]
            if gap_a and len(gap_a) == len(gap_b) and self._alike(gap_a, gap_b):
                pairs.update((x, y) for (x, _), (y, _) in zip(gap_a, gap_b))
        taken = set(pairs.values())
        left = (
            [(n, t) for n, t in called_a if n not in pairs],
            [(n, t) for n, t in called_b if n not in taken],
        )
        keys = [
            [(type_key(t), self._weights[k].get(n), self._shapes[k].get(n)) for n, t in side]
            for k, side in enumerate(left)
        ]
        for (name, _), key in zip(left[0], keys[0]):
            if key[1] and keys[0].count(key) == 1 and keys[1].count(key) == 1:
                pairs[name] = left[1][keys[1].index(key)][0]

    def _alike(self, gap_a: Called, gap_b: Called) -> bool:
        """Whether two runs of modules stand for each other in order: one type in b for
        each type in a and the other way round, and the same output shapes where known."""
        to_b: dict[str, str] = {}
        to_a: dict[str, str] = {}
        for (name_a, kind_a), (name_b, kind_b) in zip(gap_a, gap_b):
            key_a, key_b = type_key(kind_a), type_key(kind_b)
            if to_b.setdefault(key_a, key_b) != key_b or to_a.setdefault(key_b, key_a) != key_a:
                return False
            shape_a, shape_b = self._shapes[0].get(name_a), self._shapes[1].get(name_b)
            if shape_a is not None and shape_b is not None and shape_a != shape_b:
                return False
            # (a 3x3 conv is no 1x1 conv here either: helper-134's FINDING 3)
            weights_a, weights_b = self._weights[0].get(name_a), self._weights[1].get(name_b)
            if weights_a and weights_b and weights_a != weights_b:
                return False
        return True

    def renamed(
        self,
        rest_a: Called,
        rest_b: Called,
        pairs: dict[str, str],
        ran: tuple[set[str], set[str]],
    ) -> None:
        """The modules a port renamed (torch's `downsample` as `shortcut`), by order and type
        among the modules under paired ones (shallowest first, so a renamed module's
        children follow it): a module with no counterpart elsewhere in the model stays
        unpaired. A module's holder is its closest ancestor that ran: a ``ModuleList`` (which
        never runs) the port renamed holds nothing, its blocks are the model's."""
        kids_a: dict[str, list[tuple[str, str]]] = {}
        kids_b: dict[str, list[tuple[str, str]]] = {}
        for name, kind in rest_a:
            kids_a.setdefault(_holder(name, ran[0]), []).append((name, kind))
        for name, kind in rest_b:
            kids_b.setdefault(_holder(name, ran[1]), []).append((name, kind))
        for holder in sorted(kids_a, key=lambda n: n.count(".") + bool(n)):
            if holder in pairs:
                self.pair(kids_a[holder], kids_b.get(pairs[holder], []), pairs)


def _holder(name: str, ran: set[str]) -> str:
    """The closest ancestor of `name` that ran ("" when none did)."""
    found = parent(name) if name else ""
    while found and found not in ran:
        found = parent(found)
    return found


def _lcs(
    keys_a: list[str], keys_b: list[str], extra: tuple[list[object], list[object]] | None = None
) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of two lists, each element of a matched
    as early in b as the subsequence allows. Two elements match when their keys are equal
    and their `extra` values (each list's, by position) are too, or either is falsy."""
    n, m = len(keys_a), len(keys_b)
    more_a, more_b = extra or ([None] * n, [None] * m)
    values = {v: c for c, v in enumerate(dict.fromkeys(v for v in (*more_a, *more_b) if v))}
    codes = {k: c for c, k in enumerate(dict.fromkeys(keys_a + keys_b))}
    code_a = np.array([codes[k] for k in keys_a], np.int64)
    code_b = np.array([codes[k] for k in keys_b], np.int64)
    # (-1: no value, matching any)
    value_a = np.array([values[v] if v else -1 for v in more_a], np.int64)
    value_b = np.array([values[v] if v else -1 for v in more_b], np.int64)

    def match(i: int, j: int) -> bool:
        return bool(
            code_a[i] == code_b[j]
            and (value_a[i] == value_b[j] or value_a[i] < 0 or value_b[j] < 0)
        )

    start = 0
    while start < min(n, m) and match(start, start):
        start += 1
    end = 0  # (a common prefix and suffix are part of a longest common subsequence)
    while end < min(n, m) - start and match(n - 1 - end, m - 1 - end):
        end += 1
    middle = _lcs_table(
        code_a[start : n - end], code_b[start : m - end],
        value_a[start : n - end], value_b[start : m - end],
    )  # fmt: skip
    return (
        [(k, k) for k in range(start)]
        + [(start + i, start + j) for i, j in middle]
        + [(n - end + k, m - end + k) for k in range(end)]
    )


def _lcs_table(
    code_a: np.ndarray, code_b: np.ndarray, value_a: np.ndarray, value_b: np.ndarray
) -> list[tuple[int, int]]:
    n, m = len(code_a), len(code_b)
    if not n or not m:
        return []
    if n * m > LCS_CELLS:
        return _longest_runs(code_a.tolist(), code_b.tolist())
    # table[i, j]: the length of a longest common subsequence of a[i:] and b[j:], a row at a
    # time: table[i, j] = max over k >= j of (table[i + 1, k], or table[i + 1, k + 1] + 1
    # where a[i] matches b[k]), a reversed running maximum
    table = np.zeros((n + 1, m + 1), np.uint16 if min(n, m) < 65535 else np.uint32)
    for i in range(n - 1, -1, -1):
        below = table[i + 1]
        same = (code_b == code_a[i]) & ((value_b == value_a[i]) | (value_b < 0) | (value_a[i] < 0))
        found = np.maximum(below[:-1], np.where(same, below[1:] + 1, 0))
        table[i, :-1] = np.maximum.accumulate(found[::-1])[::-1]
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < n and j < m:
        value_i, value_j = value_a[i], value_b[j]
        if code_a[i] == code_b[j] and (value_i == value_j or value_i < 0 or value_j < 0):
            # (a match is always part of a longest one from here)
            out.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1, j] >= table[i, j + 1]:
            i += 1
        else:
            j += 1
    return out


def _longest_runs(keys_a: list[int], keys_b: list[int]) -> list[tuple[int, int]]:
    import difflib

    warnings.warn(
        f"compare: {len(keys_a)} x {len(keys_b)} modules to align by order: matched by "
        "longest runs of their types, not a longest common subsequence, which can pair "
        "modules of a repeated type wrongly; pair them by hand (`layer_map`) or give the "
        "modules the same names in both models",
        RuntimeWarning,
        stacklevel=5,
    )
    matcher = difflib.SequenceMatcher(None, keys_a, keys_b, autojunk=False)
    return [
        (block.a + k, block.b + k)
        for block in matcher.get_matching_blocks()
        for k in range(block.size)
    ]
