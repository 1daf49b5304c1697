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

__all__ = [
    "PROVENANCE_FILE",
    "cell_provenance",
    "code_identity",
    "code_of",
    "git",
    "repair_template_info",
    "sha256_of",
    "source_sha256",
]

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


SOURCE_PACKAGES = ("repairproxy", "evals")
SOURCE_SUFFIXES = (".py", ".toml", ".json", ".md", ".txt")


def source_sha256(root: Path | None = None) -> str:
    """One sha256 over the proxy's and the suite's source files (path and content, sorted):
    what identifies the code where git cannot (an exported tree, a tarball), and what tells
    apart two dirty trees at one commit."""
    base = root or Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        folder = base / package
        if not folder.is_dir():
            continue
        files = sorted(
            p
            for p in folder.rglob("*")
            if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts
        )
        for path in files:
            digest.update(str(path.relative_to(base)).encode() + b"\0")
            digest.update(sha256_of(path).encode() + b"\0")
    return digest.hexdigest()


def code_identity() -> dict[str, Any]:
    """The code a cell runs: the commit, whether the tree was dirty, and the source hash."""
    return {
        "git_commit": git("rev-parse", "HEAD") or None,
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "source_sha256": source_sha256(),
    }


def code_of(provenance: Mapping[str, Any]) -> str:
    """What two cells must share to be one run: the commit when clean, else the source hash (a
    provenance written before the hash was recorded: its commit, marked dirty when it was)."""
    commit = provenance.get("git_commit") or None
    if commit and not provenance.get("git_dirty"):
        return str(commit)
    source = provenance.get("source_sha256")
    if source:
        return f"source {str(source)[:12]}" + (f" (at {str(commit)[:7]}, dirty)" if commit else "")
    return f"{commit or 'unknown'} (dirty)" if commit else "unknown"


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
    code: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything one cell x mode ran with; ``proxy`` says which proxy and what it was sent;
    ``code`` is ``code_identity()`` (computed here when not given)."""
    arm = grid.arms[cell.arm]
    code = dict(code) if code is not None else code_identity()
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
        "git_commit": code["git_commit"],
        "git_dirty": code["git_dirty"],
        "source_sha256": code["source_sha256"],
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
