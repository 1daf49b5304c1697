"""The Retail database (``db.json``) as pydantic models, field for field as in τ²-bench v1.0.1.

Field order and types matter: tool results are ``json.dumps(model.model_dump())``, so the key order,
the ``null`` optional order fields and int-to-float coercion all show up in what the agent reads.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

__all__ = [
    "CreditCard",
    "GiftCard",
    "Order",
    "OrderFulfillment",
    "OrderItem",
    "OrderPayment",
    "PaymentMethod",
    "Paypal",
    "Product",
    "RetailDB",
    "User",
    "UserAddress",
    "UserName",
    "Variant",
]


class Variant(BaseModel):
    """One purchasable item (a product with concrete options)."""

    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    """A product type and its variants, keyed by item id."""

    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    """A customer's name."""

    first_name: str
    last_name: str


class UserAddress(BaseModel):
    """A postal address (a user's default one, or an order's shipping one)."""

    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(BaseModel):
    """A credit card on file."""

    source: Literal["credit_card"]
    id: str
    brand: str
    last_four: str


class Paypal(BaseModel):
    """A PayPal account on file."""

    source: Literal["paypal"]
    id: str


class GiftCard(BaseModel):
    """A gift card; the only payment method with a balance the tools change."""

    source: Literal["gift_card"]
    id: str
    balance: float


PaymentMethod = Annotated[CreditCard | GiftCard | Paypal, Field(discriminator="source")]


class User(BaseModel):
    """A customer, their payment methods and their order ids."""

    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFulfillment(BaseModel):
    """Tracking numbers for the items shipped together."""

    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    """One line of an order (quantity is always one; repeated items repeat the line)."""

    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    """One payment or refund on an order."""

    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
]


class Order(BaseModel):
    """An order; the optional fields record cancellations, exchanges and returns."""

    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFulfillment]
    payment_history: list[OrderPayment]
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(BaseModel):
    """The whole store: products, users and orders, each keyed by id."""

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
