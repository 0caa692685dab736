"""Whether one of a module call's outputs was computed from another: a walk of their autograd
histories, for the backends' `Ops.derived` (GradientMonitor asks: the gradient reaching the
other output then sums its use inside the call with the caller's, not its grad_output)."""

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
) -> bool | None:
    """Whether the history of one of `outputs` (their grad nodes) reaches another's node (the
    same output of it, where the framework tells outputs apart): True, False, or None past
    `BUDGET` nodes. `edges(node)` are a node's inputs' entries; `order(node)` its creation
    number (torch's, MindSpore's sequence numbers; None where there is none), and nodes made
    before `floor` are not walked (those on a path between two outputs were made after the
    earlier one); `stops` are nodes not walked either (the call's arguments')."""
    targets: set[Hashable] = set()
    for key, index, _ in outputs:
        targets.add(key if index is None else (key, index))
    hold: list[Any] = []  # (keys may be ids of wrappers a framework makes per read)
    visited: set[Hashable] = set(stops)
    for key, _, node in outputs:
        # (a node of two outputs is not on a path between them: the graph has no cycles)
        if key in visited:
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
                if len(hold) > BUDGET:
                    return None
                stack.append(before)
    return False
