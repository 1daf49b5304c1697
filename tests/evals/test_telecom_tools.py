"""Telecom tools: schemas, results, state changes and error texts as τ²-bench v1.0.1 has them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.tau2.domains.telecom import TelecomDomain, TelecomEnvironment, load

AGENT_TOOLS = [
    "get_customer_by_phone",
    "get_customer_by_id",
    "get_customer_by_name",
    "get_details_by_id",
    "suspend_line",
    "resume_line",
    "get_bills_for_customer",
    "send_payment_request",
    "get_data_usage",
    "enable_roaming",
    "disable_roaming",
    "transfer_to_human_agents",
    "refuel_data",
]


@pytest.fixture(scope="module")
def telecom(tau2_data_dir: Path) -> TelecomDomain:
    return load(tau2_data_dir)


@pytest.fixture
def env(telecom: TelecomDomain) -> TelecomEnvironment:
    return telecom.new_environment()


def ok(env: TelecomEnvironment, requestor: Any, name: str, **arguments: Any) -> str:
    result = env.call_tool(requestor, name, arguments)
    assert not result.error, result.content
    return result.content


def fails(env: TelecomEnvironment, requestor: Any, name: str, **arguments: Any) -> str:
    result = env.call_tool(requestor, name, arguments)
    assert result.error, result.content
    assert result.content.startswith("Error: ")
    return result.content


def with_user(
    env: TelecomEnvironment, name: str = "John Smith", phone: str = "555-123-2002"
) -> None:
    """Bind the phone to a line, as every task's first initialization action does."""
    env.apply_initial_state(
        {
            "initialization_actions": [
                {
                    "env_type": "user",
                    "func_name": "set_user_info",
                    "arguments": {"name": name, "phone_number": phone},
                }
            ]
        }
    )


# --- schemas ---


def test_agent_and_user_tool_lists(env: TelecomEnvironment) -> None:
    agent = [tool["function"]["name"] for tool in env.agent_tools()]
    user = [tool["function"]["name"] for tool in env.user_tools()]
    assert agent == AGENT_TOOLS
    assert len(user) == 30 and len(set(user)) == 30
    assert {
        "check_status_bar",
        "toggle_airplane_mode",
        "set_apn_settings",
        "reseat_sim_card",
    } <= set(user)
    assert not set(agent) & set(user)
    for tool in env.agent_tools() + env.user_tools():
        assert tool["type"] == "function"
        assert tool["function"]["description"]
        assert tool["function"]["parameters"]["type"] == "object"


def test_schemas_follow_signatures_and_docstrings(env: TelecomEnvironment) -> None:
    tools = {tool["function"]["name"]: tool["function"] for tool in env.agent_tools()}
    refuel = tools["refuel_data"]["parameters"]
    assert refuel["required"] == ["customer_id", "line_id", "gb_amount"]
    assert refuel["properties"]["gb_amount"] == {
        "description": "Amount of data to add in gigabytes.",
        "title": "Gb Amount",
        "type": "number",
    }
    bills = tools["get_bills_for_customer"]["parameters"]
    assert bills["required"] == ["customer_id"]
    assert bills["properties"]["limit"]["default"] == 12
    assert bills["properties"]["limit"]["type"] == "integer"
    # τ²-bench joins the docstring's first line and the rest with a blank line.
    assert tools["get_details_by_id"]["description"] == (
        "Retrieves the details for a given ID.\n\n"
        "The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan."
    )
    user = {tool["function"]["name"]: tool["function"] for tool in env.user_tools()}
    mode = user["set_network_mode_preference"]["parameters"]
    assert mode["$defs"]["NetworkModePreference"]["enum"] == [
        "4g_5g_preferred",
        "4g_only",
        "3g_only",
        "2g_only",
    ]
    assert user["toggle_data"]["parameters"]["properties"] == {}
    # The schemas are copies: a caller editing them cannot corrupt the next episode's.
    env.agent_tools()[0]["function"]["name"] = "changed"
    assert env.agent_tools()[0]["function"]["name"] == "get_customer_by_phone"


# --- agent tools ---


def test_customer_lookups(env: TelecomEnvironment) -> None:
    by_line = json.loads(ok(env, "assistant", "get_customer_by_phone", phone_number="555-123-2001"))
    assert by_line["customer_id"] == "C1001"
    # Dates inside models fall back to str(): a space, not ISO's "T" (τ²-bench's json default=str).
    assert by_line["created_at"] == "2025-01-15 10:30:00"
    assert by_line["account_status"] == "Active"
    assert fails(env, "assistant", "get_customer_by_phone", phone_number="555-000-0000") == (
        "Error: Customer with phone number 555-000-0000 not found"
    )
    found = json.loads(
        ok(env, "assistant", "get_customer_by_name", full_name="john smith", dob="1985-06-15")
    )
    assert [customer["customer_id"] for customer in found] == ["C1001"]
    assert (
        ok(env, "assistant", "get_customer_by_name", full_name="John Smith", dob="1985-06-16")
        == "[]"
    )
    assert fails(env, "assistant", "get_customer_by_id", customer_id="C9") == (
        "Error: Customer with ID C9 not found"
    )


def test_get_details_by_id_dispatches_on_prefix(env: TelecomEnvironment) -> None:
    assert json.loads(ok(env, "assistant", "get_details_by_id", id="L1002"))["phone_number"] == (
        "555-123-2002"
    )
    assert (
        json.loads(ok(env, "assistant", "get_details_by_id", id="P1002"))["data_limit_gb"] == 15.0
    )
    assert json.loads(ok(env, "assistant", "get_details_by_id", id="B1002"))["status"] == "Issued"
    assert (
        json.loads(ok(env, "assistant", "get_details_by_id", id="D1001"))["device_type"] == "phone"
    )
    assert fails(env, "assistant", "get_details_by_id", id="X1") == (
        "Error: Unknown ID format or type: X1"
    )
    assert (
        fails(env, "assistant", "get_details_by_id", id="L42")
        == "Error: Line with ID L42 not found"
    )


def test_suspend_and_resume_line(env: TelecomEnvironment) -> None:
    suspended = json.loads(
        ok(env, "assistant", "suspend_line", customer_id="C1001", line_id="L1001", reason="travel")
    )
    assert suspended["message"] == "Line suspended successfully. $5/month holding fee will apply."
    assert suspended["line"]["status"] == "Suspended"
    assert suspended["line"]["suspension_start_date"] == "2025-02-25"
    assert fails(
        env, "assistant", "suspend_line", customer_id="C1001", line_id="L1001", reason="again"
    ) == ("Error: Line must be active to suspend")
    resumed = json.loads(ok(env, "assistant", "resume_line", customer_id="C1001", line_id="L1001"))
    assert (
        resumed["line"]["status"] == "Active" and resumed["line"]["suspension_start_date"] is None
    )
    assert fails(env, "assistant", "resume_line", customer_id="C1001", line_id="L1001") == (
        "Error: Line must be suspended to resume"
    )
    assert fails(env, "assistant", "resume_line", customer_id="C1001", line_id="L1004") == (
        "Error: Line L1004 not found for customer C1001"
    )


def test_refuel_data_charges_the_draft_bill(env: TelecomEnvironment) -> None:
    result = json.loads(
        ok(env, "assistant", "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2.0)
    )
    # Scalars nested in a returned dict are str()-ed, as τ²-bench's to_json_str does.
    assert result == {
        "message": "Successfully added 2.0 GB of data for line L1002 for $4.00",
        "new_data_refueling_gb": "2.0",
        "charge": "4.0",
    }
    draft = json.loads(ok(env, "assistant", "get_details_by_id", id="B1003"))
    assert draft["total_due"] == 4.0
    assert draft["line_items"] == [
        {
            "description": "Data refueling: 2.0 GB at $2.0/GB",
            "amount": 4.0,
            "date": "2025-02-25",
            "item_type": "Charge",
        }
    ]
    usage = json.loads(ok(env, "assistant", "get_data_usage", customer_id="C1001", line_id="L1002"))
    assert usage["data_refueling_gb"] == "2.0"
    assert usage["cycle_end_date"] == "2025-02-28"
    assert fails(
        env, "assistant", "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=0
    ) == ("Error: Refuel amount must be positive")


def test_refuel_without_draft_bill_opens_next_months_bill(env: TelecomEnvironment) -> None:
    before = json.loads(ok(env, "assistant", "get_customer_by_id", customer_id="C1002"))["bill_ids"]
    ok(env, "assistant", "refuel_data", customer_id="C1002", line_id="L1004", gb_amount=1.0)
    after = json.loads(ok(env, "assistant", "get_customer_by_id", customer_id="C1002"))["bill_ids"]
    assert after[:-1] == before and len(after) == len(before) + 1
    bill = json.loads(ok(env, "assistant", "get_details_by_id", id=after[-1]))
    assert (bill["status"], bill["period_start"], bill["period_end"]) == (
        "Draft",
        "2025-03-01",
        "2025-03-31",
    )
    assert bill["total_due"] == pytest.approx(0.1)


def test_roaming_and_transfer(env: TelecomEnvironment) -> None:
    line = {"customer_id": "C1001", "line_id": "L1001"}
    assert ok(env, "assistant", "disable_roaming", **line) == "Roaming was already disabled"
    assert ok(env, "assistant", "enable_roaming", **line) == "Roaming enabled successfully"
    assert ok(env, "assistant", "enable_roaming", **line) == "Roaming was already enabled"
    assert ok(env, "assistant", "disable_roaming", **line) == "Roaming disabled successfully"
    assert ok(env, "assistant", "transfer_to_human_agents", summary="x") == "Transfer successful"


def test_payment_request_round_trip(env: TelecomEnvironment) -> None:
    with_user(env)
    assert ok(env, "user", "check_payment_request") == "No payment request has been made."
    assert ok(env, "user", "make_payment") == "You do not have a payment request."
    assert ok(env, "assistant", "send_payment_request", customer_id="C1001", bill_id="B1002") == (
        "Payment request sent to the customer for bill B1002"
    )
    assert fails(
        env, "assistant", "send_payment_request", customer_id="C1001", bill_id="B1001"
    ) == ("Error: A bill is already awaiting payment for this customer")
    assert ok(env, "user", "check_payment_request") == (
        "You have a payment request for bill B1002 of 150.0 USD."
    )
    assert ok(env, "user", "make_payment") == "Payment of 150.0 USD has been made for bill B1002."
    assert json.loads(ok(env, "assistant", "get_details_by_id", id="B1002"))["status"] == "Paid"
    assert ok(env, "user", "check_payment_request") == "No payment request has been made."


def test_bad_arguments_are_errors_not_crashes(env: TelecomEnvironment) -> None:
    assert fails(env, "assistant", "refuel_data", customer_id="C1001", line_id="L1002") == (
        "Error: TelecomTools.refuel_data() missing 1 required positional argument: 'gb_amount'"
    )
    assert fails(env, "assistant", "transfer_to_human_agents", summary="s", urgent=True) == (
        "Error: TelecomTools.transfer_to_human_agents() got an unexpected keyword argument 'urgent'"
    )
    assert fails(
        env, "assistant", "refuel_data", customer_id="C1001", line_id="L1002", gb_amount="2"
    ) == ("Error: '<=' not supported between instances of 'str' and 'int'")
    before = env.db_hash()
    fails(env, "user", "set_apn_settings", apn_settings="internet")
    fails(env, "user", "set_apn_settings", apn_settings={"apn_name": "nonsense"})
    assert env.db_hash() == before


def test_unknown_and_cross_side_tools(env: TelecomEnvironment) -> None:
    assert fails(env, "assistant", "toggle_airplane_mode") == (
        "Error: Tool 'toggle_airplane_mode' not found."
    )
    assert fails(env, "user", "get_customer_by_id", customer_id="C1001") == (
        "Error: Tool 'get_customer_by_id' not found."
    )
    assert fails(env, "assistant", "no_such_tool") == "Error: Tool 'no_such_tool' not found."
    # Setup helpers exist on the toolkits but are not tools: a model cannot call them.
    assert fails(env, "user", "break_apn_settings") == "Error: Tool 'break_apn_settings' not found."
    assert fails(env, "assistant", "set_data_usage", customer_id="C1001", line_id="L1002") == (
        "Error: Tool 'set_data_usage' not found."
    )


# --- user tools ---


def test_airplane_mode_cuts_the_network(env: TelecomEnvironment) -> None:
    with_user(env)
    assert ok(env, "user", "check_status_bar") == (
        "Status Bar: 📶³ Good | 5G | 📱 Data Enabled | 🔋 80%"
    )
    assert ok(env, "user", "toggle_airplane_mode") == (
        "Airplane Mode is now ON.\nStatus Bar: ✈️ Airplane Mode | 🔋 80%"
    )
    status = ok(env, "user", "check_network_status")
    assert "Airplane Mode: ON" in status and "Cellular Connection: no_service" in status
    assert ok(env, "user", "run_speed_test") == "Speed test failed: No Connection."
    assert ok(env, "user", "toggle_wifi") == (
        "Cannot change Wi-Fi settings while Airplane Mode is ON.\n"
        "Status Bar: ✈️ Airplane Mode | 🔋 80%"
    )
    assert ok(env, "user", "toggle_airplane_mode").startswith("Airplane Mode is now OFF.")
    # The network search lands on 5G with the surroundings' excellent 5G signal.
    assert ok(env, "user", "run_speed_test") == (
        "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."
    )


def test_data_saver_and_network_mode_slow_the_phone(env: TelecomEnvironment) -> None:
    with_user(env)
    assert ok(env, "user", "toggle_data_saver_mode").startswith("Data Saver Mode is now ON.")
    # 5G at the device's initial "good" signal: (50 + 500) / 2 * 0.8, then data saver's 0.2.
    assert ok(env, "user", "run_speed_test").startswith("Speed Test Result: 44.00 Mbps (Good).")
    assert ok(env, "user", "check_data_restriction_status") == (
        "Data Saver mode is ON (limits data usage)."
    )
    assert ok(env, "user", "set_network_mode_preference", mode="2g_only") == (
        "Preferred Network Mode set to: 2g_only\n"
        "Status Bar: 📶¹ Poor | 2G | 📱 Data Enabled | 🔽 Data Saver | 🔋 80%"
    )
    assert ok(env, "user", "can_send_mms") == "Your messaging app cannot send MMS messages."
    invalid = ok(env, "user", "set_network_mode_preference", mode="6g")
    assert invalid.startswith("Failed to set network mode: '6g' is not a valid option.")
    assert ok(env, "user", "check_network_mode_preference") == "Network Mode Preference: 2g_only"


def test_broken_apn_is_fixed_by_reset_then_reboot(env: TelecomEnvironment) -> None:
    with_user(env)
    env.apply_initial_state(
        {"initialization_actions": [{"env_type": "user", "func_name": "break_apn_settings"}]}
    )
    assert ok(env, "user", "check_apn_settings").startswith("Current APN Name: broken\n")
    assert ok(env, "user", "reset_apn_settings").startswith("APN settings will reset at reboot.")
    assert "no_service" in ok(env, "user", "check_network_status")
    assert ok(env, "user", "reboot_device") == (
        "Resetting APN settings...\nRestarting network services...\n"
        "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"
    )


def test_app_permissions(env: TelecomEnvironment) -> None:
    assert ok(env, "user", "check_installed_apps") == (
        "The following apps are installed on the phone: messaging, browser"
    )
    assert ok(env, "user", "check_app_permissions", app_name="browser") == (
        "App 'browser' has permission for: storage, network."
    )
    assert ok(env, "user", "check_app_permissions", app_name="camera") == (
        "App 'camera' not found on this phone."
    )
    granted = ok(env, "user", "grant_app_permission", app_name="browser", permission="SMS")
    assert granted.startswith("Success. Permission 'sms' granted to app 'browser'.\nStatus Bar: ")
    assert ok(env, "user", "check_app_status", app_name="browser") == (
        "Status for App: browser\n - Permissions Granted:\n   - sms\n   - storage\n   - network"
    )
    refused = ok(env, "user", "grant_app_permission", app_name="browser", permission="camera")
    assert refused.startswith("Error. Permission 'camera' not tracked for app 'browser'")


def test_vpn_and_sim(env: TelecomEnvironment) -> None:
    with_user(env)
    assert ok(env, "user", "check_vpn_status") == "VPN is turned OFF."
    assert ok(env, "user", "connect_vpn").startswith("VPN connected successfully.\nStatus Bar: ")
    assert ok(env, "user", "connect_vpn") == "VPN already connected."
    assert ok(env, "user", "check_vpn_status").startswith("VPN is ON and connected. Details: {")
    assert ok(env, "user", "disconnect_vpn").startswith("VPN disconnected successfully.")
    assert ok(env, "user", "disconnect_vpn").startswith("No active VPN connection to disconnect.")
    env.apply_initial_state(
        {"initialization_actions": [{"env_type": "user", "func_name": "unseat_sim_card"}]}
    )
    assert ok(env, "user", "check_sim_status") == "No SIM card detected in the phone."
    assert ok(env, "user", "reseat_sim_card").startswith("SIM card re-seated successfully.")
    assert ok(env, "user", "check_sim_status") == "Your SIM card is active and working."
