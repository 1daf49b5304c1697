"""litellm (pinned 1.82.6) as a second real client: same answers, same channel headers."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.proxy.conftest import StartProxy
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

# litellm fetches a model price map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

pytestmark = [
    # litellm leaves its own event loop and sockets for the garbage collector.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(autouse=True, scope="module")
def _collect_litellm_garbage() -> Iterator[None]:
    """Close what litellm leaves behind (an idle event loop) while this module's filters apply."""
    yield
    for obj in gc.get_objects():
        if (
            isinstance(obj, asyncio.AbstractEventLoop)
            and not obj.is_running()
            and not obj.is_closed()
        ):
            obj.close()
    gc.collect()


def _call(proxy: RunningProxy, **kwargs: Any) -> Any:
    return litellm.completion(
        model="openai/scripted-model",
        api_base=proxy.base_url,
        api_key="sk-client",
        messages=MESSAGES,
        tools=TOOLS,
        num_retries=0,
        **kwargs,
    )


def _proxy_header(response: Any, name: str) -> str:
    headers = response._hidden_params["additional_headers"]
    return str(headers["llm_provider-" + name])


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("get_order_details", '{"order_id": "#W1"}', ""),
        ("get_order_status", '{"order_id": "#W1"}', "unknown_tool"),
        ("get_order_details", '{"order_id": ', "invalid_json"),
        ("get_order_details", '{"order_id": 7}', "schema_violation"),
    ],
)
def test_litellm_sees_the_answer_and_the_channel(
    name: str, arguments: str, expected: str, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(completion(tool_calls=[tool_call(name, arguments, call_id="call_x")]))
    response = _call(proxy)
    call = response.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_x", name, arguments)
    assert _proxy_header(response, "x-repairproxy-tool-errors") == expected


def test_litellm_streaming_with_repair(upstream: ScriptedUpstream, start_proxy: StartProxy) -> None:
    proxy = start_proxy(repair="reflexive")
    upstream.push(
        completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"})]),
        completion(
            tool_calls=[tool_call("get_order_details", {"order_id": "#W1"}, call_id="call_ok")]
        ),
    )
    names, arguments, ids = "", "", ""
    for chunk in _call(proxy, stream=True):
        for part in chunk.choices[0].delta.tool_calls or []:
            ids += part.id or ""
            names += part.function.name or ""
            arguments += part.function.arguments or ""
    assert (ids, names, arguments) == ("call_ok", "get_order_details", '{"order_id":"#W1"}')
    assert len(upstream.chat_requests) == 2
