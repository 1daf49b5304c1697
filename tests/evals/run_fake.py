"""``python -m tests.evals.run_fake SAVE_DIR``: a slow runner over the fake domain, to be killed.

Used by the resume test: the real runner and results file, a domain and agent that need no data.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from evals.tau2.agents import GoldAgent
from evals.tau2.logs import AssistantMessage, Message
from evals.tau2.participants import EpisodeContext
from evals.tau2.run import RunConfig, run
from tests.evals.fakes import CounterDomain, make_task

NUM_TASKS = 5
NUM_TRIALS = 2
TURN_DELAY_S = 0.15


class SlowGoldAgent(GoldAgent):
    def __init__(self, context: EpisodeContext) -> None:
        super().__init__(context)

    async def generate(self, incoming: Sequence[Message]) -> AssistantMessage:
        await asyncio.sleep(TURN_DELAY_S)
        return await super().generate(incoming)


def config(save_to: Path) -> RunConfig:
    return RunConfig(
        domain="counter",
        data_dir=Path("."),
        save_to=save_to,
        agent="gold",
        user="gold",
        num_trials=NUM_TRIALS,
        concurrency=2,
        progress=False,
    )


def domain() -> CounterDomain:
    return CounterDomain([make_task(f"task-{i}") for i in range(NUM_TASKS)])


def main(argv: Sequence[str]) -> None:
    asyncio.run(run(config(Path(argv[0])), domain=domain(), make_agent=SlowGoldAgent))


if __name__ == "__main__":
    main(sys.argv[1:])
