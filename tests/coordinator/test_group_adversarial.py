"""Defects an adversarial probe found against Apache Kafka's classic group coordinator, each pinned
where the sans-IO coordinator decides it, with a restart (replay of the log) where state changed:

- DeleteGroups and OffsetDelete write a tombstone for a partition whose only offset is a pending
  transactional one, and replaying it drops that offset: the transaction's COMMIT brings nothing back
  (Kafka's deleteAllOffsets / deleteOffsets / replay of a tombstone). A TxnOffsetCommit with
  generation -1 creates the (Empty, simple) group, as Kafka's does, by the replay of its record.
- OffsetDelete on a group with members that is not a "consumer" group is NON_EMPTY_GROUP
  (validateOffsetDelete); a consumer group whose subscriptions do not parse counts as subscribed to
  every topic (isSubscribedToTopic).
- SyncGroup v5+ answers INCONSISTENT_GROUP_PROTOCOL for a protocol type or name that differs from
  the group's (isProtocolInconsistent), after the member and generation checks.
- A joining member needs a protocol every member supports (supportsProtocols); an empty protocol
  type or protocol list is refused, on a new or Empty group too.
- The protocol is Kafka's vote (selectProtocol), ties broken as its HashMap iterates; the static
  replacement compares the protocol the vote would select next.
- ListGroups' states filter is case-insensitive.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import GroupState, java_hash_map_order
from tests.coordinator.group_harness import RANGE, GroupLog

E = ErrorCode
META = RANGE[0][1]  # a ConsumerProtocolSubscription of topic "t"
RR_FIRST = [("roundrobin", META), ("range", META)]
RANGE_FIRST = [("range", META), ("roundrobin", META)]


def _stable(h: GroupLog, members: list[tuple[list[tuple[str, bytes]], str | None]],
            protocol_type: str = "consumer", group: str = "g") -> tuple[list[str], str]:
    """A Stable group of ``members`` (protocols, instance id), the first its leader; returns the
    member ids in that order and the selected protocol."""
    (p0, i0), rest = members[0], members[1:]
    first = h.join(protocols=p0, instance=i0, protocol_type=protocol_type, group=group).value
    assert first.error == E.none and first.generation_id == 1
    h.sync(first.member_id, 1, [(first.member_id, b"")], instance=i0, group=group)
    if not rest:
        return [first.member_id], first.protocol_name
    boxes = [h.join(protocols=p, instance=i, protocol_type=protocol_type, group=group) for p, i in rest]
    again = h.join(first.member_id, i0, protocols=p0, protocol_type=protocol_type, group=group).value
    ids = [first.member_id] + [b.value.member_id for b in boxes]
    assert again.leader == first.member_id and again.generation_id == 2
    assert all(b.value.generation_id == 2 and b.value.protocol_name == again.protocol_name for b in boxes)
    h.sync(ids[0], 2, [(m, b"") for m in ids], instance=i0, group=group)
    for b, (_p, i) in zip(boxes, rest, strict=True):
        assert h.sync(b.value.member_id, 2, instance=i, group=group).value.error == E.none
    assert h.gc.groups[group].state is GroupState.STABLE
    return ids, again.protocol_name


# --- 1. deletion and pending transactional offsets -----------------------------------------------

def test_delete_groups_tombstones_pending_only_partitions_and_the_commit_does_not_bring_the_group_back() -> None:
    h = GroupLog()
    assert h.commit("", -1, [("t", 0, 5)]) == {("t", 0): E.none}
    assert h.txn_commit(7, "", -1, [("t", 1, 77)]) == {("t", 1): E.none}
    errors, records = h.gc.delete_groups(["g"])
    assert errors == {"g": E.none}
    assert records == [(rec.offset_key("g", "t", 0), None), (rec.offset_key("g", "t", 1), None),
                       (rec.group_key("g"), None)]
    h.apply(records)
    assert "g" not in h.gc.groups and not h.gc.has_pending("g", ("t", 1))
    h.marker(7, commit=True)
    assert "g" not in h.gc.groups and h.committed(("t", 1)) is None and h.gc.list_groups() == []
    gc = h.restart()
    assert "g" not in gc.groups and gc.offsets == {} and gc.list_groups() == []


def test_offset_delete_of_a_pending_only_partition_drops_the_pending_offset() -> None:
    h = GroupLog()
    h.commit("", -1, [("t", 0, 5)])
    h.txn_commit(7, "", -1, [("t", 1, 77)])
    assert h.gc.offset_fetch("g", [("t", 1)], True)[("t", 1)] == (None, E.unstable_offset_commit)
    assert h.offset_delete([("t", 1)]) == (E.none, {("t", 1): E.none})
    assert h.entries[-1][:2] == (rec.offset_key("g", "t", 1), None)
    assert h.gc.offset_fetch("g", [("t", 1)], True)[("t", 1)] == (None, E.none)
    h.marker(7, commit=True)
    assert h.committed(("t", 1)) is None and h.committed(("t", 0)) == 5
    gc = h.restart()
    assert gc.offset_fetch("g", [("t", 0), ("t", 1)], True) == {
        ("t", 0): (h.gc.offsets["g"][("t", 0)], E.none), ("t", 1): (None, E.none)}


def test_offset_delete_writes_nothing_for_a_partition_without_any_offset() -> None:
    h = GroupLog()
    h.commit("", -1, [("t", 0, 5)])
    n = len(h.entries)
    assert h.offset_delete([("t", 3)]) == (E.none, {("t", 3): E.none})
    assert len(h.entries) == n


def test_txn_offset_commit_with_generation_minus_one_creates_the_empty_group_by_replay() -> None:
    h = GroupLog()
    result = h.gc.txn_offset_commit("new", 7, -1, "", None, [("t", 0, 3, -1, None)])
    assert result.errors == {("t", 0): E.none} and "new" not in h.gc.groups, "records first"
    h.apply(result.records, 7, transactional=True)
    g = h.gc.groups["new"]
    assert g.state is GroupState.EMPTY and g.protocol_type is None
    assert h.gc.list_groups() == [("new", "", "Empty")]
    assert h.restart().list_groups() == [("new", "", "Empty")], "the replay of the record creates it again"
    h.marker(7, commit=False)
    assert h.gc.offsets == {} and h.expire() == [(rec.group_key("new"), None)]
    assert h.restart().list_groups() == []


# --- 2. OffsetDelete on live groups ---------------------------------------------------------------

def test_offset_delete_on_a_live_group_that_is_not_a_consumer_group_is_non_empty_group() -> None:
    h = GroupLog()
    (a,), _ = _stable(h, [([("default", b"\x00\x01whatever")], None)], protocol_type="connect")
    assert h.commit(a, 1, [("t", 0, 42)]) == {("t", 0): E.none}
    n = len(h.entries)
    assert h.offset_delete([("t", 0)]) == (E.non_empty_group, {})
    assert len(h.entries) == n and h.committed(("t", 0)) == 42
    h.leave([(a, None)])
    assert h.gc.groups["g"].state is GroupState.EMPTY
    assert h.offset_delete([("t", 0)]) == (E.none, {("t", 0): E.none})
    assert h.committed(("t", 0)) is None and h.restart().offsets == {}


def test_offset_delete_on_a_consumer_group_whose_subscription_does_not_parse_counts_it_subscribed() -> None:
    h = GroupLog()
    (a,), _ = _stable(h, [([("range", b"\xff\xff")], None)])
    h.commit(a, 1, [("t", 0, 42), ("u", 0, 7)])
    n = len(h.entries)
    assert h.offset_delete([("t", 0), ("u", 0)]) == (
        E.none, {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.group_subscribed_to_topic})
    assert len(h.entries) == n and h.committed(("t", 0)) == 42 and h.committed(("u", 0)) == 7


def test_offset_delete_on_a_consumer_group_deletes_only_topics_nobody_subscribes_to() -> None:
    h = GroupLog()
    (a,), _ = _stable(h, [(RANGE, None)])  # subscribed to "t"
    h.commit(a, 1, [("t", 0, 42), ("u", 0, 7)])
    assert h.offset_delete([("t", 0), ("u", 0)]) == (
        E.none, {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none})
    assert h.committed(("t", 0)) == 42 and h.committed(("u", 0)) is None
    assert h.restart().offset_fetch("g", [("u", 0)], False)[("u", 0)] == (None, E.none)


# --- 3. SyncGroup v5+ protocol type and name ------------------------------------------------------

def test_sync_group_with_another_protocol_type_or_name_is_inconsistent_and_changes_nothing() -> None:
    h = GroupLog()
    a = h.join().value
    assert h.gc.groups["g"].state is GroupState.COMPLETING_REBALANCE
    for protocol_type, protocol_name in (("connect", None), (None, "roundrobin"), ("consumer", "nope")):
        box = h.sync(a.member_id, 1, [(a.member_id, b"mine")], protocol_type=protocol_type,
                     protocol_name=protocol_name)
        assert box.value.error == E.inconsistent_group_protocol, (protocol_type, protocol_name)
        assert h.gc.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert h.sync(a.member_id, 2, protocol_type="connect").value.error == E.illegal_generation, "generation first"
    ok = h.sync(a.member_id, 1, [(a.member_id, b"mine")], protocol_type="consumer", protocol_name="range").value
    assert (ok.error, ok.protocol_type, ok.protocol_name, ok.assignment) == (E.none, "consumer", "range", b"mine")
    assert h.sync(a.member_id, 1, protocol_name="roundrobin").value.error == E.inconsistent_group_protocol
    assert h.sync(a.member_id, 1).value.assignment == b"mine", "no protocol given (SyncGroup < v5): not checked"


# --- 4. protocol support --------------------------------------------------------------------------

def test_a_member_sharing_no_protocol_with_all_members_is_refused() -> None:
    h = GroupLog()
    _stable(h, [([("x", META), ("y", META)], None), ([("x", META), ("z", META)], None)])
    g = h.gc.groups["g"]
    before, n = (g.state, g.generation_id, sorted(g.members)), len(h.entries)
    c = h.join(protocols=[("y", META), ("z", META)])
    assert c.value.error == E.inconsistent_group_protocol
    assert (g.state, g.generation_id, sorted(g.members)) == before and len(h.entries) == n
    assert h.join(protocols=[("z", META), ("x", META)]).value is None, "x is common: it joins the rebalance"


def test_an_empty_protocol_type_or_list_is_refused_on_a_new_or_empty_group() -> None:
    h = GroupLog()
    assert h.join(protocol_type="").value.error == E.inconsistent_group_protocol
    assert h.join(protocols=[]).value.error == E.inconsistent_group_protocol
    assert h.gc.groups == {}, "no group is made for a refused join"
    h.commit("", -1, [("t", 0, 1)])  # a simple group: Empty, no protocol type
    assert h.join(protocol_type="").value.error == E.inconsistent_group_protocol
    assert h.gc.groups["g"].state is GroupState.EMPTY and not h.gc.groups["g"].members


# --- 5. protocol selection ------------------------------------------------------------------------

def test_the_protocol_is_the_members_vote_not_the_leaders_preference() -> None:
    h = GroupLog()
    _ids, selected = _stable(h, [(RANGE_FIRST, None), (RR_FIRST, None), (RR_FIRST, None)])
    assert selected == "roundrobin"
    gc = h.restart()
    assert gc.groups["g"].protocol_name == "roundrobin" and gc.groups["g"].select_protocol() == "roundrobin"


def test_each_member_votes_for_its_first_protocol_that_all_members_support() -> None:
    h = GroupLog()
    x, y, z = ("x", META), ("y", META), ("z", META)
    _ids, selected = _stable(h, [([x, y], None), ([z, y, x], None), ([y, x], None)])
    assert selected == "y"  # x: 1 vote (z is not a candidate), y: 2


def test_a_tie_goes_to_the_protocol_kafkas_hash_map_iterates_first_whoever_leads() -> None:
    for leader, follower in ((RR_FIRST, RANGE_FIRST), (RANGE_FIRST, RR_FIRST)):
        h = GroupLog()
        _ids, selected = _stable(h, [(leader, None), (follower, None)])
        assert selected == "range"  # java.util.HashMap iterates "range" before "roundrobin"


def test_java_hash_map_order_matches_java() -> None:
    """Iteration orders printed by OpenJDK 17 for these keys put into a new HashMap in this order:
    bucket order, insertion order within a bucket ("Aa" and "BB" share a hash), resize past 12 keys."""
    def order(names: list[str]) -> list[str]:
        rank = java_hash_map_order(names)
        return sorted(names, key=rank.__getitem__)

    assert order(["roundrobin", "range"]) == ["range", "roundrobin"]
    assert order(["sticky", "range", "roundrobin", "cooperative-sticky"]) == \
        ["sticky", "range", "roundrobin", "cooperative-sticky"]
    assert order(["BB", "Aa"]) == ["BB", "Aa"] and order(["Aa", "BB"]) == ["Aa", "BB"]
    assert order(["é", "ü€", "😀"]) == ["ü€", "😀", "é"]
    assert ",".join(order([f"p{i}" for i in range(27)])) == (
        "p0,p1,p2,p3,p4,p5,p6,p7,p8,p9,p10,p12,p11,p14,p13,p16,p15,p18,p17,p19,p21,p20,p23,p22,p25,p24,p26")


def test_a_static_replacement_that_changes_the_vote_rebalances() -> None:
    """Kafka compares the group's protocol with the one ``selectProtocol`` would pick with the new
    member's protocols: here the vote moves from roundrobin to range, so the group rebalances."""
    h = GroupLog()
    (_lead, old, _m2), selected = _stable(h, [(RANGE_FIRST, None), (RR_FIRST, "i-1"), (RR_FIRST, None)])
    assert selected == "roundrobin"
    new = h.join(instance="i-1", protocols=RANGE_FIRST)
    g = h.gc.groups["g"]
    assert new.value is None and g.state is GroupState.PREPARING_REBALANCE and old not in g.members
    assert g.select_protocol() == "range"


def test_a_static_replacement_that_keeps_the_vote_keeps_the_generation() -> None:
    h = GroupLog()
    (_lead, old, _m2), _ = _stable(h, [(RANGE_FIRST, None), (RR_FIRST, "i-1"), (RR_FIRST, None)])
    new = h.join(instance="i-1", protocols=RR_FIRST).value
    assert (new.error, new.generation_id, new.protocol_name) == (E.none, 2, "roundrobin")
    assert h.gc.groups["g"].state is GroupState.STABLE
    assert old not in h.restart().groups["g"].members


# --- 6. ListGroups states filter ------------------------------------------------------------------

def test_list_groups_states_filter_is_case_insensitive() -> None:
    h = GroupLog()
    _stable(h, [(RANGE, None)])
    h.commit("", -1, [("t", 0, 1)], group="solo")
    for states in (["stable"], ["STABLE"], ["Stable"], ["sTaBlE", "nothing"]):
        assert h.gc.list_groups(states) == [("g", "consumer", "Stable")], states
    assert h.gc.list_groups(["empty"]) == [("solo", "", "Empty")]
    assert sorted(h.gc.list_groups(["EMPTY", "stable"])) == [("g", "consumer", "Stable"), ("solo", "", "Empty")]
    assert h.gc.list_groups(["preparingrebalance", "completingrebalance", "dead"]) == []
