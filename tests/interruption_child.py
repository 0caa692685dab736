"""Child process of tests/test_interruption_windows.py: a KeyboardInterrupt at every position
of unihook's registrations and removals, on one framework.

    python interruption_child.py torch|paddle [KIND,KIND...] [SECONDS]

A position is a call, line or return event of a frame of unihook's own code (``unihook`` and
the backend package) while a registration or a removal runs, found by a dry run of it; the
interruption is a trace function raising KeyboardInterrupt at that event. CPython delivers a
Ctrl-C (or an exception from ``PyThreadState_SetAsyncExc``) at a function's entry, after a
call of anything but a Python function, at a backward jump: the events are a superset, but
for those `_skipped` leaves out, where no Ctrl-C lands (and an exception raised there would
break what no Python code can guard).

After each interruption: the KeyboardInterrupt reached the caller as itself; no lock of
unihook's is held; the target (module or tensor), the framework's global hook tables and
what unihook patches, and unihook's module-level state are exactly as before the call (a
registration is undone, a removal finished; one cut short at its very start left the hook
whole, its handle active); at every `_FIRE_EVERY`-th position tried, the hook interrupted never
fires, and the same registration then works and its removal restores everything again.

Then, for SECONDS (if given), `real_sigint`: real signals. Prints one JSON line per failure
(the first few of each kind), then a summary line: positions per kind, failures, signals.
"""

from __future__ import annotations

import dis
import faulthandler
import gc
import inspect
import json
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable

os.environ.setdefault("GLOG_minloglevel", "2")
warnings.simplefilter("ignore")

import unihook  # noqa: E402
from unihook.backend import WeakIdentityKeys  # noqa: E402

FW = sys.argv[1]
ONLY = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else None
SIGINT_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
_MAX_FAILURES = int(os.environ.get("INTERRUPTION_MAX_FAILURES", "40"))
_SHOWN = int(os.environ.get("INTERRUPTION_SHOWN", "3"))  # failures printed per kind and step
# the hooks fire (the interrupted one must not, one registered afterwards must) at every
# this many positions; the state is compared at each
_FIRE_EVERY = int(os.environ.get("INTERRUPTION_FIRE_EVERY", "4"))
# Every position with UNIHOOK_SLOW_ATTACKS=1; else every second one (the first and last always),
# the half taken rotating by day of the year (INTERRUPTION_OFFSET sets it: a failure prints
# its position k), which halves the runs' minute and a half in `make test`
_STRIDE = int(
    os.environ.get("INTERRUPTION_STRIDE", "1" if os.environ.get("UNIHOOK_SLOW_ATTACKS") else "2")
)
_OFFSET = int(os.environ.get("INTERRUPTION_OFFSET", str(time.gmtime().tm_yday))) % _STRIDE


def _tried(k: int, n: int) -> bool:
    """Whether position `k` of `n` is interrupted in this run."""
    return k in (1, n) or k % _STRIDE == _OFFSET


faulthandler.dump_traceback_later(float(os.environ.get("INTERRUPTION_TIMEOUT", "240")), exit=True)

if FW == "torch":
    import torch as fw
    import torch.nn.modules.module as torch_module

    def linear() -> Any:
        return fw.nn.Linear(2, 2)

    def leaf() -> Any:
        return fw.ones(1, 2, requires_grad=True)

    def backward(loss: Any) -> None:
        loss.backward()

    def register_things(m: Any) -> None:
        m.register_parameter("p", fw.nn.Parameter(fw.ones(1)))
        m.register_buffer("b", fw.ones(1))
        m.add_module("s", fw.nn.Identity())

    def lock_marks() -> Any:
        return None

    def framework_state() -> dict[str, Any]:
        state = {
            name: _summary(value)
            for name, value in vars(torch_module).items()
            if name.startswith("_global_")
        }
        # what unihook patches
        state["Module"] = (fw.nn.Module._call_impl, fw.nn.Module.__call__)
        return state

elif FW == "mindspore":
    import mindspore as fw
    import mindspore.nn.cell as cell_module
    import numpy as np
    from unihook_mindspore._serial import exclusive
    from unihook_mindspore.testkit import MindSporeKit

    kit = MindSporeKit()  # (its tape: MindSpore's autograd is functional)

    def linear() -> Any:
        return kit.linear(2, 2)

    def leaf() -> Any:
        return kit.tensor(np.ones((1, 2)), requires_grad=True)

    def backward(loss: Any) -> None:
        kit.backward(loss)

    def register_things(m: Any) -> None:
        kit.register_parameter(m, "p", kit.parameter([1.0]))
        kit.register_buffer(m, "b", kit.tensor([1.0]))
        kit.add_module(m, "s", fw.nn.Identity())

    def framework_state() -> dict[str, Any]:
        # what unihook patches
        cell = vars(fw.nn.Cell)
        return {
            "Cell": tuple(cell[name] for name in _CELL_METHODS),
            "buffer hooks": _summary(cell_module._global_buffer_registration_hooks),
        }

    def lock_marks() -> Any:
        return exclusive._owner, exclusive._count

    _CELL_METHODS = ("__call__", "insert_param_to_cell", "insert_child_to_cell")

else:
    import paddle as fw
    from paddle.base import core

    def linear() -> Any:
        return fw.nn.Linear(2, 2)

    def leaf() -> Any:
        x = fw.ones([1, 2])
        x.stop_gradient = False
        return x

    def backward(loss: Any) -> None:
        loss.backward()

    def register_things(m: Any) -> None:
        m.add_parameter("p", m.create_parameter([1]))
        m.register_buffer("b", fw.ones([1]))
        m.add_sublayer("s", fw.nn.Identity())

    def lock_marks() -> Any:
        return None

    def framework_state() -> dict[str, Any]:
        # what unihook patches
        layer, tensor = vars(fw.nn.Layer), vars(core.eager.Tensor)
        return {
            "Layer": tuple(layer[name] for name in _LAYER_METHODS),
            "eager": (core.eager.run_backward, core.eager.run_partial_grad),
            "Tensor": (tensor["_register_grad_hook"], tensor["retain_grads"]),
        }

    _LAYER_METHODS = (
        "__call__",
        "_dygraph_call_func",
        "__setattr__",
        "add_parameter",
        "register_buffer",
        "add_sublayer",
    )


def _copied(copy: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    """`copy()` again where a weak reference's callback, which the collector ran during it,
    changed the container ("changed size during iteration": unihook's `_leaves` table, CI on
    0e6b094)."""
    while True:
        try:
            return copy()
        except RuntimeError:
            continue


def _summary(value: Any, depth: int = 0) -> Any:
    """A comparable picture of `value`: containers by their items, other objects by identity."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth < 3 and isinstance(value, dict):
        items = _copied(lambda: tuple(value.items()))
        return (type(value).__name__, tuple((k, _summary(v, depth + 1)) for k, v in items))
    if depth < 3 and isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_summary(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, (set, frozenset)):
        members = _copied(lambda: tuple(value))
        return (type(value).__name__, frozenset(_summary(v, depth + 1) for v in members))
    weak = (weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet)
    if isinstance(value, (*weak, WeakIdentityKeys)):
        return (type(value).__name__, len(value))  # (by size)
    return ("id", id(value))


# unihook's module-level state that changes without a registration (caches, counters)
_IGNORED = {
    "_owners",  # unihook._plugins: which plugin answered for a type
    "_serials",  # paddle's autograd guard: a number per tensor ever seen
    "_tracked",  # (compared per target below)
    "_retired",  # unihook._pinned: a module's retired hook dict, kept while the module lives
    "_active",  # paddle's autograd guard: backwards running (none here)
    "_version_checked",
    "_synced",  # MindSpore's output identities: the backward pass they last synced in
}
# the MindSpore kit's tape: its recording session changes with each forward and backward
_IGNORED_MODULES = {"unihook_mindspore._tape"}


_WATCHED: list[tuple[str, Any, str]] = []  # (module name, module, attribute)


def unihook_state() -> dict[str, Any]:
    """unihook's module-level state: every variable of its modules (not their functions,
    classes and constants), the modules loaded when first called."""
    if not _WATCHED:
        for name, module in list(sys.modules.items()):
            if not name.startswith("unihook") or module is None or name in _IGNORED_MODULES:
                continue
            for attr, value in vars(module).items():
                if attr.startswith("__") or attr in _IGNORED or attr.isupper():
                    continue
                if isinstance(value, (type, type(sys))) or (
                    callable(value) and attr == getattr(value, "__name__", "")
                ):
                    continue  # a module's own class or function
                if type(value).__module__ in ("typing", "__future__"):
                    continue
                _WATCHED.append((name, module, attr))
    state = {
        f"{name}.{attr}": _summary(getattr(module, attr, "<missing>"))
        for name, module, attr in _WATCHED
    }
    state["meta_path"] = _summary(list(sys.meta_path))
    return state


def target_state(target: Any) -> Any:
    """The hook dicts of the target and its submodules, and unihook's state of them."""
    if target is None:
        return None
    from unihook import _module_backward

    picture: dict[str, Any] = {}
    if isinstance(target, fw.Tensor):
        modules = []
        if FW == "torch":
            picture["hooks"] = _summary(target._backward_hooks)
        elif FW == "mindspore":
            # (per history of the tensor: the native hook of each runs its entries)
            table = getattr(target, "_unihook_hooks", None) or {}
            counts = [(len(h.entries), len(h.native)) for h in table.values()]
            picture["hooks"] = [c for c in counts if c != (0, 0)] or None
    elif FW == "mindspore":
        modules = [cell for _, cell in target.cells_and_names()]
    else:
        modules = list(target.modules() if FW == "torch" else target.sublayers(include_self=True))
    for n, module in enumerate(modules):
        for attr, value in vars(module).items():
            if "hook" in attr and attr != "_hook_dict":
                if FW == "mindspore" and attr.startswith("_lazy"):
                    attr = attr[len("_lazy") :]  # (Cell's property makes it when first read)
                    value = getattr(module, attr)
                picture[f"{n}.{attr}"] = _summary(value)
        picture[f"{n} backward state"] = _module_backward._states.get(module) is not None
    if FW == "paddle":
        from unihook_paddle import _autograd_guard

        entry = _autograd_guard._tracked.get(id(target))
        picture["tracked"] = None if entry is None else len(entry[1])
    return picture


# what `lock_marks` gave before the call interrupted: a re-entrant lock held across calls
# (the MindSpore kit's tape holds `exclusive` from a leaf's creation to its backward) is held
# as many times after it
_marks: list[Any] = [None]


def locks_free() -> list[str]:
    from unihook import _imports, _locks, handles

    held = [repr(lock) for lock in _locks._locks if _is_held(lock)]
    if lock_marks() != _marks[0]:
        held.append(f"re-entrant lock: {_marks[0]} -> {lock_marks()}")
    if handles._removing.locked():
        held.append("handles._removing")
    if _imports._lock._is_owned():  # type: ignore[attr-defined]
        held.append("_imports._lock")
    if FW == "paddle":
        from unihook_paddle import _autograd_guard

        if _autograd_guard._lock._is_owned():  # type: ignore[attr-defined]
            held.append("_autograd_guard._lock")
    if FW == "mindspore":
        import unihook_mindspore
        from unihook_mindspore import _forward

        for name, lock in (
            ("_deferred_lock", unihook_mindspore._deferred_lock),
            ("_forward._lock", _forward._lock),
            ("_forward._ids", _forward._ids),
        ):
            if _is_held(lock):
                held.append(name)
    return held


def _is_held(lock: Any) -> bool:
    inner = getattr(lock, "mutex", None) or getattr(lock, "_lock", None) or lock
    if hasattr(inner, "_is_owned"):
        if inner._is_owned():
            return True
        # held by another thread would be a hang: none runs here
        if inner.acquire(blocking=False):
            inner.release()
            return False
        return True
    return bool(inner.locked())


def snapshot(target: Any) -> Any:
    return (target_state(target), unihook_state(), framework_state())


def same(before: Any, target: Any) -> tuple[bool, Any]:
    """Whether the state is `before` again (after collecting the garbage, if not at once:
    a removed hook's cycles keep what they hold until then)."""
    after = snapshot(target)
    if after != before:
        gc.collect()
        after = snapshot(target)
    return after == before, after


def diff(before: Any, after: Any) -> str:
    out = []
    for name, b, a in zip(("target", "unihook", "framework"), before, after):
        if b == a:
            continue
        if isinstance(b, dict) and isinstance(a, dict):
            keys = [k for k in {**b, **a} if b.get(k, "<missing>") != a.get(k, "<missing>")]
            out.append(f"{name}: " + "; ".join(f"{k}: {b.get(k)!r} -> {a.get(k)!r}" for k in keys))
        else:
            out.append(f"{name}: {b!r} -> {a!r}")
    return " | ".join(out)[:1500]


# -- the kinds: (make a target, register a hook on it, make it fire) --


def _forward(m: Any) -> None:
    m(leaf() * 1)


def _backward(m: Any) -> None:
    backward(m(leaf()).sum())


def _tensor_backward(t: Any) -> None:
    backward((t * 2).sum())


Register = Callable[[Any, Callable[..., Any]], Any]
Kind = tuple[Callable[[], Any], Register, Callable[[Any], None], Any]


def _beside(register: Register) -> Callable[[Any], Callable[[], None]]:
    """Registers a hook of `register`'s kind beside the one under test; returns its removal."""
    return lambda target: register(target, lambda *a: None).remove


def _global(name: str, with_kwargs: bool = False) -> Register:
    register = getattr(unihook, f"register_module_{name}_hook")
    if with_kwargs:
        return lambda _, h: register(lambda m, a, k: h(), backend=FW, with_kwargs=True)
    # (no `**`: a call through C is followed by a point where a Ctrl-C lands, in this frame,
    # where the caller of `real_sigint` would lose the handle)
    return lambda _, h: register(h, backend=FW)


def _forward_pre(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_forward_pre_hook(m, h)


def _forward_pre_kwargs(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_forward_pre_hook(
        m, lambda mod, a, k: h(), with_kwargs=True, prepend=True
    )


def _forward_hook(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_forward_hook(m, h)


def _forward_kwargs(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_forward_hook(
        m, lambda mod, a, k, o: h(), with_kwargs=True, always_call=True, prepend=True
    )


def _full_backward(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_full_backward_hook(m, h)


def _full_backward_pre(m: Any, h: Callable[..., Any]) -> Any:
    return unihook.register_full_backward_pre_hook(m, h)


def _sequential() -> Any:
    if FW == "mindspore":
        return kit.sequential(linear(), fw.nn.ReLU())
    return fw.nn.Sequential(linear(), fw.nn.ReLU())


def _none() -> None:
    return None


def _on_new(fire: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda _: fire(linear())


# name -> (make a target, register a hook on it, make it fire, register one beside or None)
KINDS: dict[str, Kind] = {
    "forward_pre": (linear, _forward_pre, _forward, None),
    "forward_pre kwargs prepend": (linear, _forward_pre_kwargs, _forward, None),
    "forward": (linear, _forward_hook, _forward, None),
    "forward kwargs always prepend": (linear, _forward_kwargs, _forward, None),
    # (the module's hook dicts unihook's while it has backward hooks: see unihook._pinned)
    "forward_pre beside a full_backward": (linear, _forward_pre, _forward, _beside(_full_backward)),
    "forward kwargs beside a full_backward": (
        linear,
        _forward_kwargs,
        _forward,
        _beside(_full_backward),
    ),
    "tensor": (leaf, lambda t, h: unihook.register_tensor_hook(t, h), _tensor_backward, None),
    "full_backward_pre": (linear, _full_backward_pre, _backward, None),
    "full_backward": (linear, _full_backward, _backward, None),
    "full_backward beside another": (linear, _full_backward, _backward, _beside(_full_backward)),
    "attach forward to every module": (
        _sequential,
        lambda m, h: unihook.attach(m, lambda *a: h()),
        _forward,
        None,
    ),
    "module_forward_pre": (_none, _global("forward_pre"), _on_new(_forward), None),
    "module_forward_pre kwargs": (
        _none,
        _global("forward_pre", with_kwargs=True),
        _on_new(_forward),
        None,
    ),
    "module_forward_pre beside another": (
        _none,
        _global("forward_pre"),
        _on_new(_forward),
        _beside(_global("forward_pre")),
    ),
    "module_forward": (_none, _global("forward"), _on_new(_forward), None),
    "module_full_backward_pre": (_none, _global("full_backward_pre"), _on_new(_backward), None),
    "module_full_backward": (_none, _global("full_backward"), _on_new(_backward), None),
    "module_full_backward beside another": (
        _none,
        _global("full_backward"),
        _on_new(_backward),
        _beside(_global("full_backward")),
    ),
    "parameter_registration": (
        _none,
        _global("parameter_registration"),
        _on_new(register_things),
        None,
    ),
    "buffer_registration": (_none, _global("buffer_registration"), _on_new(register_things), None),
    "module_registration": (_none, _global("module_registration"), _on_new(register_things), None),
}

ROOTS = tuple(
    os.path.dirname(m.__file__ or "") + os.sep for m in (unihook, __import__(f"unihook_{FW}"))
)
# The public functions call unihook's `_register` and return what it returns: CPython checks
# for a Ctrl-C neither when a Python function called from Python code returns, nor at a return
# (3.11: RESUME, JUMP_BACKWARD and the end of a call to anything but a Python function do).
_REGISTER_CODES = {
    unihook.api._register.__code__,
    unihook.global_hooks._register.__code__,
}


_WITH_EXITS: dict[Any, frozenset[int]] = {}


def _with_exits(code: Any) -> frozenset[int]:
    """Where the normal exits of `code`'s with statements start (a return's included):
    ``LOAD_CONST None`` three times, then the call of ``__exit__``. A line event fires there,
    where no Ctrl-C lands: CPython checks next when that call returns (a C lock's: let go)."""
    exits = _WITH_EXITS.get(code)
    if exits is None:
        ops = [(i.offset, i.opname, i.argval) for i in dis.get_instructions(code)]
        found = set()
        for n in range(len(ops)):
            m = n
            while m < len(ops) and ops[m][1] == "SWAP":  # (a return's value set aside)
                m += 1
            call = ops[m : m + 4]
            if (
                len(call) == 4
                and all(op == "LOAD_CONST" and arg is None for _, op, arg in call[:3])
                and call[3][1:] == ("PRECALL", 2)
            ):
                found.add(ops[n][0])
        exits = frozenset(found)
        _WITH_EXITS[code] = exits
    return exits


# unihook's weakref callbacks and finalizers: CPython prints what one raises and drops it, so
# a Ctrl-C landing in one never reaches the caller, and nothing can catch one landing at its
# entry (skipped); one landing inside must leave the state consistent all the same
_CALLBACKS = {"forget", "_release", "_release_identity", "__del__", "_flags_dropped", "_unmark"}


def _in_callback(frame: Any) -> bool:
    while frame is not None and frame.f_code.co_filename.startswith(ROOTS):
        if frame.f_code.co_name in _CALLBACKS:
            return True
        frame = frame.f_back
    return False


# Code no position lies in (README "Left"): MindSpore's `exclusive`, a lock written in Python
# (it hands over a dead thread's hold, gives up after a while), which a Ctrl-C inside its
# acquire or release can leave held
_UNGUARDED = {os.path.join(ROOTS[1], "_serial.py")} if FW == "mindspore" else set()

_NOPS: dict[Any, frozenset[int]] = {}


def _nops(code: Any) -> frozenset[int]:
    nops = _NOPS.get(code)
    if nops is None:
        nops = _NOPS[code] = frozenset(
            i.offset for i in dis.get_instructions(code) if i.opname == "NOP"
        )
    return nops


def _skipped(frame: Any, event: str) -> bool:
    """The events at which no Ctrl-C lands: the entry of a weakref callback (see
    `_CALLBACKS`); a line that starts with a NOP (``try:``: CPython checks at no NOP, and one
    landing after the line before belongs to that line, whose handlers may not cover the
    NOP: the with statement's, where the try begins its body); the return of unihook's
    `_register` and of the outermost frame (see `_REGISTER_CODES`); the start of a with
    statement's normal exit (see `_with_exits`). (And any in `_UNGUARDED`'s code.)"""
    if frame.f_code.co_filename in _UNGUARDED:
        return True
    if event == "call":
        return frame.f_code.co_name in _CALLBACKS
    if event == "return":
        # (the outermost: the caller has what it returned)
        caller = frame.f_back
        return frame.f_code in _REGISTER_CODES or not (
            caller is not None and caller.f_code.co_filename.startswith(ROOTS)
        )
    lasti = frame.f_lasti
    return lasti in _with_exits(frame.f_code) or lasti in _nops(frame.f_code)


def _count(fn: Callable[[], Any], until: tuple[Any, int] | None = None) -> tuple[Any, int]:
    """`fn`'s result and its positions; with `until` (a code object and a line of it), those
    up to that line's first event (included: a Ctrl-C there lands before the line runs)."""
    n = [0]
    reached = [False]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(ROOTS) or reached[0]:
            return None
        if not _skipped(frame, event):
            n[0] += 1
        if until is not None and (frame.f_code, frame.f_lineno, event) == (*until, "line"):
            reached[0] = True
            return None
        return trace

    sys.settrace(trace)
    try:
        result = fn()
    finally:
        sys.settrace(None)
    return result, n[0]


def _interrupt_at(k: int, fn: Callable[[], Any]) -> tuple[Any, str]:
    """Run `fn` with a KeyboardInterrupt at its `k`-th position; return (its result or the
    exception, where it was raised)."""
    n = [0]
    where = [""]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if not code.co_filename.startswith(ROOTS):
            return None
        if _skipped(frame, event):
            return trace
        n[0] += 1
        if n[0] == k:
            sys.settrace(None)
            where[0] = (
                f"{event} {os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"
            )
            if _in_callback(frame):
                where[0] += " (in a weakref callback)"
            raise KeyboardInterrupt(f"position {k}")
        return trace

    _marks[0] = lock_marks()
    sys.settrace(trace)
    try:
        result: Any = fn()
        _checkpoint()  # (one raised again asynchronously lands here at the latest)
    except BaseException as error:  # noqa: BLE001 (what reached the caller)
        # (its traceback would keep the frames of the registration, and what they hold)
        error.__traceback__ = None
        result = error
    finally:
        sys.settrace(None)
    return result, where[0]


def _checkpoint() -> None:
    """A point where CPython checks for an asynchronous exception: a function's entry."""


failures: list[dict[str, Any]] = []
_shown: dict[tuple[str, str], int] = {}


def fail(kind: str, what: str, k: int, where: str, detail: str) -> None:
    """Record a failure; print the first few of each kind and step (one residue shows at
    every position after it)."""
    failures.append({"kind": kind, "what": what, "k": k, "where": where, "detail": detail})
    shown = _shown[kind, what] = _shown.get((kind, what), 0) + 1
    if shown <= _SHOWN and len(failures) <= _MAX_FAILURES:
        print(json.dumps(failures[-1]), flush=True)


def _taking_the_remover() -> tuple[Any, int]:
    """`Handle._remove`'s code and the line where it takes the remover: the removal begins."""
    code = unihook.Handle._remove.__code__
    lines, first = inspect.getsourcelines(code)
    (at,) = [i for i, line in enumerate(lines) if "remover, self._remover =" in line]
    return code, first + at


_TAKING_THE_REMOVER = _taking_the_remover()


def _removed(handle: Any) -> bool:
    removed = getattr(handle, "removed", None)
    return len(handle) == 0 if removed is None else bool(removed)  # (a HookGroup: emptied)


def check_after(
    kind: str,
    what: str,
    k: int,
    where: str,
    result: Any,
    target: Any,
    before: Any,
    ghost: list[int],
    fire: Callable[[Any], None],
    register: Callable[[Any, Callable[..., Any]], Any],
) -> bool:
    # (raised again by its type, `interrupt_later`, where a weakref callback caught it)
    if where.endswith("(in a weakref callback)"):
        pass  # (dropped by CPython: see _CALLBACKS)
    elif not isinstance(result, KeyboardInterrupt) or result.args != (f"position {k}",):
        fail(kind, what, k, where, f"the caller got {result!r}")
        if hasattr(result, "remove"):
            result.remove()
        return False
    held = locks_free()
    if held:
        fail(kind, what, k, where, f"locks held: {held}")
        print(json.dumps({"summary": None, "failures": len(failures)}), flush=True)
        os._exit(1)  # the next registration would wait for ever
    ok, after = same(before, target)
    if not ok:
        fail(kind, what, k, where, "state changed: " + diff(before, after))
        return False
    if (k - _OFFSET) % (_FIRE_EVERY * _STRIDE):  # (every `_FIRE_EVERY`-th position tried)
        return True
    fired: list[int] = []
    fire(target)
    if ghost:
        fail(kind, what, k, where, "the interrupted hook fired")
        return False
    handle = register(target, lambda *a: fired.append(1))
    fire(target)
    handle.remove()
    if not fired:
        fail(kind, what, k, where, "a hook registered afterwards did not fire")
        return False
    ok, after = same(before, target)
    if not ok:
        fail(kind, what, k, where, "registering and removing afterwards: " + diff(before, after))
        return False
    return True


def run_kind(
    kind: str,
    make: Callable[[], Any],
    register: Any,
    fire: Any,
    beside: Callable[[Any], Callable[[], None]] | None,
) -> dict[str, int]:
    """Every position of `register` and of its handle's removal. `beside` registers a hook
    kept beside it (on the target, or global: then once), returning its removal."""
    counts = {}
    gone: Callable[[], None] | None = None
    if beside is not None and make() is None:
        gone, beside = beside(None), None

    neighbours: list[Callable[[], None]] = []
    current: list[Any] = []  # the target, kept while the positions leave it as it was

    def fresh() -> Any:
        if current:
            return current[0]
        while neighbours:  # (the last target's)
            neighbours.pop()()
        target = make()
        if beside is not None:
            neighbours.append(beside(target))
        register(target, lambda *a: None).remove()  # (what a first registration leaves)
        current.append(target)
        return target

    def state_before(target: Any) -> Any:
        # (a hook beside it on the target changes unihook's global state too)
        return snapshot(target) if neighbours else (target_state(target), *base)

    # the positions: a dry run's (after a collection: the collector freeing what an earlier
    # kind left, during the dry run, ran finalizers it counted, and the positions past the
    # real runs' ends failed, as where the caller got the handle)
    target = fresh()
    gc.collect()
    handle, n_register = _count(lambda: register(target, lambda *a: None))
    _, n_remove = _count(handle.remove)
    # the positions of a removal that may come before it begins (`Handle._remove` taking the
    # remover): Handle.remove's and the compiler escapes' it runs through (`_plugins.escaped`)
    handle = register(target, lambda *a: None)
    _, before_removing = _count(handle.remove, until=_TAKING_THE_REMOVER)
    counts["register"], counts["remove"] = n_register, n_remove
    ghost: list[int] = []
    while neighbours:
        neighbours.pop()()
    current.clear()
    gc.collect()
    base = snapshot(None)[1:]
    for k in range(1, n_register + 1):
        if not _tried(k, n_register):
            continue
        target = fresh()
        before = state_before(target)
        ghost.clear()
        result, where = _interrupt_at(k, lambda: register(target, lambda *a: ghost.append(1)))
        if not check_after(
            kind, "register", k, where, result, target, before, ghost, fire, register
        ):
            current.clear()
            gc.collect()
            base = snapshot(None)[1:]  # (the residue shows once)
    for k in range(1, n_remove + 1):
        if not _tried(k, n_remove):
            continue
        target = fresh()
        before = state_before(target)
        ghost.clear()
        handle = register(target, lambda *a: ghost.append(1))
        # (only its first positions come before the removal begins)
        registered = snapshot(target) if k <= before_removing else None
        result, where = _interrupt_at(k, handle.remove)
        if not _removed(handle):
            # cut short before it began: the hook stays, whole, its handle active
            if registered is None:
                fail(kind, "remove", k, where, "not removed, though the removal began")
            else:
                ok, after = same(registered, target)
                if not ok:
                    fail(
                        kind, "remove", k, where, "not removed, changed: " + diff(registered, after)
                    )
            handle.remove()
        if not check_after(kind, "remove", k, where, result, target, before, ghost, fire, register):
            current.clear()
            gc.collect()
            base = snapshot(None)[1:]
    while neighbours:
        neighbours.pop()()
    if gone is not None:
        gone()
    return counts


def real_sigint(seconds: float) -> dict[str, Any]:
    """Real signals while this thread registers and removes hooks of every kind, on one
    target per kind, for `seconds`: before each registration and removal, a one-shot
    ``signal.setitimer`` at a random 0-200 us, its SIGALRM handled as Python handles SIGINT
    (``signal.default_int_handler``: a KeyboardInterrupt where CPython checks next). After
    each: the timer disarmed, a signal that came meanwhile landed. At the end every handle it
    got removed: the targets and unihook's state as before, no hook fires, no lock held."""
    import random
    import signal

    rng = random.Random(12)
    landed = {"register": 0, "remove": 0, "after": 0}
    ghost: list[int] = []
    kinds = []  # (register, target, its state, fire)
    for make, register, fire, _ in KINDS.values():
        target = make()
        if target is not None:
            register(target, lambda *a: None).remove()
        kinds.append((register, target, target_state(target), fire))
    live: list[Any] = []  # the handles it got
    _marks[0] = lock_marks()
    gc.collect()
    base = snapshot(None)[1:]
    n = 0
    deadline = time.monotonic() + seconds
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)
    itimer, real = signal.setitimer, signal.ITIMER_REAL
    while time.monotonic() < deadline:
        n += 1
        register, target, _, _ = kinds[n % len(kinds)]
        handle = None
        try:
            itimer(real, rng.uniform(1e-6, 2e-4))
            handle = register(target, lambda *a: ghost.append(1))
            live.append(handle)
            itimer(real, 0)
            _checkpoint()
        except KeyboardInterrupt:  # (the one-shot timer went off: no other comes)
            landed["register" if handle is None else "after"] += 1
        while live:
            handle = live[-1]
            try:
                itimer(real, rng.uniform(1e-6, 2e-4))
                handle.remove()
                itimer(real, 0)
                _checkpoint()
            except KeyboardInterrupt:
                landed["remove"] += 1
            if _removed(handle):
                live.pop()
    signal.signal(signal.SIGALRM, previous)
    problems = []
    held = locks_free()
    if held:
        problems.append(f"locks held: {held}")
    gc.collect()
    now = snapshot(None)[1:]
    if now != base:
        problems.append("state changed: " + diff((None, *base), (None, *now)))
    for _, target, state, fire in kinds:
        if target_state(target) != state:
            problems.append(f"target changed: {state} -> {target_state(target)}")
        fire(target)
    if ghost:
        problems.append(f"a removed hook fired {len(ghost)} times")
    return {"iterations": n, "landed": landed, "problems": problems[:5]}


def main() -> None:
    # every module loaded before the first picture of unihook's state (`_WATCHED`)
    for make, register, fire, _ in KINDS.values():
        target = make()
        handle = register(target, lambda *a: None)
        fire(target)
        handle.remove()
    # what lives now (the frameworks' modules, mostly) is never collected: each full collection
    # below, after a position that left garbage, scans only what came later (68 ms a
    # collection with three frameworks loaded, more than half the child's time, otherwise)
    del target, handle
    gc.collect()
    gc.freeze()
    summary = {}
    for kind, (make, register, fire, beside) in KINDS.items():
        if ONLY and kind not in ONLY:
            continue
        summary[kind] = run_kind(kind, make, register, fire, beside)
    signals = real_sigint(SIGINT_SECONDS) if SIGINT_SECONDS else None
    print(
        json.dumps(
            {
                "summary": summary,
                "failures": len(failures),
                "signals": signals,
                "stride": _STRIDE,
                "offset": _OFFSET,
            }
        )
    )


if __name__ == "__main__":
    threading.current_thread().name = "interruption"
    main()
