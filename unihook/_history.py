"""Whether one of a module call's outputs was computed from another, or a tensor it keeps from
one of them: a walk of their autograd histories, for the backends' `Ops.derived` and
`Ops.derived_from` (GradientMonitor asks: the gradient reaching that output then sums those
uses with the caller's, not its grad_output)."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Sequence

# A node of an autograd graph as a backend reads it: (a key naming it while the graph lives,
# the output of the node a tensor is, None where the framework does not tell, the node itself)
Entry = tuple[Hashable, "int | None", Any]

# the nodes one walk visits at most: beyond, it cannot tell (a call that reads a long history
# it was not given as an argument)
BUDGET = 16384


def history_reaches(
    outputs: Sequence[Entry],
    edges: Callable[[Any], Iterable[Entry]],
    order: Callable[[Any], int | None],
    floor: int | None,
    stops: frozenset[Hashable] = frozenset(),
    sources: Sequence[Entry] | None = None,
    budget: int = BUDGET,
) -> bool | None:
    """Whether the history of one of `outputs` (their grad nodes) reaches another's node (the
    same output of it, where the framework tells outputs apart): True, False, or None past
    `budget` nodes. `edges(node)` are a node's inputs' entries; `order(node)` its creation
    number (torch's, MindSpore's sequence numbers; None where there is none), and nodes made
    before `floor` are not walked (those on a path between two outputs were made after the
    earlier one); `stops` are nodes not walked either (the call's arguments'). `sources`:
    walk from these instead, whether one is or reaches one of `outputs` (`Ops.derived_from`:
    a tensor a module keeps, made from its output or another object of it)."""
    targets: set[Hashable] = set()
    for key, index, _ in outputs:
        targets.add(key if index is None else (key, index))
    hold: list[Any] = []  # (keys may be ids of wrappers a framework makes per read)
    visited: set[Hashable] = set(stops)
    if sources is not None and any(
        key in targets or (key, index) in targets for key, index, _ in sources
    ):
        return True
    for key, _, node in outputs if sources is None else sources:
        # (a node of two outputs is not on a path between them: the graph has no cycles; a
        # source made before every output is made of none)
        made = None if floor is None else order(node)
        if key in visited or (floor is not None and made is not None and made < floor):
            continue
        visited.add(key)
        stack = [node]
        while stack:
            current = stack.pop()
            for name, index, before in edges(current):
                if name in targets or (name, index) in targets:
                    return True
                if name in visited:
                    continue
                visited.add(name)
                hold.append(before)
                made = order(before)
                if floor is not None and made is not None and made < floor:
                    continue
                if len(hold) > budget:
                    return None
                stack.append(before)
    return False
