"""`oncelog transactions list|describe|find-hanging|abort` (KIP-664), like kafka-transactions.sh."""

from __future__ import annotations

import argparse
import time
from typing import Any

from oncelog.admin.common import EXIT_OK, add_bootstrap, fail
from oncelog.admin.raw_client import KafkaProtocolError, RawClient

DESCRIBE_PRODUCERS = (61, (0, 0))
DESCRIBE_TRANSACTIONS = (65, (0, 0))
LIST_TRANSACTIONS = (66, (0, 1))
WRITE_TXN_MARKERS = (27, (1, 1))
METADATA = (3, (1, 12))


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="transactional ids known to the coordinator")
    ls.add_argument("--state", action="append", default=[], help="only these states (repeatable)")
    add_bootstrap(ls)
    d = sub.add_parser("describe", help="state, producer id/epoch, partitions of a transactional id")
    d.add_argument("--transactional-id", required=True)
    add_bootstrap(d)
    f = sub.add_parser("find-hanging", help="open transactions in partitions that the coordinator does not "
                                            "know or that outlived the maximum transaction timeout")
    f.add_argument("--topic", help="only this topic (default: all)")
    f.add_argument("--max-transaction-timeout-ms", type=int, default=900_000)
    add_bootstrap(f)
    a = sub.add_parser("abort", help="abort a hanging transaction by writing an ABORT marker")
    a.add_argument("--topic", required=True)
    a.add_argument("--partition", type=int, required=True)
    a.add_argument("--producer-id", type=int, required=True)
    a.add_argument("--producer-epoch", type=int, required=True)
    a.add_argument("--coordinator-epoch", type=int, default=0)
    add_bootstrap(a)


def _table(rows: list[list[Any]], header: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(*header)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console().print(t)


def _hanging(client: RawClient, args: argparse.Namespace) -> list[list[Any]]:
    md = client.request(*METADATA, {"topics": None if not args.topic else [{"name": args.topic}],
                                    "allow_auto_topic_creation": False})
    req = [{"name": t.name, "partition_indexes": [p.partition_index for p in t.partitions]}
           for t in md.topics if t.error_code == 0 and not t.name.startswith("__")]
    if not req:
        return []
    producers = client.request(*DESCRIBE_PRODUCERS, {"topics": req})
    listed = client.request(*LIST_TRANSACTIONS, {"state_filters": [], "producer_id_filters": [],
                                                 "duration_filter": -1})
    by_pid = {t.producer_id: t.transactional_id for t in listed.transaction_states}
    ongoing: dict[int, set[tuple[str, int]]] = {}
    if by_pid:
        desc = client.request(*DESCRIBE_TRANSACTIONS, {"transactional_ids": list(by_pid.values())})
        for s in desc.transaction_states:
            if s.transaction_state == "Ongoing":
                ongoing[s.producer_id] = {(t.topic, p) for t in s.topics for p in t.partitions}
    now = int(time.time() * 1000)
    rows = []
    for t in producers.topics:
        for p in t.partitions:
            for prod in p.active_producers:
                if prod.current_txn_start_offset < 0:
                    continue
                known = (t.name, p.partition_index) in ongoing.get(prod.producer_id, set())
                age = now - prod.last_timestamp
                if not known or age > args.max_transaction_timeout_ms:
                    rows.append([t.name, p.partition_index, prod.producer_id, prod.producer_epoch,
                                 prod.coordinator_epoch, prod.current_txn_start_offset, age])
    return rows


def run(args: argparse.Namespace) -> int:
    try:
        with RawClient(args.bootstrap, args.timeout) as client:
            if args.action == "list":
                resp = client.request(*LIST_TRANSACTIONS, {"state_filters": args.state, "producer_id_filters": [],
                                                           "duration_filter": -1})
                _table([[t.transactional_id, t.producer_id, t.transaction_state]
                        for t in sorted(resp.transaction_states, key=lambda t: t.transactional_id)],
                       ["TransactionalId", "ProducerId", "TransactionState"])
                return EXIT_OK
            if args.action == "describe":
                resp = client.request(*DESCRIBE_TRANSACTIONS, {"transactional_ids": [args.transactional_id]})
                [s] = resp.transaction_states
                if s.error_code != 0:
                    return fail(f"{args.transactional_id}: {s.error_code.name}")
                parts = ",".join(f"{t.topic}-{p}" for t in s.topics for p in t.partitions)
                start = int(s.transaction_start_time.timestamp() * 1000)
                _table([[s.transactional_id, s.producer_id, s.producer_epoch, s.transaction_state,
                         int(s.transaction_timeout.total_seconds() * 1000), start, parts or "-"]],
                       ["TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                        "TransactionTimeoutMs", "TransactionStartTimeMs", "TopicPartitions"])
                return EXIT_OK
            if args.action == "find-hanging":
                rows = _hanging(client, args)
                _table(rows, ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                              "StartOffset", "AgeMs"])
                return EXIT_OK
            if args.action == "abort":
                resp = client.request(*WRITE_TXN_MARKERS, {"markers": [{
                    "producer_id": args.producer_id, "producer_epoch": args.producer_epoch,
                    "transaction_result": False, "coordinator_epoch": args.coordinator_epoch,
                    "topics": [{"name": args.topic, "partition_indexes": [args.partition]}]}]})
                code = resp.markers[0].topics[0].partitions[0].error_code
                if code != 0:
                    return fail(f"abort refused: {code.name}")
                print(f"wrote ABORT marker for producer {args.producer_id} to {args.topic}-{args.partition}")
                return EXIT_OK
    except KafkaProtocolError as exc:
        return fail(str(exc))
    return fail(f"unknown action {args.action}")
