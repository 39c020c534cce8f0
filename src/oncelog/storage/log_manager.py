"""All partition logs of a broker, and the topic metadata that says which exist.

``<data_dir>/__meta/topics.json`` is the source of truth for topics (name, topic id, partition count,
config overrides, internal flag); it is replaced atomically (write, fsync, rename, fsync dir) on each
change, before/after the directories as needed so a crash leaves either the old or the new topic
set: a created topic's directories are made before it is listed; a deleted topic is unlisted
(its directories named in the file's ``deleting`` list) before its directories are removed. At a
start, unlisted directories that a deletion names or that hold no record are removed; any other
unlisted directory with records is moved aside (``<name>.<id>-stray``), as Kafka does with strays.

Only the broker's event loop thread calls the log manager.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.clock import Clock
from oncelog.storage import descriptors, fileio, recovery_checkpoint
from oncelog.storage.config import (
    BrokerLayers,
    DescribedConfig,
    LogConfig,
    check_combination,
    describe_topic_configs,
    parse_broker_configs,
    parse_topic_configs,
)
from oncelog.storage.errors import (
    DiskFullError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    PartitionsNotBuiltError,
    StorageError,
    TopicExistsError,
)
from oncelog.storage.flush_job import FlushJob
from oncelog.storage.log_cleaner import CleanerConfig, CleanJob, LogCleanerManager
from oncelog.storage.partition_log import LogDirState, PartitionLog
from oncelog.storage.producer_state import ProducerStateBound

# A flush pass encodes the producer-state snapshots of this many entries at most (``begin_flush_pass``).
SNAPSHOT_PASS_ENTRIES = 20_000

log = logging.getLogger("oncelog.storage")

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
MAX_PARTITIONS = 10_000
#: What a new partition's first files take on disk, at most, for :meth:`LogManager.check_room`.
PARTITION_FILES_BYTES = 4096


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    is_internal: bool = False


def _holds_records(directory: Path) -> bool:
    """A partition directory with a non-empty segment."""
    return any(f.stat().st_size > 0 for f in directory.glob("*.log"))


def _is_dir_of(dir_name: str, topic: str) -> bool:
    return re.fullmatch(re.escape(topic) + r"-\d+", dir_name) is not None


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidTopicError(f"topic name is longer than {MAX_TOPIC_NAME} characters")
    if not _LEGAL.match(name):
        raise InvalidTopicError(f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_', '-'")


@dataclass
class DetachedTopic:
    """A deleted topic whose files are still to remove (``LogManager.detach_topic``)."""

    name: str
    directories: list[Path]
    flushes: list[FlushJob]  # flushes running on its partitions when it was detached


class LogManager:
    def __init__(self, data_dir: Path, default_config: LogConfig, clock: Clock,
                 cleaner_config: CleanerConfig | None = None, *,
                 producer_bound: ProducerStateBound | None = None) -> None:
        self.data_dir = data_dir
        self.cleaner = LogCleanerManager(cleaner_config or CleanerConfig())
        self.default_config = default_config
        self.clock = clock
        self.meta_dir = data_dir / "__meta"
        fileio.fs.mkdir(self.meta_dir)
        self.dir_state = LogDirState()
        self.dir_state.producer_bound = producer_bound
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], PartitionLog] = {}
        # Names whose partitions are being built off the loop (``reserve_topic``): taken, not visible.
        self._creating: set[str] = set()
        # Directories of deleted topics not yet removed (topics.json's "deleting"): a start removes
        # those it finds, and moves other unknown directories with records aside.
        self._deleting: set[str] = set()
        self.broker_configs = self._load_broker_configs()
        self._defaults = self.broker_configs.effective_defaults()
        self.leader_epoch = 0
        self._meta_bytes = 0  # topics.json's size at the last load or save (``check_room``)
        self._load()
        self._take_leadership()

    # --- metadata --------------------------------------------------------------------------------
    def _meta_path(self) -> Path:
        return self.meta_dir / "topics.json"

    def _load(self) -> None:
        """Load topics.json and every partition it names; remove a partition directory it does not
        name (a topic deleted, or one whose creation a crash cut short). Without topics.json the
        data directory must hold no records: otherwise every partition of it would be removed as
        unknown, so the broker refuses to start instead (the file must be restored)."""
        path = self._meta_path()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = None
            holding = self._partitions_holding_records()
            if holding:
                raise StorageError(
                    f"{path} is missing, but {len(holding)} partition directories hold records (such as "
                    f"{holding[0]}): without it they would be taken for deleted topics and removed. Restore "
                    "it (a backup, or the file of the broker this data directory belongs to) and start again") \
                    from None
        try:
            doc = json.loads(raw) if raw is not None else {"topics": []}
            self._meta_bytes = len(raw or b"")
            for t in doc["topics"]:
                info = TopicInfo(t["name"], uuid.UUID(t["topic_id"]), int(t["num_partitions"]),
                                 dict(t["configs"]), bool(t.get("internal", False)))
                self._topics[info.name] = info
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{path} is corrupt ({type(exc).__name__}: {exc}); restore it and start again") \
                from None
        expected = set()
        checkpoint = recovery_checkpoint.read(self._checkpoint_path())
        for info in self._topics.values():
            cfg = self._stored_config(info)
            for p in range(info.num_partitions):
                d = self._dir(info.name, p)
                expected.add(d.name)
                point, topic_id = checkpoint.get((info.name, p), (None, None))
                self._partitions[(info.name, p)] = PartitionLog(
                    d, info.name, p, cfg, self.clock, self.dir_state,
                    checkpointed_recovery_point=point if topic_id == info.topic_id else None)
        deleting = {str(n) for n in doc.get("deleting", [])}
        for d in self.data_dir.iterdir():
            stray = d.name not in expected and re.match(r".+-\d+(\.deleted)?$", d.name)
            if not (d.is_dir() and d.name != "__meta" and stray):
                continue
            if d.name in deleting or not _holds_records(d):
                log.warning("removing directory %s of a deleted topic (or an unfinished creation)", d)
                fileio.fs.rmtree(d)
            else:
                # Kafka moves a stray log aside and never deletes it (LogManager: "Move aside stray
                # partitions, don't delete them"): records of no topic this broker knows, say an
                # operator's copy, are not the broker's to remove.
                aside = d.with_name(f"{d.name}.{uuid.uuid4().hex}-stray")
                log.warning("directory %s holds records of no known topic: moved aside to %s (remove it by hand "
                            "once it is not needed)", d, aside.name)
                fileio.fs.replace(d, aside)
        fileio.fs.fsync_dir(self.data_dir)
        # Deletions cut short are finished now; names still listed would only be dropped later.
        self._deleting = set()

    def _partitions_holding_records(self) -> list[Path]:
        """Directories of the data directory named like a partition with a non-empty segment."""
        return sorted(d for d in self.data_dir.iterdir()
                      if d.is_dir() and d.name != "__meta" and re.match(r".+-\d+$", d.name) and _holds_records(d))

    def _take_leadership(self) -> None:
        """Each start of the broker is a new leader epoch for every partition (as a restarted Kafka
        broker is re-elected with a bumped epoch), so clients detect a log that lost its tail
        (KIP-101/KIP-320). The epoch is one number for the broker, above every epoch any partition
        has seen, written durably before any partition uses it."""
        path = self.meta_dir / "leader-epoch"
        stored = fileio.read_file(path)
        previous = int(stored) if stored is not None and stored.strip().isdigit() else -1
        seen = max((p.epochs.latest_epoch for p in self._partitions.values()), default=-1)
        self.leader_epoch = max(previous, seen) + 1
        fileio.fs.write_atomic(path, str(self.leader_epoch).encode())
        for plog in self._partitions.values():
            plog.become_leader(self.leader_epoch)

    def _save(self) -> None:
        """Write topics.json (``write_atomic``: the old file or the new one survives). A disk too
        full for it raises DiskFullError with the old file intact, and the caller undoes the change
        it made in memory: what a restart would load and what is served stay the same."""
        doc: dict[str, Any] = {
            "topics": [{"name": t.name, "topic_id": str(t.topic_id), "num_partitions": t.num_partitions,
                        "configs": t.configs, "internal": t.is_internal} for t in self._topics.values()],
            "deleting": sorted(self._deleting)}
        data = json.dumps(doc, indent=1).encode()
        try:
            fileio.fs.write_atomic(self._meta_path(), data)
        except OSError as exc:
            if exc.errno in fileio.DISK_FULL_ERRNOS:
                raise DiskFullError(f"could not write {self._meta_path()}: {exc}") from exc
            raise
        self._meta_bytes = len(data)

    def check_room(self, more_bytes: int) -> None:
        """DiskFullError if a change that makes topics.json ``more_bytes`` longer (or new files of
        that size) would eat into ``log_dir_min_free_bytes``: topics.json is written whole beside
        its old copy. Asked by every creation of a topic or of partitions (:meth:`validate_new_topic`,
        :meth:`validate_new_partitions`), except the internal topics'; a client creating topics in
        a loop would otherwise fill the disk, and the broker's next write of its own would stop
        it. Deletions are not asked: they give room back."""
        self.check_meta_room(self._meta_bytes + more_bytes)

    def check_meta_room(self, nbytes: int) -> None:
        """DiskFullError if writing a file of ``nbytes`` in ``__meta`` (a client's change to a file
        written whole: topics.json, users.json) would eat into ``log_dir_min_free_bytes``."""
        refused = self.dir_state.client_write_refused(self.meta_dir, nbytes)
        if refused is not None:
            raise DiskFullError(refused)

    def _checkpoint_path(self) -> Path:
        return self.data_dir / recovery_checkpoint.FILE_NAME

    def _dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _stored_config(self, info: TopicInfo) -> LogConfig:
        """The config of a topic loaded from disk; an override this version refuses (written by
        another version) is ignored with an error rather than keeping the broker from starting."""
        try:
            return self.config_for(info)
        except InvalidConfigError as exc:
            good = {}
            for k, v in info.configs.items():
                try:
                    self._validated_config({k: v})
                    good[k] = v
                except InvalidConfigError:
                    pass
            log.error("topic %s: ignoring stored config overrides %s: %s", info.name,
                      sorted(set(info.configs) - set(good)), exc)
            return self._defaults.with_topic_configs(good)

    def config_for(self, info: TopicInfo) -> LogConfig:
        return self._defaults.with_topic_configs(dict(info.configs))

    # --- topics ----------------------------------------------------------------------------------
    def topics(self) -> dict[str, TopicInfo]:
        return self._topics

    def validate_new_topic(self, name: str, num_partitions: int, configs: dict[str, str], *,
                           internal: bool = False) -> LogConfig:
        """The new topic's config, or a StorageError saying why it cannot be made (its name, its
        partition count, its configs, or the descriptors it would take: :meth:`check_descriptors`,
        not asked for an ``internal`` topic)."""
        validate_topic_name(name)
        if name in self._topics or name in self._creating:
            raise TopicExistsError(f"topic {name!r} already exists")
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise InvalidPartitionsError(f"number of partitions must be between 1 and {MAX_PARTITIONS}")
        collides = name.replace(".", "_")
        for other in (*self._topics, *self._creating):
            if other.replace(".", "_") == collides:
                raise InvalidTopicError(f"topic {name!r} collides with existing topic {other!r} ('.' vs '_')")
        cfg = self._validated_config(configs)
        if not internal:
            self.check_descriptors(num_partitions)
            self.check_room(256 + 2 * len(name) + sum(8 + len(k) + len(v or "") for k, v in configs.items())
                            + PARTITION_FILES_BYTES * num_partitions)
        return cfg

    def check_descriptors(self, new_partitions: int) -> None:
        """InvalidPartitionsError if ``new_partitions`` more partitions (each keeps its active
        segment's file open) would eat into the descriptors kept free (``storage.descriptors``).

        Asked by every creation of a topic (:meth:`validate_new_topic`) or of partitions
        (:meth:`validate_new_partitions`), except the internal topics': a broker out of descriptors accepts no
        connection and opens no file, so a creation that would leave it there is refused with a
        message that names the limit (``ulimit -n``), instead of wedging the broker."""
        spare = descriptors.spare_for_new_partitions()
        if spare is not None and new_partitions > spare[0]:
            room, limit = spare
            raise InvalidPartitionsError(
                f"{new_partitions} new partition(s) do not fit under this broker's limit of {limit} open files "
                f"(ulimit -n): there is room for {max(room, 0)} more, each segment counted twice (its file, and a "
                f"flush's duplicate) and {descriptors.headroom(limit)} kept free for connections and segment rolls")

    def create_topic(self, name: str, num_partitions: int, configs: dict[str, str], *,
                     internal: bool = False) -> TopicInfo:
        """Create a topic here and now (its directories and files on the calling thread)."""
        cfg = self.reserve_topic(name, num_partitions, configs, internal=internal)
        try:
            parts = self.build_partitions(name, num_partitions, cfg)
        except BaseException:
            self.release_topic(name)
            raise
        return self.register_topic(name, configs, parts, internal=internal)

    # Creation in three steps, so that the slow middle one (a directory, a segment file and two
    # directory fsyncs per partition: 1.2 s for 1,000 partitions) can run off the event loop:
    # ``reserve_topic`` and ``register_topic`` on the loop, ``build_partitions`` anywhere. While a
    # name is reserved it is taken (a second creation answers TOPIC_ALREADY_EXISTS) but not
    # visible (Metadata and Produce do not find it), and nothing else touches its directories.

    def reserve_topic(self, name: str, num_partitions: int, configs: dict[str, str], *,
                      internal: bool = False) -> LogConfig:
        """Validate a new topic and take its name; the caller then builds it and registers it, or
        releases the name."""
        cfg = self.validate_new_topic(name, num_partitions, configs, internal=internal)
        self._creating.add(name)
        return cfg

    def is_being_created(self, name: str) -> bool:
        return name in self._creating

    def release_topic(self, name: str) -> None:
        """The name is free again; a deletion's directories are gone (``remove_topic_files``), so
        they leave the ``deleting`` list (persisted with the next change of topics.json)."""
        self._creating.discard(name)
        self._deleting = {d for d in self._deleting
                          if not (_is_dir_of(d, name) and not (self.data_dir / d).exists())}

    def build_partitions(self, name: str, num_partitions: int, cfg: LogConfig) -> list[PartitionLog]:
        """The partitions of a reserved topic, on disk (their directory names durable), not yet
        part of this manager: safe on any thread, since nothing else sees them. A leftover
        directory of an earlier topic of the same name (deleted, or built by a creation that a
        crash cut short) is removed first."""
        return self._build(name, range(num_partitions), cfg)

    def _build(self, name: str, partitions: range, cfg: LogConfig) -> list[PartitionLog]:
        """New partitions' directories and files. If one cannot be made (an OSError: no descriptor
        left, a full disk), those made are closed and removed again, and PartitionsNotBuiltError
        names the cause: a failed creation keeps no file open and leaves nothing to load."""
        parts: list[PartitionLog] = []
        try:
            for p in partitions:
                d = self._dir(name, p)
                if d.exists():
                    fileio.fs.rmtree(d)
                plog = PartitionLog(d, name, p, cfg, self.clock, self.dir_state)
                parts.append(plog)
                plog.become_leader(self.leader_epoch)
        except OSError as exc:
            for plog in parts:
                try:
                    plog.delete()
                except OSError:
                    log.warning("could not remove %s after a failed creation", plog.directory, exc_info=True)
            try:  # the partition that failed (its log closed what it had opened)
                if self._dir(name, p).exists():
                    fileio.fs.rmtree(self._dir(name, p))
            except OSError:
                log.warning("could not remove %s after a failed creation", self._dir(name, p), exc_info=True)
            raise PartitionsNotBuiltError(f"could not make the files of {name}-{p}: {exc}") from exc
        return parts

    def register_topic(self, name: str, configs: dict[str, str], parts: list[PartitionLog], *,
                       internal: bool = False) -> TopicInfo:
        """Make a reserved topic whose partitions were built visible, and durable in topics.json.

        The partitions were built with the config :meth:`reserve_topic` computed; a dynamic broker
        config changed meanwhile (``alter_broker_configs`` reaches registered partitions only) is
        applied here, the overrides validated against the current defaults as any topic's are. If
        they no longer pass, the creation fails (InvalidConfigError) and the partitions go."""
        self._creating.discard(name)
        try:
            cfg = self._validated_config(configs)
        except InvalidConfigError:
            self._forget(name, parts)
            raise
        for plog in parts:
            if plog.config != cfg:
                plog.set_config(cfg)
        info = TopicInfo(name, uuid.uuid4(), len(parts), {k: v for k, v in configs.items() if v is not None},
                         internal)
        for plog in parts:
            self._partitions[(name, plog.partition)] = plog
        self._topics[name] = info
        try:
            self._save()
        except BaseException:
            del self._topics[name]
            self._forget(name, parts)
            raise
        return info

    def _forget(self, name: str, parts: list[PartitionLog]) -> None:
        """Partitions of ``name`` made, but whose creation failed after: no longer served, their
        files removed (a failure to remove them is logged; a restart removes a directory that
        topics.json does not name)."""
        for plog in parts:
            self._partitions.pop((name, plog.partition), None)
            try:
                plog.delete()
            except OSError:
                log.warning("could not remove %s after a failed creation", plog.directory, exc_info=True)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` here and now, its files on the calling thread."""
        detached = self.detach_topic(name)
        try:
            self.remove_topic_files(detached)
        finally:
            self.release_topic(name)

    # Deletion in three steps, so that the slow one (removing every file, 1.3 s for 1,000
    # partitions, and waiting for a flush in flight) runs off the event loop: ``detach_topic`` and
    # ``release_topic`` on the loop, ``remove_topic_files`` anywhere. Between them the name is taken
    # as while a topic is created (a CreateTopics answers TOPIC_ALREADY_EXISTS, a produce or Metadata
    # LEADER_NOT_AVAILABLE), so a topic made again under it never has its files removed by the deletion.

    def detach_topic(self, name: str) -> DetachedTopic:
        """Take topic ``name`` out of topics.json (durably: a restart does not bring it back, and
        removes what is left of its directories) and out of service, its partitions closed; its
        name stays taken until :meth:`release_topic`."""
        info = self._topics.pop(name)
        dirs = {self._dir(name, p).name for p in range(info.num_partitions)}
        added = dirs - self._deleting
        self._deleting |= added
        try:
            self._save()
        except BaseException:
            self._topics[name] = info
            self._deleting -= added
            raise
        self._creating.add(name)
        detached = DetachedTopic(name, [], [])
        for p in range(info.num_partitions):
            plog = self._partitions.pop((name, p), None)
            if plog is not None:
                self.cleaner.abort(plog)
                if (running := plog.close_for_deletion()) is not None:
                    detached.flushes.append(running)
                detached.directories.append(plog.directory)
        return detached

    def remove_topic_files(self, detached: DetachedTopic) -> None:
        """Remove a detached topic's directories, once the flushes that were running on them are
        done, then make that durable with one fsync of the data directory (not one a partition).
        Safe on any thread: nothing else touches them. (Their names stay in topics.json's
        ``deleting`` list until its next write after :meth:`release_topic`: a start that finds one
        of them removes it, where an unknown directory with records is moved aside.)"""
        for job in detached.flushes:
            job.done.wait(60)
        for d in detached.directories:
            fileio.fs.rmtree(d)
        fileio.fs.fsync_dir(self.data_dir)

    def validate_new_partitions(self, name: str, new_total: int) -> None:
        """A StorageError if topic ``name`` cannot grow to ``new_total`` partitions: not more than it
        has, above the maximum, or past the descriptors (:meth:`check_descriptors`)."""
        info = self._topics[name]
        if new_total <= info.num_partitions or new_total > MAX_PARTITIONS:
            raise InvalidPartitionsError(f"new partition count {new_total} must exceed {info.num_partitions}")
        self.check_descriptors(new_total - info.num_partitions)
        self.check_room(PARTITION_FILES_BYTES * (new_total - info.num_partitions))

    def create_partitions(self, name: str, new_total: int) -> None:
        self.validate_new_partitions(name, new_total)
        info = self._topics[name]
        built = self._build(name, range(info.num_partitions, new_total), self.config_for(info))
        for plog in built:
            self._partitions[(name, plog.partition)] = plog
        before, info.num_partitions = info.num_partitions, new_total
        try:
            self._save()
        except BaseException:
            info.num_partitions = before
            self._forget(name, built)
            raise

    def get_partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self._partitions.get((topic, partition))

    def partitions(self) -> dict[tuple[str, int], PartitionLog]:
        return self._partitions

    # --- dynamic configuration (IncrementalAlterConfigs / AlterConfigs / DescribeConfigs) --------
    # Topic overrides live in topics.json; dynamic broker configs in broker-configs.json:
    # {"node": {...}, "cluster": {...}} (per-broker and cluster-wide default, Kafka's two scopes).
    # A change is validated against the whole resulting set, persisted (write_atomic), then every
    # affected partition gets its new LogConfig at once (PartitionLog.set_config): the next
    # append, roll, retention pass or flush uses it.

    def _broker_configs_path(self) -> Path:
        return self.meta_dir / "broker-configs.json"

    def _load_broker_configs(self) -> BrokerLayers:
        raw = fileio.read_file(self._broker_configs_path())
        doc = json.loads(raw) if raw else {}
        scopes: list[dict[str, str]] = []
        for scope in ("node", "cluster"):
            kept = {}
            for k, v in dict(doc.get(scope, {})).items():
                try:
                    parse_broker_configs({k: v})
                    kept[k] = v
                except InvalidConfigError as exc:  # written by another version: ignored, not fatal
                    log.error("ignoring the stored dynamic broker config %s=%r: %s", k, v, exc)
            scopes.append(kept)
        return BrokerLayers(scopes[0], scopes[1], self.default_config)

    def _validated_config(self, configs: Mapping[str, str | None], defaults: LogConfig | None = None) -> LogConfig:
        """The LogConfig a topic with these overrides would have; InvalidConfigError if any is bad."""
        parsed = parse_topic_configs(configs)
        base = self._defaults if defaults is None else defaults
        cfg = base.with_values(parsed)
        check_combination(cfg, parsed)
        return cfg

    def alter_topic_configs(self, name: str, configs: dict[str, str], *, validate_only: bool = False) -> None:
        """Replace topic ``name``'s overrides with ``configs`` (the whole set), live."""
        info = self._topics[name]
        cfg = self._validated_config(dict(configs))
        if validate_only:
            return
        before, info.configs = info.configs, dict(configs)
        try:
            self._save()
        except BaseException:
            info.configs = before
            raise
        for p in range(info.num_partitions):
            self._partitions[(name, p)].set_config(cfg)

    def alter_broker_configs(self, scope: str, configs: dict[str, str], *, validate_only: bool = False) -> None:
        """Replace the dynamic broker configs of ``scope`` ("node" or "cluster"), live: every topic
        without its own override of a changed config takes the new default."""
        parse_broker_configs(configs)  # raises on a bad value of a config that defaults a topic config
        node = dict(configs) if scope == "node" else dict(self.broker_configs.node)
        cluster = dict(configs) if scope == "cluster" else dict(self.broker_configs.cluster)
        layers = BrokerLayers(node, cluster, self.default_config)
        defaults = layers.effective_defaults()
        new_configs = {t: self._validated_config(dict(info.configs), defaults) for t, info in self._topics.items()}
        if validate_only:
            return
        fileio.fs.write_atomic(self._broker_configs_path(),
                               json.dumps({"node": node, "cluster": cluster}, indent=1).encode())
        self.broker_configs = layers
        self._defaults = defaults
        for (topic, _p), plog in self._partitions.items():
            plog.set_config(new_configs[topic])

    def describe_topic_configs(self, name: str) -> list[DescribedConfig]:
        return describe_topic_configs(self._topics[name].configs, self.broker_configs)

    def min_flush_interval_ms(self) -> int:
        """The shortest flush.ms of any partition: how often the background flush must look."""
        return min((plog.config.flush_interval_ms for plog in self._partitions.values()),
                   default=self.default_config.flush_interval_ms)

    # --- maintenance -----------------------------------------------------------------------------
    def due_for_flush(self, monotonic_ms: int) -> list[PartitionLog]:
        """Partitions whose background flush is due (none in flight, flush.ms passed on the monotonic
        clock, ``monotonic_ms`` being ``Clock.monotonic_ms``, unflushed data)."""
        return [plog for plog in self._partitions.values() if plog.needs_flush(monotonic_ms)]

    def begin_flush_pass(self, monotonic_ms: int) -> recovery_checkpoint.FlushPass | None:
        """Plan the periodic flush of every due partition (on the loop thread): the caller runs
        ``run()`` on the flush thread, then :meth:`finish_flush_pass` here. None if none is due.

        Snapshots are encoded here, on the loop, at about 5 µs a producer-state entry: once this
        pass's come to SNAPSHOT_PASS_ENTRIES entries, the other due partitions flush without theirs,
        which the next pass writes (their recovery point still moves, through the checkpoint; only
        a recovery's replay is longer meanwhile). So partitions full of producers snapshotted at the
        same tick hold the loop for a pass each, not all at once.

        A partition whose plan fails (no descriptor left for a duplicate: EMFILE) is left out of the
        pass, with nothing planned (``PartitionLog.begin_flush`` is all or nothing), and the next
        pass tries it again; the others' jobs run. (The error used to end the planning: the jobs
        already planned were never run, so those partitions' flushes never ran again, their
        duplicates stayed open, and their recovery points stayed where they were.) A directory
        offline raises StorageOfflineError, from the first partition asked (nothing planned yet)."""
        jobs = []
        encoded = 0  # producer-state entries whose snapshot this pass encodes (on the loop)
        unplanned: list[str] = []
        error: OSError | None = None
        for plog in self.due_for_flush(monotonic_ms):
            try:
                job = plog.begin_flush(snapshot_deferred=encoded >= SNAPSHOT_PASS_ENTRIES)
            except fileio.StorageOfflineError:
                raise
            except OSError as exc:
                unplanned.append(plog.name)
                error = exc
                continue
            if job is not None:
                jobs.append((plog, job))
                if job.snapshot is not None:
                    encoded += len(plog.producer_state.producers)
        if unplanned:
            log.warning("flush pass: %d partition(s) left to the next pass (%s%s): %s", len(unplanned),
                        ", ".join(unplanned[:5]), ", ..." if len(unplanned) > 5 else "", error)
        if not jobs:
            return None
        return recovery_checkpoint.FlushPass(self._checkpoint_path(), jobs, self._recovery_points())

    def finish_flush_pass(self, flush_pass: recovery_checkpoint.FlushPass) -> None:
        """After ``flush_pass.run()``: each job's recovery point moves (``finish_flush``). Raises
        StorageOfflineError (the log directory goes offline) if a job or the checkpoint failed."""
        failure: fileio.StorageOfflineError | None = None
        for plog, job in flush_pass.jobs:
            try:
                plog.finish_flush(job)
            except fileio.StorageOfflineError as exc:
                failure = failure or exc
        if flush_pass.error is not None and failure is None:
            failure = self.dir_state.fail(str(flush_pass.path), flush_pass.error)
        if failure is not None:
            raise failure

    def flush_all(self, monotonic_ms: int, force: bool = False) -> None:
        """The background flush. Its order does not matter for transactions: the transaction
        protocol makes each step durable itself (see server.coordination); here every partition's
        recovery point moves independently. Raises StorageOfflineError once the directory failed."""
        for plog in self._partitions.values():
            if force or plog.needs_flush(monotonic_ms):
                plog.flush()

    def apply_retention_all(self, now_ms: int) -> None:
        for plog in self._partitions.values():
            if not self._topics[plog.topic].is_internal:
                plog.apply_retention(now_ms)

    def compacted_logs(self) -> list[PartitionLog]:
        """Partitions of user topics whose cleanup.policy includes compact (read live from each
        log's current config). Internal topics keep their checkpoints (see docs/design/storage.md)."""
        return [plog for plog in self._partitions.values()
                if plog.config.compact and not self._topics[plog.topic].is_internal]

    def grab_cleanable(self, now_ms: int) -> CleanJob | None:
        """The next cleaning job (loop thread), or None: see ``LogCleanerManager.grab_filthiest``."""
        return self.cleaner.grab_filthiest(self.compacted_logs(), now_ms)

    def remove_expired_producers(self, now_ms: int, producer_id_expiration_ms: int) -> None:
        for plog in self._partitions.values():
            plog.remove_expired_producers(now_ms, producer_id_expiration_ms)

    def close(self) -> None:
        self.cleaner.abort_all()
        for plog in self._partitions.values():
            plog.close()

    def _recovery_points(self) -> recovery_checkpoint.Points:
        """Every partition's in-memory recovery point with its topic id, as the checkpoint holds them."""
        return {key: (plog.recovery_point, self._topics[plog.topic].topic_id) for key, plog in self._partitions.items()}

    def checkpoint_at_stop(self) -> None:
        """After :meth:`close`, once no flush pass can run any more (a pass writes the same file):
        the recovery-point checkpoint rewritten with where each partition now stands, as Kafka's
        shutdown checkpoints its logs, so a stale value (one past a log cut since, say) is not met
        again at the next start. Nothing is written to a failed directory; the checkpoint is an
        optimisation, so failing to write it is only a warning."""
        if self.dir_state.offline_reason is not None:
            return
        try:
            fileio.fs.write_atomic(self._checkpoint_path(), recovery_checkpoint.encode(self._recovery_points()))
        except OSError as exc:
            log.warning("could not write %s at a clean stop: %s", self._checkpoint_path(), exc)
