"""The candidate table (CONTRACT §6.2, 6.4, 6.5): dedupe, refs, limits, expiry, revisions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.contract.canonical import canonical_bytes
from connector.core.observations import BleObservation, Observation
from connector.core.snapshot import CandidateTable, IngestOutcome, Revision
from tests.core.builders import (
    CATALOG_PROFILE,
    HR_UUID,
    T0,
    ble,
    mdns,
    profile,
    ref_factory,
    scope_of,
    table_for,
    usb,
)

ACCEPTED, UNCHANGED = IngestOutcome.ACCEPTED, IngestOutcome.UNCHANGED
OUT, LIMIT = IngestOutcome.OUT_OF_SCOPE, IngestOutcome.LIMIT_REACHED
HR = {"transport": "ble", "filters": {"service_uuids": [HR_UUID]}}


def strap(address: str = "C2:00:00:00:00:01", rssi: int = -60, **fields: Any) -> BleObservation:
    """A heart-rate strap advert (in the HR scope)."""
    fields.setdefault("service_uuids", (HR_UUID,))
    fields.setdefault("name", "Polar H10")
    fields.setdefault("manufacturer_data", {107: b"\x01"})
    return ble(address, rssi, **fields)


def counting_refs() -> tuple[Callable[[], str], list[str]]:
    """A ref factory that records every ref it handed out."""
    handed: list[str] = []
    factory = ref_factory()

    def new_ref() -> str:
        handed.append(factory())
        return handed[-1]

    return new_ref, handed


def hr_table(**profile_changes: Any) -> CandidateTable:
    """A BLE table for heart-rate straps."""
    return table_for(HR, profile(**profile_changes))


def refs(revision: Revision | None) -> list[str]:
    """The refs of a revision, in snapshot order."""
    assert revision is not None
    return [candidate["candidate/ref"] for candidate in revision.candidates]


# -- ingest outcomes and the candidate document -------------------------------------------------------------


def test_outcomes_of_repeats_rssi_payload_and_structure() -> None:
    table = hr_table()
    assert table.ingest(strap(), T0) is ACCEPTED
    assert table.ingest(strap(), T0 + 10) is UNCHANGED
    # Manufacturer data VALUES are not candidate content; only the company ids are.
    assert table.ingest(strap(manufacturer_data={107: b"\x99"}), T0 + 20) is UNCHANGED
    assert table.ingest(strap(rssi=-61), T0 + 30) is ACCEPTED
    assert table.ingest(strap(rssi=-61, manufacturer_data={107: b"", 6: b""}), T0 + 40) is ACCEPTED
    assert (
        table.ingest(strap(rssi=-61, manufacturer_data={107: b"", 6: b""}, name="Polar H9"), T0 + 50)
        is ACCEPTED
    )
    assert (
        table.ingest(strap(rssi=-61, manufacturer_data={107: b"", 6: b""}, name="Polar H9"), T0 + 999)
        is UNCHANGED
    )
    # The next whole second changes last_seen_at and expires_at.
    assert (
        table.ingest(strap(rssi=-61, manufacturer_data={107: b"", 6: b""}, name="Polar H9"), T0 + 1000)
        is ACCEPTED
    )
    assert len(table) == 1


def test_candidate_document_shape() -> None:
    table = hr_table()
    table.ingest(strap(tx_power=4, connectable=True), T0 + 1500)
    revision = table.cut(T0 + 1600)
    assert revision is not None and revision.revision == 1
    assert revision.generation == "gen-1"
    assert revision.candidates == (
        {
            "schema": "sensorium-device-discovery-candidate.v1",
            "candidate/ref": "ref-0001",
            "transport": "ble",
            "generation": "gen-1",
            "first_seen_at": "2026-11-30T12:00:01Z",
            "last_seen_at": "2026-11-30T12:00:01Z",
            "expires_at": "2026-11-30T12:00:31Z",
            "label": "Polar H10",
            "signal": {"rssi_dbm": -60},
            "ble": {
                "service_uuids": [HR_UUID],
                "manufacturer_ids": [107],
                "connectable": True,
                "tx_power": 4,
            },
        },
    )
    assert revision.snapshot() == {"candidates": list(revision.candidates)}
    assert revision.snapshot_bytes == len(canonical_bytes(revision.snapshot()))
    assert revision.cut_at_ms == T0 + 1600
    assert table.candidate_document("ref-0001") == revision.candidates[0]
    assert table.candidate_document("nope") is None


def test_rssi_is_clamped_to_the_int8_range() -> None:
    table = hr_table()
    table.ingest(strap(rssi=-300), T0)
    revision = table.cut(T0)
    assert revision is not None and revision.candidates[0]["signal"] == {"rssi_dbm": -128}
    table.ingest(strap(rssi=300), T0 + 500)
    revision = table.cut(T0 + 500)
    assert revision is not None and revision.candidates[0]["signal"] == {"rssi_dbm": 127}


# -- revisions ----------------------------------------------------------------------------------------------


def test_revisions_only_on_change_and_coalesced_by_the_interval() -> None:
    table = hr_table()
    assert table.cut(T0) is None  # nothing seen: no revision (final_revision would be 0)
    table.ingest(strap(), T0)
    first = table.cut(T0)
    assert first is not None and first.revision == 1
    assert table.cut(T0 + 1000) is None  # nothing changed
    table.ingest(strap(rssi=-70), T0 + 1100)
    table.ingest(strap(rssi=-71), T0 + 1150)
    assert table.cut(T0 + 1200) is not None  # 1.2 s after the first cut
    table.ingest(strap(rssi=-72), T0 + 1300)
    assert table.cut(T0 + 1400) is None  # within 250 ms of the last revision: coalesced
    table.ingest(strap(rssi=-73), T0 + 1420)
    third = table.cut(T0 + 1450)
    assert third is not None and third.revision == 3
    assert third.candidates[0]["signal"] == {"rssi_dbm": -73}
    table.ingest(strap(rssi=-74), T0 + 1500)
    final = table.cut(T0 + 1500, final=True)  # the final cut ignores the interval
    assert final is not None and final.revision == 4
    assert table.latest is final


def test_a_change_that_returns_to_the_last_revision_cuts_nothing() -> None:
    table = hr_table()
    table.ingest(strap(rssi=-60), T0)
    assert table.cut(T0) is not None
    table.ingest(strap(rssi=-65), T0 + 100)
    table.ingest(strap(rssi=-60), T0 + 200)
    assert table.cut(T0 + 300) is None
    assert table.latest is not None and table.latest.revision == 1


def test_unchanged_candidates_keep_their_document_objects() -> None:
    table = hr_table()
    table.ingest(strap("C2:00:00:00:00:01"), T0)
    table.ingest(strap("C2:00:00:00:00:02"), T0)
    first = table.cut(T0)
    table.ingest(strap("C2:00:00:00:00:02", rssi=-50), T0 + 300)
    second = table.cut(T0 + 300)
    assert first is not None and second is not None
    assert second.candidates[0] is first.candidates[0]
    assert second.candidates[1] != first.candidates[1]


def test_max_revisions_ends_cutting_and_sets_the_limit() -> None:
    table = hr_table(max_revisions=3, min_revision_interval_ms=0)
    for step in range(3):
        table.ingest(strap(rssi=-60 - step), T0 + step)
        assert table.cut(T0 + step) is not None
    assert table.limit_reason == "limit-reached"
    table.ingest(strap(rssi=-90), T0 + 10)
    assert table.cut(T0 + 10) is None
    assert table.cut(T0 + 10, final=True) is None
    assert table.next_cut_at_ms() is None
    assert table.latest is not None and table.latest.revision == 3


def test_candidates_are_ordered_by_first_seen_then_ref() -> None:
    new_ref = iter(["zz", "aa", "mm"]).__next__
    table = CandidateTable(scope_of(HR), CATALOG_PROFILE, generation="g", new_ref=new_ref)
    table.ingest(strap("C2:00:00:00:00:01"), T0 + 2000)  # zz, later second
    table.ingest(strap("C2:00:00:00:00:02"), T0 + 1100)  # aa
    table.ingest(strap("C2:00:00:00:00:03"), T0 + 1900)  # mm, same second as aa
    assert refs(table.cut(T0 + 2000)) == ["aa", "mm", "zz"]


# -- refs ---------------------------------------------------------------------------------------------------


def test_refs_are_stable_per_device_and_survive_leaving_and_coming_back() -> None:
    new_ref, handed = counting_refs()
    table = CandidateTable(scope_of(HR), CATALOG_PROFILE, generation="g", new_ref=new_ref)
    table.ingest(strap("C2:00:00:00:00:01"), T0)
    table.ingest(strap("C2:00:00:00:00:02"), T0)
    table.ingest(strap("C2:00:00:00:00:01", rssi=-40), T0 + 10)
    assert handed == ["ref-0001", "ref-0002"]
    # Device 1 expires (30 s), then comes back: same ref, new first sighting.
    table.ingest(strap("C2:00:00:00:00:02"), T0 + 29_000)
    assert table.cut(T0 + 30_000) is not None
    assert refs(table.latest) == ["ref-0002"]
    table.ingest(strap("C2:00:00:00:00:01"), T0 + 31_000)
    revision = table.cut(T0 + 31_000)
    assert refs(revision) == ["ref-0002", "ref-0001"]
    assert revision is not None and revision.candidates[1]["first_seen_at"] == "2026-11-30T12:00:31Z"
    assert handed == ["ref-0001", "ref-0002"]


# -- expiry and removal -------------------------------------------------------------------------------------


def test_expiry_drops_a_candidate_at_its_shown_expires_at() -> None:
    table = hr_table()
    table.ingest(strap(), T0 + 1700)
    assert table.cut(T0 + 1700) is not None
    assert table.candidate_expires_at_ms("ref-0001") == T0 + 31_000
    assert table.next_cut_at_ms() == T0 + 31_000
    assert table.cut(T0 + 30_999) is None
    dropped = table.cut(T0 + 31_000)
    assert dropped is not None and dropped.candidates == ()
    assert table.binding_target("ref-0001") is None
    assert table.candidate_expires_at_ms("ref-0001") is None
    assert len(table) == 0


def test_an_expired_but_uncut_device_is_readmitted_fresh() -> None:
    table = hr_table()
    table.ingest(strap(), T0)
    table.cut(T0)
    assert table.ingest(strap(), T0 + 40_000) is ACCEPTED
    revision = table.cut(T0 + 40_000)
    assert revision is not None and revision.candidates[0]["first_seen_at"] == "2026-11-30T12:00:40Z"
    assert refs(revision) == ["ref-0001"]


def test_usb_removal_drops_the_device_and_unknown_removals_leave_no_trace() -> None:
    new_ref, handed = counting_refs()
    scope = scope_of({"transport": "usb-serial", "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}]}})
    table = CandidateTable(scope, CATALOG_PROFILE, generation="g", new_ref=new_ref)
    assert table.ingest(usb("/dev/ttyUSB7", event="remove"), T0) is OUT
    assert table.next_cut_at_ms() is None
    assert table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001, product="FT232R"), T0) is ACCEPTED
    assert table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001, product="FT232R"), T0 + 500) is UNCHANGED
    assert table.cut(T0 + 500) is not None
    assert table.binding_target("ref-0001") == ("usb-serial", "/dev/ttyUSB0")
    assert table.ingest(usb("/dev/ttyUSB0", event="remove"), T0 + 900) is ACCEPTED
    revision = table.cut(T0 + 900)
    assert revision is not None and revision.candidates == ()
    assert table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001), T0 + 1900) is ACCEPTED
    assert refs(table.cut(T0 + 1900)) == ["ref-0001"]
    assert handed == ["ref-0001"]


def test_mdns_removal_goodbye_and_record_ttl() -> None:
    table = table_for({"transport": "mdns", "filters": {"service_types": ["_ipp._tcp"]}})
    table.ingest(mdns("Lab printer._ipp._tcp.local.", addresses=("192.0.2.7",), port=631, ttl=10), T0)
    revision = table.cut(T0)
    assert revision is not None and revision.candidates[0]["expires_at"] == "2026-11-30T12:00:10Z"
    assert revision.candidates[0]["label"] == "Lab printer"
    assert table.binding_target("ref-0001") == ("mdns", "192.0.2.7:631")
    # A longer record TTL is capped by the candidate TTL (30 s).
    table.ingest(mdns("Lab printer._ipp._tcp.local.", event="update", ttl=4500), T0 + 1000)
    revision = table.cut(T0 + 1000)
    assert revision is not None and revision.candidates[0]["expires_at"] == "2026-11-30T12:00:31Z"
    assert table.ingest(mdns("Lab printer._ipp._tcp.local.", event="remove"), T0 + 2000) is ACCEPTED
    assert table.cut(T0 + 2000) is not None and len(table) == 0
    table.ingest(mdns("Hall._ipp._tcp.local.", addresses=("2001:db8::7",), port=631), T0 + 3000)
    assert table.binding_target("ref-0002") == ("mdns", "[2001:db8::7]:631")
    assert table.ingest(mdns("Hall._ipp._tcp.local.", ttl=0), T0 + 3100) is ACCEPTED
    assert len(table) == 0
    assert table.ingest(mdns("Never._ipp._tcp.local.", ttl=0), T0 + 3200) is OUT


def test_binding_target_by_transport() -> None:
    table = hr_table()
    table.ingest(strap("C2:AA:BB:CC:DD:EE"), T0)
    assert table.binding_target("ref-0001") == ("ble", "C2:AA:BB:CC:DD:EE")
    assert table.binding_target("ref-9999") is None


# -- out of scope leaves no trace ---------------------------------------------------------------------------


def test_out_of_scope_observations_leave_no_trace() -> None:
    new_ref, handed = counting_refs()
    table = CandidateTable(scope_of(HR), CATALOG_PROFILE, generation="g", new_ref=new_ref)
    for index in range(500):
        assert (
            table.ingest(ble(f"C2:00:00:00:{index >> 8:02X}:{index & 255:02X}", name="Lamp"), T0 + index)
            is OUT
        )
    assert table.ingest(usb(vid=1, pid=2), T0) is OUT
    assert table.ingest(mdns(), T0) is OUT
    assert len(table) == 0 and handed == []
    assert table.next_cut_at_ms() is None
    assert table.cut(T0 + 1000) is None
    assert table.limit_reason is None
    assert table.snapshot_bytes() == len(canonical_bytes({"candidates": []}))


def test_out_of_scope_floods_do_not_disturb_revisions() -> None:
    table = hr_table()
    table.ingest(strap(), T0)
    first = table.cut(T0)
    for index in range(200):
        table.ingest(ble(f"C2:11:00:00:00:{index:02X}", rssi=-30), T0 + 300 + index)
    assert table.cut(T0 + 600) is None
    assert table.latest is first


# -- limits -------------------------------------------------------------------------------------------------


def test_count_limit_keeps_the_first_and_stops_new_devices() -> None:
    scope = scope_of({**HR, "limits": {"max_candidates": 2}})
    table = CandidateTable(scope, CATALOG_PROFILE, generation="g", new_ref=ref_factory())
    assert table.ingest(strap("C2:00:00:00:00:01"), T0) is ACCEPTED
    assert table.ingest(strap("C2:00:00:00:00:02"), T0) is ACCEPTED
    assert table.limit_reason is None
    assert table.ingest(strap("C2:00:00:00:00:03"), T0) is LIMIT
    assert table.limit_reason == "limit-reached"
    # Known devices still update; new ones stay refused even after room frees up.
    assert table.ingest(strap("C2:00:00:00:00:01", rssi=-40), T0 + 1) is ACCEPTED
    table.ingest(strap("C2:00:00:00:00:01", rssi=-40), T0 + 20_000)
    assert table.cut(T0 + 30_000) is not None and len(table) == 1
    assert table.ingest(strap("C2:00:00:00:00:04"), T0 + 30_001) is LIMIT
    assert refs(table.latest) == ["ref-0001"]


def test_a_full_table_makes_room_from_expired_candidates_first() -> None:
    scope = scope_of({**HR, "limits": {"max_candidates": 1}})
    table = CandidateTable(scope, CATALOG_PROFILE, generation="g", new_ref=ref_factory())
    table.ingest(strap("C2:00:00:00:00:01"), T0)
    assert table.ingest(strap("C2:00:00:00:00:02"), T0 + 30_000) is ACCEPTED
    assert table.limit_reason is None


def test_byte_limit_refuses_a_device_that_would_not_fit() -> None:
    probe = hr_table()
    probe.ingest(strap("C2:00:00:00:00:01"), T0)
    one = probe.cut(T0)
    assert one is not None
    # Room for one candidate with its RSSI reserved at four characters, not for two.
    bound = one.snapshot_bytes + 1
    table = table_for({**HR, "limits": {"max_snapshot_bytes": bound}})
    assert table.ingest(strap("C2:00:00:00:00:01"), T0) is ACCEPTED
    assert table.ingest(strap("C2:00:00:00:00:02"), T0) is LIMIT
    assert table.limit_reason == "limit-reached"
    for rssi in (-128, -1, 0, 127):  # any RSSI still fits
        assert table.ingest(strap("C2:00:00:00:00:01", rssi=rssi), T0 + 1000 + rssi + 200) is not LIMIT
        revision = table.cut(T0 + 5000 + rssi + 200, final=True)
        assert revision is None or revision.snapshot_bytes <= bound


def test_a_content_change_that_does_not_fit_is_not_applied() -> None:
    probe = hr_table()
    probe.ingest(strap(rssi=-128), T0)
    first = probe.cut(T0)
    assert first is not None
    table = table_for({**HR, "limits": {"max_snapshot_bytes": first.snapshot_bytes}})
    assert table.ingest(strap(), T0) is ACCEPTED
    assert table.ingest(strap(name="Polar H10 with a much longer name"), T0 + 100) is LIMIT
    assert table.limit_reason == "limit-reached"
    revision = table.cut(T0 + 100)
    assert revision is not None and revision.candidates[0]["label"] == "Polar H10"
    assert revision.snapshot_bytes <= first.snapshot_bytes


# -- erase --------------------------------------------------------------------------------------------------


def test_erase_forgets_everything_and_accepts_nothing() -> None:
    table = hr_table()
    table.ingest(strap(), T0)
    table.cut(T0)
    table.erase()
    assert table.latest is None and len(table) == 0
    assert table.binding_target("ref-0001") is None
    assert table.ingest(strap(), T0 + 1) is OUT
    assert table.cut(T0 + 1000, final=True) is None
    assert table.next_cut_at_ms() is None


def test_next_cut_at() -> None:
    table = hr_table()
    assert table.next_cut_at_ms() is None
    table.ingest(strap(), T0 + 100)
    assert table.next_cut_at_ms() == T0 + 100
    table.cut(T0 + 200)
    assert table.next_cut_at_ms() == T0 + 30_000  # only the expiry is pending
    table.ingest(strap(rssi=-1), T0 + 300)
    assert table.next_cut_at_ms() == T0 + 450  # last cut + 250 ms
    table.ingest(strap(rssi=-2), T0 + 800)
    assert table.next_cut_at_ms() == T0 + 450  # a pending change keeps its due time


# -- property: bounds hold under any flood ------------------------------------------------------------------

ADDRESSES = [f"C2:00:00:00:00:{n:02X}" for n in range(12)]
flood_step = st.tuples(
    st.sampled_from(ADDRESSES),
    st.integers(-130, 130),
    st.sampled_from([None, "Polar H10", "Polar H9 with a rather long name", "Lamp"]),
    st.booleans(),  # in scope?
    st.integers(0, 12_000),  # ms since the previous step
    st.booleans(),  # cut after this step?
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(flood_step, min_size=1, max_size=120),
    max_candidates=st.integers(1, 8),
    max_bytes=st.integers(17, 3000),
    interval=st.sampled_from([0, 250, 1000]),
)
def test_bounds_hold_under_a_flood(
    steps: list[tuple[str, int, str | None, bool, int, bool]],
    max_candidates: int,
    max_bytes: int,
    interval: int,
) -> None:
    prof = profile(min_revision_interval_ms=interval, max_revisions=40)
    scope = scope_of(
        {**HR, "limits": {"max_candidates": max_candidates, "max_snapshot_bytes": max_bytes}}, prof
    )
    table = CandidateTable(scope, prof, generation="g", new_ref=ref_factory())
    now, last_number = T0, 0
    for address, rssi, name, in_scope, delta, cut in steps:
        now += delta
        uuids = (HR_UUID,) if in_scope else ()
        outcome = table.ingest(ble(address, rssi, name=name, service_uuids=uuids), now)
        if not in_scope:
            assert outcome is OUT
        revision = table.cut(now) if cut else None
        if revision is not None:
            _check_revision(revision, scope.max_candidates, scope.max_snapshot_bytes, last_number)
            last_number = revision.revision
        assert len(table) <= max_candidates
        assert table.snapshot_bytes() <= max_bytes
    final = table.cut(now + 1, final=True)
    if final is not None:
        _check_revision(final, scope.max_candidates, scope.max_snapshot_bytes, last_number)


def _check_revision(revision: Revision, max_candidates: int, max_bytes: int, last_number: int) -> None:
    assert revision.revision == last_number + 1
    assert len(revision.candidates) <= max_candidates
    encoded = canonical_bytes(revision.snapshot())
    assert revision.snapshot_bytes == len(encoded) <= max_bytes
    order = [(c["first_seen_at"], c["candidate/ref"]) for c in revision.candidates]
    assert order == sorted(order)
    assert len({c["candidate/ref"] for c in revision.candidates}) == len(revision.candidates)
    assert all(candidate["ble"]["service_uuids"] == [HR_UUID] for candidate in revision.candidates)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(flood_step, min_size=1, max_size=80))
def test_refs_map_one_to_one_onto_devices(steps: list[tuple[str, int, str | None, bool, int, bool]]) -> None:
    table = hr_table(max_revisions=1000, min_revision_interval_ms=0)
    device_of_ref: dict[str, str] = {}
    ref_of_device: dict[str, str] = {}
    now = T0
    for address, rssi, name, _, delta, _ in steps:
        now += delta % 3000
        table.ingest(ble(address, rssi, name=name, service_uuids=(HR_UUID,)), now)
        revision = table.cut(now)
        if revision is None:
            continue
        for candidate in revision.candidates:
            ref = candidate["candidate/ref"]
            device = _device_of(table, ref)
            assert device_of_ref.setdefault(ref, device) == device
            assert ref_of_device.setdefault(device, ref) == ref


def _device_of(table: CandidateTable, ref: str) -> str:
    target = table.binding_target(ref)
    assert target is not None
    return target[1]


def test_observation_union_is_what_the_table_takes() -> None:
    observations: list[Observation] = [strap(), usb(), mdns()]
    table = hr_table()
    assert [table.ingest(o, T0) for o in observations] == [ACCEPTED, OUT, OUT]


@pytest.mark.parametrize("transport", ["usb-serial", "mdns"])
def test_event_tables_ignore_adverts(transport: str) -> None:
    raw = {
        "usb-serial": {"transport": "usb-serial", "filters": {"serial_numbers": ["A"]}},
        "mdns": {"transport": "mdns", "filters": {"service_types": ["_ipp._tcp"]}},
    }[transport]
    table = table_for(raw)
    assert table.ingest(strap(), T0) is OUT
    assert len(table) == 0


def test_a_different_device_on_a_reused_port_path_gets_a_new_ref() -> None:
    new_ref, handed = counting_refs()
    scope = scope_of({"transport": "usb-serial", "filters": {"vid_pid": [{"vid": 0x0403, "pid": 0x6001}]}})
    table = CandidateTable(scope, CATALOG_PROFILE, generation="g", new_ref=new_ref)
    table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001, serial_number="FT-A"), T0)
    table.ingest(usb("/dev/ttyUSB0", event="remove"), T0 + 100)
    table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001, serial_number="FT-B"), T0 + 200)
    assert handed == ["ref-0001", "ref-0002"]
    table.ingest(usb("/dev/ttyUSB0", event="remove"), T0 + 300)
    table.ingest(usb("/dev/ttyUSB0", vid=0x0403, pid=0x6001, serial_number="FT-B"), T0 + 400)
    assert handed == ["ref-0001", "ref-0002"]
    assert refs(table.cut(T0 + 400)) == ["ref-0002"]
