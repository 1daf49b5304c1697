"""Repair: promotion of calls written as text, then the one bounded async re-ask loop (what each
re-ask says is built by ``reask``).

Step 0 costs no upstream call: a call the model wrote as text that names a declared tool with
valid arguments is promoted to a real ``tool_calls`` entry (``textcalls``). What remains invalid is
re-asked (reflexive, constrained). The client never sees a repair turn. Valid calls that came in the
same turn as a broken one are *kept by the proxy*: the model is told they are kept and asked to
re-issue only the failed calls; the final answer carries the kept calls (original ids, original
order) followed by the repaired ones, dropping any re-issued duplicate of a kept call (same name,
same arguments) and renaming any repeated id. If the model answers the repair with text only, the
kept calls are returned without that text. A model that repeats the same invalid answer gets a
different next attempt: its call quoted back with the exact correction expected, a lower
temperature, and (constrained) the tool it named forced. A failed re-ask never loses the answer
held so far: it is delivered under the ``on_exhausted`` policy with ``repair_failed`` set.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from repairproxy.errors import (
    RepairExhaustedError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from repairproxy.native import promoted_format
from repairproxy.observe.record import CaughtCall
from repairproxy.reask import (
    DEFAULT_TEMPLATE,
    MAX_NAME_EDITS,
    RepairTemplate,
    build_repair_turn,
    edit_distance,
    grounding_texts,
    lowered_temperature,
    near_name,
    quote_call,
    repair_request,
    ungrounded_values,
    unrelated_tool,
    with_repair_instruction,
)
from repairproxy.textcalls import TextCall, fresh_call_id, promote_calls, stopped_by_length
from repairproxy.types import OnExhausted, RepairMode
from repairproxy.validation import (
    CallRules,
    CallVerdict,
    Channel,
    CompiledTools,
    MessageVerdict,
    text_calls_allowed,
)
from repairproxy.wire.openai import first_message, message_text

__all__ = [
    "DEFAULT_TEMPLATE",
    "MAX_NAME_EDITS",
    "Complete",
    "RepairPolicy",
    "RepairRun",
    "RepairTemplate",
    "build_repair_turn",
    "caught_calls",
    "edit_distance",
    "escalated_tool_choice",
    "promotable_text_calls",
    "promote",
    "promoted_formats",
    "repair_completion",
    "with_repair_instruction",
]

# One completion for a request body: how the loop calls the model (``Upstream.complete``
# bound to the request's headers). Not ``Send``: that is the ASGI callable (``types.Send``).
Complete = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class RepairPolicy:
    mode: RepairMode = RepairMode.REFLEXIVE
    max_repairs: int = 2
    on_exhausted: OnExhausted = OnExhausted.PASS
    template: RepairTemplate = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        # Settings may hand over plain strings ("constrained"); store the enum members.
        object.__setattr__(self, "mode", RepairMode(self.mode))
        object.__setattr__(self, "on_exhausted", OnExhausted(self.on_exhausted))
        if self.max_repairs < 0:
            raise ValueError("max_repairs must be >= 0")

    @property
    def re_asks(self) -> bool:
        return self.mode in (RepairMode.REFLEXIVE, RepairMode.CONSTRAINED)

    @property
    def promotes(self) -> bool:
        return self.mode in (RepairMode.PROMOTE, RepairMode.REFLEXIVE, RepairMode.CONSTRAINED)


@dataclass(frozen=True, slots=True)
class RepairRun:
    """What ``repair_completion`` did to one answer.

    With ``n > 1`` every choice is repaired; the verdict fields (``first_verdict``,
    ``caught_channels``, ``caught_calls``, ``delivered_invalid``) are choice 0's, the one agents
    act on and the budget charges, while the work fields (``attempts``, ``promoted``, repair
    tokens, ``repair_failed``) count every choice.
    """

    response: dict[str, Any]
    attempts: int
    # Every invalid channel seen: the first answer's, then each re-ask's.
    caught_channels: tuple[Channel, ...]
    first_verdict: MessageVerdict
    exhausted: bool
    promoted: int = 0  # calls written as text returned as real tool calls
    # The format of each promoted call (``native.FAMILIES``), choice 0's first, in order.
    promoted_formats: tuple[str, ...] = ()
    caught_calls: tuple[CaughtCall, ...] = ()  # the first answer's invalid calls, with detail
    delivered_invalid: tuple[CallVerdict, ...] = ()  # invalid calls the client still receives
    repair_prompt_tokens: int = 0  # usage of the re-asks alone
    repair_completion_tokens: int = 0
    # A re-ask failed upstream ("400", "503", "timeout", "unavailable", "bad_answer"): the answer
    # is the best one held before it.
    repair_failed: str | None = None
    # A re-ask's reply called a listed tool with values found nowhere in the conversation after
    # the model asked for a tool none of the listed ones replaces; it was refused (``_made_up``).
    made_up: bool = False
    # The channels of the answer delivered (choice 0), after promotion, re-asks or stripping.
    delivered_channels: tuple[Channel, ...] = ()


# A mention is a whole word of word characters and hyphens (what a function name is made of),
# not preceded by a dot (``module.name`` names something else).
_WORD = re.compile(r"[\w-]+")


def _declared_mentions(text: str, tools: CompiledTools) -> list[str]:
    """Declared tool names the text mentions as words, in order of first mention.

    One pass over the text, each word looked up among the names: linear in text + tools, however
    many tools are declared (a name with other characters is not looked for).
    """
    names = tools.name_set
    found: dict[str, None] = {}
    for word in _WORD.finditer(text):
        name = word.group()
        if name in names and name not in found:
            start = word.start()
            if start == 0 or text[start - 1] != ".":
                found[name] = None
    return list(found)


def _intended_tool(call: CallVerdict, tools: CompiledTools, mentions: Sequence[str]) -> str | None:
    """The declared tool the model named (in the call, else in its text), or one within
    ``MAX_NAME_EDITS`` of the name it wrote; None when it named none (nothing is forced)."""
    if call.name is not None and tools.schema_for(call.name) is not None:
        return call.name
    if mentions:
        return mentions[0]
    return call.closest_tool if near_name(call.name, call.closest_tool) else None


def escalated_tool_choice(
    body: Mapping[str, Any],
    verdict: MessageVerdict,
    attempt: int,
    policy: RepairPolicy,
    message: Mapping[str, Any] | None = None,
    tools: CompiledTools | None = None,
) -> Any | None:
    """The ``tool_choice`` to force on this attempt (constrained mode, attempt >= 2), else None.

    The tool every failed call points at, when it is one: the declared tool the model named (in
    the call, or else in the answer's text), otherwise a declared name within ``MAX_NAME_EDITS``
    of the one it wrote; ``"required"`` when they point at different declared tools. Nothing
    when a failed call points at no declared tool (the model may rightly answer in text: no
    listed tool fits), for an empty answer, or when the client said ``tool_choice: "none"``.
    """
    if policy.mode is not RepairMode.CONSTRAINED or attempt < 2:
        return None
    if not text_calls_allowed(body):
        return None
    failed = [call for call in verdict.calls if call.channel is not Channel.VALID]
    if not failed or all(call.channel is Channel.EMPTY_OUTPUT for call in failed):
        return None
    mentions = (
        _declared_mentions(message_text(message), tools)
        if message is not None and tools is not None
        else []
    )
    intended = {
        _intended_tool(call, tools, mentions) if tools is not None else _closest_or_name(call)
        for call in failed
        if call.channel is not Channel.EMPTY_OUTPUT
    }
    if None in intended:
        return None
    if len(intended) == 1:
        (name,) = intended
        return {"type": "function", "function": {"name": name}}
    return "required"


def _closest_or_name(call: CallVerdict) -> str | None:
    if call.channel in (Channel.UNKNOWN_TOOL, Channel.TOOL_CALL_IN_CONTENT):
        return call.closest_tool if near_name(call.name, call.closest_tool) else None
    return call.name


# --- promotion -----------------------------------------------------------------------------------


def promote(message: Mapping[str, Any], verdict: MessageVerdict) -> tuple[Mapping[str, Any], int]:
    """``message`` with every call written as text that validates promoted to a tool call.

    Only candidate calls reach a verdict (prose that narrates, declines or quotes a call does
    not), and a call that conflicts with the request (``CallVerdict.conflict``) is never
    promoted. Calls written together (one JSON list, one tag) are promoted together or not at all.
    Returns the message (the same object when nothing was promoted) and how many were promoted.
    """
    chosen = promotable_text_calls(verdict)
    if not chosen:
        return message, 0
    promoted = promote_calls(message, chosen)
    count = len(promoted.get("tool_calls") or ()) - len(message.get("tool_calls") or ())
    return promoted, count


def promotable_text_calls(verdict: MessageVerdict) -> list[TextCall]:
    """The text calls ``promote`` turns into tool calls: every group (calls sharing one span)
    whose calls are all promotable."""
    spans: dict[tuple[int, int], list[CallVerdict]] = {}
    for call in verdict.calls:
        if call.text_call is not None:
            spans.setdefault((call.text_call.start, call.text_call.end), []).append(call)
    return [
        call.text_call
        for group in spans.values()
        if all(call.promotable for call in group)
        for call in group
        if call.text_call is not None
    ]


def promoted_formats(verdict: MessageVerdict) -> list[str]:
    """The bounded format label (``native.FAMILIES``) of each call ``promote`` promotes."""
    return [
        promoted_format(call.shape, call.source, call.family)
        for call in promotable_text_calls(verdict)
    ]


def caught_calls(verdict: MessageVerdict) -> tuple[CaughtCall, ...]:
    """Each invalid call of a verdict, with its form, invented name, and inner problem."""
    caught = []
    for call in verdict.calls:
        if call.channel is Channel.VALID:
            continue
        invented = call.channel is Channel.UNKNOWN_TOOL or call.inner is Channel.UNKNOWN_TOOL
        caught.append(
            CaughtCall(
                str(call.channel),
                call.form,
                call.name if invented and call.name else None,
                _DETAIL.get(call.inner) if call.inner is not None else None,
            )
        )
    return tuple(caught)


_DETAIL = {
    Channel.UNKNOWN_TOOL: "unknown_tool",
    Channel.SCHEMA_VIOLATION: "schema",
    Channel.INVALID_JSON: "invalid_json",
}


# --- assembling the final answer -----------------------------------------------------------------


def _choices(response: Mapping[str, Any]) -> list[Any]:
    choices = response.get("choices")
    return choices if isinstance(choices, list) else []


def _sum_usage(usages: Iterable[Any]) -> dict[str, Any] | None:
    total: dict[str, Any] | None = None
    for usage in usages:
        if not isinstance(usage, Mapping):
            continue
        total = _add_counts(total or {}, usage)
    return total


def _add_counts(into: dict[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            previous = into.get(key, 0)
            into[key] = (previous if isinstance(previous, int | float) else 0) + value
        elif isinstance(value, Mapping):
            nested = into.get(key)
            into[key] = _add_counts(dict(nested) if isinstance(nested, Mapping) else {}, value)
        elif key not in into:
            into[key] = value
    return into


def _tokens(usage: Mapping[str, Any] | None, key: str) -> int:
    value = usage.get(key) if usage is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _call_key(call: Mapping[str, Any]) -> tuple[str, str]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONDecodeError, TypeError):
        canonical = arguments if isinstance(arguments, str) else repr(type(arguments))
    return str(function.get("name")), canonical


def _copied_call(call: Any) -> Any:
    # Copy the path the proxy may change (the call and its function), never deep structures.
    if not isinstance(call, Mapping):
        return call
    copied = dict(call)
    if isinstance(call.get("function"), Mapping):
        copied["function"] = dict(call["function"])
    return copied


def _unique_ids(calls: list[Any]) -> list[Any]:
    """Kept and repaired calls merged: a repeated id (upstreams reuse "0") gets a fresh one."""
    seen: set[str] = set()
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            continue
        if call["id"] in seen:
            call["id"] = fresh_call_id()
        seen.add(call["id"])
    return calls


def _final_choice(
    last_choice: Mapping[str, Any],
    message: Mapping[str, Any],
    kept: Sequence[dict[str, Any]],
    verdict: MessageVerdict,
    strip_invalid: bool,
) -> dict[str, Any]:
    choice = dict(last_choice)
    final = dict(message)
    choice["message"] = final
    raw_calls = final.get("tool_calls")
    calls = [_copied_call(c) for c in raw_calls] if isinstance(raw_calls, list) else []
    if strip_invalid:
        invalid = {
            c.index for c in verdict.calls if c.channel is not Channel.VALID and c.text_call is None
        }
        calls = [call for index, call in enumerate(calls) if index not in invalid]
        if isinstance(final.get("function_call"), Mapping) and not verdict.ok:
            del final["function_call"]
    if kept:
        if not calls:
            # Text written in reply to a repair turn the client never sees would not make sense to
            # it, and τ²-bench rejects a message holding both text and tool calls.
            final["content"] = None
        seen = {_call_key(call) for call in kept}
        calls = [*map(_copied_call, kept), *(c for c in calls if _call_key(c) not in seen)]
    if calls:
        final["tool_calls"] = _unique_ids(calls)
        choice["finish_reason"] = "tool_calls"
    elif "tool_calls" in final:
        del final["tool_calls"]  # every call was stripped
        choice["finish_reason"] = "stop"
    elif (
        strip_invalid
        and "function_call" not in final
        and choice.get("finish_reason") == ("function_call")
    ):
        choice["finish_reason"] = "stop"
    return choice


# --- the loop ------------------------------------------------------------------------------------


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, UpstreamStatusError):
        return str(exc.reply.status_code)
    if isinstance(exc, UpstreamTimeoutError):
        return "timeout"
    return "unavailable"


def _signature(verdict: MessageVerdict) -> tuple[tuple[str, str | None, str], ...]:
    """What makes two invalid answers "the same": each failed call's channel, name and text."""
    return tuple(
        sorted(
            (str(call.channel), call.name, quote_call(call))
            for call in verdict.calls
            if call.channel is not Channel.VALID
        )
    )


@dataclass(slots=True)
class _ChoiceRepair:
    """The repair of one choice: the state of the loop, then its result."""

    choice: dict[str, Any]
    top: Mapping[str, Any]  # the completion whose metadata (id, model...) the answer carries
    first_verdict: MessageVerdict
    verdict: MessageVerdict
    caught_channels: list[Channel] = field(default_factory=list)
    attempts: int = 0
    promoted: int = 0
    promoted_formats: list[str] = field(default_factory=list)
    exhausted: bool = False
    made_up: bool = False
    repair_failed: str | None = None
    reask_usages: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class _Asking:
    """The re-ask loop's memory: the answer in hand, the turns sent, the calls kept."""

    message: Mapping[str, Any]  # the last answer's message (promoted calls in place)
    last_choice: Mapping[str, Any]
    rules: CallRules
    history: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    previous: tuple[Any, ...] = ()  # the last invalid answer's signature
    temperature: float | None = None
    attempt_start: int = 0  # where the last attempt's turns begin in ``history``


async def _repair_choice(
    body: Mapping[str, Any],
    top: Mapping[str, Any],
    choice: Mapping[str, Any],
    tools: CompiledTools,
    policy: RepairPolicy,
    complete: Complete,
) -> _ChoiceRepair:
    """One choice: validated, its text calls promoted, re-asked until valid or out of repairs."""
    message = choice.get("message")
    if not isinstance(message, Mapping):
        empty = MessageVerdict(())
        return _ChoiceRepair(dict(choice), top, empty, empty)
    text_ok = text_calls_allowed(body)
    # The original request's rules hold for every re-ask: its repair turns quote the model's own
    # call back, which must not make the re-issued call "quoted from the conversation".
    rules = CallRules.of_request(body)
    first_verdict = tools.check_message(
        message, text_calls=text_ok, rules=rules, cut_off=stopped_by_length(choice)
    )
    state = _ChoiceRepair(dict(choice), top, first_verdict, first_verdict)
    state.caught_channels.extend(first_verdict.error_channels)
    if first_verdict.ok or not policy.promotes or not text_ok:
        # Observing modes, and tool_choice "none" (no call expected: nothing to re-ask).
        return state
    message, state.promoted = _promoted(message, first_verdict, tools, state, rules)
    asking = _Asking(message, choice, rules)
    while policy.re_asks and not state.verdict.ok and state.attempts < policy.max_repairs:
        request, turn, newly_kept = _next_request(body, state, asking, tools, policy)
        try:
            reply = await complete(request)
        except (UpstreamStatusError, UpstreamTimeoutError, UpstreamUnavailableError) as exc:
            state.repair_failed = _failure_reason(exc)
            break
        if not _take_reply(reply, turn, newly_kept, body, state, asking, tools):
            break
    return _settled(choice, state, asking, tools, policy)


def _next_request(
    body: Mapping[str, Any],
    state: _ChoiceRepair,
    asking: _Asking,
    tools: CompiledTools,
    policy: RepairPolicy,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The next re-ask (request, its repair turns, the valid calls those turns keep). The
    same mistake twice is shown once, with the quote and the correction, and sampled cooler."""
    attempt = state.attempts + 1
    signature = _signature(state.verdict)
    repeated = signature == asking.previous
    asking.previous = signature
    turn, newly_kept = build_repair_turn(
        asking.message,
        state.verdict,
        tools,
        policy.template,
        attempt=attempt,
        max_repairs=policy.max_repairs,
        repeated=repeated,
    )
    if repeated:
        del asking.history[asking.attempt_start :]
        temperature = body.get("temperature") if asking.temperature is None else asking.temperature
        asking.temperature = lowered_temperature(temperature)
    asking.attempt_start = len(asking.history)
    tool_choice = escalated_tool_choice(body, state.verdict, attempt, policy, asking.message, tools)
    request = repair_request(body, [*asking.history, *turn], tool_choice, asking.temperature)
    return request, turn, newly_kept


def _take_reply(
    reply: dict[str, Any],
    turn: list[dict[str, Any]],
    newly_kept: list[dict[str, Any]],
    body: Mapping[str, Any],
    state: _ChoiceRepair,
    asking: _Asking,
    tools: CompiledTools,
) -> bool:
    """Judge a re-ask's reply into the loop's state; False when the loop must stop here."""
    reply_choices = _choices(reply)
    reply_message = first_message(reply)
    if reply_message is None:
        state.repair_failed = "bad_answer"
        return False
    state.attempts += 1
    asking.history.extend(turn)
    asking.kept.extend(newly_kept)
    state.reask_usages.append(reply.get("usage"))
    verdict = tools.check_message(
        reply_message, rules=asking.rules, cut_off=stopped_by_length(reply_choices[0])
    )
    if _made_up(state.verdict, verdict, reply_message, body, asking.message):
        # Asked for a tool no listed one replaces, the model called a listed tool anyway
        # with values found nowhere in the conversation: not what the user asked for. The
        # answer held (the first one, as text) is delivered; nothing made up is executed.
        state.made_up = True
        return False
    state.caught_channels.extend(verdict.error_channels)
    state.verdict = verdict
    asking.message, promoted = _promoted(reply_message, verdict, tools, state, asking.rules)
    state.promoted += promoted
    asking.last_choice, state.top = reply_choices[0], reply
    return True


def _settled(
    choice: Mapping[str, Any],
    state: _ChoiceRepair,
    asking: _Asking,
    tools: CompiledTools,
    policy: RepairPolicy,
) -> _ChoiceRepair:
    """The loop's end: an exhausted repair raises, is stripped or delivered as the policy says;
    the choice the client gets, and its verdict."""
    state.exhausted = not state.verdict.ok
    # A made-up reply refused is the model declining, as far as the client is concerned: the
    # answer held goes out as text, whatever ``on_exhausted`` says.
    if state.exhausted and policy.on_exhausted is OnExhausted.ERROR and not state.made_up:
        failed = f"; the re-ask failed ({state.repair_failed})" if state.repair_failed else ""
        raise RepairExhaustedError(
            f"no valid tool call after {state.attempts} repair attempt(s): "
            + ", ".join(map(str, state.verdict.error_channels))
            + failed,
            attempts=state.attempts,
            channels=tuple(map(str, state.caught_channels)),
        )
    strip = state.exhausted and policy.on_exhausted is OnExhausted.STRIP and not state.made_up
    last_choice = asking.last_choice
    state.choice = _final_choice(last_choice, asking.message, asking.kept, state.verdict, strip)
    if "index" in choice or last_choice is not choice:  # a re-ask's answer is always choice 0
        state.choice["index"] = choice.get("index", 0)
    # What the client actually receives.
    state.verdict = tools.check_message(
        state.choice["message"], rules=asking.rules, cut_off=stopped_by_length(state.choice)
    )
    return state


def _made_up(
    before: MessageVerdict,
    after: MessageVerdict,
    reply: Mapping[str, Any],
    body: Mapping[str, Any],
    answer: Mapping[str, Any],
) -> bool:
    """Whether a re-ask's reply calls a listed tool the model did not want, with made-up values.

    Only after an answer whose failed calls all named tools no listed one is a misspelling of
    (``reask.unrelated_tool``): the re-ask then said "answer in plain text if no listed tool
    fits", and a small model may still call the one listed tool with invented arguments
    (``get_order_details({"order_id": "12345"})`` for "send an email to bob@example.com"). A
    reply call is made up when it shares no argument name with the failed calls (another
    intent: ``to``/``body`` became ``order_id``) and some string or number in its arguments
    appears in no user, tool or assistant turn, nor in the declared tools
    (``reask.ungrounded_values``).
    """
    failed = [call for call in before.calls if call.channel is not Channel.VALID]
    if not failed or not all(unrelated_tool(call) for call in failed):
        return False
    wanted = {key for call in failed for key in _argument_names(_call_arguments(answer, call))}
    calls = [
        arguments
        for verdict in after.calls
        if verdict.name is not None
        and not wanted & _argument_names(arguments := _call_arguments(reply, verdict))
    ]
    if not calls:
        return False
    grounding = grounding_texts(body, [answer])
    return any(ungrounded_values(arguments, grounding) for arguments in calls)


def _argument_names(arguments: Any) -> set[str]:
    return set(arguments) if isinstance(arguments, Mapping) else set()


def _call_arguments(message: Mapping[str, Any], verdict: CallVerdict) -> Any:
    """The arguments of a message's call, decoded (a call written as text carries them)."""
    if verdict.text_call is not None:
        return verdict.text_call.arguments
    entries = message.get("tool_calls") or ()
    entry = entries[verdict.index] if 0 <= verdict.index < len(entries) else None
    function = entry.get("function") if isinstance(entry, Mapping) else None
    raw = function.get("arguments") if isinstance(function, Mapping) else None
    try:
        return orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    except orjson.JSONDecodeError:
        return raw


def _promoted(
    message: Mapping[str, Any],
    verdict: MessageVerdict,
    tools: CompiledTools,
    state: _ChoiceRepair,
    rules: CallRules,
) -> tuple[Mapping[str, Any], int]:
    """Step 0: promote text calls that validate; the verdict in ``state`` follows the message."""
    promoted, count = promote(message, verdict)
    if count:
        state.verdict = tools.check_message(promoted, rules=rules)
        state.promoted_formats.extend(promoted_formats(verdict))
    return promoted, count


async def repair_completion(
    body: Mapping[str, Any],
    first_response: Mapping[str, Any],
    tools: CompiledTools,
    policy: RepairPolicy,
    complete: Complete,
) -> RepairRun:
    """Validate the upstream's answer; promote calls written as text; re-ask for the rest.

    ``body`` is the request as it went upstream; ``complete`` posts a non-streaming request upstream
    and returns the completion JSON (it raises ``UpstreamStatusError`` / ``UpstreamTimeoutError``
    / ``UpstreamUnavailableError`` on failure: the answer held so far is then delivered, with
    ``repair_failed`` set). OFF/PROMPT only validate; PROMOTE promotes and never re-asks;
    REFLEXIVE/CONSTRAINED promote, then re-ask (bounded). With ``tool_choice: "none"`` text is not
    classified and nothing is re-asked. With ``OnExhausted.ERROR`` the error carries every
    channel caught. Every choice of an ``n > 1`` answer is repaired on its own.
    """
    choices = _choices(first_response)
    if not choices:
        empty = MessageVerdict(())
        return RepairRun(dict(first_response), 0, (), empty, False)
    results = [
        await _repair_choice(body, first_response, choice, tools, policy, complete)
        if isinstance(choice, Mapping)
        else None
        for choice in choices
    ]
    head = results[0]
    if head is None:
        empty = MessageVerdict(())
        return RepairRun(dict(first_response), 0, (), empty, False)
    reask_usages = [u for r in results if r is not None for u in r.reask_usages]
    changed = any(r is not None and (r.attempts or r.promoted) for r in results)
    if not changed and not any(r is not None and r.exhausted for r in results):
        response = dict(first_response)
    else:
        response = dict(head.top if len(choices) == 1 else first_response)
        response["choices"] = [
            r.choice if r is not None else choice
            for r, choice in zip(results, choices, strict=True)
        ]
        usage = _sum_usage([first_response.get("usage"), *reask_usages])
        if usage is not None:
            response["usage"] = usage
    reask_usage = _sum_usage(reask_usages)
    delivered = tuple(c for c in head.verdict.calls if c.channel is not Channel.VALID)
    return RepairRun(
        response,
        sum(r.attempts for r in results if r is not None),
        tuple(head.caught_channels),
        head.first_verdict,
        head.exhausted,
        promoted=sum(r.promoted for r in results if r is not None),
        promoted_formats=tuple(f for r in results if r is not None for f in r.promoted_formats),
        caught_calls=caught_calls(head.first_verdict),
        delivered_invalid=delivered,
        repair_prompt_tokens=_tokens(reask_usage, "prompt_tokens"),
        repair_completion_tokens=_tokens(reask_usage, "completion_tokens"),
        repair_failed=next((r.repair_failed for r in results if r and r.repair_failed), None),
        made_up=any(r is not None and r.made_up for r in results),
        delivered_channels=head.verdict.error_channels,
    )
