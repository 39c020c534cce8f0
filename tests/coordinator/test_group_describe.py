"""DescribeGroups as Kafka's GroupMetadataManager.describeGroups answers it: the protocol name and the
members' metadata only while the group is Stable (describeNoMetadata elsewhere: the protocol is not
settled while it rebalances), the members' assignments in every state, and Dead for a group that
does not exist."""

from __future__ import annotations

from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.test_group_coordinator import PROTO, join, make, sync

META = PROTO[0][1]


def _members(d: dict) -> list[tuple[bytes, bytes]]:  # type: ignore[type-arg]
    return [(m["member_metadata"], m["member_assignment"]) for m in d["members"]]


def test_protocol_and_metadata_only_while_stable_assignments_always() -> None:
    gc, _clock = make()
    a = join(gc).value
    assert gc.groups["g"].state is GroupState.COMPLETING_REBALANCE
    d = gc.describe_group("g")
    assert (d["group_state"], d["protocol_type"], d["protocol_data"]) == ("CompletingRebalance", "consumer", "")
    assert _members(d) == [(b"", b"")]
    sync(gc, a.member_id, 1, [(a.member_id, b"all")])
    d = gc.describe_group("g")
    assert (d["group_state"], d["protocol_data"]) == ("Stable", "range")
    assert _members(d) == [(META, b"all")]
    join(gc)  # a second member: PreparingRebalance until the first rejoins
    d = gc.describe_group("g")
    assert (d["group_state"], d["protocol_type"], d["protocol_data"]) == ("PreparingRebalance", "consumer", "")
    assert _members(d)[0] == (b"", b"all")


def test_a_group_that_does_not_exist_is_dead() -> None:
    gc, _clock = make()
    d = gc.describe_group("nobody")
    assert (d["error_code"], d["group_state"], d["protocol_data"], d["members"]) == (0, "Dead", "", [])
