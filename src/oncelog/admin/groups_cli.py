"""`oncelog groups list|describe` against any Kafka broker: members, assignments, committed offsets, lag."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.admin.common import EXIT_OK, add_bootstrap, admin_client, fail, metadata


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="consumer groups and their states")
    add_bootstrap(ls)
    d = sub.add_parser("describe", help="members, assignments, committed offsets and lag")
    d.add_argument("group")
    add_bootstrap(d)


def _table(rows: list[list[Any]], header: list[str], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(*header, title=title)
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console().print(t)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    admin = admin_client(args)
    metadata(args, admin)
    try:
        if args.action == "list":
            res = admin.list_consumer_groups(request_timeout=args.timeout).result()
            groups = sorted(res.valid, key=lambda g: g.group_id)
            _table([[g.group_id, g.state.name if g.state else "?"] for g in groups], ["Group", "State"])
            if res.errors:  # a broker that did not answer: the list above may lack its groups
                return fail("; ".join(e.str() for e in res.errors))
            return EXIT_OK
        desc = admin.describe_consumer_groups([args.group], request_timeout=args.timeout)[args.group].result()
        members = []
        for m in desc.members:
            assigned = m.assignment.topic_partitions if m.assignment else []
            names = ",".join(f"{tp.topic}-{tp.partition}" for tp in assigned)
            members.append([m.member_id, m.client_id, m.host, names])
        _table(members, ["MemberId", "ClientId", "Host", "Assignment"],
               title=f"group {args.group}: {desc.state.name if desc.state else '?'}, "
                     f"protocol {desc.partition_assignor or '-'}")
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(args.group)],
                                                    request_timeout=args.timeout)[args.group].result()
        probe = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "oncelog-groups-cli", "log_level": 0})
        rows = []
        try:
            for tp in sorted(offsets.topic_partitions, key=lambda t: (t.topic, t.partition)):
                _low, high = probe.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=args.timeout)
                lag = high - tp.offset if tp.offset >= 0 else "-"
                rows.append([tp.topic, tp.partition, tp.offset, high, lag])
        finally:
            probe.close()
        _table(rows, ["Topic", "Partition", "CommittedOffset", "LogEndOffset", "Lag"])
        return EXIT_OK
    except KafkaException as exc:
        return fail(f"{exc.args[0].str()}")
