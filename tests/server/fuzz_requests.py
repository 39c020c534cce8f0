"""Structure-aware request fuzzing: valid kio requests for every API and version the broker serves,
built from the dataclasses' type hints, with fields mutated toward the values that break handlers.

``RequestFuzzer.request()`` returns a kio request body whose every field has its wire type (so kio
encodes it), its values chosen by field name (producer ids and epochs the broker handed out, member
ids and generations it answered, a bounded pool of topic/group/transactional names) and, with some
probability per field, an extreme of its type instead (-1, 0, INT_MAX, INT_MIN, empty, huge, unicode).
Record batches come valid (every codec), with mutated headers under a valid CRC, garbage records, or
compressed payloads that do not decompress. ``RequestFuzzer.frame()`` wraps a request into a frame
and sometimes breaks the frame itself (flipped bytes, truncation, an oversized or negative size,
unknown keys and versions, trailing bytes).

The fuzzer never names the resources of the well-behaved client it runs beside (topics ``good-*``,
group ``good-group``, transactional ids ``good-*``, the producer ids in ``protected_pids``): with
no authorizer, Kafka lets any client delete another's topic or abort its transaction, and that is
not what this fuzzer looks for. Names are drawn from bounded pools so that resources stay bounded.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import random
import struct
import types
import typing
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import crc32c

from oncelog.protocol import records as rb
from oncelog.protocol.messages import decode_response, encode_request, request_type
from oncelog.protocol.versions import SUPPORTED_VERSIONS

FUZZ_TOPICS = [f"fuzz-{i}" for i in range(6)]
BAD_TOPICS = ["", ".", "..", "t" * 250, "bad/name", "bad name", "ü-topic", "__consumer_offsets",
              "__transaction_state", "-", "x" * 32767]
FUZZ_GROUPS = [f"fuzz-group-{i}" for i in range(4)] + [""]
FUZZ_TIDS = [f"fuzz-tx-{i}" for i in range(6)]
# Extreme names for fields that name a resource: a fixed set, so that the resources a long run can
# create stay bounded (random names would auto-create topics and groups without end, as in Kafka).
WEIRD_NAMES = ["", "ü-\u2603", "s" * 300, "L" * 32000, "with space", "a/b", "\x00nul"]
CONFIG_KEYS = ["retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes", "segment.bytes",
               "segment.ms", "message.timestamp.type", "min.insync.replicas", "unknown.config", ""]
CONFIG_VALUES = ["-1", "0", "1", "1000", "compact", "delete", "LogAppendTime", "CreateTime", "abc", "",
                 "99999999999999999999", None]

ALTER_CONFIGS_KEYS = (33, 44)  # AlterConfigs, IncrementalAlterConfigs: topics only
INT_RANGES = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
              "int64": (-(2**63), 2**63 - 1)}


def edges(kind: str) -> list[int]:
    lo, hi = INT_RANGES[kind]
    return [lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi]


@dataclass
class FuzzState:
    """What the fuzzer learned from answers (so its requests reach deeper states) and must avoid."""

    protected_pids: set[int] = field(default_factory=set)
    idempotent: list[tuple[int, int]] = field(default_factory=list)  # (producer id, epoch)
    txn: dict[str, tuple[int, int]] = field(default_factory=dict)  # transactional id -> (pid, epoch)
    members: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # group -> (member id, generation)

    def learn(self, api_key: int, body: Any, request: Any) -> None:
        if api_key == 22 and int(body.error_code) == 0:
            pid, epoch = int(body.producer_id), int(body.producer_epoch)
            if pid in self.protected_pids:
                return
            tid = getattr(request, "transactional_id", None)
            if tid:
                self.txn[tid] = (pid, epoch)
            else:
                self.idempotent.append((pid, epoch))
                del self.idempotent[:-20]
        elif api_key == 11:
            member = getattr(body, "member_id", "")
            group = getattr(request, "group_id", "")
            if member:
                lst = self.members.setdefault(group, [])
                lst.append((member, int(getattr(body, "generation_id", -1))))
                del lst[:-10]


@cache
def _fields(entity: type) -> tuple[tuple[str, Any, str | None], ...]:
    hints = typing.get_type_hints(entity)
    return tuple((f.name, hints[f.name], f.metadata.get("kafka_type")) for f in dataclasses.fields(entity))


def supported_pairs() -> list[tuple[int, int]]:
    return [(k, v) for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]


class RequestFuzzer:
    _api = -1

    def __init__(self, rng: random.Random, state: FuzzState | None = None, *, chaos: float = 0.08,
                 pairs: list[tuple[int, int]] | None = None) -> None:
        self.rng = rng
        self.state = state or FuzzState()
        self.chaos = chaos
        self.pairs = pairs or supported_pairs()
        self.corr = 0

    # --- requests ----------------------------------------------------------------------------------
    def request(self, api_key: int | None = None, version: int | None = None) -> tuple[int, int, Any]:
        if api_key is None:
            api_key, version = self.rng.choice(self.pairs)
        elif version is None:
            lo, hi = SUPPORTED_VERSIONS[api_key]
            version = self.rng.randint(lo, hi)
        assert version is not None
        entity = request_type(api_key, version)
        self._api = api_key
        self._txn_pick: tuple[str, int, int] | None = None
        if self.state.txn and self.rng.random() < 0.6:
            tid = self.rng.choice(sorted(self.state.txn))
            self._txn_pick = (tid, *self.state.txn[tid])
        self._member_pick = None
        return api_key, version, self.entity(entity, depth=0)

    def entity(self, entity: type, depth: int) -> Any:
        kwargs = {}
        for name, tp, kind in _fields(entity):
            kwargs[name] = self.value(name, tp, kind, depth)
        return entity(**kwargs)

    def value(self, name: str, tp: Any, kind: str | None, depth: int) -> Any:
        rng = self.rng
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if rng.random() < (0.3 if kind != "records" else 0.03):
                return None
            return self.value(name, args[0], kind, depth)
        if origin is tuple:
            item_t = typing.get_args(tp)[0]
            n = self.count(depth)
            return tuple(self.value(name, item_t, kind, depth + 1) for _ in range(n))
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.entity(tp, depth + 1)
        chaos = rng.random() < self.chaos
        if kind in INT_RANGES:
            v = rng.choice(edges(kind)) if chaos else self.int_for(name, kind)
            lo, hi = INT_RANGES[kind]
            return max(lo, min(hi, v))
        if kind == "timedelta_i32" or kind == "timedelta_i64":
            ms = rng.choice(edges("int32")) if chaos else self.ms_for(name)
            return datetime.timedelta(milliseconds=ms)
        if kind == "bool":
            return rng.random() < 0.5
        if kind == "string":
            return self.string_for(name, chaos)
        if kind == "bytes":
            return self.random_bytes(rng.choice([0, 1, 8, 40, 300]))
        if kind == "records":
            return self.records(name)
        if kind == "uuid":
            return rng.choice([uuid.UUID(int=0), uuid.uuid4()])
        if kind == "float64":
            return rng.choice([0.0, 1.5, -1.0])
        raise AssertionError(f"no generator for {name}: {tp} ({kind})")

    def count(self, depth: int) -> int:
        r = self.rng.random()
        if r < 0.1:
            return 0
        if r < 0.97:
            return self.rng.randint(1, 3 if depth else 4)
        return self.rng.randint(10, 60 if depth else 200)

    # --- values by field name -------------------------------------------------------------------------
    def int_for(self, name: str, kind: str) -> int:
        rng = self.rng
        st = self.state
        n = name.lower()
        if "producer_id" in n:
            if self._txn_pick and rng.random() < 0.7:
                return self._txn_pick[1]
            pool = [p for p, _ in st.idempotent] + [p for p, _ in st.txn.values()]
            pid = rng.choice(pool) if pool and rng.random() < 0.7 else rng.choice([-1, 0, 1, 2, 999, 2**40])
            return pid if pid not in st.protected_pids else -1
        if "producer_epoch" in n:
            if self._txn_pick and rng.random() < 0.7:
                return self._txn_pick[2] + rng.choice([0, 0, 0, 1, -1])
            return rng.choice([-1, 0, 0, 1, 2, 5, 32767])
        if n in ("acks",):
            return rng.choice([-1, -1, 1, 0, 2, -2])
        if "isolation" in n:
            return rng.choice([0, 1, 2, -1])
        if n == "num_partitions":
            return rng.choice([-1, 1, 1, 2, 3, 0, -7, 2**31 - 1, 10_001])
        if n == "count":
            return rng.choice([1, 2, 3, 4, 6, 0, -1, 2**31 - 1])
        if "replication_factor" in n:
            return rng.choice([-1, 1, 1, 2, 0])
        if n.endswith("bytes"):
            return rng.choice([0, 1, 1024, 1 << 20, 50 << 20, 2**31 - 1, -1])
        if "resource_type" in n and self._api in ALTER_CONFIGS_KEYS:
            # The broker's and the cluster's configs are shared with the well-behaved client (a
            # max.message.bytes of 0 for every topic is any client's right without an authorizer).
            return rng.choice([2, 2, 2, 0, -1, 126])
        if "key_type" in n or "resource_type" in n:
            return rng.choice([0, 1, 2, 3, 4, -1, 2])
        if "generation" in n:
            return rng.choice([-1, 0, 1, 2, 3])
        if "timestamp" in n:
            return rng.choice([-1, -2, -3, -4, 0, 1_700_000_000_000, 2**62])
        if "sequence" in n:
            return rng.choice([-1, 0, 1, 2**31 - 1])
        if "offset" in n:
            return rng.choice([-2, -1, 0, 0, 1, 5, 100, rng.randint(0, 5000), 2**63 - 1])
        if "epoch" in n:
            return rng.choice([-1, 0, 1, 2, rng.randint(0, 100)])
        if "partition" in n or n in ("index", "partitions", "partition_indexes"):
            return rng.choice([0, 0, 1, 2, 3, -1, 17, 2**31 - 1])
        if "replica" in n or "broker" in n or "node" in n or "leader" in n:
            return rng.choice([-1, 0, 1, 5])
        if "limit" in n or "max" in n or "min" in n:
            return rng.choice([-1, 0, 1, 10, 1000, 2**31 - 1])
        return rng.choice([0, 0, 1, 2, 3, -1, rng.randint(0, 100)])

    def ms_for(self, name: str) -> int:
        n = name.lower()
        if "session" in n:
            return self.rng.choice([6000, 10000, 30000, 0, 1, 5999, 1_800_001])
        if "rebalance" in n:
            return self.rng.choice([0, 100, 1000, 3000, 60000])
        if "max_wait" in n:
            return self.rng.choice([0, 0, 10, 100, 500, 3000])
        if "transaction_timeout" in n:
            return self.rng.choice([1000, 5000, 10000, 0, -1, 900_001])
        return self.rng.choice([0, 100, 1000, 5000, 30000])

    def string_for(self, name: str, chaos: bool) -> str:
        rng = self.rng
        n = name.lower()
        names_a_resource = any(w in n for w in ("topic", "group", "transactional_id", "resource_name")) or n == "name"
        if chaos:
            return rng.choice(WEIRD_NAMES + BAD_TOPICS) if names_a_resource else self.random_string()
        if "transactional_id" in n:
            if self._txn_pick and rng.random() < 0.8:
                return self._txn_pick[0]
            return rng.choice(FUZZ_TIDS)
        if "group_instance" in n:
            return rng.choice(["fuzz-instance-0", "fuzz-instance-1", ""])
        if "group" in n or n in ("key",) or n.endswith("_group_id"):
            return rng.choice(FUZZ_GROUPS)
        if "member_id" in n:
            members = [m for ms in self.state.members.values() for m, _ in ms]
            if members and rng.random() < 0.7:
                return rng.choice(members)
            return rng.choice(["", "fuzz-member", "x" * 300])
        if "topic" in n or n == "name" or "resource_name" in n:
            if n == "name" and rng.random() < 0.15:
                return rng.choice([*CONFIG_KEYS, "range", "roundrobin", "consumer", ""])
            return rng.choice(FUZZ_TOPICS) if rng.random() < 0.9 else rng.choice(BAD_TOPICS)
        if n == "value":
            return rng.choice([v for v in CONFIG_VALUES if v is not None])
        if "protocol_type" in n:
            return rng.choice(["consumer", "consumer", "connect", ""])
        if "state" in n:
            return rng.choice(["Empty", "Stable", "Ongoing", "PrepareCommit", "Dead", "bogus"])
        return self.random_string()

    def random_string(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return ""
        if r < 0.7:
            return "".join(rng.choice("abcxyz-_.019") for _ in range(rng.randint(1, 20)))
        if r < 0.85:
            return "ünï¢ødé-\u2603-" * rng.randint(1, 5)
        if r < 0.97:
            return "s" * rng.randint(200, 400)
        return "L" * rng.randint(5000, 32000)

    def random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    # --- record batches ------------------------------------------------------------------------------
    def records(self, name: str) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.03:
            return b""
        if r < 0.06:
            return self.random_bytes(rng.choice([1, 10, 60, 61, 100]))
        batch = self.valid_batch()
        r = rng.random()
        if r < 0.45:
            return batch
        if r < 0.65:
            return self.mutate_header(batch)
        if r < 0.8:
            return self.garbage_records(batch)
        if r < 0.9:
            return self.bad_compression(batch)
        if r < 0.95:
            return batch + self.valid_batch()  # two batches
        cut = rng.randint(1, len(batch) - 1)
        return batch[:cut]

    def valid_batch(self) -> bytes:
        rng = self.rng
        n = rng.choice([1, 1, 2, 5, 20, 100])
        recs = []
        for i in range(n):
            key = None if rng.random() < 0.5 else self.random_bytes(rng.randint(0, 20))
            value = None if rng.random() < 0.05 else self.random_bytes(rng.choice([0, 5, 100, 1000]))
            headers = tuple((f"h{j}", None if rng.random() < 0.2 else self.random_bytes(3))
                            for j in range(rng.choice([0, 0, 0, 1, 3])))
            recs.append(rb.encode_record(i, rng.choice([0, i, -5, 10_000]), key, value, headers))
        payload = b"".join(recs)
        codec = rng.choice([0, 0, 0, 1, 2, 3, 4])
        if codec:
            payload = compress(codec, payload)
        attrs = codec
        pid, epoch, seq = -1, -1, -1
        txn_pick = getattr(self, "_txn_pick", None)
        if txn_pick and rng.random() < 0.6:
            pid, epoch, seq = txn_pick[1], txn_pick[2], rng.choice([0, 0, 1, 5])
            attrs |= rb.ATTR_TRANSACTIONAL
        elif self.state.idempotent and rng.random() < 0.4:
            pid, epoch = rng.choice(self.state.idempotent)
            seq = rng.choice([0, 0, 1, 2, 7])
        elif rng.random() < 0.1:
            pid, epoch, seq = rng.choice([0, 1, 5, 2**40]), rng.choice([0, 1]), 0
        if pid in self.state.protected_pids:
            pid, epoch, seq = -1, -1, -1
        if rng.random() < 0.05:
            attrs |= rb.ATTR_CONTROL
        return raw_batch(payload, n, attrs=attrs, pid=pid, epoch=epoch, seq=seq)

    def mutate_header(self, batch: bytes) -> bytes:
        """Change one header field, keep the CRC valid (over the new content)."""
        rng = self.rng
        data = bytearray(batch)
        what = rng.choice(["count", "last_delta", "seq", "epoch", "attrs", "magic", "length", "base_offset",
                           "pid", "timestamps"])
        if what == "count":
            struct.pack_into(">i", data, 57, rng.choice([0, -1, 1, 2, 1000, 2**31 - 1]))
        elif what == "last_delta":
            struct.pack_into(">i", data, 23, rng.choice([-1, 0, 1, 5000, 2**31 - 1]))
        elif what == "seq":
            struct.pack_into(">i", data, 53, rng.choice([-1, 0, 3, 2**31 - 1]))
        elif what == "epoch":
            struct.pack_into(">h", data, 51, rng.choice([-1, 0, 1, 32767]))
        elif what == "attrs":
            struct.pack_into(">h", data, 21, rng.choice([0x20, 0x30, 0x05, 0x06, 0x07, 0x08, 0x7FFF, -1]))
        elif what == "magic":
            data[16] = rng.choice([0, 1, 3, 255])
        elif what == "length":
            struct.pack_into(">i", data, 8, rng.choice([0, 48, 49, len(data), 2**31 - 1, -1]))
            return bytes(data)  # the CRC cannot follow a length that lies
        elif what == "base_offset":
            struct.pack_into(">q", data, 0, rng.choice([-1, 5, 2**62]))
        elif what == "pid":
            pid = rng.choice([-1, 0, 1, 2**62, -5])
            if pid not in self.state.protected_pids:
                struct.pack_into(">q", data, 43, pid)
        else:
            struct.pack_into(">qq", data, 27, rng.choice([-1, 0, 2**62]), rng.choice([-1, 0, 2**62]))
        return fix_crc(data)

    def garbage_records(self, batch: bytes) -> bytes:
        """The batch's header (count, deltas) around garbage or lightly damaged records; CRC valid."""
        rng = self.rng
        data = bytearray(batch)
        body = data[61:]
        if rng.random() < 0.5 or not body:
            body = bytearray(self.random_bytes(rng.randint(1, 200)))
        else:
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        return fix_crc(data[:61] + body)

    def bad_compression(self, batch: bytes) -> bytes:
        rng = self.rng
        data = bytearray(batch)
        codec = rng.choice([1, 2, 3, 4, 5, 6, 7])
        struct.pack_into(">h", data, 21, (struct.unpack_from(">h", data, 21)[0] & ~7) | codec)
        body = bytes(data[61:])
        r = rng.random()
        if r < 0.3:
            body = self.random_bytes(rng.randint(0, 100))  # not a stream of that codec at all
        elif r < 0.5 and codec <= 4:
            body = compress(codec, self.random_bytes(rng.randint(1, 200)))  # a stream of garbage records
        elif r < 0.7 and codec <= 4:
            body = compress(codec, body)[: rng.randint(0, 30)]  # a truncated stream
        elif r < 0.8 and codec <= 4:
            body = bomb(codec, rng.choice([1 << 20, 200 << 20]))  # inflates a lot
        elif body:
            b2 = bytearray(body)
            b2[rng.randrange(len(b2))] ^= 0xFF
            body = bytes(b2)
        return fix_crc(data[:61] + body)

    # --- frames -------------------------------------------------------------------------------------
    def frame(self) -> tuple[bytes, bool, int, int, int, Any, str]:
        """(bytes to send, whether an answer may come, api key, version, correlation id, body, kind).

        kind "ok": a well-formed request; anything else is a frame the broker may close the
        connection on ("fatal" kinds leave the stream unsynchronised: the sender must close)."""
        rng = self.rng
        self.corr = (self.corr + 1) % 2**31
        api_key, version, body = self.request()
        frame = encode_request(api_key, version, self.corr, body, client_id=self.random_client_id())
        expects = not (api_key == 0 and int(getattr(body, "acks", -1)) == 0)
        r = rng.random()
        if r < 0.86:
            return frame, expects, api_key, version, self.corr, body, "ok"
        if r < 0.89:  # flip bytes after the header
            data = bytearray(frame)
            for _ in range(rng.randint(1, 5)):
                i = rng.randrange(12, len(data)) if len(data) > 12 else len(data) - 1
                data[i] = rng.randrange(256)
            return bytes(data), True, api_key, version, self.corr, body, "flipped"
        if r < 0.91:  # honest size, truncated body
            cut = rng.randint(8, max(8, len(frame) - 5))
            data = struct.pack(">i", cut - 4) + frame[4:cut]
            return data, True, api_key, version, self.corr, body, "truncated"
        if r < 0.92:  # trailing garbage inside the frame
            extra = self.random_bytes(rng.randint(1, 20))
            data = struct.pack(">i", len(frame) - 4 + len(extra)) + frame[4:] + extra
            return data, True, api_key, version, self.corr, body, "trailing"
        if r < 0.93:  # a non-nullable array sent as null (length -1, or compact length 0)
            paths = non_nullable_array_paths(body)
            if paths:
                bad = with_path(body, rng.choice(paths), None)
                data = encode_request(api_key, version, self.corr, bad, client_id="fuzz")
                return data, True, api_key, version, self.corr, bad, "null-array"
        if r < 0.935 and version >= FLEXIBLE_FROM.get(api_key, 99):  # a compact array announcing 2**32 entries
            positions = compact_array_positions(frame)
            if positions:
                at, size = rng.choice(positions)
                data = frame[:at] + rng.choice([b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\x07"]) + frame[at + size:]
                data = struct.pack(">i", len(data) - 4) + data[4:]
                return data, True, api_key, version, self.corr, body, "huge-array"
        if r < 0.94:  # unsupported version or unknown key
            data = bytearray(frame)
            if rng.random() < 0.5:
                struct.pack_into(">h", data, 6, rng.choice([-1, 99, SUPPORTED_VERSIONS[api_key][1] + 1]))
            else:
                struct.pack_into(">h", data, 4, rng.choice([-1, 4, 5, 6, 7, 17, 21, 999, 32767]))
            return bytes(data), True, api_key, version, self.corr, body, "version"
        if r < 0.96:  # size prefix announces more than is sent: the sender then goes away
            return struct.pack(">i", len(frame) + rng.randint(1, 10_000)) + frame[4:], False, api_key, version, \
                self.corr, body, "fatal-short"
        if r < 0.98:  # oversized or negative frame size
            size = rng.choice([-1, -(2**31), 2**31 - 1, 200 << 20])
            return struct.pack(">i", size) + frame[4:64], False, api_key, version, self.corr, body, "fatal-size"
        # a header too short to read
        n = rng.randint(0, 7)
        return struct.pack(">i", n) + frame[4:4 + n], False, api_key, version, self.corr, body, "fatal-tiny"

    def random_client_id(self) -> str:
        return self.rng.choice(["fuzz", "", "ü", "c" * 300])

    def learn(self, api_key: int, version: int, frame: bytes, body: Any) -> None:
        """Feed a response frame (without its size prefix) back into the state."""
        try:
            _, resp = decode_response(api_key, version, frame)
        except Exception:
            return
        self.state.learn(api_key, resp, body)


def compress(codec: int, data: bytes) -> bytes:
    if codec == 1:
        return gzip.compress(data, compresslevel=1)
    if codec == 2:
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    from oncelog.protocol.compression import _zstd_module

    return bytes(_zstd_module().compress(data))


FLEXIBLE_FROM = {k: next((v for v in range(lo, hi + 1) if request_type(k, v).__flexible__), 99)
                 for k, (lo, hi) in SUPPORTED_VERSIONS.items()}


# --- the layout of a flexible request, to find its compact array lengths ---------------------------
_FIXED = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
          "float64": 8, "bool": 1, "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8, "datetime_i64": 8}
_LENGTH_PREFIXED = {"string", "bytes", "records"}


class _FrameTooShort(Exception):
    """The walk ran off the frame."""


@cache
def _layout(entity_type: type) -> tuple[tuple[str, bool, Any], ...]:
    """Inline fields of a flexible entity in wire order: (kafka type or "entity", is array, entity
    type or None). Tagged fields live in the tagged section and are skipped with it."""
    hints = typing.get_type_hints(entity_type)
    out: list[tuple[str, bool, Any]] = []
    for f in dataclasses.fields(entity_type):
        if "tag" in f.metadata:
            continue
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        is_array = typing.get_origin(tp) is tuple
        if is_array:
            tp = typing.get_args(tp)[0]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.append(("entity", is_array, tp))
        else:
            out.append((f.metadata["kafka_type"], is_array, None))
    return tuple(out)


def _uvarint_at(frame: bytes, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if p >= len(frame) or shift > 63:
            raise _FrameTooShort
        b = frame[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7



def compact_array_positions(frame: bytes) -> list[tuple[int, int]]:
    """(position, size) of every compact array length in a flexible request frame (size prefix
    included), found by walking the body with the broker's own layout of the schema."""
    from oncelog.protocol.messages import _reader

    api_key, version = struct.unpack_from(">hh", frame, 4)
    entity = request_type(api_key, version)
    _, pos = _reader(entity.__header_schema__)(frame[4:], 0)
    found: list[tuple[int, int]] = []

    def walk(p: int, t: type) -> int:
        for kind, is_array, nested in _layout(t):
            count = 1
            if is_array:
                start = p
                raw, p = _uvarint_at(frame, p)
                found.append((start, p - start))
                count = raw - 1
                if count <= 0:
                    continue
            if nested is not None:
                for _ in range(count):
                    p = walk(p, nested)
            elif kind in _FIXED:
                p += _FIXED[kind] * count
            else:
                assert kind in _LENGTH_PREFIXED
                for _ in range(count):
                    raw, p = _uvarint_at(frame, p)
                    p += max(raw - 1, 0)
        tags, p = _uvarint_at(frame, p)
        for _ in range(tags):
            _tag, p = _uvarint_at(frame, p)
            size, p = _uvarint_at(frame, p)
            p += size
        return p

    end = walk(pos + 4, entity)
    assert end == len(frame), (api_key, version, end, len(frame))
    return found


Path = tuple[Any, ...]  # field names, or (field name, index) to step into an array's item


def non_nullable_array_paths(entity: Any, prefix: Path = ()) -> list[Path]:
    """Paths to every array field of ``entity`` (and of its items) whose schema forbids null."""
    out: list[Path] = []
    for name, tp, _kind in _fields(type(entity)):
        value = getattr(entity, name)
        nullable = typing.get_origin(tp) in (typing.Union, types.UnionType)
        if isinstance(value, tuple):
            if not nullable:
                out.append((*prefix, name))
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    out += non_nullable_array_paths(item, (*prefix, (name, i)))
        elif dataclasses.is_dataclass(value):
            out += non_nullable_array_paths(value, (*prefix, name))
    return out


def with_path(entity: Any, path: Path, value: Any) -> Any:
    """A copy of the frozen ``entity`` with the field at ``path`` set to ``value``."""
    head, *rest = path
    if isinstance(head, tuple):
        name, i = head
        items = list(getattr(entity, name))
        items[i] = with_path(items[i], tuple(rest), value)
        return dataclasses.replace(entity, **{name: tuple(items)})
    if not rest:
        return dataclasses.replace(entity, **{head: value})
    return dataclasses.replace(entity, **{head: with_path(getattr(entity, head), tuple(rest), value)})


@cache
def bomb(codec: int, size: int) -> bytes:
    return compress(codec, b"\x00" * size)


def fix_crc(data: bytes | bytearray) -> bytes:
    out = bytearray(data)
    if len(out) >= 21:
        struct.pack_into(">i", out, 8, len(out) - 12)
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def raw_batch(payload: bytes, count: int, *, attrs: int = 0, pid: int = -1, epoch: int = -1, seq: int = -1,
              base_timestamp: int = 1_700_000_000_000) -> bytes:
    head = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, attrs, count - 1, base_timestamp, base_timestamp,
                       pid, epoch, seq, count)
    return fix_crc(head + payload)
