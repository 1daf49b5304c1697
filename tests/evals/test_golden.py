"""Our engine's prompts and requests are byte-identical to τ²-bench v1.0.1's, task by task.

``golden/tau2_v1_0_1.json`` holds sha256 digests of the requests τ²-bench v1.0.1 itself sent in
the same scripted opening (made by ``golden/make_golden.py`` with τ²-bench installed apart). Here
our LLM agent and LLM user play that opening against a scripted upstream on loopback, and the
digests of what the upstream received must match: agent and user system prompts, the tool schemas
each side sees, the first messages, and ``tool_choice`` / ``temperature`` / ``seed``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from evals.tau2.agents import LLMAgent, ModelConfig, agent_system_prompt
from evals.tau2.chat import to_openai_messages
from evals.tau2.domains import load_domain
from evals.tau2.logs import AssistantMessage, ToolMessage, UserMessage
from evals.tau2.orchestrator import GREETING, OrchestratorConfig, run_episode
from evals.tau2.scoring.nl import judge_messages
from evals.tau2.users import LLMUserSimulator, load_guidelines, user_system_prompt
from tests.support.scripted_upstream import ScriptedUpstream, completion

pytestmark = pytest.mark.anyio

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tau2_v1_0_1.json").read_text())
SCRIPT = GOLDEN["script"]
PARAMS = ("tool_choice", "temperature", "seed")
HTTP_SAMPLE = 8  # every 8th task plays the opening over loopback HTTP (15 of 114 per domain)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _digests(request: dict[str, Any]) -> dict[str, Any]:
    """The same digests as ``make_golden.request_digests`` (no ``None`` values on either side)."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in request["messages"]]
    tools = request.get("tools")
    return {
        "system_prompt": _sha256(messages[0]["content"]),
        "messages": _sha256(_canonical(messages)),
        "tools": _sha256(_canonical(tools)) if tools else None,
        "tool_names": [t["function"]["name"] for t in tools] if tools else [],
        "params": {k: request.get(k) for k in PARAMS},
    }


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as server:
        yield server


@pytest.mark.parametrize("domain_name", ["retail", "telecom"])
async def test_requests_match_tau2_v1_0_1(
    domain_name: str, tau2_data_dir: Path, upstream: ScriptedUpstream
) -> None:
    golden = GOLDEN["domains"][domain_name]
    domain = load_domain(domain_name, tau2_data_dir)
    tasks = domain.tasks("base")
    assert sorted(t.id for t in tasks) == sorted(golden["tasks"])
    tasks = tasks[::HTTP_SAMPLE]  # over HTTP: a spread sample; every task below, without HTTP
    agent_model = ModelConfig(
        model="golden-agent", base_url=upstream.base_url, temperature=SCRIPT["temperature"]
    )
    user_model = ModelConfig(
        model="golden-user", base_url=upstream.base_url, temperature=SCRIPT["temperature"]
    )
    guidelines = {t: load_guidelines(tau2_data_dir, with_tools=t) for t in (False, True)}
    mismatches: list[str] = []
    async with openai.AsyncOpenAI(base_url=upstream.base_url, api_key="x", max_retries=0) as c:
        for task in tasks:
            before = len(upstream.chat_requests)
            upstream.push(
                completion(content=SCRIPT["user_opening"]),
                completion(content=SCRIPT["agent_reply"]),
                completion(content="###STOP###"),
            )
            episode = await run_episode(
                domain=domain,
                task=task,
                make_agent=lambda ctx: LLMAgent(c, agent_model, ctx),
                make_user=lambda ctx: LLMUserSimulator(
                    c, user_model, guidelines[bool(ctx.user_tools)], ctx
                ),
                config=OrchestratorConfig(),
                seed=SCRIPT["seed"],
            )
            assert episode.run.termination_reason == "user_stop"
            user_first, agent_first = upstream.chat_requests[before : before + 2]
            user, agent = _digests(user_first), _digests(agent_first)
            want = golden["tasks"][task.id]
            got = {
                "user_first_request": {k: user[k] for k in want["user_first_request"]},
                "agent_first_request_messages": agent["messages"],
            }
            if got != want:
                mismatches.append(f"{task.id}: {got} != {want}")
            assert agent["system_prompt"] == golden["agent_system_prompt"]
            assert agent["tool_names"] == golden["agent_tool_names"]
            assert agent["tools"] == golden["agent_tools"]
            assert agent["params"] == golden["agent_params"]
            assert user["tool_names"] == golden["user_tool_names"]
    assert not mismatches, f"{len(mismatches)} tasks differ; first: {mismatches[0]}"


@pytest.mark.parametrize("domain_name", ["retail", "telecom"])
def test_tool_schemas_are_tau2_v1_0_1s(domain_name: str, tau2_data_dir: Path) -> None:
    """Both domains declare tools one way (``evals.tau2.domains.toolkit``); the result is
    τ²-bench's."""
    golden = GOLDEN["domains"][domain_name]
    environment = load_domain(domain_name, tau2_data_dir).new_environment()
    agent_tools = environment.agent_tools()
    assert [t["function"]["name"] for t in agent_tools] == golden["agent_tool_names"]
    assert _sha256(_canonical(agent_tools)) == golden["agent_tools"]
    user_tools = environment.user_tools()
    assert [t["function"]["name"] for t in user_tools] == golden["user_tool_names"]
    first_task = next(iter(golden["tasks"].values()))
    expected_user = first_task["user_first_request"]["tools"]
    assert (_sha256(_canonical(user_tools)) if user_tools else None) == expected_user


@pytest.mark.parametrize("domain_name", ["retail", "telecom"])
def test_every_tasks_user_prompt_and_first_messages_match(
    domain_name: str, tau2_data_dir: Path
) -> None:
    """All 114 tasks per domain, built by the same functions the participants use (no HTTP)."""
    golden = GOLDEN["domains"][domain_name]
    domain = load_domain(domain_name, tau2_data_dir)
    environment = domain.new_environment()
    user_tools = environment.user_tools()
    guidelines = load_guidelines(tau2_data_dir, with_tools=bool(user_tools))
    agent_prompt = agent_system_prompt(domain.policy)
    greeting = AssistantMessage(content=GREETING)
    opening = UserMessage(content=SCRIPT["user_opening"])
    agent_messages = to_openai_messages(agent_prompt, [greeting, opening], speaker="assistant")
    agent_digest = _digests({"messages": agent_messages})["messages"]
    mismatches = []
    for task in domain.tasks("base"):
        system = user_system_prompt(guidelines, task.user_scenario)
        user_messages = to_openai_messages(system, [greeting], speaker="user")
        request = {"messages": user_messages, "tools": user_tools or None}
        user = _digests(request)
        want = golden["tasks"][task.id]
        got_user = {k: user[k] for k in ("system_prompt", "messages", "tools")}
        want_user = {
            k: want["user_first_request"][k] for k in ("system_prompt", "messages", "tools")
        }
        if got_user != want_user or agent_digest != want["agent_first_request_messages"]:
            mismatches.append(task.id)
    assert mismatches == []


@pytest.mark.parametrize("domain_name", ["retail", "telecom"])
async def test_wire_bodies_match_tau2_v1_0_1_through_litellm(
    domain_name: str, tau2_data_dir: Path, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """Four whole request bodies, with an agent tool call and its result in the later ones."""
    wire = GOLDEN["wire"][domain_name]
    domain = load_domain(domain_name, tau2_data_dir)
    task = next(t for t in domain.tasks("base") if t.id == wire["task_id"])
    for answer in wire["script"]:
        calls = answer.get("tool_calls")
        upstream.push(completion(content=answer["content"], tool_calls=calls))
    agent_model = ModelConfig(
        model="golden-agent", base_url=upstream.base_url, temperature=SCRIPT["temperature"]
    )
    user_model = ModelConfig(
        model="golden-user", base_url=upstream.base_url, temperature=SCRIPT["temperature"]
    )
    before = len(upstream.chat_requests)
    async with openai.AsyncOpenAI(base_url=upstream.base_url, api_key="x", max_retries=0) as c:
        episode = await run_episode(
            domain=domain,
            task=task,
            make_agent=lambda ctx: LLMAgent(c, agent_model, ctx),
            make_user=lambda ctx: LLMUserSimulator(
                c,
                user_model,
                load_guidelines(tau2_data_dir, with_tools=bool(ctx.user_tools)),
                ctx,
            ),
            config=OrchestratorConfig(),
            seed=SCRIPT["seed"],
        )
    assert episode.run.termination_reason == "user_stop"
    bodies = upstream.chat_requests[before:]
    assert [b["model"] for b in bodies] == wire["models"]
    digests = [_sha256(_canonical(body)) for body in bodies]
    if digests != wire["bodies"]:  # leave the bodies for a side-by-side read with make_golden's
        (tmp_path / "ours.json").write_text(json.dumps(bodies, indent=1))
    assert digests == wire["bodies"], f"see {tmp_path / 'ours.json'}"


def test_nl_judge_prompts_match_tau2_v1_0_1() -> None:
    golden = GOLDEN["nl_judge"]
    roles = {"assistant": AssistantMessage, "user": UserMessage}
    conversation = [
        ToolMessage(id="t", content=text) if role == "tool" else roles[role](content=text)
        for role, text in golden["conversation"]
    ]
    system, user = judge_messages(conversation, golden["assertions"])
    assert _sha256(system["content"]) == golden["system_prompt"]
    assert _sha256(user["content"]) == golden["user_prompt"]
