"""The margin account end to end: the proxy's X-Repairproxy-Tool-Name-Margins header, recorded
by the study's client as the engine records every x-repairproxy-* header, read back from a
results file and split into declared and invented names."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest

from evals.analysis.margins import THIN_MARGIN, margin_view, parse_margins
from evals.analysis.stats import Interval, NotAvailable
from evals.analysis.summary import load_arm, summarize_arm
from evals.tau2.chat import proxy_report
from repairproxy.settings import Settings
from tests.evals.fixtures_tau2 import Call, Turn, episode, not_found, results, write
from tests.support.proxy_server import running_proxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream

RETAIL = ("get_order_details", "get_user_details", "cancel_pending_order")


def _entry(token: str, logprob: float, rivals: dict[str, float]) -> dict[str, Any]:
    top = sorted({token: logprob, **rivals}.items(), key=lambda item: -item[1])
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
    }


def test_the_recorded_header_gives_each_calls_name_and_margin() -> None:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in RETAIL
    ]
    tokens = [
        _entry('{"name": "', -0.01, {}),
        _entry("get", -0.05, {"find": -0.2}),
        _entry("_order", -0.4, {"_user": -0.7}),
        _entry('_details", "arguments": {}}', -0.01, {"_status": -3.0}),
    ]
    answer = {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_order_details", "arguments": "{}"},
                        }
                    ],
                },
                "logprobs": {"content": tokens},
                "finish_reason": "tool_calls",
            }
        ],
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
    with ScriptedUpstream() as upstream:
        settings = Settings(upstream=upstream.base_url, margin_probe=True)
        with running_proxy(settings) as proxy:
            upstream.push(Reply(body=copy.deepcopy(answer)))
            response = httpx.post(f"{proxy.root_url}/v1/chat/completions", json=body)
    record = proxy_report(response.headers.items())
    assert parse_margins(record["tool_name_margins"]) == [("get_order_details", pytest.approx(0.3))]


def test_parse_margins_skips_what_is_not_a_pair() -> None:
    assert parse_margins("a=1.5,b=-0.25") == [("a", 1.5), ("b", -0.25)]
    assert parse_margins(["a=1", "junk", "=2", "c=x"]) == [("a", 1.0)]
    assert parse_margins(None) == []


def test_an_arm_splits_its_margins_into_declared_and_invented_names(tmp_path: Path) -> None:
    thin = THIN_MARGIN / 2
    simulations = [
        episode(
            "t1",
            0,
            [
                Turn(
                    (Call("lookup_order", not_found("lookup_order")),),
                    proxy={
                        "tool_errors": ["unknown_tool"],
                        "unknown_tools": ["lookup_order"],
                        "tool_name_margins": f"lookup_order={thin}",
                    },
                ),
                Turn(
                    (Call("get_order_details"),),
                    proxy={"tool_errors": [], "tool_name_margins": "get_order_details=2.5"},
                ),
            ],
        ),
        episode(
            "t2",
            0,
            [
                Turn(
                    (Call("get_order_details"), Call("get_user_details")),
                    proxy={
                        "tool_errors": [],
                        "tool_name_margins": "get_order_details=1.5,get_user_details=0.1",
                    },
                )
            ],
        ),
    ]
    path = write(tmp_path / "r" / "results.json", results(simulations))
    view = summarize_arm(load_arm(path)).margins
    assert view is not None and view.answers_with_margins == 3
    assert (view.all_calls.calls, view.all_calls.thin) == (4, 2)
    assert (view.declared.calls, view.declared.thin, view.declared.median) == (3, 1, 1.5)
    assert (view.invented.calls, view.invented.thin, view.invented.median) == (1, 1, thin)
    share = view.all_calls.thin_share
    assert isinstance(share, Interval) and share.estimate == pytest.approx(0.5)
    assert share.low < 0.5 < share.high


def test_an_arm_run_without_the_probe_says_so() -> None:
    view = margin_view([])
    assert view.answers_with_margins == 0
    assert isinstance(view.all_calls.thin_share, NotAvailable)
    assert "--margin-probe" in view.all_calls.thin_share.reason
