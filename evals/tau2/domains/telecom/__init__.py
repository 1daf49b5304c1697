"""τ²-bench's Telecom domain (dual control): the agent's 13 tools, the user's 30 device tools,
the state they share, task setup and the environment assertions that score an episode.

``load(data_dir)`` reads a τ²-bench ``data/`` folder and returns a ``Domain``.
"""

from evals.tau2.domains.telecom.domain import TelecomDomain, load
from evals.tau2.domains.telecom.environment import TelecomEnvironment

__all__ = ["TelecomDomain", "TelecomEnvironment", "load"]
