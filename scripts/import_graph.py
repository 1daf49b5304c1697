"""Draw a package's import graph (grimp: module-, function-level and ``TYPE_CHECKING`` imports).

``python scripts/import_graph.py evals --depth 2 --out docs/architecture/evals-imports``
writes ``.dot`` and, where Graphviz's ``dot`` is on PATH, ``.svg``: one node per module or
folder at ``--depth`` dotted parts, one arrow per importing pair, red where it is part of a
circle. It prints the circles it found (none is the goal).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path


def collapse(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def graph(package: str, depth: int) -> tuple[set[str], set[tuple[str, str]]]:
    import grimp

    built = grimp.build_graph(package, include_external_packages=False, cache_dir=None)
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()
    for module in built.modules:
        if not module.startswith(package):
            continue
        source = collapse(module, depth)
        nodes.add(source)
        for imported in built.find_modules_directly_imported_by(module):
            if not imported.startswith(package + ".") and imported != package:
                continue
            target = collapse(imported, depth)
            if target != source and target != package:
                edges.add((source, target))
    nodes.discard(package)
    return nodes, {(a, b) for a, b in edges if a != package}


def circles(nodes: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


def dot(package: str, nodes: set[str], edges: set[tuple[str, str]], cycles: list[list[str]]) -> str:
    in_cycle = {n for c in cycles for n in c}
    lines = [f'digraph "{package}" {{', "  rankdir=TB; node [shape=box, fontsize=10];"]
    for n in sorted(nodes):
        colour = ", color=red" if n in in_cycle else ""
        lines.append(f'  "{n}" [label="{n.removeprefix(package + ".")}"{colour}];')
    for a, b in sorted(edges):
        colour = " [color=red]" if a in in_cycle and b in in_cycle else ""
        lines.append(f'  "{a}" -> "{b}"{colour};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package")
    parser.add_argument("--depth", type=int, default=2, help="dotted parts per node (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    nodes, edges = graph(args.package, args.depth)
    cycles = circles(nodes, edges)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".dot").write_text(dot(args.package, nodes, edges, cycles))
    if shutil.which("dot"):
        subprocess.run(
            [
                "dot",
                "-Tsvg",
                "-o",
                str(args.out.with_suffix(".svg")),
                str(args.out.with_suffix(".dot")),
            ],
            check=True,
        )
    print(f"{args.package}: {len(nodes)} nodes, {len(edges)} arrows, {len(cycles)} circles")
    for c in cycles:
        print("  circle:", " <-> ".join(c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
