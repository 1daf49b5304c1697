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
from pathlib import Path
from typing import Any

from evals.grid.spec import Grid, ScreenCells, parse_screen
from evals.screen.answers import ANSWERS_FILE, AnswerLog
from evals.screen.ask import ArmSpec as ScreenArm
from evals.screen.ask import AskOptions, ask_arm
from evals.screen.cli import prepare, rebuild

__all__ = ["SCREEN_DIR", "ScreenCells", "parse_screen", "run_screen_cells"]

SCREEN_DIR = "screen"


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
