"""A fixed workload's headers and log lines, compared with a committed snapshot.

Refactors of the request path (moving modules, merging the per-request objects) must not change
what a client or an operator sees. The workload covers a valid call, each repaired channel, a
promoted text call, a tool error in the history, a stream and a Responses request; volatile
fields (times, generated ids) are dropped before the comparison. Regenerate after an intended
change with ``REPAIRPROXY_UPDATE_SNAPSHOT=1 pytest tests/proxy/test_snapshot.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from repairproxy.settings import Settings
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

pytestmark = pytest.mark.anyio

SNAPSHOT = Path(__file__).parents[1] / "data" / "snapshots" / "workload.json"
GOOD = {"order_id": "#W1"}
# Values that differ run to run: clocks, durations, generated ids.
VOLATILE_KEYS = re.compile(r"(^|_)(timestamp|ms|seconds|duration|elapsed|latency|id|pid)$|_at$")
VOLATILE_HEADER = re.compile(r"-(ms|seconds|request-id)$")
CHAINED_ID = re.compile(r"^c-[0-9a-f]{16}$")  # a chained episode's id is drawn at random


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in sorted(value.items()) if not VOLATILE_KEYS.search(k)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    return value


def _workload() -> list[tuple[str, dict[str, Any], dict[str, str], list[Any]]]:
    """(path, body, extra headers, upstream replies) per request, in order."""
    bad_name = tool_call("get_order_status", GOOD, call_id="call_bad")
    good = tool_call("get_order_details", GOOD, call_id="call_good")
    bad_args = tool_call("exchange_items", {"order_id": "#W1", "item_ids": "42"}, call_id="c2")
    fixed_args = tool_call("exchange_items", {"order_id": "#W1", "item_ids": ["42"]}, call_id="c3")
    text_call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [good]},
        {"role": "tool", "tool_call_id": "call_good", "content": "Error: order not found"},
    ]
    chat = "/v1/chat/completions"
    return [
        (chat, {"messages": MESSAGES}, {"x-episode-id": "ep-1"}, [completion(tool_calls=[good])]),
        (
            chat,
            {"messages": MESSAGES},
            {"x-episode-id": "ep-1"},
            [completion(tool_calls=[bad_name]), completion(tool_calls=[good])],
        ),
        (
            chat,
            {"messages": MESSAGES},
            {"x-episode-id": "ep-2"},
            [completion(tool_calls=[bad_args]), completion(tool_calls=[fixed_args])],
        ),
        (chat, {"messages": MESSAGES}, {"x-episode-id": "ep-2"}, [completion(content=text_call)]),
        (chat, {"messages": history}, {"x-episode-id": "ep-1"}, [completion(content="Sorry.")]),
        (
            chat,
            {"messages": MESSAGES, "stream": True},
            {"x-episode-id": "ep-3"},
            [completion(tool_calls=[bad_name]), completion(tool_calls=[good])],
        ),
        (
            chat,
            {"messages": MESSAGES},
            {"x-repairproxy-repair": "off"},
            [completion(tool_calls=[bad_name])],
        ),
    ]


async def _observe() -> dict[str, Any]:
    settings = Settings(upstream="http://mock/v1", repair="reflexive")
    transport = MockTransport()
    seen: list[dict[str, Any]] = []
    async with in_process_proxy(settings, transport) as proxy:
        for path, body, headers, replies in _workload():
            transport.push(*replies)
            payload = {"model": "scripted-model", "tools": TOOLS, **body}
            response = await proxy.http.post(path, json=payload, headers=headers)
            kept = {
                k: CHAINED_ID.sub("c-*", v)
                for k, v in sorted(response.headers.items())
                if k.startswith("x-repairproxy") and not VOLATILE_HEADER.search(k)
            }
            trailer = [
                line for line in response.text.splitlines() if line.startswith(": repairproxy")
            ]
            seen.append({"status": response.status_code, "headers": kept, "trailer": trailer})
        logs = [_stable(line) for line in proxy.log_lines()]
    return {"requests": seen, "log": logs}


async def test_headers_and_log_lines_match_the_snapshot() -> None:
    observed = orjson.loads(orjson.dumps(await _observe()))
    if os.environ.get("REPAIRPROXY_UPDATE_SNAPSHOT") or not SNAPSHOT.exists():
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_bytes(orjson.dumps(observed, option=orjson.OPT_INDENT_2) + b"\n")
        if not os.environ.get("REPAIRPROXY_UPDATE_SNAPSHOT"):
            pytest.fail(f"no snapshot yet: wrote {SNAPSHOT}; commit it")
    expected = orjson.loads(SNAPSHOT.read_bytes())
    assert observed["requests"] == expected["requests"]
    assert observed["log"] == expected["log"]
