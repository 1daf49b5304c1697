"""The one exception tree of repairproxy, and its mapping to OpenAI-shaped error responses
(Anthropic-shaped on ``/v1/messages``: ``to_anthropic``).

    RepairProxyError                  base; carries status, type, code, param
    ├── BadRequestError               400 invalid_request_error
    │   ├── InvalidJSONBodyError      400 the request body is not JSON
    │   └── InvalidToolsError         400 a tool is not a valid JSON Schema (names it)
    ├── AuthenticationError           401 missing or wrong client API key
    ├── PermissionDeniedError         403 a valid key that may not open this route
    ├── NotFoundError                 404 no such route
    ├── ConflictError                 409 e.g. a message thread already continued
    ├── PayloadTooLargeError          413 body over the configured limit
    ├── BudgetExhaustedError          403 episode spent its budget (--on-budget-exhausted reject);
    │                                     403, not 429: clients (the openai SDK) retry 429
    ├── RepairExhaustedError          502 no valid answer after --max-repairs (--on-exhausted error)
    └── UpstreamError                 the upstream failed us
        ├── UpstreamUnavailableError  502 connection refused / reset / truncated body
        ├── UpstreamBadAnswerError    502 a 2xx whose body is not what the API promises
        ├── UpstreamTimeoutError      504 no answer within --upstream-timeout
        └── UpstreamStatusError       the upstream's own non-2xx answer to a re-ask: its reply
                                      is passed through as it is

Upstream 4xx/5xx *responses* are not exceptions: they pass through to the client as they are.
Each class also names the request ``outcome`` metrics count it under.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repairproxy.types import Outcome

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExhaustedError",
    "ConflictError",
    "InvalidJSONBodyError",
    "InvalidToolsError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RepairExhaustedError",
    "RepairProxyError",
    "UpstreamBadAnswerError",
    "UpstreamError",
    "UpstreamStatusError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "anthropic_error_body",
]

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_error_body(
    status: int, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An error in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``, with
    ``details`` (``{"error_code": ...}``, what the SDKs read to recover) when given."""
    kind = ANTHROPIC_ERROR_TYPES.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    error: dict[str, Any] = {"type": kind, "message": message}
    if details:
        error["details"] = dict(details)
    return {"type": "error", "error": error}


class RepairProxyError(Exception):
    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = None
    outcome: Outcome = Outcome.UPSTREAM_ERROR
    details: Mapping[str, Any] | None = None  # Anthropic's ``error.details`` (error_code, ...)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if details is not None:
            self.details = details

    def to_anthropic(self) -> dict[str, Any]:
        """The same error in Anthropic's shape, for ``/v1/messages``:
        ``{"type": "error", "error": {"type", "message", "details"?}}``: the type named by the
        status, ``details`` when the error has them (``{"error_code": "thread_not_found"}``)."""
        return anthropic_error_body(self.status_code, self.message, self.details)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequestError(RepairProxyError):
    status_code = 400
    error_type = "invalid_request_error"
    outcome = Outcome.CLIENT_ERROR


class InvalidJSONBodyError(BadRequestError):
    code = "invalid_json"


class InvalidToolsError(BadRequestError):
    code = "invalid_tools"

    def __init__(
        self, message: str, *, tool_name: str | None = None, param: str | None = "tools"
    ) -> None:
        super().__init__(message, param=param)
        self.tool_name = tool_name


class AuthenticationError(RepairProxyError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"
    outcome = Outcome.CLIENT_ERROR


class PermissionDeniedError(RepairProxyError):
    status_code = 403
    error_type = "permission_error"
    code = "permission_denied"
    outcome = Outcome.CLIENT_ERROR


class NotFoundError(RepairProxyError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"
    outcome = Outcome.CLIENT_ERROR


class ConflictError(RepairProxyError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"
    outcome = Outcome.CLIENT_ERROR


class PayloadTooLargeError(RepairProxyError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"
    outcome = Outcome.CLIENT_ERROR


class BudgetExhaustedError(RepairProxyError):
    status_code = 403
    error_type = "error_budget_exhausted"
    code = "error_budget_exhausted"
    outcome = Outcome.BUDGET_REJECTED


class RepairExhaustedError(RepairProxyError):
    """Raised by the repair loop when every attempt still held an invalid call."""

    status_code = 502
    error_type = "repair_exhausted"
    code = "repair_exhausted"
    outcome = Outcome.REPAIR_EXHAUSTED

    def __init__(self, message: str, *, attempts: int, channels: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.channels = channels


class UpstreamError(RepairProxyError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    code = "upstream_timeout"


class UpstreamBadAnswerError(UpstreamError):
    code = "upstream_bad_answer"


class UpstreamStatusError(UpstreamError):
    """A re-ask got a non-2xx answer; the route passes ``reply`` (an UpstreamReply) through."""

    def __init__(self, reply: Any) -> None:
        super().__init__(f"upstream answered {reply.status_code}")
        self.reply = reply
        self.status_code = int(reply.status_code)
