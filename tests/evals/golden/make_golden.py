"""Make ``tau2_v1_0_1.json``: sha256 digests of what τ²-bench v1.0.1 itself sends to its models.

Run it with τ²-bench v1.0.1 installed in a Python 3.12 virtualenv of its own (never in this
project's), against the same data folder the engine reads::

    git --git-dir=/path/to/tau2-bench.git archive v1.0.1 src pyproject.toml README.md \\
        | tar -x -C /tmp/tau2
    ~/.pyenv/versions/3.12.1/bin/python -m venv /tmp/tau2-venv
    /tmp/tau2-venv/bin/pip install -e /tmp/tau2
    TAU2_DATA_DIR=/work/shared/tau2-data /tmp/tau2-venv/bin/python \\
        tests/evals/golden/make_golden.py tests/evals/golden/tau2_v1_0_1.json [DUMP_DIR]

For every task of the ``base`` split of Retail and Telecom it runs τ²-bench's own half-duplex
orchestrator with its own ``llm_agent`` and ``user_simulator``; ``litellm.completion`` is replaced
by a recorder that answers with fixed texts (user: ``USER_OPENING``; agent: ``AGENT_REPLY``; user
again: ``###STOP###``). The recorded requests are the user's first and the agent's first request.
Digests cover the exact strings (system prompts) and canonical JSON (sorted keys, no ``None``
values) of the message lists and tool schemas. ``tests/evals/test_golden.py`` computes the same
digests from our engine's requests.

The ``wire`` part goes one step further for the first base task of each domain: τ²-bench talks to
a loopback HTTP server through litellm, as it would to a real upstream, and the agent makes one
tool call; the digests are of the whole JSON bodies the server received (messages, tools,
``tool_choice``, ``temperature``, ``seed``, model), so a later turn's shape is pinned too.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

USER_OPENING = "Hi, I have a problem with my account."
AGENT_REPLY = "Sure, I can help with that. Could you tell me more?"
STOP = "###STOP###"
SEED = 300
TEMPERATURE = 0.0
DOMAINS = ("retail", "telecom")
REQUEST_PARAMS = ("tool_choice", "temperature", "seed")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical(value: Any) -> str:
    """Sorted keys, compact separators, non-ASCII kept; the form both sides hash."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def without_none(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if value is not None}


def request_digests(request: dict[str, Any]) -> dict[str, Any]:
    messages = [without_none(m) for m in request["messages"]]
    tools = request.get("tools")
    return {
        "system_prompt": sha256(messages[0]["content"]),
        "messages": sha256(canonical(messages)),
        "tools": sha256(canonical(tools)) if tools else None,
        "tool_names": [t["function"]["name"] for t in tools] if tools else [],
        "params": {k: request.get(k) for k in REQUEST_PARAMS},
    }


class Recorder:
    """Stands in for ``litellm.completion``: records each request, answers from a script."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        from litellm import ModelResponse

        self.requests.append(kwargs)
        script = [USER_OPENING, AGENT_REPLY, STOP]
        content = script[min(len(self.requests), len(script)) - 1]
        return ModelResponse(
            model=kwargs["model"],
            choices=[
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        )


def golden_for_domain(domain: str, dump: Path | None) -> dict[str, Any]:
    import tau2.utils.llm_utils as llm_utils
    from tau2.registry import registry

    tasks = registry.get_tasks_loader(domain)("base")
    out: dict[str, Any] = {"tasks": {}}
    real_completion = llm_utils.completion
    try:
        _record_tasks(domain, tasks, out, dump)
    finally:
        llm_utils.completion = real_completion
    return out


def _record_tasks(domain: str, tasks: list[Any], out: dict[str, Any], dump: Path | None) -> None:
    import tau2.utils.llm_utils as llm_utils
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.runner.build import build_agent, build_environment, build_user

    for task in tasks:
        recorder = Recorder()
        llm_utils.completion = recorder  # the name generate() calls
        environment = build_environment(domain)
        agent = build_agent(
            "llm_agent", environment, llm="golden-agent", llm_args={"temperature": TEMPERATURE}
        )
        user = build_user(
            "user_simulator",
            environment,
            task,
            llm="golden-user",
            llm_args={"temperature": TEMPERATURE},
        )
        orchestrator = Orchestrator(
            domain=domain,
            agent=agent,
            user=user,
            environment=environment,
            task=task,
            seed=SEED,
        )
        orchestrator.run()
        user_first, agent_first = recorder.requests[0], recorder.requests[1]
        if dump is not None:  # the raw requests, for reading a mismatch (never committed)
            dump.mkdir(parents=True, exist_ok=True)
            raw = {"user": user_first, "agent": agent_first}
            (dump / f"{domain}-{sha256(task.id)[:12]}.json").write_text(
                json.dumps(raw, indent=1, ensure_ascii=False, default=str), encoding="utf-8"
            )
        assert user_first["model"] == "golden-user" and agent_first["model"] == "golden-agent"
        agent_digests = request_digests(agent_first)
        for key in ("system_prompt", "tools", "tool_names", "params"):
            previous = out.setdefault(f"agent_{key}", agent_digests[key])
            assert previous == agent_digests[key], f"{domain}: agent {key} varies by task"
        user_digests = request_digests(user_first)
        names = user_digests.pop("tool_names")
        assert out.setdefault("user_tool_names", names) == names, f"{domain}: user tools vary"
        out["tasks"][task.id] = {
            "user_first_request": user_digests,
            "agent_first_request_messages": agent_digests["messages"],
        }


# The wire check: one task per domain played over real HTTP through litellm, with a tool call.
WIRE_CALLS = {
    "retail": ("find_user_id_by_email", {"email": "noa.doe@example.com"}),
    "telecom": ("get_customer_by_phone", {"phone_number": "555-123-2002"}),
}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def wire_script(domain: str) -> list[dict[str, Any]]:
    """The answers, in request order: [user (a device tool call, Telecom only)], user, agent (a
    tool call), agent, user (stop)."""
    name, arguments = WIRE_CALLS[domain]
    device = [{"content": None, "tool_calls": [_call("call_wire_0", "check_status_bar", {})]}]
    return [
        *(device if domain == "telecom" else []),
        {"content": USER_OPENING},
        {"content": None, "tool_calls": [_call("call_wire_1", name, arguments)]},
        {"content": AGENT_REPLY},
        {"content": STOP},
    ]


def wire_golden(domain: str, dump: Path | None) -> dict[str, Any]:
    """The four HTTP request bodies τ²-bench (through litellm) sends for the first base task."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.registry import registry
    from tau2.runner.build import build_agent, build_environment, build_user

    script = wire_script(domain)
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            bodies.append(body)
            message = script[min(len(bodies), len(script)) - 1]
            reply = {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", **message},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/v1"
    task = registry.get_tasks_loader(domain)("base")[0]
    environment = build_environment(domain)
    args = {"temperature": TEMPERATURE, "api_base": base, "api_key": "x"}
    agent = build_agent("llm_agent", environment, llm="openai/golden-agent", llm_args=dict(args))
    user = build_user(
        "user_simulator", environment, task, llm="openai/golden-user", llm_args=dict(args)
    )
    Orchestrator(
        domain=domain, agent=agent, user=user, environment=environment, task=task, seed=SEED
    ).run()
    server.shutdown()
    assert len(bodies) == len(script), f"{domain}: {len(bodies)} requests"
    if dump is not None:
        (dump / f"wire-{domain}.json").write_text(json.dumps(bodies, indent=1), encoding="utf-8")
    return {
        "task_id": task.id,
        "script": script,
        "models": [body["model"] for body in bodies],
        "bodies": [sha256(canonical(body)) for body in bodies],
    }


NL_CONVERSATION = [
    ("assistant", "Hi! How can I help you today?"),
    ("user", "I want to return my order."),
    ("tool", "Error: Order not found"),
]
NL_ASSERTIONS = ["Agent is polite.", "Agent explains the return policy."]


def nl_judge_golden() -> dict[str, Any]:
    """The judge's prompts τ²-bench builds for NL assertions (its judge model call recorded)."""
    import tau2.evaluator.evaluator_nl_assertions as nl
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage

    captured: dict[str, Any] = {}

    def record(model: str, messages: list[Any], **kwargs: Any) -> Any:
        captured.update(model=model, messages=messages, kwargs=kwargs)
        return AssistantMessage(role="assistant", content='{"results": []}')

    nl.generate = record
    kinds = {"assistant": AssistantMessage, "user": UserMessage}
    trajectory = [
        ToolMessage(id="t", role="tool", content=content)
        if role == "tool"
        else kinds[role](role=role, content=content)
        for role, content in NL_CONVERSATION
    ]
    nl.NLAssertionsEvaluator.evaluate_nl_assertions(trajectory, NL_ASSERTIONS)
    system, user = captured["messages"]
    return {
        "conversation": NL_CONVERSATION,
        "assertions": NL_ASSERTIONS,
        "system_prompt": sha256(system.content),
        "user_prompt": sha256(user.content),
        "temperature": captured["kwargs"].get("temperature"),
    }


def main(argv: list[str]) -> int:
    import tau2

    target = Path(argv[1])
    dump = Path(argv[2]) if len(argv) > 2 else None
    golden = {
        "tau2_version": getattr(tau2, "__version__", "1.0.1"),
        "made_by": "tests/evals/golden/make_golden.py",
        "script": {
            "user_opening": USER_OPENING,
            "agent_reply": AGENT_REPLY,
            "seed": SEED,
            "temperature": TEMPERATURE,
        },
        "domains": {domain: golden_for_domain(domain, dump) for domain in DOMAINS},
        "wire": {domain: wire_golden(domain, dump) for domain in DOMAINS},
        "nl_judge": nl_judge_golden(),
    }
    target.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    counts = {d: len(golden["domains"][d]["tasks"]) for d in DOMAINS}
    print(f"wrote {target}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
