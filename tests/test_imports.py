"""The package's import graph: no cycles, a light ``import repairproxy``, and every dotted module
path the repository writes down (README, docs, Makefile, settings strings) importable."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "repairproxy"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of the package imported at module level (not inside functions, not under
    TYPE_CHECKING): the edges that make a cycle at import time."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in known else base)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                if isinstance(node, ast.Try):
                    for handler in node.handlers:
                        visit(handler.body)
                    visit(node.finalbody)

    visit(tree.body)
    return {m for m in found if m in known and m != this}


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _top_level_imports(path, set(modules)) for name, path in modules.items()}
    # A package imports its own __init__ implicitly; parents are not edges we control here.
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


HEAVY = ("repairproxy.validation", "repairproxy.upstream.http1", "jsonschema_rs", "uvicorn")


@pytest.mark.parametrize(
    "code",
    [
        "import repairproxy",
        "import sys; sys.argv = ['repairproxy', '--help']\n"
        "from repairproxy.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass",
        "import sys; sys.argv = ['repairproxy', 'serve', '--help']\n"
        "from repairproxy.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass",
    ],
    ids=["import", "help", "serve-help"],
)
def test_light_entry_points(code: str) -> None:
    probe = code + "\nimport json, sys\nprint('\\n' + json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    ours = [m for m in loaded if m.startswith("repairproxy")]
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert not heavy, f"{code.splitlines()[0]!r} loads {heavy} (repairproxy modules: {ours})"


_DOTTED = re.compile(
    r"(?<![\w/.-])((?:repairproxy|evals|benchmarks)(?:\.[a-z_][a-z0-9_]*)+)(?::\w+)?(?![\w/])"
)
_SOURCES = ["README.md", "CONTRIBUTING.md", "Makefile", "docker", "docs", "grafana"]


def _written_paths() -> set[str]:
    texts: list[str] = []
    for name in _SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for f in files:
            if f.is_file() and f.suffix in {"", ".md", ".yaml", ".yml", ".toml", ".json", ".txt"}:
                texts.append(f.read_text(errors="replace"))
    for f in sorted(PACKAGE.rglob("*.py")):
        # Strings in code that name modules (uvicorn factories, `python -m` hints).
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    found: set[str] = set()
    for text in texts:
        for match in _DOTTED.finditer(text):
            found.add(match.group(1))
    return found


def _importable_prefix(dotted: str) -> str:
    """``repairproxy.cli.main`` names an attribute of ``repairproxy.cli``: check the longest
    prefix that is a module file or package, and that the rest is an attribute."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ROOT.joinpath(*parts[:end])
        if candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file():
            return ".".join(parts[:end])
    return ""


def test_every_written_module_path_imports() -> None:
    missing = []
    checked = 0
    for dotted in sorted(_written_paths()):
        module = _importable_prefix(dotted)
        if not module:
            missing.append(dotted)
            continue
        checked += 1
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # an optional extra (llama_cpp, vllm) is not an error
            if exc.name and exc.name.split(".")[0] in {"llama_cpp", "vllm", "awq", "torch"}:
                continue
            raise
        rest = dotted[len(module) + 1 :].split(".") if dotted != module else []
        obj: object = mod
        for attr in rest[:1]:  # one attribute deep: `module.function`, not prose after it
            if not hasattr(obj, attr) and attr not in {"py", "md", "toml"}:
                missing.append(dotted)
    assert checked > 10
    assert not missing, f"paths written in the repository that do not exist: {missing}"
