"""Broker configuration: defaults, a TOML file, then command-line flags, in that order of precedence.

Names follow Kafka's broker configs in snake_case (``auto.create.topics.enable`` ->
``auto_create_topics_enable``); durations end in ``_ms``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse_host_port(value: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:9092') -> (host, port); ValueError with a clear message."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not port_s.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    port = int(port_s)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, port


DEFAULT_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def parse_list(name: str, value: Any, separator: str) -> list[str]:
    """A TOML list, or one string: Kafka's comma list (``sasl.enabled.mechanisms``) or, for
    ``super.users``, Kafka's ';' list (names may hold ',') where ',' also works when there is no ';'."""
    if isinstance(value, str):
        sep = separator if separator in value or separator == "," else ","
        items = value.split(sep)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ValueError(f"config {name!r} must be a list of strings or a string")
    return [item.strip() for item in items if item.strip()]


#: The least value of each numeric broker config that is not a topic config's default (those are
#: checked by the topic config's own rule): Kafka's where Kafka has the config.
AT_LEAST: dict[str, float] = {
    "listen_port": 0, "advertised_port": 0, "node_id": 0, "num_partitions": 1, "socket_request_max_bytes": 1,
    "flush_interval_ms": 0, "log_retention_check_interval_ms": 1, "log_retention_bytes": -1,
    "transaction_max_timeout_ms": 1, "transactional_id_expiration_ms": 1, "transactional_id_max_entries": 1,
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": 1, "producer_id_expiration_ms": 1,
    "producer_state_max_entries": 1, "transaction_state_log_num_partitions": 1, "group_max_count": 1,
    "offsets_topic_num_partitions": 1, "group_min_session_timeout_ms": 0, "group_max_session_timeout_ms": 0,
    "group_initial_rebalance_delay_ms": 0, "offsets_retention_minutes": 1, "internal_log_checkpoint_bytes": 1,
    "internal_log_checkpoint_interval_ms": 1, "log_cleaner_threads": 0, "log_cleaner_backoff_ms": 0,
    "log_cleaner_dedupe_buffer_size": 1, "log_cleaner_io_buffer_load_factor": 0,
    "log_cleaner_io_max_bytes_per_second": 1, "max_connections": 0, "max_connections_per_ip": 0,
    "connections_max_idle_ms": 1, "queued_max_request_bytes": 1, "queued_max_response_bytes": 0,
    "queued_max_requests_per_connection": 1,
    "socket_send_buffer_high_bytes": 0, "log_dir_min_free_bytes": 0, "fetch_max_bytes": 1024,
    "quota_producer_default": 1, "quota_consumer_default": 1, "sasl_server_max_receive_size": 1024,
    "connection_failed_authentication_delay_ms": 0,
}
#: ... and the greatest, where there is one.
AT_MOST: dict[str, float] = {"listen_port": 65535, "advertised_port": 65535, "log_cleaner_io_buffer_load_factor": 1}
#: What ``log_level`` may name (Python's logging levels, in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass
class BrokerConfig:
    data_dir: Path = Path("./oncelog-data")
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    node_id: int = 1
    cluster_id: str = "oncelog-cluster"
    auto_create_topics_enable: bool = False
    num_partitions: int = 1
    socket_request_max_bytes: int = 100 * 1024 * 1024
    # Durability: by default fsync runs in the background every flush_interval_ms; with
    # flush_every_append every append is fsynced before it is acknowledged.
    flush_interval_ms: int = 1000
    flush_every_append: bool = False
    # The fsyncs an answer waits for (flush_every_append, flush.messages=1, a transaction's steps) go
    # to a Linux io_uring where the kernel allows it (storage/fsync_ring.py), else to sync threads.
    fsync_io_uring: bool = True
    log_segment_bytes: int = 1024 * 1024 * 1024
    log_roll_ms: int = 7 * 24 * 3600 * 1000
    log_retention_ms: int = 7 * 24 * 3600 * 1000
    log_retention_bytes: int = -1
    log_retention_check_interval_ms: int = 300_000
    message_max_bytes: int = 1024 * 1024 + 12
    # Transactions and idempotence.
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # Transactional ids the coordinator keeps (about 620 B of memory each): past it the idle ones updated
    # longest ago expire at the next timeout scan, as they would after transactional_id_expiration_ms.
    transactional_id_max_entries: int = 100_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    producer_id_expiration_ms: int = 24 * 3600 * 1000
    # Producer-state entries (one per partition and idempotent or transactional producer id) the broker
    # keeps in all, about 1.3 KB of memory each: past it the least recently written idle ones are
    # evicted early, and their producers get UNKNOWN_PRODUCER_ID (ProducerStateBound).
    producer_state_max_entries: int = 200_000
    transaction_state_log_num_partitions: int = 1
    # Groups.
    # Groups kept (about 1 KB each with an offset): past it a JoinGroup or an offset commit for a new group
    # gets COORDINATOR_NOT_AVAILABLE (retriable); known groups are never dropped for room.
    group_max_count: int = 100_000
    offsets_topic_num_partitions: int = 1
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3000
    offsets_retention_minutes: int = 7 * 24 * 60
    # Internal topics are kept bounded by rewriting their live state and dropping the prefix
    # (what compaction does for Kafka's __consumer_offsets and __transaction_state).
    internal_log_checkpoint_bytes: int = 16 * 1024 * 1024
    internal_log_checkpoint_interval_ms: int = 30_000
    # --- log compaction: the log cleaner (Kafka's log.cleaner.* names) ---------------------------
    # Threads that clean compacted logs off the event loop; each cleans one partition at a time.
    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15_000  # sleep when no log needs cleaning
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024  # key -> offset map, all threads (24 B a key)
    log_cleaner_io_buffer_load_factor: float = 0.9
    log_cleaner_io_max_bytes_per_second: float = float("inf")  # read throttle, all threads
    # Broker defaults of the topic configs delete.retention.ms, min.cleanable.dirty.ratio, ...
    log_cleaner_delete_retention_ms: int = 24 * 3600 * 1000
    log_cleaner_min_cleanable_ratio: float = 0.5
    log_cleaner_min_compaction_lag_ms: int = 0
    log_cleaner_max_compaction_lag_ms: int = 2**63 - 1
    # --- end of log compaction ----------------------------------------------------------------------
    # Limits (Kafka's names): a slow or hostile client cannot exhaust the broker.
    max_connections: int = 2**31 - 1
    max_connections_per_ip: int = 2**31 - 1
    connections_max_idle_ms: int = 600_000
    # Request bytes read but not yet handled, over all connections; reading pauses above it.
    queued_max_request_bytes: int = 512 * 1024 * 1024
    # Per connection: requests queued while one is handled, and response bytes not yet taken by
    # the client above which the broker stops reading its requests (Kafka mutes the channel).
    queued_max_requests_per_connection: int = 32
    socket_send_buffer_high_bytes: int = 1024 * 1024
    # Response bytes clients have not read, over all connections whose send buffer passed its high
    # mark: a Fetch's max_bytes shrinks to what is left (its first batch still goes whole, KIP-74),
    # so clients that never read cannot make the broker hold one fetch_max_bytes response each.
    queued_max_response_bytes: int = 512 * 1024 * 1024
    # Free space a client's produce must leave in the data directory's file system, for the
    # broker's own records (markers, transaction and offset records): below it produces are refused
    # with KAFKA_STORAGE_ERROR instead of the disk filling up and the broker stopping. 0: off.
    log_dir_min_free_bytes: int = 64 * 1024 * 1024
    fetch_max_bytes: int = 55 * 1024 * 1024
    # Byte-rate quotas per principal (bytes/s; the default is unlimited), answered with throttle_time_ms.
    quota_producer_default: int = 2**63 - 1
    quota_consumer_default: int = 2**63 - 1
    # Authorization (Kafka's authorizer): ACLs decide who may do what once it is enabled (--sasl
    # enables it unless authorizer_enabled is set). super_users: "User:alice,User:bob" (Kafka's
    # super.users, ';'-separated there; --super-users; a TOML list works too).
    authorizer_enabled: bool = False
    allow_everyone_if_no_acl_found: bool = False
    super_users: str = ""
    log_level: str = "INFO"
    # Security (docs/design/security.md): SASL on the listener (Kafka's SASL_PLAINTEXT, or SASL_SSL
    # with TLS), TLS from a PEM certificate and key, and the principals every authorizer lets through.
    sasl_enabled: bool = False
    sasl_enabled_mechanisms: list[str] = field(default_factory=lambda: list(DEFAULT_SASL_MECHANISMS))
    sasl_server_max_receive_size: int = 524288  # largest frame before authentication (Kafka's default)
    connection_failed_authentication_delay_ms: int = 100  # answer a failed login after this long
    tls_cert: str | None = None
    tls_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    explicitly_set: set[str] = field(default_factory=set, repr=False, compare=False)  # names update() saw

    @property
    def super_user_set(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.super_users.replace(";", ",").split(",") if u.strip())

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.advertised_host or self.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return host, self.advertised_port or self.listen_port

    def update(self, values: dict[str, Any]) -> None:
        """Apply a flat mapping of config names (Kafka dotted or snake_case); unknown names raise."""
        names = {f.name for f in dataclasses.fields(self)}
        for raw_key, value in values.items():
            key = raw_key.replace(".", "_").replace("-", "_")
            if key == "auto_create_topics":
                key = "auto_create_topics_enable"
            if key in ("listen", "advertised_listener", "advertised_listeners"):
                if not isinstance(value, str):
                    raise ValueError(f"config {raw_key!r} must be a string HOST:PORT")
                if key == "listen":
                    self.listen_host, self.listen_port = parse_host_port(value)
                else:
                    self.advertised_host, self.advertised_port = parse_host_port(value)
                continue
            if key not in names or key in ("extra", "explicitly_set"):
                raise ValueError(f"unknown broker config {raw_key!r}")
            self.explicitly_set.add(key)
            if key == "sasl_enabled_mechanisms":
                self.sasl_enabled_mechanisms = parse_list(raw_key, value, ",")
                continue
            if key == "super_users":
                self.super_users = ";".join(parse_list(raw_key, value, ";"))
                continue
            if key in ("tls_cert", "tls_key"):
                if value is not None and not isinstance(value, str):
                    raise ValueError(f"config {raw_key!r} must be a file path")
                setattr(self, key, value or None)
                continue
            current = getattr(self, key)
            if key == "data_dir":
                if not isinstance(value, (str, Path)) or not str(value):
                    raise ValueError(f"config {raw_key!r} must be a directory path")
                value = Path(value)
            elif isinstance(current, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"config {raw_key!r} must be true or false")
            elif isinstance(current, int) and not isinstance(value, int):
                raise ValueError(f"config {raw_key!r} must be an integer")
            elif isinstance(current, float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"config {raw_key!r} must be a number")
                value = float(value)
            elif isinstance(current, str) and not isinstance(value, str):
                raise ValueError(f"config {raw_key!r} must be a string")
            setattr(self, key, value)

    @property
    def security_protocol(self) -> str:
        """The listener's security protocol, as Kafka names it."""
        tls = self.tls_cert is not None
        return ("SASL_SSL" if tls else "SASL_PLAINTEXT") if self.sasl_enabled else ("SSL" if tls else "PLAINTEXT")

    def apply_security_defaults(self) -> None:
        """``--sasl`` turns the authorizer on (a SASL listener is there to tell principals apart),
        unless ``authorizer_enabled`` was set explicitly (``false``: authentication only)."""
        if self.sasl_enabled and "authorizer_enabled" not in self.explicitly_set:
            self.authorizer_enabled = True

    def validate_security(self) -> None:
        """ValueError for a combination that cannot run (the CLI exits 2 with the message)."""
        from oncelog.security.sasl_server_authenticator import SUPPORTED_MECHANISMS

        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key (tls_cert, tls_key) must be given together")
        unknown = [m for m in self.sasl_enabled_mechanisms if m not in SUPPORTED_MECHANISMS]
        if unknown:
            raise ValueError(f"unsupported SASL mechanism(s) {', '.join(unknown)} in sasl_enabled_mechanisms "
                             f"(supported: {', '.join(SUPPORTED_MECHANISMS)})")
        if self.sasl_enabled and not self.sasl_enabled_mechanisms:
            raise ValueError("SASL is enabled but sasl_enabled_mechanisms is empty")
        for principal in sorted(self.super_user_set):
            kind, sep, name = principal.partition(":")
            if kind != "User" or not sep or not name:
                raise ValueError(f"super user {principal!r} must be a principal of the form User:NAME")
        self.validate_limits()
        if self.tls_cert is not None and self.tls_key is not None:
            from oncelog.security.tls import server_context

            server_context(Path(self.tls_cert), Path(self.tls_key))  # fail now, not at the first client

    def validate_limits(self) -> None:
        """ValueError naming the first config out of its range: a broker default of a topic config
        (``log_segment_bytes`` is ``segment.bytes``'s) by that topic config's rule, the others by
        :data:`AT_LEAST` (Kafka's rule where Kafka has the config), so a value that would make the
        broker misbehave (a negative segment size, no partition in an auto-created topic) stops it
        at start, with the config's name, instead."""
        from oncelog.storage.config import broker_spec

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            spec = broker_spec(f.name.replace("_", "."))
            problem = spec.validator(value) if spec is not None and spec.validator is not None else None
            low = AT_LEAST.get(f.name)
            if problem is None and low is not None and (value < low or value != value):  # NaN too
                problem = f"Value must be at least {low}"
            if problem is None and f.name in AT_MOST and value > AT_MOST[f.name]:
                problem = f"Value must be no more than {AT_MOST[f.name]}"
            if problem is not None:
                raise ValueError(f"invalid value {value} for config {f.name}: {problem}")
        if str(self.log_level).upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group_min_session_timeout_ms must not be above group_max_session_timeout_ms")

    @classmethod
    def from_toml(cls, path: Path) -> BrokerConfig:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        flat: dict[str, Any] = {}
        for k, v in data.items():
            if isinstance(v, dict):  # allow [broker] / [log] tables
                flat.update(v)
            else:
                flat[k] = v
        cfg = cls()
        cfg.update(flat)
        return cfg
