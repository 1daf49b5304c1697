"""The one exception tree of repairproxy, and its mapping to OpenAI-shaped error responses.

    RepairProxyError                  base; carries status, type, code, param
    ├── BadRequestError               400 invalid_request_error
    │   ├── InvalidJSONBodyError      400 the request body is not JSON
    │   └── InvalidToolsError         400 a tool is not a valid JSON Schema (names it)
    ├── AuthenticationError           401 missing or wrong client API key
    ├── PayloadTooLargeError          413 body over the configured limit
    ├── BudgetExhaustedError          429 episode spent its budget (--on-budget-exhausted reject)
    ├── RepairExhaustedError          502 no valid answer after --max-repairs (--on-exhausted error)
    └── UpstreamError                 the upstream failed us
        ├── UpstreamUnavailableError  502 connection refused / reset
        └── UpstreamTimeoutError      504 no answer within --upstream-timeout

Upstream 4xx/5xx *responses* are not exceptions: they pass through to the client as they are.
"""

from __future__ import annotations

from typing import Any


class RepairProxyError(Exception):
    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

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


class PayloadTooLargeError(RepairProxyError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class BudgetExhaustedError(RepairProxyError):
    status_code = 429
    error_type = "error_budget_exhausted"
    code = "error_budget_exhausted"


class RepairExhaustedError(RepairProxyError):
    """Raised by the repair loop when every attempt still held an invalid call."""

    status_code = 502
    error_type = "repair_exhausted"
    code = "repair_exhausted"

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
