"""The proxy in front of the embedded real model, through the official openai client.

This model usually writes its call as bare JSON in the text, which vLLM's hermes parser (and our
server) leaves in the content: the proxy classifies it ``tool_call_in_content``. With repair off the
client gets that answer as is; in constrained mode the proxy re-asks and then forces the intended
tool (named ``tool_choice`` -> grammar), and a validated call comes back. Skipped unless the model
is fetched and llama-cpp-python is installed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from repairproxy.validation import Channel, ToolsCache
from tests.local.model_fixtures import embedded_upstream, requires_model
from tests.local.retail_tools import RETAIL_SYSTEM, RETAIL_TOOLS

pytestmark = [pytest.mark.model, requires_model]

__all__ = ["embedded_upstream"]

DECLARED = {t["function"]["name"] for t in RETAIL_TOOLS}
REQUEST = {
    "messages": [
        {"role": "system", "content": RETAIL_SYSTEM},
        # Asks for the lookup outright: with the repair instruction after the tools block (the
        # embedded server's rendering), "I need help with an order" drew a text-only reply.
        {"role": "user", "content": "Look up my user id please. My email is ava.li@example.com."},
    ],
    "tools": RETAIL_TOOLS,
}


@pytest.fixture(scope="module")
def proxy_url(embedded_upstream: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "repairproxy", "serve", "--upstream", embedded_upstream]
    command += ["--port", str(port), "--repair", "constrained", "--max-repairs", "2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)
        if process.stderr:
            process.stderr.close()


@pytest.fixture(scope="module")
def client(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def _ask(client: openai.OpenAI, mode: str) -> tuple[httpx.Headers, dict[str, Any]]:
    raw = client.chat.completions.with_raw_response.create(
        model="local",
        temperature=0,
        seed=1,
        max_tokens=80,
        extra_headers={"X-Repairproxy-Repair": mode},
        **REQUEST,
    )
    return raw.headers, raw.parse().choices[0].message.model_dump(exclude_none=True)


def _channels(message: dict[str, Any]) -> list[Channel]:
    compiled = ToolsCache().compile(REQUEST)
    assert compiled is not None
    return [v.channel for v in compiled.check_message(message).calls]


def test_with_repair_off_the_failure_reaches_the_client_and_is_reported(
    client: openai.OpenAI,
) -> None:
    headers, message = _ask(client, "off")
    caught = [c for c in headers["x-repairproxy-tool-errors"].split(",") if c]
    assert caught, f"the model answered validly this time: {message!r}"
    assert caught == [str(c) for c in _channels(message)]  # the header tells the truth
    assert headers["x-repairproxy-repairs"] == "0"


def test_constrained_repair_round_trip_returns_a_validated_call(client: openai.OpenAI) -> None:
    headers, message = _ask(client, "constrained")
    assert _channels(message) == [Channel.VALID]
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "find_user_id_by_email"
    assert json.loads(call["function"]["arguments"]) == {"email": "ava.li@example.com"}
    # Fixed on the real model: promoted from its text (no re-ask), or re-asked.
    fixed = int(headers.get("x-repairproxy-promoted", "0")) + int(headers["x-repairproxy-repairs"])
    assert fixed >= 1
    assert headers["x-repairproxy-tool-errors"]  # what it caught on the way is reported


def test_a_structured_output_verdict_on_the_real_model_is_what_the_client_got(
    client: openai.OpenAI,
) -> None:
    """A ``response_format`` json_schema answer from the real model, re-asked (reflexive): the
    headers count every attempt that failed, the last one included exactly when the client got
    an answer that does not match the schema, and nothing is charged to the error budget."""
    from pydantic import BaseModel, ValidationError

    class Person(BaseModel):
        name: str
        age: int

    raw = client.chat.completions.with_raw_response.create(
        model="local",
        temperature=0,
        seed=1,
        max_tokens=100,
        messages=[{"role": "user", "content": "Ada Lovelace was 36. Give her name and age."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": Person.model_json_schema()},
        },
        extra_headers={"X-Repairproxy-Repair": "reflexive"},
    )
    headers = raw.headers
    content = raw.parse().choices[0].message.content or ""
    errors = [c for c in headers["x-repairproxy-output-errors"].split(",") if c]
    repairs = int(headers["x-repairproxy-output-repairs"])
    assert int(headers["x-repairproxy-upstream-calls"]) == repairs + 1
    try:
        Person.model_validate_json(content)
    except ValidationError:
        assert repairs == 2, headers  # --max-repairs 2, all spent
        assert len(errors) == repairs + 1, headers
    else:
        assert len(errors) == repairs, headers
    assert headers["x-repairproxy-episode-errors"] == "0"  # never charged to the error budget
