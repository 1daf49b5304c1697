"""The compiled build is all or nothing, and never stale (repairproxy/compiled.py).

Each case runs a fresh interpreter on a copy of the package (with its ``.so`` files and manifest
when ``make native`` built them), changed one way, and reads which file every compiled module
was loaded from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

import repairproxy
from repairproxy import compiled

PACKAGE = Path(repairproxy.__file__).resolve().parent
BUILT = (PACKAGE / compiled.MANIFEST).exists()
# What the copy's interpreter prints: its build state and the file of every compiled module.
PROBE = """
import importlib, sys, orjson
from repairproxy import compiled
names = [*compiled.COMPILED_MODULES, "repairproxy.settings"]
files = [importlib.import_module(name).__file__ for name in names]
import repairproxy.app  # the whole app imports beside them
sys.stdout.write(orjson.dumps({"state": compiled.build_state(), "files": files}).decode())
"""


def _probe(root: Path, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    environment = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    environment.update(env or {}, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=root,
        env=environment,
        capture_output=True,
        check=True,
        timeout=60,
    )
    answer = orjson.loads(done.stdout)
    return answer["state"], answer["files"]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the package, built files included, in a root of its own."""
    shutil.copytree(PACKAGE, tmp_path / "repairproxy", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _sources_only(files: list[str]) -> bool:
    return all(file.endswith(".py") for file in files)


def test_every_listed_module_exists_and_the_list_is_sorted() -> None:
    for name in compiled.COMPILED_MODULES:
        assert PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py").is_file(), name
    assert list(compiled.COMPILED_MODULES) == sorted(set(compiled.COMPILED_MODULES))


def test_the_python_source_runs_when_asked(copy: Path) -> None:
    state, files = _probe(copy, {compiled.PURE_ENV: "1"})
    assert state == f"python ({compiled.PURE_ENV} is set)"
    assert _sources_only(files)


def test_without_a_build_the_python_source_runs(copy: Path) -> None:
    (copy / "repairproxy" / compiled.MANIFEST).unlink(missing_ok=True)
    state, files = _probe(copy)
    assert state == "python (not built (make native))"
    assert _sources_only(files)


needs_build = pytest.mark.skipif(not BUILT, reason="no compiled build here (make native)")


@needs_build
def test_a_fresh_build_runs_every_listed_module_compiled(copy: Path) -> None:
    if compiled.build_state() != "compiled (mypyc)":
        pytest.skip(f"this checkout's build is not current: {compiled.build_state()}")
    state, files = _probe(copy)
    assert state == "compiled (mypyc)"
    assert all(file.endswith(".so") for file in files[:-1]), files
    assert files[-1].endswith("settings.py")


def _append_comment(root: Path) -> None:
    settings = root / "repairproxy" / "settings.py"
    settings.write_text(settings.read_text() + "\n# edited after the build\n")


def _drop_a_shim(root: Path) -> None:
    module = root.joinpath(*compiled.COMPILED_MODULES[-1].split("."))
    next(module.parent.glob(module.name + ".*.so")).unlink()


def _stray_shim(root: Path) -> None:
    """A shim left by an older list (here copied beside settings.py): it must not load."""
    module = root.joinpath(*compiled.COMPILED_MODULES[0].split("."))
    shim = next(module.parent.glob(module.name + ".*.so"))
    shutil.copy(shim, root / "repairproxy" / ("settings" + shim.name.removeprefix(module.name)))


def _other_python(root: Path) -> None:
    manifest = root / "repairproxy" / compiled.MANIFEST
    built = orjson.loads(manifest.read_bytes())
    manifest.write_bytes(orjson.dumps({**built, "python": "cpython-299"}))


@needs_build
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        # Any source of the package, compiled or not: the compiled code was checked against all.
        (_append_comment, "the sources changed since the build (make native)"),
        (_drop_a_shim, "a compiled module is missing"),
        (_stray_shim, "a module is compiled that the list no longer names"),
        (_other_python, "built for another Python"),
        (lambda root: (root / "repairproxy" / compiled.MANIFEST).write_text("{"), None),
    ],
)
def test_a_stale_or_partial_build_never_runs(
    copy: Path, change: Callable[[Path], None], reason: str | None
) -> None:
    change(copy)
    state, files = _probe(copy)
    assert state == f"python ({reason or 'the build manifest is unreadable'})"
    assert _sources_only(files)  # none compiled, not some: one copy of every class
