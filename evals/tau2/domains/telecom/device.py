"""The user side of Telecom: the simulated phone and the user's surroundings (τ²-bench's user DB).

Enum values and defaults follow τ²-bench's ``user_data_model.py``: the user simulator reads them
back through the device tools, and the environment assertions of the tasks test them.
"""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from evals.tau2.domains.telecom.models import StrictModel

__all__ = [
    "APNNames",
    "APNSettings",
    "AppPermissions",
    "AppStatus",
    "MockPhoneAttributes",
    "NetworkModePreference",
    "NetworkStatus",
    "NetworkTechnology",
    "PaymentRequest",
    "PerformanceLevel",
    "SignalStrength",
    "SimStatus",
    "TelecomUserDB",
    "UserSurroundings",
    "VpnDetails",
]


class SimStatus(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    ACTIVE = "active"
    MISSING = "missing"
    LOCKED_PIN = "locked_pin"
    LOCKED_PUK = "locked_puk"


class NetworkTechnology(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    NONE = "none"
    TWO_G = "2G"
    THREE_G = "3G"
    FOUR_G = "4G"
    FIVE_G = "5G"


class NetworkModePreference(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    FOUR_G_5G_PREFERRED = "4g_5g_preferred"
    FOUR_G_ONLY = "4g_only"
    THREE_G_ONLY = "3g_only"
    TWO_G_ONLY = "2g_only"


class SignalStrength(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    NONE = "none"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class PerformanceLevel(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    UNKNOWN = "unknown"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class NetworkStatus(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    CONNECTED = "connected"
    SEARCHING = "searching"
    NO_SERVICE = "no_service"
    EMERGENCY_ONLY = "emergency_only"


class APNNames(str, Enum):  # noqa: UP042 (the enum kind τ²-bench uses; StrEnum formats differently)
    INTERNET = "internet"
    BROKEN = "broken"


class APNSettings(StrictModel):
    """Represents the configuration for a single Access Point Name (APN)."""

    apn_name: APNNames = Field(
        default=APNNames.INTERNET, description="The name identifier for the APN connection."
    )
    reset_at_reboot: bool = Field(
        default=False, description="Whether the APN settings will be reset at the next reboot."
    )
    mms_apn: str | None = Field(
        default="mms",
        description="Specific APN name used for MMS traffic, if different from general data.",
    )
    mmsc_url: str | None = Field(
        default="http://mms.carrier.com/mms/wapenc",
        description="The URL of the Multimedia Messaging Service Center (MMSC). Crucial for MMS.",
    )
    mms_proxy: str | None = Field(
        default=None,
        description="The proxy server address required for MMS traffic on some networks.",
    )
    mms_port: int | None = Field(
        default=None,
        description="The proxy server port required for MMS traffic on some networks.",
    )


class VpnDetails(StrictModel):
    """Holds details about the VPN connection if active."""

    server_address: str | None = Field(
        default=None, description="Address of the connected VPN server."
    )
    protocol: str | None = Field(
        default=None, description="VPN protocol being used (e.g., WireGuard, OpenVPN)."
    )
    server_performance: PerformanceLevel = Field(
        default=PerformanceLevel.UNKNOWN,
        description="Estimated performance/latency of the VPN connection.",
    )


class AppPermissions(StrictModel):
    """Represents the permissions relevant to an application."""

    sms: bool = Field(default=False, description="Permission to send/read SMS/MMS.")
    storage: bool = Field(default=False, description="Permission to access device storage.")
    phone: bool = Field(default=False, description="Permission to make/manage phone calls.")
    network: bool = Field(default=False, description="Permission to access network state/internet.")


class AppStatus(StrictModel):
    """Represents the status of a specific application relevant to issues."""

    app_name: str
    permissions: AppPermissions = Field(
        default_factory=lambda: AppPermissions(),
        description="Structured permissions relevant to the application.",
    )


def _default_apps() -> dict[str, AppStatus]:
    return {
        "messaging": AppStatus(
            app_name="messaging",
            permissions=AppPermissions(sms=True, storage=True, phone=True),
        ),
        "browser": AppStatus(
            app_name="browser", permissions=AppPermissions(network=True, storage=True)
        ),
    }


class MockPhoneAttributes(StrictModel):
    """Data model representing the state attributes of a mock phone device."""

    sim_card_status: SimStatus = Field(
        default=SimStatus.ACTIVE, description="Current status of the physical or eSIM card."
    )
    sim_card_missing: bool = Field(default=False, description="Whether the SIM card is missing.")
    airplane_mode: bool = Field(
        default=False,
        description="Whether Airplane Mode, which disables all radios, is currently enabled.",
    )
    network_signal_strength: SignalStrength = Field(
        default=SignalStrength.GOOD, description="Current strength of the cellular network signal."
    )
    network_technology_connected: NetworkTechnology = Field(
        default=NetworkTechnology.FIVE_G,
        description="The type of cellular network technology currently connected (e.g., 5G, 4G).",
    )
    network_connection_status: NetworkStatus = Field(
        default=NetworkStatus.CONNECTED,
        description="High-level network status description "
        "(e.g., 'Connected', 'Searching', 'Emergency Calls Only', 'No Service').",
    )
    battery_level: int = Field(
        default=80, description="The current battery level, from 0 to 100 percent."
    )
    data_enabled: bool = Field(
        default=True,
        description="Whether the master switch for Mobile/Cellular Data usage is enabled.",
    )
    roaming_enabled: bool = Field(
        default=False,
        description="Whether the user setting to allow data usage while roaming is enabled.",
    )
    network_mode_preference: NetworkModePreference = Field(
        default=NetworkModePreference.FOUR_G_5G_PREFERRED,
        description="User's preferred network type (e.g., prefer 4G/5G, use 3G only).",
    )
    active_apn_settings: APNSettings = Field(
        default_factory=lambda: APNSettings(),
        description="The currently active Access Point Name configuration.",
    )
    wifi_enabled: bool = Field(default=False, description="Whether the Wi-Fi radio is enabled.")
    wifi_connected: bool = Field(
        default=False, description="Whether the device is currently connected to a Wi-Fi network."
    )
    wifi_ssid: str | None = Field(
        default=None, description="The name (SSID) of the connected Wi-Fi network, if any."
    )
    wifi_signal_strength: SignalStrength = Field(
        default=SignalStrength.NONE, description="Strength of the connected Wi-Fi signal."
    )
    wifi_calling_enabled: bool = Field(
        default=False, description="Whether the Wi-Fi Calling feature is enabled."
    )
    wifi_calling_mms_over_wifi: bool = Field(
        default=False,
        description="Preference/capability to send/receive MMS over Wi-Fi "
        "(depends on carrier and device support).",
    )
    data_saver_mode: bool = Field(
        default=False,
        description="Whether the system-wide Data Saver mode is enabled to reduce data "
        "consumption.",
    )
    vpn_enabled_setting: bool = Field(
        default=False,
        description="Whether a VPN profile is configured and potentially set to be 'always on' "
        "or manually enabled in settings.",
    )
    vpn_connected: bool = Field(
        default=False, description="Whether there currently is an active VPN connection tunnel."
    )
    vpn_details: VpnDetails | None = Field(
        default=None, description="Details about the active VPN connection, if connected."
    )
    app_statuses: dict[str, AppStatus] = Field(
        default_factory=_default_apps,
        description="Status of specific applications relevant to troubleshooting "
        "(e.g., messaging app, browser).",
    )


class PaymentRequest(StrictModel):
    """A bill the agent asked the user to pay, as the user's side sees it."""

    bill_id: str = Field(description="The ID of the bill.")
    amount_due: float = Field(description="The amount of the payment in USD.")
    paid: bool = Field(default=False, description="Whether the payment has been made.")


def _default_signal() -> dict[NetworkTechnology, SignalStrength]:
    return {
        NetworkTechnology.TWO_G: SignalStrength.POOR,
        NetworkTechnology.THREE_G: SignalStrength.FAIR,
        NetworkTechnology.FOUR_G: SignalStrength.GOOD,
        NetworkTechnology.FIVE_G: SignalStrength.EXCELLENT,
    }


class UserSurroundings(StrictModel):
    """Represents the physical surroundings of the user."""

    name: str | None = Field(default=None, description="The name of the user.")
    phone_number: str | None = Field(default=None, description="The phone number of the user.")
    is_abroad: bool = Field(default=False, description="Whether the user is currently abroad.")
    roaming_allowed: bool = Field(default=False, description="Whether the user is allowed to roam.")
    signal_strength: dict[NetworkTechnology, SignalStrength] = Field(
        default_factory=_default_signal,
        description="Signal strength for each network technology where the user is located.",
    )
    mobile_data_usage_exceeded: bool = Field(
        default=False, description="Whether the user has exceeded their data usage limit."
    )
    line_active: bool = Field(default=True, description="Whether the user has an active line.")
    payment_request: PaymentRequest | None = Field(
        default=None, description="The payment that the agent has requested."
    )


class TelecomUserDB(StrictModel):
    """Everything the user's device tools read and write."""

    device: MockPhoneAttributes = Field(
        default_factory=lambda: MockPhoneAttributes(), description="Mock phone device"
    )
    surroundings: UserSurroundings = Field(
        default_factory=lambda: UserSurroundings(), description="User's physical surroundings"
    )
