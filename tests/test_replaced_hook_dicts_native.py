"""A library assigns a hooked module new forward hook containers (issue: unihook's backward
dispatchers went with the dicts they were pinned in), on every backend against torch's native
hooks on the same model (oracle): torch keeps module backward hooks apart from the forward hook
dicts, so they survive the assignment. Each scenario replaces the pre-hook dict, the hook dict,
both, the always_call flag table, or all three, with an empty dict or a copy (three ways to
copy), before a forward or between forward and backward, with per-module or global backward
hooks, with native hooks registered into the new dicts or not; it compares every hook call,
the input and parameter gradients, and what the module holds once the hooks are removed.
The shipped, framework-neutral side: ``unihook/conformance/test_replaced_hook_dicts.py``.
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import pytest

import unihook
from unihook._module_backward import _states
from unihook.conformance import kit

W = [[1.0, 2.0, 3.0], [-4.0, -5.0, -6.0]]
B = [1.0, 2.0]
X = [[1.0, -1.0, 2.0]]

WHICH = {
    "pre": ("forward_pre",),
    "post": ("forward",),
    "both": ("forward_pre", "forward"),
    "always": ("always_called",),
    "all": ("forward_pre", "forward", "always_called"),
}
NEW: dict[str, Callable[[Any], Any]] = {
    "empty": lambda old: OrderedDict(),
    "copy": lambda old: OrderedDict(old),
    "copy_method": lambda old: old.copy(),
}
HOOKS = ("full_backward", "full_backward_pre", "module_full_backward")


class Run:
    """One scenario on one framework; `native` registers the backward hooks with torch's own
    functions instead (the oracle)."""

    def __init__(self, k: Any, native: bool = False) -> None:
        self.k = k
        self.native = native
        self.events: list[tuple[Any, ...]] = []
        self.module = k.linear(3, 2, W, B)
        k.native_hook(self.module, "forward_pre", lambda m, args: (args[0] * 2,))

    def val(self, t: Any) -> Any:
        return None if t is None else np.round(self.k.numpy(t), 4).tolist()

    def backward_hook(self, kind: str) -> Callable[[], None]:
        m = self.module

        def full(mod: Any, gi: Any, go: Any) -> None:
            self.events.append((kind, mod is m, self.val(gi[0]), self.val(go[0])))

        def pre(mod: Any, go: Any) -> None:
            self.events.append((kind, mod is m, self.val(go[0])))

        if kind == "module_full_backward":
            if self.native:
                import torch

                register = torch.nn.modules.module.register_module_full_backward_hook
                return register(full).remove  # type: ignore[no-any-return]
            return unihook.register_module_full_backward_hook(full, backend=self.k.name).remove
        if self.native:
            native = getattr(m, f"register_{kind}_hook")
            return native(full if kind == "full_backward" else pre).remove  # type: ignore[no-any-return]
        register = getattr(unihook, f"register_{kind}_hook")
        return register(m, full if kind == "full_backward" else pre).remove  # type: ignore[no-any-return]

    def replace(self, which: str, new: str, natives_after: bool) -> None:
        for name in WHICH[which]:
            self.k.replace_hook_dict(self.module, name, NEW[new])
        if natives_after:  # registered into the library's new dicts: before the dispatchers
            self.k.native_hook(self.module, "forward", lambda m, args, out: out * 3)
            self.k.native_hook(self.module, "forward_pre", lambda m, args: (args[0] * 5,))

    def step(self, label: str, between: Callable[[], None] | None = None) -> None:
        k = self.k
        x = k.tensor(X, requires_grad=True)
        y = self.module(x)
        if between is not None:
            between()
        k.backward(k.relu(y).sum())
        self.events.append((f"{label}: x.grad", self.val(x.grad)))
        for p in k.parameters(self.module):  # paddle's Linear weight is torch's transposed
            g = k.grad(p)
            self.events.append(
                (f"{label}: param grad", (g.T if k.name == "paddle" else g).tolist())
            )
        if not self.native:
            state = _states.get(self.module)
            assert state is None or state._stack() == [], f"{label}: per-call state left"

    def containers(self) -> list[tuple[type, int]]:
        """What the module holds, comparable across frameworks (the kits list the containers
        in the same order)."""
        dicts = self.k.hook_dicts(self.module).values()
        return [(type(d), len(d)) for d in dicts]


def scenario(run: Run, kind: str, which: str, new: str, when: str, natives_after: bool) -> None:
    remove = run.backward_hook(kind)
    run.step("first")
    if when == "before_forward":
        run.replace(which, new, natives_after)
        run.step("replaced")
    else:
        run.step("replaced", lambda: run.replace(which, new, natives_after))
    run.step("after")
    remove()
    remove()  # idempotent
    run.step("removed")


COMBOS = [
    c
    for c in itertools.product(
        HOOKS, WHICH, NEW, ("before_forward", "before_backward"), (False, True)
    )
    if not (c[-1] and c[2] == "empty")  # (natives after an emptied dict: as after a copy)
]


@pytest.mark.parametrize(
    "kind,which,new,when,natives_after",
    COMBOS,
    ids=["-".join([k, w, n, t, "natives" if a else "alone"]) for k, w, n, t, a in COMBOS],
)
def test_replaced_hook_dicts_as_torch_native(
    backend: Any, kind: str, which: str, new: str, when: str, natives_after: bool
) -> None:
    oracle = Run(kit("torch"), native=True)
    scenario(oracle, kind, which, new, when, natives_after)
    run = Run(backend)
    scenario(run, kind, which, new, when, natives_after)
    assert run.events == oracle.events
    assert run.module not in _states
    assert run.containers() == oracle.containers()


def test_a_plain_dict_assigned(backend: Any) -> None:
    """``m._forward_hooks = dict(m._forward_hooks)``: torch's own registration cannot take a
    plain dict (its handles refer to their dict weakly); the hooks still fire as torch's, and
    once removed the module holds an OrderedDict with the same entries."""

    def go(k: Any, native: bool) -> list[Any]:
        run = Run(k, native=native)
        remove = run.backward_hook("full_backward")
        for name in ("forward_pre", "forward"):
            k.replace_hook_dict(run.module, name, dict)
        run.step("plain")
        remove()
        run.step("removed")
        if not native:
            assert [type(d) for d in k.hook_dicts(run.module).values()] == [OrderedDict] * 5
        return run.events

    assert go(backend, False) == go(kit("torch"), True)


def test_a_deep_copy_follows_its_own_replaced_dicts(backend: Any) -> None:
    def go(k: Any, native: bool) -> list[Any]:
        run = Run(k, native=native)
        remove = run.backward_hook("full_backward")
        twin = Run(k, native=native)
        twin.events = run.events
        twin.module = copy.deepcopy(run.module)
        for name in ("forward", "always_called"):
            k.replace_hook_dict(twin.module, name, NEW["empty"])
        run.step("original")
        twin.step("copy")
        remove()  # from the original only, as torch's handle
        run.step("original, removed")
        twin.step("copy, its hook kept")
        return run.events

    assert go(backend, False) == go(kit("torch"), True)


def test_the_always_called_flag_follows_into_a_deep_copy(backend: Any) -> None:
    m = backend.linear(3, 2, W, B)
    handle = unihook.register_full_backward_hook(m, lambda *a: None)
    twin = copy.deepcopy(m)
    backend.replace_hook_dict(twin, "always_called", NEW["empty"])
    flags = backend.hook_dicts(twin)[list(backend.hook_counts(twin))[-1]]
    assert list(flags.values()) == [True]  # the post-dispatcher's flag, in the new table
    handle.remove()
    assert not any(backend.hook_counts(m).values())


def test_kept_replaced_pre_hook_dict_limit(backend: Any) -> None:
    """The limit README states: a library that keeps the dict it replaced (to put it back)
    takes unihook's pre-dispatcher away until it does; the module's own backward hooks do not
    fire for the calls in between (torch's would), and fire again once it is back."""
    run = Run(backend)
    fired: list[str] = []
    handle = unihook.register_full_backward_hook(run.module, lambda *a: fired.append("full"))
    saved = backend.replace_hook_dict(run.module, "forward_pre", NEW["empty"])
    run.step("kept")
    assert fired == []
    backend.replace_hook_dict(run.module, "forward_pre", lambda old: saved)
    run.step("put back")
    assert fired == ["full"]
    handle.remove()
    assert all(type(d) is OrderedDict for d in backend.hook_dicts(run.module).values())
    assert sum(backend.hook_counts(run.module).values()) == 1  # the native pre-hook
