"""The versions of each API this broker serves: the single source for ApiVersions and dispatch.

Minimums stay low because aiokafka speaks only old, non-flexible versions; maximums stop before the
versions that need topic ids in Produce/Fetch or features we do not have. The server advertises
only the keys that have a handler, so an entry here is inert until one exists (librdkafka starts
using whatever is advertised).
"""

from __future__ import annotations

from typing import Final

from kio.schema.index import api_key_map

API_PRODUCE: Final = 0
API_FETCH: Final = 1
API_LIST_OFFSETS: Final = 2
API_METADATA: Final = 3
API_OFFSET_COMMIT: Final = 8
API_OFFSET_FETCH: Final = 9
API_FIND_COORDINATOR: Final = 10
API_JOIN_GROUP: Final = 11
API_HEARTBEAT: Final = 12
API_LEAVE_GROUP: Final = 13
API_SYNC_GROUP: Final = 14
API_DESCRIBE_GROUPS: Final = 15
API_LIST_GROUPS: Final = 16
API_SASL_HANDSHAKE: Final = 17
API_API_VERSIONS: Final = 18
API_CREATE_TOPICS: Final = 19
API_DELETE_TOPICS: Final = 20
API_DELETE_RECORDS: Final = 21
API_INIT_PRODUCER_ID: Final = 22
API_OFFSET_FOR_LEADER_EPOCH: Final = 23
API_ADD_PARTITIONS_TO_TXN: Final = 24
API_ADD_OFFSETS_TO_TXN: Final = 25
API_END_TXN: Final = 26
API_WRITE_TXN_MARKERS: Final = 27
API_TXN_OFFSET_COMMIT: Final = 28
API_DESCRIBE_ACLS: Final = 29
API_CREATE_ACLS: Final = 30
API_DELETE_ACLS: Final = 31
API_DESCRIBE_CONFIGS: Final = 32
API_ALTER_CONFIGS: Final = 33
API_DESCRIBE_LOG_DIRS: Final = 35
API_SASL_AUTHENTICATE: Final = 36
API_CREATE_PARTITIONS: Final = 37
API_DELETE_GROUPS: Final = 42
API_ELECT_LEADERS: Final = 43
API_INCREMENTAL_ALTER_CONFIGS: Final = 44
API_OFFSET_DELETE: Final = 47
API_DESCRIBE_USER_SCRAM_CREDENTIALS: Final = 50
API_ALTER_USER_SCRAM_CREDENTIALS: Final = 51
API_DESCRIBE_CLUSTER: Final = 60
API_DESCRIBE_PRODUCERS: Final = 61
API_DESCRIBE_TRANSACTIONS: Final = 65
API_LIST_TRANSACTIONS: Final = 66

SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    API_PRODUCE: (3, 9),
    API_FETCH: (4, 12),
    API_LIST_OFFSETS: (1, 7),
    API_METADATA: (0, 12),
    API_OFFSET_COMMIT: (2, 8),
    API_OFFSET_FETCH: (1, 8),
    API_FIND_COORDINATOR: (0, 3),
    API_JOIN_GROUP: (0, 7),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 4),
    API_SYNC_GROUP: (0, 5),
    API_DESCRIBE_GROUPS: (0, 5),
    API_LIST_GROUPS: (0, 4),
    API_SASL_HANDSHAKE: (0, 1),  # librdkafka before 2.x only sees SASL when v0 is advertised
    API_API_VERSIONS: (0, 3),
    API_CREATE_TOPICS: (2, 7),
    API_DELETE_TOPICS: (1, 6),
    API_DELETE_RECORDS: (0, 2),
    API_INIT_PRODUCER_ID: (0, 4),
    API_OFFSET_FOR_LEADER_EPOCH: (2, 4),
    API_ADD_PARTITIONS_TO_TXN: (0, 3),
    API_ADD_OFFSETS_TO_TXN: (0, 3),
    API_END_TXN: (0, 3),
    API_TXN_OFFSET_COMMIT: (0, 3),
    API_WRITE_TXN_MARKERS: (1, 1),
    API_DESCRIBE_ACLS: (1, 3),
    API_CREATE_ACLS: (1, 3),
    API_DELETE_ACLS: (1, 3),
    API_DESCRIBE_CONFIGS: (1, 4),
    API_ALTER_CONFIGS: (0, 2),
    API_INCREMENTAL_ALTER_CONFIGS: (0, 1),
    API_DESCRIBE_LOG_DIRS: (1, 4),
    API_SASL_AUTHENTICATE: (0, 2),
    API_CREATE_PARTITIONS: (0, 3),
    API_DELETE_GROUPS: (0, 2),
    API_ELECT_LEADERS: (0, 2),
    API_OFFSET_DELETE: (0, 0),
    API_DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    API_ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    API_DESCRIBE_CLUSTER: (0, 1),
    API_DESCRIBE_PRODUCERS: (0, 0),
    API_DESCRIBE_TRANSACTIONS: (0, 0),
    API_LIST_TRANSACTIONS: (0, 1),
}


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"unknown({api_key})")
