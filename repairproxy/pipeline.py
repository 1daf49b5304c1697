"""One chat completion, decided: instruction -> upstream -> validate -> promote -> repair ->
charge the budget -> one event for the observer.

The routes frame HTTP (auth, body, headers, SSE, the log line); this module decides what the
answer is. Buffered and streamed answers meet here the same way: the stream gate hands over the
assembled completion, and ``judge`` returns the answer to send. Like inspect_ai's
``Solver(state, generate)``, a step of work is given a way to call the model
(``repair.Complete``) and never owns the transport. The chat-completions shape is read here only
through small accessors (``first_message``), so the Responses and Messages adapters reuse the
same steps.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import orjson

from repairproxy.episodes.budget import BudgetSnapshot, EpisodeRef, ErrorBudget
from repairproxy.errors import (
    BadRequestError,
    BudgetExhaustedError,
    InvalidJSONBodyError,
    NotFoundError,
    RepairExhaustedError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from repairproxy.margin import named_tool_name_margins, strip_probe, with_probe
from repairproxy.observe.record import (
    CaughtCall,
    EpisodeRecord,
    OutputRecord,
    RepairResult,
    RepairResultKind,
)
from repairproxy.observe.record import RequestRecord as Record
from repairproxy.reask import build_output_repair_turn, repair_request
from repairproxy.repair import (
    Complete,
    RepairPolicy,
    caught_calls,
    repair_completion,
    with_repair_instruction,
)
from repairproxy.settings import Settings
from repairproxy.structured import FormatCache, OutputFormat
from repairproxy.textcalls import stopped_by_length
from repairproxy.types import BudgetPolicy, OnExhausted, Outcome, RepairMode
from repairproxy.validation import (
    CallRules,
    CallVerdict,
    Channel,
    CompiledTools,
    MessageVerdict,
    ToolsCache,
)
from repairproxy.wire.openai import ChatCompletion, ChatRequestBody, first_message

__all__ = ["ChatPipeline", "ChatRequest", "Decision", "instructs", "json_object"]

REPAIR_HEADER = "x-repairproxy-repair"
BUDGET_HEADER = "x-repairproxy-budget"
# Modes whose answers the proxy may change (promotion, then re-asks for reflexive/constrained).
_CHANGES_ANSWERS = frozenset({RepairMode.PROMOTE, RepairMode.REFLEXIVE, RepairMode.CONSTRAINED})
# Modes that add the repair instruction to the system prompt (promote is promotion alone).
_INSTRUCTS = frozenset({RepairMode.PROMPT, RepairMode.REFLEXIVE, RepairMode.CONSTRAINED})
_MODES = {mode.value: mode for mode in RepairMode}


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; anything else is a 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSONBodyError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidJSONBodyError("the request body must be a JSON object")
    return body


def instructs(mode: RepairMode) -> bool:
    """Whether ``mode`` adds the repair instruction to the system prompt (or instructions)."""
    return mode in _INSTRUCTS


_RESPONSE_KEY = b"response:"  # chain-index keys for Responses ids (never a history digest)
_MAX_BUDGET_DIGITS = 9


def _response_key(tenant: str, response_id: str) -> bytes:
    """The chain-index key of a delivered Responses id, within its tenant."""
    scope = f"{tenant}/" if tenant else ""
    return _RESPONSE_KEY + (scope + response_id).encode("utf-8", "surrogatepass")


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat-completion request and what the proxy decided about it before answering."""

    body: ChatRequestBody
    raw: bytes
    tools: CompiledTools | None
    mode: RepairMode
    budget_override: int | None  # the client's X-Repairproxy-Budget, if sent
    episode: EpisodeRef | None = None
    forward: ChatRequestBody | None = None  # the body as it goes upstream
    forward_raw: bytes = b""
    probe_added: bool = False  # --margin-probe asked for logprobs the client did not
    output: OutputFormat | None = None  # the JSON answer the client asked for (response_format)

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))

    def reask_body(self) -> dict[str, Any]:
        """What repair re-asks start from: the forwarded body, never streamed."""
        forward = self.forward if self.forward is not None else self.body
        return {k: v for k, v in forward.items() if k not in ("stream", "stream_options")}


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class Decision:
    """What ``judge`` decided: the answer to send and what it took (``types.Outcome`` is the
    operator's one-word summary of it, in the record and the metrics)."""

    answer: ChatCompletion
    changed: bool
    first_verdict: MessageVerdict | None
    caught_channels: tuple[str, ...]
    repair_attempts: int
    promoted: int = 0
    repair_failed: str | None = None


class ChatPipeline:
    """Validation, repair and budget rules for chat completions, built once per app."""

    def __init__(
        self,
        settings: Settings,
        tools_cache: ToolsCache,
        episodes: ErrorBudget,
        policies: Mapping[RepairMode, RepairPolicy],
    ) -> None:
        self.settings = settings
        self.tools_cache = tools_cache
        self.episodes = episodes  # episode identity, chaining and the error budget
        self.policies = policies
        self.formats = FormatCache(max_format_bytes=settings.max_response_format_bytes)

    # -- before the upstream ----------------------------------------------------------------------

    def parse(self, raw: bytes, headers: Mapping[str, str], record: Record) -> ChatRequest:
        """The request body and per-request options; malformed input is a 400, never a 500."""
        return self.parse_body(json_object(raw), raw, headers, record)

    def parse_body(
        self, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], record: Record
    ) -> ChatRequest:
        """A decoded chat body (as sent, or an adapter's chat view of another API's request)."""
        for name in ("messages", "tools", "functions"):
            value = body.get(name)
            if value is not None and not isinstance(value, list):
                raise BadRequestError(f"'{name}' must be an array", param=name)
        for message in body.get("messages") or ():
            if type(message) is not dict or type(message.get("role")) is not str:
                _check_messages(body["messages"])  # the exact test, which names the culprit
        model = body.get("model")
        record.model = model if isinstance(model, str) else None
        record.stream = body.get("stream") is True
        # The two schemas share the request's caps on what their compiles cost.
        max_patterns, max_nodes = self.settings.max_schema_patterns, self.settings.max_schema_nodes
        tools = self.tools_cache.compile(body, max_patterns=max_patterns, max_nodes=max_nodes)
        request = ChatRequest(
            cast(ChatRequestBody, body), raw, tools, self._mode(headers), self._budget(headers)
        )
        request.output = self.formats.compile(
            body,
            max_patterns=max_patterns,
            max_nodes=max_nodes,
            tools_patterns=tools.patterns if tools is not None else 0,
            tools_nodes=tools.nodes if tools is not None else 0,
        )
        record.mode = request.mode
        return request

    async def admit(
        self,
        request: ChatRequest,
        headers: Mapping[str, str],
        record: Record,
        episode: EpisodeRef | None = None,
    ) -> None:
        """Find the episode (unless an adapter already did), count the error results the history
        reports, and apply the budget policy."""
        ref = episode or await self.episodes.resolve_episode(headers, request.body)
        request.episode = ref
        record.episode_id = ref.id
        record.warn_missing_header = ref.warn_missing_header
        snapshot = await self.episodes.observe_request(ref, request.body, request.budget_override)
        record.snapshot = snapshot
        record.env_errors = list(snapshot.new_env_errors)
        # An unknown budget (shared store down) is not observed: no ladder rung, no histogram.
        record.episode = (
            None if snapshot.unknown else _episode_record(ref.new, ref.explicit, snapshot)
        )
        if (
            snapshot.exhausted
            and ref.explicit  # a chained episode may be a fresh conversation that looks old
            and self.settings.on_budget_exhausted is BudgetPolicy.REJECT
        ):
            record.outcome = Outcome.BUDGET_REJECTED
            raise BudgetExhaustedError(
                f"episode {ref.id} spent its error budget "
                f"({snapshot.errors} errors, budget {snapshot.budget})"
            )

    def prepare_forward(self, request: ChatRequest) -> None:
        """The body as it goes upstream: byte for byte unless the instruction (or the margin
        probe, on non-streaming requests with tools) is added."""
        request.forward = request.body
        request.forward_raw = request.raw
        if request.tools is None:
            return
        # Neither step mutates what it is given: each returns a copy when it changes something.
        forward = cast(dict[str, Any], request.body)
        if request.mode in _INSTRUCTS:
            forward = with_repair_instruction(forward, self.policies[request.mode].template)
        if self.settings.margin_probe and not request.stream:
            forward, request.probe_added = with_probe(forward)
        if forward is request.body or forward == request.body:
            return
        try:
            request.forward_raw = orjson.dumps(forward)
        except (TypeError, orjson.JSONEncodeError) as exc:  # nested deeper than orjson writes
            raise BadRequestError(f"the request body cannot be re-encoded: {exc}") from exc
        request.forward = cast(ChatRequestBody, forward)

    # -- after the upstream -----------------------------------------------------------------------

    async def judge(
        self, request: ChatRequest, completion: ChatCompletion, complete: Complete, record: Record
    ) -> Decision:
        """Validate (and maybe repair) one answer; charge the episode; fill the record. With a
        response format, the text answer that comes out is then checked (never charged)."""
        served = completion.get("model")
        record.served_model = served if isinstance(served, str) and served else None
        try:
            outcome = await self._judge_calls(request, completion, complete, record)
            if request.output is not None:
                outcome = await self._judge_output(
                    request, request.output, outcome, complete, record
                )
        except BaseException:
            record.channels = tuple(call.channel for call in record.caught_calls)
            raise
        record.channels, record.repair_failed = outcome.caught_channels, outcome.repair_failed
        record.choice_channels = _choice_channels(request, outcome)
        return outcome

    async def _judge_output(
        self,
        request: ChatRequest,
        output: OutputFormat,
        outcome: Decision,
        complete: Complete,
        record: Record,
    ) -> Decision:
        """Check the answer's text against the response format; re-ask (reflexive, constrained)
        with the failing paths until it holds or the repairs run out."""
        message = first_message(outcome.answer)
        verdict = output.check_message(message) if message is not None else None
        if verdict is None or verdict.ok:
            record.output = OutputRecord()
            return outcome
        first = verdict
        caught_channels = [verdict.channel.value]
        policy = self.policies[request.mode]
        if not policy.re_asks or not _single_choice(request):
            record.output = OutputRecord(tuple(caught_channels), first.error_paths)
            return outcome
        assert message is not None
        body = request.reask_body()
        history: list[dict[str, Any]] = []
        content = message.get("content")
        attempts, failed = 0, None
        reply: dict[str, Any] | None = None
        started = time.perf_counter()
        while not verdict.ok and attempts < policy.max_repairs:
            turn = build_output_repair_turn(
                content, verdict.diagnosis, verdict.error_paths, output.schema
            )
            try:
                reply = await complete(repair_request(body, [*history, *turn], None))
            except (UpstreamStatusError, UpstreamTimeoutError, UpstreamUnavailableError) as exc:
                failed = _failure_reason(exc)
                break
            reply_message = first_message(cast(ChatCompletion, reply))
            if reply_message is None:
                failed = "bad_answer"
                break
            attempts += 1
            history.extend(turn)
            found = output.check_message(reply_message)
            if found is None:  # the re-ask's answer called tools: not an output, stop here
                failed = "bad_answer"
                break
            verdict = found
            content = reply_message.get("content")
            if not verdict.ok:
                caught_channels.append(verdict.channel.value)
        record.repair_seconds += time.perf_counter() - started
        if failed is not None:
            result = RepairResultKind.UPSTREAM_ERROR
        else:
            result = RepairResultKind.FIXED if verdict.ok else RepairResultKind.FAILED
        record.output = OutputRecord(tuple(caught_channels), first.error_paths, attempts, result)
        if not verdict.ok and policy.on_exhausted is OnExhausted.ERROR:
            record.outcome = Outcome.REPAIR_EXHAUSTED
            raise RepairExhaustedError(
                f"no valid structured output after {attempts} repair attempt(s): "
                + ", ".join(caught_channels),
                attempts=attempts,
                channels=tuple(caught_channels),
            )
        if not verdict.ok or reply is None:
            return replace(outcome, repair_failed=outcome.repair_failed or failed)
        answer = dict(reply)
        answer["usage"] = _summed_usage(outcome.answer.get("usage"), reply.get("usage"))
        return replace(outcome, answer=cast(ChatCompletion, answer), changed=True)

    async def _judge_calls(
        self, request: ChatRequest, completion: ChatCompletion, complete: Complete, record: Record
    ) -> Decision:
        """The tool calls of one answer: validated, maybe repaired, charged."""
        tools = request.tools
        probed = request.probe_added
        if self.settings.margin_probe:
            declared = tools.names if tools is not None else ()
            named = named_tool_name_margins(completion, declared)
            record.tool_name_margins = [margin for _, margin in named]
            record.tool_name_margin_names = [name for name, _ in named]
            if probed:  # the client never asked for logprobs: it does not get them
                completion = cast(ChatCompletion, strip_probe(cast(dict[str, Any], completion)))
        message = first_message(completion)
        if tools is None or message is None or _tool_choice_none(request.body):
            return Decision(completion, probed, None, (), 0)
        verdict = tools.check_message(
            message, rules=CallRules.of_request(request.body), cut_off=stopped_by_length(completion)
        )
        if verdict.ok:  # the common answer: nothing caught, nothing to charge or repair
            record.tool_calls = len(verdict.calls)  # an ok verdict holds no empty_output
            record.delivered_channels = ()
            return Decision(completion, probed, verdict, (), 0)
        record.tool_calls = _calls_seen(verdict)
        record.caught_calls = list(caught_calls(verdict))
        if request.mode not in _CHANGES_ANSWERS:
            record.delivered_channels = _channels(verdict)  # delivered as it came
            await self._charge(request, verdict, _invalid_calls(verdict), record)
            return Decision(completion, probed, verdict, _channels(verdict), 0)
        started = time.perf_counter()
        try:
            repaired = await repair_completion(
                request.reask_body(), completion, tools, self.policies[request.mode], complete
            )
        except RepairExhaustedError as exc:
            record.repair_attempts = exc.attempts
            record.repair_results = _results(record.caught_calls, RepairResultKind.FAILED)
            record.outcome = Outcome.REPAIR_EXHAUSTED
            record.repair_seconds = time.perf_counter() - started
            await self._charge(request, verdict, (), record)  # the client gets an error, no calls
            raise
        record.repair_seconds = time.perf_counter() - started
        record.caught_calls = list(repaired.caught_calls) or record.caught_calls
        record.repair_attempts = repaired.attempts
        record.promoted = repaired.promoted
        record.promoted_formats = list(repaired.promoted_formats)
        record.repair_prompt_tokens = repaired.repair_prompt_tokens
        record.repair_completion_tokens = repaired.repair_completion_tokens
        record.delivered_channels = tuple(c.value for c in repaired.delivered_channels)
        if repaired.made_up and repaired.exhausted:
            # The proxy refused the re-ask's reply and delivered the answer it held.
            kind, record.outcome = RepairResultKind.WITHHELD, Outcome.REPAIR_EXHAUSTED
        elif repaired.repair_failed is not None:
            kind, record.outcome = RepairResultKind.UPSTREAM_ERROR, Outcome.REPAIR_EXHAUSTED
        elif repaired.exhausted:
            kind, record.outcome = RepairResultKind.FAILED, Outcome.REPAIR_EXHAUSTED
        elif repaired.attempts and not _has_calls(repaired.response):
            kind, record.outcome = RepairResultKind.DECLINED, Outcome.DECLINED
        else:
            kind, record.outcome = RepairResultKind.FIXED, Outcome.REPAIRED
        record.repair_results = _results(record.caught_calls, kind)
        await self._charge(request, repaired.first_verdict, repaired.delivered_invalid, record)
        changed = probed or repaired.attempts > 0 or repaired.response != completion
        return Decision(
            cast(ChatCompletion, repaired.response),
            changed,
            repaired.first_verdict,
            tuple(c.value for c in repaired.caught_channels),
            repaired.attempts,
            repaired.promoted,
            repaired.repair_failed,
        )

    async def _charge(
        self,
        request: ChatRequest,
        first: MessageVerdict,
        delivered_invalid: Sequence[CallVerdict],
        record: Record,
    ) -> None:
        """Charge the first answer's errors; remember invalid calls the client will still see."""
        if request.episode is None:
            return
        if first.ok and not delivered_invalid:
            return  # nothing to charge or remember: the snapshot from admit() still holds
        snapshot = await self.episodes.observe_answer(
            request.episode, first, request.budget_override, delivered_invalid
        )
        if snapshot.unknown:
            record.episode = None
        elif record.episode is not None:
            record.episode = replace(
                record.episode,
                errors_after=snapshot.errors,
                budget=snapshot.budget,
                exhausted=snapshot.exhausted,
            )
        record.snapshot = snapshot

    async def settle(self, request: ChatRequest | None, record: Record) -> None:
        """Write the episode's changes to a shared store, once, after the upstream call (the
        route calls it however the request ended). A racing request may have written first:
        the record then takes the counts as the store took them, so each ladder rung is still
        crossed once across processes."""
        if request is None or request.episode is None:
            return
        txn = await self.episodes.settle(request.episode)
        if txn is None or record.episode is None:
            return
        first = txn.request or txn.answer
        last = txn.answer or txn.request
        assert first is not None and last is not None
        record.episode = replace(
            record.episode,
            errors_before=first.errors_before,
            errors_after=last.errors,
            budget=last.budget,
            exhausted=last.exhausted,
        )
        if txn.request is not None:
            record.env_errors = list(txn.request.new_env_errors)
        record.snapshot = last

    async def episode_of_response(
        self, headers: Mapping[str, str], previous_response_id: Any
    ) -> EpisodeRef | None:
        """The episode a Responses ``previous_response_id`` continues (no header sent), if known.

        With client keys, an id this tenant was never given is unknown: a 404 before anything is
        charged or forwarded, naming nothing of whoever received it."""
        if not isinstance(previous_response_id, str):
            return None
        if self.settings.episode_header in headers and not self.settings.api_keys:
            return None  # the header names the episode: the link would be read for nothing
        tenant = self.episodes.tenant_of(headers)
        link = await self.episodes.chains.lookup(_response_key(tenant, previous_response_id))
        if link is None and self.settings.api_keys:
            raise NotFoundError(
                f"Previous response with id '{previous_response_id[:128]}' not found.",
                param="previous_response_id",
            )
        if link is None or self.settings.episode_header in headers:
            return None
        return EpisodeRef(link.episode_id, explicit=False, new=False, tenant=tenant)

    async def remember_response(self, request: ChatRequest, response_id: Any) -> None:
        """Point a delivered Responses id at its episode, for the client's next turn."""
        if request.episode is not None and isinstance(response_id, str):
            key = _response_key(request.episode.tenant, response_id)
            await self.episodes.chains.link(key, request.episode.id)

    async def remember(self, request: ChatRequest, answer: ChatCompletion) -> None:
        """Link history + delivered answer to the episode, so the next turn continues it (every
        choice when ``n > 1``: the client may continue with any of them)."""
        if request.episode is None:
            return
        choices = answer.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                await self.episodes.remember_answer(request.episode, request.body, message)

    # -- per-request options ----------------------------------------------------------------------

    def _mode(self, headers: Mapping[str, str]) -> RepairMode:
        override = headers.get(REPAIR_HEADER)
        if not override:
            return self.settings.repair
        mode = _MODES.get(override.strip().lower())
        if mode is not None:
            return mode
        raise BadRequestError(
            f"X-Repairproxy-Repair must be one of {', '.join(_MODES)}", param=REPAIR_HEADER
        )

    def _budget(self, headers: Mapping[str, str]) -> int | None:
        """The client's budget: at most ``--budget`` unless ``--allow-client-budget``."""
        override = headers.get(BUDGET_HEADER)
        if override is None:
            return None
        value = override.strip()
        # ASCII digits only ("²".isdigit() is true), and short enough to be a count.
        if not (value.isascii() and value.isdigit() and len(value) <= _MAX_BUDGET_DIGITS):
            raise BadRequestError(
                f"X-Repairproxy-Budget must be a non-negative integer of at most "
                f"{_MAX_BUDGET_DIGITS} digits",
                param=BUDGET_HEADER,
            )
        budget = int(value)
        if budget > self.settings.budget and not self.settings.allow_client_budget:
            raise BadRequestError(
                f"X-Repairproxy-Budget {budget} is above the proxy's --budget "
                f"{self.settings.budget}: a client may only lower it (start the proxy with "
                "--allow-client-budget to let clients raise it)",
                param=BUDGET_HEADER,
            )
        return budget


def _check_messages(messages: Sequence[Any]) -> None:
    """A 400 for the first message that is not an object with a string role."""
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequestError(f"'messages[{index}]' must be an object", param="messages")
        if not isinstance(message.get("role"), str):
            raise BadRequestError(
                f"'messages[{index}].role' must be a string", param=f"messages[{index}].role"
            )


def _single_choice(request: ChatRequest) -> bool:
    """Structured outputs are re-asked for one-choice requests only (with ``n > 1`` a re-ask
    would replace every choice by one)."""
    n = request.body.get("n")
    return not isinstance(n, int) or n <= 1


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, UpstreamStatusError):
        return str(exc.reply.status_code)
    if isinstance(exc, UpstreamTimeoutError):
        return "timeout"
    return "unavailable"


def _summed_usage(first: Any, second: Any) -> Any:
    """The usage of the first answer plus the re-ask's (the client pays for both)."""
    if not isinstance(first, Mapping) or not isinstance(second, Mapping):
        return second if isinstance(second, Mapping) else first
    total = dict(first)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        a, b = first.get(key), second.get(key)
        if isinstance(a, int) and isinstance(b, int):
            total[key] = a + b
    return total


def _tool_choice_none(body: Mapping[str, Any]) -> bool:
    """The client asked for no tool call: text is text, nothing to classify or repair."""
    return body.get("tool_choice") == "none" or body.get("function_call") == "none"


def _choice_channels(request: ChatRequest, outcome: Decision) -> tuple[tuple[str, ...], ...]:
    """Each choice's error channels when the answer has several (``n > 1``): choice 0 as judged,
    the others checked as they are (only choice 0 is repaired), by choice 0's rules: the
    request's call rules, ``tool_choice: "none"`` (nothing caught), and each choice's own
    token-limit cut-off (its call shapes are text)."""
    tools = request.tools
    choices = outcome.answer.get("choices") if isinstance(outcome.answer, dict) else None
    if tools is None or not isinstance(choices, list) or len(choices) < 2:
        return ()
    found = [outcome.caught_channels]
    if _tool_choice_none(request.body):
        return (*found, *(() for _ in choices[1:]))
    rules = CallRules.of_request(request.body)
    for choice in choices[1:]:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            found.append(())
            continue
        verdict = tools.check_message(message, rules=rules, cut_off=stopped_by_length(choice))
        found.append(_channels(verdict))
    return tuple(found)


def _channels(verdict: MessageVerdict) -> tuple[str, ...]:
    return tuple(c.value for c in verdict.error_channels)


def _invalid_calls(verdict: MessageVerdict) -> tuple[CallVerdict, ...]:
    return tuple(c for c in verdict.calls if c.channel is not Channel.VALID)


def _calls_seen(verdict: MessageVerdict) -> int:
    return sum(1 for c in verdict.calls if c.channel is not Channel.EMPTY_OUTPUT)


def _has_calls(response: Any) -> bool:
    """Whether the delivered answer's first choice carries tool calls (else: a prose answer)."""
    message = first_message(cast(ChatCompletion, response))
    return bool(message and message.get("tool_calls"))


def _results(calls: list[CaughtCall], kind: RepairResultKind) -> list[RepairResult]:
    return [RepairResult(call.channel, kind) for call in calls]


def _episode_record(new: bool, explicit: bool, snapshot: BudgetSnapshot) -> EpisodeRecord:
    return EpisodeRecord(
        new=new,
        explicit=explicit,
        errors_before=snapshot.errors_before,
        errors_after=snapshot.errors,
        budget=snapshot.budget,
        exhausted=snapshot.exhausted,
    )
