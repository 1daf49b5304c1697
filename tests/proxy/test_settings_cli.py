"""Settings come from flags and REPAIRPROXY_* env vars; the CLI serves a real process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from repairproxy.cli import open_proxy_warning
from repairproxy.settings import Settings, settings_from_args
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_the_issue() -> None:
    settings = settings_from_args(["--upstream", "http://u/v1"], environ={})
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert (settings.repair, settings.max_repairs, settings.on_exhausted) == (
        "reflexive",
        2,
        "pass",
    )
    assert (settings.budget, settings.on_budget_exhausted) == (10, "annotate")
    assert settings.episode_header == "x-episode-id"
    assert settings.tool_error_pattern is None  # the known frameworks' formats
    assert settings.api_keys == ()


def test_env_vars_fill_every_flag_and_flags_win() -> None:
    environ = {
        "REPAIRPROXY_UPSTREAM": "http://env/v1",
        "REPAIRPROXY_PORT": "9001",
        "REPAIRPROXY_API_KEY": "k1,k2",
        "REPAIRPROXY_UPSTREAM_TIMEOUT": "2.5",
        "REPAIRPROXY_REPAIR": "constrained",
        "REPAIRPROXY_MAX_REPAIRS": "4",
        "REPAIRPROXY_BUDGET": "3",
        "REPAIRPROXY_ON_BUDGET_EXHAUSTED": "reject",
        "REPAIRPROXY_EPISODE_HEADER": "X-Session",
        "REPAIRPROXY_LOG_BODIES": "true",
        "REPAIRPROXY_MAX_BODY_BYTES": "1234",
    }
    settings = settings_from_args([], environ=environ)
    assert settings.upstream == "http://env/v1"
    assert settings.port == 9001
    assert settings.api_keys == ("k1", "k2")
    assert settings.upstream_timeout == 2.5
    assert (settings.repair, settings.max_repairs, settings.budget) == ("constrained", 4, 3)
    assert settings.on_budget_exhausted == "reject"
    assert settings.episode_header == "x-session"
    assert settings.log_bodies is True
    assert settings.max_body_bytes == 1234
    flagged = settings_from_args(
        ["--port", "9002", "--repair", "off", "--api-key", "k9"], environ=environ
    )
    assert (flagged.port, flagged.repair, flagged.api_keys) == (9002, "off", ("k9",))


@pytest.mark.parametrize(
    "environ", [{"REPAIRPROXY_REPAIR": "always"}, {"REPAIRPROXY_ON_EXHAUSTED": "explode"}]
)
def test_bad_values_fail_at_start(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        settings_from_args([], environ=environ)


def test_settings_are_frozen() -> None:
    settings = Settings(upstream="http://u")
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_python_dash_m_serve_runs_the_proxy(upstream: ScriptedUpstream) -> None:
    port = _free_port()
    env = {**os.environ, "REPAIRPROXY_REPAIR": "off", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "repairproxy",
            "serve",
            "--upstream",
            upstream.base_url,
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.1)
        upstream.push(completion(tool_calls=[tool_call("get_order_status", {"order_id": "1"})]))
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": MESSAGES, "tools": TOOLS},
        )
        assert response.headers["x-repairproxy-tool-errors"] == "unknown_tool"
        assert response.headers["x-repairproxy-repairs"] == "0"  # the env var said off
    finally:
        process.terminate()
        stdout, _stderr = process.communicate(timeout=10)
    log_line = [line for line in stdout.splitlines() if b'"path":"/v1/chat/completions"' in line]
    assert len(log_line) == 1


def test_cli_rejects_bad_flags() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "repairproxy", "serve", "--repair", "always"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30,
    )
    assert result.returncode != 0
    assert b"--repair" in result.stderr


def test_a_busy_port_fails_at_once_naming_the_remedy_before_any_model_loads(
    tmp_path: Path,
) -> None:
    """No --upstream: the embedded model would start (minutes on a cold cache); the port is
    taken, so the proxy must say so first, with --port and REPAIRPROXY_PORT."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = {**os.environ, "REPAIRPROXY_CACHE_DIR": str(tmp_path)}  # no model there
        done = subprocess.run(
            [sys.executable, "-m", "repairproxy", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "--port N" in done.stderr and "REPAIRPROXY_PORT" in done.stderr
    assert "embedded CPU model" not in done.stderr


@pytest.mark.parametrize(
    ("host", "keys", "warned"),
    [
        ("0.0.0.0", (), True),
        ("::", (), True),
        ("10.1.2.3", (), True),
        ("0.0.0.0", ("k",), False),
        ("127.0.0.1", (), False),
        ("::1", (), False),
        ("localhost", (), False),
    ],
)
def test_listening_beyond_loopback_without_keys_warns(
    host: str, keys: tuple[str, ...], warned: bool
) -> None:
    warning = open_proxy_warning(Settings(host=host, api_keys=keys))
    assert (warning is not None) is warned
    if warning:
        assert "--api-key" in warning and host in warning
