"""Start, health-check and stop the servers a grid needs: model servers and proxies.

``ArmEndpoint`` makes one arm reachable for a while: it starts the arm's model server when the
arm says ``launch = ...`` and one proxy in front of the upstream, and stops both on exit.

Each server is a child process with its output in a log file. On Linux the child is asked to
receive SIGTERM when the runner dies, so a killed grid run leaves no server holding a port or a GPU
behind (the next run starts fresh ones and resumes from the results files).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from evals.grid.spec import ArmSpec, Launch, VllmLaunch

__all__ = ["ArmEndpoint", "LaunchError", "ManagedProcess", "free_port", "proxy_command"]

_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """A server did not start, or did not become healthy in time (the message has its log tail)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def proxy_command(upstream: str, port: int, args: Sequence[str] = ()) -> list[str]:
    """``python -m repairproxy serve`` in front of ``upstream`` on loopback ``port``.

    With ``--allow-client-budget``: the grid sends each cell's budget K in
    ``X-Repairproxy-Budget``, and a proxy without the flag refuses any K above its ``--budget``
    (a 400, never a silent clamp)."""
    command = [sys.executable, "-m", "repairproxy", "serve", "--upstream", upstream]
    extra = [] if "--allow-client-budget" in args else ["--allow-client-budget"]
    return [*command, "--host", "127.0.0.1", "--port", str(port), *extra, *args]


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arrange() -> None:  # runs in the child between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return arrange


class ManagedProcess:
    """One server child: ``start()`` waits until ``health_url`` answers 200, ``stop()`` ends it."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        health_url: str,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.health_url = health_url
        self.log_path = log_path
        self._env = None if env is None else {**os.environ, **env}
        self._ready_timeout_s = ready_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    preexec_fn=_die_with_parent(),  # prctl only: safe between fork and exec
                )
            except OSError as exc:
                raise LaunchError(f"{self.name}: cannot run {self.command[0]!r}: {exc}") from exc
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._ready_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                code = self._process.poll()
                if code is not None:
                    raise LaunchError(
                        f"{self.name} exited with {code} before it was healthy:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.health_url).status_code == 200:
                        return
                time.sleep(0.1)
        raise LaunchError(
            f"{self.name} was not healthy at {self.health_url} within "
            f"{self._ready_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def exited(self) -> bool:
        """Whether a started process has ended on its own (a crash, an out-of-memory kill)."""
        return self._process is not None and self._process.poll() is not None

    def exit_error(self) -> LaunchError:
        code = None if self._process is None else self._process.returncode
        return LaunchError(f"{self.name} exited with {code} while in use:\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (None if never started)."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def __enter__(self) -> ManagedProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ArmEndpoint:
    """An arm made reachable for a while: its model server (if launched) and its proxy."""

    def __init__(self, arm: ArmSpec, logs: Path, proxy_args: Sequence[str] = ()) -> None:
        self.arm = arm
        self._proxy_args = list(proxy_args)
        self._logs = logs
        self._stack = ExitStack()
        self.upstream_url = ""
        self.proxy_url = ""
        self.proxy_urls: list[
            str
        ] = []  # one proxy per upstream (several: evals.grid.upstream_pool)
        self.proxy_command: list[str] | str | list[list[str]] = "external"
        self.processes: list[ManagedProcess] = []

    def describe(self) -> dict[str, Any]:
        """The proxy this arm is reached through, for the provenance."""
        if len(self.proxy_urls) > 1:
            return {"urls": self.proxy_urls, "command": self.proxy_command}
        return {"url": self.proxy_url, "command": self.proxy_command}

    def open(self) -> ArmEndpoint:
        arm = self.arm
        launch = arm.launch
        if arm.arm_dir is not None:  # a made arm: its arm.json says how to serve it
            from evals.arms import ArmError, load_arm

            try:
                served_by = launch if isinstance(launch, VllmLaunch) else None
                launch = load_arm(arm.arm_dir).launch(served_model_name=arm.model, vllm=served_by)
            except ArmError as exc:
                raise LaunchError(f"arms.{arm.name}: {exc}") from exc
        if len(arm.upstreams) > 1 and arm.proxy is not None:
            raise LaunchError(f"arms.{arm.name}: several upstreams need a proxy each, not proxy =")
        upstreams = [self._launch(launch)] if launch is not None else list(arm.upstreams)
        self.upstream_url = upstreams[0]
        if arm.proxy is not None:
            self.proxy_url = arm.proxy
            self.proxy_urls = [arm.proxy]
            return self
        env = None
        if arm.api_key_env and arm.api_key_env in os.environ:
            # The upstream key travels in the environment, never on a command line or in a log.
            env = {"REPAIRPROXY_UPSTREAM_API_KEY": os.environ[arm.api_key_env]}
        commands = []
        for index, upstream in enumerate(upstreams):
            port = free_port()
            command = proxy_command(upstream, port, [*self._proxy_args, *arm.proxy_args])
            suffix = f"-{index}" if len(upstreams) > 1 else ""
            proxy = ManagedProcess(
                f"proxy for {arm.name}{suffix}",
                command,
                f"http://127.0.0.1:{port}/healthz",
                self._logs / f"proxy-{arm.name}{suffix}.log",
                env=env,
            )
            self._start(proxy)
            commands.append(command)
            self.proxy_urls.append(f"http://127.0.0.1:{port}/v1")
        self.proxy_command = commands[0] if len(commands) == 1 else commands
        self.proxy_url = self.proxy_urls[0]
        return self

    def _launch(self, launch: Launch) -> str:
        env = None
        if isinstance(launch, VllmLaunch):
            from repairproxy.local.vllm_cpu import VllmCpuError

            try:
                launch = launch.prepared()
            except VllmCpuError as exc:
                raise LaunchError(f"arms.{self.arm.name}: {exc}") from exc
            env = dict(launch.env) or None
        port = launch.port or free_port(launch.host)
        kind = "vllm" if isinstance(launch, VllmLaunch) else "embedded"
        server = ManagedProcess(
            f"{kind} server for {self.arm.name}",
            launch.command(port),
            f"http://{launch.host}:{port}{launch.health_path}",
            self._logs / f"{kind}-{self.arm.name}.log",
            env=env,
            ready_timeout_s=launch.ready_timeout_s,
        )
        self._start(server)
        return f"http://{launch.host}:{port}/v1"

    def check(self) -> None:
        """Raise ``LaunchError`` (with its log) if a server of this arm has died."""
        for process in self.processes:
            if process.exited():
                raise process.exit_error()

    def _start(self, process: ManagedProcess) -> None:
        process.start()
        self.processes.append(process)
        self._stack.callback(process.stop)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ArmEndpoint:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
