"""The package's import graph: no cycles, a light ``import repairproxy``, and every dotted module
path the repository writes down (README, docs, Makefile, settings strings) importable."""

from __future__ import annotations

import ast
import importlib
import json
import os
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


def _every_import(path: Path, known: set[str]) -> set[str]:
    """Modules of the tree a file imports anywhere: at module level, inside functions and under
    ``TYPE_CHECKING`` (each is an arrow a reader follows, even where Python defers it)."""
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    resolved = set()
    for name in found:  # `import evals.tau2.logs` names the module; `from x import y` may name y
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != this:
            resolved.add(name)
    return resolved


def _tree_graph() -> dict[str, set[str]]:
    files = {
        _module_name(p): p
        for top in ("repairproxy", "evals", "benchmarks")
        for p in (ROOT / top).rglob("*.py")
    }
    return {name: _every_import(path, set(files)) for name, path in files.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_circle_counting_every_import() -> None:
    """No circle in the whole tree, function-level and ``TYPE_CHECKING`` imports counted."""
    circles = _circles(_tree_graph())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


# The rooms of evals/ and benchmarks/, bottom first: a room imports only rooms of lower rows
# (and itself); rooms of one row do not import each other. A module the rows do not name is a
# room of its own at the top (an entry: ``python -m evals.run``).
LAYERS: dict[str, list[list[str]]] = {
    "evals": [
        ["evals.tau2"],
        ["evals.arms", "evals.analysis"],
        ["evals.grid", "evals.report"],
        ["evals.screen"],
        ["evals.demo"],
    ],
    # The figures (benchmarks/'s top) between: diagnostics may reuse a figure, never the reverse.
    "benchmarks": [["benchmarks.support"], ["*"], ["benchmarks.diagnostics"]],
}


# What each top folder may import of the others: the study measures the proxy, the benchmarks
# measure both; the proxy imports neither (its own test below).
BELOW = {"evals": {"repairproxy"}, "benchmarks": {"repairproxy", "evals"}}


def _room(module: str, rows: list[list[str]]) -> tuple[int, str]:
    for level, row in enumerate(rows):
        for room in row:
            if module == room or module.startswith(room + "."):
                return level, room
    for level, row in enumerate(rows):
        if "*" in row:  # the modules no row names, each a room of its own
            return level, module
    return len(rows), module


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_arrows_only_point_down(package: str) -> None:
    rows = LAYERS[package]
    wrong = []
    for module, imported in sorted(_tree_graph().items()):
        if not module.startswith(package + "."):
            continue
        level, room = _room(module, rows)
        for target in sorted(imported):
            if target.split(".")[0] in BELOW[package]:
                continue
            if target.split(".")[0] != package:
                wrong.append(f"{module} -> {target} (another top folder)")
                continue
            if target == package:
                continue
            target_level, target_room = _room(target, rows)
            if target_room == room:
                continue
            if target_level >= level:
                wrong.append(f"{module} ({room}) -> {target} ({target_room})")
    assert not wrong, "arrows that do not point down:\n" + "\n".join(wrong)


def test_benchmark_figures_do_not_import_diagnostics() -> None:
    """The figures at benchmarks/'s top may share support/, never a diagnostic."""
    wrong = [
        f"{module} -> {target}"
        for module, imported in sorted(_tree_graph().items())
        if module.startswith("benchmarks.") and not module.startswith("benchmarks.diagnostics")
        for target in imported
        if target.startswith("benchmarks.diagnostics")
    ]
    assert not wrong, wrong


def test_the_proxy_imports_neither_the_study_nor_the_benchmarks() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, imported in sorted(_tree_graph().items())
        if module.startswith("repairproxy")
        for target in imported
        if target.split(".")[0] in {"evals", "benchmarks"}
    ]
    assert not wrong, wrong


# What each entry of the study must not load: the report and its plotting only where a report is
# written, the analysis only where numbers are computed.
ENTRY_MUST_NOT_LOAD = {
    "evals.run": ("evals.analysis", "evals.report", "evals.grid", "matplotlib", "numpy"),
    "evals.demo": ("evals.analysis", "evals.report", "matplotlib", "numpy"),
    "evals.repair_ablation": ("evals.analysis", "evals.report", "matplotlib"),
    "evals.arms": ("evals.analysis", "evals.report", "evals.grid", "matplotlib"),
    "evals.screen": ("evals.report", "matplotlib"),
    "evals.analyze": ("evals.grid", "evals.screen", "evals.tau2.orchestrator", "evals.tau2.agents"),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_MUST_NOT_LOAD))
def test_study_entries_load_only_what_they_need(entry: str) -> None:
    probe = f"import {entry}\nimport json, sys\nprint('\\n' + json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    unneeded = ENTRY_MUST_NOT_LOAD[entry]
    heavy = sorted(
        m
        for m in loaded
        if m.startswith(unneeded) and m.split(".")[0] in {u.split(".")[0] for u in unneeded}
    )
    heavy = [m for m in heavy if any(m == u or m.startswith(u + ".") for u in unneeded)]
    assert not heavy, f"import {entry} loads {heavy}"


@pytest.mark.parametrize("entry", sorted(ENTRY_MUST_NOT_LOAD))
def test_study_entries_print_their_usage(entry: str) -> None:
    """``python -m evals.<entry> --help``, as a user types it, needs no model, data or network."""
    done = subprocess.run(
        [sys.executable, "-m", entry, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, f"python -m {entry} --help: {done.stderr}"
    assert done.stdout.startswith(f"usage: python -m {entry} "), done.stdout[:500]
    assert "-h, --help" in done.stdout


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
_SOURCES = [
    "README.md",
    "CONTRIBUTING.md",
    "Makefile",
    "docker",
    "docs",
    "grafana",
    "benchmarks/results",
    "studies",
]


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


@pytest.mark.parametrize("package", ["evals", "benchmarks"])
def test_the_committed_import_graph_is_current(package: str, tmp_path: Path) -> None:
    """docs/architecture/<package>-imports-after.dot is what scripts/import_graph.py draws of the
    tree today (grimp, every import): a move that changes the rooms' arrows redraws it."""
    pytest.importorskip("grimp")
    out = tmp_path / package
    subprocess.run(
        [sys.executable, "scripts/import_graph.py", package, "--depth", "2", "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PATH": "/nonexistent"},  # the .dot only, no Graphviz
    )
    committed = ROOT / "docs" / "architecture" / f"{package}-imports-after.dot"
    assert out.with_suffix(".dot").read_text() == committed.read_text(), (
        f"redraw it: python scripts/import_graph.py {package} --depth 2 "
        f"--out docs/architecture/{package}-imports-after"
    )
