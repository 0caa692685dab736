"""What a user gets from `pip install`: the built wheel and sdist, installed into fresh venvs that
hold one framework each, without this repository on the path.

Each venv sees only the distributions the wheel's metadata asks for (``unihook[torch]``,
``unihook[paddle]`` or ``unihook[mindspore]`` and their requirements, followed through the
running venv's metadata): they are symlinked from its site-packages into a directory that a .pth
file adds to the path. A dependency the wheel forgets to declare is missing there, and the other
frameworks cannot be imported at all. MindSpore's venv is made from the MindSpore venv's
packages (numpy 1.x): `make test-mindspore` runs its cases, the dev suite skips them.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable

import pytest
from children import run_code
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import unihook

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = {"torch": "torch", "paddle": "paddlepaddle", "mindspore": "mindspore"}  # extra -> dist
# what each framework's paragraph of the quickstart prints, and a tensor of ones made with it
SHOWN = {"torch": "Linear [2, 4]", "paddle": "Linear [2, 4]", "mindspore": "Dense [2, 4]"}
ONES = {
    "torch": "torch.ones([2, 3])",
    "paddle": "paddle.ones([2, 3])",
    "mindspore": "mindspore.ops.ones((2, 3), mindspore.float32)",
}


def _installed(framework: str) -> Any:
    """A parameter for `framework`, skipped where the running venv lacks it (MindSpore's cases
    run in its own venv: `make test-mindspore`)."""
    present = find_spec(framework) is not None
    reason = f"{framework} is not in this venv (make test-mindspore runs it)"
    return pytest.param(framework, marks=pytest.mark.skipif(not present, reason=reason))


ONE_FRAMEWORK = [_installed(f) for f in FRAMEWORKS]
# what the sdist holds besides the packages: enough to run its own `make test`
SDIST_TOP = {
    "ARCHITECTURE.md",
    "CHANGELOG.md",
    "LICENSE",
    "MANIFEST.in",
    "Makefile",
    "PKG-INFO",
    "README.md",
    "pyproject.toml",
    "requirements-dev.txt",
    "setup.cfg",
}
SDIST_DIRS = {"backends", "benchmarks", "docs", "tests", "unihook", "unihook.egg-info"}


def package_files() -> dict[str, str]:
    """Every .py and py.typed of the packages: path in the wheel -> path in the source tree."""
    roots = {"unihook": ROOT / "unihook"}
    # the backends the package registers (an unregistered one in backends/ is not shipped)
    with open(ROOT / "pyproject.toml", "rb") as f:
        registered = tomllib.load(f)["project"]["entry-points"]["unihook"].values()
    roots.update({name: ROOT / "backends" / name for name in registered})
    files = {}
    for package, root in roots.items():
        for path in root.rglob("*"):
            if path.suffix == ".py" or path.name == "py.typed":
                rel = path.relative_to(root).as_posix()
                files[f"{package}/{rel}"] = path.relative_to(ROOT).as_posix()
    return files


def _checked(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `command`; a failure shows its exit status, stderr and stdout (check=True shows
    neither stream)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # (not `assert`: pytest would indent the streams)
        raise AssertionError(
            f"{' '.join(command)} exited with {done.returncode}\n"
            f"--- stderr ---\n{done.stderr}\n--- stdout ---\n{done.stdout}"
        )
    return done


def test_a_failing_step_shows_its_stderr() -> None:
    with pytest.raises(AssertionError) as info:
        _checked([sys.executable, "-c", "import sys; print('out'); sys.exit('the reason')"])
    assert "exited with 1" in str(info.value)
    assert "--- stderr ---\nthe reason\n" in str(info.value) and "out" in str(info.value)


def _requirements_dev() -> dict[str, str]:
    """requirements-dev.txt: distribution -> its requirement (pin), comments dropped."""
    lines = (ROOT / "requirements-dev.txt").read_text().splitlines()
    specs = [line.split("#")[0].strip() for line in lines]
    return {canonicalize_name(Requirement(s).name): s for s in specs if s}


def test_the_test_extra_holds_what_the_tests_need_and_agrees_with_the_dev_pins() -> None:
    """`pip install unihook[test]` runs the sdist's tests: tests/test_package.py builds with
    build and setuptools (no isolation), and the dev venv's pins satisfy the extra."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["test"]]
    names = {canonicalize_name(r.name): r for r in extra}
    assert {"pytest", "hypothesis", "build", "setuptools"} <= set(names)
    (backend,) = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    assert names["setuptools"].specifier == backend.specifier  # what building needs
    dev = _requirements_dev()
    for name, requirement in names.items():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        assert name in dev, f"{requirement} (test extra) is not in requirements-dev.txt"
        pins = [s.version for s in Requirement(dev[name]).specifier if s.operator == "=="]
        for pin in pins:
            assert requirement.specifier.contains(pin), f"{dev[name]} against {requirement}"
    # tests/test_package.py imports packaging: build depends on it
    build_requires = {
        canonicalize_name(Requirement(r).name) for r in metadata.requires("build") or []
    }
    assert "packaging" in build_requires or "packaging" in names


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # sdist, then the wheel built from the unpacked sdist: the wheel proves the sdist complete.
    # Building the sdist writes unihook.egg-info into the checkout, as the editable installs
    # do: under their lock (the Makefile's EDITABLE), since `make test` runs two venvs at once
    with open(ROOT / "pyproject.toml") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _checked([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)])
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_holds_exactly_the_packages(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        info = f"unihook-{unihook.__version__}.dist-info"
        meta = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert {n for n in names if not n.startswith(info + "/")} == set(package_files())
    assert {n for n in names if n.startswith(info + "/")} == {
        f"{info}/{n}" for n in ("METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt")
    } | {f"{info}/licenses/LICENSE"}
    assert f"Version: {unihook.__version__}\n" in meta
    assert "License-Expression: Apache-2.0\n" in meta
    assert "unihook = unihook.__main__:main" in entry_points
    assert "torch = unihook_torch" in entry_points and "paddle = unihook_paddle" in entry_points
    assert "mindspore = unihook_mindspore" in entry_points
    # the conformance suite, runnable as `pytest --pyargs unihook.conformance`, and its option
    suite = {f"unihook/conformance/{n}" for n in ("__init__.py", "conftest.py", "plugin.py")}
    assert suite | {"unihook/conformance/test_forward_hooks.py"} <= set(names)
    assert "unihook.conformance.plugin = unihook.conformance.plugin" in entry_points


def test_sdist_holds_the_packages_and_what_its_tests_need(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        prefix = f"unihook-{unihook.__version__}/"
        names = {m.name.removeprefix(prefix) for m in sdist.getmembers() if m.isfile()}
    stray = [
        n
        for n in names
        if "__pycache__" in n
        or n.endswith((".pyc", ".pyo"))
        or n.startswith("benchmarks/results/")
        or ("/" in n and n.split("/")[0] not in SDIST_DIRS)
        or ("/" not in n and n not in SDIST_TOP)
    ]
    assert not stray
    assert set(package_files().values()) <= names
    # the sources there are exactly the packages' sources: nothing left out, nothing extra
    sources = {n for n in names if n.startswith(("unihook/", "backends/"))}
    assert sources == set(package_files().values())
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("*.py")}
    assert tests <= names and "tests/conftest.py" in names
    assert {"docs/SEMANTICS.md", "benchmarks/run.py"} <= names
    assert SDIST_TOP - {"setup.cfg"} <= names


def _closure(requirements: list[Requirement], extra: str) -> list[metadata.Distribution]:
    """The dev venv's distributions that `requirements` (a wheel's, with `extra`) pull in."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(r, {extra}) for r in requirements]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} is required but not in the dev venv (requirements-dev.txt)")
        found[name] = dist
        todo += [(Requirement(r), set(req.extras) or {""}) for r in dist.requires or []]
    return list(found.values())


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The names that `dist` installed directly into site-packages (packages, modules, its
    .dist-info, bundled libraries)."""
    names = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


@pytest.fixture(scope="module")
def envs(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """framework -> the python of a fresh venv with the wheel and only that framework (made at
    the first test that asks for it)."""
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        meta = wheel.read(f"unihook-{unihook.__version__}.dist-info/METADATA").decode()
    requires = [Requirement(line[len("Requires-Dist: ") :]) for line in meta.splitlines()
                if line.startswith("Requires-Dist: ")]  # fmt: skip
    pythons: dict[str, Path] = {}

    def env(framework: str) -> Path:
        if framework in pythons:
            return pythons[framework]
        base = tmp_path_factory.mktemp(f"env-{framework}")
        venv.create(base / "venv", with_pip=False, symlinks=True)
        python = base / "venv" / "bin" / "python"
        deps = base / "site"
        deps.mkdir()
        # a venv of Python < 3.12 comes with setuptools, and paddle imports it undeclared there
        baseline = [Requirement("setuptools")] if sys.version_info < (3, 12) else []
        for dist in _closure([*requires, *baseline], framework):
            site = Path(str(dist.locate_file("")))
            for name in _top_level(dist):
                (deps / name).symlink_to(site / name)
        purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        Path(purelib.stdout.strip(), "unihook-deps.pth").write_text(f"{deps}\n")
        install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        _checked([*install, "--no-deps", "--no-index", str(dists["wheel"])])
        pythons[framework] = python
        return python

    return env


def _run(
    python: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "UNIHOOK"))},
        "GLOG_minloglevel": "2",
        **(env or {}),
    }
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd or python.parent,
        env=env,
    )


def quickstart(framework: str) -> str:
    """The README's quickstart with the other frameworks' paragraphs left out."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    paragraphs = code.group(1).split("\n\n")
    # a framework's paragraph starts with its import (a comment may follow it)
    imported = [re.match(r"import (\w+)\b(?!\.)", p) for p in paragraphs]
    assert any(m is not None and m.group(1) == framework for m in imported)
    return "\n\n".join(
        p
        for p, m in zip(paragraphs, imported)
        if m is None or m.group(1) not in FRAMEWORKS or m.group(1) == framework
    )


PROBE = """
import json, sys
from importlib.util import find_spec
import unihook, unihook.recipes
from unihook import ops
import {module}
t = {ones}
print("PROBE", json.dumps({{
    "unihook": unihook.__file__,
    "path": sys.path,
    "importable": {{name: find_spec(name) is not None for name in {frameworks!r}}},
    "backends": {{i.name: [i.version, sorted(set(i.kinds.values()))] for i in unihook.backends()}},
    "to_numpy": ops.to_numpy(t).tolist(),
}}))
"""


@pytest.mark.parametrize("framework", ONE_FRAMEWORK)
def test_quickstart_from_the_wheel_with_one_framework(
    framework: str, envs: Callable[[str], Path]
) -> None:
    python = envs(framework)
    probe_code = PROBE.format(module=framework, ones=ONES[framework], frameworks=tuple(FRAMEWORKS))
    done = _run(python, "-c", quickstart(framework) + textwrap.dedent(probe_code))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(SHOWN[framework]) == 1
    probe = json.loads(done.stdout.split("PROBE ", 1)[1])
    assert probe["unihook"].startswith(str(python.parent.parent))  # the wheel, not the repo
    assert not any(Path(p).resolve() == ROOT for p in probe["path"] if p)
    assert probe["importable"] == {f: f == framework for f in FRAMEWORKS}
    assert probe["backends"][framework][0] == metadata.version(FRAMEWORKS[framework])
    assert "native" in probe["backends"][framework][1]
    for other in set(FRAMEWORKS) - {framework}:  # nothing claimed for a missing framework
        assert probe["backends"][other] == [None, []]
    assert probe["to_numpy"] == [[1.0] * 3] * 2


@pytest.mark.parametrize("framework", ONE_FRAMEWORK)
def test_cli_from_the_wheel_with_one_framework(
    framework: str, envs: Callable[[str], Path], tmp_path: Path
) -> None:
    python = envs(framework)
    script = python.parent / "unihook"
    version = _run(script, "--version")
    assert (version.returncode, version.stdout) == (0, f"unihook {unihook.__version__}\n")
    for args in ([str(script), "--help"], [str(python), "-m", "unihook", "--help"]):
        done = _run(Path(args[0]), *args[1:])
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.startswith("usage: unihook") and "demo" in done.stdout
    demo_help = _run(script, "demo", "--help")
    assert demo_help.returncode == 0 and "--out DIR" in demo_help.stdout
    assert "Seed model" not in demo_help.stdout  # help, not the demo

    others = ", ".join(sorted(set(FRAMEWORKS) - {framework}))
    demo = _run(python, "-m", "unihook", "demo", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"Ran with {framework} only ({others} not installed): nothing to compare." in demo.stdout
    assert "Identical" not in demo.stdout and "  same" not in demo.stdout
    assert "[[89.0]]" in demo.stdout  # the seed model's output (docs/SEMANTICS.md §4)
    # matplotlib is not a dependency: the demo says how to get the picture, and where it goes
    assert f"unihook[demo]' for {tmp_path / 'out' / 'gradcam.png'}" in demo.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory
    # the backend table: the other framework's kinds are "not installed", not "unsupported"
    table = demo.stdout.split("Backends (unihook.backends()):")[1]
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == ["tensor"])
    expected = ["tensor"]
    for name in sorted(FRAMEWORKS):  # unihook.backends() is sorted by name
        expected += ["native"] if name == framework else ["not", "installed"]
    assert row == expected
    # the installed framework disabled: nothing to run, said on stderr, and why
    disabled = _run(
        python, "-m", "unihook", "demo", "--out", str(tmp_path / "out"),
        cwd=tmp_path, env={"UNIHOOK_DISABLE": framework},
    )  # fmt: skip
    assert (disabled.returncode, disabled.stdout) == (1, ""), disabled.stderr
    assert disabled.stderr.startswith(
        f"No framework to run the demo on: {framework} disabled by UNIHOOK_DISABLE; "
        f"{others} not installed; pip install 'unihook[torch]', 'unihook[paddle]' or "
        "'unihook[mindspore]'"
    ), disabled.stderr


def test_make_test_min_pins_the_declared_lower_bounds() -> None:
    """`make test-min` installs exactly the lower bounds that pyproject.toml declares."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared: dict[str, Version] = {}
    for spec in [*project["dependencies"], *project["optional-dependencies"]["torch"],
                 *project["optional-dependencies"]["paddle"]]:  # fmt: skip
        req = Requirement(spec)
        (bound,) = [s.version for s in req.specifier if s.operator == ">="]
        declared[canonicalize_name(req.name)] = Version(bound)
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(r"^MIN_PINS := (.*)$", makefile, re.M)
    assert line is not None
    pins = dict(pin.split("==") for pin in line.group(1).split())
    assert {canonicalize_name(k): Version(v) for k, v in pins.items()} == declared


def test_documents_point_at_files_of_the_repository() -> None:
    """Relative links and path mentions in the shipped documents resolve inside the repository
    (the sdist holds them): none reaches a directory beside it."""
    documents = [ROOT / n for n in ("README.md", "ARCHITECTURE.md", "CHANGELOG.md")]
    documents += sorted((ROOT / "docs").glob("*.md"))
    broken = []
    for document in documents:
        text = document.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL or an anchor
            resolved = (document.parent / target.split("#")[0]).resolve()
            if not resolved.exists() or ROOT not in resolved.parents:
                broken.append(f"{document.name}: ]({target})")
        broken += [f"{document.name}: {m}" for m in re.findall(r"\.\./[\w./-]+", text)]
    assert broken == []


def test_the_whole_quickstart_runs_beside_every_framework() -> None:
    """The README's quickstart as it stands, every framework's paragraph in one process (its
    order imports MindSpore before paddle, whose oneDNN build breaks a later MindSpore import:
    README "MindSpore")."""
    missing = [f for f in FRAMEWORKS if find_spec(f) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in this venv (make test-mindspore runs it)")
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme[readme.index("## Quickstart") :], re.S)
    assert code is not None
    done = run_code(code.group(1))
    assert done.returncode == 0, done.stderr[-3000:]
    shown = [line for line in done.stdout.splitlines() if line.endswith("[2, 4]")]
    assert shown == ["Linear [2, 4]", "Dense [2, 4]", "Linear [2, 4]"], done.stdout
