"""The request path's modules compiled with mypyc, and the rule that keeps them all-or-nothing.

``make native`` (``scripts/build_native.py``) compiles ``COMPILED_MODULES`` into one shared library
(``repairproxy/_native__mypyc*.so``) with a shim per module beside its source, and writes
``_native_manifest.json``: the sha256 of every ``.py`` file of the package at build time. The
compiled request path runs ~17-21% fewer instructions (README, "Measured").

Python imports a module's ``.so`` before its ``.py``, so a stale build would run old code, and a
partial one would mix compiled and interpreted copies of the same classes. ``install`` (run by
``repairproxy/__init__.py`` before any of these modules loads) therefore checks the manifest and,
unless every source is unchanged and every shim is present, loads all of them from source.
``REPAIRPROXY_PURE_PYTHON=1`` asks for the source too (the test suite runs both ways).
``build_state()`` says which one runs; the benchmarks print it beside their figures.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

import orjson

__all__ = ["COMPILED_MODULES", "MANIFEST", "PURE_ENV", "build_state", "install", "source_digests"]

# The hot path of a chat, Messages or Responses request, measured module by module with callgrind.
# (server.py, upstream/http1.py, observe/logging.py and observe/metrics.py stay interpreted: they
# subclass or weakly reference classes mypyc cannot compile against.)
COMPILED_MODULES: tuple[str, ...] = (
    "repairproxy.asgi.call",
    "repairproxy.asgi.chat",
    "repairproxy.asgi.exchange",
    "repairproxy.asgi.gate",
    "repairproxy.asgi.messages",
    "repairproxy.asgi.responder",
    "repairproxy.asgi.responses",
    "repairproxy.asgi.routes",
    "repairproxy.episodes.budget",
    "repairproxy.episodes.chaining",
    "repairproxy.episodes.memory_store",
    "repairproxy.episodes.tool_errors",
    "repairproxy.observe.record",
    "repairproxy.pipeline",
    "repairproxy.reask",
    "repairproxy.repair",
    "repairproxy.structured",
    "repairproxy.textcalls",
    "repairproxy.upstream.client",
    "repairproxy.validation",
    "repairproxy.wire.openai",
)
PURE_ENV = "REPAIRPROXY_PURE_PYTHON"
MANIFEST = "_native_manifest.json"
_PACKAGE = Path(__file__).resolve().parent
_EXTENSION_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def source_digests(package: Path = _PACKAGE) -> dict[str, str]:
    """sha256 of every ``.py`` file under ``package``, by path relative to it (posix)."""
    return {
        path.relative_to(package).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(package.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _source(module: str) -> Path:
    return _PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def _built_modules(package: Path = _PACKAGE) -> set[str]:
    """Every module of the package with an extension file beside its source (a shim)."""
    return {
        ".".join(path.relative_to(package.parent).with_suffix("").with_suffix("").parts)
        for path in package.rglob("*" + _EXTENSION_SUFFIX)
        if path.with_name(path.name.removesuffix(_EXTENSION_SUFFIX) + ".py").exists()
    }


def _why_source(package: Path = _PACKAGE) -> str | None:
    """Why the modules must load from source, or None when the compiled build is whole and fresh."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    manifest = package / MANIFEST
    if not manifest.exists():
        return "not built (make native)"
    built = _built_modules(package)
    if not all(module in built for module in COMPILED_MODULES):
        return "a compiled module is missing"
    if not built <= set(COMPILED_MODULES):
        return "a module is compiled that the list no longer names"
    try:
        record = orjson.loads(manifest.read_bytes())
    except orjson.JSONDecodeError:
        return "the build manifest is unreadable"
    if not isinstance(record, dict) or record.get("python") != sys.implementation.cache_tag:
        return "built for another Python"
    if record.get("modules") != list(COMPILED_MODULES) or record.get("sources") != source_digests(
        package
    ):
        return "the sources changed since the build (make native)"
    return None


class _SourceFinder:
    """Loads the compiled modules from their ``.py`` files, ahead of the path finder's ``.so``."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self._names:
            return None
        source = _source(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


_state: list[str] = []


def install() -> None:
    """Decide once per process whether the compiled build runs; if not, route imports to source."""
    if _state:
        return
    reason = _why_source()
    if reason is None:
        _state.append("compiled (mypyc)")
        return
    # Every module with a shim, listed or left over from an older list: none may load compiled.
    sys.meta_path.insert(0, _SourceFinder([*COMPILED_MODULES, *_built_modules()]))
    _state.append(f"python ({reason})")


def build_state() -> str:
    """``compiled (mypyc)`` or ``python (<why>)``: which build this process runs."""
    install()
    return _state[0]
