"""torch's global registration hook dicts while unihook has hooks there (unihook/_global_table.py):
native handles made before, during and after keep removing their hooks, the order is the
registration order, and the dict torch had goes back, the same object, with exactly the native
hooks; nothing keeps a removed hook alive."""

from __future__ import annotations

import gc
import random
import weakref
from collections import OrderedDict
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.modules.module as torch_module  # noqa: E402

import unihook  # noqa: E402
from unihook import _global_table  # noqa: E402

KINDS = ("parameter", "buffer", "module")


def _register(holder: Any, what: str, name: str) -> None:
    if what == "parameter":
        holder.register_parameter(name, torch.nn.Parameter(torch.ones(1)))
    elif what == "buffer":
        holder.register_buffer(name, torch.ones(1))
    else:
        holder.add_module(name, torch.nn.ReLU())


@pytest.mark.parametrize("what", KINDS)
def test_native_handles_order_and_the_dict_put_back(what: str) -> None:
    attr = f"_global_{what}_registration_hooks"
    native = getattr(torch_module, f"register_module_{what}_registration_hook")
    register = getattr(unihook, f"register_module_{what}_registration_hook")
    origin = getattr(torch_module, attr)
    assert type(origin) is OrderedDict and not origin
    log: list[str] = []

    def logging(tag: str) -> Any:
        return lambda module, name, value: log.append(f"{tag} {name}")

    before = native(logging("n0"))
    first = register(logging("u1"), backend="torch")
    assert getattr(torch_module, attr) is not origin  # (the table)
    during = native(logging("n1"))
    second = register(logging("u2"), backend="torch")
    holder = torch.nn.Module()
    _register(holder, what, "a")
    before.remove()  # through the dict it was made on, which torch's loop does not read now
    _register(holder, what, "b")
    first.remove()
    second.remove()
    assert getattr(torch_module, attr) is origin
    assert list(origin) == [during.id]
    gc.collect()
    assert during.hooks_dict_ref() is not None  # the table lives on for `during`'s handle
    _register(holder, what, "c")
    during.remove()
    assert getattr(torch_module, attr) is origin and not origin
    assert log == ["n0 a", "u1 a", "n1 a", "u2 a", "u1 b", "n1 b", "u2 b", "n1 c"]
    hook = logging("gone")
    gone = weakref.ref(hook)
    native(hook).remove()
    register(hook, backend="torch").remove()
    del hook
    gc.collect()
    assert gone() is None  # (kept by nothing: not by the table, which lives on)
    assert not _global_table._tables[id(torch_module), attr, id(origin)].own
    assert getattr(torch_module, attr) is origin and not origin


_OPS = ("native", "unihook", "remove", "rewrite", "reinsert", "move", "fire")


def _play(ops: list[tuple[str, int, bool]], *, oracle: bool) -> tuple[list[list[str]], list[str]]:
    """`ops` on torch's buffer registration hooks; unihook's registrations made natively when
    `oracle` (torch's own dict is then the reference: every hook runs in insertion order). The
    calls of each registration, and the native hooks left once unihook's went."""
    attr = "_global_buffer_registration_hooks"
    origin = getattr(torch_module, attr)
    log: list[str] = []
    fired: list[list[str]] = []
    handles: list[tuple[str, Any]] = []  # (tag, handle), alive ones

    def logging(tag: str) -> Any:
        return lambda module, name, value: log.append(tag)

    holder = torch.nn.Module()
    try:
        for n, (op, i, last) in enumerate(ops):
            natives = [(t, h) for t, h in handles if t.startswith("n")]
            if op == "native" or (op == "unihook" and oracle):
                tag = f"{op[0]}{n}"
                handles.append(
                    (tag, torch_module.register_module_buffer_registration_hook(logging(tag)))
                )
            elif op == "unihook":
                tag = f"u{n}"
                handle = unihook.register_module_buffer_registration_hook(
                    logging(tag), backend="torch"
                )
                handles.append((tag, handle))
            elif op == "remove" and handles:
                tag, handle = handles.pop(i % len(handles))
                handle.remove()
            elif op in ("rewrite", "reinsert") and natives:
                tag, handle = natives[i % len(natives)]
                d = getattr(torch_module, attr)
                if op == "reinsert":  # (a library switching its hook off and on under its key)
                    del d[handle.id]
                d[handle.id] = logging(tag)
            elif op == "move" and natives:
                getattr(torch_module, attr).move_to_end(natives[i % len(natives)][1].id, last)
            elif op == "fire":
                log.clear()
                holder.register_buffer(f"b{n}", torch.ones(1))
                fired.append(list(log))
        for tag, handle in handles:
            if tag.startswith("u"):
                handle.remove()
        assert getattr(torch_module, attr) is origin
        log.clear()
        holder.register_buffer("last", torch.ones(1))
        left = list(log)
        for _, handle in handles:
            handle.remove()
        assert getattr(torch_module, attr) is origin and not origin
    finally:  # (a failure leaves torch as it was for the next tests)
        for _, handle in handles:
            handle.remove()
    return fired, left


@pytest.mark.parametrize("seed", range(3))
def test_order_is_the_order_hooks_went_in_as_in_torchs_dict(seed: int) -> None:
    """Generated sequences of native and unihook registrations, removals, a library's rewrites
    of a key, a key deleted and put in again, and ``move_to_end``: each registration runs the
    hooks in the order torch's own dict would, unihook's registered natively as the oracle,
    and the native hooks left when unihook's went are in that order too."""
    rng = random.Random(seed)
    for _ in range(150):
        ops = [
            (rng.choice(_OPS), rng.randrange(10), rng.random() < 0.5)
            for _ in range(rng.randrange(1, 30))
        ]
        assert _play(ops, oracle=False) == _play(ops, oracle=True), ops
