"""Malformed input the server layer used to answer 500 (or pass on): each is now a 4xx, or
forwarded only once it is safe."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson
import pytest

from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion
from tests.support.tools import TOOLS


def _post(proxy: RunningProxy, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(
        proxy.base_url + "/chat/completions",
        content=orjson.dumps(body),
        headers={"content-type": "application/json", **headers},
        timeout=10,
    )


@pytest.mark.parametrize("role", [7, None, ["user"], {"x": 1}])
def test_a_non_string_role_is_400_naming_the_field(
    upstream: ScriptedUpstream, proxy: RunningProxy, role: Any
) -> None:
    upstream.push(completion(content="hi"))
    body = {"model": "m", "messages": [{"role": role, "content": "hi"}], "tools": TOOLS}
    response = _post(proxy, body)
    assert response.status_code == 400, response.text
    assert "role" in response.json()["error"]["message"]
    assert upstream.requests == []


def _raw_get(proxy: RunningProxy, target: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        client.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" % target)
        chunks = []
        while chunk := client.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/../internal/x",
        b"/v1/%2e%2e/internal/x",
        b"/v1/%2E%2e/internal/x",
        b"/v1/models/./../../internal",
        b"/v1/..%2finternal/x",
        b"/v1/%252e%252e/internal/x",
    ],
)
def test_pass_through_refuses_dot_segments(
    upstream: ScriptedUpstream, proxy: RunningProxy, target: bytes
) -> None:
    upstream.push(Reply(body={"ok": True}))
    answer = _raw_get(proxy, target)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"invalid_request" in answer or b"dot segment" in answer
    assert upstream.requests == []  # nothing went upstream with the upstream key


def test_pass_through_still_forwards_ordinary_paths(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(Reply(body={"object": "list", "data": []}))
    answer = _raw_get(proxy, b"/v1/models/a.b..c")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert len(upstream.requests) == 1


def test_every_choice_is_reported_when_n_is_above_one(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    good = {"role": "assistant", "content": None, "tool_calls": [_call("get_order_details")]}
    bad = {"role": "assistant", "content": None, "tool_calls": [_call("get_order_status")]}
    choices = [
        {"index": i, "message": m, "finish_reason": "tool_calls"}
        for i, m in enumerate([good, bad, good])
    ]
    upstream.push(
        Reply(body={"id": "c", "object": "chat.completion", "model": "m", "choices": choices})
    )
    body = {"model": "m", "n": 3, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    response = _post(proxy, body)
    assert response.status_code == 200, response.text
    assert response.headers["x-repairproxy-tool-errors"] == ""  # choice 0, as before
    assert response.headers["x-repairproxy-choice-tool-errors"] == "0=;1=unknown_tool;2="


def _call(name: str) -> dict[str, Any]:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": '{"order_id": "#W1"}'},
    }
