"""Turn an OpenAI chat request into a prompt and sampling params, and answers back into OpenAI JSON.

Pure functions, no runtime: what the embedded server does between HTTP and the engine. Tool handling
follows vLLM with ``--tool-call-parser hermes``: with ``tool_choice`` auto the answer is parsed for
``<tool_call>`` blocks; ``"none"`` leaves the text alone; a named choice or ``"required"`` adds a
grammar over the declared names and always yields tool calls. A ``response_format`` (JSON object
or schema) is a grammar over the whole answer when no tool can be called (no tools, or
``tool_choice`` ``"none"``); with callable tools it is left to the proxy's checks, since a
grammar over the content would rule the calls out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from repairproxy.local.engine import Generation, SamplingParams, TokenLogprob
from repairproxy.local.grammar import (
    SchemaToGbnf,
    forced_call_grammar,
    forced_tool_names,
    response_format_grammar,
)
from repairproxy.local.hermes import ParsedOutput, parse_hermes
from repairproxy.local.prompt import render_prompt

__all__ = [
    "ChatPlan",
    "InvalidChatRequest",
    "chunk",
    "completion_body",
    "finish_reason",
    "parse_answer",
    "plan_chat",
    "usage_body",
]

_MAX_TOP_LOGPROBS = 20


class InvalidChatRequest(ValueError):
    """The request cannot be served; becomes a 400 with ``param`` named."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ChatPlan:
    prompt: str
    params: SamplingParams
    parse_tools: bool  # run the hermes parser over the answer
    forced: bool  # a grammar forces tool calls (finish_reason stays the sampler's, as in vLLM)
    stream: bool
    include_usage: bool
    completion_id: str
    created: int


def _tools_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None and body.get("functions"):  # legacy functions API
        tools = [{"type": "function", "function": f} for f in body["functions"]]
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise InvalidChatRequest("tools must be a list of objects", "tools")
    return [dict(t) for t in tools]


def _tool_choice_of(body: Mapping[str, Any]) -> Any:
    if "tool_choice" in body:
        return body["tool_choice"]
    legacy = body.get("function_call")
    if isinstance(legacy, Mapping):
        return {"type": "function", "function": {"name": legacy.get("name")}}
    return legacy if legacy in ("none", "auto") else "auto"


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidChatRequest(f"{key} must be a number", key)
    return float(value)


def _sampling(body: Mapping[str, Any], grammar: str | None) -> SamplingParams:
    defaults = SamplingParams()
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise InvalidChatRequest("max_tokens must be a positive integer", "max_tokens")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop if s)
    top_logprobs = int(_number(body, "top_logprobs", 0))
    if not 0 <= top_logprobs <= _MAX_TOP_LOGPROBS:
        raise InvalidChatRequest("top_logprobs must be between 0 and 20", "top_logprobs")
    seed = body.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise InvalidChatRequest("seed must be an integer", "seed")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature),
        top_p=_number(body, "top_p", defaults.top_p),
        top_k=int(_number(body, "top_k", defaults.top_k)),
        min_p=_number(body, "min_p", defaults.min_p),
        repeat_penalty=_number(body, "repetition_penalty", defaults.repeat_penalty),
        seed=seed,
        stop=stop,
        logprobs=bool(body.get("logprobs")),
        top_logprobs=top_logprobs,
        grammar=grammar,
    )


def plan_chat(body: Mapping[str, Any], schema_to_gbnf: SchemaToGbnf | None = None) -> ChatPlan:
    """Validate ``body`` and decide prompt, sampling, and how the answer is to be parsed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidChatRequest("messages must be a non-empty list", "messages")
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise InvalidChatRequest("every message needs a string role", "messages")
    if body.get("n", 1) != 1:
        raise InvalidChatRequest("only n=1 is supported", "n")
    tools = _tools_of(body)
    choice = _tool_choice_of(body)
    names = forced_tool_names(choice, tools) if tools else None
    if isinstance(choice, Mapping) and names:
        declared = {t.get("function", t).get("name") for t in tools}
        if names[0] not in declared:
            raise InvalidChatRequest(
                f"tool_choice names an undeclared tool {names[0]!r}", "tool_choice"
            )
    grammar = (
        forced_call_grammar(
            names, tools, several=choice == "required", schema_to_gbnf=schema_to_gbnf
        )
        if names
        else None
    )
    if grammar is None and (not tools or choice == "none"):
        grammar = response_format_grammar(body.get("response_format"), schema_to_gbnf)
    stream_options = body.get("stream_options") or {}
    return ChatPlan(
        prompt=render_prompt(messages, tools or None),
        params=_sampling(body, grammar),
        parse_tools=bool(tools) and choice != "none",
        forced=grammar is not None,
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
        completion_id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
    )


def parse_answer(plan: ChatPlan, text: str) -> ParsedOutput:
    return parse_hermes(text) if plan.parse_tools else ParsedOutput(text)


def finish_reason(plan: ChatPlan, parsed: ParsedOutput, generation: Generation) -> str:
    if parsed.tools_called and not plan.forced:
        return "tool_calls"  # vLLM reports tool_calls for auto-parsed calls, even when cut
    return "length" if generation.finish_reason == "length" else "stop"


def usage_body(generation: Generation) -> dict[str, Any]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
    }


def _logprobs_body(plan: ChatPlan, logprobs: Sequence[TokenLogprob]) -> dict[str, Any] | None:
    if not plan.params.logprobs:
        return None
    return {"content": [lp.to_openai() for lp in logprobs]}


def completion_body(plan: ChatPlan, model: str, generation: Generation) -> dict[str, Any]:
    """The whole non-streaming ``chat.completion`` object."""
    parsed = parse_answer(plan, generation.text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:  # OpenAI omits the field when there are none (vLLM sends [])
        message["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
    return {
        "id": plan.completion_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs_body(plan, generation.logprobs),
                "finish_reason": finish_reason(plan, parsed, generation),
            }
        ],
        "usage": usage_body(generation),
    }


def chunk(
    plan: ChatPlan,
    model: str,
    delta: Mapping[str, Any] | None,
    *,
    logprobs: Sequence[TokenLogprob] = (),
    finish: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` makes the usage-only chunk (no choices)."""
    body: dict[str, Any] = {
        "id": plan.completion_id,
        "object": "chat.completion.chunk",
        "created": plan.created,
        "model": model,
        "choices": [],
    }
    if delta is not None:
        body["choices"] = [
            {
                "index": 0,
                "delta": dict(delta),
                "logprobs": _logprobs_body(plan, logprobs),
                "finish_reason": finish,
            }
        ]
    if usage is not None:
        body["usage"] = dict(usage)
    return body
