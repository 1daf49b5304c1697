"""The embedded real model (Qwen2.5-Coder-1.5B Q4_K_M, CPU) behind its server and the openai client.

Skipped unless the model is fetched and llama-cpp-python is installed. Each generation costs seconds
on two cores, so there are few tests, with greedy decoding, a seed and small ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from repairproxy.validation import Channel, ToolsCache
from tests.local.model_fixtures import embedded_upstream, requires_model
from tests.local.retail_tools import RETAIL_SYSTEM, RETAIL_TOOLS

pytestmark = [pytest.mark.model, requires_model]

__all__ = ["embedded_upstream"]  # the fixture, re-exported so pytest finds it here

DECLARED = {t["function"]["name"] for t in RETAIL_TOOLS}
ASK_EMAIL = "Hi, I want to cancel an order. My email is noah.brown7922@example.com."


@pytest.fixture(scope="module")
def client(embedded_upstream: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=embedded_upstream, api_key="unused", max_retries=0) as c:
        yield c


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": RETAIL_SYSTEM}, {"role": "user", "content": user}]


def test_models_lists_the_arm(client: openai.OpenAI) -> None:
    [model] = client.models.list().data
    assert model.id.endswith("q4_k_m")


def test_auto_answers_are_parsed_as_vllm_hermes_would(client: openai.OpenAI) -> None:
    # This model mostly writes its call as bare JSON instead of a <tool_call> block; vLLM's hermes
    # parser leaves that in the content, and so must we (the proxy's tool_call_in_content channel).
    request = {"messages": _messages(ASK_EMAIL), "tools": RETAIL_TOOLS}
    reply = client.chat.completions.create(
        model="local", temperature=0, seed=1, max_tokens=80, logprobs=True, **request
    )
    choice = reply.choices[0]
    message = choice.message.model_dump(exclude_none=True)
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    verdicts = compiled.check_message(message).calls
    assert verdicts, f"expected a tool call in some form, got {message!r}"
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert {v.channel for v in verdicts} <= {Channel.VALID, Channel.SCHEMA_VIOLATION}
    else:
        assert [v.channel for v in verdicts] == [Channel.TOOL_CALL_IN_CONTENT]
        assert choice.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 300
    tokens = choice.logprobs.content if choice.logprobs else None
    assert tokens is not None and len(tokens) == reply.usage.completion_tokens


def test_named_tool_choice_forces_a_valid_call_with_logprobs(client: openai.OpenAI) -> None:
    request = {
        "messages": _messages("Hello there, how are you today?"),
        "tools": RETAIL_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_order_details"}},
    }
    reply = client.chat.completions.create(
        model="local",
        temperature=0,
        seed=1,
        max_tokens=60,
        logprobs=True,
        top_logprobs=2,
        **request,
    )
    message = reply.choices[0].message
    [call] = message.tool_calls or []
    assert call.function.name == "get_order_details"
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    [verdict] = compiled.check_message(message.model_dump(exclude_none=True)).calls
    assert verdict.channel is Channel.VALID
    tokens = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    assert tokens is not None
    assert "<tool_call>" in "".join(t.token for t in tokens)  # tool-call tokens carry logprobs
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)


def test_required_streams_a_declared_call_and_reuses_the_kv_cache(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="local",
        messages=_messages(ASK_EMAIL),
        tools=RETAIL_TOOLS,
        tool_choice="required",
        temperature=0,
        seed=1,
        max_tokens=80,
        stream=True,
        stream_options={"include_usage": True},
    )
    names, arguments, usage = [], "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names.append(delta.function.name)
                arguments += (delta.function.arguments or "") if delta.function else ""
    assert len(names) == 1 and names[0] in DECLARED
    assert isinstance(json.loads(arguments), dict)
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (
        usage.prompt_tokens_details.cached_tokens > 300
    )  # the system turn was not prefilled again


def test_max_tokens_and_stop_are_honoured(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "Count from 1 to 50, separated by commas."}],
        temperature=0,
        max_tokens=6,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    stopped = client.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "Count from 1 to 50, separated by commas."}],
        temperature=0,
        max_tokens=40,
        stop=["5"],
    )
    text = stopped.choices[0].message.content or ""
    assert stopped.choices[0].finish_reason == "stop"
    assert "5" not in text and "4" in text


def test_a_json_schema_response_format_is_followed(client: openai.OpenAI) -> None:
    """Guided by a grammar, as vLLM guides decoding: the answer is JSON valid for the schema."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="local",
        messages=[{"role": "user", "content": "Name a large city and its population."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        temperature=0,
        seed=1,
        max_tokens=60,
    )
    answer = json.loads(reply.choices[0].message.content or "")
    assert set(answer) == {"city", "population"}
    assert isinstance(answer["city"], str) and isinstance(answer["population"], int)
