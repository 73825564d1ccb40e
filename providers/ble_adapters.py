"""Which adapters bluetoothd has and which are powered, followed from bluetoothd's own signals.

A scan's adapter is resolved at admission (its claim key, CONTRACT §6.7). Asking bluetoothd for it is a
GetManagedObjects round trip on every admission; like bleak's `BlueZManager`, the link asks once and then
follows the signals bluetoothd sends anyway:

- ObjectManager `InterfacesAdded` / `InterfacesRemoved` carrying `org.bluez.Adapter1` (gdbus/object.c
  emits them when src/adapter.c `adapter_register` / `adapter_unregister` add or drop the interface);
- `PropertiesChanged` of `Powered` on an adapter (src/adapter.c `settings_changed`);
- a new owner of `org.bluez` (bluetoothd restarted): everything known is forgotten and asked again.

Signals that arrive while the first answer is on its way are replayed over it in order: each one sets a
fact outright, so replaying one the answer already holds changes nothing.
"""

from __future__ import annotations

from typing import Any

from dbus_fast import Message, MessageType

from providers.ble_worker import ADAPTER_IFACE, BLUEZ, DBUS

OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
ADAPTER_RULES = (
    f"type='signal',sender='{BLUEZ}',interface='{OBJECT_MANAGER_IFACE}',member='InterfacesAdded'",
    f"type='signal',sender='{BLUEZ}',interface='{OBJECT_MANAGER_IFACE}',member='InterfacesRemoved'",
    f"type='signal',sender='{BLUEZ}',interface='{PROPERTIES_IFACE}',member='PropertiesChanged',"
    f"arg0='{ADAPTER_IFACE}'",
    f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',arg0='{BLUEZ}'",
)


class AdapterView:
    """Adapter name -> powered, as bluetoothd last said; None until its first answer."""

    def __init__(self) -> None:
        self._powered: dict[str, bool] | None = None
        self._early: list[Message] | None = None  # signals seen while the first answer is on its way
        self._generation = 0  # moves on with every new owner of org.bluez

    @property
    def known(self) -> bool:
        """True once an answer was taken and no restart of bluetoothd came since."""
        return self._powered is not None

    def default(self) -> str | None:
        """The first powered adapter in name order (None when none is)."""
        assert self._powered is not None
        return min((name for name, on in self._powered.items() if on), default=None)

    def begin(self) -> int:
        """A GetManagedObjects is about to go out: keep the signals that come meanwhile."""
        self._early = []
        return self._generation

    def take(self, generation: int, managed: dict[str, dict[str, dict[str, Any]]]) -> str | None:
        """Its answer, with the signals seen meanwhile replayed over it; the default it gives."""
        powered = {
            _name(path): _is_on(interfaces[ADAPTER_IFACE])
            for path, interfaces in managed.items()
            if ADAPTER_IFACE in interfaces
        }
        for signal in self._early or ():
            _apply(powered, signal)
        self._early = None
        if generation == self._generation:  # else bluetoothd restarted meanwhile: ask again next time
            self._powered = powered
        return min((name for name, on in powered.items() if on), default=None)

    def abandon(self) -> None:
        """The answer never came."""
        self._early = None

    def forget(self) -> None:
        """The connection is new: nothing heard on the old one holds."""
        self._powered = None
        self._early = None
        self._generation += 1

    def on_message(self, msg: Message) -> None:
        """One message of the link's connection; only bluetoothd's adapter signals count."""
        if msg.message_type != MessageType.SIGNAL:
            return
        if msg.member == "NameOwnerChanged":
            if msg.body[0] == BLUEZ:
                self.forget()
            return
        if self._powered is not None:
            _apply(self._powered, msg)
        elif self._early is not None:
            self._early.append(msg)


def _apply(powered: dict[str, bool], msg: Message) -> None:
    """Set the facts one adapter signal states."""
    if msg.member == "InterfacesAdded" and ADAPTER_IFACE in msg.body[1]:
        powered[_name(msg.body[0])] = _is_on(msg.body[1][ADAPTER_IFACE])
    elif msg.member == "InterfacesRemoved" and ADAPTER_IFACE in msg.body[1]:
        powered.pop(_name(msg.body[0]), None)
    elif msg.member == "PropertiesChanged" and _powered_change(msg) and _name(msg.path or "") in powered:
        powered[_name(msg.path or "")] = bool(msg.body[1]["Powered"].value)


def _powered_change(msg: Message) -> bool:
    return msg.body[0] == ADAPTER_IFACE and "Powered" in msg.body[1]


def _is_on(properties: dict[str, Any]) -> bool:
    powered = properties.get("Powered")
    return powered is not None and bool(powered.value)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]
