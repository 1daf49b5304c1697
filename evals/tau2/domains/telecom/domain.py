"""The Telecom domain loaded from a τ²-bench data folder: policy, tasks and an environment factory.

Files are read once per ``load``; each ``new_environment`` gets its own deep copy of the databases.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from evals.tau2.domains.base import domain_dir
from evals.tau2.domains.telecom.agent_tools import TelecomTools
from evals.tau2.domains.telecom.device import TelecomUserDB
from evals.tau2.domains.telecom.environment import TelecomEnvironment
from evals.tau2.domains.telecom.models import TelecomDB
from evals.tau2.domains.telecom.user_tools import TelecomUserTools
from evals.tau2.tasks import Task

__all__ = ["TelecomDomain", "assemble_policy", "load"]


def assemble_policy(main_policy: str, tech_support_manual: str) -> str:
    """The agent's system policy as τ²-bench's ``get_environment`` (manual variant) builds it."""
    return (
        f"<main_policy>\n{main_policy}\n</main_policy>\n"
        f"<tech_support_policy>\n{tech_support_manual}\n</tech_support_policy>"
    )


class TelecomDomain:
    """Implements ``evals.tau2.domains.base.Domain`` for Telecom."""

    def __init__(
        self,
        policy: str,
        tasks: list[Task],
        splits: dict[str, list[str]],
        db: TelecomDB,
        user_db: TelecomUserDB,
    ) -> None:
        self.name = "telecom"
        self.policy = policy
        self._tasks = tasks
        self._splits = splits
        self._db = db
        self._user_db = user_db
        self._schemas = (TelecomTools.openai_tools(), TelecomUserTools.openai_tools())

    def tasks(self, split: str | None = "base") -> list[Task]:
        """Typed tasks (copies), in ``tasks.json`` order, optionally of one split."""
        if split is None:
            chosen = self._tasks
        elif split in self._splits:
            wanted = set(self._splits[split])
            chosen = [task for task in self._tasks if task.id in wanted]
        else:
            raise ValueError(
                f"Invalid task split name: {split}. Valid splits are: {sorted(self._splits)}"
            )
        return [task.model_copy(deep=True) for task in chosen]

    def new_environment(self) -> TelecomEnvironment:
        return TelecomEnvironment(
            self._db.model_copy(deep=True), self._user_db.model_copy(deep=True), self._schemas
        )


def load(data_dir: Path) -> TelecomDomain:
    """Read ``tau2/domains/telecom`` under a τ²-bench ``data/`` folder."""
    folder = domain_dir(Path(data_dir), "telecom")
    with (folder / "db.toml").open("rb") as handle:
        db = TelecomDB.model_validate(tomllib.load(handle))
    with (folder / "user_db.toml").open("rb") as handle:
        user_db = TelecomUserDB.model_validate(tomllib.load(handle))
    policy = assemble_policy(
        (folder / "main_policy.md").read_text(encoding="utf-8"),
        (folder / "tech_support_manual.md").read_text(encoding="utf-8"),
    )
    raw_tasks = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    tasks = [Task.model_validate(task) for task in raw_tasks]
    split_file = folder / "split_tasks.json"
    splits = json.loads(split_file.read_text(encoding="utf-8")) if split_file.exists() else {}
    return TelecomDomain(policy, tasks, splits, db, user_db)
