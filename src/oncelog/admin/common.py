"""Shared helpers of the admin CLIs: an AdminClient for --bootstrap, error reporting, exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK = 0
EXIT_KAFKA_ERROR = 1
EXIT_USAGE = 2


def add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", "--bootstrap-server", dest="bootstrap", default="127.0.0.1:9092",
                   help="HOST:PORT of any broker (default 127.0.0.1:9092)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the broker")


def admin_client(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": args.bootstrap, "socket.timeout.ms": int(args.timeout * 1000),
                        "log_level": 0})


def metadata(args: argparse.Namespace, admin: Any = None) -> Any:
    """The cluster's metadata through ``admin`` (or a new AdminClient), which proves a broker is
    reachable; exits with a message naming the address when none answers within ``--timeout``
    (librdkafka's admin calls that do not need a broker's answer, such as listing groups, would
    otherwise report an empty cluster)."""
    from confluent_kafka import KafkaException

    try:
        return (admin or admin_client(args)).list_topics(timeout=args.timeout)
    except KafkaException as exc:
        raise SystemExit(fail(f"cannot reach a broker at {args.bootstrap}: {exc.args[0].str()}")) from None


def fail(message: str, code: int = EXIT_KAFKA_ERROR) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code
