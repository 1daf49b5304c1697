"""The framework tool-error table against the frameworks' real output.

Each sample is what the framework itself wrote into the ``role: tool`` message, captured by
running it (in a scratch venv, never this project's) against a loopback fake OpenAI server, or by
calling the function named: openai-agents 0.24.0, pydantic-ai-slim 2.68.0, langgraph 1.2.24,
langchain-core 1.8.3. Older formats are copied from the source file and tag cited beside them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from repairproxy.episodes.chaining import canonical_message
from repairproxy.episodes.tool_errors import (
    DEFAULT_TOOL_ERROR_PATTERN,
    KNOWN_FORMATS,
    MAX_SCANNED_CHARS,
    ErrorClassifier,
    ToolErrorDetector,
    scanned_text,
)
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.in_process import in_process_proxy
from tests.support.mock_transport import MockTransport
from tests.support.scripted_upstream import completion, tool_call

# (framework that must match, label, the text exactly as the framework wrote it)
REAL_ERRORS: list[tuple[str, str, str]] = [
    # instructor 1.17.0, Mode.TOOLS, max_retries=1: its re-ask after a pydantic ValidationError
    # (captured in tests/data/frameworks/instructor-1.17.0-tools.json).
    (
        "instructor",
        "env_argument_error",
        "Validation Error found:\n1 validation error for Person\nage\n  Input should be a valid "
        "integer [type=int_type, input_value='forty', input_type=str]\n    For further "
        "information visit https://errors.pydantic.dev/2.14/v/int_type\nRecall the function "
        "correctly, fix the errors",
    ),
    # τ²-bench v1.0.1 environment: f"Error: {e}" (the texts of evals/domains, which replicate it).
    ("tau2-bench", "env_unknown_tool", "Error: Tool 'get_order_status' not found."),
    ("tau2-bench", "env_entity_not_found", "Error: Order not found"),
    (
        "tau2-bench",
        "env_argument_error",
        "Error: RetailTools.get_user_details() got an unexpected keyword argument 'email'",
    ),
    (
        "tau2-bench",
        "env_argument_error",
        "Error: Invalid arguments for tool 'get_order_details': expected a JSON object, "
        "got '{\"order_id\": 5'",
    ),
    ("tau2-bench", "env_other_error", "Error: Non-pending order cannot be cancelled"),
    # langgraph 1.2.24, ToolNode(handle_tool_errors=True), the tool raised ValueError:
    # TOOL_CALL_ERROR_TEMPLATE in langgraph/prebuilt/tool_node.py.
    (
        "tau2-bench",
        "env_entity_not_found",
        "Error: ValueError('Order not found')\n Please fix your mistakes.",
    ),
    # langgraph 1.2.24, default ToolNode, arguments failing the tool's schema
    # (TOOL_INVOCATION_ERROR_TEMPLATE) and an undeclared tool (INVALID_TOOL_NAME_ERROR_TEMPLATE).
    (
        "tau2-bench",
        "env_argument_error",
        "Error invoking tool 'get_order_details' with kwargs {'order_id': 5} with error:\n"
        " order_id: Input should be a valid string\n Please fix the error and try again.",
    ),
    (
        "tau2-bench",
        "env_unknown_tool",
        "Error: get_order_status is not a valid tool, try one of [get_order_details].",
    ),
    # openai-agents 0.24.0 default_tool_error_function (a raising tool, and invalid JSON input).
    (
        "openai-agents",
        "env_other_error",
        "An error occurred while running the tool. Please try again.",
    ),
    # openai-agents 0.25.0 default_tool_error_function (src/agents/tool.py): the sentence alone,
    # for a raising tool and invalid JSON input alike.
    (
        "openai-agents",
        "env_other_error",
        "An error occurred while running the tool.",
    ),
    # openai-agents v0.0.3-v0.22.0 src/agents/tool.py default_tool_error_function:
    # f"An error occurred while running the tool. Please try again. Error: {str(error)}"
    (
        "openai-agents",
        "env_entity_not_found",
        "An error occurred while running the tool. Please try again. Error: Order not found",
    ),
    # openai-agents v0.14.0-v0.22.0, the JSON-decode branch of the same function.
    (
        "openai-agents",
        "env_argument_error",
        "An error occurred while parsing tool arguments. Please try again with valid JSON. "
        "Error: Expecting ',' delimiter: line 1 column 16 (char 15)",
    ),
    # openai-agents default_tool_timeout_error_message.
    (
        "openai-agents-timeout",
        "env_other_error",
        "Tool 'get_order_details' timed out after 2.5 seconds.",
    ),
    # pydantic-ai RetryPromptPart.model_response (pydantic_ai_slim/pydantic_ai/messages.py,
    # v0.0.14-v2.33, what OpenAIModel sends as the tool message; run with 2.68.0): ModelRetry,
    # a validation error, an unknown tool.
    (
        "pydantic-ai-retry",
        "env_entity_not_found",
        "Order not found\n\nFix the errors and try again.",
    ),
    (
        "pydantic-ai-retry",
        "env_argument_error",
        '1 validation error:\n```json\n[\n  {\n    "type": "string_type",\n    "loc": [\n'
        '      "order_id"\n    ],\n    "msg": "Input should be a valid string",\n'
        '    "input": 5\n  }\n]\n```\n\nFix the errors and try again.',
    ),
    (
        "pydantic-ai-retry",
        "env_unknown_tool",
        "Unknown tool name: 'get_order_status'. Available tools: 'get_order_details'\n\n"
        "Fix the errors and try again.",
    ),
    # pydantic-ai 2.68.0 OpenAIChatModel, the same three failures on the wire.
    ("pydantic-ai-json", "env_entity_not_found", '{"error":"Order not found"}'),
    (
        "pydantic-ai-json",
        "env_argument_error",
        '{"error":[{"type":"string_type","loc":["order_id"],'
        '"msg":"Input should be a valid string","input":5}]}',
    ),
    (
        "pydantic-ai-json",
        "env_unknown_tool",
        '{"error":"Unknown tool name: \'get_order_status\'. Available tools: '
        "'get_order_details'\"}",
    ),
    # langchain-core 1.8.3 handle_tool_error=True on an empty ToolException, and
    # handle_validation_error=True (langchain_core/tools/base.py).
    ("langchain-tool-exception", "env_other_error", "Tool execution error"),
    ("langchain-tool-exception", "env_argument_error", "Tool input validation error"),
]

NOT_ERRORS = [
    '{"order_id": "#W1", "status": "delivered"}',
    "Order #W1 is delivered.",
    "The word Error: mid-text",
    "",
    '{"errors_found": 0}',
    # the openai-agents sentence opening a result that goes on: a tool's own text, not the
    # framework's error (0.25.0's is the sentence alone)
    "An error occurred while running the tool. The retry succeeded: order #W1 is delivered.",
    # langchain-core 1.8.3: a ToolException("Order not found") with handle_tool_error=True is
    # sent as its bare message, which no text rule can tell from a result (documented limit).
    "Order not found",
]


@pytest.mark.parametrize(("framework", "label", "text"), REAL_ERRORS)
def test_real_framework_errors_are_detected_and_labelled(
    framework: str, label: str, text: str
) -> None:
    detector = ToolErrorDetector()
    assert detector.is_error(text)
    assert detector.framework(text) == framework
    assert ErrorClassifier()(text) == label


@pytest.mark.parametrize("text", NOT_ERRORS)
def test_ordinary_results_are_not_errors(text: str) -> None:
    assert not ToolErrorDetector().is_error(text)


def test_every_format_has_a_real_sample() -> None:
    assert {f.framework for f in KNOWN_FORMATS} == {framework for framework, _, _ in REAL_ERRORS}
    assert all(f.source for f in KNOWN_FORMATS)


def test_an_operator_pattern_replaces_the_table() -> None:
    custom = ToolErrorDetector(r"^FAILED")
    assert custom.is_error("FAILED: order #W9 not found")
    assert custom.framework("FAILED: x") == "custom"
    assert not custom.is_error("Error: this does not match the pattern")
    assert not custom.is_error("An error occurred while running the tool. Please try again.")
    # The default value selects the table, as does None.
    for default in (DEFAULT_TOOL_ERROR_PATTERN, None):
        table = ToolErrorDetector(default)
        assert table.is_error("Order not found\n\nFix the errors and try again.")


def test_huge_results_are_scanned_at_both_ends_only() -> None:
    body = "x" * 1_000_000
    assert len(scanned_text(body)) <= MAX_SCANNED_CHARS + 8
    detector = ToolErrorDetector()
    assert detector.is_error("Error: " + body)
    assert detector.is_error(body + "\n\nFix the errors and try again.")
    assert not detector.is_error(body + "Error: in the middle" + body)


def test_the_label_memory_keeps_no_long_texts() -> None:
    classify = ErrorClassifier()
    long_text = "Error: Order not found " + "y" * 1_000_000
    for _ in range(3):
        assert classify(long_text) == "env_entity_not_found"
    assert classify("Error: Order not found") == "env_entity_not_found"
    kept = classify._labels
    assert kept and max(map(len, kept)) <= ErrorClassifier.MAX_REMEMBERED_TEXT_CHARS


# -- frameworks whose protocol the table reads, from captured real output ---------------------

FRAMEWORKS = Path(__file__).resolve().parents[1] / "data" / "frameworks"


def _captured(name: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = orjson.loads((FRAMEWORKS / name).read_bytes())
    return requests


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content or "")


def test_instructor_retry_text_is_a_known_error_format() -> None:
    retry = _captured("instructor-1.17.0-tools.json")[1]["messages"][-1]
    assert retry["role"] == "tool"
    detector = ToolErrorDetector()
    assert detector.is_error(retry["content"])
    assert detector.framework(retry["content"]) == "instructor"
    assert ErrorClassifier()(retry["content"]) == "env_argument_error"


def test_smolagents_errors_written_in_the_user_message_are_found() -> None:
    requests = _captured("smolagents-1.26.0.json")
    errored = _text_of(requests[3]["messages"][-1])
    (error,) = ToolErrorDetector().errors_in_text(errored)
    assert error.startswith("Error executing tool 'get_order_details'")
    assert ErrorClassifier()(error) == "env_entity_not_found"
    # An observation is a result, not an error; an operator's own pattern replaces the table.
    assert ToolErrorDetector().errors_in_text(_text_of(requests[1]["messages"][-1])) == []
    assert ToolErrorDetector(r"^Oops").errors_in_text(errored) == []


def test_smolagents_resent_call_text_digests_as_the_delivered_call() -> None:
    requests = _captured("smolagents-1.26.0.json")
    resent = requests[1]["messages"][2]
    assert _text_of(resent).startswith("Calling tools:\n[")
    delivered = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a1",
                "type": "function",
                "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'},
            }
        ],
    }
    assert canonical_message(resent) == canonical_message(delivered)


def _replay(requests: list[dict[str, Any]], headers: list[dict[str, str]]) -> list[httpx.Response]:
    """The captured requests sent again through the proxy, the upstream answering as it did."""
    transport = MockTransport(
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"}, "call_a1")]),
        completion(tool_calls=[tool_call("final_answer", {"answer": "Delivered."}, "call_a2")]),
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W2"}, "call_b1")]),
        completion(tool_calls=[tool_call("final_answer", {"answer": "Not found."}, "call_b2")]),
    )

    async def run() -> list[httpx.Response]:
        settings = Settings(upstream="http://mock/v1", repair=RepairMode.REFLEXIVE)
        async with in_process_proxy(settings, transport) as proxy:
            return [
                await proxy.http.post("/v1/chat/completions", json=body, headers=extra)
                for body, extra in zip(requests, headers, strict=True)
            ]

    return asyncio.run(run())


def test_smolagents_runs_chain_and_count_their_tool_errors() -> None:
    requests = _captured("smolagents-1.26.0.json")
    replies = _replay(requests, [{}] * 4)
    episodes = [reply.headers["x-repairproxy-episode-id"] for reply in replies]
    assert episodes[0] == episodes[1]  # the resent "Calling tools:" text continues the run
    assert episodes[2] != episodes[1]  # the second run is its own episode
    # After the tool error smolagents resends no turn of the failed call: still the same run.
    assert episodes[3] == episodes[2]
    assert len(set(episodes)) == 2
    errors = [reply.headers["x-repairproxy-episode-errors"] for reply in replies]
    assert errors == ["0", "0", "0", "1"]
    # With the episode header the error written into the user message is counted, once.
    marked = _replay(requests, [{}, {}, {"x-episode-id": "run2"}, {"x-episode-id": "run2"}])
    assert [r.headers["x-repairproxy-episode-errors"] for r in marked[2:]] == ["0", "1"]
