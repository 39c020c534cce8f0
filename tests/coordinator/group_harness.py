"""Drive the sans-IO group coordinator like the server does: records appended to a log, then replayed.

``GroupLog`` stands in for ``__consumer_offsets``: every record a coordinator returns (or buffers for
``take_records``) is appended here and replayed, so a test can restart by replaying the log into a
fresh coordinator, as the broker does after kill -9.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oncelog.clock import ManualClock
from oncelog.coordinator.group.group_coordinator import GroupCoordinator

RANGE = [("range", b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff")]
RANGE_OTHER_META = [("range", b"\x00\x00\x00\x00\x00\x01\x00\x01u\xff\xff\xff\xff")]
ROUNDROBIN_FIRST = [("roundrobin", b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"), RANGE[0]]


class Box:
    """A respond callback that remembers what it was called with (and how often)."""

    def __init__(self) -> None:
        self.value: Any = None
        self.calls = 0

    def __call__(self, v: Any) -> None:
        self.value = v
        self.calls += 1


@dataclass
class GroupLog:
    clock: ManualClock = field(default_factory=ManualClock)
    delay_ms: int = 0
    retention_ms: int = 7 * 24 * 3600 * 1000
    entries: list[tuple[bytes, bytes | None, int, bool] | tuple[str, int, bool]] = field(default_factory=list)
    gc: GroupCoordinator = field(init=False)

    def __post_init__(self) -> None:
        self.gc = self._new()

    def _new(self) -> GroupCoordinator:
        return GroupCoordinator(self.clock, group_initial_rebalance_delay_ms=self.delay_ms,
                                offsets_retention_ms=self.retention_ms)

    # --- records, then replay ---------------------------------------------------------------------
    def apply(self, records: list[tuple[bytes, bytes | None]], producer_id: int = -1,
              transactional: bool = False) -> None:
        for k, v in records:
            self.entries.append((k, v, producer_id, transactional))
            self.gc.replay(k, v, producer_id, transactional)

    def flush(self) -> None:
        self.apply(self.gc.take_records())

    def marker(self, producer_id: int, commit: bool) -> None:
        self.entries.append(("marker", producer_id, commit))
        self.gc.replay_control(producer_id, commit)

    def restart(self) -> GroupCoordinator:
        """Replay the whole log into a fresh coordinator (what loading after kill -9 does)."""
        self.flush()
        fresh = self._new()
        fresh.loading = True
        for e in self.entries:
            if e[0] == "marker":
                fresh.replay_control(e[1], e[2])  # type: ignore[arg-type]
            else:
                k, v, pid, txn = e  # type: ignore[misc]
                fresh.replay(k, v, pid, txn)  # type: ignore[arg-type]
        fresh.loaded()
        self.gc = fresh
        return fresh

    # --- requests ---------------------------------------------------------------------------------
    def join(self, member: str = "", instance: str | None = None, protocols: list[tuple[str, bytes]] = RANGE,
             group: str = "g", session: int = 10_000, rebalance: int = 20_000, require_known: bool = False,
             protocol_type: str = "consumer") -> Box:
        box = Box()
        self.gc.join_group(group, member, instance, "client", "/h", session, rebalance, protocol_type, protocols,
                           require_known, box)
        self.flush()
        return box

    def sync(self, member: str, generation: int, assignments: list[tuple[str, bytes]] | None = None,
             instance: str | None = None, group: str = "g", protocol_type: str | None = None,
             protocol_name: str | None = None) -> Box:
        box = Box()
        self.gc.sync_group(group, generation, member, instance, list(assignments or []), box, protocol_type,
                           protocol_name)
        self.flush()
        return box

    def heartbeat(self, member: str, generation: int, instance: str | None = None, group: str = "g") -> Any:
        code = self.gc.heartbeat(group, generation, member, instance)
        self.flush()
        return code

    def leave(self, members: list[tuple[str, str | None]], group: str = "g") -> Any:
        out = self.gc.leave_group(group, members)
        self.flush()
        return out

    def commit(self, member: str, generation: int, offsets: list[tuple[str, int, int]],
               instance: str | None = None, group: str = "g") -> dict[tuple[str, int], Any]:
        result = self.gc.offset_commit(group, generation, member, instance,
                                       [(t, p, o, -1, None) for t, p, o in offsets])
        self.apply(result.records)
        return result.errors

    def txn_commit(self, producer_id: int, member: str, generation: int, offsets: list[tuple[str, int, int]],
                   instance: str | None = None, group: str = "g") -> dict[tuple[str, int], Any]:
        result = self.gc.txn_offset_commit(group, producer_id, generation, member, instance,
                                           [(t, p, o, -1, None) for t, p, o in offsets])
        self.apply(result.records, producer_id, transactional=True)
        return result.errors

    def offset_delete(self, partitions: list[tuple[str, int]], group: str = "g") -> tuple[Any, dict[Any, Any]]:
        top, errors, records = self.gc.offset_delete(group, partitions)
        self.apply(records)
        return top, errors

    def delete_groups(self, groups: list[str]) -> dict[str, Any]:
        errors, records = self.gc.delete_groups(groups)
        self.apply(records)
        return errors

    def expire(self) -> list[tuple[bytes, bytes | None]]:
        records = self.gc.expire_offsets()
        self.apply(records)
        return records

    def tick(self) -> None:
        self.apply(self.gc.tick())

    def committed(self, tp: tuple[str, int], group: str = "g") -> int | None:
        om, _code = self.gc.offset_fetch(group, [tp], False)[tp]
        return None if om is None else om.offset
