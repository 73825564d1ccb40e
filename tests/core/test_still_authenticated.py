"""The re-check after a long wait: the same token's principal as the principals say now, with no token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connector.core.authority import Grant, Principal, authenticate, still_authenticated
from connector.errors import SensoriumError
from tests.core.test_authority import ALICE, BOB, EVERYONE, SCAN


def test_the_current_version_of_the_same_token_answers() -> None:
    narrowed = replace(ALICE, grants=(Grant(SCAN, ("ble",)),))
    assert still_authenticated(ALICE, EVERYONE) is ALICE
    assert still_authenticated(ALICE, (BOB, narrowed)) is narrowed  # its grants as they are now
    assert still_authenticated(ALICE, (narrowed,)) == authenticate("tok-alice", (narrowed,))


@pytest.mark.parametrize(
    "now",
    [
        (BOB,),  # removed
        (replace(ALICE, revoked=True), BOB),  # revoked
        (replace(ALICE, token_sha256="0" * 64),),  # given another token
        (),  # a refused principals file authenticates nobody
    ],
)
def test_a_token_that_no_longer_authenticates_is_refused_as_authenticate_would(
    now: tuple[Principal, ...],
) -> None:
    with pytest.raises(SensoriumError) as refused:
        still_authenticated(ALICE, now)
    assert refused.value.code == "unauthenticated"
    with pytest.raises(SensoriumError) as again:
        authenticate("tok-alice", now)
    assert again.value.code == refused.value.code
