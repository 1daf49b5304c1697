"""Telecom state: task setup, agent/phone sync, environment assertions, db_hash, tasks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evals.tau2.domains.telecom import TelecomDomain, TelecomEnvironment, load
from evals.tau2.domains.telecom.agent_tools import TelecomTools
from evals.tau2.domains.telecom.user_tools import TelecomUserTools
from evals.tau2.domains.toolkit import ToolKit
from evals.tau2.tasks import EnvFunctionCall

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def telecom(tau2_data_dir: Path) -> TelecomDomain:
    return load(tau2_data_dir)


def user_call(func_name: str, **arguments: Any) -> dict[str, Any]:
    return {"env_type": "user", "func_name": func_name, "arguments": arguments}


def agent_call(func_name: str, **arguments: Any) -> dict[str, Any]:
    return {"env_type": "assistant", "func_name": func_name, "arguments": arguments}


def assertion(call: dict[str, Any], assert_value: bool = True) -> dict[str, Any]:
    return {**call, "assert_value": assert_value, "message": None}


def set_up(telecom: TelecomDomain, *actions: dict[str, Any]) -> TelecomEnvironment:
    env = telecom.new_environment()
    user = user_call("set_user_info", name="John Smith", phone_number="555-123-2002")
    env.apply_initial_state({"initialization_actions": [user, *actions]})
    return env


def test_every_function_the_tasks_name_is_implemented(telecom: TelecomDomain) -> None:
    sides: dict[str, type[ToolKit]] = {"assistant": TelecomTools, "user": TelecomUserTools}
    named = set()
    for task in telecom.tasks(split=None):
        assert task.evaluation_criteria is not None
        calls: list[EnvFunctionCall] = []
        calls += (task.initial_state.initialization_actions if task.initial_state else None) or []
        calls += task.evaluation_criteria.env_assertions or []
        named |= {(call.env_type, call.func_name) for call in calls}
        for action in task.gold_actions:
            assert sides[action.requestor].has_tool(action.name), action
    missing = sorted(pair for pair in named if not sides[pair[0]].has_env_function(pair[1]))
    assert missing == []
    assert len(named) >= 20


def test_initialization_actions_shape_the_phone(telecom: TelecomDomain) -> None:
    env = set_up(
        telecom,
        user_call("turn_airplane_mode_on"),
        user_call("set_user_location", abroad=True),
        agent_call("disable_roaming", customer_id="C1001", line_id="L1002"),
        agent_call("set_data_usage", customer_id="C1001", line_id="L1002", data_used_gb=15.1),
    )
    device, around = env.user_db.device, env.user_db.surroundings
    assert device.airplane_mode and device.network_connection_status.value == "no_service"
    assert around.name == "John Smith" and around.is_abroad
    # Synchronised from the carrier's records after each action:
    assert around.roaming_allowed is False
    assert around.mobile_data_usage_exceeded is True
    assert around.line_active is True


def test_overdue_bill_setup_suspends_the_line_and_requests_payment(telecom: TelecomDomain) -> None:
    env = set_up(
        telecom,
        agent_call(
            "suspend_line_for_overdue_bill",
            customer_id="C1001",
            line_id="L1002",
            new_bill_id="B1234321",
            contract_ended=False,
        ),
    )
    bill = next(bill for bill in env.agent_db.bills if bill.bill_id == "B1234321")
    assert (bill.status.value, bill.total_due, str(bill.period_start)) == (
        "Overdue",
        65.0,
        "2025-01-01",
    )
    assert env.user_db.surroundings.line_active is False
    assert env.user_db.device.network_connection_status.value == "connected"  # until a search
    exists = agent_call(
        "assert_overdue_bill_exists", customer_id="C1001", overdue_bill_id="B1234321"
    )
    assert env.run_env_assertion(assertion(exists))
    no_overdue = agent_call("assert_no_overdue_bill", overdue_bill_id="B1234321")
    assert not env.run_env_assertion(assertion(no_overdue))
    assert env.run_env_assertion(assertion(no_overdue, assert_value=False))


def test_env_assertions_track_the_state(telecom: TelecomDomain) -> None:
    env = set_up(telecom, user_call("turn_airplane_mode_on"))
    no_service = assertion(user_call("assert_service_status", expected_status="no_service"))
    data_on = assertion(user_call("assert_mobile_data_status", expected_status=True))
    fast = assertion(
        user_call("assert_internet_speed", expected_speed=200, expected_desc="excellent")
    )
    assert env.run_env_assertion(no_service)
    assert not env.run_env_assertion(data_on)
    assert not env.run_env_assertion(fast)
    assert not env.call_tool("user", "toggle_airplane_mode", {}).error
    assert not env.run_env_assertion(no_service)
    assert env.run_env_assertion(data_on)
    assert env.run_env_assertion(fast)
    refuel = assertion(
        agent_call(
            "assert_data_refueling_amount",
            customer_id="C1001",
            line_id="L1002",
            expected_amount=2.0,
        )
    )
    assert not env.run_env_assertion(refuel)
    env.call_tool(
        "assistant", "refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0}
    )
    assert env.run_env_assertion(refuel)


def test_assertion_errors(telecom: TelecomDomain) -> None:
    env = telecom.new_environment()
    with pytest.raises(ValueError, match="Function assert_magic not found in user tools"):
        env.run_env_assertion(assertion(user_call("assert_magic")))
    with pytest.raises(ValueError, match="instead of bool"):
        env.run_env_assertion(assertion(user_call("check_status_bar")))
    # An assertion function that raises (no such bill) is simply not met.
    missing = agent_call("assert_overdue_bill_exists", customer_id="C1001", overdue_bill_id="B0")
    assert env.run_env_assertion(assertion(missing)) is False


def test_initialization_data_is_merged_into_both_databases(telecom: TelecomDomain) -> None:
    env = telecom.new_environment()
    env.apply_initial_state(
        {
            "initialization_data": {
                "agent_data": {"plans": []},
                "user_data": {
                    "device": {"battery_level": 12, "active_apn_settings": {"mms_apn": "x"}}
                },
            },
            "initialization_actions": None,
            "message_history": None,
        }
    )
    assert env.agent_db.plans == []
    assert env.user_db.device.battery_level == 12
    assert env.user_db.device.active_apn_settings.mms_apn == "x"
    assert (
        env.user_db.device.active_apn_settings.apn_name.value == "internet"
    )  # merged, not replaced


def test_bad_setup_raises(telecom: TelecomDomain) -> None:
    env = telecom.new_environment()
    with pytest.raises(ValueError, match="Line with phone number 555-000-0000 not found"):
        env.apply_initial_state(
            {
                "initialization_actions": [
                    user_call("set_user_info", name="X", phone_number="555-000-0000")
                ]
            }
        )


def test_environments_are_independent(telecom: TelecomDomain) -> None:
    first, second = telecom.new_environment(), telecom.new_environment()
    assert first.db_hash() == second.db_hash()
    first.call_tool("assistant", "enable_roaming", {"customer_id": "C1001", "line_id": "L1001"})
    assert first.db_hash() != second.db_hash()
    assert telecom.new_environment().db_hash() == second.db_hash()


def test_db_hash_covers_both_sides_and_ignores_reads(telecom: TelecomDomain) -> None:
    env = telecom.new_environment()
    start = env.db_hash()
    assert len(start) == 64
    env.call_tool("assistant", "get_customer_by_id", {"customer_id": "C1001"})
    env.call_tool("user", "check_network_status", {})
    assert env.db_hash() == start
    env.call_tool("user", "toggle_data_saver_mode", {})
    assert env.db_hash() != start
    env.call_tool("user", "toggle_data_saver_mode", {})
    assert env.db_hash() == start


def test_db_hash_is_the_same_in_another_process(
    telecom: TelecomDomain, tau2_data_dir: Path
) -> None:
    task = telecom.tasks()[0]
    script = (
        "import json, sys; from pathlib import Path; from evals.tau2.domains.telecom import load\n"
        "domain = load(Path(sys.argv[1])); task = json.loads(sys.argv[2])\n"
        "env = domain.new_environment(); env.apply_initial_state(task['initial_state'])\n"
        "print(env.db_hash())\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script, str(tau2_data_dir), task.model_dump_json()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout.strip()
    env = telecom.new_environment()
    env.apply_initial_state(task.initial_state)
    assert output == env.db_hash()


def test_tasks_and_policy(telecom: TelecomDomain) -> None:
    base = telecom.tasks()
    assert len(base) == 114
    # The other splits of split_tasks.json name v1's 2,285 tasks, which this tasks.json lacks.
    assert {task.id for task in telecom.tasks("test")} <= {task.id for task in base}
    assert len(telecom.tasks(None)) >= len(base)
    with pytest.raises(ValueError, match="Invalid task split name"):
        telecom.tasks("nope")
    base[0].id = "edited"
    assert telecom.tasks()[0].id != "edited"
    assert telecom.name == "telecom"
    assert telecom.policy.startswith("<main_policy>\n# Telecom Agent Policy")
    assert "\n</main_policy>\n<tech_support_policy>\n" in telecom.policy
    assert telecom.policy.endswith("\n</tech_support_policy>")
