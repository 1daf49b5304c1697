"""Calibration text for AWQ and static FP8, taken from the local τ²-bench data, never a hub dataset.

The samples are the domains' policy sections and the user-simulator task instructions: the kind of
text the quantized agent reads in the study. Their choice is fixed by a seed; ``describe()`` is what
``arm.json`` records (each file's sha256, the count, one digest over the exact samples).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.arms.record import ArmError, sha256_of

__all__ = ["CalibrationSet", "calibration_data_dir", "load_calibration"]

# (domain, policy files, task file) in the order the samples are drawn from.
_SOURCES = (
    ("retail", ("policy.md",), "tasks.json"),
    ("telecom", ("main_policy.md", "tech_support_manual.md"), "tasks.json"),
)
_SECTION_CHARS = 2000  # about 500 tokens: a policy is cut into sections near this size


@dataclass(frozen=True)
class CalibrationSet:
    texts: tuple[str, ...]
    files: dict[str, str]  # path relative to the data folder -> sha256
    available: int
    seed: int
    data_dir: Path

    def describe(self) -> dict[str, Any]:
        joined = "\x00".join(self.texts).encode()
        return {
            "source": "τ²-bench policies and task instructions (local files)",
            "data_dir": str(self.data_dir),
            "files": self.files,
            "samples": len(self.texts),
            "available": self.available,
            "seed": self.seed,
            "characters": sum(len(t) for t in self.texts),
            "format": "plain text, one sample per policy section or task",
            "texts_sha256": hashlib.sha256(joined).hexdigest(),
        }


def _sections(text: str, limit: int = _SECTION_CHARS) -> list[str]:
    """Consecutive paragraphs joined up to about ``limit`` characters."""
    sections: list[str] = []
    current: list[str] = []
    for paragraph in (p.strip() for p in text.split("\n\n")):
        if not paragraph:
            continue
        if current and sum(len(p) for p in current) + len(paragraph) > limit:
            sections.append("\n\n".join(current))
            current = []
        current.append(paragraph)
    if current:
        sections.append("\n\n".join(current))
    return sections


def _instructions(task: Any) -> str | None:
    scenario = task.get("user_scenario") if isinstance(task, dict) else None
    instructions = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instructions, str):
        return instructions.strip() or None
    if not isinstance(instructions, dict):
        return None
    parts = [
        f"{key.replace('_', ' ').capitalize()}: {value.strip()}"
        for key in ("reason_for_call", "known_info", "unknown_info", "task_instructions")
        if isinstance(value := instructions.get(key), str) and value.strip()
    ]
    return "\n".join(parts) or None


def load_calibration(data_dir: Path, samples: int, *, seed: int = 0) -> CalibrationSet:
    """``samples`` texts, drawn with ``seed`` from the policies and task instructions."""
    if samples < 1:
        raise ArmError("--calibration-samples must be at least 1")
    pool: list[str] = []
    files: dict[str, str] = {}
    domains = data_dir / "tau2" / "domains"
    for domain, policies, tasks_file in _SOURCES:
        for name in policies:
            path = domains / domain / name
            if path.is_file():
                pool += _sections(path.read_text(encoding="utf-8"))
                files[str(path.relative_to(data_dir))] = sha256_of(path)
        path = domains / domain / tasks_file
        if path.is_file():
            tasks: Sequence[Any] = json.loads(path.read_text(encoding="utf-8"))
            pool += [text for task in tasks if (text := _instructions(task))]
            files[str(path.relative_to(data_dir))] = sha256_of(path)
    if not pool:
        raise ArmError(
            f"no τ²-bench policies or tasks under {domains}; pass --tau2-data or set TAU2_DATA_DIR"
        )
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    # Fewer texts than asked: every one, and the record says how many there were.
    chosen = tuple(pool[i] for i in order[:samples])
    return CalibrationSet(chosen, files, len(pool), seed, data_dir)


def calibration_data_dir(explicit: Path | None) -> Path:
    """``--tau2-data``, else ``TAU2_DATA_DIR``, else the cache of the pinned download."""
    from evals.tau2.data import DataNotFoundError, resolve_data_dir

    try:
        return resolve_data_dir(explicit, os.environ, allow_download=False)
    except DataNotFoundError as exc:
        raise ArmError(f"calibration text: {exc}") from exc
