"""One Telecom episode's world: the carrier's database, the user's phone, and the link between them.

After every successful tool call (either side) and every setup or assertion function, the phone
is re-synchronised from the carrier's records, as τ²-bench's ``TelecomEnvironment.sync_tools``
does: the line's status and roaming flag, the data allowance, and payment requests flow to the
phone, and a payment made on the phone marks the bill paid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from evals.tau2.domains.base import Requestor, ToolResult
from evals.tau2.domains.telecom.agent_tools import TelecomTools
from evals.tau2.domains.telecom.device import PaymentRequest, TelecomUserDB
from evals.tau2.domains.telecom.models import LineStatus, TelecomDB
from evals.tau2.domains.telecom.serialize import to_json_str
from evals.tau2.domains.telecom.user_tools import TelecomUserTools
from evals.tau2.domains.toolkit import ToolKit
from evals.tau2.tasks import (
    EnvAssertion,
    EnvFunctionCall,
    InitialState,
    as_env_assertion,
    as_initial_state,
)

__all__ = ["TelecomEnvironment", "ToolSchemas"]

ToolSchemas = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts merge key by key; anything else (lists included) is replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class TelecomEnvironment:
    """Implements ``evals.tau2.domains.base.DomainEnvironment`` for Telecom (dual control)."""

    def __init__(self, db: TelecomDB, user_db: TelecomUserDB, schemas: ToolSchemas) -> None:
        self._agent = TelecomTools(db)
        self._user = TelecomUserTools(user_db)
        self._schemas = schemas
        self._sync()

    @property
    def agent_db(self) -> TelecomDB:
        return self._agent.db

    @property
    def user_db(self) -> TelecomUserDB:
        return self._user.db

    def agent_tools(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self._schemas[0]))  # type: ignore[no-any-return]

    def user_tools(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self._schemas[1]))  # type: ignore[no-any-return]

    def _toolkit(self, side: str) -> ToolKit:
        if side == "assistant":
            return self._agent
        if side == "user":
            return self._user
        raise ValueError(f"Invalid requestor: {side}")

    def call_tool(self, requestor: Requestor, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call as τ²-bench's ``get_response`` does: exceptions become ``Error: <text>``."""
        try:
            value = self._toolkit(requestor).call_tool(name, arguments)
            self._sync()
            content = to_json_str(value)
        except Exception as exc:  # every failure is the caller's tool message, never a crash
            return ToolResult(content=f"Error: {exc}", error=True)
        return ToolResult(content=content, error=False)

    def apply_initial_state(self, initial_state: InitialState | Mapping[str, Any] | None) -> None:
        """Apply ``initialization_data``, then run ``initialization_actions``, then replay history.

        Bad task data raises: a task that cannot be set up must not be scored.
        """
        state = as_initial_state(initial_state)
        if state is None:
            return
        data = state.initialization_data
        if data is not None and data.agent_data:
            merged = _deep_merge(self._agent.db.model_dump(), data.agent_data)
            self._agent.db = TelecomDB.model_validate(merged)
        if data is not None and data.user_data:
            merged = _deep_merge(self._user.db.model_dump(), data.user_data)
            self._user.db = TelecomUserDB.model_validate(merged)
        for action in state.initialization_actions or []:
            self._run_env_function(action)
        self._replay(state.message_history or [])
        self._sync()

    def _replay(self, messages: list[dict[str, Any]]) -> None:
        # Only calls that change state matter; τ²-bench skips reads and unknown tools likewise.
        for message in messages:
            for call in message.get("tool_calls") or []:
                side: Requestor = call.get("requestor") or message["role"]
                toolkit = self._toolkit(side)
                spec = toolkit.tool_specs().get(call["name"])
                if spec is not None and spec.mutates:
                    self.call_tool(side, call["name"], call.get("arguments") or {})

    def _run_env_function(self, call: EnvFunctionCall) -> Any:
        toolkit = self._toolkit(call.env_type)
        result = toolkit.call_env_function(call.func_name, call.arguments)
        self._sync()
        return result

    def run_env_assertion(self, assertion: EnvAssertion | Mapping[str, Any]) -> bool:
        """True when the assertion function's verdict equals ``assert_value``.

        An unknown function or a non-boolean verdict is a task-data error and raises; an assertion
        function that itself raises (e.g. the bill it checks does not exist) counts as not met.
        """
        typed = as_env_assertion(assertion)
        toolkit = self._toolkit(typed.env_type)
        name = typed.func_name
        if not toolkit.has_env_function(name):
            raise ValueError(f"Function {name} not found in {typed.env_type} tools")
        try:
            verdict = self._run_env_function(typed)
        except Exception:
            return False
        if not isinstance(verdict, bool):
            raise ValueError(f"Function {name} returned {type(verdict)} instead of bool")
        return bool(verdict == typed.assert_value)

    def db_hash(self) -> str:
        """sha256 of canonical JSON of both databases (carrier's and phone's)."""
        state = {
            "agent": self._agent.db.model_dump(mode="json", warnings=False),
            "user": self._user.db.model_dump(mode="json", warnings=False),
        }
        canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def _sync(self) -> None:
        """Propagate the carrier's view of the user's line to the phone (τ²-bench's sync_tools)."""
        around = self._user.db.surroundings
        phone_number = around.phone_number
        if phone_number is None:
            return
        agent = self._agent
        line = agent._line_by_phone(phone_number)
        around.line_active = line.status == LineStatus.ACTIVE
        around.roaming_allowed = line.roaming_enabled
        plan = agent._plan_by_id(line.plan_id)
        around.mobile_data_usage_exceeded = (
            line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
        )
        request = around.payment_request
        if request is not None and request.paid:
            agent._set_bill_to_paid(request.bill_id)
            around.payment_request = None
        if around.payment_request is None:
            customer = agent.get_customer_by_phone(phone_number)
            awaiting = agent._bills_awaiting_payment(customer)
            if awaiting:
                around.payment_request = PaymentRequest(
                    bill_id=awaiting[0].bill_id, amount_due=awaiting[0].total_due
                )
