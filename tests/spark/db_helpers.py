"""The database sink tests' query helper (their ``db_url`` fixture is in conftest.py)."""

from __future__ import annotations

import sqlite3
from typing import Any


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()
