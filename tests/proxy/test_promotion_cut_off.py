"""An answer cut off by the token limit (``finish_reason: "length"``) promotes nothing.

The model stopped because it ran out of tokens, not because it had finished: whatever call shape
its text ends with may be the start of something else (a listing, an example, a sentence that
would have declined it). Its call shapes are *not a call* (``NotACall.CUT_OFF``): delivered as
text, no re-ask, not a failure; buffered and streamed alike. The same text with
``finish_reason: "stop"`` is promoted (the control).
"""

from __future__ import annotations

from typing import Any

import pytest

from repairproxy.settings import Settings
from repairproxy.textcalls import NotACall, read_text_calls, stopped_by_length
from repairproxy.types import RepairMode
from repairproxy.validation import CallRules, ToolsCache
from tests.proxy.test_promotion_safety import TOOLS, _ask
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion

pytestmark = pytest.mark.anyio

TEXT = 'Let me look that up.\n{"name": "get_order_details", "arguments": {"order_id": "W1"}}'
CASE: dict[str, Any] = {
    "request": {"tools": TOOLS},
    "messages": [{"role": "user", "content": "Where is my order W1?"}],
}


def test_a_cut_off_reading_holds_no_candidate() -> None:
    reading = read_text_calls(TEXT, cut_off=True)
    assert reading.calls == ()
    assert [reason for _, reason in reading.prose] == [NotACall.CUT_OFF]
    assert len(read_text_calls(TEXT).calls) == 1  # the control: the same text, finished


def test_stopped_by_length_reads_a_completion_or_a_choice() -> None:
    cut = {"index": 0, "message": {"content": TEXT}, "finish_reason": "length"}
    assert stopped_by_length(cut)
    assert stopped_by_length({"choices": [cut]})
    assert not stopped_by_length({**cut, "finish_reason": "stop"})
    assert not stopped_by_length({"choices": []})
    assert not stopped_by_length(None)


def test_the_verdict_of_a_cut_off_answer_catches_nothing() -> None:
    tools = ToolsCache().compile({"tools": TOOLS})
    assert tools is not None
    message = {"role": "assistant", "content": TEXT}
    rules = CallRules.of_request(CASE["request"])
    assert tools.check_message(message, rules=rules, cut_off=True).calls == ()
    assert len(tools.check_message(message, rules=rules).calls) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("mode", [RepairMode.PROMOTE, RepairMode.REFLEXIVE])
async def test_a_call_cut_off_by_the_token_limit_is_delivered_as_text(
    stream: bool, mode: RepairMode
) -> None:
    transport = MockTransport(completion(content=TEXT, finish_reason="length"))
    settings = Settings(upstream="http://mock/v1", repair=mode)
    async with in_process_proxy(settings, transport) as proxy:
        got = await _ask(proxy, CASE, stream)
    assert got == {"content": TEXT, "calls": [], "channels": []}
    assert len(transport.chat_requests) == 1  # not re-asked


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_the_same_call_finished_is_promoted(stream: bool) -> None:
    transport = MockTransport(completion(content=TEXT, finish_reason="stop"))
    settings = Settings(upstream="http://mock/v1", repair=RepairMode.PROMOTE)
    async with in_process_proxy(settings, transport) as proxy:
        got = await _ask(proxy, CASE, stream)
    assert got["calls"] == [("get_order_details", {"order_id": "W1"})]
    assert got["channels"] == ["tool_call_in_content"]
