"""The loaded Retail domain: policy, tasks, splits and the pristine store new environments share."""

from __future__ import annotations

import json
from pathlib import Path

from evals.tau2.domains.base import domain_dir
from evals.tau2.domains.retail.db import RetailDB
from evals.tau2.domains.retail.environment import RetailEnvironment
from evals.tau2.domains.retail.hashing import CanonicalCache
from evals.tau2.tasks import Task

__all__ = ["DEFAULT_TASKS_FILE", "RetailDomain", "load"]

DEFAULT_TASKS_FILE = "tasks.json"


class RetailDomain:
    """τ²-bench Retail, read once from a data folder; implements ``evals.tau2.domains.base.Domain``.

    ``modify_items_fix`` (option ``retail_modify_items_fix``, off by default): τ²-bench v1.0.1's
    ``modify_pending_order_items`` gives every modified item the price and options of the variant
    checked last (a bug in the benchmark). We reproduce it, since the agent must see the tool
    output τ²-bench shows; with the option on, each item gets its own new variant. Runs record
    the option in their results' ``info.domain_options``.
    """

    name = "retail"

    def __init__(
        self,
        policy: str,
        pristine: RetailDB,
        tasks: list[Task],
        splits: dict[str, list[str]],
        *,
        modify_items_fix: bool = False,
    ) -> None:
        self.modify_items_fix = modify_items_fix
        self.policy = policy
        self._pristine = pristine
        self._cache = CanonicalCache(pristine)
        self._tasks = tasks
        self._splits = splits

    def tasks(self, split: str | None = "base") -> list[Task]:
        """Typed tasks (copies), in file order, filtered by ``split`` unless it is None."""
        if split is None:
            chosen = self._tasks
        elif split not in self._splits:
            raise ValueError(
                f"Invalid task split name: {split}. Valid splits are: {sorted(self._splits)}"
            )
        else:
            wanted = set(self._splits[split])
            chosen = [task for task in self._tasks if task.id in wanted]
        return [task.model_copy(deep=True) for task in chosen]

    def new_environment(self) -> RetailEnvironment:
        """A world in the database's initial state; it shares unchanged objects with the others."""
        return RetailEnvironment(
            self._pristine, self._cache, modify_items_fix=self.modify_items_fix
        )

    def initial_db_hash(self) -> str:
        """The hash every new environment starts from."""
        return self.new_environment().db_hash()


def _split_file(folder: Path, tasks_file: str) -> Path:
    # τ²-bench names the split file after the task file; the v0.2.0 task file has none of its own
    # and holds the same task ids, so it falls back to split_tasks.json.
    own = folder / f"split_{Path(tasks_file).stem}.json"
    return own if own.exists() else folder / f"split_{Path(DEFAULT_TASKS_FILE).stem}.json"


def load(
    data_dir: Path, tasks_file: str = DEFAULT_TASKS_FILE, *, modify_items_fix: bool = False
) -> RetailDomain:
    """Read ``tau2/domains/retail/`` under ``data_dir``; ``tasks_file`` may name v0.2.0's."""
    folder = domain_dir(Path(data_dir), "retail")
    pristine = RetailDB.model_validate_json((folder / "db.json").read_bytes())
    policy = (folder / "policy.md").read_text(encoding="utf-8")
    raw_tasks = json.loads((folder / tasks_file).read_text(encoding="utf-8"))
    tasks = [Task.model_validate(task) for task in raw_tasks]
    split_path = _split_file(folder, tasks_file)
    splits = json.loads(split_path.read_text(encoding="utf-8")) if split_path.exists() else {}
    return RetailDomain(
        policy=policy,
        pristine=pristine,
        tasks=tasks,
        splits=splits,
        modify_items_fix=modify_items_fix,
    )
