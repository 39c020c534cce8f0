"""One guarantee's result in `oncelog demo`: what the checks counted, and its row of the table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from oncelog.demo.windows import SHORT, WINDOWS, KillRecord

HEADINGS = ("guarantee", "driver kills", "kill windows", "replay skipped", "acks dropped", "ledger out", "lost",
            "dup", "ledger sums wrong", "total updates repeated", "totals wrong topic", "totals wrong SQLite",
            "zombie lost/dup", "verdict")


@dataclass
class Outcome:
    guarantee: str
    kills: int
    exit_code: int | None
    records_out: int
    lost: int
    duplicated: int
    unexpected: int
    wrong_accounts: int
    seconds: float
    repeated_updates: int = 0
    wrong_totals_topic: int = 0
    wrong_totals_sqlite: int = 0
    zombie_lost: int = 0
    zombie_duplicated: int = 0
    dropped_acks: int = 0
    commit_window_kills: int = 0
    replay_skipped: int = 0
    kill_records: list[KillRecord] = field(default_factory=list)

    def windows(self) -> Counter[str]:
        """How many kills hit each window (the window of the query each kill aimed at)."""
        return Counter(k.window for k in self.kill_records)

    def windows_text(self) -> str:
        hit = self.windows()
        return ", ".join(f"{SHORT[w]} {hit[w]}" for w in WINDOWS if hit[w]) or "-"

    def cells(self) -> tuple[object, ...]:
        verdict = "exact" if self.ok else ("FAILED RUN" if self.exit_code != 0 else "inexact")
        kills = f"{self.kills}+{self.commit_window_kills}" if self.commit_window_kills else self.kills
        return (self.guarantee, kills, self.windows_text(), self.replay_skipped, self.dropped_acks,
                self.records_out, self.lost, self.duplicated, self.wrong_accounts, self.repeated_updates,
                self.wrong_totals_topic, self.wrong_totals_sqlite, f"{self.zombie_lost}/{self.zombie_duplicated}",
                verdict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 \
            and self.wrong_accounts == 0 and self.repeated_updates == 0 \
            and self.wrong_totals_topic == 0 and self.wrong_totals_sqlite == 0 \
            and self.zombie_lost == 0 and self.zombie_duplicated == 0
