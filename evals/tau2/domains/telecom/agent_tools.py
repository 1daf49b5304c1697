"""The 13 tools of the Telecom agent, plus the setup and assertion helpers the tasks call.

Behaviour, return values and error texts follow τ²-bench v1.0.1's telecom ``tools.py``. The class
is named ``TelecomTools`` like τ²-bench's, so that Python's own messages for bad arguments
(``TelecomTools.refuel_data() missing 1 required positional argument: 'gb_amount'``) read the same.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from evals.tau2.domains.telecom.models import (
    Bill,
    BillStatus,
    Customer,
    Device,
    Line,
    LineItem,
    LineStatus,
    Plan,
    TelecomDB,
)
from evals.tau2.domains.toolkit import ToolKit, env_function, tool

__all__ = ["TODAY", "TelecomTools"]

# τ²-bench's telecom world is frozen at this date (``utils.get_today``); the policy says so too.
TODAY = datetime.date(2025, 2, 25)

_OWNER = "ID of the customer who owns the line."


def _digits(phone_number: str) -> str:
    # Lookups ignore punctuation: '555-123-2002' and '5551232002' name the same line.
    return "".join(ch for ch in phone_number if ch.isdigit())


def _first_of_next_month(day: datetime.date) -> datetime.date:
    return (day.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)


class TelecomTools(ToolKit):
    """The agent's view of the carrier's systems; every method works on ``self.db`` in place."""

    env_type = "assistant"

    def __init__(self, db: TelecomDB) -> None:
        self.db = db

    # --- lookups (private helpers raise ValueError with τ²-bench's texts) ---

    def _line_by_id(self, line_id: str) -> Line:
        for line in self.db.lines:
            if line.line_id == line_id:
                return line
        raise ValueError(f"Line with ID {line_id} not found")

    def _line_by_phone(self, phone_number: str) -> Line:
        for line in self.db.lines:
            if _digits(line.phone_number) == _digits(phone_number):
                return line
        raise ValueError(f"Line with phone number {phone_number} not found")

    def _plan_by_id(self, plan_id: str) -> Plan:
        for plan in self.db.plans:
            if plan.plan_id == plan_id:
                return plan
        raise ValueError(f"Plan with ID {plan_id} not found")

    def _device_by_id(self, device_id: str) -> Device:
        for device in self.db.devices:
            if device.device_id == device_id:
                return device
        raise ValueError(f"Device with ID {device_id} not found")

    def _bill_by_id(self, bill_id: str) -> Bill:
        for bill in self.db.bills:
            if bill.bill_id == bill_id:
                return bill
        raise ValueError(f"Bill with ID {bill_id} not found")

    def _customer_line(self, customer_id: str, line_id: str) -> Line:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.line_ids:
            raise ValueError(f"Line {line_id} not found for customer {customer_id}")
        return self._line_by_id(line_id)

    def _bills_awaiting_payment(self, customer: Customer) -> list[Bill]:
        bills = (self._bill_by_id(bill_id) for bill_id in customer.bill_ids)
        return [bill for bill in bills if bill.status == BillStatus.AWAITING_PAYMENT]

    def _set_bill_to_paid(self, bill_id: str) -> None:
        self._bill_by_id(bill_id).status = BillStatus.PAID

    def _new_bill_id(self, customer_id: str) -> str:
        # τ²-bench draws a random uuid here; a digest of the state keeps db_hash reproducible.
        seed = f"{customer_id}/{len(self.db.bills)}".encode()
        return f"B{hashlib.sha256(seed).hexdigest()[:8]}"

    def _apply_one_time_charge(self, customer_id: str, amount: float, description: str) -> None:
        """Add a charge (or credit) to the customer's draft bill, opening next month's if none."""
        customer = self.get_customer_by_id(customer_id)
        draft = next(
            (
                bill
                for bill in map(self._bill_by_id, customer.bill_ids)
                if bill.status == BillStatus.DRAFT
            ),
            None,
        )
        if draft is None:
            start = _first_of_next_month(TODAY)
            draft = Bill(
                bill_id=self._new_bill_id(customer_id),
                customer_id=customer_id,
                period_start=start,
                period_end=_first_of_next_month(start) - datetime.timedelta(days=1),
                issue_date=start,
                total_due=0,
                due_date=start + datetime.timedelta(days=14),
                status=BillStatus.DRAFT,
            )
            self.db.bills.append(draft)
            customer.bill_ids.append(draft.bill_id)
        draft.line_items.append(
            LineItem(
                description=description,
                amount=amount,
                date=TODAY,
                item_type="Credit" if amount < 0 else "Charge",
            )
        )
        draft.total_due += amount

    # --- the agent's tools ---

    @tool(
        "Finds a customer by their primary contact or line phone number.",
        phone_number="The phone number to search for.",
    )
    def get_customer_by_phone(self, phone_number: str) -> Customer:
        wanted = _digits(phone_number)
        for customer in self.db.customers:
            if _digits(customer.phone_number) == wanted:
                return customer
            for line_id in customer.line_ids:
                if _digits(self._line_by_id(line_id).phone_number) == wanted:
                    return customer
        raise ValueError(f"Customer with phone number {phone_number} not found")

    @tool(
        "Retrieves a customer directly by their unique ID.",
        customer_id="The unique identifier of the customer.",
    )
    def get_customer_by_id(self, customer_id: str) -> Customer:
        for customer in self.db.customers:
            if customer.customer_id == customer_id:
                return customer
        raise ValueError(f"Customer with ID {customer_id} not found")

    @tool(
        "Searches for customers by name and DOB. May return multiple matches if names are "
        "similar,\n\nDOB helps disambiguate.",
        full_name="The full name of the customer.",
        dob="Date of birth for verification, in the format YYYY-MM-DD.",
    )
    def get_customer_by_name(self, full_name: str, dob: str) -> list[Customer]:
        return [
            customer
            for customer in self.db.customers
            if customer.full_name.lower() == full_name.lower() and customer.date_of_birth == dob
        ]

    @tool(
        "Retrieves the details for a given ID.\n\n"
        "The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan.",
        id="The ID of the object to retrieve.",
    )
    def get_details_by_id(self, id: str) -> Any:
        # The first letter names the kind of object, as in τ²-bench.
        if id.startswith("L"):
            return self._line_by_id(id)
        if id.startswith("D"):
            return self._device_by_id(id)
        if id.startswith("B"):
            return self._bill_by_id(id)
        if id.startswith("C"):
            return self.get_customer_by_id(id)
        if id.startswith("P"):
            return self._plan_by_id(id)
        raise ValueError(f"Unknown ID format or type: {id}")

    @tool(
        "Suspends a specific line (max 6 months).\n\n"
        "Checks: Line status must be Active.\n"
        "Logic: Sets line status to Suspended, records suspension_start_date.",
        mutates=True,
        customer_id=_OWNER,
        line_id="ID of the line to suspend.",
        reason="Reason for suspension.",
    )
    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict[str, Any]:
        line = self._customer_line(customer_id, line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend")
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        return {
            "message": "Line suspended successfully. $5/month holding fee will apply.",
            "line": line,
        }

    @tool(
        "Resumes a suspended line.\n\n"
        "Checks: Line status must be Suspended or Pending Activation.\n"
        "Logic: Sets line status to Active, clears suspension_start_date.",
        mutates=True,
        customer_id=_OWNER,
        line_id="ID of the line to resume.",
    )
    def resume_line(self, customer_id: str, line_id: str) -> dict[str, Any]:
        line = self._customer_line(customer_id, line_id)
        if line.status not in (LineStatus.SUSPENDED, LineStatus.PENDING_ACTIVATION):
            raise ValueError("Line must be suspended to resume")
        line.status = LineStatus.ACTIVE
        line.suspension_start_date = None
        return {"message": "Line resumed successfully", "line": line}

    @tool(
        "Retrieves a list of the customer's bills, most recent first.",
        customer_id="ID of the customer.",
        limit="Maximum number of bills to return.",
    )
    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[Bill]:
        customer = self.get_customer_by_id(customer_id)
        bills = [self._bill_by_id(bill_id) for bill_id in customer.bill_ids]
        return sorted(bills, key=lambda bill: bill.issue_date, reverse=True)[:limit]

    @tool(
        "Sends a payment request to the customer for a specific bill.\n\n"
        "Checks:\n"
        "    - Customer exists\n"
        "    - Bill exists and belongs to the customer\n"
        "    - No other bills are already awaiting payment for this customer\n"
        "Logic: Sets bill status to AWAITING_PAYMENT and notifies customer.\n"
        "Warning: This method does not check if the bill is already PAID.\n"
        "Always check the bill status before calling this method.",
        mutates=True,
        customer_id="ID of the customer who owns the bill.",
        bill_id="ID of the bill to send payment request for.",
    )
    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        customer = self.get_customer_by_id(customer_id)
        if self._bills_awaiting_payment(customer):
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.bill_ids:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self._bill_by_id(bill_id)
        bill.status = BillStatus.AWAITING_PAYMENT
        return f"Payment request sent to the customer for bill {bill.bill_id}"

    @tool(
        "Retrieves current billing cycle data usage for a line, including data\n\n"
        "refueling amount, data limit, and cycle end date.",
        customer_id=_OWNER,
        line_id="ID of the line to check usage for.",
    )
    def get_data_usage(self, customer_id: str, line_id: str) -> dict[str, Any]:
        line = self._customer_line(customer_id, line_id)
        plan = self._plan_by_id(line.plan_id)
        return {
            "line_id": line_id,
            "data_used_gb": line.data_used_gb,
            "data_limit_gb": plan.data_limit_gb,
            "data_refueling_gb": line.data_refueling_gb,
            "cycle_end_date": _first_of_next_month(TODAY) - datetime.timedelta(days=1),
        }

    @tool(
        "Enables international roaming on a line.",
        mutates=True,
        customer_id=_OWNER,
        line_id="ID of the line to enable roaming for.",
    )
    def enable_roaming(self, customer_id: str, line_id: str) -> str:
        line = self._customer_line(customer_id, line_id)
        if line.roaming_enabled:
            return "Roaming was already enabled"
        line.roaming_enabled = True
        return "Roaming enabled successfully"

    @tool(
        "Disables international roaming on a line.",
        mutates=True,
        customer_id=_OWNER,
        line_id="ID of the line to disable roaming for.",
    )
    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        line = self._customer_line(customer_id, line_id)
        if not line.roaming_enabled:
            return "Roaming was already disabled"
        line.roaming_enabled = False
        return "Roaming disabled successfully"

    @tool(
        "Transfer the user to a human agent, with a summary of the user's issue.\n\n"
        "Only transfer if\n"
        " -  the user explicitly asks for a human agent\n"
        " -  given the policy and the available tools, you cannot solve the user's issue.",
        summary="A summary of the user's issue.",
    )
    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    @tool(
        "Refuels data for a specific line, adding to the customer's bill.\n\n"
        "Checks: Line status must be Active, Customer owns the line.\n"
        "Logic: Adds data to the line and charges customer based on the plan's refueling rate.",
        mutates=True,
        customer_id=_OWNER,
        line_id="ID of the line to refuel data for.",
        gb_amount="Amount of data to add in gigabytes.",
    )
    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
        line = self._customer_line(customer_id, line_id)
        # τ²-bench documents an Active-line check here but does not enforce it; neither do we.
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = self._plan_by_id(line.plan_id)
        charge = gb_amount * plan.data_refueling_price_per_gb
        line.data_refueling_gb += gb_amount
        self._apply_one_time_charge(
            customer_id,
            charge,
            f"Data refueling: {gb_amount} GB at ${plan.data_refueling_price_per_gb}/GB",
        )
        return {
            "message": f"Successfully added {gb_amount} GB of data for line {line_id} "
            f"for ${charge:.2f}",
            "new_data_refueling_gb": line.data_refueling_gb,
            "charge": charge,
        }

    # --- setup helpers used by initialization_actions ---

    @env_function
    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        line = self._customer_line(customer_id, line_id)
        line.data_used_gb = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    @env_function
    def suspend_line_for_overdue_bill(
        self, customer_id: str, line_id: str, new_bill_id: str, contract_ended: bool
    ) -> str:
        """Suspend a line and give its owner an overdue bill for last month's plan price."""
        line = self._line_by_id(line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend for unpaid bill")
        amount = self._plan_by_id(line.plan_id).price_per_month
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        if any(
            self._bill_by_id(bill_id).status == BillStatus.OVERDUE for bill_id in customer.bill_ids
        ):
            raise ValueError("Customer already has an overdue bill")
        last_month_end = TODAY.replace(day=1) - datetime.timedelta(days=1)
        last_month_start = last_month_end.replace(day=1)
        bill = Bill(
            bill_id=new_bill_id,
            customer_id=customer_id,
            period_start=last_month_start,
            period_end=last_month_end,
            issue_date=last_month_start,
            total_due=0,
            due_date=last_month_start + datetime.timedelta(days=14),
            status=BillStatus.OVERDUE,
        )
        bill.line_items.append(
            LineItem(
                description=f"Charge for line {line.line_id}",
                amount=amount,
                date=TODAY,
                item_type="Charge" if amount > 0 else "Credit",
            )
        )
        bill.total_due += amount
        self.db.bills.append(bill)
        customer.bill_ids.append(new_bill_id)
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        if contract_ended:
            line.contract_end_date = last_month_end
        return (
            f"Line {line_id} suspended for unpaid bill {new_bill_id}. "
            f"Contract ended: {contract_ended}"
        )

    # --- assertions used by env_assertions ---

    @env_function
    def assert_data_refueling_amount(
        self, customer_id: str, line_id: str, expected_amount: float
    ) -> bool:
        line = self._customer_line(customer_id, line_id)
        return abs(line.data_refueling_gb - expected_amount) < 1e-6

    @env_function
    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        return self._customer_line(customer_id, line_id).status == expected_status

    @env_function
    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        customer = self.get_customer_by_id(customer_id)
        if overdue_bill_id not in customer.bill_ids:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if self._bill_by_id(overdue_bill_id).status != BillStatus.OVERDUE:
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    @env_function
    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """True when the bill is gone or paid."""
        try:
            return self._bill_by_id(overdue_bill_id).status == BillStatus.PAID
        except ValueError:
            return True
