"""A scripted OpenAI-compatible model server: the agent, replaying each task's gold actions.

It recognises the task from the conversation (the scripted user's opening message), asks once for
the customer's identity, then makes the gold ``assistant`` calls one per turn and ends with a text
that states the task's ``communicate_info``. Per arm (the first path segment: ``/<arm>/v1/...``) a
known share of the gold calls is first made under an invented tool name; once the conversation shows
that call (answered by the environment's "not found" error, or by the proxy's repair diagnosis) the
next answer makes the real call. So with repair off the agent meets exactly
``len(hallucinated_actions(task, share))`` tool-not-found errors, and with reflexive repair none.

    with GoldUpstream(tasks, {"a": GoldArm(share=0.5)}) as upstream:
        upstream.base_url("a")   # http://127.0.0.1:PORT/a/v1

Run as a program it stands in for ``vllm serve`` (``--port`` and ``--tasks FILE`` are read, every
other argument is recorded to ``$GOLD_UPSTREAM_ARGV_FILE`` and ignored); with
``$GOLD_UPSTREAM_EXIT_AFTER=N`` it dies on its (N+1)-th chat request, like a crashed server.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from evals.tau2.scripted_user import opening_message

__all__ = ["IDENTITY_QUESTION", "GoldArm", "GoldUpstream", "hallucinated_actions", "invented_name"]

IDENTITY_QUESTION = "Could you please tell me your name and zip code, or your email?"
_ids = itertools.count(1)


@dataclass(frozen=True)
class GoldArm:
    """How one arm misbehaves: the share of gold calls first made under an invented name."""

    share: float = 0.0
    prefix: str = "lookup_"
    delay_s: float = 0.0  # seconds to wait before each answer (lets a test kill a run mid-way)
    exit_after: int | None = None  # the process dies on the next chat request after this many


def hallucinated_actions(task: Mapping[str, Any], share: float) -> list[int]:
    """Indexes of the task's gold agent actions made under an invented name first (evenly spread:
    action i is when floor((i + 1) * share) > floor(i * share))."""
    actions = _agent_actions(task)
    return [i for i in range(len(actions)) if math.floor((i + 1) * share) > math.floor(i * share)]


def invented_name(name: str, prefix: str) -> str:
    return f"{prefix}{name}"


def _agent_actions(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    criteria = task.get("evaluation_criteria") or {}
    return [a for a in criteria.get("actions") or [] if a.get("requestor", "assistant") != "user"]


def _call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_gold_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments))},
    }


def _completion(model: str, content: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-gold-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _Script:
    """Decides the next answer from the request alone (no state: resumable, concurrent-safe)."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]]) -> None:
        openings: dict[str, list[Mapping[str, Any]]] = {}
        for task in tasks:
            openings.setdefault(opening_message(task.get("user_scenario") or {}), []).append(task)
        self._tasks = openings

    def answer(self, body: Mapping[str, Any], arm: GoldArm) -> dict[str, Any]:
        model = str(body.get("model", "gold"))
        messages = list(body.get("messages") or [])
        declared = {t["function"]["name"] for t in body.get("tools") or []}
        users = [m for m in messages if m.get("role") == "user"]
        if not users:
            raise LookupError("no user message to recognise the task from")
        candidates = self._tasks.get(str(users[0].get("content")), [])
        if len(candidates) != 1:
            raise LookupError(f"{len(candidates)} tasks open with {users[0].get('content')!r}")
        task = candidates[0]
        actions = _agent_actions(task)
        wrong = set(hallucinated_actions(task, arm.share))
        calls = [
            c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []
        ]
        done = sum(1 for c in calls if c["function"]["name"] in declared)
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        retried = any(
            c["function"]["name"] not in declared for c in (last or {}).get("tool_calls") or []
        )
        if done < len(actions):
            if not calls and len(users) == 1:
                return _completion(model, IDENTITY_QUESTION, [])
            action = actions[done]
            name = action["name"]
            if done in wrong and not retried:
                name = invented_name(name, arm.prefix)
            return _completion(model, None, [_call(name, action.get("arguments") or {})])
        info = (task.get("evaluation_criteria") or {}).get("communicate_info") or []
        told = f" For your information: {', '.join(map(str, info))}." if info else ""
        closing = f"Your request has been handled.{told} Is there anything else I can help with?"
        return _completion(model, closing, [])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _arm(self) -> tuple[str, str]:
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts and parts[0] != "v1" and len(parts) > 1:
            return parts[0], "/" + "/".join(parts[1:])
        return "default", "/" + "/".join(parts)

    def do_GET(self) -> None:
        _, path = self._arm()
        if path in ("/health", "/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "gold", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        arm_name, path = self._arm()
        state = self.server.state
        arm = state.arms.get(arm_name)
        if path != "/v1/chat/completions" or arm is None:
            self._send(404, {"error": {"message": f"no arm or route {self.path}", "type": "x"}})
            return
        with state.lock:
            if arm.exit_after is not None and len(state.requests) >= arm.exit_after:
                os._exit(3)
            state.requests.append((arm_name, body))
        if arm.delay_s:
            time.sleep(arm.delay_s)
        try:
            answer = state.script.answer(body, arm)
        except LookupError as exc:
            self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            return
        self._send(200, answer)


@dataclass
class _State:
    script: _Script
    arms: Mapping[str, GoldArm]
    lock: threading.Lock
    requests: list[tuple[str, dict[str, Any]]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: _State


class GoldUpstream:
    """Start on construction (a background thread on 127.0.0.1); ``close()`` to stop."""

    def __init__(
        self,
        tasks: Sequence[Mapping[str, Any]],
        arms: Mapping[str, GoldArm] | None = None,
        port: int = 0,
    ) -> None:
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.state = _State(
            _Script(tasks), dict(arms or {"default": GoldArm()}), threading.Lock(), []
        )
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def base_url(self, arm: str = "default") -> str:
        prefix = "" if arm == "default" else f"/{arm}"
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def set_arm(self, name: str, arm: GoldArm) -> None:
        """Add or change an arm while serving (e.g. drop the delay once a test has killed a run)."""
        with self._server.state.lock:
            self._server.state.arms = {**self._server.state.arms, name: arm}

    @property
    def requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every chat request received, as (arm, body), in order."""
        with self._server.state.lock:
            return list(self._server.state.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> GoldUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Stand in for ``vllm serve MODEL ...``: serve the gold answers on ``--port``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    record = os.environ.get("GOLD_UPSTREAM_ARGV_FILE")
    if record:
        Path(record).write_text(json.dumps(argv), encoding="utf-8")
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tasks", default=os.environ.get("GOLD_UPSTREAM_TASKS"))
    parser.add_argument(
        "--share", type=float, default=float(os.environ.get("GOLD_UPSTREAM_SHARE", "0"))
    )
    args, _ = parser.parse_known_args(argv)
    tasks = json.loads(Path(args.tasks).read_text(encoding="utf-8")) if args.tasks else []
    exit_after = os.environ.get("GOLD_UPSTREAM_EXIT_AFTER")
    arm = GoldArm(share=args.share, exit_after=int(exit_after) if exit_after else None)
    upstream = GoldUpstream(tasks, {"default": arm}, port=args.port)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        upstream.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
