"""A client that leaves mid-request: the work is cancelled and the log line says 499, whether
the server tells the app through the proxy's disconnect extension (its own protocol: no task
waits in ``receive()``) or, under any other ASGI server, a watcher task sees ``http.disconnect``."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
import uvicorn

from repairproxy.app import create_app
from repairproxy.asgi.responder import (
    DISCONNECT_EXTENSION,
    ClientDisconnectedError,
    cancel_on_disconnect,
)
from repairproxy.server import LimitedProtocol
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.proxy_server import RunningProxy, _LockedBytes, running_proxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion
from tests.support.tools import MESSAGES

# -- cancel_on_disconnect against fakes at the ASGI seam -------------------------------------------


class _Watch:
    """A server's side of the extension: records the callback and whether watching stopped."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.stopped = 0

    def __call__(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return self.stop

    def stop(self) -> None:
        self.stopped += 1


async def _never_receive() -> dict[str, Any]:
    raise AssertionError("receive() was called: the extension should make it unnecessary")


def test_with_the_extension_no_task_waits_and_the_callback_cancels_the_work() -> None:
    async def scenario() -> tuple[str, int, int, bool]:
        watch = _Watch()
        scope = {"extensions": {DISCONNECT_EXTENSION: {"watch": watch}}}
        reached_end = False

        async def work() -> None:
            nonlocal reached_end
            await asyncio.sleep(5)
            reached_end = True

        tasks_before = len(asyncio.all_tasks())
        running = asyncio.ensure_future(cancel_on_disconnect(work(), _never_receive, scope))
        await asyncio.sleep(0)  # the work is now waiting
        tasks_during = len(asyncio.all_tasks())
        watch.callbacks[0]()  # the connection was lost
        try:
            await running
        except ClientDisconnectedError:
            outcome = "disconnected"
        else:
            outcome = "finished"
        return outcome, tasks_during - tasks_before, watch.stopped, reached_end

    outcome, extra_tasks, stopped, reached_end = asyncio.run(scenario())
    assert outcome == "disconnected"
    assert extra_tasks == 1  # the request's own task only: no watcher
    assert stopped == 1
    assert reached_end is False


def test_with_the_extension_finished_work_stops_watching_and_is_not_cancelled() -> None:
    async def scenario() -> tuple[int, int, bool]:
        watch = _Watch()
        scope = {"extensions": {DISCONNECT_EXTENSION: {"watch": watch}}}

        async def work() -> None:
            await asyncio.sleep(0)

        await cancel_on_disconnect(work(), _never_receive, scope)
        await asyncio.sleep(0.01)  # a cancellation left pending would land here
        current = asyncio.current_task()
        assert current is not None
        return len(watch.callbacks), watch.stopped, current.cancelling() == 0

    assert asyncio.run(scenario()) == (1, 1, True)


def test_without_the_extension_a_watcher_task_sees_http_disconnect() -> None:
    async def scenario() -> str:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def work() -> None:
            gone.set()
            await asyncio.sleep(5)

        try:
            await cancel_on_disconnect(work(), receive, {})
        except ClientDisconnectedError:
            return "disconnected"
        return "finished"

    assert asyncio.run(scenario()) == "disconnected"


# -- the real server -------------------------------------------------------------------------------


@contextmanager
def _plain_uvicorn_proxy(settings: Settings) -> Iterator[RunningProxy]:
    """The app under uvicorn's own httptools protocol: no disconnect extension in the scope."""
    log = _LockedBytes()
    app = create_app(settings, log_stream=log)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http="httptools", loop="uvloop", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the proxy did not start"
        time.sleep(0.01)
    try:
        yield RunningProxy(sock.getsockname()[1], settings, log)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _leave_mid_request(port: int) -> None:
    body = orjson.dumps({"model": "m", "messages": MESSAGES})
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(head + body)
        time.sleep(0.3)  # the proxy is waiting on the (slow) upstream


@pytest.mark.parametrize("server", ["repairproxy", "plain uvicorn"])
def test_a_client_leaving_a_buffered_request_is_logged_499(
    server: str, upstream: ScriptedUpstream
) -> None:
    upstream.push(Reply(body=completion(content="late").body, delay=1.5))
    settings = Settings(upstream=upstream.base_url, repair=RepairMode.OFF)
    serving = running_proxy if server == "repairproxy" else _plain_uvicorn_proxy
    with serving(settings) as proxy:
        _leave_mid_request(proxy.port)
        deadline = time.monotonic() + 5
        while not proxy.log_lines() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = proxy.log_lines()
    requests = [line for line in lines if line.get("path") == "/v1/chat/completions"]
    assert [line["status"] for line in requests] == [499]


def test_the_server_offers_the_extension_and_calls_back_only_before_the_answer_ends() -> None:
    seen: list[str] = []
    answered = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        watch = scope["extensions"][DISCONNECT_EXTENSION]["watch"]
        stop = watch(lambda: seen.append(scope["path"]))
        if scope["path"] == "/leave":
            await asyncio.sleep(0.5)  # the client leaves meanwhile
        stop()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        answered.set()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=LimitedProtocol, loop="asyncio", lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = sock.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"GET /stay HTTP/1.1\r\nhost: x\r\n\r\n")
            assert answered.wait(5)
            assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"GET /leave HTTP/1.1\r\nhost: x\r\n\r\n")
            time.sleep(0.1)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert seen == ["/leave"]
