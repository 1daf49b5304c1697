"""Many proxy processes, one budget: real ``python -m repairproxy serve`` processes on one real
``redis-server``, directly and behind Debian's nginx running ``docker/nginx.conf``.

One episode alternating between two processes counts as one process would; 16 concurrent clients
of one episode across both end at the exact count; Redis killed mid-run costs no 5xx, and the
budget comes back with Redis; a SIGTERM to a replica mid-stream loses no stream; ``--workers 2``
serves one port and one summed ``/metrics``.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from repairproxy.errors import BudgetExhaustedError
from repairproxy.settings import Settings
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.processes import (
    ProxyProcess,
    RedisServer,
    free_port,
    nginx,
    proxy_process,
    redis_server,
)
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import ORDER_TOOL

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "docker" / "nginx.conf"
# Every process: the shared store, and rejection once a named episode's budget is spent.
REJECTED = BudgetExhaustedError.status_code
# The tests name budgets per request (X-Repairproxy-Budget), some above the default --budget.
# --store-timeout 2: exact counts need every store call to finish; on shared cores a call can
# run past the 250 ms default and fail open, which the timeout tests cover elsewhere.
COMMON = (
    "--on-budget-exhausted",
    "reject",
    "--repair",
    "off",
    "--allow-client-budget",
    "--store-timeout",
    "2",
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _earlier_garbage_collected_first() -> None:
    """Collect what earlier modules left before this one starts, its unraisable reports set
    aside: in a full run one client socket left unclosed by an earlier test (not found: with a
    collection after every test, none leaks) was collected inside the Redis-kill test below and
    failed it as a ResourceWarning that is not this module's."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def history(ids: list[str]) -> list[dict[str, Any]]:
    """A user turn, then one failed tool call per id."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is order #W1?"}]
    for call_id in ids:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_order_details", "arguments": '{"id":"1"}'},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": f"Error: order {call_id} missing"}
        )
    return messages


def chat(
    client: httpx.Client,
    proxy: str,
    episode: str,
    ids: list[str],
    *,
    budget: int | None = None,
    stream: bool = False,
    tools: bool = False,
) -> httpx.Response:
    headers = {"x-episode-id": episode}
    if budget is not None:
        headers["x-repairproxy-budget"] = str(budget)
    body: dict[str, Any] = {"model": "scripted-model", "messages": history(ids), "stream": stream}
    if tools:
        body["tools"] = [ORDER_TOOL]
    return client.post(f"{proxy}/v1/chat/completions", json=body, headers=headers, timeout=30)


def remaining(response: httpx.Response) -> str:
    return response.headers["x-repairproxy-budget-remaining"]


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def pair(
    redis: RedisServer, upstream: ScriptedUpstream
) -> Iterator[tuple[ProxyProcess, ProxyProcess]]:
    args = ("--episode-store", redis.url, *COMMON)
    with (
        proxy_process(upstream.base_url, *args) as a,
        proxy_process(upstream.base_url, *args) as b,
    ):
        yield a, b


@contextlib.contextmanager
def load_balancer(*replicas: ProxyProcess) -> Iterator[str]:
    """nginx running docker/nginx.conf, its two servers pointed at ``replicas``."""
    port = free_port()
    conf = NGINX_CONF.read_text()
    for name, replica in zip(("proxy", "proxy-2"), replicas, strict=True):
        conf, found = re.subn(rf"server {name}:8080 ", f"server 127.0.0.1:{replica.port} ", conf)
        assert found == 1
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    with nginx(conf, port):
        yield f"http://127.0.0.1:{port}"


def served(replica: ProxyProcess, episode: str) -> int:
    """Requests of ``episode`` in the replica's log (one JSON line per request)."""
    lines = [orjson.loads(line) for line in replica.log().splitlines() if line.startswith("{")]
    return sum(1 for line in lines if line.get("episode_id") == episode)


def counters(*replicas: ProxyProcess) -> dict[str, float]:
    """Episodes started and ladder rungs crossed, summed over ``replicas``' /metrics."""
    totals: dict[str, float] = {}
    for replica in replicas:
        text = httpx.get(replica.root_url + "/metrics", timeout=5).text
        pattern = r"^repairproxy_(?:episodes|episodes_over_budget)_total\{([^}]*)\} (\S+)"
        for labels, value in re.findall(pattern, text, re.M):
            rung = re.search(r'k="(\d+)"', labels)
            key = f"k={rung.group(1)}" if rung else "started"
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def test_one_episode_alternating_between_two_processes(
    pair: tuple[ProxyProcess, ProxyProcess], upstream: ScriptedUpstream
) -> None:
    a, b = pair
    upstream.push(*[completion(content="Looking into it.") for _ in range(5)])
    seen = []
    with httpx.Client() as client:
        for turn, replica in enumerate((a, b, a, b), start=1):
            ids = [f"alt-{i}" for i in range(turn)]
            seen.append(remaining(chat(client, replica.root_url, "alternating", ids)))
        # The whole history again, at the other process: nothing new to count.
        again = chat(client, a.root_url, "alternating", [f"alt-{i}" for i in range(4)])
    assert seen == ["9", "8", "7", "6"]
    assert remaining(again) == "6" and again.headers["x-repairproxy-episode-errors"] == "4"


def test_sixteen_clients_of_one_episode_end_at_the_exact_count(
    pair: tuple[ProxyProcess, ProxyProcess], upstream: ScriptedUpstream
) -> None:
    a, b = pair
    turns = 3
    upstream.push(*[completion(content="ok") for _ in range(16 * turns + 1)])

    def client_run(index: int) -> list[int]:
        replica = (a, b)[index % 2]
        statuses = []
        with httpx.Client() as client:
            for turn in range(1, turns + 1):
                ids = [f"c{index}-{i}" for i in range(turn)]
                response = chat(client, replica.root_url, "crowd", ids, budget=1000)
                statuses.append(response.status_code)
        return statuses

    before = counters(a, b)
    with ThreadPoolExecutor(16) as pool:
        statuses = [s for run in pool.map(client_run, range(16)) for s in run]
    after = counters(a, b)
    # One episode started, each rung of the ladder (1, 2, 5, 10) crossed once: across both.
    assert {key: after[key] - before.get(key, 0.0) for key in after} == {
        "started": 1,
        "k=1": 1,
        "k=2": 1,
        "k=5": 1,
        "k=10": 1,
    }
    assert statuses == [200] * 16 * turns
    with httpx.Client() as client:
        final = chat(client, b.root_url, "crowd", [], budget=1000)
    assert final.headers["x-repairproxy-episode-errors"] == str(16 * turns)
    assert remaining(final) == str(1000 - 16 * turns)


def test_through_nginx_one_episode_alternates_and_counts_exactly(
    pair: tuple[ProxyProcess, ProxyProcess], upstream: ScriptedUpstream
) -> None:
    a, b = pair
    upstream.push(*[completion(content="ok") for _ in range(6)])
    with load_balancer(a, b) as lb, httpx.Client() as client:
        seen = [
            remaining(chat(client, lb, "balanced", [f"lb-{i}" for i in range(turn)]))
            for turn in range(1, 5)
        ]
        streamed = chat(client, lb, "balanced", [f"lb-{i}" for i in range(5)], stream=True)
    assert seen == ["9", "8", "7", "6"]
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert remaining(streamed) == "5"
    assert served(a, "balanced") >= 2 and served(b, "balanced") >= 2  # both replicas answered


def test_redis_killed_mid_run_no_5xx_then_recovery(
    pair: tuple[ProxyProcess, ProxyProcess], upstream: ScriptedUpstream, redis: RedisServer
) -> None:
    a, b = pair
    upstream.push(*[completion(content="ok") for _ in range(5000)])
    spent = ["spent-0", "spent-1"]
    stop = threading.Event()
    background: list[int | str] = []

    def busy(index: int) -> None:  # traffic in flight while Redis dies and comes back
        with httpx.Client() as client:
            while not stop.is_set():
                replica = (a, b)[index % 2]
                try:
                    response = chat(client, replica.root_url, f"busy-{index}", [f"busy-{index}"])
                except httpx.HTTPError as exc:
                    background.append(repr(exc))
                else:
                    background.append(response.status_code)

    workers = [threading.Thread(target=busy, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    with httpx.Client() as client:
        assert chat(client, a.root_url, "spent", spent, budget=2).status_code == REJECTED
        time.sleep(0.3)
        redis.kill()
        try:
            outage = [
                chat(client, replica.root_url, episode, spent, budget=2)
                for replica in (a, b, a, b)
                for episode in ("spent", "other")
            ]
        finally:
            redis.restart()  # empty, as a restarted Redis without disk is
            time.sleep(1.5)
            stop.set()
            for worker in workers:
                worker.join(30)
        assert background and set(background) == {200}, set(background)
        assert [r.status_code for r in outage] == [200] * 8  # reject lets them through
        assert {remaining(r) for r in outage} == {"unknown"}
        metrics = client.get(a.root_url + "/metrics").text
        failed = re.findall(
            r'^repairproxy_store_errors_total\{operation="(\w+)"\} (\S+)', metrics, re.M
        )
        assert sum(float(value) for _, value in failed) >= 4
        # Back by itself within the guard's rest (1 s, doubling while Redis stayed away).
        deadline = time.monotonic() + 20
        recovered: dict[str, int] = {}
        while len(recovered) < 2 and time.monotonic() < deadline:
            for name, replica in (("a", a), ("b", b)):
                response = chat(client, replica.root_url, "spent", spent, budget=2)
                assert response.status_code in (200, REJECTED)
                if response.status_code == REJECTED:
                    recovered[name] = REJECTED  # counted again from the history: enforced again
            time.sleep(0.2)
    assert recovered == {"a": REJECTED, "b": REJECTED}
    for replica in (a, b):
        log = replica.log()
        assert log.count("episode store unavailable") == 1, log
        assert "episode store available again" in log


def test_sigterm_mid_stream_loses_no_stream(redis: RedisServer) -> None:
    """Two streams through nginx (one per replica), SIGTERM to one: both finish whole, the
    signalled replica stops accepting at once, and the other takes the next requests."""
    args = ("--episode-store", redis.url, "--drain-timeout", "20", *COMMON)
    slow = [completion(content="one two three four five six", event_delay=0.4) for _ in range(2)]
    with (
        ScriptedUpstream() as upstream,
        proxy_process(upstream.base_url, *args) as leaving,
        proxy_process(upstream.base_url, *args) as staying,
        load_balancer(leaving, staying) as lb,
    ):
        upstream.push(*slow)
        results: dict[int, httpx.Response] = {}
        failures: list[str] = []
        started = threading.Barrier(3)

        def stream(index: int) -> None:
            try:
                with httpx.Client() as client:
                    body = {"model": "m", "messages": history([]), "stream": True}
                    headers = {"x-episode-id": f"drain-{index}"}
                    with client.stream(
                        "POST", lb + "/v1/chat/completions", json=body, headers=headers, timeout=30
                    ) as response:
                        started.wait(30)
                        response.read()
                        results[index] = response
            except (httpx.HTTPError, threading.BrokenBarrierError) as exc:
                failures.append(repr(exc))

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        started.wait(30)
        time.sleep(0.3)  # both streams are under way
        leaving.terminate()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # no longer accepting, within uvicorn's 0.1 s tick
            try:
                httpx.get(leaving.root_url + "/healthz", timeout=2)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                # refused, closed unread, or reset from the backlog of a closed listener
                break
            time.sleep(0.05)
        else:
            pytest.fail("the signalled replica still accepts connections")
        assert leaving.process.poll() is None  # ... while its streams go on
        for thread in threads:
            thread.join(30)
        assert not failures, failures
        for response in results.values():
            assert response.status_code == 200
            text = response.text
            assert text.endswith("data: [DONE]\n\n"), text
            content = "".join(
                (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                for line in text.splitlines()
                if line.startswith("data: {")
            )
            assert content == "one two three four five six"
        assert len(results) == 2
        assert leaving.process.wait(20) is not None  # drained, then exited
        upstream.push(*[completion(content="ok") for _ in range(4)])
        with httpx.Client() as client:
            after = [chat(client, lb, "after", []).status_code for _ in range(4)]
        assert after == [200] * 4


def served_per_worker(directory: Path) -> dict[str, float]:
    """Chat requests each worker counted, read from its multi-process metric file."""
    from prometheus_client.mmap_dict import MmapedDict

    served = {}
    for path in directory.glob("counter_*.db"):
        values = MmapedDict.read_all_values_from_file(str(path))
        served[path.stem] = sum(
            value for key, value, *_ in values if '"repairproxy_requests_total"' in key
        )
    assert len(served) == 2, served
    return served


def test_two_workers_share_one_port_one_budget_and_one_metrics(
    redis: RedisServer, tmp_path: Path
) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    args = ("--episode-store", redis.url, "--workers", "2", *COMMON)
    with (
        ScriptedUpstream() as upstream,
        proxy_process(upstream.base_url, *args, env=env) as proxy,
    ):
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("counter_*.db"))) < 2:  # each worker built its app
            assert time.monotonic() < deadline, "the second worker did not start"
            time.sleep(0.1)
        call = tool_call("get_order_details", {"order_id": "#W1"})
        upstream.push(*[completion(tool_calls=[call]) for _ in range(200)])

        def one(turn: int) -> int:
            with httpx.Client() as client:  # a new connection each: either worker may accept
                response = chat(
                    client, proxy.root_url, "workers", [f"w-{turn}"], budget=1000, tools=True
                )
            return response.status_code

        sent = 0
        with ThreadPoolExecutor(4) as pool:  # both workers busy at once, until both served
            while sent < 160 and (sent == 0 or min(served_per_worker(tmp_path).values()) == 0):
                assert list(pool.map(one, range(sent, sent + 8))) == [200] * 8
                sent += 8
        with httpx.Client() as client:
            last = chat(client, proxy.root_url, "workers", [], budget=1000, tools=True)
        assert last.headers["x-repairproxy-episode-errors"] == str(sent)  # one budget
        requests = sent + 1
        # A request is counted just after its answer left (the metrics come after the last
        # byte, by design): the client can read the files first, so wait for the last count.
        deadline = time.monotonic() + 5
        served = served_per_worker(tmp_path)
        while sum(served.values()) < requests and time.monotonic() < deadline:
            time.sleep(0.01)
            served = served_per_worker(tmp_path)
        assert min(served.values()) > 0 and sum(served.values()) == requests, served
        for _ in range(4):  # whichever worker answers the scrape, the sum is the same
            text = httpx.get(proxy.root_url + "/metrics", timeout=5).text
            total = sum(
                float(value)
                for value in re.findall(r"^repairproxy_requests_total\{[^}]*\} (\S+)", text, re.M)
            )
            assert total == requests
            assert "pid=" not in text
            page = httpx.get(proxy.root_url + "/dashboard", timeout=5).text
            assert f"<b>{requests}</b><span>tool calls</span>" in page  # summed there too
        proxy.terminate()  # the manager stops both workers, each drains, then it exits
        assert proxy.process.wait(20) == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "2"], "--workers > 1 needs --episode-store redis://"),
        (["--episode-store", "mysql://db"], "--episode-store must be memory or a redis://"),
        (
            ["--workers", "2", "--episode-store", "redis://127.0.0.1:1/0", "--metrics-port", "9"],
            "--metrics-port cannot be combined with --workers > 1",
        ),
    ],
)
def test_the_cli_refuses_what_cannot_work(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from repairproxy.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--upstream", "http://127.0.0.1:1/v1", *flags])
    assert message in str(exited.value.code)


@pytest.mark.anyio
async def test_draining_turns_readyz_unready_but_keeps_serving() -> None:
    transport = MockTransport(completion(content="ok"))
    async with in_process_proxy(Settings(upstream="http://mock/v1"), transport) as proxy:
        assert (await proxy.http.get("/readyz")).status_code == 200
        proxy.app.begin_drain()
        ready = await proxy.http.get("/readyz")
        assert ready.status_code == 503 and ready.json() == {"status": "draining"}
        assert (await proxy.http.get("/healthz")).status_code == 200
        answer = await proxy.http.post(
            "/v1/chat/completions", json={"model": "m", "messages": history([])}
        )
        assert answer.status_code == 200
