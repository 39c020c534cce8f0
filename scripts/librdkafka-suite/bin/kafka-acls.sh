#!/bin/sh
# Stand-in for Apache Kafka's bin/kafka-acls.sh (librdkafka's test_kafka_cmd()).
exec "${ONCELOG_PYTHON:-python3}" "$(dirname "$0")/kafka_shim.py" acls "$@"
