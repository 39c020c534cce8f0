"""Group states, their allowed transitions (as data), members and groups.

Invariants: ``generation_id`` only grows; ``leader_id`` is a member while members exist; a member is
in ``members`` or in ``pending_members`` (waiting to rejoin with the id it was given), never both;
``static_members`` maps every ``group.instance.id`` of a member to that member's id, and nothing else
(one live member per instance id: a newer one replaces, and so fences, the older).

Pending sync (Kafka's ``pendingSyncMembers``): ``pending_sync_members`` is non-empty only in
``PENDING_SYNC_STATES``, for the generation whose join phase filled it; it holds the ids of that
generation's members that have not sent SyncGroup of it, each still a member except the old id of a
static member replaced in Stable (as in Kafka, the replacement does not count as its sync);
``pending_sync_deadline_ms`` counts only while it is non-empty.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kio.schema.errors import ErrorCode


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


G = GroupState

VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    G.EMPTY: frozenset({G.PREPARING_REBALANCE, G.EMPTY}),
    G.PREPARING_REBALANCE: frozenset({G.EMPTY, G.STABLE, G.COMPLETING_REBALANCE, G.PREPARING_REBALANCE}),
    G.COMPLETING_REBALANCE: frozenset({G.PREPARING_REBALANCE}),
    G.STABLE: frozenset({G.COMPLETING_REBALANCE}),
    G.DEAD: frozenset({G.EMPTY, G.STABLE, G.PREPARING_REBALANCE, G.COMPLETING_REBALANCE, G.DEAD}),
}


#: The states in which members owe the coordinator a SyncGroup of the current generation: a join phase
#: completing (into CompletingRebalance) fills ``pending_sync_members``, every rebalance starting
#: (into PreparingRebalance) and every join phase completing empties it (Kafka's
#: ``removeSyncExpiration``, ``initNextGeneration``); ``expirePendingSync`` acts only in these states.
PENDING_SYNC_STATES: frozenset[GroupState] = frozenset({G.COMPLETING_REBALANCE, G.STABLE})


class IllegalGroupTransition(Exception):
    pass


@dataclass
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat_ms: int = 0  # monotonic clock (see group_metadata_manager), never logged
    awaiting_join: Callable[[Any], None] | None = None
    awaiting_sync: Callable[[Any], None] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> expiry (monotonic clock)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    rebalance_deadline_ms: int = 0  # monotonic clock, as is initial_delay_until_ms (0: no delay)
    initial_delay_until_ms: int = 0
    # Members of this generation that have not sent its SyncGroup, and when they are removed for it
    # (monotonic clock; see the module's invariants).
    pending_sync_members: set[str] = field(default_factory=set)
    pending_sync_deadline_ms: int = 0
    # When it entered its state, wall clock (logged; offset retention counts from it); -1: unknown
    # (loaded from an older record).
    state_timestamp_ms: int = 0

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalGroupTransition(f"group {self.group_id}: {self.state.value} -> {state.value}")
        self.state = state
        self.state_timestamp_ms = now_ms

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's validateMember: a known instance id must map to ``member_id`` (else the sender is
        a replaced, fenced instance), an unknown one is an unknown member; then the member must exist."""
        if group_instance_id:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def select_protocol(self) -> str | None:
        """Kafka's selectProtocol: the candidates are the protocols every member supports; each member
        votes for the first candidate in its own preference order; the most votes wins. A tie goes,
        as in Kafka, to the protocol its ``HashMap`` of votes iterates first (``java_hash_map_order``).
        None only for a group without members (every accepted join keeps a common protocol)."""
        if not self.members:
            return None
        candidates = set.intersection(*({name for name, _ in m.protocols} for m in self.members.values()))
        votes: dict[str, int] = {}
        for m in self.members.values():
            vote = next((name for name, _ in m.protocols if name in candidates), None)
            if vote is not None:
                votes[vote] = votes.get(vote, 0) + 1
        order = java_hash_map_order(list(votes))
        return min(votes, key=lambda name: (-votes[name], order[name]), default=None)

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's supportsProtocols: an Empty group takes any non-empty protocol type with at least
        one protocol; otherwise the type must be the group's and one of ``protocols`` must be
        supported by every member (a rejoining member counts with the protocols it has now)."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        supported = [{n for n, _ in m.protocols} for m in self.members.values()]
        return any(all(name in names for names in supported) for name, _ in protocols)

    def uses_consumer_group_protocol(self) -> bool:
        """Kafka's usesConsumerGroupProtocol: the group's protocol type is "consumer"."""
        return self.protocol_type == "consumer"

    def validate_offset_delete(self) -> ErrorCode:
        """Kafka's validateOffsetDelete: a group with members that is not a "consumer" group keeps its
        offsets (NON_EMPTY_GROUP); a consumer group's are checked per topic (``is_subscribed_to``)."""
        if self.state is not GroupState.EMPTY and not self.uses_consumer_group_protocol():
            return ErrorCode.non_empty_group
        return ErrorCode.none

    def subscribed_topics_known(self) -> set[str] | None:
        """Kafka's computeSubscribedTopics: the topics the members subscribe to, or None when the
        group does not know them (not a "consumer" group, no protocol chosen yet, or a member's
        subscription does not parse)."""
        if not self.uses_consumer_group_protocol():
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_subscription_topics(m.metadata_for(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    def is_subscribed_to(self, topic: str) -> bool:
        """Kafka's isSubscribedToTopic: unknown subscriptions count as subscribed for consumer groups."""
        known = self.subscribed_topics_known()
        return topic in known if known is not None else self.uses_consumer_group_protocol()

    def offset_expiration_base(self) -> Callable[[int], int] | None:
        """Kafka's offsetExpirationCondition: given an offset's commit time, the time its retention
        counts from; None when the group's offsets do not expire now.

        A simple group (no protocol type) expires each offset by its commit time. An Empty group
        expires them counting from when it became Empty (its commit times if that is unknown). A
        Stable consumer group whose subscriptions are known expires, by commit time, offsets of
        topics nobody subscribes to (KIP-496; the caller skips subscribed topics). Otherwise none.
        """
        if self.protocol_type is None:
            return lambda committed_ms: committed_ms
        if self.state is GroupState.EMPTY:
            since = self.state_timestamp_ms
            return lambda committed_ms: since if since >= 0 else committed_ms
        if self.uses_consumer_group_protocol() and self.state is GroupState.STABLE \
                and self.subscribed_topics_known() is not None:
            return lambda committed_ms: committed_ms
        return None


def parse_subscription_topics(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (version i16, then an array of i16-length strings,
    the v0 prefix every version shares), or None if ``data`` is not one."""
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        topics = set()
        for _ in range(max(n, 0)):
            (length,) = struct.unpack_from(">h", data, pos)
            pos += 2
            if length < 0 or pos + length > len(data):
                return None
            topics.add(data[pos : pos + length].decode())
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def java_hash_map_order(names: list[str]) -> dict[str, int]:
    """The position of each of ``names`` (distinct, in insertion order) when a ``java.util.HashMap``
    they were put into, with its default capacity, is iterated: by bucket (``String.hashCode`` over
    UTF-16 code units, spread by ``h ^ (h >>> 16)``, masked by the table size, which doubles past a
    load factor of 0.75 from 16), then by insertion within a bucket. Kafka breaks ties with it."""
    capacity = 16
    while len(names) > capacity * 3 // 4:
        capacity *= 2

    def bucket(name: str) -> int:
        h = 0
        units = name.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    ranked = sorted(range(len(names)), key=lambda i: (bucket(names[i]), i))
    return {names[i]: position for position, i in enumerate(ranked)}
