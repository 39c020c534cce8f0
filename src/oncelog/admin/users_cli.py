"""`oncelog users add|list|delete`: SCRAM users in a broker's data directory, while the broker is stopped.

This is how the first (super) user exists before a broker with ``--sasl`` starts, as Kafka's
``kafka-storage.sh format --add-scram``. A running broker holds the data directory's lock, and then
``add`` and ``delete`` refuse (exit 1): manage users on a running broker over the protocol instead
(AdminClient's alter_user_scram_credentials, i.e. AlterUserScramCredentials).

The password is read from stdin (one line, ``--password-stdin``) or prompted for on a terminal;
it is never a command-line argument, so it does not show in ``ps`` or the shell history. Only its
salted hashes are stored (``<data_dir>/__meta/users.json``).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="create a user, or set a new password for an existing one")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin (one line)")
    add.add_argument("--mechanism", default="all", choices=["SCRAM-SHA-256", "SCRAM-SHA-512", "all"],
                     help="which SCRAM credentials to create (default: all; PLAIN logins use either)")
    add.add_argument("--iterations", type=int, default=None, help="PBKDF2 iterations, 4096-16384 (default 4096)")
    add.add_argument("--data-dir", type=Path, required=True)
    lst = sub.add_parser("list", help="list users and their SCRAM mechanisms (never the keys)")
    lst.add_argument("--data-dir", type=Path, required=True)
    delete = sub.add_parser("delete", help="delete a user (all its credentials, or one mechanism's)")
    delete.add_argument("name")
    delete.add_argument("--mechanism", default="all", choices=["SCRAM-SHA-256", "SCRAM-SHA-512", "all"])
    delete.add_argument("--data-dir", type=Path, required=True)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"oncelog users: {message}", file=sys.stderr)
    return code


def _read_password(args: argparse.Namespace) -> str | None:
    if args.password_stdin:
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    if not sys.stdin.isatty():
        return None
    first = getpass.getpass(f"Password for {args.name}: ")
    if getpass.getpass("Again: ") != first:
        raise ValueError("the two passwords differ")
    return first


def run(args: argparse.Namespace) -> int:
    from oncelog.security import scram
    from oncelog.security.credentials import CredentialStore, validate_username
    from oncelog.server.broker import DataDirInUseError, lock_data_dir

    data_dir: Path = args.data_dir
    mechanisms = list(scram.MECHANISMS.values()) if getattr(args, "mechanism", "all") == "all" else \
        [scram.MECHANISMS[args.mechanism]]
    if args.action == "list":
        if not data_dir.is_dir():
            return _fail(f"no data directory {data_dir}")
        try:
            users = CredentialStore(data_dir).users()
        except ValueError as exc:
            return _fail(str(exc))
        for name, creds in sorted(users.items()):
            detail = ", ".join(f"{m} ({c.iterations} iterations)" for m, c in sorted(creds.items()))
            print(f"{name}\t{detail}")
        if not users:
            print("(no users)", file=sys.stderr)
        return EXIT_OK

    problem = validate_username(args.name)
    if problem is not None:
        return _fail(problem, EXIT_USAGE)
    password = ""
    if args.action == "add":
        iterations = scram.DEFAULT_ITERATIONS if args.iterations is None else args.iterations
        lo, hi = scram.SCRAM_SHA_256.min_iterations, scram.SCRAM_SHA_256.max_iterations
        if not lo <= iterations <= hi:
            return _fail(f"--iterations must be between {lo} and {hi} (Kafka's limits)", EXIT_USAGE)
        try:
            read = _read_password(args)
        except ValueError as exc:
            return _fail(str(exc), EXIT_USAGE)
        if read is None:
            return _fail("give the password on stdin with --password-stdin", EXIT_USAGE)
        if not read:
            return _fail("the password must not be empty", EXIT_USAGE)
        password = read

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = lock_data_dir(data_dir)
    except DataDirInUseError as exc:
        return _fail(f"{exc}. A running broker manages its users itself: use AlterUserScramCredentials "
                     "(e.g. confluent_kafka AdminClient.alter_user_scram_credentials) instead")
    try:
        store = CredentialStore(data_dir)
        if args.action == "add":
            existed = args.name in store.users()
            store.alter(upsertions=[(args.name, m, scram.ScramCredential.from_password(m, password, iterations))
                                    for m in mechanisms])
            names = ", ".join(m.name for m in mechanisms)
            print(f"{'updated' if existed else 'created'} user {args.name} ({names}, {iterations} iterations)")
            return EXIT_OK
        existing = store.users().get(args.name, {})
        doomed = [m for m in mechanisms if m.name in existing]
        if not doomed:
            return _fail(f"user {args.name} has no {' or '.join(m.name for m in mechanisms)} credential")
        store.alter(deletions=[(args.name, m) for m in doomed])
        print(f"deleted {', '.join(m.name for m in doomed)} of user {args.name}")
        return EXIT_OK
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    finally:
        os.close(lock)
