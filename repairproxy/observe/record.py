"""What one request did, as one typed record, and the observer that receives it.

The pipeline fills one ``RequestRecord`` per request, whichever API it came through (chat
completions, Responses and Messages all reach it as a chat request), and the route hands it to a
``PipelineObserver`` when the answer has left. Metrics implement the observer; the
default one does nothing. One call per request, after the client has its answer: observers never
sit on the latency path of the answer itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from repairproxy.types import API, Outcome, RepairMode

if TYPE_CHECKING:  # the record only carries the snapshot: observe does not depend on episodes
    from repairproxy.episodes.budget import BudgetSnapshot

__all__ = [
    "CaughtCall",
    "EpisodeRecord",
    "NullObserver",
    "OutputRecord",
    "PipelineObserver",
    "RepairResult",
    "RepairResultKind",
    "RequestRecord",
]


class RepairResultKind(enum.StrEnum):
    """How a repair ended, one meaning each (the ``result`` label of ``repairproxy_repairs``)."""

    FIXED = "fixed"  # the agent got valid calls: promoted, or a re-ask answered with calls
    DECLINED = "declined"  # re-asked, the model answered in prose: no call to run, not a fix
    FAILED = "failed"  # invalid calls were still left when the re-asks ran out
    UPSTREAM_ERROR = "upstream_error"
    # The proxy refused a re-ask's reply (a listed tool called with made-up values after the
    # model asked for a tool none replaces) and delivered the answer it held: its own decision,
    # not the model's failure to fix the call.
    WITHHELD = "withheld"


@dataclass(frozen=True, slots=True)
class CaughtCall:
    """One invalid call in the model's first answer.

    ``channel`` is a ``validation.Channel`` value; ``form`` says whether the call came as a
    structured ``tool_calls`` entry or was written as text; ``tool`` is the name the model used
    when it was not a declared tool (an invented name, for the hallucination inventory).
    """

    channel: str
    form: str = "structured"  # "structured" | "text"
    tool: str | None = None
    detail: str | None = None  # what was wrong inside a text call: "unknown_tool", "schema", ...


@dataclass(frozen=True, slots=True)
class RepairResult:
    channel: str
    result: RepairResultKind


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class EpisodeRecord:
    """The episode's budget around this request (charged errors, as τ²-bench would count them).

    ``errors_before`` / ``errors_after`` bracket this request's charges, so an observer can tell
    which budget-ladder rungs were crossed exactly once even when several processes share a store.
    """

    new: bool
    explicit: bool  # the client sent an episode header (else the proxy chained the conversation)
    errors_before: int
    errors_after: int
    budget: int
    exhausted: bool

    @property
    def remaining(self) -> int:
        return max(self.budget - self.errors_after, 0)


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """The check of a structured output (``response_format``): never charged to the budget.

    ``caught_channels``: the channels of the first answer and of each re-ask's answer that failed;
    ``result``: ``fixed``/``failed``/``upstream_error`` once a re-ask was tried, else None.
    """

    caught_channels: tuple[str, ...] = ()
    error_paths: tuple[str, ...] = ()  # the first answer's failing paths
    repair_attempts: int = 0
    result: RepairResultKind | None = None


@dataclass(slots=True)
class RequestRecord:
    """Every fact of one request, written once as the request goes: the ``X-Repairproxy-*``
    headers, the stream trailer, the log line (``asgi/exchange.py``) and the metrics read it."""

    api: API = API.CHAT
    model: str | None = None  # as the client asked (the metrics' model label)
    served_model: str | None = None  # as the upstream's answer names it
    stream: bool = False
    outcome: Outcome = Outcome.OK
    status: int = 0  # the status sent (499: the client went away first)
    tool_calls: int = 0  # calls seen in the first answer, text calls included
    caught_calls: list[CaughtCall] = field(default_factory=list)
    env_errors: list[str] = field(default_factory=list)  # env_* labels newly counted
    repair_results: list[RepairResult] = field(default_factory=list)
    mode: RepairMode | None = None  # the repair mode the request runs under (header or default)
    episode_id: str | None = None  # set once the episode is known, even before its snapshot
    warn_missing_header: bool = False  # the first request without an episode header
    snapshot: BudgetSnapshot | None = None  # the episode's count after the last observation
    # What the verdict headers and the log line report: every channel caught (the first answer's,
    # then each re-ask's; the first answer's alone when the request ended in an error), and why a
    # re-ask could not be made ("timeout", "unavailable", a status code, "bad_answer").
    channels: tuple[str, ...] = ()
    repair_failed: str | None = None
    # The channels of the answer the client received (choice 0), as the proxy judged it; None
    # where no answer with tools was judged (no tools declared, or an error was sent instead).
    delivered_channels: tuple[str, ...] | None = None
    # With n > 1: each choice's error channels, in choice order (choice 0 as judged, the others
    # as they came: only choice 0 is repaired).
    choice_channels: tuple[tuple[str, ...], ...] = ()
    promoted: int = 0
    # The format each promoted text call was written in (``native.FAMILIES``: a model family's
    # native format, or "other"), in order; set where the promotion is made.
    promoted_formats: list[str] = field(default_factory=list)
    repair_attempts: int = 0
    repair_prompt_tokens: int = 0
    repair_completion_tokens: int = 0
    repair_seconds: float = 0.0
    upstream_seconds: float = 0.0
    overhead_seconds: float = 0.0
    first_byte_seconds: float | None = None
    tool_name_margins: list[float] = field(default_factory=list)
    # The names those margins were written for, same order (the X-Repairproxy-Tool-Name-Margins
    # header pairs them, so a study can tell declared names' margins from invented ones').
    tool_name_margin_names: list[str] = field(default_factory=list)
    episode: EpisodeRecord | None = None
    output: OutputRecord | None = None  # set when the request asked for a JSON response format
    request_body: bytes | None = None  # kept only with --log-bodies
    response_body: bytes | None = None


class PipelineObserver(Protocol):
    """Receives one record per finished request. Must not raise and must not block."""

    def request_finished(self, record: RequestRecord) -> None: ...


class NullObserver:
    """The observer when metrics are off."""

    def request_finished(self, record: RequestRecord) -> None:
        return None
