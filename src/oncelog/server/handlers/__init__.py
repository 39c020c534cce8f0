"""Request handlers, one module per API family. Each takes (broker, request) and returns a dict (the
response body as plain data, built per version by ``protocol.messages.build``), a kio response, an
awaitable of either, or None when no response must be sent (acks=0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oncelog.protocol import versions as v
from oncelog.server.handlers import (
    acls,
    admin,
    configs,
    coordinator_lookup,
    fetch,
    group,
    leader_epochs,
    leaders,
    list_offsets,
    metadata,
    produce,
    records,
    sasl,
    scram_credentials,
    txn,
)

Handler = Callable[[Any, Any], Any]

HANDLERS: dict[int, Handler] = {
    v.API_API_VERSIONS: metadata.handle_api_versions,
    v.API_METADATA: metadata.handle_metadata,
    v.API_DESCRIBE_CLUSTER: metadata.handle_describe_cluster,
    v.API_PRODUCE: produce.handle_produce,
    v.API_FETCH: fetch.handle_fetch,
    v.API_LIST_OFFSETS: list_offsets.handle_list_offsets,
    v.API_OFFSET_FOR_LEADER_EPOCH: leader_epochs.handle_offset_for_leader_epoch,
    v.API_ELECT_LEADERS: leaders.handle_elect_leaders,
    v.API_CREATE_TOPICS: admin.handle_create_topics,
    v.API_DELETE_TOPICS: admin.handle_delete_topics,
    v.API_CREATE_PARTITIONS: admin.handle_create_partitions,
    v.API_DELETE_RECORDS: records.handle_delete_records,
    v.API_DESCRIBE_LOG_DIRS: records.handle_describe_log_dirs,
    v.API_DESCRIBE_CONFIGS: configs.handle_describe_configs,
    v.API_ALTER_CONFIGS: configs.handle_alter_configs,
    v.API_INCREMENTAL_ALTER_CONFIGS: configs.handle_incremental_alter_configs,
    v.API_FIND_COORDINATOR: coordinator_lookup.handle_find_coordinator,
    v.API_INIT_PRODUCER_ID: txn.handle_init_producer_id,
    v.API_ADD_PARTITIONS_TO_TXN: txn.handle_add_partitions_to_txn,
    v.API_ADD_OFFSETS_TO_TXN: txn.handle_add_offsets_to_txn,
    v.API_END_TXN: txn.handle_end_txn,
    v.API_DESCRIBE_PRODUCERS: txn.handle_describe_producers,
    v.API_DESCRIBE_TRANSACTIONS: txn.handle_describe_transactions,
    v.API_LIST_TRANSACTIONS: txn.handle_list_transactions,
    v.API_WRITE_TXN_MARKERS: txn.handle_write_txn_markers,
    v.API_JOIN_GROUP: group.handle_join_group,
    v.API_SYNC_GROUP: group.handle_sync_group,
    v.API_HEARTBEAT: group.handle_heartbeat,
    v.API_LEAVE_GROUP: group.handle_leave_group,
    v.API_OFFSET_COMMIT: group.handle_offset_commit,
    v.API_OFFSET_FETCH: group.handle_offset_fetch,
    v.API_TXN_OFFSET_COMMIT: group.handle_txn_offset_commit,
    v.API_LIST_GROUPS: group.handle_list_groups,
    v.API_DESCRIBE_GROUPS: group.handle_describe_groups,
    v.API_DELETE_GROUPS: group.handle_delete_groups,
    v.API_OFFSET_DELETE: group.handle_offset_delete,
    v.API_DESCRIBE_ACLS: acls.handle_describe_acls,
    v.API_CREATE_ACLS: acls.handle_create_acls,
    v.API_DELETE_ACLS: acls.handle_delete_acls,
    # Authentication and users (oncelog.security).
    v.API_SASL_HANDSHAKE: sasl.handle_sasl_handshake,
    v.API_SASL_AUTHENTICATE: sasl.handle_sasl_authenticate,
    v.API_DESCRIBE_USER_SCRAM_CREDENTIALS: scram_credentials.handle_describe_user_scram_credentials,
    v.API_ALTER_USER_SCRAM_CREDENTIALS: scram_credentials.handle_alter_user_scram_credentials,
}
