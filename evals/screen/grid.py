"""Screen cells in a grid file: a ``[screen]`` table beside the ``[[cell]]`` episode cells.

    [screen]
    points = 40                      # decision points, over all domains
    seed = 7
    domains = ["retail"]             # default: the domains of the grid's cells
    arms = ["q4", "q3"]              # default: every arm of the grid
    reference = "q4"                 # default: the arm the others name as reference, else the first

``python -m evals.repair_ablation`` runs it after the episode cells: each arm is reached as the
grid reaches it (``evals.grid.launch.ArmEndpoint``) and screened on its upstream directly (repair
off, nothing in between), into ``<out>/screen``; the run ends by saying which arms were flagged.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.grid.spec import ArmSpec, CellSpec, Grid, GridError
from evals.screen.answers import ANSWERS_FILE, AnswerLog
from evals.screen.ask import ArmSpec as ScreenArm
from evals.screen.ask import AskOptions, ask_arm
from evals.screen.cli import prepare, rebuild

__all__ = ["SCREEN_DIR", "ScreenCells", "parse_screen", "run_screen_cells"]

SCREEN_DIR = "screen"
_KEYS = {"points", "seed", "domains", "arms", "reference", "max_tokens"}


@dataclass(frozen=True)
class ScreenCells:
    points: int
    seed: int
    domains: tuple[str, ...]
    arms: tuple[str, ...]
    reference: str
    max_tokens: int = 512


def _reference(arms: Mapping[str, ArmSpec], chosen: Sequence[str]) -> str:
    for name in chosen:
        named = arms[name].reference
        if named is not None and named in chosen:
            return named
    return chosen[0]


def parse_screen(table: Any, arms: Mapping[str, ArmSpec], cells: Sequence[CellSpec]) -> ScreenCells:
    """The ``[screen]`` table, checked against the grid's arms (GridError names the key)."""
    if not isinstance(table, dict):
        raise GridError("screen: expected a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise GridError(f"screen: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    points, seed = table.get("points", 40), table.get("seed", 0)
    if not isinstance(points, int) or points < 1 or not isinstance(seed, int):
        raise GridError("screen: points must be a positive integer and seed an integer")
    domains = table.get("domains") or sorted({cell.domain for cell in cells})
    chosen = table.get("arms") or list(arms)
    for key, values in (("domains", domains), ("arms", chosen)):
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise GridError(f"screen.{key}: expected a list of strings")
    missing = [a for a in chosen if a not in arms]
    if missing:
        raise GridError(f"screen.arms: no arm named {missing}")
    reference = table.get("reference") or _reference(arms, chosen)
    if reference not in chosen:
        raise GridError(f"screen.reference: {reference!r} is not one of the screened arms")
    max_tokens = table.get("max_tokens", 512)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise GridError("screen.max_tokens: expected a positive integer")
    return ScreenCells(points, seed, tuple(domains), tuple(chosen), reference, max_tokens)


def run_screen_cells(grid: Grid, cells: ScreenCells, out: Path, data_dir: Path) -> dict[str, Any]:
    """Screen every arm of ``cells`` not fully answered yet, then write screen.json and report."""
    from evals.grid.launch import ArmEndpoint

    folder = out / SCREEN_DIR
    names = list(cells.arms)
    points, tools = prepare(
        arms=[(name, f"grid:{name}") for name in names],
        reference=cells.reference,
        domains=cells.domains,
        count=cells.points,
        seed=cells.seed,
        out=folder,
        data_dir=data_dir,
    )
    options = AskOptions(max_tokens=cells.max_tokens, seed=cells.seed)
    with AnswerLog(folder / ANSWERS_FILE) as log:
        for name in names:
            if all((name, p.key) in log.done for p in points):
                continue
            arm = grid.arms[name]
            with ArmEndpoint(arm, out / "logs", grid.proxy_args) as endpoint:
                screen_arm = ScreenArm(name, endpoint.upstream_url)
                ask_arm(screen_arm, endpoint.upstream_url, points, tools, log, options)
    screen = rebuild(folder)
    flagged = screen["flagged"]
    verdict = "; ".join(f"{a} ({', '.join(c)})" for a, c in flagged.items()) or "none"
    print(f"screen: {folder / 'report.md'}; flagged arms: {verdict}", file=sys.stderr)
    return screen
