"""Produce: validate each partition's record batches and append them.

``records_refusal`` first answers what Kafka's ProduceRequest.validateRecords answers (no whole
batch, a bad length or magic, a second batch); then ``PartitionLog.append`` checks headers, CRCs
and records (walked in place, never decoded into objects), the producer state (idempotence,
epochs, transactions) and assigns offsets. Errors are per partition; one bad
partition does not fail the others. acks=0 gets no response at all, as in Kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from functools import partial
from typing import TYPE_CHECKING, Any

from oncelog.protocol import records
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.authz import Op, R, allowed, create_topic_allowed
from oncelog.server.topics import ensure_topic
from oncelog.storage import errors as storage_errors
from oncelog.storage.fileio import StorageOfflineError
from oncelog.storage.refusals import storage_refused

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")


def _error(index: int, code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_append_time": -1,
            "log_start_offset": -1, "error_message": message}


def produce_partition(broker: Broker, req: Request, topic: str, partition: int, data: bytes | None,
                      transactional_id: str | None,
                      durability: list[tuple[Any, int]] | None = None) -> dict[str, Any]:
    """One partition's append; with ``durability`` given, an append that must be fsynced before it
    is acknowledged (flush_every_append) adds (partition log, offset) there instead of fsyncing."""
    if not allowed(broker, req, Op.WRITE, R.TOPIC, topic):
        return _error(partition, ErrorCode.topic_authorization_failed)
    info, err = ensure_topic(broker, topic, may_create=partial(create_topic_allowed, broker, req, topic))
    if info is None:
        return _error(partition, err)
    if info.is_internal:
        return _error(partition, ErrorCode.invalid_topic_exception, "cannot produce to an internal topic")
    plog = broker.logs.get_partition(topic, partition)
    if plog is None:
        return _error(partition, ErrorCode.unknown_topic_or_partition)
    data = data or b""  # null records: as empty ones
    refused = records_refusal(data, req.api_version)
    if refused is not None:
        return _error(partition, *refused)
    first = records.read_header(data, 0)
    code = broker.check_produce(first.producer_id, first.producer_epoch, transactional_id, first.is_transactional,
                                topic, partition)
    if code != ErrorCode.none:
        return _error(partition, code)
    if req.body.acks == -1 and plog.config.min_insync_replicas > 1:
        # The in-sync replica set of a single node is itself (Kafka's Partition.appendRecordsToLeader).
        return _error(partition, ErrorCode.not_enough_replicas,
                      f"The size of the current ISR (1) is insufficient to satisfy the min.isr requirement of "
                      f"{plog.config.min_insync_replicas} for partition {topic}-{partition}")
    try:
        result = plog.append(data, defer_sync=durability is not None)
    except records.InvalidRecordError as exc:
        log.warning("rejecting invalid batch for %s-%d: %s", topic, partition, exc)
        return _error(partition, ErrorCode(exc.error_code), str(exc))
    except storage_errors.RecordTooLargeError as exc:
        return _error(partition, ErrorCode.message_too_large, str(exc))
    except storage_errors.InvalidTimestampError as exc:
        return _error(partition, ErrorCode.invalid_timestamp, str(exc))
    except storage_errors.KeylessRecordError as exc:
        return {**_error(partition, ErrorCode.invalid_record, str(exc)), "log_start_offset": plog.log_start_offset,
                "record_errors": [{"batch_index": i, "batch_index_error_message": m} for i, m in exc.record_errors]}
    except storage_errors.ProducerStateError as exc:
        return _error(partition, ErrorCode(exc.error_code), str(exc))
    except (storage_errors.DiskFullError, storage_errors.SegmentRollRefusedError) as exc:
        # Out of disk space or descriptors: retriable (retention may free room), the broker stays up.
        storage_refused(exc)
        return _error(partition, ErrorCode.kafka_storage_error, str(exc))
    except StorageOfflineError as exc:
        broker.storage_failed(exc)
        return _error(partition, ErrorCode.kafka_storage_error, str(exc))
    if durability is not None and plog.must_sync:
        durability.append((plog, result.last_offset + 1))
    elif first.is_transactional:
        broker.sync_behind(plog, len(data))
    if not result.duplicate:
        broker.notify_append((topic, partition))
    return {"index": partition, "error_code": ErrorCode.none, "base_offset": result.base_offset,
            "log_append_time": result.log_append_time_ms, "log_start_offset": result.log_start_offset,
            "error_message": None}


def records_refusal(data: bytes, version: int) -> tuple[ErrorCode, str] | None:
    """What Kafka answers a partition's records before appending them, in its order: its
    ProduceRequest.validateRecords (every version we serve is v3+), which reads them as
    ByteBufferLogInputStream does (``records.complete_batch_size``), then UnifiedLog's check that the
    batch is longer than its header. None: one complete RecordBatch v2, nothing after it.

    - no complete batch (empty, fewer than 12 or 17 bytes, a length past the data): INVALID_RECORD;
    - a length below 14, or a magic outside 0-2: CORRUPT_MESSAGE (checked before the batch is whole);
    - magic 0 or 1: INVALID_RECORD; zstd before v7: UNSUPPORTED_COMPRESSION_TYPE;
    - a second complete batch: INVALID_RECORD (a second one whose length or magic is bad: CORRUPT_MESSAGE);
    - a batch shorter than its 61-byte header: CORRUPT_MESSAGE.

    Bytes after the batch that are not a whole batch are refused too (INVALID_RECORD), where Kafka
    drops them and appends the batch (UnifiedLog.trimInvalidBytes): no client sends them."""
    requests = f"Produce requests with version {version}"
    try:
        size = records.complete_batch_size(data)
        if size is None:
            return ErrorCode.invalid_record, f"{requests} must have at least one record batch per partition"
        if data[16] != records.MAGIC_V2:
            return ErrorCode.invalid_record, \
                f"{requests} are only allowed to contain record batches with magic version 2"
        if version < 7 and data[22] & records.ATTR_COMPRESSION_MASK == 4:  # the attributes' low byte
            return ErrorCode.unsupported_compression_type, f"{requests} are not allowed to use ZStandard compression"
        if records.complete_batch_size(data, size) is not None:
            return ErrorCode.invalid_record, \
                f"{requests} are only allowed to contain exactly one record batch per partition"
    except records.InvalidRecordError as exc:
        return ErrorCode.corrupt_message, str(exc)
    if size < records.HEADER_SIZE:
        return ErrorCode.corrupt_message, \
            f"Record batch is corrupt (the size {size} is smaller than the minimum allowed overhead 61)"
    if size < len(data):
        return ErrorCode.invalid_record, f"{len(data) - size} bytes after the record batch are not a record batch"
    return None


def _has_transactional_records(body: Any) -> bool:
    """Kafka's RequestUtils.hasTransactionalRecords: some partition's batch is transactional (a batch
    whose header cannot be read is answered per partition later)."""
    for topic_data in body.topic_data:
        for pd in topic_data.partition_data:
            try:
                if pd.records and records.read_header(pd.records, 0).is_transactional:
                    return True
            except records.InvalidRecordError:
                continue
    return False


def handle_produce(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any] | None] | None:
    """Appends happen now, atomically; when some must be fsynced first (flush_every_append) the
    response waits for the broker's group commit, off the event loop (an awaitable is returned).

    Authorization is Kafka's handleProduceRequest: a request carrying a transactional batch needs a
    transactional id and WRITE on it (else every partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    each partition needs WRITE on its topic. Idempotent batches are not checked here: IDEMPOTENT_WRITE
    was checked when InitProducerId handed out the producer id."""
    body = req.body
    durability: list[tuple[Any, int]] = []
    transactional_id = getattr(body, "transactional_id", None)
    responses = []
    valid_acks = body.acks in (-1, 0, 1)
    txn_denied = _has_transactional_records(body) and (
        transactional_id is None or not allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, transactional_id))
    for topic_data in body.topic_data:
        if txn_denied:
            parts = [_error(pd.index, ErrorCode.transactional_id_authorization_failed)
                     for pd in topic_data.partition_data]
        elif valid_acks:
            parts = [produce_partition(broker, req, topic_data.name, pd.index, pd.records, transactional_id,
                                       durability)
                     for pd in topic_data.partition_data]
        else:
            parts = [_error(pd.index, ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {body.acks}")
                     for pd in topic_data.partition_data]
        responses.append({"name": topic_data.name, "partition_responses": parts})
    nbytes = sum(len(pd.records or b"") for t in body.topic_data for pd in t.partition_data)
    throttle = broker.throttle(req, broker.produce_quota, nbytes)
    response = None if body.acks == 0 else {"responses": responses, "throttle_time": throttle}
    if not durability:
        return response
    return AnsweredWhenDurable.after_appends(broker, durability, response)
