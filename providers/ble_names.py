"""Names a bench tester knows for BLE numbers, from bleak's own tables (as nRF Connect or bluetoothctl show).

`bleak.uuids` holds the Bluetooth SIG's assigned UUIDs (and well-known vendor ones such as Nordic UART);
bleak's company identifier table holds the SIG's manufacturer list. A name is always shown beside its
number (`Heart Rate (180d)`, `Nordic Semiconductor ASA (0x0059)`), so the number a filter takes stays in
view. Only display code uses this; wire documents keep the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Final

BASE_SUFFIX: Final = "-0000-1000-8000-00805f9b34fb"
_UNNAMED: Final = frozenset({"Unknown", "Vendor specific"})


@cache
def _companies() -> Mapping[int, str]:
    # bleak keeps the SIG company list in a private module; without it, numbers are shown alone.
    try:
        from bleak.backends._manufacturers import MANUFACTURERS
    except ImportError:  # pragma: no cover - an older or newer bleak
        return {}
    return dict(MANUFACTURERS)


def uuid_name(uuid: str) -> str | None:
    """The assigned name of a (128-bit, lowercase) UUID, or None."""
    from bleak.uuids import uuidstr_to_str

    name = uuidstr_to_str(uuid)
    return None if name in _UNNAMED else name


def short_uuid(uuid: str) -> str:
    """`180d` for a UUID on the Bluetooth base, else the first 8 hex digits (`6e400001`)."""
    lowered = uuid.lower()
    if lowered.endswith(BASE_SUFFIX) and lowered.startswith("0000"):
        return lowered[4:8]
    return lowered[:8]


def uuid_label(uuid: str) -> str:
    """`Heart Rate (180d)`; an unnamed UUID as its short form."""
    name = uuid_name(uuid)
    short = short_uuid(uuid)
    return f"{name} ({short})" if name else short


def company_name(company_id: int) -> str | None:
    """The SIG name of a company identifier, or None."""
    return _companies().get(company_id)


def company_label(company_id: int) -> str:
    """`Nordic Semiconductor ASA (0x0059)`; an unnamed one as `mfr 0x....`."""
    name = company_name(company_id)
    return f"{name} (0x{company_id:04x})" if name else f"mfr 0x{company_id:04x}"
