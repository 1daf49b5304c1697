"""Frameworks that ask for structured outputs, pointed at the proxy: pydantic-ai's native output
type (chat ``response_format``, and Responses ``text.format``) and instructor's JSON mode. The
upstream breaks the schema once; the framework, its own retries off, gets a valid object.

instructor pins ``jiter<0.15`` and an older openai than the project's, so it runs from its own
venv (``python -m venv ~/.cache/repairproxy/fw-venvs/instructor`` and ``pip install
instructor==1.17.0`` in it); the test skips when that venv is absent.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, message
from tests.support.scripted_upstream import ScriptedUpstream, completion

pydantic_ai = pytest.importorskip("pydantic_ai")

BAD = '{"name": "Ann", "age": "forty"}'
GOOD = '{"name": "Ann", "age": 40}'
INSTRUCTOR_VENV = (
    Path(os.environ.get("REPAIRPROXY_FW_VENVS", Path.home() / ".cache/repairproxy/fw-venvs"))
    / "instructor"
)
INSTRUCTOR_PYTHON = INSTRUCTOR_VENV / "bin/python"
INSTRUCTOR_INSTALLED = any(INSTRUCTOR_VENV.glob("lib/python*/site-packages/instructor"))


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture
def proxy(upstream: ScriptedUpstream) -> Iterator[RunningProxy]:
    with running_proxy(Settings(upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)) as run:
        yield run


def _output_lines(proxy: RunningProxy) -> list[object]:
    return [line.get("output_errors") for line in proxy.log_lines() if line.get("path")]


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_pydantic_ai_native_output_chat(
    proxy: RunningProxy,
    upstream: ScriptedUpstream,
    streamed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic_ai import Agent, NativeOutput

    monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    upstream.push(completion(content=BAD), completion(content=GOOD))
    agent = Agent("openai-chat:scripted-model", output_type=NativeOutput(Person), retries=0)

    async def run() -> Person:
        async with agent:
            if streamed:
                async with agent.run_stream("Who is Ann?") as result:
                    return await result.get_output()
            return (await agent.run("Who is Ann?")).output

    assert asyncio.run(run()) == Person(name="Ann", age=40)
    assert upstream.chat_requests[0]["response_format"]["type"] == "json_schema"
    assert len(upstream.chat_requests) == 2  # one re-ask, none by pydantic-ai
    assert _output_lines(proxy) == [["output_schema_violation"]]


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_pydantic_ai_native_output_responses(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai import Agent, NativeOutput

    with ResponsesUpstream() as upstream:
        upstream.push([message(BAD)], [message(GOOD)])
        settings = Settings(upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)
        with running_proxy(settings) as proxy:
            monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "x")
            agent = Agent("openai:scripted-model", output_type=NativeOutput(Person), retries=0)
            assert asyncio.run(_agent_output(agent, streamed=streamed)) == Person(
                name="Ann", age=40
            )
            assert upstream.requests[0]["text"]["format"]["type"] == "json_schema"
            assert upstream.requests[0].get("stream", False) is streamed
            assert len(upstream.requests) == 2
            assert _output_lines(proxy) == [["output_schema_violation"]]


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_pydantic_ai_native_output_responses_on_a_chat_only_upstream(
    upstream: ScriptedUpstream, streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai's ``openai:`` (Responses) model against an upstream that serves chat only:
    ``text.format`` goes upstream as ``response_format`` and the answer is checked there."""
    from pydantic_ai import Agent, NativeOutput

    upstream.push(completion(content=BAD), completion(content=GOOD))
    settings = Settings(
        upstream=upstream.base_url, upstream_apis=("chat",), repair=RepairMode.REFLEXIVE
    )
    with running_proxy(settings) as proxy:
        monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "x")
        agent = Agent("openai:scripted-model", output_type=NativeOutput(Person), retries=0)
        assert asyncio.run(_agent_output(agent, streamed=streamed)) == Person(name="Ann", age=40)
        assert {r.path for r in upstream.requests} == {"/v1/chat/completions"}
        assert upstream.chat_requests[0]["response_format"]["type"] == "json_schema"
        assert upstream.chat_requests[0].get("stream", False) is streamed
        assert len(upstream.chat_requests) == 2
        assert _output_lines(proxy) == [["output_schema_violation"]]


async def _agent_output(agent: Any, *, streamed: bool) -> Any:
    async with agent:
        if streamed:
            async with agent.run_stream("Who is Ann?") as result:
                return await result.get_output()
        return (await agent.run("Who is Ann?")).output


_INSTRUCTOR_SCRIPT = """
import json, sys
import instructor, openai
from pydantic import BaseModel

class Person(BaseModel):
    name: str
    age: int

client = instructor.from_openai(
    openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0), mode=instructor.Mode.JSON
)
person = client.chat.completions.create(
    model="scripted-model",
    response_model=Person,
    max_retries=0,
    stream=sys.argv[2] == "stream",
    messages=[{"role": "user", "content": "Who is Ann?"}],
) if sys.argv[2] != "stream" else client.chat.completions.create_partial(
    model="scripted-model",
    response_model=Person,
    max_retries=0,
    messages=[{"role": "user", "content": "Who is Ann?"}],
)
if sys.argv[2] == "stream":
    last = None
    for last in person:
        pass
    person = last
print(json.dumps({"person": person.model_dump(), "version": instructor.__version__}))
"""


@pytest.mark.skipif(
    not INSTRUCTOR_INSTALLED,
    reason=f"instructor's venv is absent; make it: python3 -m venv {INSTRUCTOR_VENV} && "
    f"{INSTRUCTOR_VENV}/bin/pip install instructor==1.17.0",
)
@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_instructor_json_mode(
    proxy: RunningProxy, upstream: ScriptedUpstream, streamed: bool
) -> None:
    # Not JSON at all first (prose around it): json_object's channel; then valid.
    upstream.push(completion(content="Sure! Ann is forty."), completion(content=GOOD))
    done = subprocess.run(
        [
            str(INSTRUCTOR_PYTHON),
            "-c",
            _INSTRUCTOR_SCRIPT,
            proxy.base_url,
            "stream" if streamed else "whole",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["person"] == {"name": "Ann", "age": 40}
    assert upstream.chat_requests[0]["response_format"] == {"type": "json_object"}
    assert len(upstream.chat_requests) == 2
    assert _output_lines(proxy) == [["output_not_json"]]


DSPY_VENV = INSTRUCTOR_VENV.parent / "dspy"
DSPY_INSTALLED = any(DSPY_VENV.glob("lib/python*/site-packages/dspy"))


@pytest.mark.skipif(
    not DSPY_INSTALLED,
    reason=f"dspy's venv is absent; make it: python3 -m venv {DSPY_VENV} && "
    f"{DSPY_VENV}/bin/pip install dspy",
)
def test_dspy_json_adapter(proxy: RunningProxy, upstream: ScriptedUpstream) -> None:
    # dspy sends response_format only for a model litellm knows to support it (an unknown
    # name gets a prompt-only JSON request: nothing to validate).
    upstream.push(completion(content='{"age": "forty"}'), completion(content='{"age": 40}'))
    script = Path(__file__).resolve().parents[1] / "frameworks/agents/dspy_json.py"
    done = subprocess.run(
        [str(DSPY_VENV / "bin/python"), str(script), proxy.base_url, "openai/gpt-4o-mini"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = orjson.loads(done.stdout.rpartition("RESULT ")[2].splitlines()[0])
    assert result["age"] == 40
    assert upstream.chat_requests[0]["response_format"]["type"] == "json_schema"
    assert len(upstream.chat_requests) == 2
    assert _output_lines(proxy) == [["output_schema_violation"]]
