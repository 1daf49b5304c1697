"""A repair re-ask that fails upstream never loses the model's answer.

Real proxy and scripted upstream on loopback: the first answer holds an invented tool name, the
re-ask fails (400 context length, 503, connection dropped); the client still gets the first answer,
whole and well-formed (buffered or streamed), with ``X-Repairproxy-Repair-Failed``.
"""

from __future__ import annotations

import openai
import pytest

from tests.proxy.conftest import StartProxy
from tests.support.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    completion,
    error_reply,
    tool_call,
)
from tests.support.tools import MESSAGES, TOOLS

FAILURES = {
    "400": [error_reply(400, "This model's maximum context length is 4096 tokens.")],
    "503": [error_reply(503, "overloaded", "server_error")],
    # A dropped keep-alive connection is retried once by the pool: drop both.
    "unavailable": [Reply(fault="close"), Reply(fault="close")],
}


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failed_re_ask_delivers_the_first_answer(
    upstream: ScriptedUpstream, start_proxy: StartProxy, failure: str, stream: bool
) -> None:
    proxy = start_proxy(repair="reflexive")
    upstream.push(
        completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"}, "call_a")]),
        *FAILURES[failure],
    )
    with openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
                tools=TOOLS,
                stream=True,
            )
            names = [
                part.function.name
                for chunk in raw.parse()
                for choice in chunk.choices
                for part in choice.delta.tool_calls or ()
                if part.function is not None and part.function.name
            ]
        else:
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
                tools=TOOLS,
            )
            message = raw.parse().choices[0].message
            names = [c.function.name for c in message.tool_calls or ()]
    assert names == ["get_order_status"]  # the model's own answer, delivered as it came
    assert raw.headers["x-repairproxy-repair-failed"] == failure
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert len(upstream.chat_requests) == 1 + len(FAILURES[failure])
