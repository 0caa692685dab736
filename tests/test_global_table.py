"""torch's global registration hook dicts while unihook has hooks there (unihook/_global_table.py):
native handles made before, during and after keep removing their hooks, the order is the
registration order, and the dict torch had goes back, the same object, with exactly the native
hooks; nothing keeps a removed hook alive."""

from __future__ import annotations

import gc
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
    assert not _global_table._tables[id(torch_module), attr].own
    assert getattr(torch_module, attr) is origin and not origin
