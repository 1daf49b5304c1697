"""LLM agent, LLM user and judge against a real OpenAI-compatible server on loopback; gold play."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

from evals.tau2.agents import EPISODE_HEADER, GoldAgent, LLMAgent, ModelConfig, action_blocks
from evals.tau2.logs import ToolMessage
from evals.tau2.orchestrator import GREETING, OrchestratorConfig, run_episode
from evals.tau2.reward import evaluate_episode
from evals.tau2.scoring import OpenAIJudge
from evals.tau2.users import GoldUser, LLMUserSimulator, render_scenario
from tests.evals.fakes import POLICY, CounterDomain, make_task
from tests.support.scripted_upstream import ScriptedUpstream, completion, error_reply, tool_call

pytestmark = pytest.mark.anyio

GUIDELINES = "# Guidelines\nBe a customer.<PERSONA_GUIDELINES>"


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as server:
        yield server


@pytest.fixture
async def client(upstream: ScriptedUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=upstream.base_url, api_key="x", max_retries=0) as c:
        yield c


async def test_llm_agent_and_user_over_http(
    upstream: ScriptedUpstream, client: openai.AsyncOpenAI
) -> None:
    agent_model = ModelConfig(
        model="agent-m",
        base_url=upstream.base_url,
        temperature=0.3,
        extra_headers={"X-Repairproxy-Repair": "constrained"},
    )
    user_model = ModelConfig(model="user-m", base_url=upstream.base_url, temperature=0.7)
    # Half duplex: the order of requests is fixed, so one server can play both sides.
    upstream.push(
        completion(content="I need 2 added."),  # user
        completion(tool_calls=[tool_call("add", {"amount": 2}, "c1")]),  # agent
        completion(tool_calls=[tool_call("add", '{"amount": ', "c2")]),  # agent, malformed
        completion(content="Added 2. Please press ok."),  # agent
        completion(tool_calls=[tool_call("press", {"button": "ok"}, "u1")]),  # user
        completion(content="Pressed. ###STOP###"),  # user
    )
    task = make_task(
        reward_basis=["DB"], actions=[{"action_id": "a", "name": "add", "arguments": {"amount": 2}}]
    )
    episode = await run_episode(
        domain=CounterDomain(),
        task=task,
        make_agent=lambda ctx: LLMAgent(client, agent_model, ctx),
        make_user=lambda ctx: LLMUserSimulator(client, user_model, GUIDELINES, ctx),
        config=OrchestratorConfig(),
        seed=42,
    )
    run = episode.run
    assert run.termination_reason == "user_stop"
    assert run.malformed_tool_calls == {"assistant": 1} and run.num_errors == 1
    assert episode.environment.total == 2 and episode.environment.presses == ["ok"]

    requests = upstream.requests
    bodies = upstream.chat_requests
    agent_requests = [
        (r, b) for r, b in zip(requests, bodies, strict=True) if b["model"] == "agent-m"
    ]
    user_requests = [b for b in bodies if b["model"] == "user-m"]
    assert len(agent_requests) == 3 and len(user_requests) == 3
    for request, body in agent_requests:
        assert request.headers[EPISODE_HEADER.lower()] == run.id
        assert request.headers["x-repairproxy-repair"] == "constrained"
        assert body["temperature"] == 0.3 and body["seed"] == 42
        assert POLICY in body["messages"][0]["content"]
        assert [t["function"]["name"] for t in body["tools"]] == ["add", "fail"]
        assert body["tool_choice"] == "auto"  # as τ²-bench's generate() whenever tools are sent
    first_agent = agent_requests[0][1]["messages"]
    assert first_agent[1] == {"role": "assistant", "content": GREETING}
    assert first_agent[2] == {"role": "user", "content": "I need 2 added."}
    third_agent = agent_requests[2][1]["messages"]
    # The malformed call goes back verbatim with its error result.
    assert third_agent[-2]["tool_calls"][0]["function"]["arguments"] == '{"amount": '
    assert third_agent[-1]["role"] == "tool" and third_agent[-1]["tool_call_id"] == "c2"
    assert third_agent[-1]["content"].startswith("Error: Invalid arguments")

    first_user = user_requests[0]["messages"]
    assert first_user[0]["content"].startswith("# Guidelines\nBe a customer.\n\n<scenario>")
    assert "Ask for 2 then 1." in first_user[0]["content"]
    assert first_user[1] == {"role": "user", "content": GREETING}  # roles flipped
    assert [t["function"]["name"] for t in user_requests[0]["tools"]] == ["press"]
    assert user_requests[0]["tool_choice"] == "auto"
    last_user = user_requests[2]["messages"]
    assert last_user[-1] == {"role": "tool", "tool_call_id": "u1", "content": "pressed"}
    assert all(m.get("tool_calls") is None for m in last_user if m["role"] == "user")


async def test_agent_http_failure_is_agent_error(
    upstream: ScriptedUpstream, client: openai.AsyncOpenAI
) -> None:
    upstream.push(completion(content="hello"), error_reply(500, "boom"))
    model = ModelConfig(model="m", base_url=upstream.base_url)
    episode = await run_episode(
        domain=CounterDomain(),
        task=make_task(),
        make_agent=lambda ctx: LLMAgent(client, model, ctx),
        make_user=lambda ctx: LLMUserSimulator(client, model, GUIDELINES, ctx),
        config=OrchestratorConfig(),
    )
    assert episode.run.termination_reason == "agent_error"
    assert "500" in (episode.run.error_detail or "")


async def test_openai_judge(upstream: ScriptedUpstream, client: openai.AsyncOpenAI) -> None:
    upstream.push(
        completion(
            content='{"results": ['
            '{"expectedOutcome": "polite", "reasoning": "yes", "metExpectation": true},'
            '{"expectedOutcome": "brief", "reasoning": "no", "metExpectation": false}]}'
        )
    )
    judge = OpenAIJudge(client, "judge-m")
    task = make_task(reward_basis=["NL_ASSERTION"], nl_assertions=["polite", "brief"])
    env = CounterDomain().new_environment()
    from evals.tau2.logs import AssistantMessage

    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason="user_stop",
        messages=[AssistantMessage(content="Hello there")],
        final_env=env,
        judge=judge,
    )
    assert [c.met for c in info.nl_assertions] == [True, False] and info.reward == 0.0
    prompt = upstream.chat_requests[0]["messages"][1]["content"]
    assert "assistant: Hello there" in prompt and "polite" in prompt


def test_action_blocks_group_consecutive_requestors() -> None:
    actions = [
        {"action_id": "0", "name": "a", "arguments": {}},
        {"action_id": "1", "name": "b", "arguments": {}, "requestor": "user"},
        {"action_id": "2", "name": "c", "arguments": {}, "requestor": "user"},
        {"action_id": "3", "name": "d", "arguments": {}, "requestor": "assistant"},
    ]
    assert [(r, [a.name for a in b]) for r, b in action_blocks(actions)] == [
        ("assistant", ["a"]),
        ("user", ["b", "c"]),
        ("assistant", ["d"]),
    ]


async def test_gold_agent_and_gold_user_interleave_the_gold_actions() -> None:
    actions = [
        {"action_id": "1", "name": "add", "arguments": {"amount": 2}},
        {"action_id": "2", "requestor": "user", "name": "press", "arguments": {"button": "x"}},
        {"action_id": "3", "requestor": "user", "name": "press", "arguments": {"button": "y"}},
        {"action_id": "4", "name": "add", "arguments": {"amount": 1}},
        {"action_id": "5", "requestor": "user", "name": "press", "arguments": {"button": "z"}},
    ]
    task = make_task(actions=actions, reward_basis=["DB", "ACTION"])
    episode = await run_episode(
        domain=CounterDomain(),
        task=task,
        make_agent=GoldAgent,
        make_user=GoldUser,
        config=OrchestratorConfig(),
    )
    assert episode.run.termination_reason == "user_stop"
    assert episode.environment.presses == ["x", "y", "z"] and episode.environment.total == 3
    calls = [
        c.name
        for m in episode.run.messages
        if not isinstance(m, ToolMessage)
        for c in m.tool_calls or []
    ]
    assert calls == ["add", "press", "press", "add", "press"]
    info = await evaluate_episode(
        domain=CounterDomain(),
        task=task,
        termination_reason=episode.run.termination_reason,
        messages=episode.run.messages,
        final_env=episode.environment,
        judge=None,
    )
    assert info.reward == 1.0


def test_render_scenario_structured(tau2_data_dir: Path) -> None:
    import json

    tasks = json.loads((tau2_data_dir / "tau2/domains/telecom/tasks.json").read_text())
    text = render_scenario(tasks[0]["user_scenario"])
    assert text.startswith("Instructions:\n\tDomain: telecom\n\tReason for call:\n\t\t")
    assert tasks[0]["user_scenario"]["instructions"]["known_info"] in text


def test_proxy_report_parses_the_repairproxy_headers() -> None:
    from evals.tau2.chat import proxy_report

    report = proxy_report(
        [
            ("content-type", "application/json"),
            ("X-Repairproxy-Tool-Errors", "unknown_tool,schema_violation"),
            ("x-repairproxy-unknown-tools", ""),
            ("x-repairproxy-repairs", "2"),
            ("x-repairproxy-overhead-ms", "1.250"),
            ("x-repairproxy-budget-exhausted", "true"),
            ("x-repairproxy-episode-id", "ep-7"),
        ]
    )
    assert report == {
        "tool_errors": ["unknown_tool", "schema_violation"],
        "unknown_tools": [],
        "repairs": 2,
        "overhead_ms": 1.25,
        "budget_exhausted": "true",
        "episode_id": "ep-7",
    }
