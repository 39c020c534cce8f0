"""Pure parts of `oncelog demo`: payment generation, totals, loss/duplicate counting, SQLite, HTML."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from oncelog.demo.cli import Outcome, add_arguments, payments, store_totals, totals_of, write_html
from oncelog.demo.faults import duplicates_and_losses


def test_payments_are_deterministic_and_totals_add_up() -> None:
    a = payments(50, 4, seed=1)
    assert a == payments(50, 4, seed=1) and a != payments(50, 4, seed=2)
    totals = totals_of([v for _k, v in a])
    assert len(totals) <= 4 and sum(totals.values()) == sum(json.loads(v)["amount"] for _k, v in a)


def test_losses_and_duplicates_are_counted_separately() -> None:
    assert duplicates_and_losses([b"a", b"b", b"c"], [b"a", b"a", b"a", b"c", b"x"]) == (1, 2, 1)
    assert duplicates_and_losses([b"a"], [b"a"]) == (0, 0, 0)


def test_totals_upsert_and_report(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    store_totals(db, "exactly_once", {"a": 1})
    store_totals(db, "exactly_once", {"a": 2, "b": 3})
    with sqlite3.connect(db) as conn:
        assert dict(conn.execute("SELECT account, total FROM totals").fetchall()) == {"a": 2, "b": 3}
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--records", "10"])
    good = Outcome("exactly_once", 2, 0, 10, 0, 0, 0, 0, 1.0)
    bad = Outcome("at_least_once", 2, 0, 12, 0, 2, 0, 3, 1.0, zombie_duplicated=5)
    assert good.ok and not bad.ok
    write_html(tmp_path / "r.html", [good, bad], args)
    text = (tmp_path / "r.html").read_text()
    assert "exactly_once" in text and "inexact" in text and "0/5" in text
