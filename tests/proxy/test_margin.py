"""The tool-name margin probe on vLLM-shaped answers and on the embedded server's answers."""

from __future__ import annotations

import copy
import threading
import urllib.request
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from repairproxy.local.engine import Generation, SamplingParams, TokenLogprob
from repairproxy.local.server import create_app
from repairproxy.margin import (
    PROBE_TOP_LOGPROBS,
    decision_offset,
    named_tool_name_margins,
    strip_probe,
    tool_name_margins,
    with_probe,
)
from repairproxy.settings import Settings
from tests.support.proxy_server import running_proxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream

TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_order_details", "parameters": {"type": "object"}},
    }
]


def entry(token: str, logprob: float, rivals: dict[str, float] | None = None) -> dict[str, Any]:
    """One logprobs.content entry as vLLM writes it: the chosen token is in its own top list."""
    top = {token: logprob, **(rivals or {})}
    ordered = sorted(top.items(), key=lambda item: -item[1])
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ordered
        ],
    }


def call(name: str, arguments: str = "{}") -> dict[str, Any]:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def vllm_answer(content: list[dict[str, Any]], calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "qwen",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
                "logprobs": {"content": content},
                "finish_reason": "tool_calls",
            }
        ],
    }


def hermes_tokens(name_pieces: list[dict[str, Any]], arguments: str = "{}") -> list[dict[str, Any]]:
    return [
        entry("<tool_call>", -0.01),
        entry("\n", -0.001),
        entry('{"', -0.002),
        entry("name", -0.0001),
        entry('":', -0.0001),
        entry(' "', -0.003),
        *name_pieces,
        entry('",', -0.001),
        entry(' "arguments": ' + arguments + "}", -0.2),
        entry("\n</tool_call>", -0.01),
    ]


def test_margin_of_the_first_name_token_is_exact() -> None:
    tokens = hermes_tokens(
        [entry("get", -0.125, {"find": -2.625, "cancel": -4.0}), entry("_order_details", -0.5)]
    )
    answer = vllm_answer(tokens, [call("get_order_details")])
    assert tool_name_margins(answer) == [2.5]


def test_two_calls_with_the_same_name_each_get_their_own_token() -> None:
    first = hermes_tokens([entry("get", -0.25, {"find": -1.25}), entry("_order_details", -0.1)])
    second = hermes_tokens([entry("get", -0.5, {"cancel": -0.75}), entry("_order_details", -0.1)])
    answer = vllm_answer(first + second, [call("get_order_details"), call("get_order_details")])
    assert tool_name_margins(answer) == [1.0, 0.25]


def test_a_sampled_runner_up_gives_a_negative_margin() -> None:
    tokens = hermes_tokens([entry("cancel", -1.5, {"get": -0.5}), entry("_order", -0.1)])
    assert tool_name_margins(vllm_answer(tokens, [call("cancel_order")])) == [-1.0]


def test_name_sharing_a_token_with_its_quote() -> None:
    tokens = [
        entry('{"name":', -0.1),
        entry(' "get', -0.0625, {' "find': -3.0625}),
        entry('_order_details", "arguments": {}}', -0.3),
    ]
    assert tool_name_margins(vllm_answer(tokens, [call("get_order_details")])) == [3.0]


RETAIL = ("get_order_details", "get_user_details", "get_product_details", "cancel_pending_order")


def test_the_margin_is_taken_where_the_name_leaves_the_nearest_declared_one() -> None:
    # "get" decides nothing between Retail's get_* tools; "_order" against "_user" does.
    tokens = hermes_tokens(
        [
            entry("get", -0.05, {"find": -0.15}),
            entry("_order", -0.25, {"_user": -2.25, "_product": -3.0}),
            entry("_details", -0.01, {"_status": -4.01}),
        ]
    )
    answer = vllm_answer(tokens, [call("get_order_details")])
    assert decision_offset("get_order_details", RETAIL) == len("get_")
    assert tool_name_margins(answer, RETAIL) == [2.0]
    assert tool_name_margins(answer) == [pytest.approx(0.1)]  # no tools known: the first token


def test_an_invented_name_is_measured_where_it_leaves_the_declared_name_it_resembles() -> None:
    tokens = hermes_tokens(
        [
            entry("get", -0.05, {"find": -0.15}),
            entry("_order", -0.05, {"_user": -3.05}),
            entry("_status", -0.5, {"_details": -0.75}),
        ]
    )
    answer = vllm_answer(tokens, [call("get_order_status")])
    assert decision_offset("get_order_status", RETAIL) == len("get_order_")
    assert named_tool_name_margins(answer, RETAIL) == [("get_order_status", 0.25)]


def test_a_name_that_a_declared_one_continues_is_decided_after_its_end() -> None:
    declared = ("get_order", "get_order_details")
    tokens = [
        entry('{"name": "', -0.01),
        entry("get_order", -0.1, {"get_user": -3.1}),
        entry('", "arguments": {}}', -0.5, {"_details": -1.5}),
    ]
    answer = vllm_answer(tokens, [call("get_order")])
    assert decision_offset("get_order", declared) == len("get_order")
    assert tool_name_margins(answer, declared) == [1.0]


def test_answers_without_logprobs_or_rivals_give_nothing() -> None:
    tokens = hermes_tokens([entry("get_order_details", -0.1)])
    answer = vllm_answer(tokens, [call("get_order_details")])
    assert tool_name_margins(answer) == []  # only the chosen token in its top list
    answer["choices"][0]["logprobs"] = None
    assert tool_name_margins(answer) == []
    assert tool_name_margins({"choices": []}) == []
    assert tool_name_margins({"error": {"message": "x"}}) == []
    unscored = vllm_answer([entry("Sure", -0.1, {"Ok": -1.0})], [call("get_order_details")])
    assert tool_name_margins(unscored) == []  # the call's tokens are not among the scored ones


def test_a_call_written_as_text_has_a_margin() -> None:
    tokens = [
        entry('{"', -0.01),
        entry("name", -0.001),
        entry('":', -0.001),
        entry(' "', -0.002),
        entry("get", -0.25, {"cancel": -0.5}),
        entry('_order_details", "arguments": {"order_id": "#W1"}}', -0.1),
    ]
    answer = vllm_answer(tokens, [])
    answer["choices"][0]["message"]["content"] = "".join(t["token"] for t in tokens)
    assert tool_name_margins(answer) == [0.25]
    answer["choices"][0]["message"]["content"] = "Your order is on its way."
    assert tool_name_margins(answer) == []  # prose: no call, no margin


def test_with_probe_adds_only_what_the_client_did_not_ask() -> None:
    body: dict[str, Any] = {"model": "m", "messages": [], "tools": TOOLS}
    probed, added = with_probe(body)
    assert added and probed["logprobs"] is True and probed["top_logprobs"] == PROBE_TOP_LOGPROBS
    assert "logprobs" not in body  # the client's body is not changed
    asked = {**body, "logprobs": True, "top_logprobs": 2}
    assert with_probe(asked) == (asked, False)
    no_tools = {"model": "m", "messages": []}
    assert with_probe(no_tools) == (no_tools, False)


def test_strip_probe_leaves_what_a_plain_answer_has() -> None:
    answer = vllm_answer(hermes_tokens([entry("get", -0.1, {"x": -1.0})]), [call("get")])
    stripped = strip_probe(answer)
    assert stripped["choices"][0]["logprobs"] is None
    assert stripped["choices"][0]["message"]["tool_calls"] == [call("get")]
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [{"delta": {}, "logprobs": {"content": []}}],
    }
    assert strip_probe(chunk)["choices"][0]["logprobs"] is None


class _Scored:
    """The embedded server's generate seam, producing hermes text with known logprobs."""

    PIECES = (
        "<tool_call>",
        '\n{"name": "',
        "get",
        "_order_details",
        '", "arguments": {}}',
        "\n</tool_call>",
    )

    def __call__(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        on_delta: Any = None,
        cancelled: threading.Event | None = None,
    ) -> Generation:
        logprobs = []
        for piece in self.PIECES:
            rivals: tuple[tuple[str, float, list[int]], ...] = ()
            chosen = -0.03125
            if piece == "get":
                rivals = (("get", chosen, list(b"get")), ("find", -1.53125, list(b"find")))
            logprobs.append(
                TokenLogprob(piece, chosen, list(piece.encode()), rivals[: params.top_logprobs])
            )
        return Generation(
            text="".join(self.PIECES),
            completion_tokens=len(self.PIECES),
            logprobs=logprobs if params.logprobs else [],
        )


@pytest.mark.anyio
async def test_embedded_server_answers_carry_the_margin() -> None:
    transport = httpx.ASGITransport(app=create_app(_Scored(), "local-model"))
    async with httpx.AsyncClient(transport=transport, base_url="http://local") as client:
        body, added = with_probe(
            {"model": "local-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
        )
        assert added
        reply = (await client.post("/v1/chat/completions", json=body)).json()
    assert (
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_order_details"
    )
    assert tool_name_margins(reply) == [1.5]
    assert strip_probe(reply)["choices"][0]["logprobs"] is None


def _margin_sum(root_url: str) -> tuple[float, float]:
    """(sum, count) of repairproxy_tool_name_margin, read from the proxy's /metrics."""
    with urllib.request.urlopen(f"{root_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("repairproxy_tool_name_margin_")
    }
    return values.get("repairproxy_tool_name_margin_sum", 0.0), values.get(
        "repairproxy_tool_name_margin_count", 0.0
    )


def test_margin_probe_through_the_proxy() -> None:
    tokens = hermes_tokens([entry("get", -0.125, {"find": -2.625}), entry("_order_details", -0.5)])
    answer = vllm_answer(tokens, [call("get_order_details", '{"order_id": "#W1"}')])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    with ScriptedUpstream() as upstream:
        settings = Settings(upstream=upstream.base_url, margin_probe=True)
        with running_proxy(settings) as proxy, httpx.Client(base_url=proxy.root_url) as client:
            upstream.push(Reply(body=copy.deepcopy(answer)))
            response = client.post("/v1/chat/completions", json=body)
            assert response.headers["x-repairproxy-tool-name-margins"] == "get_order_details=2.500"
            reply = response.json()
            sent = upstream.chat_requests[-1]
            assert sent["logprobs"] is True and sent["top_logprobs"] == PROBE_TOP_LOGPROBS
            assert reply["choices"][0]["logprobs"] is None  # what the client did not ask for
            assert _margin_sum(proxy.root_url) == (2.5, 1.0)
            upstream.push(Reply(body=copy.deepcopy(answer)))
            asked = {**body, "logprobs": True, "top_logprobs": 2}
            reply = client.post("/v1/chat/completions", json=asked).json()
            assert upstream.chat_requests[-1]["top_logprobs"] == 2
            assert reply["choices"][0]["logprobs"] == answer["choices"][0]["logprobs"]
            assert _margin_sum(proxy.root_url) == (5.0, 2.0)


def test_the_margin_header_names_each_call_and_measures_it_where_retail_names_part() -> None:
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in RETAIL
    ]
    tokens = hermes_tokens(
        [
            entry("get", -0.05, {"find": -0.15}),
            entry("_order", -0.25, {"_user": -2.25}),
            entry("_details", -0.01, {"_status": -4.01}),
        ]
    )
    answer = vllm_answer(tokens, [call("get_order_details", '{"order_id": "#W1"}')])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    with ScriptedUpstream() as upstream:
        settings = Settings(upstream=upstream.base_url, margin_probe=True)
        with running_proxy(settings) as proxy, httpx.Client(base_url=proxy.root_url) as client:
            upstream.push(Reply(body=copy.deepcopy(answer)))
            response = client.post("/v1/chat/completions", json=body)
            assert response.headers["x-repairproxy-tool-name-margins"] == "get_order_details=2.000"
        with running_proxy(Settings(upstream=upstream.base_url)) as proxy:
            upstream.push(Reply(body=copy.deepcopy(answer)))
            plain = httpx.post(f"{proxy.root_url}/v1/chat/completions", json=body)
            assert "x-repairproxy-tool-name-margins" not in plain.headers  # probe off: none
