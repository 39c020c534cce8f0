"""The sans-IO group coordinator with a manual clock: joins, syncs, heartbeats, expiry, offsets."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.group.group_coordinator import GroupCoordinator, JoinResult, SyncResult
from oncelog.coordinator.group.group_state import VALID_PREVIOUS, GroupMetadata, GroupState, IllegalGroupTransition

PROTO = [("range", b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff")]


class Box:
    def __init__(self) -> None:
        self.value: Any = None

    def __call__(self, v: Any) -> None:
        self.value = v


def make(delay: int = 0) -> tuple[GroupCoordinator, ManualClock]:
    clock = ManualClock()
    return GroupCoordinator(clock, group_initial_rebalance_delay_ms=delay), clock


def join(gc: GroupCoordinator, member: str = "", instance: str | None = None, protocols=PROTO,  # type: ignore[no-untyped-def]
         require_known: bool = False, session: int = 10_000) -> Box:
    box = Box()
    gc.join_group("g", member, instance, "client", "/h", session, 20_000, "consumer", protocols, require_known, box)
    return box


def sync(gc: GroupCoordinator, member: str, generation: int, assignments=()) -> Box:  # type: ignore[no-untyped-def]
    box = Box()
    gc.sync_group("g", generation, member, None, list(assignments), box)
    return box


def test_two_members_join_one_generation_and_sync_assignments() -> None:
    gc, _clock = make()
    a = join(gc)
    assert a.value.error == ErrorCode.none and a.value.generation_id == 1  # alone: completes at once
    a_id = a.value.member_id
    sync(gc, a_id, 1, [(a_id, b"all")])
    b = join(gc)  # a second member triggers a rebalance; a must rejoin
    assert b.value is None
    assert gc.heartbeat("g", 1, a_id, None) == ErrorCode.rebalance_in_progress
    a2 = join(gc, a_id)
    assert a2.value.generation_id == b.value.generation_id == 2
    leader = a2.value if a2.value.leader == a2.value.member_id else b.value
    assert len(leader.members) == 2 and a2.value.protocol_name == "range"
    follower_id = b.value.member_id
    fs = sync(gc, follower_id, 2)
    assert fs.value is None  # waits for the leader's assignment
    ls = sync(gc, a_id, 2, [(a_id, b"p0"), (follower_id, b"p1")])
    assert isinstance(fs.value, SyncResult) and fs.value.assignment == b"p1" and ls.value.assignment == b"p0"
    assert gc.groups["g"].state is GroupState.STABLE
    assert gc.heartbeat("g", 1, a_id, None) == ErrorCode.illegal_generation
    assert gc.heartbeat("g", 2, "nobody", None) == ErrorCode.unknown_member_id
    assert sync(gc, a_id, 1).value.error == ErrorCode.illegal_generation
    records = gc.take_records()
    assert records and all(k.startswith(b"\x00\x02") for k, _ in records)


def test_member_id_required_then_join() -> None:
    gc, _ = make()
    first = join(gc, require_known=True)
    assert first.value.error == ErrorCode.member_id_required and first.value.member_id
    again = join(gc, first.value.member_id, require_known=True)
    assert again.value.error == ErrorCode.none
    assert join(gc, "made-up").value.error == ErrorCode.unknown_member_id


def test_session_expiry_rebalances_and_empty_group_is_recorded() -> None:
    gc, clock = make()
    a = join(gc).value
    sync(gc, a.member_id, 1, [(a.member_id, b"x")])
    clock.advance(10_001)
    gc.tick()
    g = gc.groups["g"]
    assert g.state is GroupState.EMPTY and not g.members and g.generation_id == 2


def test_leave_group_and_dead_member_during_rebalance() -> None:
    gc, clock = make()
    a = join(gc).value
    sync(gc, a.member_id, 1, [(a.member_id, b"x")])
    b = join(gc)  # rebalance starts; a never rejoins (dead)
    clock.advance(10_001)
    gc.tick()
    assert b.value is not None and b.value.generation_id == 2 and len(b.value.members) == 1
    top, _results = gc.leave_group("g", [(b.value.member_id, None)])
    assert top == ErrorCode.none and gc.groups["g"].state is GroupState.EMPTY
    assert gc.leave_group("g", [("ghost", None)])[0] == ErrorCode.unknown_member_id


def test_static_member_rejoins_without_rebalance_and_old_id_is_fenced() -> None:
    gc, _ = make()
    a = join(gc, instance="i-1").value
    sync(gc, a.member_id, 1, [(a.member_id, b"mine")])
    again = join(gc, instance="i-1").value
    assert again.error == ErrorCode.none and again.member_id != a.member_id and again.generation_id == 1
    assert gc.groups["g"].state is GroupState.STABLE
    assert sync(gc, again.member_id, 1).value.assignment == b"mine"
    assert gc.heartbeat("g", 1, a.member_id, "i-1") == ErrorCode.fenced_instance_id  # KIP-345
    assert gc.heartbeat("g", 1, again.member_id, "i-1") == ErrorCode.none
    box = Box()
    gc.sync_group("g", 1, a.member_id, "i-1", [], box)
    assert box.value.error == ErrorCode.fenced_instance_id


def test_invalid_requests() -> None:
    gc, _ = make()
    box = Box()
    gc.join_group("", "", None, "c", "h", 10_000, 10_000, "consumer", PROTO, False, box)
    assert box.value.error == ErrorCode.invalid_group_id
    assert join(gc, session=10).value.error == ErrorCode.invalid_session_timeout
    join(gc)
    assert join(gc, protocols=[("other", b"")]).value.error == ErrorCode.inconsistent_group_protocol


def test_offset_commit_validation_and_replay() -> None:
    gc, _clock = make()
    simple = gc.offset_commit("solo", -1, "", None, [("t", 0, 5, -1, "m")])
    assert simple.errors == {("t", 0): ErrorCode.none}
    assert gc.offset_fetch("solo", [("t", 0)], False)[("t", 0)][0] is None  # not visible before replay
    for k, v in simple.records:
        gc.replay(k, v)
    assert gc.offset_fetch("solo", [("t", 0)], False)[("t", 0)][0].offset == 5  # type: ignore[union-attr]
    a = join(gc).value
    assert gc.offset_commit("g", 99, a.member_id, None, [("t", 0, 1, -1, None)]).errors[("t", 0)] == \
        ErrorCode.illegal_generation
    assert gc.offset_commit("g", 1, "nobody", None, [("t", 0, 1, -1, None)]).errors[("t", 0)] == \
        ErrorCode.unknown_member_id
    assert gc.offset_commit("g", -1, "", None, [("t", 0, 1, -1, None)]).errors[("t", 0)] == \
        ErrorCode.unknown_member_id  # a group with members refuses "simple" commits
    assert gc.offset_commit("g", 1, a.member_id, None, [("t", 0, 1, -1, None)]).errors[("t", 0)] == \
        ErrorCode.rebalance_in_progress  # CompletingRebalance until the leader syncs
    sync(gc, a.member_id, 1, [(a.member_id, b"")])
    ok = gc.offset_commit("g", 1, a.member_id, None, [("t", 0, 1, -1, "x" * 5000), ("t", 1, 3, -1, None)])
    assert ok.errors == {("t", 0): ErrorCode.offset_metadata_too_large, ("t", 1): ErrorCode.none}


def test_transactional_offsets_pending_until_marker() -> None:
    gc, _ = make()
    r = gc.txn_offset_commit("g", 7, -1, "", None, [("t", 0, 10, -1, None)])
    for k, v in r.records:
        gc.replay(k, v, producer_id=7, transactional=True)
    assert gc.offset_fetch("g", [("t", 0)], True)[("t", 0)] == (None, ErrorCode.unstable_offset_commit)
    assert gc.offset_fetch("g", [("t", 0)], False)[("t", 0)] == (None, ErrorCode.none)
    gc.replay_control(7, commit=True)
    assert gc.offset_fetch("g", [("t", 0)], True)[("t", 0)][0].offset == 10  # type: ignore[union-attr]
    r = gc.txn_offset_commit("g", 8, -1, "", None, [("t", 0, 20, -1, None)])
    for k, v in r.records:
        gc.replay(k, v, producer_id=8, transactional=True)
    gc.replay_control(8, commit=False)
    assert gc.offset_fetch("g", [("t", 0)], True)[("t", 0)][0].offset == 10  # type: ignore[union-attr]
    # KIP-447: a stale generation is fenced
    a = join(gc).value
    assert gc.txn_offset_commit("g", 9, a.generation_id + 5, a.member_id, None,
                                [("t", 0, 1, -1, None)]).errors[("t", 0)] == ErrorCode.illegal_generation


def test_replay_restores_offsets_and_groups_after_restart() -> None:
    gc, clock = make()
    log: list[tuple[bytes, bytes | None, int, bool]] = []
    a = join(gc).value
    sync(gc, a.member_id, 1, [(a.member_id, b"assign")])
    for k, v in gc.take_records():
        log.append((k, v, -1, False))
    for k, v in gc.offset_commit("g", 1, a.member_id, None, [("t", 0, 3, -1, None)]).records:
        log.append((k, v, -1, False))
    for k, v in gc.txn_offset_commit("g", 5, -1, "", None, [("t", 1, 9, -1, None)]).records:
        log.append((k, v, 5, True))
    fresh = GroupCoordinator(clock)
    fresh.loading = True
    for k, v, pid, txn in log:
        fresh.replay(k, v, pid, txn)
    fresh.loaded()
    g = fresh.groups["g"]
    assert g.state is GroupState.STABLE and g.generation_id == 1 and g.members[a.member_id].assignment == b"assign"
    assert fresh.offset_fetch("g", [("t", 0)], False)[("t", 0)][0].offset == 3  # type: ignore[union-attr]
    assert fresh.offset_fetch("g", [("t", 1)], True)[("t", 1)][1] == ErrorCode.unstable_offset_commit
    assert fresh.heartbeat("g", 1, a.member_id, None) == ErrorCode.none


def test_delete_groups_offset_delete_and_retention() -> None:
    gc, clock = make()
    for k, v in gc.offset_commit("solo", -1, "", None, [("t", 0, 1, -1, None)]).records:
        gc.replay(k, v)
    a = join(gc).value
    errors, records = gc.delete_groups(["g", "solo", "missing"])
    assert errors == {"g": ErrorCode.non_empty_group, "solo": ErrorCode.none, "missing": ErrorCode.group_id_not_found}
    assert "solo" in gc.groups  # records, then replay: nothing changes before the records are replayed
    for k, v in records:
        gc.replay(k, v)
    assert "solo" not in gc.groups and "g" in gc.groups
    sync(gc, a.member_id, 1, [(a.member_id, b"")])
    _top, per, _ = gc.offset_delete("g", [("t", 0), ("other", 0)])
    assert per == {("t", 0): ErrorCode.group_subscribed_to_topic, ("other", 0): ErrorCode.none}
    assert gc.offset_delete("nope", [])[0] == ErrorCode.group_id_not_found
    for k, v in gc.offset_commit("old", -1, "", None, [("t", 0, 1, -1, None)]).records:
        gc.replay(k, v)
    clock.advance(gc.offsets_retention_ms + 1)
    assert [k for k, v in gc.expire_offsets() if v is None]
    assert [g for g, _, st in gc.list_groups(["Stable"])] == ["g"]


def test_group_transitions_are_checked() -> None:
    for target, allowed in VALID_PREVIOUS.items():
        for source in GroupState:
            g = GroupMetadata("x", state=source)
            if source in allowed:
                g.transition_to(target, 0)
            else:
                with pytest.raises(IllegalGroupTransition):
                    g.transition_to(target, 0)


def test_join_result_types() -> None:
    gc, _ = make()
    assert isinstance(join(gc).value, JoinResult)


def test_an_assignment_too_large_to_store_is_refused_and_the_group_rebalances() -> None:
    """Kafka stores a group with its assignment in one record of __consumer_offsets, bounded by
    message.max.bytes: past it the leader's SyncGroup fails, every member waiting in SyncGroup gets
    UNKNOWN_SERVER_ERROR, and the group rebalances. Before, a client's 3 MB assignment (and 3 MB of
    protocol metadata) was kept and written as a 6 MB record per group (scratch big_group.py)."""
    gc = GroupCoordinator(ManualClock(), group_initial_rebalance_delay_ms=0, group_max_record_bytes=4000)
    a = join(gc)
    a_id = a.value.member_id
    assert sync(gc, a_id, 1, [(a_id, b"x" * 100)]).value.assignment == b"x" * 100
    gc.take_records()
    b = join(gc)
    a2 = join(gc, a_id)
    b_id, gen = b.value.member_id, b.value.generation_id
    assert a2.value.leader == a_id and gen == 2
    follower = sync(gc, b_id, gen)
    assert follower.value is None
    leader = sync(gc, a_id, gen, [(a_id, b"p" * 2000), (b_id, b"q" * 2000)])
    assert leader.value.error == follower.value.error == ErrorCode.unknown_server_error
    g = gc.groups["g"]
    assert g.state is GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in g.members.values())
    assert not any(b"cHBw" in (v or b"") for _k, v in gc.take_records()), "the refused assignment was stored"
    b3, a3 = join(gc, b_id), join(gc, a_id)  # they rejoin; a smaller assignment is stored
    gen3 = a3.value.generation_id
    assert gen3 == b3.value.generation_id == 3
    f3 = sync(gc, b_id, gen3)
    l3 = sync(gc, a_id, gen3, [(a_id, b"p" * 1000), (b_id, b"q" * 1000)])
    assert (l3.value.error, f3.value.error) == (ErrorCode.none, ErrorCode.none)
    assert f3.value.assignment == b"q" * 1000 and g.state is GroupState.STABLE


def test_a_group_record_the_store_refuses_is_not_kept_and_the_group_rebalances() -> None:
    """``store_refused`` (the server's: the record would eat into log_dir_min_free_bytes) is asked
    with the exact size of the Stable record the leader's SyncGroup would write; when it refuses,
    every member waiting in SyncGroup gets NOT_COORDINATOR (Kafka's answer to a storage error),
    no record is produced and the group rebalances; once it accepts, the same sync goes through."""
    asked: list[tuple[str, int]] = []
    full = [True]

    def refused(group_id: str, size: int) -> bool:
        asked.append((group_id, size))
        return full[0]

    gc = GroupCoordinator(ManualClock(), group_initial_rebalance_delay_ms=0, store_refused=refused)
    a = join(gc)
    b = join(gc)
    a2 = join(gc, a.value.member_id)
    a_id, b_id, gen = a.value.member_id, b.value.member_id, b.value.generation_id
    assert a2.value.leader == a_id
    gc.take_records()
    follower = sync(gc, b_id, gen)
    leader = sync(gc, a_id, gen, [(a_id, b"p" * 700), (b_id, b"q" * 700)])
    assert leader.value.error == follower.value.error == ErrorCode.not_coordinator
    assert gc.groups["g"].state is GroupState.PREPARING_REBALANCE and gc.take_records() == []
    assert asked and asked[-1][0] == "g" and asked[-1][1] > 2 * 700 * 4 // 3  # both assignments, base64

    full[0] = False
    b3, a3 = join(gc, b_id), join(gc, a_id)
    gen3 = a3.value.generation_id
    f3 = sync(gc, b_id, gen3)
    l3 = sync(gc, a_id, gen3, [(a_id, b"p" * 700), (b_id, b"q" * 700)])
    assert (l3.value.error, f3.value.error, b3.value.error) == (ErrorCode.none,) * 3
    records = gc.take_records()
    assert len(records) == 1 and len(records[0][0]) + len(records[0][1] or b"") <= asked[-1][1] + 64


def test_past_group_max_count_new_groups_are_refused_and_known_ones_keep_everything() -> None:
    """A client committing to group after group (or joining them) cannot grow the coordinator for
    the week offsets are kept: past ``group_max_count`` a JoinGroup or an offset commit for a new
    group gets COORDINATOR_NOT_AVAILABLE (retriable) and writes nothing; known groups keep joining
    and committing; a deletion makes room again. Loading never refuses."""
    clock = ManualClock()
    gc = GroupCoordinator(clock, group_initial_rebalance_delay_ms=0, group_max_count=2)
    log: list[tuple[bytes, bytes | None]] = []

    def apply(records: list[tuple[bytes, bytes | None]]) -> None:
        log.extend(records)
        for k, v in records:
            gc.replay(k, v)

    for gid in ("a", "b"):
        result = gc.offset_commit(gid, -1, "", None, [("t", 0, 5, -1, "")])
        assert result.errors == {("t", 0): ErrorCode.none}
        apply(result.records)
    refused = gc.offset_commit("c", -1, "", None, [("t", 0, 5, -1, ""), ("t", 1, 6, -1, "")])
    assert refused.errors == {("t", 0): ErrorCode.coordinator_not_available,
                              ("t", 1): ErrorCode.coordinator_not_available} and refused.records == []
    assert gc.txn_offset_commit("c", 7, -1, "", None, [("t", 0, 5, -1, "")]).errors == \
        {("t", 0): ErrorCode.coordinator_not_available}
    box = Box()
    gc.join_group("c", "", None, "client", "/h", 10_000, 20_000, "consumer", PROTO, False, box)
    assert box.value.error == ErrorCode.coordinator_not_available and "c" not in gc.groups
    assert gc.membership.groups_refused == 3
    again = gc.offset_commit("a", -1, "", None, [("t", 0, 9, -1, ""), ("t", 3, 1, -1, "")])  # a known group
    assert set(again.errors.values()) == {ErrorCode.none}
    apply(again.records)
    box = Box()
    gc.join_group("b", "", None, "client", "/h", 10_000, 20_000, "consumer", PROTO, False, box)
    assert box.value.error == ErrorCode.none
    apply(gc.take_records())
    errors, records = gc.delete_groups(["a"])
    assert errors == {"a": ErrorCode.none}
    apply(records)
    assert "a" not in gc.groups
    result = gc.offset_commit("c", -1, "", None, [("t", 0, 5, -1, "")])
    assert result.errors == {("t", 0): ErrorCode.none}
    apply(result.records)
    fresh = GroupCoordinator(clock, group_max_count=1)  # a smaller bound: loading keeps what the log holds
    fresh.loading = True
    for k, v in log:
        fresh.replay(k, v)
    fresh.loaded()
    assert sorted(fresh.groups) == ["b", "c"]
