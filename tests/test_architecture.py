"""The architecture's rules (ARCHITECTURE.md), checked on the source: backends and the shipped
conformance suite import only public unihook modules, no module-level import cycles, hook
kinds derived from one table, recipes and the suite import no framework.
That ``import unihook`` imports no framework is test_core's
``test_import_unihook_imports_no_framework`` (it loads every backend, hence unihook.backend)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Callable, Iterator, get_args

import pytest

import unihook.backend
from unihook import api, compose, global_hooks
from unihook._plugins import plugin_manager
from unihook.kinds import (
    GLOBAL_KINDS,
    KIND_INFO,
    KINDS,
    MODULE_KINDS,
    GlobalKind,
    HookKind,
    ModuleKind,
)

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ROOT / "backends"


def _modules() -> dict[str, Path]:
    """Every module of unihook and of the backends, by its dotted name."""
    files = [*(ROOT / "unihook").rglob("*.py"), *BACKENDS.rglob("*.py")]
    modules = {}
    for path in files:
        rel = path.relative_to(BACKENDS if BACKENDS in path.parents else ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _package(name: str) -> str:
    """The package a module's relative imports start from."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module_level: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `tree`; with `module_level`, only those that run when the
    module is imported (not in a function, nor under ``if TYPE_CHECKING:``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif module_level and isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), module_level)
        else:
            yield from _imports(node, module_level)


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names `node` in module `name` imports: for ``from X import y``, X.y when
    it is a module, else X."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = _package(name).split(".")
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([base] if base else [])])
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        for alias in node.names
    ]


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), str(MODULES[name]))


def _is_private(module: str) -> bool:
    return module.split(".")[0] == "unihook" and any(
        part.startswith("_") and not part.startswith("__") for part in module.split(".")
    )


def test_backends_import_only_public_unihook_modules() -> None:
    backends = [name for name in MODULES if name.split(".")[0] != "unihook"]
    assert {name.split(".")[0] for name in backends} >= {"unihook_torch", "unihook_paddle"}
    private = [
        f"{MODULES[name].relative_to(ROOT)}:{node.lineno} imports {target}"
        for name in backends
        for node in _imports(_tree(name), module_level=False)
        for target in _targets(name, node)
        if _is_private(target)
    ]
    assert private == []


def test_the_conformance_suite_imports_public_unihook_modules_and_no_framework() -> None:
    """Every test of unihook.conformance runs on any backend through its kit: a framework
    import (any, function bodies included) or a private unihook module would tie it to one."""
    suite = [name for name in MODULES if name.startswith("unihook.conformance")]
    assert {"unihook.conformance.conftest", "unihook.conformance.test_forward_hooks"} <= set(suite)
    wrong = [
        f"{MODULES[name].relative_to(ROOT)}:{node.lineno} imports {target}"
        for name in suite
        for node in _imports(_tree(name), module_level=False)
        for target in _targets(name, node)
        if _is_private(target) or target.split(".")[0] in ("torch", "paddle", "mindspore")
    ]
    assert wrong == []


def test_recipes_import_no_private_core_module() -> None:
    """The recipes are ordinary users of the public API (their own private modules aside)."""
    recipes = [name for name in MODULES if name.startswith("unihook.recipes")]
    assert "unihook.recipes._scope" in recipes
    private = [
        f"{MODULES[name].relative_to(ROOT)}:{node.lineno} imports {target}"
        for name in recipes
        for node in _imports(_tree(name), module_level=False)
        for target in _targets(name, node)
        if _is_private(target) and not target.startswith("unihook.recipes.")
    ]
    assert private == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> modules it imports), each as a closed path."""
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycles.append(path[path.index(name) :] + [name])
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return cycles


def test_no_module_level_import_cycles() -> None:
    graph = {
        name: {
            target
            for node in _imports(_tree(name), module_level=True)
            for target in _targets(name, node)
            if target in MODULES and target != name
        }
        for name in MODULES
    }
    assert graph["unihook.api"] >= {"unihook._plugins", "unihook.kinds"}
    assert _cycles(graph) == []


def test_the_import_graph_checks() -> None:
    """The graph reads relative imports and skips function bodies and TYPE_CHECKING blocks;
    the cycle search finds a cycle."""
    tree = ast.parse(
        "from . import api\nfrom .kinds import KINDS\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .ops import Ops\n"
        "def f():\n    from .capture import capture\n"
    )
    found = [t for node in _imports(tree, module_level=True) for t in _targets("unihook", node)]
    assert found == ["unihook.api", "unihook.kinds", "typing"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_kind_table_matches_the_literal_types() -> None:
    assert tuple(KIND_INFO) == KINDS == get_args(HookKind)
    assert all(name == info.name for name, info in KIND_INFO.items())
    assert MODULE_KINDS == get_args(ModuleKind)
    assert MODULE_KINDS == tuple(k for k, i in KIND_INFO.items() if i.target == "module")
    assert set(GLOBAL_KINDS) == set(get_args(GlobalKind))
    assert set(GLOBAL_KINDS.values()) == {
        k for k, i in KIND_INFO.items() if i.target in ("global", "registration")
    }
    assert tuple(compose.KINDS) == MODULE_KINDS


def _options(function: Callable[..., object]) -> set[str]:
    names = inspect.signature(function).parameters
    return set(names) & {"prepend", "with_kwargs", "always_call"}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_options_are_its_functions_keywords(kind: HookKind) -> None:
    info = KIND_INFO[kind]
    if info.spec_kind is None:
        function = getattr(api, f"register_{kind}_hook")
    else:
        function = getattr(global_hooks, f"register_module_{info.spec_kind}_hook")
    assert _options(function) == info.options


def test_every_backend_states_its_support_of_every_kind() -> None:
    infos = plugin_manager().hook.unihook_backend_info()
    assert infos
    for info in infos:
        assert set(info.kinds) == set(KINDS), info.name


def test_the_backend_sdk_is_documented() -> None:
    for name in unihook.backend.__all__:
        value = getattr(unihook.backend, name)
        assert inspect.getdoc(value), name


def test_recipes_import_no_framework() -> None:
    for path in (ROOT / "unihook" / "recipes").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in ("torch", "paddle"), f"{path.name} imports {name}"
