"""τ²-bench's Retail domain: 16 agent tools over an online store's users, orders and products.

``load(data_dir)`` reads ``tau2/domains/retail/{db.json,policy.md,tasks.json,split_tasks.json}``
and returns a ``Domain`` whose environments follow τ²-bench v1.0.1's tool behaviour exactly.
"""

from evals.tau2.domains.retail.domain import DEFAULT_TASKS_FILE, RetailDomain, load
from evals.tau2.domains.retail.environment import RetailEnvironment
from evals.tau2.domains.retail.tools import AGENT_TOOL_NAMES, READ_TOOLS, WRITE_TOOLS

__all__ = [
    "AGENT_TOOL_NAMES",
    "DEFAULT_TASKS_FILE",
    "READ_TOOLS",
    "WRITE_TOOLS",
    "RetailDomain",
    "RetailEnvironment",
    "load",
]
