"""Reflexive repair and the per-episode error budget, end to end through the openai client."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.proxy.conftest import StartProxy
from tests.proxy.test_proxy_openai import _collect_stream
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

GOOD = {"order_id": "#W1"}


def _client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)


def _create(proxy: RunningProxy, **kwargs: Any) -> Any:
    with _client(proxy) as client:
        return client.chat.completions.with_raw_response.create(
            model="scripted-model", messages=kwargs.pop("messages", MESSAGES), tools=TOOLS, **kwargs
        )


def test_hallucinated_name_repaired_on_first_attempt(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive")
    bad = tool_call("get_order_status", GOOD, call_id="call_bad")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    upstream.push(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    raw = _create(proxy)
    message = raw.parse().choices[0].message
    assert [(c.id, c.function.name) for c in message.tool_calls] == [
        ("call_good", "get_order_details")
    ]
    assert raw.headers["x-repairproxy-repairs"] == "1"
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert raw.parse().usage.total_tokens == 36  # both attempts
    first, second = upstream.chat_requests
    assert "re-issue a valid call" in first["messages"][0]["content"]  # the reflexive instruction
    assistant, diagnosis = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "get_order_status"
    assert diagnosis["role"] == "tool" and diagnosis["tool_call_id"] == "call_bad"
    assert "get_order_details" in diagnosis["content"]


def test_schema_violation_repaired(upstream: ScriptedUpstream, start_proxy: StartProxy) -> None:
    proxy = start_proxy(repair="reflexive")
    bad = tool_call("exchange_items", {"order_id": "#W1", "item_ids": "42"})
    good = tool_call("exchange_items", {"order_id": "#W1", "item_ids": ["42"]})
    upstream.push(completion(tool_calls=[bad]), completion(tool_calls=[good]))
    raw = _create(proxy)
    call = raw.parse().choices[0].message.tool_calls[0]
    assert orjson.loads(call.function.arguments) == {"order_id": "#W1", "item_ids": ["42"]}
    assert raw.headers["x-repairproxy-tool-errors"] == "schema_violation"
    diagnosis = upstream.chat_requests[1]["messages"][-1]["content"]
    assert "item_ids" in diagnosis


def test_valid_calls_in_a_broken_turn_are_kept(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive")
    kept = tool_call("find_user_id_by_email", {"email": "a@b.c"}, call_id="call_kept")
    bad = tool_call("get_order_details", "{oops", call_id="call_broken")
    fixed = tool_call("get_order_details", GOOD, call_id="call_fixed")
    upstream.push(completion(tool_calls=[kept, bad]), completion(tool_calls=[fixed]))
    calls = _create(proxy).parse().choices[0].message.tool_calls
    assert [c.id for c in calls] == ["call_kept", "call_fixed"]


@pytest.mark.parametrize("policy", ["pass", "strip", "error"])
def test_exhaustion_policies(
    policy: str, upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive", max_repairs=2, on_exhausted=policy)
    answers = [completion(tool_calls=[tool_call(f"no_such_tool_{i}", GOOD)]) for i in range(3)]
    upstream.push(*answers)
    if policy == "error":
        with pytest.raises(openai.APIStatusError) as caught:
            _create(proxy)
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "repair_exhausted"  # type: ignore[index]
        assert len(upstream.chat_requests) == 3
        return
    raw = _create(proxy)
    assert raw.headers["x-repairproxy-repairs"] == "2"
    assert raw.headers["x-repairproxy-tool-errors"] == "unknown_tool,unknown_tool,unknown_tool"
    choice = raw.parse().choices[0]
    if policy == "pass":
        assert choice.message.tool_calls[0].function.name == "no_such_tool_2"
    else:
        assert not choice.message.tool_calls
        assert choice.finish_reason == "stop"
    assert upstream.pending == 0


def test_constrained_escalation_names_the_tool_on_attempt_two(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="constrained", max_repairs=2)
    upstream.push(
        completion(tool_calls=[tool_call("get_order_detail", GOOD)]),
        completion(tool_calls=[tool_call("get_order_detials", GOOD)]),
        completion(tool_calls=[tool_call("get_order_details", GOOD)]),
    )
    raw = _create(proxy)
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_order_details"
    first, attempt1, attempt2 = upstream.chat_requests
    assert "tool_choice" not in first and "tool_choice" not in attempt1
    assert attempt2["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_order_details"},
    }


def test_streaming_repair_yields_a_parseable_valid_call(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    upstream.push(
        completion(tool_calls=[tool_call("get_order_status", GOOD)]),
        completion(tool_calls=[good]),
    )
    with (
        _client(proxy) as client,
        client.chat.completions.with_streaming_response.create(
            model="scripted-model",
            messages=MESSAGES,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        ) as raw,
    ):
        headers = raw.headers
        content, calls, finish, usage = _collect_stream(raw.parse())
    assert calls == {
        0: {"id": "call_good", "name": "get_order_details", "arguments": '{"order_id":"#W1"}'}
    }
    assert (content, finish) == ("", "tool_calls")
    assert usage.total_tokens == 36
    assert headers["x-repairproxy-repairs"] == "1"
    assert headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert upstream.chat_requests[0]["stream"] is True
    assert upstream.chat_requests[1]["stream"] is False


def test_streaming_repair_of_a_call_written_as_text(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive")
    text = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    upstream.push(
        completion(content=text), completion(tool_calls=[tool_call("get_order_details", GOOD)])
    )
    with _client(proxy) as client:
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, tools=TOOLS, stream=True
        )
        content, calls, finish, _ = _collect_stream(stream)
    assert content == ""  # the call-shaped text was held back, never shown
    assert calls[0]["name"] == "get_order_details"
    assert finish == "tool_calls"


def test_override_headers_select_mode_and_budget(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="reflexive", budget=10)
    bad = completion(tool_calls=[tool_call("get_order_status", GOOD)])
    upstream.push(bad)
    raw = _create(proxy, extra_headers={"X-Repairproxy-Repair": "off", "X-Repairproxy-Budget": "3"})
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_order_status"
    assert raw.headers["x-repairproxy-repairs"] == "0"
    assert raw.headers["x-repairproxy-budget-remaining"] == "2"
    assert len(upstream.chat_requests) == 1
    assert upstream.chat_requests[0]["messages"] == MESSAGES  # off: no instruction added
    upstream.push(bad)
    raw = _create(proxy, extra_headers={"X-Repairproxy-Repair": "prompt"})
    assert raw.headers["x-repairproxy-repairs"] == "0"  # prompt: instruction only, no re-ask
    assert "re-issue a valid call" in upstream.chat_requests[1]["messages"][0]["content"]
    for header in ("x-repairproxy-repair", "x-repairproxy-budget"):
        assert header not in upstream.requests[-1].headers


def test_two_interleaved_episodes_keep_separate_budgets(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="off", budget=5)
    seen: dict[str, list[str]] = {"A": [], "B": []}
    for _ in range(3):
        for episode in ("A", "B"):
            name = "get_order_status" if episode == "A" else "get_order_details"
            upstream.push(completion(tool_calls=[tool_call(name, GOOD)]))
            raw = _create(proxy, extra_headers={"X-Episode-ID": episode})
            seen[episode].append(raw.headers["x-repairproxy-episode-errors"])
            assert raw.headers["x-repairproxy-episode-id"] == episode
    assert seen == {"A": ["1", "2", "3"], "B": ["0", "0", "0"]}
    upstream.push(completion(content="hi"))
    raw = _create(proxy, extra_headers={"X-Episode-ID": "A"})
    assert raw.headers["x-repairproxy-budget-remaining"] == "2"


def test_budget_exhausted_reject_refuses_the_episode(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="off", budget=1, on_budget_exhausted="reject")
    upstream.push(completion(tool_calls=[tool_call("get_order_status", GOOD)]))
    raw = _create(proxy, extra_headers={"X-Episode-ID": "ep"})
    assert raw.headers["x-repairproxy-budget-remaining"] == "0"
    assert raw.headers["x-repairproxy-budget-exhausted"] == "true"
    # 403, not 429: the openai SDK retries 429.
    with pytest.raises(openai.PermissionDeniedError) as caught:
        _create(proxy, extra_headers={"X-Episode-ID": "ep"})
    assert caught.value.body["code"] == "error_budget_exhausted"  # type: ignore[index]
    assert len(upstream.chat_requests) == 1
    upstream.push(completion(content="fine"))
    assert (
        _create(proxy, extra_headers={"X-Episode-ID": "other"}).headers[
            "x-repairproxy-episode-errors"
        ]
        == "0"
    )


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


def test_twelve_turn_episode_counts_what_tau2_bench_counts(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(repair="off", budget=10)
    history: list[dict[str, Any]] = list(MESSAGES)
    tau2_errors = 0
    header_errors: list[int] = []
    with httpx.Client(base_url=proxy.base_url) as client:
        for turn in _episode_script():
            reply = (
                completion(content=turn) if isinstance(turn, str) else completion(tool_calls=turn)
            )
            upstream.push(reply)
            response = client.post(
                "/chat/completions",
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
