"""The history a verify run records: every operation the clients did, with what they observed.

One JSON object per line. ``send`` ops are grouped in transactions (``txn`` ops carry the outcome);
``poll`` ops carry what a read_committed consumer received (a poll made inside a consume-transform-
produce transaction names that transaction); ``offsets`` ops carry a consumer group's committed
offsets as a client read them; ``fault`` ops mark injected faults; ``error`` ops record a workload
role that stopped on an unexpected exception. Times are milliseconds since the run started, on the
machine's monotonic clock (shared by every worker process).

An offset of -1 means "none": a delivery report or a record without an offset (a broker that answers
so is itself a finding, see the checker's ``missing-offset``). ``load`` accepts any JSON a broker or
an older version could have produced and coerces it; only a file that is not a history at all raises
``HistoryError``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any


class HistoryError(Exception):
    """The file is not a verify history (exit code 2)."""


@dataclass
class Send:
    process: str
    txn: int  # transaction number within the process (-1: non-transactional)
    value: str
    partition: int
    offset: int = -1  # from the delivery report; -1 when not acknowledged or acknowledged without one
    acked: bool = False
    time_ms: int = 0
    source: str = ""  # a copier's send: the input value it copies ("" for an original value)


@dataclass
class Txn:
    process: str
    txn: int
    outcome: str  # "committed" | "aborted" | "unknown" (commit failed ambiguously), as the client saw it
    commit_started_ms: int
    end_ms: int
    values: list[str] = field(default_factory=list)
    group: str = ""  # consume-transform-produce: the consumer group whose offsets the transaction carries
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> offset sent to the transaction
    fenced_ms: int = -1  # a newer instance with the same transactional.id fenced this one at this time
    # A copier transaction that did not commit: the partitions its consumer was sought back to (the
    # transaction's first offsets), and the consumer session whose reads follow that seek.
    rewound: dict[int, int] = field(default_factory=dict)
    rewind_session: str = ""


@dataclass
class Poll:
    process: str  # the consumer session: a consumer's reads are monotonic within one session
    time_ms: int
    records: list[tuple[int, int, str]]  # (partition, offset, value)
    final: bool = False
    txn_process: str = ""  # a poll inside a consume-transform-produce transaction: that transaction
    txn: int = -1
    # The final read: partition -> the end offset (the LSO) it read up to, every offset below it read
    # (empty in histories recorded before it was kept).
    ends: dict[int, int] = field(default_factory=dict)


@dataclass
class Offsets:
    """A group's committed offsets as ``process`` read them (OffsetFetch, RequireStable), between
    ``start_ms`` and ``end_ms``: after one of its transactions committed (``after == "commit"``) or
    when it was assigned partitions and resumed from them (``after == "assign"``, ``session`` being
    the consumer session that then reads)."""

    process: str
    group: str
    start_ms: int
    end_ms: int
    after: str
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> committed offset (-1: none)
    session: str = ""


@dataclass
class Fault:
    kind: str
    start_ms: int
    end_ms: int
    detail: str = ""


@dataclass
class RoleError:
    process: str
    time_ms: int
    error: str


@dataclass
class History:
    sends: list[Send] = field(default_factory=list)
    txns: list[Txn] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    offsets: list[Offsets] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    errors: list[RoleError] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def items(self) -> list[tuple[str, list[Any]]]:
        return [("send", self.sends), ("txn", self.txns), ("poll", self.polls), ("offsets", self.offsets),
                ("fault", self.faults), ("error", self.errors)]

    def dump(self, path: Path) -> None:
        with open(path, "w") as f:
            f.write(json.dumps({"type": "meta", **self.meta}) + "\n")
            for kind, items in self.items():
                for item in items:
                    f.write(dump_line(kind, item))

    def add(self, kind: str, item: Any) -> None:
        dict(self.items())[kind].append(item)

    @classmethod
    def load(cls, path: Path) -> History:
        h = cls()
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise HistoryError(f"cannot read {path}: {exc}") from exc
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                kind, item = parse_line(d)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise HistoryError(f"{path}, line {n}: not a history entry ({exc})") from exc
            if kind == "meta":
                h.meta = item
            elif kind is not None:
                h.add(kind, item)
        return h


def dump_line(kind: str, item: Any) -> str:
    return json.dumps({"type": kind, **asdict(item)}) + "\n"


_TYPES: dict[str, type] = {"send": Send, "txn": Txn, "poll": Poll, "offsets": Offsets, "fault": Fault,
                           "error": RoleError}


def _int(x: Any, default: int = -1) -> int:
    """An offset, partition or time as the broker or client gave it; anything that is not a number
    (None, a string) becomes ``default`` so that the checker can report it instead of crashing."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        try:
            return int(x)
        except ValueError:
            return default
    return default


def _offset_map(d: Any) -> dict[int, int]:
    if not isinstance(d, dict):
        return {}
    return {_int(k): _int(v) for k, v in d.items()}


def _is_int(x: Any) -> bool:
    return type(x) is int


def normalized(h: History) -> History:
    """The same history with every offset, partition, time and value of the expected type (a history
    built in memory from a client's answers may hold None where an offset should be). Entries already
    well-typed are shared, not copied: O(n)."""
    out = History(faults=list(h.faults), errors=list(h.errors), meta=dict(h.meta))
    for s in h.sends:
        if not (_is_int(s.offset) and _is_int(s.partition) and _is_int(s.txn) and _is_int(s.time_ms)
                and isinstance(s.value, str) and isinstance(s.source, str)):
            s = replace(s, offset=_int(s.offset), partition=_int(s.partition), txn=_int(s.txn),
                        time_ms=_int(s.time_ms, 0), value=str(s.value), source=str(s.source or ""))
        out.sends.append(s)
    for t in h.txns:
        if not (_is_int(t.txn) and _is_int(t.commit_started_ms) and _is_int(t.end_ms) and _is_int(t.fenced_ms)
                and all(_is_int(k) and _is_int(v) for k, v in [*t.offsets.items(), *t.rewound.items()])):
            t = replace(t, txn=_int(t.txn), commit_started_ms=_int(t.commit_started_ms), end_ms=_int(t.end_ms),
                        fenced_ms=_int(t.fenced_ms), offsets=_offset_map(t.offsets), rewound=_offset_map(t.rewound))
        out.txns.append(t)
    for p in h.polls:
        records = p.records
        if not all(_is_int(r[0]) and _is_int(r[1]) and isinstance(r[2], str) for r in records):
            records = [(_int(r[0]), _int(r[1]), str(r[2])) for r in records]
        ends_ok = all(_is_int(k) and _is_int(v) for k, v in p.ends.items())
        if records is not p.records or not (_is_int(p.time_ms) and _is_int(p.txn) and ends_ok):
            p = replace(p, records=records, time_ms=_int(p.time_ms, 0), txn=_int(p.txn), ends=_offset_map(p.ends))
        out.polls.append(p)
    for o in h.offsets:
        if not (_is_int(o.start_ms) and all(_is_int(k) and _is_int(v) for k, v in o.offsets.items())):
            o = replace(o, offsets=_offset_map(o.offsets), start_ms=_int(o.start_ms, 0), end_ms=_int(o.end_ms, 0))
        out.offsets.append(o)
    return out


def parse_line(d: Any) -> tuple[str | None, Any]:
    """One decoded JSON line -> (kind, entry). Unknown kinds are skipped (None) so that newer files
    load in older checkers; missing optional fields take their defaults."""
    if not isinstance(d, dict):
        raise TypeError(f"expected an object, got {type(d).__name__}")
    d = dict(d)
    kind = d.pop("type")
    if kind == "meta":
        return "meta", d
    cls = _TYPES.get(kind)
    if cls is None:
        return None, None
    names = {f.name for f in fields(cls)}
    d = {k: v for k, v in d.items() if k in names}
    if cls is Send:
        d["offset"] = _int(d.get("offset"))
        d["partition"] = _int(d.get("partition"))
        d["txn"] = _int(d.get("txn"))
        d["time_ms"] = _int(d.get("time_ms"), 0)
        d["value"] = str(d["value"])
        d["acked"] = bool(d.get("acked", False))
        d["source"] = str(d.get("source") or "")
    elif cls is Txn:
        d["txn"] = _int(d.get("txn"))
        d["commit_started_ms"] = _int(d.get("commit_started_ms"))
        d["end_ms"] = _int(d.get("end_ms"))
        d["values"] = [str(v) for v in d.get("values") or []]
        d["offsets"] = _offset_map(d.get("offsets"))
        d["fenced_ms"] = _int(d.get("fenced_ms"))
        d["rewound"] = _offset_map(d.get("rewound"))
        d["rewind_session"] = str(d.get("rewind_session") or "")
    elif cls is Poll:
        d["time_ms"] = _int(d.get("time_ms"), 0)
        d["records"] = [(_int(r[0]), _int(r[1]), str(r[2])) for r in d["records"]]
        d["txn"] = _int(d.get("txn"))
        d["ends"] = _offset_map(d.get("ends"))
    elif cls is Offsets:
        d["offsets"] = _offset_map(d.get("offsets"))
        d["start_ms"] = _int(d.get("start_ms"), 0)
        d["end_ms"] = _int(d.get("end_ms"), 0)
    return kind, cls(**d)
