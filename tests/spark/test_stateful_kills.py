"""A stateful aggregation (running count and total per account, update mode through foreachBatch)
stays exact while the Spark driver is SIGKILLed mid-batch and restarted from its checkpoint.

exactly_once: the output topic holds each (micro-batch, account) update once, the latest update per
account equals the committed input's count and total, and so do the SQLite and PostgreSQL tables.
at_least_once, same faults: the topic shows replayed updates twice (the databases stay exact: they
record batch ids, the seed's "write to a system with unique keys").
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from oncelog.demo.faults import produce_transactions, read_topic, run_with_driver_kills
from oncelog.testing.broker_process import BrokerProcess, create_topic

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

ACCOUNTS = 6


def _payments(n: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(11)
    out = []
    for i in range(n):
        acct = f"acct-{rng.randrange(ACCOUNTS)}"
        out.append((acct.encode(), json.dumps({"id": i, "account": acct, "amount": rng.randrange(1, 100)}).encode()))
    return out


def _expected(records: list[tuple[bytes, bytes]]) -> dict[str, tuple[int, int]]:
    count: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for _k, v in records:
        d = json.loads(v)
        count[d["account"]] += 1
        total[d["account"]] += d["amount"]
    return {a: (count[a], total[a]) for a in count}


def _run(broker: BrokerProcess, tmp_path: Path, guarantee: str, kills: int,
         databases: list[str]) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
    bs = broker.bootstrap
    create_topic(bs, "payments", 2)
    create_topic(bs, "totals", 2)
    records = _payments(160)
    produce_transactions(bs, "payments", records, per_txn=16, abort_every=3, partitions=2)
    cmd = [sys.executable, "-m", "oncelog.demo.job", "--mode", "counts", "--bootstrap", bs, "--input", "payments",
           "--output", "totals", "--checkpoint", str(tmp_path / "ckpt"), "--guarantee", guarantee,
           "--max-offsets", "40", "--delay-ms", "1000"]
    for url in databases:
        cmd += ["--database", url]
    report = run_with_driver_kills(cmd, bs, "totals", kills=kills, seed=3, log_path=tmp_path / "job.log",
                                   timeout_s=240)
    assert report.exit_code == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert report.kills == kills
    updates = [json.loads(v or b"{}") for _k, v in read_topic(bs, "totals")]
    return updates, _expected(records)


def _latest(updates: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    latest: dict[str, dict[str, Any]] = {}
    for u in updates:  # per partition in offset order; an account lives in one partition
        if u["account"] not in latest or u["batch"] >= latest[u["account"]]["batch"]:
            latest[u["account"]] = u
    return {a: (u["count"], u["total"]) for a, u in latest.items()}


def _db_totals(url: str) -> dict[str, tuple[int, int]]:
    sql = 'SELECT account, "count", total FROM account_totals'
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            rows = conn.execute(sql).fetchall()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            rows = pg.execute(sql).fetchall()
    return {a: (int(c), int(t)) for a, c, t in rows}


def _postgres_if_available(request: pytest.FixtureRequest) -> list[str]:
    from oncelog.testing.postgres import find_postgres

    install, _why = find_postgres()
    return [str(request.getfixturevalue("postgres_url"))] if install is not None else []


def test_counts_per_key_exact_after_driver_kills(broker: BrokerProcess, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    dbs = [f"sqlite:///{tmp_path / 'totals.sqlite'}", *_postgres_if_available(request)]
    updates, expected = _run(broker, tmp_path, "exactly_once", kills=2, databases=dbs)
    per_batch = Counter((u["batch"], u["account"]) for u in updates)
    assert [k for k, n in per_batch.items() if n > 1] == [], "an update of one batch appeared twice"
    assert _latest(updates) == expected
    for url in dbs:
        assert _db_totals(url) == expected, url


def test_at_least_once_repeats_updates_under_the_same_faults(broker: BrokerProcess, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'totals.sqlite'}"
    updates, expected = _run(broker, tmp_path, "at_least_once", kills=1, databases=[db])
    per_batch = Counter((u["batch"], u["account"]) for u in updates)
    assert any(n > 1 for n in per_batch.values()), "a kill after the flush must replay the batch's updates"
    assert _latest(updates) == expected, "replays repeat updates but never change the final state"
    assert _db_totals(db) == expected, "the database sink records batch ids, so it stays exact"
