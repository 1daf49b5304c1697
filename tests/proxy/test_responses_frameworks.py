"""Agent frameworks whose default model speaks the Responses API, pointed at the proxy: the OpenAI
Agents SDK (``OpenAIResponsesModel``, tracing off) and pydantic-ai (``Agent("openai:...")``).
A hallucinated tool name is repaired before the framework sees it, plain and streamed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
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
    with running_proxy(
        Settings(upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)
    ) as running:
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
        found = request.get("input")
        items: list[Any] = found if isinstance(found, list) else []
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


def _agent(
    base_url: str,
    ran: list[str],
    model: str = "scripted-model",
    tool_choice: str | None = None,
    timeout: float = 60.0,
    **agent_options: Any,
) -> Any:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_order_details(order_id: str) -> str:
        """Get the status of an order."""
        ran.append(order_id)
        return f"Order {order_id}: delivered"

    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=timeout)
    agent = Agent(
        name="support",
        instructions="You help with orders. Look orders up with get_order_details.",
        tools=[get_order_details],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(tool_choice=tool_choice),  # reset after the tool ran
        **agent_options,
    )
    return agent, client


def test_agents_sdk_chains_previous_response_id_across_a_promoted_call(
    upstream: ResponsesUpstream,
) -> None:
    """A run continued with ``previous_response_id`` whose first answer is a call written as
    text: the proxy promotes it, the SDK runs the tool and continues from the promoted answer's
    id; the upstream (which checks call ids as OpenAI does) is sent the conversation the agent
    saw, rebuilt from the proxy's store."""
    from agents import Runner

    text_call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    upstream.push(
        [message("Hello! How can I help?")],
        [message(text_call)],
        [message("Your order #W1 was delivered.")],
    )
    ran: list[str] = []
    with running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.PROMOTE)) as proxy:
        agent, client = _agent(proxy.base_url, ran)

        async def run() -> str:
            async with client:
                first = await Runner.run(agent, "Hi")
                second = await Runner.run(
                    agent, "Where is my order #W1?", previous_response_id=first.last_response_id
                )
                return str(second.final_output)

        final = asyncio.run(run())
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    last = upstream.requests[-1]
    assert last["store"] is False and "previous_response_id" not in last
    assert [i.get("type", "message") for i in last["input"]][-2:] == [
        "function_call",
        "function_call_output",
    ]


@pytest.mark.parametrize("streamed", [False, True])
def test_agents_sdk_on_a_chat_only_upstream(streamed: bool) -> None:
    """The Agents SDK's default (Responses) model against a proxy whose upstream serves chat
    completions only: translated both ways, the invented name repaired."""
    from agents import Runner

    from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

    ran: list[str] = []
    with ScriptedUpstream() as chat:
        chat.push(
            completion(tool_calls=[tool_call("lookup_order", GOOD)]),
            completion(tool_calls=[tool_call("get_order_details", GOOD)]),
            completion(content="Your order #W1 was delivered."),
        )
        settings = Settings(
            upstream=chat.base_url, upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
        )
        with running_proxy(settings) as proxy:
            agent, client = _agent(proxy.base_url, ran)

            async def run() -> str:
                async with client:
                    if streamed:
                        result = Runner.run_streamed(agent, "Where is my order #W1?")
                        async for _ in result.stream_events():
                            pass
                        return str(result.final_output)
                    return str((await Runner.run(agent, "Where is my order #W1?")).final_output)

            final = asyncio.run(run())
            lines = _budget_lines(proxy)
        paths = {r.path for r in chat.requests}
        tool_results = [m for m in chat.chat_requests[-1]["messages"] if m.get("role") == "tool"]
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    assert paths == {"/v1/chat/completions"}
    assert [m["content"] for m in tool_results] == ["Order #W1: delivered"]
    assert lines[0] == (["unknown_tool"], 1)


@contextmanager
def _zero_config_serve() -> Iterator[str]:
    """``python -m repairproxy serve`` with no upstream (the embedded model, chat only); yields
    its base URL once it is ready."""
    from tests.local.model_fixtures import MODEL_PRESENT

    if not MODEL_PRESENT:
        pytest.skip("embedded model not installed")
    import subprocess
    import sys
    import time

    import httpx

    from tests.support.processes import free_port

    port = free_port()
    command = [sys.executable, "-m", "repairproxy", "serve", "--port", str(port)]
    command += ["--repair", "constrained", "--max-repairs", "2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(base + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.model
@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_agents_sdk_against_zero_config_serve_with_the_embedded_model(streamed: bool) -> None:
    """``repairproxy serve`` with no upstream (the embedded model, chat only) answers the
    Agents SDK's default Responses model, streamed or not, and the agent's tool runs."""
    import httpx
    from agents import Runner

    with _zero_config_serve() as base:
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        ran: list[str] = []
        # A 1.5B model often answers in prose, or calls again and again: one turn that must
        # call a tool, whose output is the run's answer.
        agent, client = _agent(
            base + "/v1",
            ran,
            model=model,
            tool_choice="required",
            timeout=600.0,  # a CPU model on a busy machine
            tool_use_behavior="stop_on_first_tool",
        )

        async def run() -> str:
            async with client:
                if streamed:
                    streaming = Runner.run_streamed(agent, "Where is my order #W1?", max_turns=4)
                    async for _ in streaming.stream_events():
                        pass
                    return str(streaming.final_output)
                result = await Runner.run(agent, "Where is my order #W1?", max_turns=4)
                return str(result.final_output)

        final = asyncio.run(run())
    assert ran and ran[0].lstrip("#").upper().endswith("W1")
    assert final == f"Order {ran[0]}: delivered"


@pytest.mark.model
@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_pydantic_ai_against_zero_config_serve_with_the_embedded_model(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai's ``openai:`` model (its Responses model) against ``repairproxy serve`` with
    no upstream, streamed or not: its tool runs (the run may then end at the request limit: a
    1.5B model can call again instead of answering)."""
    import httpx
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.models import infer_model
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.usage import UsageLimits

    with _zero_config_serve() as base:
        name = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        monkeypatch.setenv("OPENAI_BASE_URL", base + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "x")
        assert isinstance(infer_model(f"openai:{name}"), OpenAIResponsesModel)
        agent = Agent(
            f"openai:{name}", instructions="You help with orders. Look orders up with the tool."
        )
        ran: list[str] = []

        @agent.tool_plain
        def get_order_details(order_id: str) -> str:
            """Get the status and details of an order."""
            ran.append(order_id)
            return f"Order {order_id}: delivered"

        async def run() -> None:
            question = "Look up order #W1 with get_order_details."
            limits = UsageLimits(request_limit=3)
            async with agent:
                with suppress(UsageLimitExceeded):
                    if streamed:
                        async with agent.run_stream(question, usage_limits=limits) as result:
                            await result.get_output()
                    else:
                        await agent.run(question, usage_limits=limits)

        asyncio.run(run())
    assert ran and ran[0].lstrip("#").upper().endswith("W1")


_NODE_STREAM = r"""
const OpenAI = require("openai");
const client = new OpenAI({ baseURL: process.argv[1], apiKey: "x", maxRetries: 0 });
(async () => {
  const tools = JSON.parse(process.argv[2]);
  const stream = client.responses.stream({ model: "m", input: "Where?", tools });
  const seen = [];
  const ids = new Set();
  for await (const event of stream) {
    seen.push([event.type, event.sequence_number]);
    if (event.response) ids.add(event.response.id);
  }
  const final = await stream.finalResponse();
  console.log(JSON.stringify({ id: final.id, ids: [...ids], output: final.output, seen }));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


def _node_modules() -> str | None:
    """Where the openai npm package is installed (``npm install --prefix DIR openai``):
    ``$REPAIRPROXY_NODE_MODULES``, else ``~/.cache/repairproxy/npm/node_modules``."""
    import os
    import shutil
    from pathlib import Path

    if shutil.which("node") is None:
        return None
    default = Path.home() / ".cache" / "repairproxy" / "npm" / "node_modules"
    path = Path(os.environ.get("REPAIRPROXY_NODE_MODULES", default))
    return str(path) if (path / "openai" / "package.json").is_file() else None


def test_the_openai_npm_client_streams_a_repaired_answer(
    proxy: RunningProxy, upstream: ResponsesUpstream
) -> None:
    """The official openai npm client's ``responses.stream()`` through a repaired stream: one
    response identity, sequence numbers 0, 1, 2, ..., the repaired call in the final output."""
    import os
    import subprocess

    import orjson

    modules = _node_modules()
    if modules is None:
        pytest.skip("node or the openai npm package is not installed")
    upstream.push(
        [message("Checking."), function_call("lookup_order", GOOD)],
        [function_call("get_order_details", GOOD)],
    )
    tools = [
        {
            "type": "function",
            "name": "get_order_details",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }
    ]
    done = subprocess.run(
        ["node", "-e", _NODE_STREAM, "--", proxy.base_url, orjson.dumps(tools).decode()],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_PATH": modules},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert [number for _, number in result["seen"]] == list(range(len(result["seen"])))
    assert result["ids"] == [result["id"]]  # one identity from response.created to the end
    assert [item["type"] for item in result["output"]] == ["message", "function_call"]
    assert result["output"][1]["name"] == "get_order_details"


@pytest.mark.parametrize("streamed", [False, True])
def test_pydantic_ai_on_a_chat_only_upstream(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai's ``openai:`` model (Responses) against a proxy whose upstream serves chat
    completions only: translated both ways, the invented name repaired."""
    from pydantic_ai import Agent

    from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

    ran: list[str] = []
    with ScriptedUpstream() as chat:
        chat.push(
            completion(tool_calls=[tool_call("lookup_order", GOOD)]),
            completion(tool_calls=[tool_call("get_order_details", GOOD)]),
            completion(content="Your order #W1 was delivered."),
        )
        settings = Settings(
            upstream=chat.base_url, upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
        )
        with running_proxy(settings) as proxy:
            monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "x")
            agent = Agent("openai:scripted-model", instructions="You help with orders.")

            @agent.tool_plain
            def get_order_details(order_id: str) -> str:
                """Get the status of an order."""
                ran.append(order_id)
                return f"Order {order_id}: delivered"

            async def run() -> str:
                async with agent:
                    if streamed:
                        async with agent.run_stream("Where is my order #W1?") as result:
                            return str(await result.get_output())
                    return str((await agent.run("Where is my order #W1?")).output)

            final = asyncio.run(run())
            lines = _budget_lines(proxy)
        paths = {r.path for r in chat.requests}
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    assert paths == {"/v1/chat/completions"}
    assert lines[0] == (["unknown_tool"], 1)


def test_agents_sdk_full_history_run_stays_one_episode(upstream: ResponsesUpstream) -> None:
    """The Agents SDK resends the whole history each turn (its default, no previous_response_id);
    an answer holding text and a call must not start a new episode on the next turn."""
    from agents import Runner

    upstream.push(
        [message("Let me check."), function_call("get_order_details", GOOD)],
        [message("Your order #W1 was delivered.")],
    )
    ran: list[str] = []
    with running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)) as proxy:
        agent, client = _agent(proxy.base_url, ran)

        async def run() -> str:
            async with client:
                return str((await Runner.run(agent, "Where is my order #W1?")).final_output)

        final = asyncio.run(run())
        episodes = [
            line.get("episode_id")
            for line in proxy.log_lines()
            if line.get("path") == "/v1/responses"
        ]
    assert final == "Your order #W1 was delivered."
    assert ran == ["#W1"]
    assert len(episodes) == 2 and episodes[0] == episodes[1], episodes


_NODE_AGENTS = r"""
const { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } = require("@openai/agents");
const OpenAI = require("openai");
const { z } = require("zod");
const options = JSON.parse(process.argv[2]);
setTracingDisabled(true);
setDefaultOpenAIClient(
  new OpenAI({ baseURL: process.argv[1], apiKey: "x", maxRetries: 0, timeout: options.timeout_ms }),
);
const ran = [];
const getOrder = tool({
  name: "get_order_details",
  description: "Get the status and details of an order.",
  parameters: z.object({ order_id: z.string() }),
  execute: async ({ order_id }) => { ran.push(order_id); return `Order ${order_id}: delivered`; },
});
const agent = new Agent({
  name: "support",
  instructions: "You help with orders. Look orders up with get_order_details.",
  tools: [getOrder],
  model: options.model,
  ...(options.tool_choice ? { modelSettings: { toolChoice: options.tool_choice } } : {}),
  ...(options.stop_on_first_tool ? { toolUseBehavior: "stop_on_first_tool" } : {}),
});
(async () => {
  const result = await run(agent, "Where is my order #W1?", {
    stream: options.stream,
    maxTurns: 4,
  });
  if (options.stream) { for await (const _ of result) {} await result.completed; }
  console.log(JSON.stringify({ final: result.finalOutput, ran }));
})().catch((error) => { console.error(String(error.stack || error)); process.exit(1); });
"""

# The newest @openai/agents whose dependencies support node 20 (CI's node): 0.15 and later need
# openai 7, which declares node >= 22.
AGENTS_NPM = "@openai/agents@0.14.3 zod@4"


def _agents_node_modules() -> str:
    """Where ``@openai/agents`` (npm) is installed (``npm install --prefix DIR`` the packages
    above): ``$REPAIRPROXY_AGENTS_NODE_MODULES``, else ``~/.cache/repairproxy/npm-agents/
    node_modules``, a folder of its own beside the openai npm client's. Skips without it."""
    import os
    import shutil
    from pathlib import Path

    default = Path.home() / ".cache" / "repairproxy" / "npm-agents" / "node_modules"
    path = Path(os.environ.get("REPAIRPROXY_AGENTS_NODE_MODULES", default))
    if shutil.which("node") is None or not (path / "@openai" / "agents" / "package.json").is_file():
        pytest.skip(
            "node or the @openai/agents npm package is not installed "
            f"(npm install --prefix ~/.cache/repairproxy/npm-agents {AGENTS_NPM})"
        )
    return str(path)


def _run_openai_agents_npm(
    modules: str, base_url: str, *, timeout: float, **options: Any
) -> dict[str, Any]:
    """Run the agent above under node; its final output and the tool's order ids."""
    import os
    import subprocess

    import orjson

    options = {"model": "m", "stream": False, "timeout_ms": int(timeout * 1000), **options}
    done = subprocess.run(
        ["node", "-e", _NODE_AGENTS, "--", base_url, orjson.dumps(options).decode()],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env={**os.environ, "NODE_PATH": modules},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_openai_agents_npm_on_a_chat_only_upstream(streamed: bool) -> None:
    """``@openai/agents`` (its default model is the Responses one) against a proxy whose
    upstream serves chat completions only: the invented name is repaired and the tool runs."""
    from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

    modules = _agents_node_modules()
    with ScriptedUpstream() as chat:
        chat.push(
            completion(tool_calls=[tool_call("lookup_order", GOOD)]),
            completion(tool_calls=[tool_call("get_order_details", GOOD)]),
            completion(content="Your order #W1 was delivered."),
        )
        settings = Settings(
            upstream=chat.base_url, upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
        )
        with running_proxy(settings) as proxy:
            result = _run_openai_agents_npm(modules, proxy.base_url, timeout=60.0, stream=streamed)
            lines = _budget_lines(proxy)
        paths = {r.path for r in chat.requests}
        tool_results = [m for m in chat.chat_requests[-1]["messages"] if m.get("role") == "tool"]
    assert result == {"final": "Your order #W1 was delivered.", "ran": ["#W1"]}
    assert paths == {"/v1/chat/completions"}
    assert [m["content"] for m in tool_results] == ["Order #W1: delivered"]
    assert lines[0] == (["unknown_tool"], 1)


@pytest.mark.model
@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_openai_agents_npm_against_zero_config_serve_with_the_embedded_model(
    streamed: bool,
) -> None:
    """``@openai/agents``'s default (Responses) model against ``repairproxy serve`` with no
    upstream (the embedded model, chat only), streamed through the stream gate or not: the
    agent's tool runs."""
    import httpx

    modules = _agents_node_modules()
    with _zero_config_serve() as base:
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        # As for the Python Agents SDK: one turn that must call the tool, whose output is the
        # run's answer (a 1.5B model often answers in prose or calls again and again).
        result = _run_openai_agents_npm(
            modules,
            base + "/v1",
            timeout=600.0,  # a CPU model on a busy machine
            model=model,
            stream=streamed,
            tool_choice="required",
            stop_on_first_tool=True,
        )
    ran = result["ran"]
    assert ran and ran[0].lstrip("#").upper().endswith("W1")
    assert result["final"] == f"Order {ran[0]}: delivered"
