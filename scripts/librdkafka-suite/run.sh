#!/usr/bin/env bash
# Run librdkafka's own integration tests (tests/test-runner) against a fresh oncelog broker.
# usage: run.sh NAME PORT TESTS [scenario] [test-runner args...]
#   TESTS     comma list of test numbers, e.g. "0001,0002,0077" (test-runner's TESTS variable)
#   scenario  default (auto-create on, 4 partitions: trivup's default) or noautocreate
# env: LIBRDKAFKA_SRC (built source tree), LOGS (where NAME/ goes), ONCELOG_PYTHON (python with
#      oncelog and confluent-kafka), KVER (TEST_KAFKA_VERSION, default 3.7.0),
#      KP=1 (KAFKA_PATH/BROKERS point at the kafka-topics.sh/kafka-acls.sh stand-ins in bin/),
#      BROKER_ARGS (extra broker flags, e.g. "--config $(dirname $0)/acl.toml").
# See docs/design/compatibility.md.
set -u
NAME=$1; PORT=$2; TESTS_LIST=$3; SCEN=${4:-default}; shift $(( $# < 4 ? $# : 4 ))
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=${LIBRDKAFKA_SRC:-/work/librdkafka-src}
LOG=${LOGS:-/tmp/rdk-logs}/$NAME
PY=${ONCELOG_PYTHON:-python3}
export ONCELOG_PYTHON=$PY
mkdir -p "$LOG"
DATA=$(mktemp -d)
AUTO="--auto-create-topics --num-partitions 4"
[ "$SCEN" = noautocreate ] && AUTO=""
"$PY" -m oncelog broker --data-dir "$DATA" --listen 127.0.0.1:$PORT $AUTO ${BROKER_ARGS:-} \
  --log-level WARNING >"$LOG/broker.log" 2>&1 &
BPID=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.2; done
echo "bootstrap.servers=127.0.0.1:$PORT" > "$LOG/test.conf"
if [ -n "${KP:-}" ]; then export KAFKA_PATH=$HERE BROKERS=127.0.0.1:$PORT; fi
cd "$SRC/tests"
LD_LIBRARY_PATH=../src:../src-cpp RDKAFKA_TEST_CONF="$LOG/test.conf" TEST_KAFKA_VERSION=${KVER:-3.7.0} \
  TEST_MAX_REPLICATION_FACTOR=1 TEST_SCENARIO=$SCEN TESTS="$TESTS_LIST" \
  ./test-runner -L -K -E -p1 "$@" >"$LOG/runner.log" 2>&1
echo "rc=$?" >> "$LOG/runner.log"
kill $BPID; wait $BPID 2>/dev/null
rm -rf "$DATA"
sed 's/\x1b\[[0-9;]*m//g' "$LOG/runner.log" | grep -E '^\| ' || tail -5 "$LOG/runner.log"
