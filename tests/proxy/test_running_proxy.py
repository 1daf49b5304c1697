"""``tests.support.proxy_server``: a request writes its log line just after its answer left, so a
test holding the answer can be ahead of the line; ``log_lines()`` waits for the requests in
flight (bounded), ``log_lines(settle=0)`` reads at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from repairproxy.asgi.routes import Proxy
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion

_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _slow_finish(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[str]:
    """The post-answer work (the log line, metrics) made to start ``seconds`` late, on the
    server's thread, after the answer left; returns the threads it ran on."""
    finish = Proxy._finish
    ran_on: list[str] = []

    def late(self: Proxy, *args: Any) -> None:
        ran_on.append(threading.current_thread().name)
        time.sleep(seconds)
        finish(self, *args)

    monkeypatch.setattr(Proxy, "_finish", late)
    return ran_on


def _request_lines(lines: list[dict[str, Any]]) -> int:
    return sum(line.get("path") == "/v1/chat/completions" for line in lines)


def test_log_lines_waits_for_a_line_written_after_the_answer(
    monkeypatch: pytest.MonkeyPatch, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    ran_on = _slow_finish(monkeypatch, 0.3)
    upstream.push(completion(content="hello"))
    with httpx.Client(trust_env=False, timeout=30) as client:
        answer = client.post(proxy.base_url + "/chat/completions", json=_BODY)
    assert answer.status_code == 200  # the answer is here, its line is 0.3 s away
    assert _request_lines(proxy.log_lines(settle=0)) == 0
    assert _request_lines(proxy.log_lines()) == 1
    assert ran_on and ran_on[0] != threading.current_thread().name


def test_log_lines_stops_waiting_for_a_request_that_stays_in_flight(
    monkeypatch: pytest.MonkeyPatch, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    _slow_finish(monkeypatch, 1.0)
    upstream.push(completion(content="hello"))
    with httpx.Client(trust_env=False, timeout=30) as client:
        assert client.post(proxy.base_url + "/chat/completions", json=_BODY).status_code == 200
    started = time.monotonic()
    assert _request_lines(proxy.log_lines(settle=0.2)) == 0  # still in _finish: not logged
    assert time.monotonic() - started >= 0.2
