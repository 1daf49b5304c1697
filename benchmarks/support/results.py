"""Where each benchmark writes its latest figure: ``benchmarks/results/<name>.<ext>``, one file per
benchmark, the one source a docs page reads.

A figure is written when the benchmark runs as a command (``python -m benchmarks.NAME``, through
``run_recorded``), never when a test calls its ``main``; ``BENCHMARK_RESULTS_DIR`` sends it
elsewhere (the test suite points it at a temporary folder, so a smoke run never overwrites a
measurement).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "RESULTS_DIR",
    "machine",
    "results_dir",
    "run_recorded",
    "write_json",
    "write_text",
]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
RESULTS_ENV = "BENCHMARK_RESULTS_DIR"


def results_dir() -> Path:
    """``BENCHMARK_RESULTS_DIR`` where set, else ``benchmarks/results``."""
    override = os.environ.get(RESULTS_ENV)
    return Path(override) if override else RESULTS_DIR


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
    target = (directory or results_dir()) / f"{name}.json"
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
    target = (directory or results_dir()) / f"{name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"$ {command}\n\n{text.rstrip()}\n")
    return target


class _Tee(io.TextIOBase):
    """Writes through to the terminal and keeps a copy: what the benchmark printed is its figure."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.kept = io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_recorded(name: str, main: Callable[[list[str]], int | None]) -> int:
    """Run a benchmark's ``main`` as its command: what it prints goes to the terminal and, when it
    ends with status 0 (``--help`` excepted), to ``<results>/<name>.txt`` headed by the command."""
    argv = sys.argv[1:]
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        status = main(argv) or 0
    if status == 0 and not {"-h", "--help"} & set(argv):
        command = " ".join(["python -m", f"benchmarks.{name}", *argv])
        written = write_text(name, tee.kept.getvalue(), command=command)
        print(f"(figures written to {written})")
    return status
