"""One arm, several model servers: the arm's episodes form one queue, and each server takes up to
``per_upstream`` of them at a time.

``evals.tau2.run`` runs episodes under one gate (``concurrency``); the pool sets it to
``per_upstream x servers`` and, as each episode starts, gives its agent the least busy server
(ties: the one that took fewest episodes so far). An episode stays on its server from its first
turn to its last, so a proxy in front of each server keeps the episode's whole budget. A server's
slot is given back when the episode is saved (``episode_saved``, the run's ``on_episode``), a
moment after the gate opened for the next one: a server may hold one more episode for that moment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from evals.tau2.agents import LLMAgent, ModelConfig
from evals.tau2.logs import SimulationRun
from evals.tau2.participants import Agent, EpisodeContext

__all__ = ["UpstreamPool"]


class UpstreamPool:
    """Agents for one arm's episodes, spread over ``base_urls`` (one proxy per model server)."""

    def __init__(self, model: ModelConfig, base_urls: Sequence[str], per_upstream: int) -> None:
        if not base_urls:
            raise ValueError("an upstream pool needs at least one base URL")
        self.models = [dataclasses.replace(model, base_url=url) for url in base_urls]
        self.per_upstream = max(1, per_upstream)
        self.active = [0] * len(self.models)
        self.started = [0] * len(self.models)  # episodes each server took (provenance, tests)
        self._clients: list[Any] = [None] * len(self.models)
        self._where: dict[tuple[str, int], int] = {}

    @property
    def concurrency(self) -> int:
        """The run's gate: every server's share at once."""
        return self.per_upstream * len(self.models)

    def make_agent(self, context: EpisodeContext) -> Agent:
        index = min(range(len(self.models)), key=lambda i: (self.active[i], self.started[i], i))
        self.active[index] += 1
        self.started[index] += 1
        self._where[(context.task.id, context.trial)] = index
        if self._clients[index] is None:
            self._clients[index] = self.models[index].client()
        return LLMAgent(self._clients[index], self.models[index], context)

    def episode_saved(self, simulation: SimulationRun) -> None:
        trial = simulation.trial if simulation.trial is not None else 0
        index = self._where.pop((simulation.task_id, trial), None)
        if index is not None:
            self.active[index] -= 1

    async def aclose(self) -> None:
        for client in self._clients:
            if client is not None:
                await client.close()
        self._clients = [None] * len(self.models)
