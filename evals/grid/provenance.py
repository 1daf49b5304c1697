"""What a grid run records beside each results file (``provenance.json``), so a number in a report
can be traced to the code, proxy settings, repair text, user simulator, model and data it came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evals.grid.spec import CellSpec, Grid
from evals.tau2.domains.base import domain_dir
from evals.tau2.source import git

__all__ = ["PROVENANCE_FILE", "cell_provenance", "git", "repair_template_info", "sha256_of"]

PROVENANCE_FILE = "provenance.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def repair_template_info(proxy_args: Sequence[str]) -> dict[str, Any]:
    """The repair texts a cell ran with: ``--repair-template``'s file, else the proxy's default
    (repair-v3: its re-asks may be declined in plain text, which changes what the reflexive and
    constrained arms mean; version and sha256 say which texts a number came from)."""
    from repairproxy.reask import DEFAULT_TEMPLATE_FILE, RepairTemplate

    path: Path | None = None
    for index, arg in enumerate(proxy_args):
        if arg == "--repair-template" and index + 1 < len(proxy_args):
            path = Path(proxy_args[index + 1])
        elif arg.startswith("--repair-template="):
            path = Path(arg.split("=", 1)[1])
    if path is None:
        import repairproxy

        path = Path(repairproxy.__file__).parent / DEFAULT_TEMPLATE_FILE
    try:
        template = RepairTemplate.from_file(path)
    except (OSError, ValueError) as exc:
        return {"file": str(path), "error": str(exc)}
    return {"file": str(path), "version": template.version, "sha256": sha256_of(path)}


def _data_pins(data_dir: Path, domain: str) -> dict[str, str]:
    folder = domain_dir(data_dir, domain)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    files += sorted((data_dir / "tau2" / "user_simulator").glob("*.md"))
    return {str(p.relative_to(data_dir)): sha256_of(p) for p in files}


def _embedded_rendering() -> str:
    from repairproxy.local.prompt import RENDERING

    return RENDERING


def cell_provenance(
    grid: Grid,
    cell: CellSpec,
    mode: str,
    *,
    task_ids: Sequence[str],
    episodes_saved: int,
    proxy: Mapping[str, Any],
    data_dir: Path,
    concurrency: int,
) -> dict[str, Any]:
    """Everything one cell x mode ran with; ``proxy`` says which proxy and what it was sent."""
    arm = grid.arms[cell.arm]
    return {
        "written_at": datetime.now(UTC).isoformat(),
        "grid": {
            "name": grid.name,
            "file": str(grid.source) if grid.source else None,
            "sha256": sha256_of(grid.source) if grid.source else None,
        },
        "cell": dataclasses.asdict(cell),
        "mode": mode,
        "task_ids": list(task_ids),
        "episodes": len(task_ids) * cell.trials,
        "episodes_saved_before_this_start": episodes_saved,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "arm": arm.describe(),
        # How the embedded server renders prompts (an embedded arm's prompts depend on it).
        "embedded_rendering": _embedded_rendering(),
        "proxy": dict(proxy),
        "repair_template": repair_template_info([*grid.proxy_args, *arm.proxy_args]),
        "user": grid.users[cell.user].describe(),
        "judge": grid.judge.describe() if grid.judge else None,
        "tau2_data": {"dir": str(data_dir), "sha256": _data_pins(data_dir, cell.domain)},
        "seeds": {"run_seed": cell.seed, "llm_seed": grid.llm_seed},
        "concurrency": concurrency,
        "python": sys.version.split()[0],
    }
