"""``__consumer_offsets`` records (JSON values, versioned keys; readable with kcat).

Keys: ``\\x00\\x01`` + JSON [group, topic, partition] for an offset commit; ``\\x00\\x02`` + group id for
the group's metadata. A None value is a tombstone.

An offset value says how it orders against a pending transactional offset (``OffsetAndMetadata``'s
``record_offset``). Values written now are ``"v": 2``: without ``record_offset`` (a request's
commit) the value is ordered by its record's own offset; a checkpoint's value holds
``record_offset``, the offset of the record that committed it, or ``ORDER_UNKNOWN`` for a value it
rewrites whose order was unknown. Values of versions before 2ad1559 are ``"v": 1`` and have no
``record_offset`` (nor do regular commits of 2ad1559 up to the ``"v": 2`` format): such a value may
be an old checkpoint's rewrite of an older commit, appended after a pending offset, so its order is
``ORDER_UNKNOWN``, as the versions that wrote it had no order (their COMMIT marker applied its
offsets unconditionally). Older versions read every field they knew and ignore the others.

A group-metadata value is the group as a restart should load it: generation, protocol, leader,
members with their static instance ids and assignments, and ``state_ts``, the time the group entered
its state (an Empty group's offsets expire counting from it). Values written before ``state_ts``
existed load with -1 ("unknown"); readers ignore fields they do not know.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from oncelog.coordinator.group.group_state import GroupMetadata, GroupState, MemberMetadata

OFFSET_KEY = b"\x00\x01"
GROUP_KEY = b"\x00\x02"

#: ``OffsetAndMetadata.record_offset`` of a value not replayed yet (a request's): its replay gives it
#: the offset of its record.
NOT_REPLAYED = -1
#: ``OffsetAndMetadata.record_offset`` of a committed offset whose order against pending offsets is
#: unknown (a value written before 2ad1559): it counts as older than every record, so a COMMIT marker
#: meeting it applies its pending offset, as the version that wrote it did. Checkpoints keep it.
ORDER_UNKNOWN = -2
#: The ``"v"`` of the offset values written now (``decode``); 1 before.
OFFSET_VALUE_VERSION = 2


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed (or pending transactional) offset.

    ``record_offset`` is Kafka's recordOffset: the offset, in ``__consumer_offsets``, of the record
    that committed it (``NOT_REPLAYED``: not replayed yet, as a request's records are;
    ``ORDER_UNKNOWN``: a value of a version before 2ad1559 that may be a rewrite, older than every
    record). It orders a transactional commit against regular ones when its transaction commits
    (``OffsetMetadataManager.replay_control``), so a checkpoint that rewrites a live offset at a new,
    higher offset carries it along in the value (``record_offset``); a value written now without
    that field was committed by its own record.
    """

    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int
    record_offset: int = NOT_REPLAYED


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return OFFSET_KEY + json.dumps([group_id, topic, partition], separators=(",", ":")).encode()


def offset_value(o: OffsetAndMetadata) -> bytes:
    """The record value of ``o``; with ``record_offset`` whenever ``o`` has been replayed (a checkpoint
    writes only such values, so each of its values carries its order, ``ORDER_UNKNOWN`` included)."""
    value: dict[str, Any] = {"v": OFFSET_VALUE_VERSION, "offset": o.offset, "leader_epoch": o.leader_epoch,
                             "metadata": o.metadata, "ts": o.commit_timestamp_ms}
    if o.record_offset != NOT_REPLAYED:
        value["record_offset"] = o.record_offset
    return json.dumps(value, separators=(",", ":")).encode()


def group_key(group_id: str) -> bytes:
    return GROUP_KEY + group_id.encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def decode(key: bytes, value: bytes | None) -> tuple[str, Any, Any]:
    """("offset", (group, topic, partition), OffsetAndMetadata | None) or ("group", group_id, dict | None)."""
    kind, body = key[:2], key[2:]
    if kind == OFFSET_KEY:
        group, topic, partition = json.loads(body)
        if value is None:
            return "offset", (group, topic, partition), None
        d = json.loads(value)
        if "record_offset" in d:
            record_offset = d["record_offset"]
        else:  # v1: a version before 2ad1559 (or a regular commit of one since), maybe a checkpoint's rewrite
            record_offset = NOT_REPLAYED if d.get("v", 1) >= OFFSET_VALUE_VERSION else ORDER_UNKNOWN
        return "offset", (group, topic, partition), OffsetAndMetadata(d["offset"], d["leader_epoch"], d["metadata"],
                                                                       d["ts"], record_offset)
    if kind == GROUP_KEY:
        return "group", body.decode(), None if value is None else json.loads(value)
    raise ValueError(f"unknown __consumer_offsets key type {kind!r}")


def group_value(g: GroupMetadata, assignments: dict[str, bytes] | None = None) -> bytes:
    """The group-metadata record value of ``g`` (its durable image; in-flight rebalances are not in it);
    with ``assignments`` (member id to assignment), the value ``g`` would have with them instead of
    its members' own."""
    value = {"v": 1, "protocol_type": g.protocol_type, "generation": g.generation_id,
             "protocol": g.protocol_name, "leader": g.leader_id, "state_ts": g.state_timestamp_ms,
             "members": [{"member_id": m.member_id, "instance_id": m.group_instance_id, "client_id": m.client_id,
                          "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                          "rebalance_timeout_ms": m.rebalance_timeout_ms, "protocol_type": m.protocol_type,
                          "protocols": [[n, b64(d)] for n, d in m.protocols],
                          "assignment": b64(m.assignment if assignments is None
                                            else assignments.get(m.member_id, b""))}
                         for m in g.members.values()]}
    return json.dumps(value, separators=(",", ":")).encode()


def group_from_value(group_id: str, payload: dict[str, Any]) -> GroupMetadata:
    """The group a group-metadata value describes: Stable with its members, or Empty without."""
    g = GroupMetadata(group_id, generation_id=payload["generation"], protocol_type=payload["protocol_type"],
                      protocol_name=payload["protocol"], leader_id=payload["leader"],
                      state_timestamp_ms=payload.get("state_ts", -1))
    for md in payload["members"]:
        m = MemberMetadata(md["member_id"], md["instance_id"], md["client_id"], md["client_host"],
                           md["session_timeout_ms"], md["rebalance_timeout_ms"], md["protocol_type"],
                           [(n, unb64(d)) for n, d in md["protocols"]], unb64(md["assignment"]))
        g.members[m.member_id] = m
        if m.group_instance_id:
            g.static_members[m.group_instance_id] = m.member_id
    g.state = GroupState.STABLE if g.members else GroupState.EMPTY
    return g


def with_member_replaced(value: bytes, old_member_id: str, new_member_id: str) -> bytes | None:
    """The group-metadata value ``value`` with a static member's id replaced (assignment, instance
    id and leadership kept), or None if ``old_member_id`` is not in it."""
    payload = json.loads(value)
    found = False
    for md in payload["members"]:
        if md["member_id"] == old_member_id:
            md["member_id"] = new_member_id
            found = True
    if not found:
        return None
    if payload["leader"] == old_member_id:
        payload["leader"] = new_member_id
    return json.dumps(payload, separators=(",", ":")).encode()
