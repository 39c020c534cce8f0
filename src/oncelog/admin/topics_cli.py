"""`oncelog topics create|list|describe|alter|delete` against any Kafka broker (Kafka protocol,
librdkafka). `alter` is IncrementalAlterConfigs: `--config k=v` sets, `--delete-config k` removes an
override (refused, as kafka-configs.sh does, when the topic has no such override)."""

from __future__ import annotations

import argparse

from oncelog.admin.common import EXIT_OK, EXIT_USAGE, add_bootstrap, admin_client, fail, metadata


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = sub.add_parser("create", help="create a topic")
    c.add_argument("topic")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--replication-factor", type=int, default=1)
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="topic config (repeatable)")
    add_bootstrap(c)
    ls = sub.add_parser("list", help="list topics")
    ls.add_argument("--internal", action="store_true", help="include internal topics")
    add_bootstrap(ls)
    d = sub.add_parser("describe", help="partitions, leaders and configs of topics")
    d.add_argument("topics", nargs="*")
    add_bootstrap(d)
    a = sub.add_parser("alter", help="set or delete topic config overrides (applied at once)")
    a.add_argument("topic")
    a.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="set a config (repeatable)")
    a.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                   help="remove an override, back to the broker's default (repeatable)")
    add_bootstrap(a)
    rm = sub.add_parser("delete", help="delete topics")
    rm.add_argument("topics", nargs="+")
    add_bootstrap(rm)


def _parse_configs(items: list[str]) -> dict[str, str] | None:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--config expects KEY=VALUE, got {item!r}", EXIT_USAGE)
            return None
        configs[key] = value
    return configs


def _alter(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

    configs = _parse_configs(args.config)
    if configs is None:
        return EXIT_USAGE
    if not configs and not args.delete_config:
        return fail("nothing to alter: give --config KEY=VALUE and/or --delete-config KEY", EXIT_USAGE)
    both = sorted(set(configs) & set(args.delete_config))
    if both:
        return fail(f"both set and deleted: {', '.join(both)}", EXIT_USAGE)
    admin = admin_client(args)  # must outlive the futures
    resource = ConfigResource(ConfigResource.Type.TOPIC, args.topic)
    if args.delete_config:
        try:
            current = next(iter(admin.describe_configs([resource], request_timeout=args.timeout).values())).result()
        except KafkaException as exc:
            return fail(f"cannot alter topic {args.topic!r}: {exc.args[0].str()}")
        not_set = sorted(k for k in args.delete_config
                         if k not in current or current[k].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        if not_set:
            return fail(f"cannot delete config(s) not set on topic {args.topic!r}: {', '.join(not_set)}")
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in args.delete_config]
    resource = ConfigResource(ConfigResource.Type.TOPIC, args.topic, incremental_configs=entries)
    try:
        next(iter(admin.incremental_alter_configs([resource], request_timeout=args.timeout).values())).result()
    except KafkaException as exc:
        return fail(f"cannot alter topic {args.topic!r}: {exc.args[0].str()}")
    done = [f"set {k}={v}" for k, v in configs.items()] + [f"deleted {k}" for k in args.delete_config]
    print(f"altered topic {args.topic}: {'; '.join(done)}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, NewTopic

    if args.action == "alter":
        return _alter(args)
    if args.action == "create":
        configs = _parse_configs(args.config)
        if configs is None:
            return EXIT_USAGE
        if args.partitions < 1:
            return fail("--partitions must be >= 1", EXIT_USAGE)
        admin = admin_client(args)  # must outlive the futures
        futures = admin.create_topics(
            [NewTopic(args.topic, args.partitions, args.replication_factor, config=configs)],
            request_timeout=args.timeout)
        try:
            futures[args.topic].result()
        except KafkaException as exc:
            return fail(f"cannot create topic {args.topic!r}: {exc.args[0].str()}")
        print(f"created topic {args.topic} with {args.partitions} partition(s)")
        return EXIT_OK
    if args.action == "list":
        md = metadata(args)
        for name in sorted(md.topics):
            if name.startswith("__") and not args.internal:
                continue
            print(name)
        return EXIT_OK
    if args.action == "describe":
        md = metadata(args)
        names = args.topics or sorted(n for n in md.topics if not n.startswith("__"))
        admin = admin_client(args)
        rc = EXIT_OK
        for name in names:
            t = md.topics.get(name)
            if t is None or t.error is not None:
                rc = fail(f"topic {name!r} does not exist")
                continue
            print(f"Topic: {name}\tPartitionCount: {len(t.partitions)}")
            for pid in sorted(t.partitions):
                p = t.partitions[pid]
                print(f"\tPartition: {pid}\tLeader: {p.leader}\tReplicas: {list(p.replicas)}\tIsr: {list(p.isrs)}")
            try:
                res = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)],
                                             request_timeout=args.timeout)
                entries = next(iter(res.values())).result()
                print("\tConfigs: " + ", ".join(f"{k}={v.value}" for k, v in sorted(entries.items())))
            except KafkaException as exc:
                rc = fail(f"cannot describe configs of {name!r}: {exc.args[0].str()}")
        return rc
    if args.action == "delete":
        admin = admin_client(args)
        futures = admin.delete_topics(args.topics, request_timeout=args.timeout)
        rc = EXIT_OK
        for name, fut in futures.items():
            try:
                fut.result()
                print(f"deleted topic {name}")
            except KafkaException as exc:
                rc = fail(f"cannot delete topic {name!r}: {exc.args[0].str()}")
        return rc
    return fail(f"unknown action {args.action}", EXIT_USAGE)
