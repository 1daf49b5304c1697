"""The append-only log of raw answers: one JSON line per (arm, point), the only record of a screen.

Each answer is written with one ``write`` on an ``O_APPEND`` descriptor and fsynced before the next
question is asked, so a screen killed at any instant (SIGKILL included) leaves every finished answer
and at most one torn last line. Opening the log again cuts that torn line off; the point it held is
asked again. An (arm, point) already in the log is never asked or written twice.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = ["ANSWERS_FILE", "Answer", "AnswerLog", "read_answers"]

ANSWERS_FILE = "answers.jsonl"


@dataclass(frozen=True)
class Answer:
    """One raw answer: the upstream's completion, as received, for one point of one arm."""

    arm: str
    point: str
    completion: dict[str, Any]
    seconds: float
    logprobs: bool  # whether the request asked for logprobs (False after a refusal of them)

    def to_json(self) -> bytes:
        record = {
            "arm": self.arm,
            "point": self.point,
            "seconds": round(self.seconds, 4),
            "logprobs": self.logprobs,
            "completion": self.completion,
        }
        return orjson.dumps(record) + b"\n"

    @classmethod
    def from_json(cls, line: bytes) -> Answer:
        record = orjson.loads(line)
        return cls(
            arm=record["arm"],
            point=record["point"],
            completion=record["completion"],
            seconds=float(record["seconds"]),
            logprobs=bool(record["logprobs"]),
        )


def _complete_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        for line in handle:
            if line.endswith(b"\n") and line.strip():
                yield line


def read_answers(path: Path) -> list[Answer]:
    """Every complete answer in the log, first occurrence of each (arm, point) only."""
    if not path.is_file():
        return []
    seen: set[tuple[str, str]] = set()
    answers: list[Answer] = []
    for line in _complete_lines(path):
        answer = Answer.from_json(line)
        if (answer.arm, answer.point) not in seen:
            seen.add((answer.arm, answer.point))
            answers.append(answer)
    return answers


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline (a write the kill interrupted)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


class AnswerLog:
    """The log, open for appending; ``done`` holds the (arm, point) pairs already answered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(path)
        self.done: set[tuple[str, str]] = {(a.arm, a.point) for a in read_answers(path)}
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, answer: Answer) -> bool:
        """Write one answer unless its (arm, point) is already there; True when written."""
        key = (answer.arm, answer.point)
        with self._lock:
            if key in self.done:
                return False
            data = answer.to_json()
            while data:  # a regular file takes it all at once; loop in case it does not
                data = data[os.write(self._fd, data) :]
            os.fsync(self._fd)
            self.done.add(key)
            return True

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> AnswerLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
