"""Stand-in for Apache Kafka's bin/kafka-topics.sh and kafka-acls.sh, as librdkafka's test suite
calls them (test_kafka_topics / test_kafka_cmd), done with the Admin API of confluent-kafka."""
import sys

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)


def opts(argv):
    out, i = {"config": []}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            key = a[2:]
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                val = argv[i + 1]
                i += 1
            else:
                val = True
            if key == "config":
                out["config"].append(val)
            else:
                out[key] = val
        i += 1
    return out


def wait(fs):
    for f in fs.values():
        f.result()


def main():
    tool, o = sys.argv[1], opts(sys.argv[2:])
    admin = AdminClient({"bootstrap.servers": o["bootstrap-server"]})
    if tool == "topics":
        t = o["topic"]
        if "create" in o:
            cfg = dict(c.split("=", 1) for c in o["config"])
            wait(admin.create_topics([NewTopic(t, int(o.get("partitions", 1)),
                                               int(o.get("replication-factor", 1)), config=cfg)]))
        elif "alter" in o and "partitions" in o:
            wait(admin.create_partitions([NewPartitions(t, int(o["partitions"]))]))
        elif "delete" in o:
            wait(admin.delete_topics([t]))
        else:
            sys.exit(f"unsupported kafka-topics.sh call: {sys.argv!r}")
    elif tool == "acls":
        allow = "allow-principal" in o
        b = AclBinding(ResourceType.TOPIC, o["topic"].strip("'"), ResourcePatternType.LITERAL,
                       (o.get("allow-principal") or o["deny-principal"]).strip("'"),
                       (o.get("allow-host") or o.get("deny-host") or "*").strip("'"),
                       AclOperation[o["operation"].upper()],
                       AclPermissionType.ALLOW if allow else AclPermissionType.DENY)
        r = admin.create_acls([b])
        for f in r.values():
            f.result()


main()
