"""Anthropic message threads through the proxy (``repairproxy/asgi/threads.py``).

The real ``anthropic`` SDK's default tool runner threads (``anthropic-beta:
message-threads-2026-08-12``, ``thread: create`` then ``continue`` with only the new
``tool_result``). Against a chat-only scripted upstream the proxy must send every turn whole
(history, tools, system), never the ``thread`` field, repair an invented tool name on turn 1,
and keep the run in one episode; an unknown or another tenant's ``previous_message_id`` is
refused with ``error.details.error_code: "thread_not_found"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.proxy.conftest import StartProxy
from tests.support.messages_upstream import MessagesUpstream, text, thinking, tool_use
from tests.support.processes import RedisServer, redis_server
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

anthropic = pytest.importorskip("anthropic")

SYSTEM = "You help with orders."
KEY_A, KEY_B = "sk-thread-a-0123456789", "sk-thread-b-9876543210"
TOOL = {
    "name": "get_order_details",
    "description": "Get the status of an order.",
    "input_schema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}


def _runner_run(proxy: RunningProxy, key: str = "x", **options: Any) -> tuple[Any, list[str]]:
    from anthropic import beta_tool

    ran: list[str] = []

    @beta_tool
    def get_order_details(order_id: str) -> str:
        """Get the status of an order.

        Args:
            order_id: The order's id.
        """
        ran.append(order_id)
        return f"Order {order_id}: delivered"

    client = anthropic.Anthropic(base_url=proxy.root_url, api_key=key, max_retries=0)
    try:
        runner = client.beta.messages.tool_runner(
            model="m",
            system=SYSTEM,
            tools=[get_order_details],
            messages=[{"role": "user", "content": "Where is order #W1?"}],
            **{"max_tokens": 256, **options},
        )
        final = runner.until_done()
    finally:
        client.close()
    return final, ran


def test_the_sdk_tool_runner_threads_through_a_chat_upstream_in_one_episode(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    proxy = start_proxy(repair="reflexive", upstream_apis=("chat",))
    upstream.push(
        completion(tool_calls=[tool_call("lookup_order", {"order_id": "#W1"})]),  # invented
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]),
        completion(content="Your order #W1 was delivered."),
    )
    final, ran = _runner_run(proxy)
    assert ran == ["#W1"]  # the repaired call ran on turn 1
    assert "delivered" in final.content[0].text
    sent = upstream.chat_requests
    assert len(sent) == 3
    last = sent[-1]
    assert "thread" not in last
    assert [t["function"]["name"] for t in last["tools"]] == ["get_order_details"]
    roles = [m["role"] for m in last["messages"]]
    assert roles[0] == "system" and SYSTEM in str(last["messages"][0]["content"])
    assert roles.count("user") == 1 and "tool" in roles and "assistant" in roles
    assert "lookup_order" not in orjson.dumps(last).decode()  # the repaired answer, not the first
    lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/messages"]
    assert len(lines) == 2
    assert len({line["episode_id"] for line in lines}) == 1, lines


def _thread_post(proxy: RunningProxy, key: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-api-key": key, "anthropic-beta": "message-threads-2026-08-12"}
    return httpx.post(proxy.base_url + "/messages", json=body, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_an_unknown_or_foreign_previous_message_id_is_thread_not_found(
    store: str,
    start_proxy: StartProxy,
    upstream: ScriptedUpstream,
    request: pytest.FixtureRequest,
) -> None:
    extra: dict[str, Any] = {}
    if store == "redis":
        extra["episode_store"] = request.getfixturevalue("redis").url
    proxy = start_proxy(api_keys=(KEY_A, KEY_B), upstream_apis=("chat",), **extra)
    upstream.push(completion(content="Hello."), completion(content="Again."))
    opening = {
        "model": "m",
        "max_tokens": 64,
        "system": SYSTEM,
        "tools": [TOOL],
        "messages": [{"role": "user", "content": "Hi"}],
        "thread": {"type": "create"},
    }
    created = _thread_post(proxy, KEY_A, opening)
    assert created.status_code == 200, created.text
    message_id = created.json()["id"]
    turn = {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "More?"}],
        "thread": {"type": "continue", "previous_message_id": message_id},
    }
    for key, previous in ((KEY_A, "msg_made_up"), (KEY_B, message_id)):
        refused = _thread_post(
            proxy, key, {**turn, "thread": {"type": "continue", "previous_message_id": previous}}
        )
        assert refused.status_code == 404, refused.text
        error = refused.json()["error"]
        assert error["details"] == {"error_code": "thread_not_found"}
    assert len(upstream.chat_requests) == 1  # refused before the upstream
    continued = _thread_post(proxy, KEY_A, turn)
    assert continued.status_code == 200, continued.text
    sent = upstream.chat_requests[-1]
    assert [m["content"] for m in sent["messages"] if m["role"] == "user"] == ["Hi", "More?"]
    assert sent["tools"][0]["function"]["name"] == "get_order_details"
    again = _thread_post(proxy, KEY_A, turn)
    assert again.status_code == 409
    assert again.json()["error"]["details"] == {"error_code": "thread_already_continued"}


@pytest.mark.parametrize("think", [False, True])
def test_the_sdk_tool_runner_threads_through_a_native_upstream_with_thinking(think: bool) -> None:
    """The native scripted upstream keeps no threads (it refuses ``thread`` and the beta) and,
    with thinking on, refuses a tool_use turn that does not open with its thinking block, and a
    forced tool_choice: the re-ask keeps the thinking block first, the run finishes."""
    options: dict[str, Any] = {}
    if think:
        options = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}
    with MessagesUpstream() as upstream:
        settings = Settings(
            upstream=upstream.base_url, repair=RepairMode.CONSTRAINED, upstream_apis=("messages",)
        )
        with running_proxy(settings) as proxy:
            first = thinking("The user wants order #W1.")
            upstream.push(
                [first, tool_use("lookup_order", {"order_id": "#W1"})],  # invented name
                [
                    thinking("Use the declared tool."),
                    tool_use("get_order_details", {"order_id": "#W1"}),
                ],
                [thinking("Done."), text("Your order #W1 was delivered.")],
            )
            final, ran = _runner_run(proxy, **options)
            assert ran == ["#W1"]
            assert final.content[-1].text == "Your order #W1 was delivered."
            requests = upstream.requests
            assert len(requests) == 3, [r.get("messages") for r in requests]
            reask, last = requests[1], requests[2]
            repeated = [m for m in reask["messages"] if m["role"] == "assistant"][-1]
            assert repeated["content"][0] == first  # unmodified and first
            assert "tool_choice" not in reask or reask["tool_choice"].get("type") not in (
                ("any", "tool") if think else ()
            )
            assert "thread" not in last and last["tools"][0]["name"] == "get_order_details"
            assert str(last["system"]).startswith(SYSTEM)  # + the repair instruction
            delivered = next(m for m in last["messages"] if m["role"] == "assistant")
            assert delivered["content"][0]["type"] == "thinking"
            lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/messages"]
            assert len({line["episode_id"] for line in lines}) == 1, lines


_NODE_RUNNER = r"""
const Anthropic = require("@anthropic-ai/sdk");
const { betaTool } = require("@anthropic-ai/sdk/helpers/beta/json-schema");
const client = new Anthropic({ baseURL: process.argv[1], apiKey: "x", maxRetries: 0 });
const options = JSON.parse(process.argv[2]);
const ran = [];
const tool = betaTool({
  name: "get_order_details",
  description: "Get the status of an order.",
  inputSchema: {
    type: "object",
    properties: { order_id: { type: "string" } },
    required: ["order_id"],
  },
  run: async (input) => { ran.push(input.order_id); return `Order ${input.order_id}: delivered`; },
});
(async () => {
  const final = await client.beta.messages.toolRunner({
    model: "m",
    max_tokens: 256,
    system: "You help with orders.",
    tools: [tool],
    messages: [{ role: "user", content: "Where is order #W1?" }],
    ...options,
  });
  console.log(JSON.stringify({ final, ran }));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


def _node_runner(proxy: RunningProxy, **options: Any) -> dict[str, Any]:
    import os
    import subprocess

    from tests.support.npm import ANTHROPIC_SDK, node_modules

    modules = node_modules(ANTHROPIC_SDK)
    done = subprocess.run(
        ["node", "-e", _NODE_RUNNER, "--", proxy.root_url, orjson.dumps(options).decode()],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NODE_PATH": modules},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


def test_the_npm_sdk_tool_runner_threads_through_a_chat_upstream_in_one_episode(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    proxy = start_proxy(repair="reflexive", upstream_apis=("chat",))
    upstream.push(
        completion(tool_calls=[tool_call("lookup_order", {"order_id": "#W1"})]),  # invented
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]),
        completion(content="Your order #W1 was delivered."),
    )
    result = _node_runner(proxy)
    assert result["ran"] == ["#W1"]
    assert "delivered" in result["final"]["content"][0]["text"]
    last = upstream.chat_requests[-1]
    assert "thread" not in last and last["tools"][0]["function"]["name"] == "get_order_details"
    assert last["messages"][0]["role"] == "system"
    lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/messages"]
    assert len(lines) == 2 and len({line["episode_id"] for line in lines}) == 1, lines


@pytest.mark.parametrize("think", [False, True])
def test_the_npm_sdk_tool_runner_threads_through_a_native_upstream(think: bool) -> None:
    options: dict[str, Any] = {}
    if think:
        options = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}
    with MessagesUpstream() as upstream:
        settings = Settings(
            upstream=upstream.base_url, repair=RepairMode.CONSTRAINED, upstream_apis=("messages",)
        )
        with running_proxy(settings) as proxy:
            first = thinking("The user wants order #W1.")
            upstream.push(
                [first, tool_use("lookup_order", {"order_id": "#W1"})],
                [
                    thinking("Use the declared tool."),
                    tool_use("get_order_details", {"order_id": "#W1"}),
                ],
                [thinking("Done."), text("Your order #W1 was delivered.")],
            )
            result = _node_runner(proxy, **options)
            assert result["ran"] == ["#W1"]
            assert result["final"]["content"][-1]["text"] == "Your order #W1 was delivered."
            assert len(upstream.requests) == 3
            assert [m for m in upstream.requests[1]["messages"] if m["role"] == "assistant"][-1][
                "content"
            ][0] == first
            lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/messages"]
            assert len({line["episode_id"] for line in lines}) == 1, lines


# -- the thread store and tool changes, at the seam ------------------------------------------------


def test_a_continue_in_flight_and_tool_changes() -> None:
    import asyncio

    from repairproxy.asgi.threads import MessageThreads, apply_tool_changes
    from repairproxy.episodes.responses_store import MemoryResponsesStore
    from repairproxy.errors import BadRequestError, ConflictError

    async def main() -> None:
        threads = MessageThreads(MemoryResponsesStore(1_000_000))
        created = {"messages": [{"role": "user", "content": "Hi"}], "tools": [TOOL]}
        turn = await threads.open("t", {**created, "thread": {"type": "create"}})
        assert turn is not None
        await threads.record("t", turn, created, {"id": "msg_1", "content": []}, "ep")
        follow = {"type": "continue", "previous_message_id": "msg_1"}
        running = await threads.open("t", {"messages": [], "thread": follow})
        assert running is not None
        with pytest.raises(ConflictError) as caught:
            await threads.open("t", {"messages": [], "thread": follow})
        assert caught.value.details == {"error_code": "thread_continue_in_flight"}
        threads.close(running)

    asyncio.run(main())
    other = {"name": "cancel_order", "input_schema": {"type": "object"}}
    change = [
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_order_details"}},
        {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": other}},
        {"type": "text", "text": "Only cancellations now."},
    ]
    messages: list[Any] = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": change},
    ]
    tools, sent = apply_tool_changes([TOOL], messages)
    assert tools == [other]
    assert sent[1] == {"role": "system", "content": [change[2]]}
    back = [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_order_details"}}
    ]
    tools, _ = apply_tool_changes([TOOL], [*messages, {"role": "system", "content": back}])
    assert tools == [other, TOOL]  # removed, then added back by reference, in order
    unknown = [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "nope"}}]
    with pytest.raises(BadRequestError):
        apply_tool_changes([TOOL], [{"role": "system", "content": unknown}])
