"""The framework compatibility matrix: each framework × API path × check, run against scripted
upstreams through a real proxy on loopback, PASS/FAIL per cell; ``--write-docs`` puts the table
into ``docs/frameworks.md`` between its framework-matrix markers.

    python -m tests.frameworks.matrix                  # print the cells
    python -m tests.frameworks.matrix --write-docs     # and rewrite the docs' table

Frameworks in the project's dev extra run in process; those whose pins conflict run from their
own venv under ``~/.cache/repairproxy/fw-venvs/NAME`` (smolagents), driven by
``tests/frameworks/agents/``; a framework that is not installed is reported as not run.
Every run's agent has one tool, ``get_order_details(order_id)``, which fails for any order but #W1.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
import orjson

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion, tool_call

__all__ = ["CHECKS", "Cell", "main", "run_matrix"]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote fetch at import

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "frameworks.md"
FW_VENVS = Path(os.environ.get("REPAIRPROXY_FW_VENVS", Path.home() / ".cache/repairproxy/fw-venvs"))
START, END = "<!-- framework-matrix:start -->", "<!-- framework-matrix:end -->"
COMMAND = "python -m tests.frameworks.matrix --write-docs"
TASK = "Where is my order #W1?"
GOOD = {"order_id": "#W1"}
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "description": "The order id, like #W1."}},
    "required": ["order_id"],
}
CHECKS = ("valid", "invented", "text call", "stream", "log+metrics", "2 runs", "tool error")


class Orders:
    """The agent's one tool; records every call it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def get_order_details(self, order_id: str) -> str:
        self.ran.append(order_id)
        if order_id != "#W1":
            raise ValueError(f"Order {order_id} not found")
        return f"Order {order_id}: delivered"


# A driver runs the agent once (``runs`` times) against a base URL and returns the tool's record.
Driver = Callable[[str, bool, int], list[str]]


@dataclass(frozen=True)
class Framework:
    name: str
    package: str
    api: str  # "chat", "responses" or "messages" (on a chat-only upstream)
    driver: Driver
    venv: str | None = None  # its own venv under FW_VENVS

    def version(self) -> str | None:
        if self.package.startswith("@"):  # an npm package: the pinned one (tests/support/npm.py)
            from tests.support.npm import ANTHROPIC_SDK

            pinned = ANTHROPIC_SDK[1] if self.package == ANTHROPIC_SDK[0] else None
            return pinned if shutil.which("npm") else None
        if self.venv is not None:
            python = FW_VENVS / self.venv / "bin/python"
            if not python.exists():
                return None
            found = subprocess.run(
                [
                    str(python),
                    "-c",
                    f"import importlib.metadata as m; print(m.version({self.package!r}))",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            return found.stdout.strip() or None
        try:
            return version(self.package)
        except PackageNotFoundError:
            return None


@dataclass
class Cell:
    framework: str
    version: str
    api: str
    check: str
    ok: bool
    detail: str = ""


# -- drivers ---------------------------------------------------------------------------------------


def _chat_tools() -> Any:  # the openai SDK's ChatCompletionToolParam list
    return [
        {
            "type": "function",
            "function": {
                "name": "get_order_details",
                "description": "Get the status of an order.",
                "parameters": SCHEMA,
            },
        }
    ]


def _result(orders: Orders, arguments: str) -> str:
    """What a hand-written loop sends back: the result, or τ²-bench's ``Error: ...``."""
    try:
        return orders.get_order_details(**orjson.loads(arguments or "{}"))
    except (ValueError, TypeError) as exc:
        return f"Error: {exc}"


def openai_chat(base_url: str, streamed: bool, runs: int) -> list[str]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    orders = Orders()
    for _ in range(runs):
        messages: list[Any] = [{"role": "user", "content": TASK}]
        for _ in range(4):
            reply: Any
            if streamed:
                with client.chat.completions.stream(
                    model="scripted-model", messages=messages, tools=_chat_tools()
                ) as stream:
                    for _ in stream:
                        pass
                    reply = stream.get_final_completion().choices[0].message
            else:
                reply = (
                    client.chat.completions.create(
                        model="scripted-model", messages=messages, tools=_chat_tools()
                    )
                    .choices[0]
                    .message
                )
            calls = [c for c in reply.tool_calls or () if c.type == "function"]
            if not calls:
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": reply.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.function.name,
                                "arguments": c.function.arguments,
                            },
                        }
                        for c in calls
                    ],
                }
            )
            for call in calls:
                content = _result(orders, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return orders.ran


def openai_responses(base_url: str, streamed: bool, runs: int) -> list[str]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    tools: Any = [{"type": "function", "name": "get_order_details", "parameters": SCHEMA}]
    orders = Orders()
    for _ in range(runs):
        items: list[Any] = [{"role": "user", "content": TASK}]
        for _ in range(4):
            response: Any
            if streamed:
                with client.responses.stream(
                    model="scripted-model", input=items, tools=tools
                ) as stream:
                    for _ in stream:
                        pass
                    response = stream.get_final_response()
            else:
                response = client.responses.create(model="scripted-model", input=items, tools=tools)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            for call in calls:
                items.append(call.model_dump(exclude_none=True))
                content = _result(orders, call.arguments)
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": content}
                )
    return orders.ran


def _openai_agents(responses: bool) -> Driver:
    def drive(base_url: str, streamed: bool, runs: int) -> list[str]:
        from agents import (
            Agent,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
            Runner,
            function_tool,
            set_tracing_disabled,
        )
        from openai import AsyncOpenAI

        set_tracing_disabled(True)
        orders = Orders()

        @function_tool
        def get_order_details(order_id: str) -> str:
            """Get the status of an order."""
            return orders.get_order_details(order_id)

        async def run() -> None:
            client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
            model: Any = (
                OpenAIResponsesModel(model="scripted-model", openai_client=client)
                if responses
                else OpenAIChatCompletionsModel(model="scripted-model", openai_client=client)
            )
            agent = Agent(name="orders", model=model, tools=[get_order_details])
            for _ in range(runs):
                if streamed:
                    result = Runner.run_streamed(agent, TASK)
                    async for _ in result.stream_events():
                        pass
                else:
                    await Runner.run(agent, TASK)
            await client.close()

        asyncio.run(run())
        return orders.ran

    return drive


def _pydantic_ai(responses: bool) -> Driver:
    def drive(base_url: str, streamed: bool, runs: int) -> list[str]:
        from pydantic_ai import Agent, ModelRetry
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=base_url, api_key="x")
        model: Any = (
            OpenAIResponsesModel("scripted-model", provider=provider)
            if responses
            else OpenAIChatModel("scripted-model", provider=provider)
        )
        agent = Agent(model, instructions="You help with orders.")
        orders = Orders()

        @agent.tool_plain
        def get_order_details(order_id: str) -> str:
            """Get the status of an order."""
            try:
                return orders.get_order_details(order_id)
            except ValueError as exc:
                raise ModelRetry(str(exc)) from exc

        async def run() -> None:
            async with agent:
                for _ in range(runs):
                    if streamed:
                        async with agent.run_stream(TASK) as result:
                            await result.get_output()
                    else:
                        await agent.run(TASK)

        asyncio.run(run())
        return orders.ran

    return drive


def litellm_chat(base_url: str, streamed: bool, runs: int) -> list[str]:
    import litellm

    orders = Orders()
    for _ in range(runs):
        messages: list[Any] = [{"role": "user", "content": TASK}]
        for _ in range(4):
            options: dict[str, Any] = {
                "model": "openai/scripted-model",
                "api_base": base_url,
                "api_key": "x",
                "messages": messages,
                "tools": _chat_tools(),
            }
            reply: Any
            if streamed:
                chunks = list(litellm.completion(**options, stream=True))
                reply = litellm.stream_chunk_builder(chunks, messages=messages)
            else:
                reply = litellm.completion(**options)
            message_ = reply.choices[0].message
            calls = message_.tool_calls or []
            if not calls:
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": message_.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.function.name,
                                "arguments": c.function.arguments,
                            },
                        }
                        for c in calls
                    ],
                }
            )
            for call in calls:
                content = _result(orders, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return orders.ran


def anthropic_runner(base_url: str, streamed: bool, runs: int) -> list[str]:
    """The anthropic SDK's default tool runner (it threads: message-threads-2026-08-12)."""
    import anthropic
    from anthropic import beta_tool

    orders = Orders()

    @beta_tool
    def get_order_details(order_id: str) -> str:
        """Get the status and details of an order.

        Args:
            order_id: The order id, like #W1.
        """
        return orders.get_order_details(order_id)

    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="x", max_retries=0)
    try:
        for _ in range(runs):
            messages: Any = [{"role": "user", "content": TASK}]
            if streamed:
                runner: Any = client.beta.messages.tool_runner(
                    model="scripted-model",
                    max_tokens=256,
                    tools=[get_order_details],
                    messages=messages,
                    stream=True,
                )
                for stream in runner:
                    stream.get_final_message()
            else:
                client.beta.messages.tool_runner(
                    model="scripted-model",
                    max_tokens=256,
                    tools=[get_order_details],
                    messages=messages,
                ).until_done()
    finally:
        client.close()
    return orders.ran


_NODE_RUNNER = r"""
const Anthropic = require("@anthropic-ai/sdk");
const { betaTool } = require("@anthropic-ai/sdk/helpers/beta/json-schema");
const [baseURL, task, streamed, runs] = process.argv.slice(1);
const client = new Anthropic({ baseURL, apiKey: "x", maxRetries: 0 });
const ran = [];
const tool = betaTool({
  name: "get_order_details",
  description: "Get the status and details of an order.",
  inputSchema: {
    type: "object", properties: { order_id: { type: "string" } }, required: ["order_id"],
  },
  run: async ({ order_id }) => {
    ran.push(order_id);
    if (order_id !== "#W1") throw new Error(`Order ${order_id} not found`);
    return `Order ${order_id}: delivered`;
  },
});
(async () => {
  for (let i = 0; i < Number(runs); i++) {
    const body = { model: "scripted-model", max_tokens: 256, tools: [tool],
                   messages: [{ role: "user", content: task }] };
    if (streamed === "true") body.stream = true;
    await client.beta.messages.toolRunner(body);
  }
  console.log("RAN " + JSON.stringify(ran));
})().catch((error) => { console.error(String(error)); process.exit(1); });
"""


def anthropic_npm_runner(base_url: str, streamed: bool, runs: int) -> list[str]:
    """The @anthropic-ai/sdk npm package's default tool runner (pinned, tests/support/npm.py)."""
    from tests.support.npm import ANTHROPIC_SDK, node_modules

    modules = node_modules(ANTHROPIC_SDK)
    root = base_url.removesuffix("/v1")
    done = subprocess.run(
        ["node", "-e", _NODE_RUNNER, "--", root, TASK, str(streamed).lower(), str(runs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NODE_PATH": modules},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-800:])
    ran: list[str] = orjson.loads(done.stdout.rpartition("RAN ")[2].splitlines()[0])
    return ran


def _venv_driver(venv: str, script: str, *options: str) -> Driver:
    def drive(base_url: str, streamed: bool, runs: int) -> list[str]:
        python = FW_VENVS / venv / "bin/python"
        done = subprocess.run(
            [str(python), str(ROOT / "tests/frameworks/agents" / script), base_url, *options]
            + (["--stream"] if streamed else [])
            + ["--runs", str(runs)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-800:])
        # Its live display may share the last line: the record follows the last "RAN ".
        ran: list[str] = orjson.loads(done.stdout.rpartition("RAN ")[2].splitlines()[0])
        return ran

    return drive


FRAMEWORKS: tuple[Framework, ...] = (
    Framework(
        "LangGraph + langchain-openai",
        "langgraph",
        "chat",
        _venv_driver("langgraph", "langgraph_matrix.py"),
        venv="langgraph",
    ),
    Framework(
        "LangGraph + langchain-openai",
        "langgraph",
        "responses",
        _venv_driver("langgraph", "langgraph_matrix.py", "--responses"),
        venv="langgraph",
    ),
    Framework("openai (python)", "openai", "chat", openai_chat),
    Framework("openai (python)", "openai", "responses", openai_responses),
    Framework("openai-agents", "openai-agents", "chat", _openai_agents(responses=False)),
    Framework("openai-agents", "openai-agents", "responses", _openai_agents(responses=True)),
    Framework("pydantic-ai", "pydantic-ai-slim", "chat", _pydantic_ai(responses=False)),
    Framework("pydantic-ai", "pydantic-ai-slim", "responses", _pydantic_ai(responses=True)),
    Framework("litellm", "litellm", "chat", litellm_chat),
    Framework("anthropic (python)", "anthropic", "messages", anthropic_runner),
    Framework("@anthropic-ai/sdk (npm)", "@anthropic-ai/sdk", "messages", anthropic_npm_runner),
    Framework(
        "smolagents",
        "smolagents",
        "chat",
        _venv_driver("smolagents", "smolagents_matrix.py"),
        venv="smolagents",
    ),
)


# -- scripts and checks ----------------------------------------------------------------------------


@dataclass
class Script:
    """What the upstream answers, in order, as (kind, payload): a call, a text call, a text."""

    steps: list[tuple[str, Any]] = field(default_factory=list)

    def replies(self, api: str, final_tool: bool) -> list[Any]:
        out: list[Any] = []
        for kind, payload in self.steps:
            if kind == "call":
                name, arguments = payload
                out.append(
                    [function_call(name, arguments)]
                    if api == "responses"
                    else completion(tool_calls=[tool_call(name, arguments)])
                )
            elif kind == "text" and final_tool:  # smolagents ends a run with its final_answer tool
                out.append(completion(tool_calls=[tool_call("final_answer", {"answer": payload})]))
            else:
                out.append(
                    [message(payload)] if api == "responses" else completion(content=payload)
                )
        return out


TEXT_CALL = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
SCRIPTS: dict[str, Script] = {
    "valid": Script([("call", ("get_order_details", GOOD)), ("text", "Delivered.")]),
    "invented": Script(
        [("call", ("lookup_order", GOOD)), ("call", ("get_order_details", GOOD)), ("text", "Ok.")]
    ),
    "text call": Script([("prose", TEXT_CALL), ("text", "Delivered.")]),
    "tool error": Script([("call", ("get_order_details", {"order_id": "#W2"})), ("text", "No.")]),
}


def _lines(proxy: RunningProxy) -> list[dict[str, Any]]:
    return [
        line
        for line in proxy.log_lines()
        if line.get("path") in ("/v1/chat/completions", "/v1/responses", "/v1/messages")
    ]


def _metric(proxy: RunningProxy, name: str, **labels: str) -> float:
    text = httpx.get(f"{proxy.root_url}/metrics").text
    for line in text.splitlines():
        if line.startswith(f"repairproxy_{name}{{") and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            return float(line.rpartition(" ")[2])
    return 0.0


def _run(framework: Framework, check: str) -> tuple[bool, str]:
    script = SCRIPTS.get(
        check, SCRIPTS["invented"] if check in ("stream", "log+metrics") else SCRIPTS["valid"]
    )
    runs = 2 if check == "2 runs" else 1
    final_tool = framework.name == "smolagents"
    upstream: Any = ResponsesUpstream() if framework.api == "responses" else ScriptedUpstream()
    with upstream:
        # Each run gets its own replies (fresh call ids, as a real upstream's): byte-identical
        # runs are the one case chaining cannot tell apart.
        replies = [r for _ in range(runs) for r in script.replies(framework.api, final_tool)]
        if framework.api == "responses":
            upstream.push(*replies)
        else:
            upstream.push(*[r for r in replies if isinstance(r, Reply)])
        # Messages rows: a chat-only upstream (the proxy translates, and keeps the threads).
        chat_only = ("chat",) if framework.api == "messages" else ()
        settings = Settings(
            upstream=upstream.base_url, repair=RepairMode.REFLEXIVE, upstream_apis=chat_only
        )
        with running_proxy(settings) as proxy:
            ran = framework.driver(proxy.base_url, check == "stream", runs)
            lines = _lines(proxy)
            first = lines[0] if lines else {}
            if check == "valid":
                return ran == ["#W1"] and first.get("channels") == [], f"ran={ran}"
            if check == "invented":
                return ran == ["#W1"] and first.get("channels") == ["unknown_tool"], f"ran={ran}"
            if check == "text call":
                return ran == ["#W1"] and first.get("promoted") == 1, f"ran={ran}"
            if check == "stream":
                ok = ran == ["#W1"] and first.get("stream") is True
                return ok and first.get("channels") == ["unknown_tool"], f"ran={ran}"
            if check == "log+metrics":
                errors = _metric(
                    proxy, "tool_call_errors_total", channel="unknown_tool", source="answer"
                )
                invented = _metric(proxy, "hallucinated_tool_calls_total", tool="lookup_order")
                ok = first.get("channels") == ["unknown_tool"] and errors == 1 and invented == 1
                return ok, f"errors={errors} invented={invented}"
            if check == "2 runs":
                episodes = {line.get("episode_id") for line in lines}
                return ran == ["#W1", "#W1"] and len(episodes) == 2, f"episodes={len(episodes)}"
            # tool error: the framework's own error result is counted on the next request
            counted = [line.get("episode_errors") for line in lines]
            return ran == ["#W2"] and counted[-1:] == [1], f"episode_errors={counted}"


def run_matrix(only: str | None = None) -> tuple[list[Cell], list[str]]:
    cells: list[Cell] = []
    absent: list[str] = []
    for framework in FRAMEWORKS:
        if only is not None and only not in framework.name:
            continue
        found = framework.version()
        if found is None:
            absent.append(f"{framework.name} ({framework.api})")
            continue
        for check in CHECKS:
            try:
                ok, detail = _run(framework, check)
            except Exception as exc:  # a framework that crashes fails its cell, the run goes on
                ok, detail = False, f"{type(exc).__name__}: {str(exc)[:200]}"
            cells.append(Cell(framework.name, found, framework.api, check, ok, detail))
            print(
                f"{'PASS' if ok else 'FAIL'}  {framework.name} {found} {framework.api:9} "
                f"{check:12} {'' if ok else detail}",
                flush=True,
            )
    return cells, absent


def matrix_table(cells: list[Cell], absent: list[str], when: str) -> str:
    rows: dict[tuple[str, str, str], dict[str, bool]] = {}
    for cell in cells:
        rows.setdefault((cell.framework, cell.version, cell.api), {})[cell.check] = cell.ok
    lines = [
        START,
        "| framework | version | API | " + " | ".join(CHECKS) + " | result |",
        "| --- | --- | --- | " + " | ".join("---" for _ in CHECKS) + " | --- |",
    ]
    for (name, found, api), checks in rows.items():
        marks = ["PASS" if checks.get(c) else "FAIL" for c in CHECKS]
        result = "PASS" if all(checks.get(c) for c in CHECKS) else "FAIL"
        lines.append(f"| {name} | {found} | {api} | " + " | ".join(marks) + f" | {result} |")
    lines.append("")
    lines.append(f"Last run: {when}, `{COMMAND}` (scripted upstreams, a real proxy on loopback).")
    if absent:
        lines.append(f"Not installed at that run, so not in the table: {', '.join(absent)}.")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {PAGE}")
    parser.add_argument("--only", help="run the frameworks whose name contains this")
    args = parser.parse_args(argv)
    cells, absent = run_matrix(args.only)
    failed = sum(1 for cell in cells if not cell.ok)
    print(f"{len(cells) - failed} passed, {failed} failed")
    if args.write_docs:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        text = PAGE.read_text()
        table = matrix_table(cells, absent, when)
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{PAGE} has no {START} ... {END} markers")
        PAGE.write_text(pattern.sub(lambda _: table, text))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
