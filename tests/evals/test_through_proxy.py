"""One episode of the LLM agent through the real proxy (loopback) to a scripted upstream."""

from __future__ import annotations

import openai
import pytest

from evals.tau2.agents import LLMAgent, ModelConfig
from evals.tau2.orchestrator import OrchestratorConfig, run_episode
from evals.tau2.users import GoldUser
from tests.evals.fakes import CounterDomain, make_task
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

pytestmark = pytest.mark.anyio


async def test_every_agent_request_reaches_the_proxy_with_the_episode_id() -> None:
    settings_module = pytest.importorskip("repairproxy.settings")
    proxy_server = pytest.importorskip("tests.support.proxy_server")
    with (
        ScriptedUpstream() as upstream,
        proxy_server.running_proxy(settings_module.Settings(upstream=upstream.base_url)) as proxy,
    ):
        upstream.push(
            completion(tool_calls=[tool_call("add", {"amount": 2})]),
            completion(tool_calls=[tool_call("add", {"amount": 1})]),
            completion(content="Added 3 in total."),
        )
        model = ModelConfig(
            model="m", base_url=proxy.base_url, extra_headers={"X-Repairproxy-Repair": "off"}
        )
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0) as c:
            episode = await run_episode(
                domain=CounterDomain(),
                task=make_task(),
                make_agent=lambda ctx: LLMAgent(c, model, ctx),
                make_user=GoldUser,
                config=OrchestratorConfig(),
            )
        lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/chat/completions"]
        forwarded = [r.headers.get("x-episode-id") for r in upstream.requests]
    assert episode.run.termination_reason == "user_stop"
    assert episode.environment.total == 3
    assert [line["episode_id"] for line in lines] == [episode.run.id] * 3
    assert len(forwarded) == 3
    turns = [m for m in episode.run.messages if m.role == "assistant"][1:]  # after the greeting
    assert len(turns) == 3
    for turn in turns:
        assert turn.repairproxy is not None
        assert turn.repairproxy["episode_id"] == episode.run.id
        assert turn.repairproxy["tool_errors"] == []
        assert turn.repairproxy["repairs"] == 0
        assert isinstance(turn.repairproxy["overhead_ms"], float)
