"""Pure parts of `oncelog demo`: payment generation, totals, loss/duplicate counting, SQLite, HTML."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import pytest

from oncelog.demo.cli import (
    Outcome,
    add_arguments,
    db_totals,
    payments,
    reset_tables,
    totals_of,
    write_html,
    wrong,
)
from oncelog.demo.faults import duplicates_and_losses, expected_per_account, latest_per_account, repeated_updates


def test_payments_are_deterministic_and_totals_add_up() -> None:
    a = payments(50, 4, seed=1)
    assert a == payments(50, 4, seed=1) and a != payments(50, 4, seed=2)
    totals = totals_of([v for _k, v in a])
    assert len(totals) <= 4 and sum(totals.values()) == sum(json.loads(v)["amount"] for _k, v in a)


def test_losses_and_duplicates_are_counted_separately() -> None:
    assert duplicates_and_losses([b"a", b"b", b"c"], [b"a", b"a", b"a", b"c", b"x"]) == (1, 2, 1)
    assert duplicates_and_losses([b"a"], [b"a"]) == (0, 0, 0)


def test_update_mode_outputs_are_judged_by_newest_update_and_repeats() -> None:
    updates = [{"account": "a", "batch": 0, "count": 1, "total": 5},
               {"account": "a", "batch": 1, "count": 2, "total": 7},
               {"account": "a", "batch": 1, "count": 2, "total": 7},
               {"account": "b", "batch": 0, "count": 1, "total": 1}]
    assert latest_per_account(updates) == {"a": (2, 7), "b": (1, 1)}
    assert repeated_updates(updates) == 1 and repeated_updates(updates[:2]) == 0
    values = [json.dumps({"account": "a", "amount": n}).encode() for n in (5, 2)]
    assert expected_per_account(values) == {"a": (2, 7)}
    assert wrong({"a": (2, 7)}, {"a": (2, 7), "b": (1, 1)}) == 1


def test_totals_tables_and_report(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute('CREATE TABLE totals_exactly_once (account, "count", total)')
        conn.execute("INSERT INTO totals_exactly_once VALUES ('a', 2, 7)")
    url = f"sqlite:///{db}"
    assert db_totals(url, "totals_exactly_once") == {"a": (2, 7)}
    assert db_totals(url, "totals_at_least_once") == {}, "a table never written reads as empty"
    reset_tables(url, ["exactly_once"])
    assert db_totals(url, "totals_exactly_once") == {}
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--records", "10"])
    good = Outcome("exactly_once", 2, 0, 10, 0, 0, 0, 0, 1.0)
    bad = Outcome("at_least_once", 2, 0, 12, 0, 2, 0, 3, 1.0, zombie_duplicated=5)
    repeated = Outcome("at_least_once", 2, 0, 10, 0, 0, 0, 0, 1.0, repeated_updates=3)
    assert good.ok and not bad.ok and not repeated.ok
    write_html(tmp_path / "r.html", [good, bad, repeated], args)
    text = (tmp_path / "r.html").read_text()
    assert "exactly_once" in text and "inexact" in text and "0/5" in text and "total updates repeated" in text


def test_totals_tables_on_postgresql(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url) as pg:
        pg.execute('CREATE TABLE totals_exactly_once (account text, "count" bigint, total bigint)')
        pg.execute("INSERT INTO totals_exactly_once VALUES ('a', 2, 7)")
    assert db_totals(postgres_url, "totals_exactly_once") == {"a": (2, 7)}
    assert db_totals(postgres_url, "totals_at_most_once") == {}
    reset_tables(postgres_url, ["exactly_once", "at_most_once"])
    assert db_totals(postgres_url, "totals_exactly_once") == {}


@pytest.mark.parametrize("bad", [["--records", "0"], ["--records", "-5"], ["--accounts", "x"], ["--kills", "-1"],
                                 ["--commit-window-batch", "-2"], ["--guarantees", "exactly_once,nope"],
                                 ["--guarantees", ","], ["--drop-acks", "1"], ["--max-offsets", "-3"]])
def test_bad_demo_options_are_usage_errors_before_any_work(bad: list[str]) -> None:
    """Each used to start a broker and a Spark job anyway (a negative --records ran the whole demo
    on nothing; an unknown guarantee failed minutes later)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "oncelog", "demo", *bad], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"argument {bad[0]}" in r.stderr, (bad, r.stderr[-500:])
    assert "broker on" not in r.stdout + r.stderr


def test_demo_guarantees_parse_into_a_list() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).guarantees == ["exactly_once", "at_least_once", "at_most_once"]
    assert p.parse_args(["--guarantees", " at_most_once ,exactly_once"]).guarantees == ["at_most_once", "exactly_once"]
