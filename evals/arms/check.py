"""A short smoke test of an arm behind any OpenAI-compatible server, run before hours of grid.

Three steps, each printed as it ends: **loads** (``GET /models`` answers and lists a model),
**answers** (one plain chat turn comes back with text), **tool call** (a fixed prompt with one
declared tool comes back as a well-formed call of that tool with an ``order_id``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["CHECK_TOOL", "CheckResult", "StepResult", "check_upstream"]

CHECK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {
                    "type": "string",
                    "description": "The order id, such as '#W0000000'.",
                }
            },
            "required": ["order_id"],
        },
    },
}
_TOOL_PROMPT = [
    {
        "role": "system",
        "content": "You are a customer service agent. Use the tools to look orders up.",
    },
    {"role": "user", "content": "What is the status of my order #W2378156?"},
]
_PLAIN_PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class CheckResult:
    upstream: str
    model: str | None = None
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(step.ok for step in self.steps)


class _StepFailed(Exception):
    pass


def _chat(client: httpx.Client, model: str, messages: list[Any], **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "temperature": 0, **extra}
    response = client.post("chat/completions", json=body)
    if response.status_code != 200:
        raise _StepFailed(f"HTTP {response.status_code}: {response.text[:200]}")
    data = response.json()
    try:
        message: dict[str, Any] = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise _StepFailed(f"no choices[0].message in the answer: {str(data)[:200]}") from exc
    return message


def _loads(client: httpx.Client, wanted: str | None) -> tuple[str, str]:
    response = client.get("models")
    if response.status_code != 200:
        raise _StepFailed(f"GET /models: HTTP {response.status_code}")
    listed = response.json().get("data", [])
    ids = [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise _StepFailed("GET /models lists no model")
    if wanted is not None and wanted not in ids:
        raise _StepFailed(f"model {wanted!r} is not served (served: {', '.join(ids)})")
    model = wanted or ids[0]
    return model, f"serves {', '.join(ids)}; checking {model}"


def _answers(client: httpx.Client, model: str, max_tokens: int) -> str:
    message = _chat(client, model, _PLAIN_PROMPT, max_tokens=max_tokens)
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        raise _StepFailed(f"the answer has no text: {message}")
    return repr(content.strip()[:80])


def _tool_call(client: httpx.Client, model: str, max_tokens: int) -> str:
    message = _chat(
        client, model, _TOOL_PROMPT, tools=[CHECK_TOOL], tool_choice="auto", max_tokens=max_tokens
    )
    calls = message.get("tool_calls") or []
    if not calls:
        text = (message.get("content") or "").strip()
        # The paper's tool_call_in_content channel: the proxy's promote mode repairs this one.
        shape = " (a call written as text)" if CHECK_TOOL["function"]["name"] in text else ""
        raise _StepFailed(f"no tool call{shape}; the model wrote {text[:120]!r}")
    function = calls[0].get("function") or {}
    name, raw = function.get("name"), function.get("arguments")
    if name != CHECK_TOOL["function"]["name"]:
        raise _StepFailed(f"called {name!r}, not the one declared tool get_order_details")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise _StepFailed(f"arguments are not JSON: {raw!r}") from exc
    if not isinstance(arguments, dict) or not isinstance(arguments.get("order_id"), str):
        raise _StepFailed(f"arguments lack a string order_id: {raw!r}")
    return f"{name}({json.dumps(arguments)})"


def check_upstream(
    upstream: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    max_tokens: int = 64,
    on_step: Callable[[StepResult], None] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> CheckResult:
    """The three steps against ``upstream`` (a ``.../v1`` URL), stopping at the first failure."""
    result = CheckResult(upstream)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = upstream.rstrip("/") + "/"
    with httpx.Client(
        base_url=base, timeout=timeout, headers=headers, transport=transport
    ) as client:

        def run(name: str, action: Callable[[], str]) -> bool:
            started = time.perf_counter()
            try:
                detail, ok = action(), True
            except (_StepFailed, httpx.HTTPError, ValueError) as exc:
                detail, ok = str(exc) or type(exc).__name__, False
            step = StepResult(name, ok, detail, time.perf_counter() - started)
            result.steps.append(step)
            if on_step is not None:
                on_step(step)
            return ok

        def loads() -> str:
            result.model, detail = _loads(client, model)
            return detail

        if run("loads", loads) and result.model is not None:
            chosen = result.model
            if run("answers", lambda: _answers(client, chosen, max_tokens)):
                run("tool call", lambda: _tool_call(client, chosen, max_tokens))
    return result
