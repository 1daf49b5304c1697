"""The 30 device tools the simulated Telecom user operates, plus task setup and assertion helpers.

Behaviour and every returned text follow τ²-bench v1.0.1's telecom ``user_tools.py``: the user
simulator reads these strings to answer the agent, so their wording is part of the benchmark. The
class is named ``TelecomUserTools`` like τ²-bench's so Python's argument errors read the same.
"""

from __future__ import annotations

from evals.tau2.domains.telecom.device import (
    APNNames,
    APNSettings,
    MockPhoneAttributes,
    NetworkModePreference,
    NetworkStatus,
    NetworkTechnology,
    PerformanceLevel,
    SignalStrength,
    SimStatus,
    TelecomUserDB,
    UserSurroundings,
    VpnDetails,
)
from evals.tau2.domains.toolkit import ToolKit, env_function, tool

__all__ = ["TelecomUserTools"]

_SIGNAL_ICONS = {
    SignalStrength.NONE: "📵 No Signal",
    SignalStrength.POOR: "📶¹ Poor",
    SignalStrength.FAIR: "📶² Fair",
    SignalStrength.GOOD: "📶³ Good",
    SignalStrength.EXCELLENT: "📶⁴ Excellent",
}

_SIM_TEXT = {
    SimStatus.ACTIVE: "Your SIM card is active and working.",
    SimStatus.MISSING: "No SIM card detected in the phone.",
    SimStatus.LOCKED_PIN: "The SIM card is locked with a PIN code.",
    SimStatus.LOCKED_PUK: "The SIM card is locked with a PUK code.",
}

# Download speed range (Mbps) per technology and the share of it each signal level delivers.
_TECH_SPEED = {
    NetworkTechnology.TWO_G: (0.1, 0.4),
    NetworkTechnology.THREE_G: (1.0, 5.0),
    NetworkTechnology.FOUR_G: (10.0, 100.0),
    NetworkTechnology.FIVE_G: (50.0, 500.0),
    NetworkTechnology.NONE: (0.0, 0.0),
}
_SIGNAL_FACTOR = {
    SignalStrength.POOR: 0.2,
    SignalStrength.FAIR: 0.5,
    SignalStrength.GOOD: 0.8,
    SignalStrength.EXCELLENT: 1.0,
    SignalStrength.NONE: 0.0,
}
# Upper bounds of each speed band, checked in order; anything faster is Excellent.
_SPEED_BANDS = ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good"))
_SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
# The network a mode preference settles on when 5G is not on offer.
_MODE_TECH = {
    NetworkModePreference.FOUR_G_ONLY: NetworkTechnology.FOUR_G,
    NetworkModePreference.THREE_G_ONLY: NetworkTechnology.THREE_G,
    NetworkModePreference.TWO_G_ONLY: NetworkTechnology.TWO_G,
}


def _on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def _yes_no(flag: bool) -> str:
    return "Yes" if flag else "No"


class TelecomUserTools(ToolKit):
    """The user's phone; every method works on ``self.db`` (device and surroundings) in place."""

    env_type = "user"

    def __init__(self, db: TelecomUserDB) -> None:
        self.db = db

    @property
    def device(self) -> MockPhoneAttributes:
        return self.db.device

    @property
    def surroundings(self) -> UserSurroundings:
        return self.db.surroundings

    # --- derived state ---

    def _status_bar(self) -> str:
        device = self.device
        parts: list[str] = []
        if device.airplane_mode:
            parts.append("✈️ Airplane Mode")
        else:
            parts.append(_SIGNAL_ICONS.get(device.network_signal_strength, "📵 No Signal"))
            has_network = device.network_technology_connected != NetworkTechnology.NONE
            if has_network:
                parts.append(device.network_technology_connected.value)
            if device.data_enabled and has_network:
                parts.append("📱 Data Enabled")
                if device.data_saver_mode:
                    parts.append("🔽 Data Saver")
            else:
                parts.append("📵 Data Disabled")
        if device.wifi_enabled and device.wifi_connected:
            parts.append(
                f"📡 Connected to {device.wifi_ssid}" if device.wifi_ssid else "📡 Enabled"
            )
        if device.vpn_connected:
            parts.append("🔒 VPN Connected")
        parts.append(f"🔋 {device.battery_level}%")
        return " | ".join(parts)

    def _with_status_bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {self._status_bar()}"

    def _sim_status(self) -> SimStatus:
        return SimStatus.MISSING if self.device.sim_card_missing else self.device.sim_card_status

    def _mobile_data_working(self) -> bool:
        device, around = self.device, self.surroundings
        if device.airplane_mode or device.network_signal_strength == SignalStrength.NONE:
            return False
        if device.network_connection_status == NetworkStatus.NO_SERVICE:
            return False
        if around.is_abroad and not (device.roaming_enabled and around.roaming_allowed):
            return False
        return device.data_enabled and not around.mobile_data_usage_exceeded

    def _speed(self) -> tuple[float | None, str]:
        """Simulated download speed (Mbps) and its band, or (None, 'No Connection')."""
        if not self._mobile_data_working():
            return None, "No Connection"
        device = self.device
        factor = 1.0
        details = device.vpn_details
        if device.vpn_connected and details and details.server_performance == PerformanceLevel.POOR:
            factor = 0.1
        if device.data_saver_mode:
            factor *= 0.2
        low, high = _TECH_SPEED.get(device.network_technology_connected, (0.0, 0.0))
        signal = _SIGNAL_FACTOR.get(device.network_signal_strength, 0.0)
        speed = round((low + high) / 2.0 * signal * factor, 2)
        band = next((name for bound, name in _SPEED_BANDS if speed < bound), "Excellent")
        return speed, band

    def _can_send_mms(self) -> bool:
        device = self.device
        if not self._mobile_data_working():
            return False
        if device.network_technology_connected == NetworkTechnology.TWO_G:
            return False
        # The carrier does not carry MMS over Wi-Fi calling.
        if device.wifi_calling_enabled and device.wifi_calling_mms_over_wifi:
            return False
        if device.active_apn_settings.mmsc_url is None:
            return False
        messaging = device.app_statuses.get("messaging")
        if messaging is None:
            return False
        return messaging.permissions.storage and messaging.permissions.sms

    @env_function
    def simulate_network_search(self) -> None:
        """Re-derive the cellular connection from the SIM, mode preference and surroundings."""
        device = self.device
        if self._sim_status() == SimStatus.ACTIVE:
            device.network_connection_status = NetworkStatus.CONNECTED
            signals = self.surroundings.signal_strength
            preference = device.network_mode_preference
            five_g = signals.get(NetworkTechnology.FIVE_G, SignalStrength.NONE)
            if preference == NetworkModePreference.FOUR_G_5G_PREFERRED and (
                five_g != SignalStrength.NONE
            ):
                tech = NetworkTechnology.FIVE_G
            else:
                tech = _MODE_TECH.get(preference, NetworkTechnology.FOUR_G)
            device.network_technology_connected = tech
            device.network_signal_strength = signals.get(tech, SignalStrength.NONE)
        else:
            self._drop_network()
        if (
            device.airplane_mode
            or device.active_apn_settings.apn_name == APNNames.BROKEN
            or not self.surroundings.line_active
        ):
            self._drop_network()

    def _drop_network(self) -> None:
        self.device.network_connection_status = NetworkStatus.NO_SERVICE
        self.device.network_technology_connected = NetworkTechnology.NONE
        self.device.network_signal_strength = SignalStrength.NONE

    # --- status bar and network ---

    @tool(
        "Shows what icons are currently visible in your phone's status bar (the area at the top "
        "of the screen). Displays network signal strength, mobile data status (enabled, disabled, "
        "data saver), Wi-Fi status, and battery level."
    )
    def check_status_bar(self) -> str:
        return f"Status Bar: {self._status_bar()}"

    @tool(
        "Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane "
        "mode status, signal strength, network type, whether mobile data is enabled, and whether "
        "data roaming is enabled."
    )
    def check_network_status(self) -> str:
        device = self.device
        lines = [
            f"Airplane Mode: {_on_off(device.airplane_mode)}",
            f"SIM Card Status: {self._sim_status().value}",
            f"Cellular Connection: {device.network_connection_status.value}",
            f"Cellular Signal: {device.network_signal_strength.value}",
            f"Cellular Network Type: {device.network_technology_connected.value}",
            f"Mobile Data Enabled: {_yes_no(device.data_enabled)}",
            f"Data Roaming Enabled: {_yes_no(device.roaming_enabled)}",
            f"Wi-Fi Radio: {_on_off(device.wifi_enabled)}",
            f"Wi-Fi Connected: {_yes_no(device.wifi_connected)}",
        ]
        if device.wifi_connected:
            lines.append(f"Connected Wi-Fi Network: {device.wifi_ssid}")
        return "\n".join(lines)

    @tool("Shows the current network mode preference.")
    def check_network_mode_preference(self) -> str:
        return f"Network Mode Preference: {self.device.network_mode_preference.value}"

    @tool(
        "Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, "
        "3G). Higher-speed networks (LTE/5G) provide faster data but may use more battery.",
        mutates=True,
    )
    def set_network_mode_preference(self, mode: NetworkModePreference | str) -> str:
        try:
            chosen = NetworkModePreference(mode)
        except ValueError:
            options = ", ".join(m.value for m in NetworkModePreference)
            return self._with_status_bar(
                f"Failed to set network mode: '{mode}' is not a valid option. "
                f"Please use one of: {options}"
            )
        self.device.network_mode_preference = chosen
        self.simulate_network_search()
        return self._with_status_bar(f"Preferred Network Mode set to: {chosen.value}")

    @tool(
        "Measures your current internet connection speed (download speed). Provides information "
        "about connection quality and what activities it can support."
    )
    def run_speed_test(self) -> str:
        speed, band = self._speed()
        if speed is None:
            return f"Speed test failed: {band or 'Could not determine speed'}."
        return f"Speed Test Result: {speed:.2f} Mbps ({band}). {_SPEED_ADVICE.get(band, '')}"

    # --- airplane mode ---

    def _toggle_airplane_mode(self) -> bool:
        device = self.device
        turning_off = device.airplane_mode
        device.airplane_mode = not turning_off
        if turning_off:
            device.network_connection_status = NetworkStatus.SEARCHING
        if not turning_off or device.wifi_enabled:
            device.wifi_connected = False
            device.wifi_ssid = None
            device.wifi_signal_strength = SignalStrength.NONE
        if not turning_off and device.vpn_connected:
            self._disconnect_vpn()
        self.simulate_network_search()
        return device.airplane_mode

    @tool(
        "Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications "
        "including cellular, Wi-Fi, and Bluetooth.\n\nReturns the new state of airplane_mode.",
        mutates=True,
    )
    def toggle_airplane_mode(self) -> str:
        state = self._toggle_airplane_mode()
        return self._with_status_bar(f"Airplane Mode is now {_on_off(state)}.")

    @env_function
    def turn_airplane_mode_on(self) -> str:
        if not self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now ON."

    @env_function
    def turn_airplane_mode_off(self) -> str:
        if self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now OFF."

    # --- SIM card ---

    @tool(
        "Checks if your SIM card is working correctly and displays its current status. Shows if "
        "the SIM is active, missing, or locked with a PIN or PUK code."
    )
    def check_sim_status(self) -> str:
        status = self._sim_status()
        return _SIM_TEXT.get(status, f"Unknown SIM status: {status.value}")

    @tool(
        "Simulates removing and reinserting your SIM card. This can help resolve recognition "
        "issues.",
        mutates=True,
    )
    def reseat_sim_card(self) -> str:
        self.device.sim_card_missing = False
        self.simulate_network_search()
        return self._with_status_bar("SIM card re-seated successfully.")

    @env_function
    def unseat_sim_card(self) -> str:
        self.device.sim_card_missing = True
        self.simulate_network_search()
        return "SIM card un-seated successfully."

    @env_function
    def lock_sim_card(self, mode: str) -> str:
        if mode == "pin":
            self.device.sim_card_status = SimStatus.LOCKED_PIN
        elif mode == "puk":
            self.device.sim_card_status = SimStatus.LOCKED_PUK
        self.simulate_network_search()
        return f"SIM card locked successfully in {mode} mode."

    # --- mobile data and roaming ---

    def _toggle_data(self) -> bool:
        self.device.data_enabled = not self.device.data_enabled
        self.simulate_network_search()
        return self.device.data_enabled

    @tool(
        "Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can "
        "use cellular data for internet access when Wi-Fi is unavailable.\n\n"
        "Returns the new data connection status.",
        mutates=True,
    )
    def toggle_data(self) -> str:
        return self._with_status_bar(f"Mobile Data is now {_on_off(self._toggle_data())}.")

    @env_function
    def turn_data_on(self) -> str:
        # τ²-bench sets the switch without a network search here.
        self.device.data_enabled = True
        return "Data connection restored."

    @env_function
    def turn_data_off(self) -> str:
        if self._toggle_data():
            self._toggle_data()
        return "Data connection broken."

    def _toggle_roaming(self) -> bool:
        self.device.roaming_enabled = not self.device.roaming_enabled
        self.simulate_network_search()
        return self.device.roaming_enabled

    @tool(
        "Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas "
        "outside your carrier's coverage.\n\nReturns the new data roaming status.",
        mutates=True,
    )
    def toggle_roaming(self) -> str:
        return self._with_status_bar(f"Data Roaming is now {_on_off(self._toggle_roaming())}.")

    @env_function
    def turn_roaming_on(self) -> str:
        if not self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now ON."

    @env_function
    def turn_roaming_off(self) -> str:
        if self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now OFF."

    @tool(
        "Checks if your phone has any data-limiting features active. Shows if Data Saver mode is "
        "on."
    )
    def check_data_restriction_status(self) -> str:
        if self.device.data_saver_mode:
            return "Data Saver mode is ON (limits data usage)."
        return "Data Saver mode is OFF."

    def _toggle_data_saver_mode(self) -> bool:
        self.device.data_saver_mode = not self.device.data_saver_mode
        return self.device.data_saver_mode

    @tool(
        "Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data "
        "speed.\n\nReturns the new data saver mode status.",
        mutates=True,
    )
    def toggle_data_saver_mode(self) -> str:
        state = self._toggle_data_saver_mode()
        return self._with_status_bar(f"Data Saver Mode is now {_on_off(state)}.")

    @env_function
    def turn_data_saver_mode_on(self) -> str:
        self.device.data_saver_mode = True
        return "Data Saver Mode is now ON."

    @env_function
    def turn_data_saver_mode_off(self) -> str:
        self.device.data_saver_mode = False
        return "Data Saver Mode is now OFF."

    # --- APN settings ---

    @tool(
        "Checks the technical APN settings your phone uses to connect to your carrier's mobile "
        "data network. Shows current APN name and MMSC URL for picture messaging."
    )
    def check_apn_settings(self) -> str:
        settings = self.device.active_apn_settings
        apn_name = settings.apn_name.value or "Not Set"
        mmsc_url = settings.mmsc_url or "Not Set"
        return (
            f"Current APN Name: {apn_name}\nMMSC URL (for picture messages): {mmsc_url}\n"
            "(These are technical settings, usually best left unchanged.)"
        )

    @tool("Sets the APN settings for the phone.", mutates=True)
    def set_apn_settings(self, apn_settings: APNSettings | dict) -> str:  # type: ignore[type-arg]
        if isinstance(apn_settings, dict):
            apn_settings = APNSettings(**apn_settings)
        # Read the name first: anything but settings fails here, before it can corrupt the device.
        name = apn_settings.apn_name.value
        self.device.active_apn_settings = apn_settings
        self.simulate_network_search()
        return self._with_status_bar(f"APN settings set to: {name}")

    @tool("Resets your APN settings to the default settings.", mutates=True)
    def reset_apn_settings(self) -> str:
        # The defaults come back only at the next reboot, as on a real phone.
        self.device.active_apn_settings.reset_at_reboot = True
        self.simulate_network_search()
        return self._with_status_bar("APN settings will reset at reboot.")

    @env_function
    def break_apn_settings(self) -> str:
        self.device.active_apn_settings.apn_name = APNNames.BROKEN
        self.simulate_network_search()
        return "APN settings broken. Please call reset_apn_settings() to fix."

    @env_function
    def break_apn_mms_setting(self) -> str:
        self.device.active_apn_settings.mmsc_url = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    # --- Wi-Fi and Wi-Fi calling ---

    @tool(
        "Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're "
        "connected to (if any), and the signal strength."
    )
    def check_wifi_status(self) -> str:
        device = self.device
        if not device.wifi_enabled:
            return "Wi-Fi is turned OFF."
        if device.wifi_connected:
            return (
                f"Wi-Fi is ON and connected to '{device.wifi_ssid}'. "
                f"Signal strength: {device.wifi_signal_strength.value}."
            )
        return "Wi-Fi is ON but not connected to any network."

    @tool(
        "Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and "
        "connect to wireless networks for internet access.\n\nReturns the new Wi-Fi status.",
        mutates=True,
    )
    def toggle_wifi(self) -> str:
        device = self.device
        if device.airplane_mode:
            return self._with_status_bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        device.wifi_enabled = not device.wifi_enabled
        if not device.wifi_enabled:
            device.wifi_connected = False
            device.wifi_ssid = None
            device.wifi_signal_strength = SignalStrength.NONE
        return self._with_status_bar(f"Wi-Fi is now {_on_off(device.wifi_enabled)}.")

    @tool(
        "Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and "
        "receive calls over a Wi-Fi network instead of using the cellular network."
    )
    def check_wifi_calling_status(self) -> str:
        return f"Wi-Fi Calling is currently turned {_on_off(self.device.wifi_calling_enabled)}."

    @tool(
        "Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over "
        "Wi-Fi instead of the cellular network, which can help in areas with weak cellular "
        "signal.\n\nReturns the new Wi-Fi Calling status.",
        mutates=True,
    )
    def toggle_wifi_calling(self) -> str:
        self.device.wifi_calling_enabled = not self.device.wifi_calling_enabled
        state = self.device.wifi_calling_enabled
        return self._with_status_bar(f"Wi-Fi Calling is now {_on_off(state)}.")

    @env_function
    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        self.device.wifi_calling_enabled = enabled
        message = f"Wi-Fi Calling is now {_on_off(enabled)}."
        if mms_over_wifi is not None:
            self.device.wifi_calling_mms_over_wifi = mms_over_wifi
            message += f"\nMMS over Wi-Fi is now {_on_off(mms_over_wifi)}."
        return message

    # --- VPN ---

    @tool(
        "Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is "
        "active, connected, and displays any available connection details."
    )
    def check_vpn_status(self) -> str:
        device = self.device
        if device.vpn_connected:
            if device.vpn_details:
                return f"VPN is ON and connected. Details: {device.vpn_details.model_dump()}"
            return "VPN is ON and connected (no specific details available)."
        if device.vpn_enabled_setting:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    @tool("Connects to your VPN (Virtual Private Network).", mutates=True)
    def connect_vpn(self) -> str:
        if self.device.vpn_connected:
            return "VPN already connected."
        self.device.vpn_connected = True
        self.device.vpn_details = VpnDetails(
            server_address="192.168.1.1",
            protocol="OpenVPN",
            server_performance=PerformanceLevel.EXCELLENT,
        )
        return self._with_status_bar("VPN connected successfully.")

    def _disconnect_vpn(self) -> bool:
        if not self.device.vpn_connected:
            return False
        self.device.vpn_connected = False
        self.device.vpn_details = None
        return True

    @tool(
        "Disconnects any active VPN (Virtual Private Network) connection. Stops routing your "
        "internet traffic through a VPN server, which might affect connection speed or access to "
        "content.",
        mutates=True,
    )
    def disconnect_vpn(self) -> str:
        if self._disconnect_vpn():
            return self._with_status_bar("VPN disconnected successfully.")
        return self._with_status_bar("No active VPN connection to disconnect.")

    @env_function
    def break_vpn(self) -> str:
        """Connect a VPN whose server is slow, which drags mobile data down."""
        self.connect_vpn()
        if self.device.vpn_details is not None:
            self.device.vpn_details.server_performance = PerformanceLevel.POOR
        return "VPN connection broken."

    # --- apps ---

    @tool("Returns the name of all installed apps on the phone.")
    def check_installed_apps(self) -> str:
        names = ", ".join(self.device.app_statuses)
        return f"The following apps are installed on the phone: {names}"

    def _granted(self, app_name: str) -> list[str] | None:
        app = self.device.app_statuses.get(app_name)
        if app is None:
            return None
        granted = app.permissions.model_dump().items()
        return [name.replace("_", " ").lower() for name, allowed in granted if allowed]

    @tool(
        "Checks detailed information about a specific app. Shows its permissions and background "
        "data usage settings."
    )
    def check_app_status(self, app_name: str) -> str:
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        lines = [f"Status for App: {app_name}"]
        if granted:
            lines.append(" - Permissions Granted:")
            lines.extend(f"   - {name}" for name in granted)
        else:
            lines.append(" - Permissions: None granted.")
        return "\n".join(lines)

    @tool(
        "Checks what permissions a specific app currently has. Shows if the app has access to "
        "features like storage, camera, location, etc."
    )
    def check_app_permissions(self, app_name: str) -> str:
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    @tool(
        "Gives a specific permission to an app (like access to storage, camera, or location). "
        "Required for some app functions to work properly.",
        mutates=True,
        app_name="The name of the app to grant the permission to.",
        permission="The permission to grant, should be lowercase.",
    )
    def grant_app_permission(self, app_name: str, permission: str) -> str:
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            outcome = f"Error. App '{app_name}' not found. Cannot grant permission."
        else:
            available = list(app.permissions.model_dump())
            if permission in available:
                setattr(app.permissions, permission, True)
                outcome = f"Success. Permission '{permission}' granted to app '{app_name}'."
            else:
                outcome = (
                    f"Error. Permission '{permission}' not tracked for app '{app_name}', "
                    f"available permissions: {available}"
                )
        return self._with_status_bar(outcome)

    @env_function
    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if permission not in type(app.permissions).model_fields:
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        setattr(app.permissions, permission, False)
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    @tool("Checks if the default messaging app can send MMS messages.")
    def can_send_mms(self) -> str:
        if self._can_send_mms():
            return "Your messaging app can send MMS messages."
        return "Your messaging app cannot send MMS messages."

    # --- device ---

    @tool(
        "Restarts your phone completely. This can help resolve many temporary software glitches "
        "by refreshing all running services and connections.",
        mutates=True,
    )
    def reboot_device(self) -> str:
        lines = []
        if self.device.active_apn_settings.reset_at_reboot:
            lines.append("Resetting APN settings...")
            self.device.active_apn_settings = APNSettings()
        lines.append("Restarting network services...")
        self.device.network_connection_status = NetworkStatus.SEARCHING
        self.simulate_network_search()
        return self._with_status_bar("\n".join(lines))

    # --- payments ---

    @tool("Checks if the agent has sent you a payment request.")
    def check_payment_request(self) -> str:
        request = self.surroundings.payment_request
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request.bill_id} of {request.amount_due} USD."

    @tool("Makes a payment for the bill that the agent has sent you.", mutates=True)
    def make_payment(self) -> str:
        request = self.surroundings.payment_request
        if request is None:
            return "You do not have a payment request."
        request.paid = True
        return f"Payment of {request.amount_due} USD has been made for bill {request.bill_id}."

    # --- setup helpers ---

    @env_function
    def set_user_info(self, name: str, phone_number: str) -> None:
        self.surroundings.name = name
        self.surroundings.phone_number = phone_number

    @env_function
    def set_user_location(self, abroad: bool) -> None:
        self.surroundings.is_abroad = abroad

    # --- assertions ---

    @env_function
    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        return self.device.airplane_mode == expected_status

    @env_function
    def assert_service_status(self, expected_status: str) -> bool:
        return self.device.network_connection_status == NetworkStatus(expected_status)

    @env_function
    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        return self._mobile_data_working() == expected_status

    @env_function
    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        return self.device.roaming_enabled == expected_status

    @env_function
    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        return self.device.data_saver_mode == expected_status

    @env_function
    def assert_internet_speed(
        self, expected_speed: float, expected_desc: str | None = None
    ) -> bool:
        speed, band = self._speed()
        fast_enough = (speed or 0.0) >= expected_speed
        if expected_desc is None:
            return fast_enough
        return fast_enough and band.lower() == expected_desc.lower()

    @env_function
    def assert_internet_not_excellent(self) -> bool:
        return self._speed()[1].lower() != "excellent"

    @env_function
    def assert_can_send_mms(self, expected_status: bool) -> bool:
        return self._can_send_mms() == expected_status

    @env_function
    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        return self.surroundings.mobile_data_usage_exceeded == expected_status
