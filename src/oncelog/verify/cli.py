"""`oncelog verify`: run the fault-injecting workload against a Kafka-protocol broker and check it.

Exit codes: 0 no anomaly, 1 anomalies found, 2 the workload could not run.
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
from pathlib import Path

from oncelog.verify.checker import check
from oncelog.verify.proxy import FaultProxy
from oncelog.verify.report import print_table, write_html
from oncelog.verify.workload import ALL_FAULTS, BrokerControl, Workload, WorkloadError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="HOST:PORT of the broker under test (omit with --broker-cmd)")
    p.add_argument("--broker-cmd", help="command that starts the broker in the foreground; '{port}' is replaced "
                                        "by a free port (enables broker-kill and broker-pause faults)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of workload (default 20)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", default="drop,reset,delay,zombie,crash",
                   help=f"comma-separated, from {','.join(ALL_FAULTS)}; 'none' for no faults")
    p.add_argument("--txn", action=argparse.BooleanOptionalAction, default=True,
                   help="transactional producers (default) or idempotent ones (--no-txn)")
    p.add_argument("--no-proxy", action="store_true", help="connect directly (no network faults)")
    p.add_argument("--report", type=Path, help="write an HTML report with a timeline here")
    p.add_argument("--history", type=Path, help="write the recorded history (JSON lines) here")


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
        self.argv = shlex.split(template.replace("{port}", str(self.port)))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        if not _wait_port(self.port, 60, self.proc):
            raise WorkloadError(f"the broker command did not start listening on port {self.port}: {self.argv}")

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
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run(args: argparse.Namespace) -> int:
    faults = set() if args.faults == "none" else {f.strip() for f in args.faults.split(",") if f.strip()}
    unknown = faults - set(ALL_FAULTS)
    if unknown:
        print(f"error: unknown faults {sorted(unknown)}; choose from {', '.join(ALL_FAULTS)}", file=sys.stderr)
        return 2
    if not args.bootstrap and not args.broker_cmd:
        print("error: give --bootstrap or --broker-cmd", file=sys.stderr)
        return 2
    managed = ManagedBroker(args.broker_cmd) if args.broker_cmd else None
    proxy = None
    try:
        if managed is not None:
            managed.start()
            target = ("127.0.0.1", managed.port)
        else:
            host, _, port = str(args.bootstrap).rpartition(":")
            target = (host, int(port))
        client_bootstrap = f"{target[0]}:{target[1]}"
        if not args.no_proxy:
            proxy = FaultProxy(*target, seed=args.seed).start()
            client_bootstrap = proxy.address
        control = BrokerControl(managed.kill_and_restart, managed.pause) if managed is not None else None
        from rich.console import Console

        console = Console(stderr=True)
        with console.status("verify: starting") as status:
            workload = Workload(client_bootstrap, duration_s=args.duration, seed=args.seed, faults=faults,
                                txn=args.txn, proxy=proxy, broker=control, progress=lambda s: status.update(s))
            history = workload.run()
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if proxy is not None:
            proxy.stop()
        if managed is not None:
            managed.stop()
    report = check(history)
    title = f"oncelog verify (seed {args.seed}, faults {','.join(sorted(faults)) or 'none'})"
    print_table(report, title)
    if args.history:
        history.dump(args.history)
    if args.report:
        write_html(args.report, history, report, title)
    return 0 if report.ok else 1
