"""The history a verify run records: every operation the clients did, with what they observed.

One JSON object per line. ``send`` ops are grouped in transactions (``txn`` ops carry the outcome);
``poll`` ops carry what a read_committed consumer received; ``fault`` ops mark injected faults.
Times are milliseconds since the run started (monotonic).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Send:
    process: str
    txn: int  # transaction number within the process (-1: non-transactional)
    value: str
    partition: int
    offset: int = -1  # from the delivery report; -1 when not acknowledged
    acked: bool = False
    time_ms: int = 0


@dataclass
class Txn:
    process: str
    txn: int
    outcome: str  # "committed" | "aborted" | "unknown" (commit failed ambiguously)
    commit_started_ms: int
    end_ms: int
    values: list[str] = field(default_factory=list)


@dataclass
class Poll:
    process: str
    time_ms: int
    records: list[tuple[int, int, str]]  # (partition, offset, value)
    final: bool = False


@dataclass
class Fault:
    kind: str
    start_ms: int
    end_ms: int
    detail: str = ""


@dataclass
class History:
    sends: list[Send] = field(default_factory=list)
    txns: list[Txn] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def dump(self, path: Path) -> None:
        with open(path, "w") as f:
            f.write(json.dumps({"type": "meta", **self.meta}) + "\n")
            for kind, items in (("send", self.sends), ("txn", self.txns), ("poll", self.polls),
                                ("fault", self.faults)):
                for item in items:
                    f.write(json.dumps({"type": kind, **asdict(item)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        h = cls()
        for line in path.read_text().splitlines():
            d = json.loads(line)
            kind = d.pop("type")
            if kind == "meta":
                h.meta = d
            elif kind == "send":
                h.sends.append(Send(**d))
            elif kind == "txn":
                h.txns.append(Txn(**d))
            elif kind == "poll":
                d["records"] = [tuple(r) for r in d["records"]]
                h.polls.append(Poll(**d))
            elif kind == "fault":
                h.faults.append(Fault(**d))
        return h
