"""`oncelog verify`: run the fault-injecting workload against a Kafka-protocol broker and check it.

Exit codes: 0 no anomaly, 1 anomalies found, 2 the workload could not run (a bad option, an
unreachable broker, a broker command that does not start, an unreadable history, anything
unexpected): then one line on stderr says why (``--debug`` adds the traceback); 3 inconclusive: no
anomaly, but the run did not test what it claims (faults asked for and none made, or every producer,
copier or reader idle while faults were active), each reason on a line of stderr.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from oncelog.cli_args import count, positive
from oncelog.verify.checker import check
from oncelog.verify.history import History, HistoryError
from oncelog.verify.proxy import FaultProxy
from oncelog.verify.report import print_table, write_html
from oncelog.verify.workload import (
    ALL_FAULTS,
    BrokerControl,
    Workload,
    WorkloadError,
    default_faults,
    unrunnable_faults,
)

EXIT_CLEAN, EXIT_ANOMALIES, EXIT_CANNOT_RUN, EXIT_INCONCLUSIVE = 0, 1, 2, 3


class UsageError(Exception):
    """A bad option (exit code 2)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    def one_line_error(message: str) -> NoReturn:
        print(f"error: oncelog verify: {message}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_RUN)

    p.error = one_line_error  # type: ignore[method-assign]
    p.add_argument("--bootstrap", help="HOST:PORT of the broker under test (omit with --broker-cmd)")
    p.add_argument("--broker-cmd", help="command that starts the broker in the foreground; '{port}' is replaced "
                                        "by a free port (enables broker-kill and broker-pause faults)")
    p.add_argument("--duration", type=positive(float), default=60.0,
                   help="seconds of workload before the drain and the final read (default 60)")
    p.add_argument("--drain-timeout", type=positive(float), default=90.0,
                   help="seconds the copiers get to catch up after the producers stop; the drain also ends "
                        "when their committed offsets stay still for min(this, 30) s (default 90)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults",
                   help=f"comma-separated, from {','.join(ALL_FAULTS)}; 'none' for no faults (default: "
                        "drop,reset,delay unless --no-proxy, zombie,crash unless --no-txn); a fault this run "
                        "cannot make is refused")
    p.add_argument("--txn", action=argparse.BooleanOptionalAction, default=True,
                   help="transactional producers and copiers (default) or idempotent producers only (--no-txn)")
    p.add_argument("--producers", type=count, default=3, help="transactional producers (default 3)")
    p.add_argument("--copiers", type=count, default=2,
                   help="consume-transform-produce copiers in one consumer group (default 2)")
    p.add_argument("--consumers", type=count, default=2, help="read-only consumers (default 2)")
    p.add_argument("--processes", type=positive(int), default=3,
                   help="worker processes the clients are spread over, as threads (default 3)")
    p.add_argument("--no-proxy", action="store_true", help="connect directly (no network faults)")
    p.add_argument("--report", type=Path, help="write an HTML report with a timeline here")
    p.add_argument("--history", type=Path, help="write the recorded history (JSON lines) here")
    p.add_argument("--check", type=Path, metavar="HISTORY",
                   help="run no workload: check a history recorded earlier with --history")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected failure")


def parse_bootstrap(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; a UsageError says what is wrong."""
    text = text.strip()
    if "," in text:
        raise UsageError(f"--bootstrap {text!r}: give one HOST:PORT (verify puts its fault proxy in front of it)")
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text:
        raise UsageError(f"--bootstrap {text!r}: expected HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--bootstrap {text!r}: the port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise UsageError(f"--bootstrap {text!r}: the port must be between 1 and 65535")
    return host, port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


class ManagedBroker:
    """The broker process verify started from --broker-cmd, so it can kill and pause it."""

    def __init__(self, template: str) -> None:
        self.port = _free_port()
        try:
            self.argv = shlex.split(template.replace("{port}", str(self.port)))
        except ValueError as exc:
            raise UsageError(f"--broker-cmd: {exc}") from None
        if not self.argv:
            raise UsageError("--broker-cmd is empty")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as exc:
            raise WorkloadError(f"the broker command cannot start: {exc}") from None
        if not _wait_port(self.port, 60, self.proc):
            code = self.proc.poll()
            why = f"exited with {code}" if code is not None else "is not listening after 60 s"
            raise WorkloadError(f"the broker command {why} (port {self.port}): {shlex.join(self.argv)}")

    def kill_and_restart(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.start()

    def pause(self, seconds: float) -> None:
        if self.proc is None:
            return
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _faults(args: argparse.Namespace) -> set[str]:
    """The faults to make: those named (each must be one this run can make: a fault skipped silently
    would still be named in the title), or the default set for this configuration."""
    if args.faults is None:
        return default_faults(proxy=not args.no_proxy, txn=args.txn)
    text = args.faults
    faults = set() if text == "none" else {f.strip() for f in text.split(",") if f.strip()}
    unknown = faults - set(ALL_FAULTS)
    if unknown:
        raise UsageError(f"unknown faults {sorted(unknown)}; choose from {', '.join(ALL_FAULTS)}")
    if args.check is None:
        why = unrunnable_faults(faults, proxy=not args.no_proxy, broker=bool(args.broker_cmd), txn=args.txn)
        if why:
            raise UsageError("--faults: " + "; ".join(why))
    return faults


def _record_history(args: argparse.Namespace, faults: set[str]) -> History:
    if not args.bootstrap and not args.broker_cmd:
        raise UsageError("give --bootstrap or --broker-cmd (or --check HISTORY)")
    if args.bootstrap and args.broker_cmd:
        raise UsageError("give --bootstrap or --broker-cmd, not both")
    if args.producers == 0:
        raise UsageError("--producers must be at least 1")
    target = parse_bootstrap(args.bootstrap) if args.bootstrap else None
    managed = ManagedBroker(args.broker_cmd) if args.broker_cmd else None
    proxy = None
    try:
        if managed is not None:
            managed.start()
            target = ("127.0.0.1", managed.port)
        assert target is not None
        shown = f"{target[0]}:{target[1]}"
        client_bootstrap = shown
        if not args.no_proxy:
            proxy = FaultProxy(*target, seed=args.seed).start()
            client_bootstrap = proxy.address
            shown = f"{shown} (through the fault proxy at {proxy.address})"
        control = BrokerControl(managed.kill_and_restart, managed.pause) if managed is not None else None
        from rich.console import Console
        from rich.markup import escape

        console = Console(stderr=True)
        with console.status("verify: starting") as status:
            workload = Workload(client_bootstrap, duration_s=args.duration, seed=args.seed, faults=faults,
                                txn=args.txn, proxy=proxy, broker=control, producers=args.producers,
                                copiers=args.copiers, consumers=args.consumers, processes=args.processes,
                                drain_s=args.drain_timeout,
                                display_bootstrap=shown, progress=lambda s: status.update(escape(f"verify: {s}")))
            return workload.run()
    finally:
        if proxy is not None:
            proxy.stop()
        if managed is not None:
            managed.stop()


def _write(path: Path, option: str, write: Callable[[Path], None]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def _run(args: argparse.Namespace) -> int:
    faults = _faults(args)
    if args.check is not None:
        if args.bootstrap or args.broker_cmd:
            raise UsageError("--check reads a recorded history: give neither --bootstrap nor --broker-cmd")
        history = History.load(args.check)
        if not any(items for _kind, items in history.items()):
            # Nothing to check is not a pass: a recording that failed, or not a history file at all.
            raise HistoryError(f"{args.check} holds no history entry (no send, transaction, poll, offsets, "
                               "fault or error line): nothing to check")
        title = f"oncelog verify --check {args.check}"
    else:
        history = _record_history(args, faults)
        title = f"oncelog verify (seed {args.seed}, faults {','.join(sorted(faults)) or 'none'})"
        if args.history:
            _write(args.history, "--history", history.dump)  # before checking: it survives whatever follows
            print(f"history written to {args.history} (oncelog verify --check {args.history} checks it again)",
                  file=sys.stderr)
    report = check(history)
    print_table(report, title)
    for error in history.meta.get("errors") or []:
        print(f"warning: {error}", file=sys.stderr)
    if args.report:
        _write(args.report, "--report", lambda path: write_html(path, history, report, title))
    if not report.ok:
        return EXIT_ANOMALIES
    if history.meta.get("errors"):
        print("error: the workload did not run to the end (see the warnings); no anomaly found in what ran",
              file=sys.stderr)
        return EXIT_CANNOT_RUN
    if report.inconclusive:
        for why in report.inconclusive:
            print(f"inconclusive: no anomaly found, but {why}", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    return EXIT_CLEAN


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (UsageError, WorkloadError, HistoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except Exception as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        where = "" if getattr(args, "debug", False) else " (--debug shows the traceback)"
        print(f"error: verify failed unexpectedly: {type(exc).__name__}: {exc}{where}", file=sys.stderr)
        return EXIT_CANNOT_RUN
