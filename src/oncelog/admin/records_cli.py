"""`oncelog records delete`: DeleteRecords against any Kafka broker (librdkafka's AdminClient), like
kafka-delete-records.sh: every record of a partition before an offset goes, and the partition's
log start offset (low watermark) moves there. `--before -1` deletes up to the high watermark."""

from __future__ import annotations

import argparse

from oncelog.admin.common import EXIT_OK, EXIT_USAGE, add_bootstrap, admin_client, fail, metadata


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = sub.add_parser("delete", help="delete the records of a partition before an offset")
    d.add_argument("--topic", required=True)
    d.add_argument("--partition", type=int, required=True)
    d.add_argument("--before", type=int, required=True, metavar="OFFSET",
                   help="delete records below this offset (-1: up to the high watermark)")
    add_bootstrap(d)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, TopicPartition

    if args.action != "delete":
        return fail(f"unknown action {args.action}", EXIT_USAGE)
    if args.partition < 0:
        return fail("--partition must be >= 0", EXIT_USAGE)
    if args.before < -1:
        return fail("--before must be an offset >= 0, or -1 for the high watermark", EXIT_USAGE)
    admin = admin_client(args)  # must outlive the futures
    metadata(args, admin)
    tp = TopicPartition(args.topic, args.partition, args.before)
    try:
        futures = admin.delete_records([tp], request_timeout=args.timeout, operation_timeout=args.timeout)
        result = next(iter(futures.values())).result()
    except KafkaException as exc:
        return fail(f"cannot delete records of {args.topic}-{args.partition}: {exc.args[0].str()}")
    print(f"deleted records of {args.topic}-{args.partition} before offset "
          f"{result.low_watermark}; low watermark now {result.low_watermark}")
    return EXIT_OK
