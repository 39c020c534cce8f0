"""Two brokers on one data directory would interleave appends and corrupt it: the second refuses to
start with a clear message, and a killed broker's lock does not outlive it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.server.broker import DataDirInUseError
from oncelog.testing.broker_process import free_port, oncelog_broker
from tests.inproc import InProcessBroker


def test_second_broker_on_the_same_data_dir_exits_with_a_message(tmp_path: Path) -> None:
    data = tmp_path / "d"
    first = oncelog_broker(data, log_path=tmp_path / "first.log").start()
    try:
        r = subprocess.run([sys.executable, "-m", "oncelog", "broker", "--data-dir", str(data),
                            "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert "in use by another broker" in r.stderr and str(data) in r.stderr
        assert f"pid {first.proc.pid}" in r.stderr  # type: ignore[union-attr]
    finally:
        first.kill()
    # the kernel dropped the killed broker's lock: a new broker starts on the directory
    again = oncelog_broker(data, log_path=tmp_path / "again.log").start()
    again.kill()


def test_in_process_brokers_share_the_lock(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d")
    with pytest.raises(DataDirInUseError):
        InProcessBroker(tmp_path / "d")
    b.close()
    InProcessBroker(tmp_path / "d").close()
