"""`oncelog broker`: run the broker in the foreground until SIGTERM or SIGINT, then shut down cleanly."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from oncelog.server.config import BrokerConfig, parse_host_port


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="directory for partition logs (created if missing)")
    p.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9092)")
    p.add_argument("--advertised-listener", help="HOST:PORT clients are told to connect to")
    p.add_argument("--config", type=Path, help="TOML file with broker configs (flags override it)")
    p.add_argument("--node-id", type=int)
    p.add_argument("--auto-create-topics", action="store_true", default=None,
                   help="create unknown topics on Metadata/Produce (Kafka's auto.create.topics.enable)")
    p.add_argument("--num-partitions", type=int, help="partitions of auto-created topics")
    p.add_argument("--flush-interval-ms", type=int, help="background fsync interval (default 1000)")
    p.add_argument("--flush-every-append", action="store_true", default=None,
                   help="fsync every append before acknowledging it")
    p.add_argument("--fsync-io-uring", action=argparse.BooleanOptionalAction, default=None,
                   help="fsyncs an answer waits for go to an io_uring where Linux allows it (default: on); "
                        "off: to threads")
    p.add_argument("--segment-bytes", type=int, dest="log_segment_bytes")
    p.add_argument("--socket-request-max-bytes", type=int)
    p.add_argument("--transaction-abort-interval-ms", type=int,
                   dest="transaction_abort_timed_out_transaction_cleanup_interval_ms",
                   help="how often timed-out transactions are looked for (default 10000)")
    p.add_argument("--transaction-max-timeout-ms", type=int)
    p.add_argument("--group-initial-rebalance-delay-ms", type=int)
    p.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default INFO)")
    sec = p.add_argument_group("security (docs/design/security.md)")
    sec.add_argument("--sasl", action="store_true", default=None, dest="sasl_enabled",
                     help="require SASL authentication (SASL_PLAINTEXT, or SASL_SSL with --tls-cert)")
    sec.add_argument("--sasl-enabled-mechanisms", metavar="LIST",
                     help="comma list of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default: all three)")
    sec.add_argument("--tls-cert", metavar="PEM", help="certificate chain (PEM): the listener speaks TLS")
    sec.add_argument("--tls-key", metavar="PEM", help="private key (PEM, unencrypted) of --tls-cert")
    sec.add_argument("--super-users", metavar="User:NAME[,...]",
                     help="principals the authorizer always allows (Kafka's super.users; ';' also separates)")
    sec.add_argument("--authorizer", dest="authorizer_enabled", action=argparse.BooleanOptionalAction, default=None,
                     help="check ACLs (default: on with --sasl, off without)")


_FLAG_KEYS = ("node_id", "auto_create_topics", "num_partitions", "flush_interval_ms", "flush_every_append",
              "fsync_io_uring", "log_segment_bytes", "socket_request_max_bytes",
              "transaction_abort_timed_out_transaction_cleanup_interval_ms", "transaction_max_timeout_ms",
              "group_initial_rebalance_delay_ms", "log_level")
_SECURITY_FLAG_KEYS = ("sasl_enabled", "sasl_enabled_mechanisms", "tls_cert", "tls_key", "super_users",
                       "authorizer_enabled")


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    cfg = BrokerConfig.from_toml(args.config) if args.config else BrokerConfig()
    values: dict[str, object] = {}
    if args.data_dir is not None:
        values["data_dir"] = str(args.data_dir)
    if args.listen:
        values["listen"] = args.listen
    if args.advertised_listener:
        parse_host_port(args.advertised_listener)
        values["advertised_listener"] = args.advertised_listener
    for key in (*_FLAG_KEYS, *_SECURITY_FLAG_KEYS):
        value = getattr(args, key, None)
        if value is not None:
            values[key] = value
    cfg.update(values)
    cfg.apply_security_defaults()
    cfg.validate_security()
    return cfg


async def serve(cfg: BrokerConfig) -> None:
    from oncelog.server.broker import Broker

    broker = Broker(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker.on_storage_failure = stop.set
    await broker.start()
    try:
        await stop.wait()
    finally:
        logging.getLogger("oncelog.server").info("shutting down")
        await broker.stop()
    if broker.storage_failure is not None:
        raise OSError(f"the data directory failed: {broker.storage_failure}")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"oncelog broker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, str(cfg.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from oncelog.storage import descriptors
    from oncelog.storage.errors import StorageError

    raised = descriptors.raise_soft_limit()  # every segment keeps its file open
    if raised is not None:
        logging.getLogger("oncelog.server").info("open files limit (ulimit -n) raised from %d to %d", *raised)
    try:
        import uvloop
    except ImportError:  # optional: the standard event loop works too
        uvloop = None  # type: ignore[assignment]
    try:
        if uvloop is not None:
            uvloop.run(serve(cfg))
        else:
            asyncio.run(serve(cfg))
    except (OSError, ValueError, StorageError) as exc:
        print(f"oncelog broker: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
