"""The core without a framework: laziness, plugin discovery, errors, handles, the table."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import unihook
from unihook.info import KINDS
from unihook.ops import Ops

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, env: dict[str, str] | None = None, path: Path | None = None) -> str:
    full_env = {**os.environ, **(env or {})}
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(path), full_env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_unihook_imports_no_framework() -> None:
    out = run_python(
        """
        import sys, unihook
        unihook.backends()                    # loads every backend plugin
        unihook.register_forward_hook         # touches the API
        try:
            unihook.backend_of(object())
        except unihook.NoBackendError:
            pass
        print('torch' in sys.modules, 'paddle' in sys.modules)
        print('pytest' in sys.modules, 'unihook.conformance' in sys.modules)
        """
    )
    assert out == "False False\nFalse False"  # pytest: only the `test` extra


TOY_BACKEND = """
import sys
from unihook.spec import hookimpl
from unihook.handles import Handle
from unihook.info import BackendInfo
from unihook.ops import Ops


class ToyModule:
    def __init__(self):
        self.hooks = {}

    def __call__(self, x):
        out = x * 2
        for hook in list(self.hooks.values()):
            result = hook(self, (x,), out)
            out = out if result is None else result
        return out


class ToyTensor:
    def __init__(self, values):
        self.values = values


class ToyOps(Ops):  # the SDK's ops facet: two methods; the others' defaults, or an error
    is_tensor = staticmethod(lambda obj: isinstance(obj, ToyTensor))

    def to_numpy(self, t):
        import numpy

        return numpy.asarray(t.values)


@hookimpl
def unihook_backend_info():
    return BackendInfo("toy", "toy", "0.1", {"forward": "native"})


@hookimpl
def unihook_ops(obj):
    return ToyOps() if isinstance(obj, (ToyTensor, ToyModule)) else None


@hookimpl
def unihook_backend_of(obj):
    return "toy" if isinstance(obj, ToyModule) else None


@hookimpl
def unihook_register_forward_hook(module, hook, prepend, with_kwargs, always_call, name):
    if not isinstance(module, ToyModule):
        return None
    key = object()
    module.hooks[key] = hook
    return Handle("toy", "forward", lambda: module.hooks.pop(key, None))
"""


@pytest.fixture
def toy_backend(tmp_path: Path) -> Path:
    """A third-party backend installed the way a wheel would install it: a module plus a
    dist-info folder declaring it in the ``unihook`` entry-point group."""
    (tmp_path / "toy_backend.py").write_text(TOY_BACKEND)
    info = tmp_path / "toy_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[unihook]\ntoy = toy_backend\n")
    return tmp_path


# a module whose import another thread starts and which waits for the test: `fail` raises
SLOW_MODULE = """
import threading
started, go = threading.Event(), threading.Event()
holder = __import__("unihook_slow_holder")
holder.started.set()
assert holder.go.wait(30)
if holder.fail:
    raise ImportError("unihook's test: failed on purpose")
DONE = True
"""


def test_when_imported_during_an_import_on_another_thread_runs_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callback asked for while another thread imports the module runs as that import
    ends, on the module as it ends (helper-96's FINDING 4: run at once, on a module still
    being imported, torch's backend raised AttributeError); one whose import fails runs at the
    next import that succeeds; ``imported`` tells a module under way from one imported."""
    import importlib.machinery
    import threading
    import types

    from unihook.backend import imported, when_imported

    def slow_import(name: str, fail: bool, during: Any) -> list[BaseException]:
        """Import `name` on another thread, calling `during()` while it waits."""
        holder = types.SimpleNamespace(started=threading.Event(), go=threading.Event(), fail=fail)
        monkeypatch.setitem(sys.modules, "unihook_slow_holder", holder)
        errors: list[BaseException] = []

        def load() -> None:
            try:
                importlib.import_module(name)
            except ImportError as error:
                errors.append(error)

        thread = threading.Thread(target=load)
        thread.start()
        assert holder.started.wait(30)
        assert name in sys.modules and imported(name) is None
        during()
        holder.go.set()
        thread.join(30)
        return errors

    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[object] = []
    for name in ("unihook_slow_ok", "unihook_slow_failing"):
        (tmp_path / f"{name}.py").write_text(SLOW_MODULE)
        monkeypatch.delitem(sys.modules, name, raising=False)

    def ask(name: str) -> None:
        when_imported(name, lambda module: seen.append((name, module.DONE)))
        assert seen == []

    assert slow_import("unihook_slow_ok", False, lambda: ask("unihook_slow_ok")) == []
    assert seen == [("unihook_slow_ok", True)]
    assert type(sys.modules["unihook_slow_ok"].__spec__) is importlib.machinery.ModuleSpec
    assert imported("unihook_slow_ok") is sys.modules["unihook_slow_ok"]
    seen.clear()
    failing = "unihook_slow_failing"
    errors = slow_import(failing, True, lambda: ask(failing))
    assert [type(e) for e in errors] == [ImportError] and seen == []
    assert slow_import(failing, False, lambda: None) == []
    assert seen == [(failing, True)]
    for name in ("unihook_slow_ok", failing):
        monkeypatch.delitem(sys.modules, name)


def test_third_party_backend_is_found_through_the_entry_point_group(toy_backend: Path) -> None:
    out = run_python(
        """
        import sys, unihook
        from toy_backend import ToyModule
        print(sorted(b.name for b in unihook.backends()))
        m = ToyModule()
        h = unihook.register_forward_hook(m, lambda mod, args, out: out + 1)
        print(unihook.backend_of(m), h.backend, h.kind, m(3))
        h.remove()
        print(m(3))
        try:
            unihook.register_forward_pre_hook(m, lambda mod, args: None)
        except unihook.UnsupportedHookError as e:
            print("unsupported:", "forward_pre" in str(e), "toy" in str(e))
        print('torch' in sys.modules, 'paddle' in sys.modules)
        """,
        path=toy_backend,
    )
    lines = out.splitlines()
    assert "toy" in lines[0] and "torch" in lines[0] and "paddle" in lines[0]
    assert lines[1:] == ["toy toy forward 7", "6", "unsupported: True True", "False False"]


def test_a_third_party_ops_facet_gets_the_defaults_and_names_what_it_lacks(
    toy_backend: Path,
) -> None:
    """`unihook.ops.Ops` is the base of a backend's ops facet: what it leaves out has the
    documented default (one process, no wrapper, gradients recorded, no leaf) or raises
    NotImplementedError naming the facet and the method."""
    out = run_python(
        """
        import unihook.ops as ops
        from toy_backend import ToyModule, ToyTensor
        t, m = ToyTensor([1.0, 2.0]), ToyModule()
        print(ops.to_numpy(t).tolist(), ops.world(t), ops.unwrap(m) is m)
        print(ops.grad_enabled(t), ops.is_leaf(t), ops.float64_copy(m))
        try:
            ops.sum(t)
        except NotImplementedError as e:
            print(e)
        """,
        path=toy_backend,
    )
    assert out.splitlines() == [
        "[1.0, 2.0] None True",
        "True False None",
        "unihook.ops: the backend's ops facet (ToyOps) must implement `sum`; it has no default.",
    ]


def test_a_backend_can_be_disabled_by_environment(toy_backend: Path) -> None:
    out = run_python(
        "import unihook; print(sorted(b.name for b in unihook.backends()))",
        env={"UNIHOOK_DISABLE": "toy,paddle,mindspore"},
        path=toy_backend,
    )
    assert out == "['torch']"


def test_backends_reports_versions_and_kinds() -> None:
    infos = {info.name: info for info in unihook.backends()}
    assert {"torch", "paddle"} <= set(infos)
    for info in infos.values():
        for kind in KINDS:
            assert info.support(kind) in ("native", "emulated", "unsupported")
    if infos["paddle"].installed:
        # paddle 3.3.1 has no Layer backward hooks: unihook emulates them.
        assert infos["paddle"].support("full_backward") == "emulated"
        assert infos["paddle"].support("forward") == "native"


@pytest.mark.parametrize("obj", [object(), 3.0, [1, 2], None])
def test_objects_of_no_backend(obj: object) -> None:
    with pytest.raises(unihook.NoBackendError) as info:
        unihook.register_forward_hook(obj, lambda *a: None)
    assert isinstance(info.value, TypeError)
    assert "register_forward_hook" in str(info.value) and type(obj).__name__ in str(info.value)
    with pytest.raises(unihook.NoBackendError):
        unihook.backend_of(obj)


def test_error_tree() -> None:
    assert issubclass(unihook.NoBackendError, (unihook.UnihookError, TypeError))
    assert issubclass(unihook.UnsupportedHookError, (unihook.UnihookError, NotImplementedError))
    assert issubclass(unihook.HookReturnError, unihook.UnihookError)
    assert issubclass(unihook.HookTargetError, unihook.UnihookError)
    for name in unihook.errors.__all__:
        assert getattr(unihook, name).__doc__


def test_handle_is_idempotent_and_a_context_manager() -> None:
    calls: list[int] = []
    handle = unihook.Handle("x", "forward", lambda: calls.append(1))
    with handle as same:
        assert same is handle and not handle.removed
    assert handle.removed and calls == [1]
    handle.remove()
    assert calls == [1]
    assert "removed" in repr(handle)


# -- the frameworks' versions (issue 13) ------------------------------------------------------


def _declared_lower_bound(distribution: str) -> str:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
        import tomli as tomllib  # type: ignore[no-redef]

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for spec in [*extras["torch"], *extras["paddle"]]:
        name, _, bound = spec.partition(">=")
        if name.strip() == distribution:
            return bound.strip()
    raise AssertionError(f"pyproject.toml declares no {distribution}>= bound")


def test_backends_check_the_lower_bounds_pyproject_declares() -> None:
    import unihook_paddle
    import unihook_torch

    assert unihook_torch.MIN_VERSION == _declared_lower_bound("torch")
    assert unihook_paddle.MIN_VERSION == _declared_lower_bound("paddlepaddle")


def test_torch_older_than_the_lower_bound_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import unihook_torch

    from unihook.conformance import kit

    backend = kit("torch")
    import torch

    monkeypatch.setattr(torch, "__version__", "2.12.1+cu121")
    monkeypatch.setattr(unihook_torch, "_version_checked", False)
    module = backend.linear(2, 2)
    with pytest.warns(RuntimeWarning) as caught:
        unihook.register_forward_hook(module, lambda *a: None).remove()
    (warning,) = caught
    message = str(warning.message)
    assert "expects torch>=2.13" in message and "Received: torch 2.12.1+cu121" in message
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        unihook.register_forward_hook(module, lambda *a: None).remove()
    # a release at the bound, or a source build, claims silently
    for version in ("2.13.0+cpu", "2.14.0.dev20260101", "0.0.0"):
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(unihook_torch, "_version_checked", False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            unihook.register_forward_hook(module, lambda *a: None).remove()


def test_paddle_older_than_the_lower_bound_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import unihook_paddle

    from unihook.conformance import kit

    backend = kit("paddle")
    import paddle

    layer = backend.linear(2, 2)
    monkeypatch.setattr(paddle, "__version__", "3.2.0")
    monkeypatch.setattr(unihook_paddle, "_version_checked", False)
    for register in (
        lambda: unihook.register_forward_hook(layer, lambda *a: None, always_call=True),
        lambda: unihook.backend_of(layer),  # every claim, until paddle is upgraded
    ):
        with pytest.raises(unihook.BackendStateError) as info:
            register()
        message = str(info.value)
        assert "expected paddlepaddle>=3.3" in message and "Received: paddle 3.2.0" in message
    assert sum(backend.hook_counts(layer).values()) == 0
    for version in ("3.3.0", "3.3.1.post2", "0.0.0"):  # 0.0.0: a develop build
        monkeypatch.setattr(paddle, "__version__", version)
        monkeypatch.setattr(unihook_paddle, "_version_checked", False)
        assert unihook.backend_of(layer) == "paddle"


# -- nothing to take the object or the hook (issue 13) ----------------------------------------


def test_no_backend_says_what_unihook_disable_left_out() -> None:
    out = run_python(
        """
        import unihook
        for call in (lambda: unihook.backend_of(object()),
                     lambda: unihook.register_forward_hook(object(), lambda *a: None)):
            try:
                call()
            except unihook.NoBackendError as error:
                print(error)
        """,
        env={"UNIHOOK_DISABLE": "torch,paddle,mindspore"},
    )
    first, second = out.splitlines()
    assert first.startswith(
        "backend_of: expected a module or tensor of an installed backend (none)"
    )
    assert second.startswith("register_forward_hook: expected a module or tensor")
    for message in (first, second):
        assert (
            "Disabled by UNIHOOK_DISABLE=torch,paddle,mindspore: unset it to use them." in message
        )
        assert "No framework is installed" not in message  # they are, only disabled


def test_no_backend_says_how_to_install_a_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    from unihook import api
    from unihook.info import BackendInfo

    monkeypatch.delenv("UNIHOOK_DISABLE", raising=False)
    missing = [BackendInfo("paddle", "paddle", None), BackendInfo("torch", "torch", None)]
    monkeypatch.setattr(api, "backends", lambda: missing)
    with pytest.raises(unihook.NoBackendError) as info:
        unihook.backend_of(object())
    message = str(info.value)
    assert message.startswith("backend_of: expected a module or tensor of an installed backend")
    assert "No framework is installed (paddle, torch): pip install 'unihook[torch]'" in message
    assert "UNIHOOK_DISABLE" not in message


GLOBAL_WITH_NOTHING = """
import unihook
for register in (unihook.register_module_forward_hook,
                 unihook.register_module_full_backward_hook,
                 unihook.register_module_buffer_registration_hook):
    try:
        handle = register(lambda *a: None)
        print("handle", handle)
    except unihook.UnihookError as error:
        print(type(error).__name__, error)
"""


def test_a_global_hook_nothing_takes_is_an_error() -> None:
    """No backend installed (here: all disabled): no handle that would never fire."""
    out = run_python(GLOBAL_WITH_NOTHING, env={"UNIHOOK_DISABLE": "torch,paddle"})
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith("NoBackendError ") for line in lines), out
    for line, kind in zip(lines, ["module_forward", "module_full_backward", "buffer_registration"]):
        assert f"{kind} hook on every module [backend none]: expected an installed backend" in line
        assert "Disabled by UNIHOOK_DISABLE=torch,paddle" in line


def test_a_global_hook_no_installed_backend_implements_is_unsupported(toy_backend: Path) -> None:
    out = run_python(GLOBAL_WITH_NOTHING, env={"UNIHOOK_DISABLE": "torch,paddle"}, path=toy_backend)
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith("UnsupportedHookError ") for line in lines)
    assert "module_forward hook on every module [backend toy]" in lines[0]
    assert "installed backends 'toy', none of which does" in lines[0]


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ("2.12.1+cpu", True),
        ("2.13.0+cpu", False),
        ("2.13.0.dev20260101", False),
        ("3.2.0.post1", True),
        ("0.0.0", False),
        ("unknown", False),
        ("10.0", False),
    ],
)
def test_older_than_reads_release_numbers(installed: str, expected: bool) -> None:
    from unihook.info import older_than

    minimum = "3.3" if installed.startswith("3.") else "2.13"
    assert older_than(installed, minimum) is expected


class _Tensor:
    """A stand-in tensor for the SDK's walkers (framework-free)."""


class _Owner:
    pass


class _Lazy(dict):  # type: ignore[type-arg]
    def values(self) -> Any:  # type: ignore[override]
        raise RuntimeError("values() ran")


class _Slotted:
    __slots__ = ("a", "b", "empty")

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


class _Gets:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("__getattr__ ran")


def test_the_sdk_walks_what_a_module_holds_without_running_its_code() -> None:
    """`unihook.backend.items_of` and `held_tensors` (every hooked call may walk a module's
    attributes): a dead `weakref.proxy` (a back-reference whose owner is gone: `isinstance` on
    it raised ReferenceError), a dict subclass's own `values`, a `__getattr__`, slots, a
    namedtuple; and a large container costs no more than the values looked at (it was copied
    whole before the cap: helper-49)."""
    import collections
    import weakref

    from unihook.backend import held_tensors, items_of

    t1, t2, t3, t4 = _Tensor(), _Tensor(), _Tensor(), _Tensor()
    owner = _Owner()
    dead = weakref.proxy(owner)
    del owner
    pair = collections.namedtuple("pair", "x y")(t2, 1)
    module = _Owner()
    module.__dict__.update(
        parent=dead, lazy=_Lazy(k=t1), pair=pair, slots=_Slotted(t3, 0), gets=_Gets(),
        big={i: i for i in range(100_000)}, t=t4,
    )  # fmt: skip
    assert list(items_of(dead)) == []
    assert list(items_of(_Lazy(k=t1))) == [t1]
    assert list(items_of(pair)) == [t2, 1]
    assert list(items_of(_Slotted(t3, 0))) == [t3, 0]
    assert list(items_of(_Slotted(t3, 0), most=2)) == []
    assert list(items_of(_Gets())) == []
    found = {id(t) for _, t in held_tensors(module, lambda v: isinstance(v, _Tensor))}
    assert found == {id(t1), id(t2), id(t3), id(t4)}


def test_the_default_derived_from_cannot_tell_past_an_object_whose_class_raises() -> None:
    """`Ops.derived_from`'s default (a third party's backend without its own): an attribute
    value whose ``__class__`` raises (a proxy) is one it cannot tell (None), not an error out
    of the module's forward."""

    class Proxy:
        @property  # type: ignore[misc]
        def __class__(self) -> type:  # type: ignore[override]
            raise RuntimeError("a proxy's own check")

    class Tensor:
        pass

    class Minimal(Ops):
        is_tensor = staticmethod(lambda obj: isinstance(obj, Tensor))

    t = Tensor()
    assert Minimal().derived_from([t, 3], [t], []) is False
    assert Minimal().derived_from([Proxy()], [t], []) is None
    assert Minimal().derived_from([Tensor()], [t], []) is None
