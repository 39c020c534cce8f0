"""The broker's topics.json, lost or damaged. Without it every partition directory looked like a
deleted topic's, and the broker removed them all, internal logs included (found by an adversarial
probe of on-disk damage). Now it refuses to start while a partition directory holds records, and
names the file; a data directory whose partitions hold nothing (a first start cut short) still
starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from oncelog.clock import ManualClock
from oncelog.storage.config import LogConfig
from oncelog.storage.errors import StorageError
from oncelog.storage.log_manager import LogManager
from oncelog.testing.broker_process import create_topic, free_port, oncelog_broker
from tests.storage.helpers import batch


def test_a_missing_topics_file_refuses_to_start_while_partitions_hold_records(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.create_topic("t", 2, {})
    plog = logs.get_partition("t", 1)
    assert plog is not None
    plog.append(batch(3))
    logs.close()
    meta = tmp_path / "__meta" / "topics.json"
    saved = meta.read_bytes()
    meta.unlink()
    with pytest.raises(StorageError, match=r"topics\.json is missing, but 1 partition directories hold records"):
        LogManager(tmp_path, LogConfig(), ManualClock())
    assert (tmp_path / "t-1").is_dir() and (tmp_path / "t-0").is_dir()  # nothing was removed
    meta.write_bytes(saved)
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    assert logs.get_partition("t", 1).log_end_offset == 3  # type: ignore[union-attr]
    logs.close()


def test_without_topics_file_and_without_records_the_broker_starts_afresh(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.create_topic("t", 1, {})  # its directory and an empty segment, as a first start cut short leaves them
    logs.close()
    (tmp_path / "__meta" / "topics.json").unlink()
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    assert logs.topics() == {} and not (tmp_path / "t-0").exists()
    logs.close()


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"topics": [{"name": "t"}]}', b'{"topics": 5}'])
def test_a_corrupt_topics_file_names_itself(tmp_path: Path, damage: bytes) -> None:
    LogManager(tmp_path, LogConfig(), ManualClock()).close()
    (tmp_path / "__meta" / "topics.json").write_bytes(damage)
    with pytest.raises(StorageError, match=r"topics.json is corrupt .*restore it"):
        LogManager(tmp_path, LogConfig(), ManualClock())


def test_the_broker_command_refuses_to_start_without_its_topics_file(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d").start()
    try:
        create_topic(b.bootstrap, "kept", 1)
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce("kept", b"v")
        assert p.flush(10) == 0
        del p  # no client left retrying a broker that is gone
    finally:
        b.stop()
    (tmp_path / "d" / "__meta" / "topics.json").unlink()
    done = subprocess.run([sys.executable, "-m", "oncelog", "broker", "--data-dir", str(tmp_path / "d"),
                           "--listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "cannot start" in done.stderr and "topics.json is missing" in done.stderr, done.stderr[-2000:]
    assert (tmp_path / "d" / "kept-0").is_dir()


def _abandon(logs: LogManager) -> None:
    """A crash: nothing flushed or closed."""
    for plog in logs.partitions().values():
        for seg in plog.segments:
            seg.abandon()


def test_an_unknown_directory_with_records_is_moved_aside_not_removed(tmp_path: Path) -> None:
    """A directory named like a partition of no known topic (an operator's copy, ``backup-0``) was
    removed at start with its records. Kafka moves such a stray log aside (``-stray``) and never
    deletes it; an unknown directory without records (a creation a crash cut short) still goes."""
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.create_topic("backup", 1, {})
    plog = logs.get_partition("backup", 0)
    assert plog is not None
    plog.append(batch(3))
    logs.create_topic("empty", 1, {})
    logs.close()
    copy = (tmp_path / "backup-0").rename(tmp_path / "copy-0")
    (tmp_path / "empty-0").rename(tmp_path / "leftover-0")
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.close()
    assert not copy.exists() and not (tmp_path / "leftover-0").exists()
    [aside] = [d for d in tmp_path.iterdir() if d.name.startswith("copy-0.")]
    assert aside.name.endswith("-stray") and any(f.stat().st_size > 0 for f in aside.glob("*.log"))
    assert LogManager(tmp_path, LogConfig(), ManualClock()).get_partition("backup", 0) is not None  # starts again


def test_a_deletion_cut_short_is_finished_at_the_next_start(tmp_path: Path) -> None:
    """A deleted topic leaves topics.json first and its directories later (off the event loop): a
    crash in between leaves directories with records that topics.json lists as being deleted, and
    the next start removes them (they are not moved aside as strays)."""
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.create_topic("gone", 2, {})
    plog = logs.get_partition("gone", 1)
    assert plog is not None
    plog.append(batch(3))
    logs.detach_topic("gone")  # and the process dies before remove_topic_files
    _abandon(logs)
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    assert not any(d.name.startswith("gone-") for d in tmp_path.iterdir())
    logs.create_topic("gone", 1, {})  # the name is free, its list entry does not touch the new topic
    logs.close()
    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    assert logs.get_partition("gone", 0) is not None and (tmp_path / "gone-0").is_dir()
    logs.close()
