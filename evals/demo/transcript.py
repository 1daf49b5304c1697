"""One episode through the proxy as a short readable transcript, its counts and a one-line verdict.

Pure: an episode's messages (with the ``repairproxy`` report each agent turn carries), optionally
the raw answers the model wrote (the embedded server's answer log), in; lines of text out. What
reached the agent is re-checked here against the declared tools, so "invalid answers delivered"
does not depend on what the proxy says about itself.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evals.tau2.logs import AssistantMessage, SimulationRun, ToolMessage, UserMessage
from repairproxy.types import RepairMode
from repairproxy.validation import Channel, CompiledTools

CHARGED = frozenset({str(Channel.UNKNOWN_TOOL), str(Channel.SCHEMA_VIOLATION)})

__all__ = [
    "CHANNEL_WORDS",
    "EpisodeCounts",
    "TurnView",
    "delivered_channels",
    "episode_counts",
    "first_divergence",
    "render_transcript",
    "turn_views",
    "verdict",
]

CHANNEL_WORDS: dict[str, str] = {
    Channel.TOOL_CALL_IN_CONTENT: "the model wrote its tool call as text",
    Channel.UNKNOWN_TOOL: "the model invented a tool name",
    Channel.SCHEMA_VIOLATION: "bad arguments",
    Channel.INVALID_JSON: "broken JSON arguments",
    Channel.EMPTY_OUTPUT: "the model answered nothing at all",
}

_TERMINATION_WORDS = {
    "user_stop": "the user ended the conversation",
    "agent_stop": "the agent ended the conversation",
    "max_steps": "it ran out of steps",
    "too_many_errors": "the error budget ran out",
    "agent_error": "the agent could not get an answer",
    "user_error": "the user simulator failed",
}


# Answers are shown whole (flattened to one line): a reader must see why nothing was caught. The
# bound only keeps a runaway answer (max_tokens of text) from flooding the terminal.
ANSWER_CHARS = 2000


def _one_line(text: str | None, limit: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _call_text(name: str, arguments: Mapping[str, Any], limit: int = 400) -> str:
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return _one_line(f"{name}({shown})", limit)


def _as_openai(message: AssistantMessage) -> dict[str, Any]:
    calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": call.raw_arguments
                if call.raw_arguments is not None
                else json.dumps(call.arguments),
            },
        }
        for call in message.tool_calls or []
    ]
    body: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        body["tool_calls"] = calls
    return body


def delivered_channels(
    message: AssistantMessage, tools: CompiledTools | None, *, cut_off: bool = False
) -> list[str]:
    """The error channels of the answer as the agent received it (empty: a valid answer);
    ``cut_off``: the answer stopped at the token limit, whose call shapes are text to the
    proxy too (``textcalls.NotACall.CUT_OFF``)."""
    if tools is None:
        return []
    verdict = tools.check_message(_as_openai(message), cut_off=cut_off)
    return [str(channel) for channel in verdict.error_channels]


@dataclass
class TurnView:
    """One agent turn: what was written, what the proxy did, what ran, what was left."""

    index: int
    message: AssistantMessage
    raw_answers: list[dict[str, Any]] = field(default_factory=list)  # first answer, then re-asks
    results: list[tuple[str, ToolMessage | None]] = field(default_factory=list)
    user_reply: UserMessage | None = None
    delivered: list[str] = field(default_factory=list)

    @property
    def report(self) -> dict[str, Any]:
        return self.message.repairproxy or {}

    @property
    def caught(self) -> list[str]:
        return [str(c) for c in self.report.get("tool_errors") or []]

    @property
    def promoted(self) -> int:
        return int(self.report.get("promoted") or 0)

    @property
    def reasks(self) -> int:
        return int(self.report.get("repairs") or 0)

    @property
    def seconds(self) -> float | None:
        if not self.raw_answers:
            return None
        return sum(
            float(a.get("prefill_seconds", 0)) + float(a.get("decode_seconds", 0))
            for a in self.raw_answers
        )


def turn_views(
    run: SimulationRun,
    tools: CompiledTools | None,
    raw_answers: Sequence[Mapping[str, Any]] = (),
) -> list[TurnView]:
    """The agent turns of ``run``; ``raw_answers`` (in order) are dealt out by upstream calls."""
    views: list[TurnView] = []
    pending: dict[str, int] = {}
    answers = list(raw_answers)
    for message in run.messages:
        if isinstance(message, AssistantMessage):
            if message.repairproxy is None and not message.tool_calls and not views:
                continue  # the orchestrator's fixed greeting: no model wrote it
            view = TurnView(len(views) + 1, message)
            calls = int(view.report.get("upstream_calls") or 1) if view.report else 0
            view.raw_answers, answers = [dict(a) for a in answers[:calls]], answers[calls:]
            # The agent got the turn's last upstream answer: judged as the proxy judged it.
            last = view.raw_answers[-1] if view.raw_answers else {}
            view.delivered = delivered_channels(
                message, tools, cut_off=last.get("finish_reason") == "length"
            )
            for call in message.tool_calls or []:
                view.results.append((_call_text(call.name, call.arguments), None))
                pending[call.id] = len(view.results) - 1
            views.append(view)
        elif isinstance(message, ToolMessage) and message.requestor == "assistant" and views:
            slot = pending.pop(message.id, None)
            if slot is not None:
                text, _ = views[-1].results[slot]
                views[-1].results[slot] = (text, message)
        elif isinstance(message, UserMessage) and views and views[-1].user_reply is None:
            views[-1].user_reply = message
    return views


@dataclass(frozen=True)
class EpisodeCounts:
    agent_turns: int
    caught: Counter[str]  # channel -> agent answers where the proxy caught it in the first answer
    promoted: int
    reasks: int
    invalid_delivered: int  # answers that reached the agent with an invalid or text-only call
    tool_calls: int  # agent tool calls executed
    failed_tool_calls: int
    budget_remaining: int | None


def episode_counts(views: Sequence[TurnView]) -> EpisodeCounts:
    caught: Counter[str] = Counter()
    for view in views:
        caught.update(set(view.caught))
    results = [r for v in views for _, r in v.results if r is not None]
    budget = next(
        (
            int(v.report["budget_remaining"])
            for v in reversed(views)
            if "budget_remaining" in v.report
        ),
        None,
    )
    return EpisodeCounts(
        agent_turns=len(views),
        caught=caught,
        promoted=sum(v.promoted for v in views),
        reasks=sum(v.reasks for v in views),
        invalid_delivered=sum(1 for v in views if v.delivered),
        tool_calls=len(results),
        failed_tool_calls=sum(1 for r in results if r.error),
        budget_remaining=budget,
    )


def _proxy_line(view: TurnView, repair: str) -> str:
    if not view.report:
        return "no report (not through the proxy)"
    if not view.caught:
        return "nothing to fix"
    what = "; ".join(f"{c} ({CHANNEL_WORDS.get(c, c)})" for c in dict.fromkeys(view.caught))
    steps = []
    if view.promoted:
        steps.append(f"promoted {view.promoted} text call(s) to real tool calls")
    if view.reasks:
        steps.append(f"re-asked the model {view.reasks}x")
    if view.report.get("repair_failed"):
        steps.append(f"repair failed ({view.report['repair_failed']})")
    if repair == RepairMode.OFF:
        steps.append("repair is off: forwarded as it was")
    elif not steps:
        steps.append("left it as it was")
    return f"caught {what}; {', '.join(steps)}; {_delivered_line(view)}"


def _delivered_line(view: TurnView) -> str:
    """What the agent got, in words that never call a call "valid" when it then failed: the
    proxy checks names and arguments; whether the call succeeds is the environment's answer."""
    if view.delivered:
        return f"the agent still got an invalid answer ({', '.join(dict.fromkeys(view.delivered))})"
    ran = [result for _, result in view.results if result is not None]
    failed = [result for result in ran if result.error]
    if failed:
        why = _one_line(failed[0].content, ANSWER_CHARS)
        return f"the agent got a well-formed call; it ran and failed ({why!r})"
    if ran:
        return "the agent got a well-formed call; it ran"
    if view.results:
        return "the agent got a well-formed call (not run)"
    return "the agent got a text answer"


_CALL_START = re.compile(r"(```(?:json)?\s*)?(\{\s*\"name\"|<tool_call>|<function=)")


def _wrote_line(view: TurnView) -> str:
    if view.raw_answers:
        text = str(view.raw_answers[0].get("text") or "")
        if not text.strip():
            return "(nothing)"
        call = _CALL_START.search(text) if view.caught else None
        if call is None:
            return repr(_one_line(text, ANSWER_CHARS))
        prose = _one_line(text[: call.start()], ANSWER_CHARS)
        written = _one_line(text[call.start(2) :], ANSWER_CHARS)
        return f"{prose!r} + a call as text: {written}" if prose else f"a call as text: {written}"
    if view.message.content and view.message.content.strip():
        return repr(_one_line(view.message.content, ANSWER_CHARS))
    return "(a tool call, no text)" if view.message.tool_calls else "(nothing)"


def _plain(view: TurnView) -> bool:
    """A turn where the agent only talked: no call in any form, nothing for the proxy to do."""
    return not view.caught and not view.results and not view.delivered


def _took(view: TurnView) -> str:
    return f" ({view.seconds:.1f} s)" if view.seconds is not None else ""


def _turn_lines(view: TurnView, repair: str) -> list[str]:
    if _plain(view):
        return [
            f"[{view.index}] agent{_took(view)}: {_one_line(view.message.content, ANSWER_CHARS)!r}"
        ]
    lines = [f"[{view.index}] agent{_took(view)}", f"    wrote   {_wrote_line(view)}"]
    if view.raw_answers[1:]:
        again = view.raw_answers[1:]
        lines.append(
            "    re-asks "
            + ", ".join(repr(_one_line(str(a.get("text")), ANSWER_CHARS)) for a in again)
        )
    lines.append(f"    proxy   {_proxy_line(view, repair)}")
    raw = str(view.raw_answers[0].get("text") or "") if view.raw_answers else None
    said = view.message.content or ""
    if raw is not None and said.strip() and " ".join(said.split()) != " ".join(raw.split()):
        lines.append(f"    agent   got the text {_one_line(said, ANSWER_CHARS)!r}")
    for call, result in view.results:
        if result is None:
            lines.append(f"    ran     {call} -> (not run)")
        else:
            mark = "ERROR " if result.error else ""
            lines.append(f"    ran     {call} -> {mark}{_one_line(result.content, ANSWER_CHARS)}")
    return lines


STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # τ²-bench's user signals


def _user_text(content: str | None) -> str:
    text = content or ""
    ended = any(marker in text for marker in STOP_MARKERS)
    for marker in STOP_MARKERS:
        text = text.replace(marker, "")
    shown = _one_line(text, ANSWER_CHARS)
    if ended:
        return f"{shown} (and ends the conversation)" if shown else "(ends the conversation)"
    return shown


def _own_charges(view: TurnView) -> int:
    """Budget units the turn's own first answer charged (τ²-bench would have run those calls)."""
    return sum(1 for channel in view.caught if channel in CHARGED)


def render_transcript(views: Sequence[TurnView], *, repair: str, budget: int) -> list[str]:
    """A few lines per agent turn (one for plain talk); a run of exchanges the conversation
    already had is folded into one line; the budget is shown when it changes."""
    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    folded: list[TurnView] = []
    shown_budget: Any = None

    def fold() -> None:
        if folded:
            first, last = folded[0].index, folded[-1].index
            span = f"[{first}]" if first == last else f"[{first}-{last}]"
            lines.append(f"{span} the same exchanges again ({len(folded)} agent turn(s))")
            folded.clear()

    for position, view in enumerate(views):
        reply = view.user_reply.content if view.user_reply is not None else ""
        key = (" ".join((view.message.content or "").split()), " ".join((reply or "").split()))
        if _plain(view) and key in seen:
            folded.append(view)
            continue
        fold()
        seen.add(key)
        lines.extend(_turn_lines(view, repair))
        # The budget line follows what charged it: this answer's own invented names or bad
        # arguments are charged on this request; a failed tool result is charged when the next
        # request carries it, so that part is shown here, after the result, from the next report.
        remaining = view.report.get("budget_remaining")
        after = views[position + 1].report if position + 1 < len(views) else {}
        if isinstance(after.get("budget_remaining"), int) and isinstance(remaining, int):
            next_own = _own_charges(views[position + 1])
            remaining = max(after["budget_remaining"] + next_own, 0)
            remaining = min(remaining, view.report.get("budget_remaining", remaining))
        if remaining is not None and remaining != shown_budget:
            lines.append(f"    budget  {remaining} of {budget} left")
            shown_budget = remaining
        if view.user_reply is not None:
            lines.append(f"  user: {_user_text(view.user_reply.content)}")
    fold()
    return lines


def verdict(run: SimulationRun, counts: EpisodeCounts, *, repair: str) -> str:
    """One line: did it work, and what did the proxy have to do with it."""
    reward = run.reward_info.reward if run.reward_info else 0.0
    ending = _TERMINATION_WORDS.get(run.termination_reason, run.termination_reason)
    caught = sum(counts.caught.values())
    if caught == 0:
        proxy = "the model made no tool-call error the proxy had to catch"
    elif counts.invalid_delivered == 0:
        proxy = f"the proxy caught {caught} invalid answer(s) and the agent never saw one"
    elif repair == RepairMode.OFF:
        proxy = f"with repair off, {counts.invalid_delivered} invalid answer(s) reached the agent"
    else:
        proxy = (
            f"the proxy caught {caught} invalid answer(s) but {counts.invalid_delivered} still "
            "reached the agent"
        )
    solved = "SOLVED" if reward >= 1 - 1e-6 else "NOT SOLVED"
    return (
        f"{solved} (reward {reward:g}): {ending}; {proxy}; "
        f"{counts.tool_calls} tool call(s) ran, {counts.failed_tool_calls} failed."
    )


def _delivered(view: TurnView) -> tuple[str, tuple[str, ...]]:
    """What the agent received in a turn: its text and its calls (name and arguments)."""
    calls = tuple(
        _call_text(call.name, call.arguments, ANSWER_CHARS)
        for call in view.message.tool_calls or []
    )
    return " ".join((view.message.content or "").split()), calls


def first_divergence(
    left: Sequence[TurnView], right: Sequence[TurnView], *, labels: tuple[str, str]
) -> list[str]:
    """Lines naming the first agent turn where the two runs' agents received different answers
    (text or calls), with both sides; or that they never differed."""
    for a, b in zip(left, right, strict=False):
        if _delivered(a) == _delivered(b):
            continue
        lines = [f"first divergence: agent turn {a.index}"]
        for label, view in zip(labels, (a, b), strict=True):
            text, calls = _delivered(view)
            got = "; ".join(calls) if calls else repr(_one_line(text, ANSWER_CHARS))
            caught = ", ".join(dict.fromkeys(view.caught)) or "nothing"
            lines.append(f"  {label}: the agent got {got} (the proxy caught {caught})")
        return lines
    if len(left) != len(right):
        shorter = min(len(left), len(right))
        return [
            f"first divergence: after agent turn {shorter}, one run ended and the other went on"
        ]
    return ["the two runs never diverged: the agent received the same answers in every turn"]
