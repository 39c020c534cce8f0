"""Request validation details that follow Apache Kafka's classic group coordinator.

- Heartbeat checks the member, then the generation, then the state: a heartbeat with a stale
  generation answers ILLEGAL_GENERATION and does not count as liveness, also while the group is
  PreparingRebalance (a zombie thread must not keep a member alive that never rejoins).
- OffsetCommit / TxnOffsetCommit (Kafka's validateOffsetCommit): generation < 0 on an Empty or
  missing group is accepted whatever the member id (admin tools, consumers outside group
  management, a transactional producer sending the metadata of a consumer that has left); a
  generation >= 0 or a member id on a group with members is checked against the membership; a
  transactional commit skips the CompletingRebalance check.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import GroupLog


def _two_members_generation_2(h: GroupLog) -> tuple[str, str]:
    a = h.join().value
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    b = h.join()
    a2 = h.join(a.member_id).value
    assert a2.generation_id == 2 and b.value.generation_id == 2
    h.sync(a.member_id, 2, [(a.member_id, b""), (b.value.member_id, b"")])
    h.sync(b.value.member_id, 2)
    assert h.gc.groups["g"].state is GroupState.STABLE
    return str(a.member_id), str(b.value.member_id)


def test_stale_heartbeat_during_preparing_rebalance_is_refused_and_does_not_keep_the_member_alive() -> None:
    h = GroupLog()
    a, b = _two_members_generation_2(h)
    c = h.join()  # generation 2 is being rebalanced
    b_box = h.join(b)  # b rejoins at once and parks; a never rejoins
    assert h.gc.groups["g"].state is GroupState.PREPARING_REBALANCE and c.value is None
    assert h.heartbeat(a, 2) == ErrorCode.rebalance_in_progress  # current generation: told to rejoin
    for _ in range(10):  # from now on only a stale thread of a heartbeats, every second
        h.clock.advance(1_000)
        assert h.heartbeat(a, 1) == ErrorCode.illegal_generation
        h.tick()
    # a's session (10 s) ended, at its deadline: the rebalance completed without it, long before
    # its 20 s timeout
    g = h.gc.groups["g"]
    assert a not in g.members and set(g.members) == {b, c.value.member_id}
    assert c.value.generation_id == 3 and b_box.value.generation_id == 3


def test_stale_heartbeat_in_stable_is_illegal_generation() -> None:
    h = GroupLog()
    a, _b = _two_members_generation_2(h)
    assert h.heartbeat(a, 1) == ErrorCode.illegal_generation
    assert h.heartbeat(a, 2) == ErrorCode.none


def test_heartbeat_checks_member_before_generation() -> None:
    h = GroupLog()
    _two_members_generation_2(h)
    assert h.heartbeat("nobody", 1) == ErrorCode.unknown_member_id
    assert h.heartbeat("nobody", 1, group="missing") == ErrorCode.unknown_member_id


def test_txn_offset_commit_with_generation_minus_one_and_a_member_id_on_an_empty_group_is_accepted() -> None:
    h = GroupLog()
    # a group that does not exist yet
    assert h.txn_commit(7, "left-member", -1, [("t", 0, 3)]) == {("t", 0): ErrorCode.none}
    h.marker(7, commit=True)
    assert h.committed(("t", 0)) == 3
    # an Empty group (its member left)
    a = h.join(group="e").value
    h.sync(a.member_id, 1, [(a.member_id, b"")], group="e")
    h.leave([(a.member_id, None)], group="e")
    assert h.gc.groups["e"].state is GroupState.EMPTY
    assert h.txn_commit(8, a.member_id, -1, [("t", 0, 4)], group="e") == {("t", 0): ErrorCode.none}
    h.marker(8, commit=True)
    assert h.committed(("t", 0), "e") == 4


def test_txn_offset_commit_member_checks_on_a_group_with_members() -> None:
    h = GroupLog()
    a, _b = _two_members_generation_2(h)
    assert h.txn_commit(7, a, -1, [("t", 0, 3)]) == {("t", 0): ErrorCode.illegal_generation}
    assert h.txn_commit(7, "nobody", 2, [("t", 0, 3)]) == {("t", 0): ErrorCode.unknown_member_id}
    assert h.txn_commit(7, a, 1, [("t", 0, 3)]) == {("t", 0): ErrorCode.illegal_generation}
    assert h.txn_commit(7, "", -1, [("t", 0, 3)]) == {("t", 0): ErrorCode.none}  # KIP-98 producers: no member
    assert h.txn_commit(7, a, 2, [("t", 0, 3)]) == {("t", 0): ErrorCode.none}
    assert h.commit("", -1, [("t", 0, 3)]) == {("t", 0): ErrorCode.unknown_member_id}


def test_txn_offset_commit_is_accepted_during_completing_rebalance_but_offset_commit_is_not() -> None:
    h = GroupLog()
    a = h.join().value
    assert h.gc.groups["g"].state is GroupState.COMPLETING_REBALANCE
    assert h.commit(a.member_id, 1, [("t", 0, 1)]) == {("t", 0): ErrorCode.rebalance_in_progress}
    assert h.txn_commit(7, a.member_id, 1, [("t", 0, 1)]) == {("t", 0): ErrorCode.none}


def test_offset_commit_on_a_missing_group() -> None:
    h = GroupLog()
    assert h.commit("someone", 3, [("t", 0, 1)], group="missing") == {("t", 0): ErrorCode.illegal_generation}
    assert "missing" not in h.gc.groups
    # generation -1 creates a simple group, even with a member id (Kafka accepts it on an Empty group)
    assert h.commit("someone", -1, [("t", 0, 1)], group="missing") == {("t", 0): ErrorCode.none}
    assert h.gc.groups["missing"].state is GroupState.EMPTY and h.committed(("t", 0), "missing") == 1
