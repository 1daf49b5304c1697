"""Operator settings reach the wire: repair template file, tool-error pattern, episode header."""

from __future__ import annotations

import gc
from importlib.resources import files
from pathlib import Path

import httpx
import pytest

from repairproxy.app import YOUNG_GC_THRESHOLD, create_app
from repairproxy.settings import Settings
from tests.proxy.conftest import StartProxy
from tests.support.in_process import in_process_proxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS


def _post(url: str, messages: list[dict[str, object]], **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": messages, "tools": TOOLS}
    return httpx.post(url + "/chat/completions", json=body, headers=headers)


def test_repair_template_file_replaces_the_texts(
    tmp_path: Path, upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    default = files("repairproxy").joinpath("templates/repair_v1.txt").read_text("utf-8")
    custom = default.replace("version = repair-v1", "version = ops-v7").replace(
        "Tool-call repair:", "HOUSE RULE:"
    )
    path = tmp_path / "repair.txt"
    path.write_text(custom, encoding="utf-8")
    proxy = start_proxy(repair="reflexive", repair_template=path)
    upstream.push(
        completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"})]),
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]),
    )
    assert _post(proxy.base_url, MESSAGES).status_code == 200
    first, repair = upstream.chat_requests
    assert first["messages"][0]["content"].endswith(
        custom.split("=== instruction ===")[1].split("===")[0].strip()
    )
    assert "HOUSE RULE:" in first["messages"][0]["content"]
    assert "ops-v7" in repair["messages"][-1]["content"]


def test_a_broken_template_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "broken.txt"
    path.write_text("=== instruction ===\nno version line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="version"):
        create_app(Settings(upstream="http://127.0.0.1:1", repair_template=path))


def test_tool_error_pattern_and_episode_header(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(tool_error_pattern=r"^FAILED", episode_header="x-session")
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("get_order_details", {"order_id": "#W9"}, call_id="c1")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "FAILED: order #W9 not found"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("get_order_details", {"order_id": "#W8"}, call_id="c2")],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "Error: this does not match the pattern"},
    ]
    upstream.push(completion(content="Sorry."))
    response = _post(proxy.base_url, history, **{"X-Session": "s-1"})
    assert response.headers["x-repairproxy-episode-id"] == "s-1"
    assert response.headers["x-repairproxy-episode-errors"] == "1"


@pytest.mark.parametrize(("forbid", "expected"), [(False, ""), (True, "schema_violation")])
def test_forbid_extra_arguments(
    forbid: bool, expected: str, upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(forbid_extra_arguments=forbid)
    extra = {"email": "a@b.c", "note": "not a parameter"}  # the schema does not forbid extras
    upstream.push(completion(tool_calls=[tool_call("find_user_id_by_email", extra)]))
    response = _post(proxy.base_url, MESSAGES)
    assert response.headers["x-repairproxy-tool-errors"] == expected


@pytest.mark.anyio
async def test_the_collector_runs_less_often_while_the_app_serves() -> None:
    """After start-up the youngest generation waits for YOUNG_GC_THRESHOLD allocations (the
    older ones keep theirs); at shutdown the process gets its own thresholds back."""
    before = gc.get_threshold()
    async with in_process_proxy(Settings(upstream="http://mock/v1")):
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *before[1:])
        assert before[0] < YOUNG_GC_THRESHOLD
    assert gc.get_threshold() == before


def test_each_channel_is_named_once_in_the_tool_errors_header(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    """Two re-asks that fail the same way: the channel once in ``tool-errors`` (the first
    answer's channels stay in ``first-tool-errors``)."""
    proxy = start_proxy(repair="reflexive", max_repairs=2)
    invented = completion(tool_calls=[tool_call("get_order", {"order_id": "#W1"})])
    upstream.push(invented, invented, invented)
    response = _post(proxy.base_url, MESSAGES)
    assert response.headers["x-repairproxy-repairs"] == "2"
    assert response.headers["x-repairproxy-tool-errors"] == "unknown_tool"
    assert response.headers["x-repairproxy-first-tool-errors"] == "unknown_tool"
