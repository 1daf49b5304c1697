"""An agent framework on the Messages API through the proxy: pydantic-ai's ``AnthropicModel``
with the proxy as its base URL, against the scripted native Messages upstream. The model's
invented tool name is repaired before the agent sees it; the agent runs the real tool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from repairproxy.settings import Settings
from tests.support.messages_upstream import MessagesUpstream, text, tool_use
from tests.support.proxy_server import RunningProxy, running_proxy

pytest.importorskip("pydantic_ai")
pytest.importorskip("anthropic")


@pytest.fixture
def upstream() -> Iterator[MessagesUpstream]:
    with MessagesUpstream() as scripted:
        yield scripted


@pytest.fixture
def proxy(upstream: MessagesUpstream) -> Iterator[RunningProxy]:
    with running_proxy(Settings(upstream=upstream.base_url, repair="reflexive")) as running:
        yield running


@pytest.mark.parametrize("streamed", [False, True])
def test_pydantic_ai_anthropic_model(
    proxy: RunningProxy, upstream: MessagesUpstream, streamed: bool
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    provider = AnthropicProvider(api_key="x", base_url=proxy.root_url)
    model = AnthropicModel("scripted-model", provider=provider)
    agent = Agent(model, instructions="You help with orders.")
    ran: list[str] = []

    @agent.tool_plain
    def get_order_details(order_id: str) -> str:
        """Get the status of an order."""
        ran.append(order_id)
        return f"Order {order_id}: delivered"

    upstream.push(
        [tool_use("lookup_order", {"order_id": "#W1"})],  # invented: the proxy re-asks
        [tool_use("get_order_details", {"order_id": "#W1"})],
        [text("Your order #W1 was delivered.")],
    )

    async def run() -> str:
        async with agent:
            if streamed:
                async with agent.run_stream("Where is my order #W1?") as result:
                    return str(await result.get_output())
            return str((await agent.run("Where is my order #W1?")).output)

    final = asyncio.run(run())
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    lines: list[Any] = [
        (line.get("channels"), line.get("episode_errors"))
        for line in proxy.log_lines()
        if line.get("path") == "/v1/messages"
    ]
    assert lines[0] == (["unknown_tool"], 1)  # caught, charged as tau2 would
    assert lines[1] == ([], 1)  # the agent's turn with the real tool's result: nothing new
    # the agent's tool result went upstream as a tool_result for the repaired call's id
    last = upstream.requests[-1]["messages"]
    repaired_id = last[-2]["content"][-1]["id"]
    assert last[-1]["content"][0]["tool_use_id"] == repaired_id


_NODE_STREAM = r"""
const Anthropic = require("@anthropic-ai/sdk");
const client = new Anthropic({ baseURL: process.argv[1], apiKey: "x", maxRetries: 0 });
(async () => {
  const tools = JSON.parse(process.argv[2]);
  const messages = [{ role: "user", content: "Where is my order #W1?" }];
  const stream = client.messages.stream({ model: "m", max_tokens: 64, messages, tools });
  const seen = [];
  for await (const event of stream) seen.push(event.type);
  const final = await stream.finalMessage();
  console.log(JSON.stringify({ final, seen }));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


def _node_modules() -> str | None:
    """Where the npm packages are installed (``npm install --prefix DIR @anthropic-ai/sdk``):
    ``$REPAIRPROXY_NODE_MODULES``, else ``~/.cache/repairproxy/npm/node_modules``."""
    import os
    import shutil
    from pathlib import Path

    if shutil.which("node") is None:
        return None
    default = Path.home() / ".cache" / "repairproxy" / "npm" / "node_modules"
    path = Path(os.environ.get("REPAIRPROXY_NODE_MODULES", default))
    return str(path) if (path / "@anthropic-ai" / "sdk" / "package.json").is_file() else None


def test_the_anthropic_npm_client_streams_a_repaired_answer(
    proxy: RunningProxy, upstream: MessagesUpstream
) -> None:
    """The official ``@anthropic-ai/sdk``'s ``messages.stream()`` through a repaired stream: the
    prose streamed first, the repaired call after it, one message, ``finalMessage()`` whole."""
    import os
    import subprocess

    import orjson

    modules = _node_modules()
    if modules is None:
        pytest.skip("node or the @anthropic-ai/sdk npm package is not installed")
    upstream.push(
        [text("Checking."), tool_use("lookup_order", {"order_id": "#W1"})],
        [tool_use("get_order_details", {"order_id": "#W1"})],
    )
    tools = [
        {
            "name": "get_order_details",
            "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }
    ]
    done = subprocess.run(
        ["node", "-e", _NODE_STREAM, "--", proxy.root_url, orjson.dumps(tools).decode()],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_PATH": modules},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    final = result["final"]
    assert [block["type"] for block in final["content"]] == ["text", "tool_use"]
    assert final["content"][0]["text"] == "Checking."
    assert final["content"][1]["name"] == "get_order_details"
    assert final["content"][1]["input"] == {"order_id": "#W1"}
    assert final["stop_reason"] == "tool_use"
    assert final["id"] == upstream.answered[0]
    assert result["seen"][0] == "message_start" and result["seen"][-1] == "message_stop"
