"""helper-89's attack on commit 33c34a7: unihook/_global_table.py (torch's and MindSpore's global
registration hook dicts replaced by a `GlobalTable` -- unihook's hooks in ``own``, native ones
in the origin, merged by key -- while unihook has registration hooks).

Tests named ``test_finding_*`` FAIL on a real finding (one per finding); the others are
attacks that held.

    cd /tmp/h89 && GLOG_minloglevel=2 PYTHONPATH=/tmp/h89:/tmp/h89/backends \
        /work/main/.venv/bin/python -m pytest -q tests/test_attack_h89.py
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import torch.nn.modules.module as tm  # noqa: E402
from torch.utils.hooks import RemovableHandle  # noqa: E402

import unihook  # noqa: E402

ATTR = "_global_buffer_registration_hooks"
KINDS = ("parameter", "buffer", "module")
MS_PY = Path("/work/main/.venv-mindspore/bin/python")
ROOT = Path(__file__).resolve().parents[1]


def _uni(hook: Callable[..., Any]) -> Any:
    return unihook.register_module_buffer_registration_hook(hook, backend="torch")


def _native(hook: Callable[..., Any]) -> Any:
    return tm.register_module_buffer_registration_hook(hook)


class _Rec:
    """A buffer registration hook that records its name."""

    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def __call__(self, module: Any, name: str, value: Any) -> None:
        self.calls.append(self.name)


def _fire(calls: list[str]) -> list[str]:
    calls.clear()
    torch.nn.Module().register_buffer("b", torch.ones(1))
    return list(calls)


# FINDINGS 1 and move_to_end: fixed (the table keeps the order keys went in); 3: fixed (one
# table per dict).


@pytest.fixture(autouse=True)
def _clean() -> Any:
    """Each test starts and ends with torch's own dicts, empty."""
    origins = {what: getattr(tm, f"_global_{what}_registration_hooks") for what in KINDS}
    for what, origin in origins.items():
        assert type(origin) is OrderedDict and not origin, what
    yield
    for what, origin in origins.items():
        setattr(tm, f"_global_{what}_registration_hooks", origin)
        origin.clear()


# --- FINDING 1: order by key, not by insertion (fixed) -----------------------------------


def test_finding_native_hook_inserted_later_under_an_older_key_runs_before_unihooks() -> None:
    """torch runs its global hooks in the dict's insertion order. A library that reserves a
    handle (its key) once and switches its hook on and off by ``dict[key] = hook`` /
    ``del dict[key]`` (or any key not from the live counter: ``id(hook)``, a re-used key)
    inserts a native hook *after* unihook's under an *older* key: the table's merge by key runs
    it before unihook's, where torch (unihook's hook being torch's own) runs it after. The
    merge also assumes the origin is sorted by key, which insertion order does not give."""
    calls: list[str] = []
    origin = getattr(tm, ATTR)
    reserved = RemovableHandle(origin)  # a library's key, taken at its import
    h = _uni(_Rec(calls, "unihook"))
    getattr(tm, ATTR)[reserved.id] = _Rec(calls, "switched on")  # switched on afterwards
    try:
        assert _fire(calls) == ["unihook", "switched on"]  # as torch: insertion order
    finally:
        getattr(tm, ATTR).pop(reserved.id, None)
        h.remove()


# --- FINDING 2: a key that is not an int --------------------------------------------------


def test_finding_a_non_int_key_in_the_dict_makes_every_registration_raise() -> None:
    """torch's dict is an OrderedDict its loop reads ``.values()`` of: any key works (a
    library's ``dict["mylib"] = hook``). With a unihook hook there, the table's heapq.merge
    compares keys: TypeError "'<' not supported between 'str' and 'int'" from every
    register_buffer in the process, natively fine."""
    calls: list[str] = []
    h = _uni(_Rec(calls, "unihook"))
    getattr(tm, ATTR)["mylib"] = _Rec(calls, "lib")
    try:
        assert sorted(_fire(calls)) == ["lib", "unihook"]
    finally:
        getattr(tm, ATTR).pop("mylib", None)
        h.remove()


# --- FINDING 3: a library's save / swap / restore of the dict -----------------------------


def _swap_and_restore(register: Callable[..., Any]) -> tuple[list[str], bool, bool]:
    """A native hook, then `register`'s u1; a library's quiet section (``saved = d; d =
    OrderedDict(); ...; d = saved``) during which `register` makes u2; the hooks that fire
    after it, whether torch's dict is back once u1 and u2 went, holding the native hook alone."""
    calls: list[str] = []
    origin = getattr(tm, ATTR)
    native = _native(_Rec(calls, "native"))
    h1 = register(_Rec(calls, "u1"))
    saved = getattr(tm, ATTR)
    setattr(tm, ATTR, OrderedDict())  # the library's quiet section
    h2 = register(_Rec(calls, "u2"))
    setattr(tm, ATTR, saved)  # ... ends
    try:
        got = _fire(calls)
        h2.remove()
        h1.remove()
        return got, getattr(tm, ATTR) is origin, list(origin) == [native.id]
    finally:
        native.remove()
        h2.remove()
        h1.remove()


def test_finding_swap_and_restore_around_a_unihook_registration_keeps_native_hooks() -> None:
    """FIXED (one table per dict: `_global_table._table_for`). A library that silences the
    global hooks for a while while unihook has a hook, and unihook registers another
    meanwhile: `add_to_global_table` rebound the table's origin to the library's temporary
    dict, so the restored `saved` (the table) read the temporary one: the native hooks never
    fired again, and after unihook's last removal torch's dict was the temporary one (the
    original, with its native hooks, gone). Now as with torch's own registrations (the
    oracle): the native hook and u1 fire, u2 went with the library's dict, torch's dict is
    back with its native hook."""
    assert _swap_and_restore(_uni) == _swap_and_restore(_native) == (["native", "u1"], True, True)


# --- FINDING 4: a native write under one of unihook's keys --------------------------------


def test_finding_rewriting_a_unihook_key_runs_its_hook_twice_and_after_removal() -> None:
    """A profiler that wraps every global hook in place (``for k in list(d): d[k] =
    wrap(d[k])``): for unihook's key the write goes to the origin while the table keeps its own
    entry under the same key: unihook's hook then runs twice per registration (torch: once,
    wrapped), `len` counts the key twice, and after the handle's removal the wrapped copy stays
    in torch's dict: the removed hook keeps firing and is kept alive."""
    calls: list[str] = []
    hook = _Rec(calls, "u")
    alive = weakref.ref(hook)
    h = _uni(hook)
    del hook
    d = getattr(tm, ATTR)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any) -> Any:
            calls.append("wrapped")
            return f(*a)

        return wrapped

    for k in list(d):
        d[k] = wrap(d[k])
    during = (_fire(calls), len(d), len(list(d)))
    h.remove()
    gc.collect()
    after = (_fire(calls), alive() is None)
    assert (during, after) == ((["wrapped", "u"], 1, 1), ([], True))


@pytest.mark.skipif(not MS_PY.exists(), reason="no MindSpore venv")
def test_finding_1_and_4_on_mindspore_too() -> None:
    """MindSpore's buffer hooks (HookHandle.unique_id keys): the same two results."""
    code = textwrap.dedent(
        """
        import numpy as np, mindspore as ms, mindspore.nn.cell as cm, unihook
        from mindspore.common.hook_handle import HookHandle
        A = "_global_buffer_registration_hooks"; O = getattr(cm, A); calls = []
        def mk(n): return lambda c, name, t: calls.append(n)
        def fire():
            calls.clear(); ms.nn.Cell().register_buffer("b", ms.Tensor(np.ones(1, np.float32)))
            return list(calls)
        reserved = HookHandle(O)
        u = unihook.register_module_buffer_registration_hook(mk("u"), backend="mindspore")
        getattr(cm, A)[reserved.handle_id] = mk("switched on")
        print("order", fire())
        del getattr(cm, A)[reserved.handle_id]
        d = getattr(cm, A)
        def wrap(f):
            def w(*a): calls.append("wrapped"); return f(*a)
            return w
        for k in list(d): d[k] = wrap(d[k])
        print("wrap", fire())
        u.remove()
        print("after", fire())
        """
    )
    out = subprocess.run(
        [str(MS_PY), "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'backends'}", "GLOG_minloglevel": "2"},
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.split(" ")[0] in ("order", "wrap", "after")]
    assert lines == [
        "order ['u', 'switched on']",
        "wrap ['wrapped', 'u']",
        "after []",
    ], out.stderr[-2000:]


# --- FINDING 5: torch.compile(fullgraph=True) -------------------------------------------


def test_finding_fullgraph_compile_of_a_buffer_registration_with_a_unihook_hook() -> None:
    """torch.compile(fullgraph=True) of a function building a module that registers a buffer
    traces torch's ``for hook in _global_buffer_registration_hooks.values()``: natively fine;
    with a unihook buffer registration hook it raises dynamo's Unsupported ("does not know how
    to trace method `__call__` of class `itemgetter`", the table's heapq.merge key), a failure
    the README's fullgraph list does not name (nothing unihook does at a call here needs a
    graph break: the hook itself is traceable)."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.ones(2))

    def f(x: Any) -> Any:
        return x + M().b

    got = []
    for register in (_native, _uni):
        torch._dynamo.reset()
        h = register(lambda m, n, v: v * 2)
        try:
            got.append(torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(2)).tolist())
        except Exception as e:  # noqa: BLE001
            got.append(f"{type(e).__name__}: {str(e)[:160]}")
        finally:
            h.remove()
    torch._dynamo.reset()
    assert got == [[2.0, 2.0], [2.0, 2.0]]


# --- FINDING 6: OrderedDict API the table lacks ------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        "move_to_end",
        "reversed",
        "or",
        "eq_is_ordered",
    ],
)
def test_finding_ordereddict_methods_missing_on_the_table(op: str) -> None:
    """The attribute is typed and documented by torch as an OrderedDict; code that orders
    torch's global hooks (``move_to_end(key, last=False)`` to run first, ``reversed``) or
    merges them (``|``) fails on the table (AttributeError / TypeError), and ``==`` with an
    OrderedDict ignores order (Mapping.__eq__), which an OrderedDict's does not."""
    calls: list[str] = []
    h = _uni(_Rec(calls, "u"))
    n = _native(_Rec(calls, "n"))
    d = getattr(tm, ATTR)
    try:
        if op == "move_to_end":
            d.move_to_end(n.id, last=False)
            assert _fire(calls) == ["n", "u"]
        elif op == "reversed":
            assert list(reversed(d)) == list(d)[::-1]
        elif op == "or":
            assert list(d | {}) == list(d)
        else:
            assert d != OrderedDict(reversed(list(d.items())))
    finally:
        n.remove()
        h.remove()


# --- FINDING 7: the table keeps a dict the library dropped alive -------------------------


def test_finding_table_keeps_a_dropped_origin_and_its_native_hooks_alive() -> None:
    """After a unihook tenure, a library replaces torch's dict (``module._global_... =
    OrderedDict()``) and drops the old one with its native hooks: torch would free them; the
    process-long table keeps the old dict as its ``origin`` until unihook's next registration,
    so the hooks (and what they hold: models, tensors) stay alive."""

    class Big:
        def __call__(self, *a: Any) -> None:
            pass

    def cycle(tenure: bool) -> bool:
        setattr(tm, ATTR, OrderedDict())  # (a dict no one else holds: the fixture has torch's)
        hook = Big()
        alive = weakref.ref(hook)
        _native(hook)
        del hook
        if tenure:
            _uni(lambda m, n, v: None).remove()
        setattr(tm, ATTR, OrderedDict())  # the library's fresh dict; the old one is dropped
        gc.collect()
        return alive() is None

    assert cycle(tenure=False)  # torch alone frees them
    assert cycle(tenure=True)


# --- held --------------------------------------------------------------------------------


def test_held_removal_from_a_weakref_callback_and_gc_during_registrations() -> None:
    """unihook hooks removed by weakref callbacks (an object dying inside a hook, during the
    framework's loop) while native hooks come and go: every registration sees each
    surviving hook once, and the end state is torch's own dict, with only native hooks."""
    origin = getattr(tm, ATTR)
    calls: list[str] = []

    class Owner:
        pass

    for _ in range(30):
        owners = [Owner() for _ in range(3)]
        handles = [_uni(_Rec(calls, f"u{i}")) for i in range(3)]
        refs = [weakref.ref(o, lambda _r, h=h: h.remove()) for o, h in zip(owners, handles)]
        nat = _native(_Rec(calls, "n"))

        def killer(m: Any, name: str, v: Any) -> None:
            owners.clear()  # the weakref callbacks remove unihook's hooks mid-loop

        k = _native(killer)
        got = _fire(calls)
        assert got.count("n") == 1 and len(got) == len(set(got))
        k.remove()
        nat.remove()
        assert all(r() is None for r in refs)
    assert getattr(tm, ATTR) is origin and not origin


def test_held_threads_native_and_unihook_churn_beside_registrations() -> None:
    """Three threads: unihook hooks churned, native hooks churned, modules registering
    buffers: no error, and torch's own dict back, empty of unihook's."""
    origin = getattr(tm, ATTR)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(step: Callable[[], None]) -> Callable[[], None]:
        def loop() -> None:
            try:
                while not stop.is_set():
                    step()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        return loop

    def uni() -> None:
        _uni(lambda m, n, v: None).remove()

    def nat() -> None:
        _native(lambda m, n, v: None).remove()

    def reg() -> None:
        torch.nn.Module().register_buffer("b", None)

    threads = [threading.Thread(target=run(s)) for s in (uni, nat, reg)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        threading.Event().wait(2.0)
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:1]
    assert getattr(tm, ATTR) is origin and not origin


def test_held_ctrl_c_at_every_position_by_the_projects_harness() -> None:
    """tests/interruption_child.py (trace-raised KeyboardInterrupt at every position of the
    registration and removal, plus real SIGINTs) on the buffer registration kind: no failure
    (run by hand for the module kind too: held)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "interruption_child.py"),
            "torch",
            "buffer_registration",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'backends'}", "GLOG_minloglevel": "2"},
    )
    assert '"failures": 0' in out.stdout and '"problems": []' in out.stdout, out.stdout[-2000:]
