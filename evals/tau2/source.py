"""Which code ran: what ``git`` says of this checkout (the commit a results file records)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["git"]


def git(*args: str) -> str:
    """What ``git ARGS`` prints in this checkout, stripped; empty outside a checkout."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()
