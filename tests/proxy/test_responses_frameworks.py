"""Agent frameworks whose default model speaks the Responses API, pointed at the proxy: the OpenAI
Agents SDK (``OpenAIResponsesModel``, tracing off) and pydantic-ai (``Agent("openai:...")``).
A hallucinated tool name is repaired before the framework sees it, plain and streamed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from repairproxy.settings import Settings
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message

agents = pytest.importorskip("agents")
pydantic_ai = pytest.importorskip("pydantic_ai")

GOOD = {"order_id": "#W1"}


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


@pytest.fixture
def proxy(upstream: ResponsesUpstream) -> Iterator[RunningProxy]:
    with running_proxy(Settings(upstream=upstream.base_url, repair="reflexive")) as running:
        yield running


def _script(upstream: ResponsesUpstream) -> None:
    upstream.push(
        [function_call("lookup_order", GOOD)],  # invented: the proxy re-asks
        [function_call("get_order_details", GOOD)],
        [message("Your order #W1 was delivered.")],
    )


def _tools_seen(upstream: ResponsesUpstream) -> list[str]:
    """Names of the calls the framework executed: their tool's own output came back upstream
    (the proxy's re-asks carry diagnoses, never ``Order ...``)."""
    names = []
    for request in upstream.requests:
        items = request.get("input") if isinstance(request.get("input"), list) else []
        calls = {i.get("call_id"): i.get("name") for i in items if i.get("type") == "function_call"}
        for item in items:
            output = str(item.get("output"))
            if item.get("type") == "function_call_output" and "Order #W1" in output:
                names.append(calls[item["call_id"]])
    return sorted(set(names))


def _budget_lines(proxy: RunningProxy) -> list[tuple[Any, Any]]:
    return [
        (line.get("channels"), line.get("episode_errors"))
        for line in proxy.log_lines()
        if line.get("path") == "/v1/responses"
    ]


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_agents_sdk(
    proxy: RunningProxy, upstream: ResponsesUpstream, streamed: bool
) -> None:
    from agents import (
        Agent,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_order_details(order_id: str) -> str:
        """Get the status of an order."""
        ran.append(order_id)
        return f"Order {order_id}: delivered"

    client = AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0)
    agent = Agent(
        name="support",
        instructions="You help with orders.",
        tools=[get_order_details],
        model=OpenAIResponsesModel(model="scripted-model", openai_client=client),
    )
    _script(upstream)

    async def run() -> str:
        async with client:  # closed inside the loop that opened its connections
            if streamed:
                result = Runner.run_streamed(agent, "Where is my order #W1?")
                async for _ in result.stream_events():
                    pass
                return str(result.final_output)
            return str((await Runner.run(agent, "Where is my order #W1?")).final_output)

    final = asyncio.run(run())
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    assert _tools_seen(upstream) == ["get_order_details"]
    assert _budget_lines(proxy)[0] == (["unknown_tool"], 1)  # caught, charged as tau2 would


@pytest.mark.parametrize("streamed", [False, True])
def test_pydantic_ai(
    proxy: RunningProxy,
    upstream: ResponsesUpstream,
    streamed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic_ai import Agent

    monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    # "openai:" is pydantic-ai's Responses model, its default for OpenAI-compatible servers
    agent = Agent("openai:scripted-model", instructions="You help with orders.")
    ran: list[str] = []

    @agent.tool_plain
    def get_order_details(order_id: str) -> str:
        """Get the status of an order."""
        ran.append(order_id)
        return f"Order {order_id}: delivered"

    _script(upstream)

    async def run() -> str:
        async with agent:  # the agent's model client is closed inside this loop
            if streamed:
                async with agent.run_stream("Where is my order #W1?") as result:
                    return str(await result.get_output())
            return str((await agent.run("Where is my order #W1?")).output)

    assert asyncio.run(run()) == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    assert _tools_seen(upstream) == ["get_order_details"]
    assert _budget_lines(proxy)[0] == (["unknown_tool"], 1)
