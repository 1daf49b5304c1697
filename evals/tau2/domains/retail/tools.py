"""The 16 Retail agent tools, with τ²-bench v1.0.1's checks, state changes and error texts.

Tools are declared as Telecom's are (``evals.tau2.domains.toolkit``): ``@tool`` carries τ²-bench's
description (its docstring as docstring_parser splits it) and parameter docs, and the schema the
agent sees is built from the signature the way τ²-bench builds it; ``tests/evals/test_golden.py``
checks the result against digests of τ²-bench's own schemas.

The class is named ``RetailTools`` and tools are called as ``tools.<name>(**arguments)``, as in
τ²-bench, so that missing or unexpected arguments fail with Python's own ``TypeError`` text
(``RetailTools.get_order_details() missing 1 required positional argument: 'order_id'``). Argument
types are not validated up front (τ²-bench does not either): a wrongly typed argument fails, or not,
exactly where the same operation fails in τ²-bench.

The database is copy-on-write: an environment shares the loaded store's objects and deep-copies an
order or a user just before the first change to it, so a fresh environment costs a dict copy.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import math
import operator
from collections.abc import Callable
from typing import Any

from evals.tau2.domains.retail.db import (
    GiftCard,
    Order,
    OrderPayment,
    PaymentMethod,
    Product,
    RetailDB,
    User,
    UserAddress,
    Variant,
)
from evals.tau2.domains.toolkit import ToolKit, ToolType, tool

__all__ = [
    "AGENT_TOOL_NAMES",
    "READ_TOOLS",
    "WRITE_TOOLS",
    "RetailTools",
    "agent_tool_schemas",
    "calculate_expression",
]

# A string, not a set: membership tests on odd argument types then fail with τ²-bench's messages.
_CALCULATOR_CHARACTERS = "0123456789+-*/(). "

_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
# τ²-bench evaluates with eval(), so "9**9**9" would hang the run; beyond this many bits the integer
# power is refused (its float() would overflow anyway for any exponent this large).
_MAX_POWER_BITS = 100_000


def _power(base: Any, exponent: Any) -> Any:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log2(abs(base)) > _MAX_POWER_BITS
    ):
        raise OverflowError("int too large to convert to float")
    return operator.pow(base, exponent)


def _evaluate(node: ast.AST) -> Any:
    """Evaluate the few node kinds that digits, ``+-*/().`` and spaces can spell, like eval()."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _BINARY_OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY_OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.Tuple):  # only "()" is possible without a comma
        return tuple(_evaluate(element) for element in node.elts)
    if isinstance(node, ast.Call):  # "(1)(2)": calling a number fails just as in eval()
        function = _evaluate(node.func)
        return function(*(_evaluate(argument) for argument in node.args))
    raise ValueError("Invalid characters in expression")


def calculate_expression(expression: Any) -> str:
    """τ²-bench's ``calculate``: digits, ``+-*/().`` and spaces; the result rounded to 2 places."""
    if not all(char in _CALCULATOR_CHARACTERS for char in expression):
        raise ValueError("Invalid characters in expression")
    if not isinstance(expression, str):
        raise TypeError("eval() arg 1 must be a string, bytes or code object")
    # Same file name and mode as eval(), so syntax errors read the same.
    tree = compile(expression, "<string>", "eval", flags=ast.PyCF_ONLY_AST)
    return str(round(float(_evaluate(tree)), 2))


class RetailTools(ToolKit):
    """The Retail agent tools over one episode's view of the store (see the module docstring)."""

    env_type = "assistant"

    def __init__(self, db: RetailDB, *, modify_items_fix: bool = False) -> None:
        self.db = db
        self.modify_items_fix = modify_items_fix
        self._private_orders: set[str] = set()
        self._private_users: set[str] = set()

    @classmethod
    def sharing(cls, pristine: RetailDB, *, modify_items_fix: bool = False) -> RetailTools:
        """Tools over a view that shares ``pristine``'s objects until they are written."""
        view = RetailDB.model_construct(
            products=pristine.products,  # no tool ever changes a product
            users=dict(pristine.users),
            orders=dict(pristine.orders),
        )
        return cls(view, modify_items_fix=modify_items_fix)

    def replace_db(self, db: RetailDB) -> None:
        """Adopt a freshly validated database that shares nothing with the pristine one."""
        self.db = db
        self._private_orders = set(db.orders)
        self._private_users = set(db.users)

    # --- lookups (the τ²-bench private helpers, with their error texts) ---

    def _get_order(self, order_id: Any) -> Order:
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.db.orders[order_id]

    def _get_user(self, user_id: Any) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.users[user_id]

    def _get_product(self, product_id: Any) -> Product:
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def _get_item(self, item_id: Any) -> Variant:
        for product in self.db.products.values():
            if item_id in product.variants:
                return product.variants[item_id]
        raise ValueError("Item not found")

    def _get_variant(self, product_id: Any, variant_id: Any) -> Variant:
        product = self._get_product(product_id)
        if variant_id not in product.variants:
            raise ValueError("Variant not found")
        return product.variants[variant_id]

    def _get_payment_method(self, user_id: Any, payment_method_id: Any) -> PaymentMethod:
        user = self._get_user(user_id)
        if payment_method_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        return user.payment_methods[payment_method_id]

    # --- copy-on-write access for the write tools ---

    def _writable_order(self, order_id: Any) -> Order:
        order = self._get_order(order_id)
        if order_id not in self._private_orders:
            order = order.model_copy(deep=True)
            self.db.orders[order_id] = order
            self._private_orders.add(order_id)
        return order

    def _writable_user(self, user_id: Any) -> User:
        user = self._get_user(user_id)
        if user_id not in self._private_users:
            user = user.model_copy(deep=True)
            self.db.users[user_id] = user
            self._private_users.add(user_id)
        return user

    def _writable_payment_method(self, user_id: Any, payment_method_id: Any) -> PaymentMethod:
        if user_id in self.db.users:
            self._writable_user(user_id)
        return self._get_payment_method(user_id, payment_method_id)

    # --- tools, in τ²-bench's definition order (the order agents see them) ---

    @tool(
        "Calculate the result of a mathematical expression.",
        tool_type=ToolType.GENERIC,
        expression=(
            "The mathematical expression to calculate, such as '2 + 2'. The expression "
            "can contain numbers, operators (+, -, *, /), parentheses, and spaces."
        ),
    )
    def calculate(self, expression: str) -> str:
        return calculate_expression(expression)

    @tool(
        (
            "Cancel a pending order. If the order is already processed or delivered,\n\n"
            "it cannot be cancelled. The agent needs to explain the cancellation detail\n"
            "and ask for explicit user confirmation (yes/no) to proceed. If the user confirms,\n"
            "the order status will be changed to 'cancelled' and the payment will be refunded.\n"
            "The refund will be added to the user's gift card balance immediately if the payment\n"
            "was made using a gift card, otherwise the refund would take 5-7 business days to "
            "process.\n"
            "The function returns the order details after the cancellation."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        reason=(
            "The reason for cancellation, which should be either 'no longer needed' or "
            "'ordered by mistake'."
        ),
    )
    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        order = self._writable_order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            refunds.append(
                OrderPayment(
                    transaction_type="refund",
                    amount=payment.amount,
                    payment_method_id=payment.payment_method_id,
                )
            )
            user = self._get_user(order.user_id)
            method = self._writable_payment_method(user.user_id, payment.payment_method_id)
            if isinstance(method, GiftCard):  # gift cards are refunded at once
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason  # type: ignore[assignment]  # τ²-bench assigns unvalidated
        order.payment_history.extend(refunds)
        return order

    @tool(
        (
            "Exchange items in a delivered order to new items of the same product type.\n\n"
            "For a delivered order, return or exchange can be only done once by the agent.\n"
            "The agent needs to explain the exchange detail and ask for explicit user confirmation "
            "(yes/no) to proceed."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        item_ids=(
            "The item ids to be exchanged, each such as '1008292230'. There could be "
            "duplicate items in the list."
        ),
        new_item_ids=(
            "The item ids to be exchanged for, each such as '1008292230'.\n"
            "There could be duplicate items in the list. Each new item id should match "
            "the item id\n"
            "in the same position and be of the same product."
        ),
        payment_method_id=(
            "The payment method id to pay or receive refund for the item price "
            "difference,\n"
            "such as 'gift_card_0000000' or 'credit_card_0000000'. These can be "
            "looked up\n"
            "from the user or order details."
        ),
    )
    def exchange_delivered_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Order:
        order = self._writable_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        ordered = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > ordered.count(item_id):
                raise ValueError(f"Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        price_difference: float = 0
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            price_difference += variant.price - item.price
        price_difference = round(price_difference, 2)
        method = self._get_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < price_difference:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = price_difference
        return order

    @tool(
        (
            "Find user id by first name, last name, and zip code. If the user is not found, the "
            "function\n\n"
            "will return an error message. By default, find user id by email, and only call this "
            "function\n"
            "if the user is not found by email or cannot remember email."
        ),
        tool_type=ToolType.READ,
        first_name="The first name of the customer, such as 'John'.",
        last_name="The last name of the customer, such as 'Doe'.",
        zip="The zip code of the customer, such as '12345'.",
    )
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        for user_id, user in self.db.users.items():
            if (
                user.name.first_name.lower() == first_name.lower()
                and user.name.last_name.lower() == last_name.lower()
                and user.address.zip == zip
            ):
                return user_id
        raise ValueError("User not found")

    @tool(
        (
            "Find user id by email. If the user is not found, the function will return an error "
            "message."
        ),
        tool_type=ToolType.READ,
        email="The email of the user, such as 'something@example.com'.",
    )
    def find_user_id_by_email(self, email: str) -> str:
        for user_id, user in self.db.users.items():
            if user.email.lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool(
        "Get the status and details of an order.",
        tool_type=ToolType.READ,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
    )
    def get_order_details(self, order_id: str) -> Order:
        return self._get_order(order_id)

    @tool(
        "Get the inventory details of a product.",
        tool_type=ToolType.READ,
        product_id=(
            "The product id, such as '6086499569'. Be careful the product id is different "
            "from the item id."
        ),
    )
    def get_product_details(self, product_id: str) -> Product:
        return self._get_product(product_id)

    @tool(
        "Get the inventory details of an item.",
        tool_type=ToolType.READ,
        item_id=(
            "The item id, such as '6086499569'. Be careful the item id is different from the "
            "product id."
        ),
    )
    def get_item_details(self, item_id: str) -> Variant:
        return self._get_item(item_id)

    @tool(
        "Get the details of a user, including their orders.",
        tool_type=ToolType.READ,
        user_id="The user id, such as 'sara_doe_496'.",
    )
    def get_user_details(self, user_id: str) -> User:
        return self._get_user(user_id)

    @tool(
        (
            "List the name and product id of all product types.\n\n"
            "Each product type has a variety of different items with unique item ids and options.\n"
            "There are only 50 product types in the store."
        ),
        tool_type=ToolType.READ,
    )
    def list_all_product_types(self) -> str:
        names = {product.name: product.product_id for product in self.db.products.values()}
        return json.dumps(names, sort_keys=True)

    @tool(
        (
            "Modify the shipping address of a pending order. The agent needs to explain the "
            "modification detail and ask for explicit user confirmation (yes/no) to proceed."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        address1="The first line of the address, such as '123 Main St'.",
        address2="The second line of the address, such as 'Apt 1' or ''.",
        city="The city, such as 'San Francisco'.",
        state="The state, such as 'CA'.",
        country="The country, such as 'USA'.",
        zip="The zip code, such as '12345'.",
    )
    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Order:
        order = self._writable_order(order_id)
        if "pending" not in order.status:  # also "pending (item modified)"
            raise ValueError("Non-pending order cannot be modified")
        order.address = UserAddress(
            address1=address1,
            address2=address2,
            city=city,
            state=state,
            country=country,
            zip=zip,
        )
        return order

    @tool(
        (
            "Modify items in a pending order to new items of the same product type. For a pending "
            "order, this function can only be called once. The agent needs to explain the exchange "
            "detail and ask for explicit user confirmation (yes/no) to proceed."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        item_ids=(
            "The item ids to be modified, each such as '1008292230'. There could be "
            "duplicate items in the list."
        ),
        new_item_ids=(
            "The item ids to be modified for, each such as '1008292230'. There could be "
            "duplicate items in the list. Each new item id should match the item id in "
            "the same position and be of the same product."
        ),
        payment_method_id=(
            "The payment method id to pay or receive refund for the item price "
            "difference, such as 'gift_card_0000000' or 'credit_card_0000000'. "
            "These can be looked up from the user or order details."
        ),
    )
    def modify_pending_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Order:
        order = self._writable_order(order_id)
        if order.status != "pending":  # strict: items can be modified only once
            raise ValueError("Non-pending order cannot be modified")
        ordered = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > ordered.count(item_id):
                raise ValueError(f"{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        price_difference: float = 0
        variant: Variant | None = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._get_variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            price_difference += variant.price - item.price
        # Unlike the exchange, τ²-bench does not round the difference here.
        method = self._writable_payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < price_difference:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order.payment_history.append(
            OrderPayment(
                transaction_type="payment" if price_difference > 0 else "refund",
                amount=abs(price_difference),
                payment_method_id=payment_method_id,
            )
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - price_difference, 2)
        last_variant = variant
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((item for item in order.items if item.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            # τ²-bench v1.0.1 gives every modified item the variant checked last (its loop
            # variable leaks); the fix, an option, gives each item its own new variant.
            if self.modify_items_fix or last_variant is None:
                variant = self._get_variant(item.product_id, new_item_id)
            else:
                variant = last_variant
            item.item_id = new_item_id
            item.price = variant.price
            item.options = dict(variant.options)
        order.status = "pending (item modified)"
        return order

    @tool(
        (
            "Modify the payment method of a pending order. The agent needs to explain the "
            "modification detail and ask for explicit user confirmation (yes/no) to proceed."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        payment_method_id=(
            "The payment method id to pay or receive refund for the item price "
            "difference, such as 'gift_card_0000000' or 'credit_card_0000000'. "
            "These can be looked up from the user or order details."
        ),
    )
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
        order = self._writable_order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        method = self._writable_payment_method(order.user_id, payment_method_id)
        history = order.payment_history
        if len(history) != 1 or history[0].transaction_type != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0].payment_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        old_method_id = history[0].payment_method_id
        history.extend(
            [
                OrderPayment(
                    transaction_type="payment",
                    amount=amount,
                    payment_method_id=payment_method_id,
                ),
                OrderPayment(
                    transaction_type="refund",
                    amount=amount,
                    payment_method_id=old_method_id,
                ),
            ]
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - amount, 2)
        old_method = self._get_payment_method(order.user_id, old_method_id)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + amount, 2)
        return order

    @tool(
        (
            "Modify the default address of a user. The agent needs to explain the modification "
            "detail and ask for explicit user confirmation (yes/no) to proceed."
        ),
        tool_type=ToolType.WRITE,
        user_id="The user id, such as 'sara_doe_496'.",
        address1="The first line of the address, such as '123 Main St'.",
        address2="The second line of the address, such as 'Apt 1' or ''.",
        city="The city, such as 'San Francisco'.",
        state="The state, such as 'CA'.",
        country="The country, such as 'USA'.",
        zip="The zip code, such as '12345'.",
    )
    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> User:
        user = self._writable_user(user_id)
        user.address = UserAddress(
            address1=address1,
            address2=address2,
            city=city,
            state=state,
            country=country,
            zip=zip,
        )
        return user

    @tool(
        (
            "Return some items of a delivered order.\n\n"
            "The order status will be changed to 'return requested'.\n"
            "The agent needs to explain the return detail and ask for explicit user confirmation "
            "(yes/no) to proceed.\n"
            "The user will receive follow-up email for how and where to return the item."
        ),
        tool_type=ToolType.WRITE,
        order_id=(
            "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the "
            "beginning of the order id."
        ),
        item_ids=(
            "The item ids to be returned, each such as '1008292230'. There could be "
            "duplicate items in the list."
        ),
        payment_method_id=(
            "The payment method id to pay or receive refund for the item price "
            "difference, such as 'gift_card_0000000' or 'credit_card_0000000'.\n"
            "These can be looked up from the user or order details."
        ),
    )
    def return_delivered_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        payment_method_id: str,
    ) -> Order:
        order = self._writable_order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        user = self._get_user(order.user_id)
        method = self._get_payment_method(user.user_id, payment_method_id)
        if (
            not isinstance(method, GiftCard)
            and payment_method_id != order.payment_history[0].payment_method_id
        ):
            raise ValueError("Payment method should be the original payment method")
        ordered = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > ordered.count(item_id):
                raise ValueError("Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order

    @tool(
        (
            "Transfer the user to a human agent, with a summary of the user's issue.\n\n"
            "Only transfer if\n"
            " -  the user explicitly asks for a human agent\n"
            " -  given the policy and the available tools, you cannot solve the user's issue."
        ),
        tool_type=ToolType.GENERIC,
        summary="A summary of the user's issue.",
    )
    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"


AGENT_TOOL_NAMES: tuple[str, ...] = RetailTools.tool_names()
# τ²-bench's ``ToolType.WRITE`` tools: only they change the database, and only they are re-executed
# when τ²-bench replays a trajectory. The rest are READ, or GENERIC (calculate, transfer).
WRITE_TOOLS: frozenset[str] = frozenset(RetailTools.tool_names(ToolType.WRITE))
READ_TOOLS: frozenset[str] = frozenset(RetailTools.tool_names(ToolType.READ))


@functools.cache
def _schemas() -> tuple[dict[str, Any], ...]:
    return tuple(RetailTools.openai_tools())


def agent_tool_schemas() -> list[dict[str, Any]]:
    """The agent's tools in OpenAI format, a fresh copy (built once per process)."""
    return copy.deepcopy(list(_schemas()))
