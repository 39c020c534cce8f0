"""Idempotent database sinks for ``foreachBatch``: the seed's "write to a system with unique keys".

Invariants, for SQLite and PostgreSQL alike:

- Rows are keyed by ``key_columns``: by default Kafka's coordinates (topic, partition, offset), so
  the same input record written twice is one row; or a user key such as an account, so the latest
  running total wins. Rows with a user key are upserted. Rows keyed by coordinates are inserted and
  never overwritten: a row already stored under a record's coordinates must hold the same values
  (a record written again), and one that differs fails the batch. Other values under the same
  coordinates are another record: the topic was deleted and created again, its offsets starting
  over, or its log lost its tail and was refilled; overwriting replaced the old topic's rows.
- Table ``oncelog_sink_batches(target, query_id, batch_id, rows)`` records each applied micro-batch
  of each sink — ``target`` is the sink's table, so one query may write each batch to several
  tables under one query id — **in the same database transaction** as its rows. A replayed batch
  (Spark re-running batch N after a driver crash) finds its marker and changes nothing, so even a
  non-idempotent write (an increment) is applied once; a replay with another row count fails
  instead (the replay is not the same data). Two attempts racing on one batch (a zombie and its
  retry) serialise on that primary key: the loser sees the winner's row and skips.
- A marker of a *later* batch means a rewound checkpoint or a reused query id: the batch fails,
  unless ``fail_on_higher_committed_batch=False`` (then it is skipped with a warning).
- A failure rolls the whole batch back: a batch is applied entirely or not at all.
- **Rule: one write per sink identity (table, query id) per batch.** The marker cannot tell a
  second write of batch N into the same table under the same query id (two DataFrames, or one sink
  object called twice, in one ``foreachBatch`` function) from a replay of batch N: the second
  write is skipped when its row count equals the first's, and fails as "not the same data"
  otherwise. Union the DataFrames into one write, or give each write its own query id. A sink
  object that committed batch N itself and is asked for N again logs a warning (it cannot refuse:
  a query restarted in the same process after a failure later in the batch replays N genuinely).
- Applying batch N deletes the sink's markers of batches up to ``N - retain_batches`` (default 100,
  as Spark's ``spark.sql.streaming.minBatchesToRetain``) in the same transaction, so the markers
  table does not grow by a row per batch for ever: replays only ever concern the newest batch, and
  the newest marker, which the later-batch check needs, is always kept. (PostgreSQL: only when the
  role may DELETE from the markers table; otherwise a warning, once.)

The sinks run on the driver: the batch is collected, which suits the small, aggregated outputs
(update-mode state) they are meant for.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

KAFKA_COORDINATES = ("topic", "partition", "offset")
MARKERS = "oncelog_sink_batches"
RETAIN_BATCHES = 100  # as Spark's spark.sql.streaming.minBatchesToRetain
PG_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: longer names are truncated

log = logging.getLogger("oncelog.spark")


class UpsertSink:
    """Common part: checks names, turns a DataFrame into rows, calls :meth:`apply`."""

    def __init__(self, table: str, query_id: str, key_columns: Sequence[str] = KAFKA_COORDINATES,
                 fail_on_higher_committed_batch: bool = True, retain_batches: int = RETAIN_BATCHES) -> None:
        self.table = table
        self.query_id = query_id
        self.key_columns = list(key_columns)
        self.fail_on_higher_committed_batch = fail_on_higher_committed_batch
        if retain_batches < 1:
            raise ValueError("retain_batches must be at least 1 (the newest batch's marker is always kept)")
        self.retain_batches = retain_batches
        self._last_applied: int | None = None  # the batch this object last committed, for a warning
        if not self.key_columns:
            raise ValueError("at least one key column is needed")
        self._check_table_name(table)
        self._check_column_names(self.key_columns)

    def _check_table_name(self, table: str) -> None:
        if not table.isidentifier():
            raise ValueError("table and key column names must be plain identifiers")

    def _check_column_names(self, names: Sequence[str]) -> None:
        if not all(c.isidentifier() for c in names):
            raise ValueError("table and key column names must be plain identifiers")

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [r.asDict() if hasattr(r, "asDict") else dict(r) for r in df.collect()]
        self.apply(rows, int(batch_id))

    def apply(self, rows: list[dict[str, Any]], batch_id: int) -> bool:
        """Upsert ``rows`` as batch ``batch_id``; False if that batch was applied before."""
        raise NotImplementedError

    def _check_replay(self, committed_rows: int | None, higher: int | None, batch_id: int, rows: int) -> bool:
        """True to skip (this batch is applied, same row count); raises when neither skipping nor
        applying would be exactly once.

        A later batch's marker is looked at first: a genuine replay is always of the latest batch
        (Spark runs batch N+1 only once N is committed), so when one exists this batch's own marker
        (if any) was left by another run — a query restarted from a fresh checkpoint under the same
        query id — and matching row counts prove nothing. Checked second, such a batch 0, 1, ...
        was silently skipped whenever its row count happened to equal the old run's."""
        where = f"database sink {self.table!r} query {self.query_id!r}"
        if higher is not None:
            if self.fail_on_higher_committed_batch:
                raise RuntimeError(
                    f"{where}: batch {higher} is already applied while Spark writes batch {batch_id}: the checkpoint "
                    "was rewound or restored, or another query reuses this query id. Use a new checkpoint or "
                    "query id, or pass fail_on_higher_committed_batch=False to skip such batches.")
            log.warning("%s: batch %d already applied; skipping batch %d", where, higher, batch_id)
            return True
        if committed_rows is not None:
            if batch_id == self._last_applied:
                log.warning(
                    "%s: batch %d was applied by this sink object in this process and is written again: a "
                    "replay after a failure, or a second write of the batch into the same table under the same "
                    "query id, which is skipped or refused as a replay (union the DataFrames into one write, or "
                    "give each write its own query id)", where, batch_id)
            if committed_rows >= 0 and committed_rows != rows:
                raise RuntimeError(
                    f"{where}: batch {batch_id} was applied with {committed_rows} rows but its replay has {rows}: "
                    "the replay is not the same data (non-deterministic expression, failOnDataLoss=false with "
                    "records removed by retention, changed partitioning)")
            return True
        return False

    def keyed_by_coordinates(self) -> bool:
        """Whether rows are keyed by Kafka's coordinates: then inserted, never overwritten."""
        return tuple(self.key_columns) == KAFKA_COORDINATES

    def _differing(self, cols: list[str], row: dict[str, Any], stored: Sequence[Any], batch_id: int) -> Exception:
        non_keys = [c for c in cols if c not in self.key_columns]
        key = {k: row.get(k) for k in self.key_columns}
        return RuntimeError(
            f"database sink {self.table!r}: batch {batch_id} writes the record at {key} with other values than "
            f"the row stored under those coordinates ({_shown(dict(zip(non_keys, stored, strict=True)))} stored, "
            f"{_shown({c: row.get(c) for c in non_keys})} now). Rows keyed by Kafka coordinates (topic, "
            "partition, offset) are never overwritten: other values at the same coordinates are another record "
            "(the topic was deleted and created again and its offsets started over, or its log lost records "
            "and was refilled), and overwriting would replace the one stored. Key the table by columns that "
            "identify a record for good (key_columns), or move the stored rows away, and run the batch again")

    def _columns(self, rows: list[dict[str, Any]]) -> list[str]:
        cols = list(rows[0])
        missing = [k for k in self.key_columns if k not in cols]
        if missing:
            raise ValueError(f"rows lack key columns {missing}")
        if not all(c.isidentifier() for c in cols):
            raise ValueError("column names must be plain identifiers")
        self._check_column_names(cols)
        if any(list(r) != cols for r in rows):
            raise ValueError("all rows of a batch must have the same columns")
        return cols


class SqliteUpsertSink(UpsertSink):
    """Upserts into the SQLite file ``path`` (table created on first use, columns loosely typed).

    NULL is a key value like any other: the rows are keyed by a unique index on ``(k IS NULL,
    IFNULL(k, 0))`` for each key column ``k`` (named ``<table>_oncelog_key``), not by a PRIMARY KEY,
    which SQLite lets hold any number of NULLs (a running total of a NULL group was a new row each
    batch). A float NaN, which SQLite stores as NULL, is therefore the same key as NULL. A table
    created by an earlier version keeps its PRIMARY KEY and gets the index beside it, in the
    transaction of its next batch; if it already holds duplicate NULL-keyed rows the index cannot
    be built and the batch fails saying so (delete the older duplicates, then retry).
    """

    def __init__(self, path: str | Path, table: str, query_id: str,
                 key_columns: Sequence[str] = KAFKA_COORDINATES, fail_on_higher_committed_batch: bool = True,
                 retain_batches: int = RETAIN_BATCHES) -> None:
        super().__init__(table, query_id, key_columns, fail_on_higher_committed_batch, retain_batches)
        if str(path) in ("", ":memory:"):
            raise ValueError(
                f"SQLite database {str(path)!r} is a new, empty in-memory database for every batch: its markers "
                "would be lost with it and a replayed batch applied again. Give a file path")
        self.path = os.path.abspath(path)  # resolved once: a later chdir must not switch databases

    def apply(self, rows: list[dict[str, Any]], batch_id: int) -> bool:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        except sqlite3.OperationalError as e:
            raise sqlite3.OperationalError(
                f"database sink {self.table!r}: cannot open the SQLite database {self.path}: {e} "
                "(sqlite:///name is relative to the working directory, as in SQLAlchemy; an absolute path "
                "takes four slashes, sqlite:////dir/name)") from e
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {MARKERS} (target TEXT, query_id TEXT, batch_id INTEGER, "
                         "rows INTEGER, PRIMARY KEY (target, query_id, batch_id))")
            seen = conn.execute(f"SELECT rows FROM {MARKERS} WHERE target = ? AND query_id = ? AND batch_id = ?",
                                (self.table, self.query_id, batch_id)).fetchone()
            higher = conn.execute(f"SELECT MAX(batch_id) FROM {MARKERS} WHERE target = ? AND query_id = ? "
                                  "AND batch_id > ?", (self.table, self.query_id, batch_id)).fetchone()[0]
            if self._check_replay(None if seen is None else int(seen[0]), higher, batch_id, len(rows)):
                conn.execute("ROLLBACK")
                return False
            if rows:
                cols = self._columns(rows)
                q = [f'"{c}"' for c in cols]
                key = self._key_expressions()
                conn.execute(f'CREATE TABLE IF NOT EXISTS "{self.table}" ({", ".join(q)})')
                self._create_key_index(conn, key)
                updates = ", ".join(f'"{c}" = excluded."{c}"' for c in cols if c not in self.key_columns)
                insert_only = self.keyed_by_coordinates() or not updates
                conflict = "DO NOTHING" if insert_only else f"DO UPDATE SET {updates}"
                cur = conn.executemany(
                    f'INSERT INTO "{self.table}" ({", ".join(q)}) VALUES ({", ".join("?" for _ in cols)}) '
                    f"ON CONFLICT ({key}) {conflict}",
                    [tuple(_plain_value(r.get(c)) for c in cols) for r in rows])
                if self.keyed_by_coordinates() and cur.rowcount < len(rows):
                    self._check_stored(conn, cols, rows, batch_id)
            conn.execute(f"INSERT INTO {MARKERS} VALUES (?, ?, ?, ?)", (self.table, self.query_id, batch_id, len(rows)))
            conn.execute(f"DELETE FROM {MARKERS} WHERE target = ? AND query_id = ? AND batch_id <= ?",
                         (self.table, self.query_id, batch_id - self.retain_batches))
            conn.execute("COMMIT")
            self._last_applied = batch_id
            return True
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _key_expressions(self) -> str:
        return ", ".join(f'("{c}" IS NULL), IFNULL("{c}", 0)' for c in self.key_columns)

    def _check_stored(self, conn: sqlite3.Connection, cols: list[str], rows: list[dict[str, Any]],
                      batch_id: int) -> None:
        """Some rows met a stored row with their coordinates (the insert skipped them): each must have
        met its own values. Rows inserted just now match themselves; a later copy of a record in the
        same batch meets the first. Looked up through the key index's expressions."""
        non_keys = [c for c in cols if c not in self.key_columns]
        if not non_keys:
            return
        match = " AND ".join(f'("{c}" IS NULL) = (? IS NULL) AND IFNULL("{c}", 0) = IFNULL(?, 0)'
                             for c in self.key_columns)
        differs = " OR ".join(f'NOT ("{c}" IS ?)' for c in non_keys)
        selected = ", ".join(f'"{c}"' for c in non_keys)
        stmt = f'SELECT {selected} FROM "{self.table}" WHERE {match} AND ({differs}) LIMIT 1'
        for r in rows:
            keys = [_plain_value(r.get(c)) for c in self.key_columns]
            stored = conn.execute(stmt, [v for k in keys for v in (k, k)] +
                                  [_plain_value(r.get(c)) for c in non_keys]).fetchone()
            if stored is not None:
                raise self._differing(cols, r, stored, batch_id)

    def _create_key_index(self, conn: sqlite3.Connection, key: str) -> None:
        try:
            conn.execute(f'CREATE UNIQUE INDEX IF NOT EXISTS "{self.table}_oncelog_key" ON "{self.table}" ({key})')
        except sqlite3.IntegrityError as e:
            nulls = " OR ".join(f'"{c}" IS NULL' for c in self.key_columns)
            raise RuntimeError(
                f"database sink {self.table!r}: table {self.table!r} holds several rows with one key "
                f"{tuple(self.key_columns)} where a key column is NULL (written by an earlier version, whose "
                f"PRIMARY KEY let NULL keys repeat), so the index that makes NULL one key value cannot be built: "
                f"delete the older duplicates (SELECT rowid, * FROM \"{self.table}\" WHERE {nulls}) and retry"
            ) from e


class PostgresUpsertSink(UpsertSink):
    """Upserts into PostgreSQL at ``url`` (``postgresql://user:pass@host:port/db``) through psycopg 3.

    The table is created on first use with column types taken from the first batch's Python values
    (int → bigint, float → double precision, bool → boolean, bytes → bytea, anything else → text)
    and, on PostgreSQL 15+, ``UNIQUE NULLS NOT DISTINCT`` on the key columns, so NULL is a key value
    like any other (Spark's ``groupBy`` emits a NULL group). Older servers get a PRIMARY KEY, as
    earlier versions of this sink created everywhere; such a table refuses NULL keys, and a batch
    with one fails with a ``ValueError`` saying how to migrate the table (the upsert's
    ``ON CONFLICT (keys)`` works with either constraint).

    The batch marker (with the batch's row count) is inserted first with ``ON CONFLICT DO NOTHING``:
    if it already exists the transaction is rolled back untouched; if another session holds it
    uncommitted, PostgreSQL blocks this one until that session ends, so concurrent attempts of one
    batch apply it once.

    ``table`` may be schema-qualified, ``schema.table`` (each part a plain identifier); the markers
    table is then ``schema.oncelog_sink_batches``, beside it, and otherwise found or created through
    the ``search_path`` as an unqualified table is. The markers' ``target`` is ``table`` as given, so
    every sink of one table must spell it the same way.

    Tables are created only when the catalog (``to_regclass``) lacks them, so a least-privilege role
    with SELECT, INSERT, UPDATE on tables created beforehand and no CREATE on the schema (PostgreSQL
    15 grants none on ``public`` to other roles) can run the sink; ``CREATE TABLE IF NOT EXISTS``
    alone needs CREATE even when the table exists.
    """

    def __init__(self, url: str, table: str, query_id: str,
                 key_columns: Sequence[str] = KAFKA_COORDINATES, fail_on_higher_committed_batch: bool = True,
                 retain_batches: int = RETAIN_BATCHES) -> None:
        super().__init__(table, query_id, key_columns, fail_on_higher_committed_batch, retain_batches)
        self.url = url
        if "\x00" in query_id:
            raise ValueError("a PostgreSQL sink's query id cannot hold a NUL character (text cannot store it)")
        self.schema = table.rpartition(".")[0]  # "" when unqualified
        self.markers = f"{self.schema}.{MARKERS}" if self.schema else MARKERS
        self._warned_no_prune = False

    def _check_table_name(self, table: str) -> None:
        parts = table.split(".")
        if len(parts) > 2 or not all(p.isidentifier() for p in parts):
            raise ValueError(f"table {table!r}: a PostgreSQL table name must be a plain identifier or "
                             "schema.table (each part one)")
        self._check_column_names(parts)

    def _check_column_names(self, names: Sequence[str]) -> None:
        super()._check_column_names(names)
        long = [n for n in names if len(n.encode()) > PG_MAX_IDENTIFIER_BYTES]
        if long:
            raise ValueError(
                f"{long}: PostgreSQL truncates names to {PG_MAX_IDENTIFIER_BYTES} bytes, so names that differ only "
                "after that would be one table or column; use shorter names")

    def apply(self, rows: list[dict[str, Any]], batch_id: int) -> bool:
        import psycopg
        from psycopg import sql

        cols = self._columns(rows) if rows else []  # checked before connecting
        markers, target = _pg_ident(self.markers), _pg_ident(self.table)
        with psycopg.connect(self.url) as conn:  # one transaction; committed on success, rolled back on error
            can_prune = self._create_tables(conn, rows, cols)  # its own transaction, committed
            cur = conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING").format(markers),
                               (self.table, self.query_id, batch_id, len(rows)))
            seen = None
            if cur.rowcount == 0:  # an attempt that committed first (a concurrent one is waited for)
                row = conn.execute(sql.SQL("SELECT rows FROM {} WHERE target = %s AND query_id = %s "
                                           "AND batch_id = %s").format(markers),
                                   (self.table, self.query_id, batch_id)).fetchone()
                seen = int(row[0]) if row is not None else -1
            hi = conn.execute(sql.SQL("SELECT MAX(batch_id) FROM {} WHERE target = %s AND query_id = %s "
                                      "AND batch_id > %s").format(markers),
                              (self.table, self.query_id, batch_id)).fetchone()
            try:
                skip = self._check_replay(seen, None if hi is None else hi[0], batch_id, len(rows))
            except BaseException:
                conn.rollback()
                raise
            if skip:
                conn.rollback()
                return False
            if rows:
                ident = [sql.Identifier(c) for c in cols]
                keys = sql.SQL(", ").join(sql.Identifier(c) for c in self.key_columns)
                self._check_null_keys(conn, rows)
                non_keys = [c for c in cols if c not in self.key_columns]
                conflict: sql.Composable
                if non_keys and not self.keyed_by_coordinates():
                    conflict = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in non_keys))
                else:
                    conflict = sql.SQL("DO NOTHING")
                stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
                    target, sql.SQL(", ").join(ident),
                    sql.SQL(", ").join(sql.Placeholder() for _ in cols), keys, conflict)
                try:
                    with conn.cursor() as c:
                        c.executemany(stmt, [tuple(_plain_value(r.get(col)) for col in cols) for r in rows])
                        inserted = c.rowcount
                except psycopg.DataError as e:
                    self._explain_nul(rows, cols, e)
                    raise
                if self.keyed_by_coordinates() and inserted < len(rows):
                    self._check_stored(conn, cols, rows, batch_id)
            if can_prune:
                conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s AND query_id = %s AND batch_id <= %s").format(
                    markers), (self.table, self.query_id, batch_id - self.retain_batches))
            elif not self._warned_no_prune:
                self._warned_no_prune = True
                log.warning("database sink %r: no DELETE privilege on %s, so its markers of query %r are not pruned "
                            "(one row per batch is kept for ever)", self.table, self.markers, self.query_id)
            conn.commit()
            self._last_applied = batch_id
            return True

    def _check_stored(self, conn: Any, cols: list[str], rows: list[dict[str, Any]], batch_id: int) -> None:
        """Some rows met a stored row with their coordinates (the insert skipped them): each must have
        met its own values. Rows inserted just now match themselves; a later copy of a record in the
        same batch meets the first. One statement a row, pipelined; the key's unique index finds the
        stored row (``IS NOT DISTINCT FROM``, which no index serves, only for a NULL coordinate)."""
        from psycopg import sql

        non_keys = [c for c in cols if c not in self.key_columns]
        if not non_keys:
            return

        def statement(op: str) -> Any:
            return sql.SQL("SELECT {} FROM {} WHERE {} AND ({})").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in non_keys), _pg_ident(self.table),
                sql.SQL(" AND ").join(sql.SQL("{} " + op + " %s").format(sql.Identifier(c)) for c in self.key_columns),
                sql.SQL(" OR ").join(sql.SQL("{} IS DISTINCT FROM %s").format(sql.Identifier(c)) for c in non_keys))

        some_null = [any(r.get(k) is None for k in self.key_columns) for r in rows]
        for op, group in (("=", [r for r, null in zip(rows, some_null, strict=True) if not null]),
                          ("IS NOT DISTINCT FROM", [r for r, null in zip(rows, some_null, strict=True) if null])):
            if not group:
                continue
            with conn.cursor() as c:
                c.executemany(statement(op), [tuple(_plain_value(r.get(col)) for col in [*self.key_columns, *non_keys])
                                              for r in group], returning=True)
                for r in group:
                    stored = c.fetchone()
                    if stored is not None:
                        raise self._differing(cols, r, stored, batch_id)
                    c.nextset()

    def _create_tables(self, conn: Any, rows: list[dict[str, Any]], cols: list[str]) -> bool:
        """Creates the markers table and (for a batch with rows) the target table when the catalog
        lacks them, in a transaction of their own (a failed batch keeps them), under an advisory
        lock per table: PostgreSQL does not serialise concurrent ``CREATE TABLE IF NOT EXISTS`` of
        one name (the loser fails with a UniqueViolation on pg_type or DuplicateObject), so the
        first batches of queries starting together failed; behind the lock the loser sees the
        winner's table. True if this role may delete old markers."""
        from psycopg import sql

        current, have_markers, have_table, can_delete = conn.execute(
            "SELECT current_schema(), to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL, "
            "has_table_privilege(to_regclass(%s), 'DELETE')",
            (_pg_regclass_name(self.markers), _pg_regclass_name(self.table), _pg_regclass_name(self.markers))
        ).fetchone()
        schema = self.schema or current or ""
        if not have_markers:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ddl_lock_key(f"{schema}.{MARKERS}"),))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (target text, query_id text, batch_id bigint, "
                                 "rows bigint, PRIMARY KEY (target, query_id, batch_id))").format(
                                     _pg_ident(self.markers)))
        if rows and not have_table:
            col_defs = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(_pg_type(rows, c))) for c in cols)
            unique = "UNIQUE NULLS NOT DISTINCT" if conn.info.server_version >= 150000 else "PRIMARY KEY"
            conn.execute("SELECT pg_advisory_xact_lock(%s)",
                         (_ddl_lock_key(f"{schema}.{self.table.rpartition('.')[2]}"),))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, {} ({}))").format(
                _pg_ident(self.table), col_defs, sql.SQL(unique),
                sql.SQL(", ").join(sql.Identifier(c) for c in self.key_columns)))
        conn.commit()
        return can_delete is not False  # None: the markers table is new, this role owns it

    def _explain_nul(self, rows: list[dict[str, Any]], cols: list[str], error: Exception) -> None:
        """PostgreSQL text cannot hold the NUL character, which a Kafka value cast to a string may
        contain: psycopg's bare DataError named neither the table nor the column, and the batch
        fails again at every retry. Raises a ValueError that says where and what to do."""
        for r in rows:
            for col in cols:
                v = r.get(col)
                if isinstance(v, str) and "\x00" in v:
                    key = {k: r.get(k) for k in self.key_columns}
                    raise ValueError(
                        f"database sink {self.table!r}: column {col!r} of the row with key {key} holds a NUL "
                        f"character (\\x00), which PostgreSQL text cannot store; every retry of the batch fails "
                        f"the same way. Write the column as binary (Spark: CAST({col} AS BINARY); a new table "
                        f"gets a bytea column, an existing text column needs ALTER TABLE ... ALTER COLUMN {col} "
                        f"TYPE bytea USING convert_to({col}, 'UTF8')), or remove the NULs "
                        f"(regexp_replace({col}, '\\\\x00', ''))") from error

    def _check_null_keys(self, conn: Any, rows: list[dict[str, Any]]) -> None:
        """A clear error, before PostgreSQL's NotNullViolation, when a NULL key meets a key column
        that is NOT NULL (a PRIMARY KEY: a table created by an earlier version or on a server
        older than 15, or by hand)."""
        nulls = [c for c in self.key_columns if any(r.get(c) is None for r in rows)]
        if not nulls:
            return
        not_null = [name for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = ANY(%s) "
            "AND attnotnull", (_pg_regclass_name(self.table), nulls)).fetchall()]
        if not_null:
            raise ValueError(
                f"database sink {self.table!r}: key column(s) {not_null} are NULL in some rows but NOT NULL in "
                f"the table (a PRIMARY KEY: a table created by an earlier version of this sink, or on "
                f"PostgreSQL < 15, which has no UNIQUE NULLS NOT DISTINCT). On PostgreSQL 15+ make NULL a key "
                f"value: ALTER TABLE ... DROP CONSTRAINT <its primary key>, ADD UNIQUE NULLS NOT DISTINCT "
                f"({', '.join(self.key_columns)}), and ALTER COLUMN ... DROP NOT NULL for each key column; "
                f"or give the NULL keys a value (coalesce) or filter them out in the query")


def _ddl_lock_key(qualified_name: str) -> int:
    """A PostgreSQL advisory lock key (a signed bigint) for creating the table ``qualified_name``."""
    digest = hashlib.blake2b(f"oncelog.spark.db_sink create {qualified_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _pg_ident(name: str) -> Any:
    """``name`` (``table`` or ``schema.table``) as a psycopg identifier."""
    from psycopg import sql

    return sql.Identifier(*name.split("."))


def _pg_regclass_name(name: str) -> str:
    """``name`` (``table`` or ``schema.table``, plain identifiers) as ``to_regclass`` text, quoted."""
    return ".".join(f'"{part}"' for part in name.split("."))


def _shown(values: dict[str, Any]) -> str:
    text = repr(values)
    return text if len(text) <= 200 else text[:197] + "..."


def _plain_value(v: Any) -> Any:
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if v is None or isinstance(v, (int, float, str, bytes)):
        return v
    return str(v)


def _pg_type(rows: list[dict[str, Any]], col: str) -> str:
    sample = next((r[col] for r in rows if r.get(col) is not None), None)
    if isinstance(sample, bool):
        return "boolean"
    if isinstance(sample, int):
        return "bigint"
    if isinstance(sample, float):
        return "double precision"
    if isinstance(sample, (bytes, bytearray, memoryview)):
        return "bytea"
    return "text"


def database_sink(url: str, table: str, query_id: str, key_columns: Sequence[str] = KAFKA_COORDINATES,
                  fail_on_higher_committed_batch: bool = True, retain_batches: int = RETAIN_BATCHES) -> UpsertSink:
    """A sink for ``url``: ``sqlite:///path`` (or a bare path) or ``postgresql://…`` / ``postgres://…``.

    As in SQLAlchemy, ``sqlite:///name`` is the path ``name`` relative to the working directory
    (resolved when the sink is made) and ``sqlite:////dir/name`` the absolute ``/dir/name``; so
    ``sqlite:///tmp/x.db`` is ``./tmp/x.db``. In-memory databases (``sqlite://``,
    ``sqlite:///:memory:``) are refused: each batch would open a new one, so nothing would record
    the applied batches.

    Its identity is ``(table, query_id)``: several tables of one database may share a query id, but
    one table must be written once per batch under one query id — a second write of the batch is
    taken for a replay (union the DataFrames, or give each write its own query id).
    """
    scheme = urlsplit(url).scheme if "://" in url else ""
    strict = fail_on_higher_committed_batch
    if scheme in ("postgresql", "postgres"):
        return PostgresUpsertSink(url, table, query_id, key_columns, strict, retain_batches)
    if scheme == "sqlite":
        return SqliteUpsertSink(url[len("sqlite:///"):] if url.startswith("sqlite:///") else url[len("sqlite://"):],
                                table, query_id, key_columns, strict, retain_batches)
    if scheme:
        raise ValueError(f"unsupported database URL scheme {scheme!r}: use sqlite:///path or postgresql://…")
    return SqliteUpsertSink(url, table, query_id, key_columns, strict, retain_batches)
