"""Where each benchmark writes its latest figure: ``benchmarks/results/<name>.<ext>``, one file per
benchmark, the one source a docs page reads. A run that is not the whole measurement (a smoke
run, a subset) passes ``write=False`` or writes elsewhere with ``--results-dir``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "machine", "write_json", "write_text"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=RESULTS_DIR.parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    """What the figure was measured on: enough to compare two runs, nothing that identifies."""
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "system": platform.system(),
    }


def write_json(
    name: str, figures: dict[str, Any], *, command: str, directory: Path | None = None
) -> Path:
    """``figures`` with when, where and how they were measured, as ``<name>.json``."""
    target = (directory or RESULTS_DIR) / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "command": command,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _commit(),
        "machine": machine(),
        "figures": figures,
    }
    target.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return target


def write_text(name: str, text: str, *, command: str, directory: Path | None = None) -> Path:
    """A printed table as ``<name>.txt``, headed by the command that printed it."""
    target = (directory or RESULTS_DIR) / f"{name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"$ {command}\n\n{text.rstrip()}\n")
    return target
