"""The `oncelog` command line: each subcommand lives beside the code it drives.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int`` (the exit code).
Modules are imported only when their subcommand runs, so ``oncelog broker`` never imports Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("oncelog.server.cli", "run the Kafka-compatible broker in the foreground"),
    "topics": ("oncelog.admin.topics_cli", "create, list, describe, alter or delete topics on a running broker"),
    "records": ("oncelog.admin.records_cli", "delete a partition's records before an offset (DeleteRecords)"),
    "groups": ("oncelog.admin.groups_cli", "list or describe consumer groups on a running broker"),
    "transactions": ("oncelog.admin.transactions_cli", "list, describe, find-hanging or abort transactions"),
    "users": ("oncelog.admin.users_cli", "add, list or delete SCRAM users in a stopped broker's data directory"),
    "demo": ("oncelog.demo.cli", "run the exactly-once pipeline under injected faults and report"),
    "verify": ("oncelog.verify.cli", "run a fault-injecting workload against a broker and check its history"),
    "bench": ("oncelog.bench.cli", "measure throughput side by side"),
}


def _without_test_only_imports() -> None:
    """Keep hypothesis out of a command's process: kio imports it, when it is installed, only to
    register test strategies for its types, which no command uses. A development install (the
    test suite's) has it, and the import cost each broker start about 0.3 s. In process (a test
    calling ``main`` with its own argv) nothing changes: pytest has imported hypothesis already."""
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def _load(name: str):
    return importlib.import_module(SUBCOMMANDS[name][0])


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oncelog", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, (_module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            _load(name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        _without_test_only_imports()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    rc = _load(args.command).run(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
