"""A throwaway PostgreSQL server for tests: ``initdb`` in a temporary directory, loopback, trust auth.

Uses the server binaries of Debian's ``postgresql`` package (``/usr/lib/postgresql/<v>/bin``) or
whatever ``initdb`` is on ``PATH``. PostgreSQL refuses to run as root, so when the tests run as
root the cluster is owned by and run as the unprivileged ``postgres`` account (created by the
Debian package). :func:`find_postgres` says why a server cannot be started, for a skip reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.testing.broker_process import free_port


@dataclass
class PostgresInstall:
    bin_dir: Path
    run_as: str | None  # None: the current (non-root) user


def find_postgres() -> tuple[PostgresInstall | None, str]:
    """The binaries and the user to run them as, or None and the reason."""
    candidates = []
    which = shutil.which("initdb")
    if which:
        candidates.append(Path(os.path.realpath(which)).parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    bin_dir = next((d for d in candidates if (d / "initdb").exists() and (d / "postgres").exists()), None)
    if bin_dir is None:
        return None, "PostgreSQL server binaries not found (Debian: apt-get install postgresql)"
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None, "running as root and there is no unprivileged 'postgres' account to run PostgreSQL"
        run_as = "postgres"
    return PostgresInstall(bin_dir, run_as), ""


@dataclass
class PostgresServer:
    """``start()`` creates and starts a cluster; ``url`` is a psycopg URL; ``stop()`` removes it all."""

    install: PostgresInstall
    port: int = field(default_factory=free_port)
    user: str = "oncelog"
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="oncelog-pg-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        r = subprocess.run([str(self.install.bin_dir / args[0]), *args[1:]], capture_output=True,
                           user=self.install.run_as, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {r.stderr.decode(errors='replace')[-2000:]}")

    def start(self, timeout_s: float = 60) -> PostgresServer:
        data, sock = self.base / "data", self.base / "sock"
        sock.mkdir()
        if self.install.run_as:
            pw = pwd.getpwnam(self.install.run_as)
            for p in (self.base, sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(data), "-U", self.user, "--auth=trust", "--encoding=UTF8", "--no-sync")
        log = open(self.base / "postgres.log", "wb")  # noqa: SIM115 - kept open for the server's life
        self.proc = subprocess.Popen(
            [str(self.install.bin_dir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(sock),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off"],
            stdout=log, stderr=subprocess.STDOUT, user=self.install.run_as, start_new_session=True)
        log.close()
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.base / 'postgres.log').read_text()[-2000:]}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: "smart" shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)
