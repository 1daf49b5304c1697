"""Reflexive repair and the per-episode error budget, end to end through the openai client.

In process (the app under httpx's ASGI transport, the upstream a ``MockTransport``): these test
what the proxy decides, not the HTTP layer, which the conformance and fault tests cover on
loopback."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.proxy.conftest import StartInProcess
from tests.support.in_process import InProcessProxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

GOOD = {"order_id": "#W1"}
pytestmark = pytest.mark.anyio


async def _create(proxy: InProcessProxy, **kwargs: Any) -> Any:
    return await proxy.client().chat.completions.with_raw_response.create(
        model="scripted-model", messages=kwargs.pop("messages", MESSAGES), tools=TOOLS, **kwargs
    )


async def _collect_stream(chunks: Any) -> tuple[str, dict[int, dict[str, str]], str | None, Any]:
    content, calls, finish, usage = "", {}, None, None
    async for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += part.id or ""
                if part.function is not None:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, calls, finish, usage


async def test_hallucinated_name_repaired_on_first_attempt(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    bad = tool_call("get_order_status", GOOD, call_id="call_bad")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    transport.push(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    raw = await _create(proxy)
    message = raw.parse().choices[0].message
    assert [(c.id, c.function.name) for c in message.tool_calls] == [
        ("call_good", "get_order_details")
    ]
    assert raw.headers["x-repairproxy-repairs"] == "1"
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.parse().usage.total_tokens == 36  # both attempts
    first, second = transport.chat_requests
    assert "re-issue a valid call" in first["messages"][0]["content"]  # the reflexive instruction
    assistant, diagnosis = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "get_order_status"
    assert diagnosis["role"] == "tool" and diagnosis["tool_call_id"] == "call_bad"
    assert "get_order_details" in diagnosis["content"]


async def test_schema_violation_repaired(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    bad = tool_call("exchange_items", {"order_id": "#W1", "item_ids": "42"})
    good = tool_call("exchange_items", {"order_id": "#W1", "item_ids": ["42"]})
    transport.push(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    raw = await _create(proxy)
    call = raw.parse().choices[0].message.tool_calls[0]
    assert orjson.loads(call.function.arguments) == {"order_id": "#W1", "item_ids": ["42"]}
    assert raw.headers["x-repairproxy-tool-errors"] == "schema_violation"
    diagnosis = transport.chat_requests[1]["messages"][-1]["content"]
    assert "item_ids" in diagnosis


async def test_valid_calls_in_a_broken_turn_are_kept(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    kept = tool_call("find_user_id_by_email", {"email": "a@b.c"}, call_id="call_kept")
    bad = tool_call("get_order_details", "{oops", call_id="call_broken")
    fixed = tool_call("get_order_details", GOOD, call_id="call_fixed")
    transport.push(completion(tool_calls=[kept, bad]), completion(tool_calls=[fixed]))
    calls = (await _create(proxy)).parse().choices[0].message.tool_calls
    assert [c.id for c in calls] == ["call_kept", "call_fixed"]


@pytest.mark.parametrize("policy", ["pass", "strip", "error"])
async def test_exhaustion_policies(
    policy: str, transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive", max_repairs=2, on_exhausted=policy)
    answers = [completion(tool_calls=[tool_call(f"no_such_tool_{i}", GOOD)]) for i in range(3)]
    transport.push(*answers)
    if policy == "error":
        with pytest.raises(openai.APIStatusError) as caught:
            await _create(proxy)
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "repair_exhausted"  # type: ignore[index]
        assert len(transport.chat_requests) == 3
        return
    raw = await _create(proxy)
    assert raw.headers["x-repairproxy-repairs"] == "2"
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"  # each channel once
    choice = raw.parse().choices[0]
    if policy == "pass":
        assert choice.message.tool_calls[0].function.name == "no_such_tool_2"
    else:
        assert not choice.message.tool_calls
        assert choice.finish_reason == "stop"
    assert len(transport.script) == 0


async def test_constrained_escalation_names_the_tool_on_attempt_two(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="constrained", max_repairs=2)
    transport.push(
        completion(tool_calls=[tool_call("get_order_detail", GOOD)]),
        completion(tool_calls=[tool_call("get_order_detials", GOOD)]),
        completion(tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    raw = await _create(proxy)
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_order_details"
    first, attempt1, attempt2 = transport.chat_requests
    assert "tool_choice" not in first and "tool_choice" not in attempt1
    assert attempt2["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_order_details"},
    }


async def test_streaming_repair_yields_a_parseable_valid_call(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    transport.push(
        completion(tool_calls=[tool_call("get_order_status", GOOD)]),
        completion(tool_calls=[good]),
    )
    async with proxy.client().chat.completions.with_streaming_response.create(
        model="scripted-model",
        messages=MESSAGES,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        headers = raw.headers
        content, calls, finish, usage = await _collect_stream(await raw.parse())
    assert calls == {
        0: {"id": "call_good", "name": "get_order_details", "arguments": '{"order_id":"#W1"}'}
    }
    assert (content, finish) == ("", "tool_calls")
    assert usage.total_tokens == 36
    assert headers["x-repairproxy-repairs"] == "1"
    assert headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert transport.chat_requests[0]["stream"] is True
    assert transport.chat_requests[1]["stream"] is False


async def test_streaming_repair_of_a_call_written_as_text(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    text = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    transport.push(
        completion(content=text), completion(tool_calls=[tool_call("get_order_details", GOOD)])
    )
    stream = await proxy.client().chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, stream=True
    )
    content, calls, finish, _ = await _collect_stream(stream)
    assert content == ""  # the call-shaped text was held back, never shown
    assert calls[0]["name"] == "get_order_details"
    assert finish == "tool_calls"


async def test_override_headers_select_mode_and_budget(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive", budget=10)
    bad = completion(tool_calls=[tool_call("get_order_status", GOOD)])
    transport.push(bad)
    raw = await _create(
        proxy, extra_headers={"X-Repairproxy-Repair": "off", "X-Repairproxy-Budget": "3"}
    )
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_order_status"
    assert raw.headers["x-repairproxy-repairs"] == "0"
    assert raw.headers["x-repairproxy-budget-remaining"] == "2"
    assert len(transport.chat_requests) == 1
    assert transport.chat_requests[0]["messages"] == MESSAGES  # off: no instruction added
    transport.push(bad)
    raw = await _create(proxy, extra_headers={"X-Repairproxy-Repair": "prompt"})
    assert raw.headers["x-repairproxy-repairs"] == "0"  # prompt: instruction only, no re-ask
    assert "re-issue a valid call" in transport.chat_requests[1]["messages"][0]["content"]
    for header in ("x-repairproxy-repair", "x-repairproxy-budget"):
        assert header not in transport.requests[-1].headers


async def test_two_interleaved_episodes_keep_separate_budgets(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="off", budget=5)
    seen: dict[str, list[str]] = {"A": [], "B": []}
    for _ in range(3):
        for episode in ("A", "B"):
            name = "get_order_status" if episode == "A" else "get_order_details"
            transport.push(completion(tool_calls=[tool_call(name, GOOD)]))
            raw = await _create(proxy, extra_headers={"X-Episode-ID": episode})
            seen[episode].append(raw.headers["x-repairproxy-episode-errors"])
            assert raw.headers["x-repairproxy-episode-id"] == episode
    assert seen == {"A": ["1", "2", "3"], "B": ["0", "0", "0"]}
    transport.push(completion(content="hi"))
    raw = await _create(proxy, extra_headers={"X-Episode-ID": "A"})
    assert raw.headers["x-repairproxy-budget-remaining"] == "2"


async def test_budget_exhausted_reject_refuses_the_episode(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="off", budget=1, on_budget_exhausted="reject")
    transport.push(completion(tool_calls=[tool_call("get_order_status", GOOD)]))
    raw = await _create(proxy, extra_headers={"X-Episode-ID": "ep"})
    assert raw.headers["x-repairproxy-budget-remaining"] == "0"
    assert raw.headers["x-repairproxy-budget-exhausted"] == "true"
    # 403, not 429: the openai SDK retries 429.
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await _create(proxy, extra_headers={"X-Episode-ID": "ep"})
    assert caught.value.body["code"] == "error_budget_exhausted"  # type: ignore[index]
    assert len(transport.chat_requests) == 1
    transport.push(completion(content="fine"))
    raw = await _create(proxy, extra_headers={"X-Episode-ID": "other"})
    assert raw.headers["x-repairproxy-episode-errors"] == "0"


# --- a 12-turn episode replayed against a τ²-bench-like environment --------------------------

_ORDERS = {"#W1": {"status": "delivered"}, "#W2": {"status": "pending"}}


def _execute(call: dict[str, Any]) -> tuple[str, bool]:
    """What τ²-bench's environment answers: errors are ``Error: ...`` and cost one unit each."""
    name = call["function"]["name"]
    args = orjson.loads(call["function"]["arguments"])
    if name not in {t["function"]["name"] for t in TOOLS}:
        return f"Error: Tool '{name}' not found.", True
    required = {
        "get_order_details": {"order_id"},
        "exchange_items": {"order_id", "item_ids"},
        "find_user_id_by_email": {"email"},
    }[name]
    missing = sorted(required - set(args))
    if missing:
        return f"Error: {name}() missing 1 required positional argument: '{missing[0]}'", True
    if "order_id" in args and args["order_id"] not in _ORDERS:
        return "Error: Order not found", True
    return orjson.dumps({"ok": True, **args}).decode(), False


def _episode_script() -> list[list[dict[str, Any]] | str]:
    """Twelve agent turns: tool-call lists, or a text reply."""
    return [
        [tool_call("get_order_details", GOOD)],
        [tool_call("cancel_order", GOOD)],  # hallucinated
        [tool_call("get_order_details", {"order_id": "#W404"})],  # entity not found
        [tool_call("find_user_id_by_email", {"email": "a@b.c"})],
        [tool_call("exchange_items", {"order_id": "#W1"})],  # missing required argument
        [tool_call("get_order_details", {"order_id": "#W2"}), tool_call("track_package", GOOD)],
        "Could you confirm the item to exchange?",
        [tool_call("exchange_items", {"order_id": "#W1", "item_ids": ["9"]})],
        [tool_call("get_order_details", {"order_id": "#W999"})],  # entity not found
        [tool_call("refund", GOOD)],  # hallucinated
        [tool_call("get_order_details", {"order_id": "#W2"})],
        "All done: your exchange is on its way.",
    ]


async def test_twelve_turn_episode_counts_what_tau2_bench_counts(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="off", budget=10)
    history: list[dict[str, Any]] = list(MESSAGES)
    tau2_errors = 0
    header_errors: list[int] = []
    for turn in _episode_script():
        reply = completion(content=turn) if isinstance(turn, str) else completion(tool_calls=turn)
        transport.push(reply)
        response = await proxy.http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": history, "tools": TOOLS},
            headers={"X-Episode-ID": "tau2-replay"},
        )
        assert response.status_code == 200
        header_errors.append(int(response.headers["x-repairproxy-episode-errors"]))
        message = response.json()["choices"][0]["message"]
        history.append(message)
        if isinstance(turn, str):
            history.append({"role": "user", "content": "Yes, please go ahead."})
            continue
        for call in message["tool_calls"]:
            content, failed = _execute(call)
            tau2_errors += failed
            history.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    assert tau2_errors == 6
    # The last answer is a text reply; every tool result before it has been seen by the proxy.
    assert header_errors[-1] == tau2_errors
    assert header_errors == sorted(header_errors)  # resent history never counts twice
    assert int(response.headers["x-repairproxy-budget-remaining"]) == 10 - tau2_errors


SEND_EMAIL = (
    '{"name": "send_email", "arguments": {"to": "bob@example.com", '
    '"body": "Your refund is on its way."}}'
)
EMAIL = [{"role": "user", "content": "Send an email to bob@example.com: his refund is on its way."}]


async def test_a_refused_re_ask_is_reported_as_withheld_with_the_delivered_channels(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    """The proxy refuses a re-ask's made-up call and delivers the answer it held: the headers say
    it was the proxy's decision ("withheld"), not a fix the model failed, and which channels the
    delivered answer still has (what evals' answer_facts reads as delivered_tool_errors)."""
    proxy = await start_in_process(repair="reflexive")
    made_up = completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W0000000"})])
    transport.push(completion(content=SEND_EMAIL), made_up, made_up)
    raw = await _create(proxy, messages=EMAIL)
    message = raw.parse().choices[0].message
    assert not message.tool_calls and message.content == SEND_EMAIL
    assert raw.headers["x-repairproxy-repair-result"] == "withheld"
    assert raw.headers["x-repairproxy-delivered-tool-errors"] == "tool_call_in_content"
    assert raw.headers["x-repairproxy-first-tool-errors"] == "tool_call_in_content"
    assert raw.headers["x-repairproxy-first-tool-calls"] == "1"  # the text call, counted


async def test_a_fixed_answer_reports_no_delivered_channels(
    transport: MockTransport, start_in_process: StartInProcess
) -> None:
    proxy = await start_in_process(repair="reflexive")
    bad = tool_call("get_order_status", GOOD, call_id="call_bad")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    transport.push(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    raw = await _create(proxy)
    assert raw.headers["x-repairproxy-repair-result"] == "fixed"
    assert raw.headers["x-repairproxy-delivered-tool-errors"] == ""
    assert raw.headers["x-repairproxy-first-tool-calls"] == "1"
    off = await start_in_process(repair="off")
    transport.push(completion(tool_calls=[bad]))
    raw = await _create(off)
    assert raw.headers["x-repairproxy-delivered-tool-errors"] == "unknown_tool"
    assert "x-repairproxy-repair-result" not in raw.headers


def test_the_log_record_carries_the_repair_result_and_the_delivered_channels() -> None:
    from repairproxy.asgi.exchange import Exchange
    from repairproxy.observe.record import RepairResult, RepairResultKind

    exchange = Exchange(0.0, "POST", "/v1/chat/completions")
    exchange.record.repair_results = [RepairResult("unknown_tool", RepairResultKind.WITHHELD)]
    exchange.record.delivered_channels = ("tool_call_in_content",)
    event = orjson.loads(orjson.dumps(exchange.log_event(200, log_bodies=False)))
    assert event["repair_result"] == "withheld"
    assert event["delivered_channels"] == ["tool_call_in_content"]
    assert b"repair-result=withheld" in exchange.trailer_comment()
