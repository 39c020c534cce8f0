#!/bin/sh
# Stand-in for Apache Kafka's bin/kafka-topics.sh (librdkafka's test_kafka_topics()).
exec "${ONCELOG_PYTHON:-python3}" "$(dirname "$0")/kafka_shim.py" topics "$@"
