"""Fuzzing the broker: random bytes, then structure-aware requests (tests/server/fuzz_requests.py) for
every API and version, in process (fast, every handler exception is a failure naming the request)
and over sockets beside real clients (tests/server/fuzz_run.py). `make fuzz` runs the socket fuzz
for ONCELOG_FUZZ_SECONDS (default there 1800); `make test` for 20 seconds."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from oncelog.protocol import records as rb
from oncelog.protocol.errors import MalformedRequestError, UnsupportedVersionError
from oncelog.protocol.messages import (
    build,
    decode_request,
    encode_request,
    encode_result,
    request_type,
)
from oncelog.protocol.versions import SUPPORTED_VERSIONS
from oncelog.testing.broker_process import BrokerProcess
from tests.inproc import InProcessBroker
from tests.server.fuzz_requests import (
    FUZZ_TOPICS,
    RequestFuzzer,
    non_nullable_array_paths,
    supported_pairs,
    with_path,
)
from tests.server.fuzz_run import run_fuzz

API_METADATA = 3


def test_random_request_bodies_never_kill_the_broker(broker: BrokerProcess) -> None:
    rng = random.Random(1234)
    sent = 0
    for api_key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()):
        for version in range(lo, hi + 1):
            for _ in range(3):
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
                header = struct.pack(">hhih", api_key, version, sent, 4) + b"fuzz"
                if rng.random() < 0.5:
                    header += b"\x00"  # an empty tagged-field section, as flexible headers have
                frame = header + body
                with socket.create_connection((broker.host, broker.port), timeout=5) as s:
                    s.sendall(struct.pack(">i", len(frame)) + frame)
                    s.settimeout(0.5)
                    try:
                        s.recv(65536)
                    except (TimeoutError, ConnectionResetError):
                        pass
                sent += 1
    assert sent > 200
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce("after-fuzz", b"still alive")
    assert p.flush(15) == 0


# --- in process: the handlers themselves -------------------------------------------------------------

def handle(ib: InProcessBroker, frame: bytes, corr: int) -> bytes | None:
    """What the server's connection does with one frame (without its size prefix), minus the socket:
    decode, handle (a delayed answer waits at most 0.2 s, as a client that hangs up), encode."""
    try:
        req = decode_request(frame, ib.broker.supported_versions)
    except (MalformedRequestError, UnsupportedVersionError):
        return None  # the connection answers or closes; no handler ran
    async def on_the_loop() -> Any:  # as the server's connection: a handler may start work there
        result = ib.broker.handlers[req.api_key](ib.broker, req)
        return await asyncio.wait_for(result, 0.2) if inspect.isawaitable(result) else result

    try:
        result = ib.loop.run_until_complete(on_the_loop())
    except TimeoutError:
        return None
    if result is None:
        return None
    data = encode_result(req.api_key, req.api_version, corr, result)
    return b"".join(bytes(p) for p in data) if isinstance(data, list) else data


def stored_batches_are_valid(ib: InProcessBroker) -> int:
    """Every batch in every user partition passes the produce validation again: nothing invalid was
    ever stored. Returns the number of batches checked."""
    n = 0
    for (topic, _p), plog in ib.broker.logs.partitions().items():
        if topic.startswith("__"):
            continue
        data = plog.read(plog.log_start_offset, 1 << 30).records
        for pos, header in rb.iter_headers(data):
            rb.validate_batch(data, pos)
            rb.validate_records(data, pos, header)
            n += 1
    return n


@pytest.mark.parametrize("seed", [1, 2])
def test_structure_aware_fuzz_in_process(tmp_path: Path, seed: int) -> None:
    """Every API and version, valid requests with mutated fields and batches; no handler may raise,
    every answer must encode, a crash and a restart load the data, and only valid batches are stored."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        for t in FUZZ_TOPICS[:3]:
            ib.create_topic(t, 2)
        fz = RequestFuzzer(random.Random(seed), chaos=0.15)
        pairs = supported_pairs() * 6
        random.Random(seed).shuffle(pairs)
        for i in range(len(pairs) + 1500):
            if i == len(pairs) // 2:
                ib.restart()  # a crash (kill -9) half way
            fz.pairs = [pairs[i]] if i < len(pairs) else supported_pairs()
            frame, _expects, key, ver, corr, body, kind = fz.frame()
            if kind.startswith("fatal"):
                continue
            try:
                out = handle(ib, frame[4:], corr)
            except Exception as exc:
                raise AssertionError(f"request {i} ({kind}) api {key} v{ver} raised {exc!r}: {body!r:.3000}") from exc
            if out is not None and kind == "ok":
                fz.learn(key, ver, out[4:], body)
        ib.restart()
        assert stored_batches_are_valid(ib) > 0
    finally:
        ib.close()


def test_regression_metadata_null_topic_name_below_v12(tmp_path: Path) -> None:
    """Found by the fuzzer: Metadata v10/v11 with a null topic name (a lookup by topic id, which only
    v12 answers) made the handler answer a null name in a field that is not nullable below v12;
    encoding the response raised, and the connection was closed as an internal error."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        ib.create_topic("t")
        for version in (10, 11):
            r = ib.call(API_METADATA, version, {"topics": [{"name": None, "topic_id": None}, {"name": "t"}],
                                                "allow_auto_topic_creation": False})
            assert [int(t.error_code) for t in r.topics] == [ErrorCode.invalid_request, 0]
        r = ib.call(API_METADATA, 12, {"topics": [{"name": None}], "allow_auto_topic_creation": False})
        assert r.topics[0].error_code == ErrorCode.unknown_topic_id and r.topics[0].name is None
    finally:
        ib.close()


def test_regression_create_topics_config_name_of_32767_characters(tmp_path: Path) -> None:
    """Found by the socket fuzz: CreateTopics v2-v4 (non-flexible) with a config named by a
    32,767-character string answered "unknown topic config '...'" quoting the whole name: 32,790
    characters do not fit a legacy string, encoding raised, an internal error closed the connection.
    The message is now cut to 1,000 characters."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        for version in (2, 4, 7):
            r = ib.call(19, version, {"topics": [{"name": "fz", "num_partitions": 1, "replication_factor": 1,
                                                  "assignments": [], "configs": [{"name": "x" * 32767, "value": "1"}]}],
                                      "timeout": 1000, "validate_only": False})
            assert r.topics[0].error_code == ErrorCode.invalid_config
            assert "xxxxxxxxxx" in r.topics[0].error_message
            assert len(r.topics[0].error_message) <= 1003
    finally:
        ib.close()


def test_regression_member_id_from_a_client_id_of_32767_characters(tmp_path: Path) -> None:
    """Found by the 30-minute socket fuzz: JoinGroup from a client whose client id (or group
    instance id) is 32,767 characters made the member id clientId-UUID, 32,804 characters, which no
    legacy string holds: every JoinGroup and DescribeGroups response of that group failed to encode
    (91 internal errors). The member id keeps at most 255 characters of the prefix."""
    ib = InProcessBroker(tmp_path / "d", group_initial_rebalance_delay_ms=0)  # a lone join completes at once
    try:
        long_id = "c" * 32767
        for version, instance in ((2, None), (5, long_id)):
            group = f"g{version}"
            fields = {"group_id": group, "session_timeout": 10_000, "rebalance_timeout": 10_000,
                      "member_id": "", "protocol_type": "consumer",
                      "protocols": [{"name": "range", "metadata": b""}]}
            if version >= 5:
                fields["group_instance_id"] = instance
            r = ib.call(11, version, fields, client_id=long_id)
            assert r.error_code == 0 and r.member_id.startswith("c" * 255 + "-")
            assert len(r.member_id) == 255 + 37
            d = ib.call(15, 4, {"groups": [group], "include_authorized_operations": False}, client_id=long_id)
            assert d.groups[0].members[0].member_id == r.member_id
            assert d.groups[0].members[0].client_id == long_id
    finally:
        ib.close()


def test_regression_null_arrays_are_malformed_requests(tmp_path: Path) -> None:
    """Found by the socket fuzz: OffsetFetch v1-v5 whose topic's partition array has length -1 reached
    handle_offset_fetch with ``partition_indexes=None`` (kio's reader accepts a null array whatever
    the schema says) and raised TypeError, an internal error. A probe setting each non-nullable array
    to null found the same in 37 places across 24 APIs (produce, fetch, list_offsets, every group and
    transaction API, admin). Kafka's readers refuse such a request; ``decode_request`` now does too
    (MalformedRequestError: the connection is closed, no handler runs)."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        body = build(request_type(9, 1), {"group_id": "g", "topics": [{"name": "t", "partition_indexes": []}]})
        frame = encode_request(9, 1, 1, body)
        assert frame.endswith(b"\x00\x00\x00\x00")
        with pytest.raises(MalformedRequestError, match="partition_indexes was serialized as null"):
            decode_request(frame[4:-4] + b"\xff\xff\xff\xff")
        fz = RequestFuzzer(random.Random(3), chaos=0.0)
        checked = 0
        for key, version in supported_pairs():
            for _ in range(3):
                _, _, good = fz.request(key, version)
                for path in non_nullable_array_paths(good):
                    bad = with_path(good, path, None)
                    with pytest.raises(MalformedRequestError, match="serialized as null"):
                        decode_request(encode_request(key, version, 1, bad)[4:], ib.broker.supported_versions)
                    checked += 1
                decode_request(encode_request(key, version, 1, good)[4:])  # the valid request still decodes
        assert checked > 1000
    finally:
        ib.close()


HUGE_ARRAY_PROBE = """
import random, struct, sys
sys.path.insert(0, sys.argv[1])
from oncelog.protocol.errors import MalformedRequestError
from oncelog.protocol.messages import decode_request, encode_request
from tests.server.fuzz_requests import FLEXIBLE_FROM, RequestFuzzer, compact_array_positions, supported_pairs
fz = RequestFuzzer(random.Random(4), chaos=0.0)
refused = 0
for key, version in supported_pairs():
    if version < FLEXIBLE_FROM[key]:
        continue
    for _ in range(1):
        _, _, body = fz.request(key, version)
        frame = encode_request(key, version, 1, body)
        for at, size in compact_array_positions(frame):
            bad = frame[:at] + b"\\xff\\xff\\xff\\xff\\x0f" + frame[at + size:]
            try:
                decode_request(bad[4:])
            except MalformedRequestError:
                refused += 1
print("refused", refused)
"""


def test_regression_compact_array_of_2_to_the_32_entries_does_not_abort(tmp_path: Path) -> None:
    """Found by the 30-minute socket fuzz: the broker process died ("memory allocation of 274877906928
    bytes failed", a Rust abort in kio's native reader). A flexible request whose compact array
    announces 2**32 - 1 entries makes kio reserve memory for all of them before reading one; a failed
    Rust allocation aborts the process, nothing in Python can catch it. ``decode_request`` now walks
    flexible bodies first and refuses an array announcing more entries than bytes remain, as Kafka's
    readers do. Every compact array of every flexible request, one at a time, in a child process
    (an abort there must not take pytest down)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HUGE_ARRAY_PROBE, str(Path(__file__).resolve().parents[2])],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    refused = int(out.stdout.split()[-1])
    assert refused > 100


def _big_offsets() -> list[dict[str, object]]:
    """40 partitions of a topic named by 32,767 characters: 1.3 MB of offset records."""
    return [{"name": "x" * 32767, "partitions": [{"partition_index": i, "committed_offset": 1,
                                                  "committed_leader_epoch": -1, "committed_metadata": None}
                                                 for i in range(40)]}]


EXPECTED_BIG_COMMIT = {ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_commit_offset_size,
                       ErrorCode.invalid_topic_exception}


def test_regression_offset_commit_larger_than_max_message_bytes(tmp_path: Path) -> None:
    """Found by the fuzzer (before the group coordinator's rewrite, which fixed it): OffsetCommit for 40
    partitions of a topic whose name has 32,767 characters (no such topic; not even a valid name) built
    1.3 MB of offset records and RecordTooLargeError escaped handle_offset_commit (an internal error:
    the connection closed with no answer). Kafka answers UNKNOWN_TOPIC_OR_PARTITION for a topic that
    does not exist (and INVALID_COMMIT_OFFSET_SIZE when the records are too large)."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        r = ib.call(8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                           "topics": _big_offsets()})
        codes = {int(p.error_code) for t in r.topics for p in t.partitions}
        assert codes and codes <= EXPECTED_BIG_COMMIT
    finally:
        ib.close()


def test_regression_txn_offset_commit_larger_than_max_message_bytes(tmp_path: Path) -> None:
    """The same for TxnOffsetCommit (Coordination.apply_txn_offset_records caught only ProducerStateError)."""
    ib = InProcessBroker(tmp_path / "d")
    try:
        err, pid, epoch = ib.init_producer_id("tx")
        assert err == 0
        r = ib.call(25, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"})
        assert r.error_code == 0
        r = ib.call(28, 3, {"transactional_id": "tx", "group_id": "g", "producer_id": pid, "producer_epoch": epoch,
                            "generation_id": -1, "member_id": "", "topics": _big_offsets()})
        codes = {int(p.error_code) for t in r.topics for p in t.partitions}
        assert codes and codes <= EXPECTED_BIG_COMMIT
    finally:
        ib.close()


# --- over sockets, beside real clients -----------------------------------------------------------------

RSS_GROWTH_BOUND = 128 << 20


@pytest.mark.parametrize("flush_every_append", [False, True], ids=["background-fsync", "fsync-every-append"])
def test_socket_fuzz_beside_real_clients(tmp_path: Path, flush_every_append: bool) -> None:
    """Under --flush-every-append every produce answer waits for its fsync, so the fuzz also meets
    the connection's held answers (requests handled, and arriving, while an answer waits)."""
    seconds = float(os.environ.get("ONCELOG_FUZZ_SECONDS", "20" if not flush_every_append else "12"))
    seed = int(os.environ.get("ONCELOG_FUZZ_SEED", "1"))
    report = run_fuzz(tmp_path, seconds=seconds, seed=seed, connections=12, flush_every_append=flush_every_append)
    print(f"fuzz: {report.requests} requests ({report.kinds}), {report.answered} answered, "
          f"{report.reconnects} connections; good clients: {len(report.idem_delivered)} idempotent, "
          f"{len(report.txn_committed)} committed, {len(report.txn_aborted)} aborted, {len(report.consumed)} "
          f"consumed; RSS warm {report.rss_warm >> 20} MiB, end {report.rss_end >> 20} MiB, max "
          f"{report.rss_max >> 20} MiB; phases {report.phases}")
    for problem in report.problems():
        print("PROBLEM", problem[:3000])
    assert report.problems() == []
    assert len(report.apis) == len(SUPPORTED_VERSIONS), "every API was fuzzed"
    assert report.answered > report.requests // 3
    assert report.idem_delivered and report.txn_committed and report.txn_aborted and report.consumed
    assert report.rss_end - report.rss_warm < RSS_GROWTH_BOUND
