"""Records, then replay: a request handler returns records and changes no durable state; replaying
the records is what creates simple groups, commits offsets and deletes groups, at runtime and while
loading alike (so a restart runs the very code normal operation runs)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tests.coordinator.group_harness import GroupLog


def test_offset_commit_creates_the_simple_group_only_by_replay() -> None:
    h = GroupLog()
    result = h.gc.offset_commit("solo", -1, "", None, [("t", 0, 1, -1, None)])
    assert result.errors == {("t", 0): ErrorCode.none} and result.records
    assert "solo" not in h.gc.groups, "the records are not appended yet: nothing may change"
    h.apply(result.records)
    assert "solo" in h.gc.groups


def test_delete_groups_changes_nothing_before_replay() -> None:
    h = GroupLog()
    h.commit("", -1, [("t", 0, 1)], group="solo")
    errors, records = h.gc.delete_groups(["solo"])
    assert errors == {"solo": ErrorCode.none}
    assert "solo" in h.gc.groups and h.committed(("t", 0), "solo") == 1
    h.apply(records)
    assert "solo" not in h.gc.groups and h.committed(("t", 0), "solo") is None
    assert "solo" not in h.restart().groups
