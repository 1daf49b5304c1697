"""The proxy's shared vocabulary, in a module that imports nothing of the logic (as
``starlette/types.py``): the modes a request or a deployment picks, how a request ended, and the
ASGI and header aliases. Settings, errors and the ASGI layer import from here, so
``import repairproxy`` stays light and no decision module depends on the transport."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "API",
    "BudgetPolicy",
    "HeaderList",
    "Message",
    "OnExhausted",
    "Outcome",
    "Receive",
    "RepairMode",
    "Scope",
    "Send",
]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
HeaderList = list[tuple[bytes, bytes]]


class API(enum.StrEnum):
    """Which API surface a request came through (a metrics label)."""

    CHAT = "chat"
    RESPONSES = "responses"
    MESSAGES = "messages"  # Anthropic's Messages API


class Outcome(enum.StrEnum):
    """How a request ended, from the operator's point of view."""

    OK = "ok"  # answered; nothing needed repair (invalid calls may still have passed, repair off)
    REPAIRED = "repaired"  # at least one invalid call was fixed (promoted or re-asked)
    DECLINED = "declined"  # re-asked; the model answered in prose instead: no call, no fix
    REPAIR_EXHAUSTED = "repair_exhausted"  # repair ran out (or failed upstream) with errors left
    BUDGET_REJECTED = "budget_rejected"  # refused: the episode's error budget was spent
    UPSTREAM_ERROR = "upstream_error"  # the upstream failed, answered non-2xx, or garbage
    CLIENT_ERROR = "client_error"  # the request itself was bad (4xx made by the proxy)


class RepairMode(enum.StrEnum):
    OFF = "off"  # observe only
    PROMPT = "prompt"  # add the instruction to the system prompt; forward answers unchanged
    PROMOTE = "promote"  # promote calls written as text; no re-ask, no instruction
    REFLEXIVE = "reflexive"  # instruction + re-ask with a diagnosis per failed call
    CONSTRAINED = "constrained"  # reflexive, and attempt >= 2 forces the intended tool


class OnExhausted(enum.StrEnum):
    PASS = "pass"  # return the last answer (with the kept valid calls)
    STRIP = "strip"  # return it without its invalid calls
    ERROR = "error"  # raise errors.RepairExhaustedError


class BudgetPolicy(enum.StrEnum):
    """What happens to an episode's requests once its error budget is spent."""

    ANNOTATE = "annotate"  # answer as usual; headers say the budget is exhausted
    REJECT = "reject"  # refuse further requests of episodes with an explicit id
