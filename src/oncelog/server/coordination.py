"""Glue between the sans-IO coordinators and the logs: records, then replay.

Invariants:
- Coordinator state changes only by ``replay``: a handler's records are appended to the internal log
  first, then replayed. Startup replays every record of the internal logs through the same methods,
  so recovery runs the code that normal operation runs.
- A transaction step (``apply_txn_result``, or ``answer_when_durable`` for the requests of a client)
  makes the transaction's data durable (commit), appends its records to ``__transaction_state`` and
  makes them durable, replays them, writes the COMMIT/ABORT markers into every partition of the
  transaction (and the group's offsets partition) and makes them durable, then appends and replays
  the Complete* transition. ``apply_txn_result`` does it without awaiting (loading, before the
  broker serves anyone; and callers outside an event loop); ``answer_when_durable`` (a client's
  request, an admin abort) and ``start_step`` (the timeout scan) do the same steps in the same
  order with every fsync on the broker's sync threads, so the event loop serves other clients
  meanwhile. No request observes a
  half-done step: from the moment the result is computed until its last record is replayed, its
  transactional id is *pending* in the coordinator, which answers every request about it with
  CONCURRENT_TRANSACTIONS (Kafka's ``pendingState``), and each record is replayed only once it is
  durable, so nothing is decided on a state that a power cut could still take back.
- A crash between PrepareCommit and CompleteCommit (tests/faults/fault_broker.py injects one) leaves
  the Prepare* record in the log; on restart
  ``pending_markers()`` lists it and the markers are written again (writing a marker twice is
  harmless: the second finds no open transaction for the producer and is a no-op for the LSO).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from oncelog.coordinator.group.group_coordinator import GroupCoordinator
from oncelog.coordinator.group.offset_records import decode as decode_offset_record
from oncelog.coordinator.producer_ids import ProducerIdManager
from oncelog.coordinator.transaction.coordinator import TransactionCoordinator, TxnResult
from oncelog.protocol import records as rb
from oncelog.protocol.errors import ErrorCode
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.internal_log import encode_batch, encoded_bytes, read_all
from oncelog.storage import fileio
from oncelog.storage.errors import DiskFullError, ProducerStateError
from oncelog.storage.partition_log import AppendOrigin
from oncelog.storage.refusals import once_a_minute, storage_refused

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

T = TypeVar("T")

TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
#: Kafka's Topic.isInternal, by name: the topics made here with ``internal=True`` (so
#: ``TopicInfo.is_internal``), which no client may add to a transaction even before they exist.
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def _collect(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


#: Live records per batch of a checkpoint (``Coordination.checkpoint_internal_logs``).
CHECKPOINT_BATCH_RECORDS = 500


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Coordination:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        logs = broker.logs
        for name, n in ((TRANSACTION_STATE_TOPIC, cfg.transaction_state_log_num_partitions),
                        (CONSUMER_OFFSETS_TOPIC, cfg.offsets_topic_num_partitions)):
            if name not in logs.topics():
                logs.create_topic(name, n, {}, internal=True)
        self.producer_ids = ProducerIdManager(cfg.data_dir / "__meta" / "producer_ids")
        self.txn = TransactionCoordinator(
            self.producer_ids, broker.clock,
            transaction_max_timeout_ms=cfg.transaction_max_timeout_ms,
            transactional_id_expiration_ms=cfg.transactional_id_expiration_ms,
            offsets_partition_for=self.offsets_partition_for,
            transactional_id_max_entries=cfg.transactional_id_max_entries,
        )
        self.groups = GroupCoordinator(
            broker.clock, group_min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            group_max_session_timeout_ms=cfg.group_max_session_timeout_ms,
            group_initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
            offsets_retention_ms=cfg.offsets_retention_minutes * 60_000,
            group_max_record_bytes=cfg.message_max_bytes,
            store_refused=lambda group_id, size: self.group_store_refused(group_id, size) is not None,
            group_max_count=cfg.group_max_count)
        self._groups_refused_reported = 0
        self._checkpoint_bytes: dict[str, int] = {}  # per internal partition: size of its last checkpoint
        self._steps: set[asyncio.Task[None]] = set()  # steps in flight (start_step: the timeout scan's and clients')

    # --- partitions of internal topics ---------------------------------------------------------
    def offsets_partition_for(self, group_id: str) -> tuple[str, int]:
        n = self.broker.logs.topics()[CONSUMER_OFFSETS_TOPIC].num_partitions
        return CONSUMER_OFFSETS_TOPIC, zlib.crc32(group_id.encode()) % n

    def _txn_log(self) -> Any:
        plog = self.broker.logs.get_partition(TRANSACTION_STATE_TOPIC, 0)
        assert plog is not None
        return plog

    # --- loading --------------------------------------------------------------------------------
    def load(self, clean_shutdown: bool = True) -> None:
        """Replay the internal logs, finish what a crash interrupted, and abort what it broke.

        ``clean_shutdown`` is False when the previous run did not stop cleanly (kill -9, power
        loss): then, unless every append was fsynced, open transactions are aborted.
        """
        n = 0
        for rec in read_all(self._txn_log()):
            if rec.key is not None:
                self.txn.replay(rec.key, rec.value)
                n += 1
        self.groups.loading = True
        offsets_info = self.broker.logs.topics()[CONSUMER_OFFSETS_TOPIC]
        n_offsets = 0
        for p in range(offsets_info.num_partitions):
            plog = self.broker.logs.get_partition(CONSUMER_OFFSETS_TOPIC, p)
            for rec in read_all(plog):
                if rec.control is not None:
                    self.groups.replay_control(rec.producer_id, rec.control == rb.CONTROL_COMMIT)
                elif rec.key is not None:
                    self.groups.replay(rec.key, rec.value, rec.producer_id, rec.transactional, rec.offset)
                    n_offsets += 1
        self.groups.loaded()
        log.info("loaded %d consumer offsets record(s), %d group(s)", n_offsets, len(self.groups.groups))
        self._producer_ids_above_the_logs()
        if stale := self.groups.offsets_of_missing_topics(set(self.broker.logs.topics())):
            log.warning("removing %d committed offset(s) of deleted topics (the broker stopped before "
                        "their removal was durable)", len(stale))
            self.apply_records_by_group(stale)
        pending = self.txn.pending_markers()
        log.info("loaded %d transaction log record(s); %d transaction(s) to complete", n, len(pending))
        for markers in pending:
            try:
                self._complete(markers)
            except fileio.StorageOfflineError:
                raise
            except Exception:
                # Nothing a client wrote may stop the broker from starting; the transaction stays in
                # Prepare* and is completed on the next start (or aborted by an admin).
                log.exception("could not complete transaction %r at load; it stays %s",
                              markers.transactional_id, "PrepareCommit" if markers.commit else "PrepareAbort")
        if not clean_shutdown and not self.broker.config.flush_every_append:
            self._abort_open_transactions_after_a_crash()
        self._abort_hanging_transactions()

    def _producer_ids_above_the_logs(self) -> None:
        """The producer id block file is one small file beside the logs; if it was lost or is older
        than they are, the next ids start above every id the logs hold (``ensure_above``)."""
        seen = max((pid for plog in self.broker.logs.partitions().values() for pid in plog.producer_state.producers),
                   default=-1)
        for meta in self.txn.transactions.values():
            seen = max(seen, meta.producer_id, meta.previous_producer_id)
        if self.producer_ids.ensure_above(seen):
            log.warning("producer id block file %s was behind the logs (producer id %d in use): producer ids now "
                        "start at %d", self.producer_ids.path, seen, seen + 1)

    def _abort_open_transactions_after_a_crash(self) -> None:
        """After an unclean stop with background fsync, a transaction that was Ongoing may have lost
        acknowledged records in some of its partitions (the unflushed tail) and kept them in others:
        committing it now would tear it. Abort each one as a timeout would (epoch bump: its producer
        learns the outcome as PRODUCER_FENCED instead of a commit that silently lost records)."""
        for tid in self.txn.open_transactions():
            log.warning("aborting transaction %r: it was open when the broker stopped uncleanly and some of "
                        "its unflushed records may be lost", tid)
            self.apply_txn_result(self.txn.abort_transaction(tid))

    def _abort_hanging_transactions(self) -> None:
        """Abort transactions open in a partition that the coordinator does not know as open there.

        With the durability order of ``apply_txn_result`` this finds nothing; it is the safety net
        for a log damaged below it (or written by an older version): such a transaction can never
        be completed by anyone, and it would hold the partition's LSO forever.
        """
        for (topic, partition), plog in self.broker.logs.partitions().items():
            for pid in list(plog.producer_state.ongoing):
                if self.txn.is_tracked(pid, topic, partition):
                    continue
                entry = plog.producer_state.producers[pid]
                coordinator_epoch = max(entry.coordinator_epoch, self.txn.coordinator_epoch)
                batch = rb.build_control_batch(rb.CONTROL_ABORT, producer_id=pid, producer_epoch=entry.producer_epoch,
                                               coordinator_epoch=coordinator_epoch,
                                               timestamp_ms=self.broker.clock.now_ms())
                try:
                    plog.append(batch, origin=AppendOrigin.COORDINATOR)
                    plog.sync()
                except ProducerStateError as exc:
                    log.error("%s-%d: cannot abort the hanging transaction of producer %d: %s", topic, partition,
                              pid, exc)
                    continue
                log.warning("%s-%d: aborted a hanging transaction of producer %d (epoch %d) that the transaction "
                            "coordinator does not know", topic, partition, pid, entry.producer_epoch)
                self.on_marker(topic, partition, pid, False)

    # --- transactions ---------------------------------------------------------------------------
    def apply_txn_result(self, result: Any) -> None:
        """Append, replay and carry out one coordinator step, each part durable in this order:

        1. for a commit, the transaction's data in every partition (fsync): no PrepareCommit, and so
           no COMMIT marker, can become durable before the data it covers;
        2. the transaction log records (fsync, unless the step is a Complete*): an epoch bump, an
           Ongoing or a Prepare* is durable before the client hears of it and before any marker;
        3. the markers, in every partition (fsync);
        4. the Complete* record (not fsynced: if lost, the Prepare* is replayed and 3 redone).

        So after any power cut a transaction is whole or absent in every partition, and a retried
        EndTxn never meets a CompleteCommit that stands for a different, lost transaction (its
        AddPartitions' Ongoing was durable before the client could send data, and an Ongoing found
        after an unclean stop is aborted by :meth:`load`).
        """
        if result.records:
            for markers in result.markers:
                if markers.commit:
                    self._sync_partitions(markers.partitions)
            txn_log = self._append_txn_records(result.records)
            if result.durable:
                txn_log.sync()
            self._replay_txn_records(result.records)
        for markers in result.markers:
            self._complete(markers)

    def _append_txn_records(self, records: list[tuple[bytes, bytes | None]], *, defer_sync: bool = False) -> Any:
        """Append to ``__transaction_state`` (``defer_sync``: never fsync here, even with
        flush_every_append; the caller awaits :meth:`Broker.durable`). Returns the log."""
        txn_log = self._txn_log()
        txn_log.append(encode_batch(records, self.broker.clock.now_ms()), origin=AppendOrigin.COORDINATOR,
                       defer_sync=defer_sync)
        return txn_log

    def _replay_txn_records(self, records: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in records:
            self.txn.replay(key, value)

    def answer_when_durable(self, transactional_id: str, result: TxnResult, answer: Callable[[TxnResult], T],
                            *, bounded: bool = False) -> T | Awaitable[T]:
        """A client's transaction step: ``answer(result)`` at once when the result changes nothing;
        otherwise an awaitable of it, ready once every step of :meth:`apply_txn_result` is done
        and durable, in its order, each fsync on the sync thread.

        ``bounded``: a step by which a client's request adds to the transaction log
        (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn) is refused when its records would eat
        into ``log_dir_min_free_bytes``. It is answered NOT_COORDINATOR, as Kafka answers a storage
        error of the transaction log, and nothing of it is written or replayed (the coordinator
        computes a step without changing its state). A client creating transactional ids in a loop
        would otherwise fill the disk. The steps that finish what is written (EndTxn, the markers,
        the timeout's abort) are never refused.

        The transactional id is pending from now until its last record is replayed (module doc). The
        steps start now, as a task of their own, whether or not anyone awaits the answer: a client
        that hangs up (its request cancelled) does not stop a step halfway, which would leave records
        in the log that were never replayed; and a connection lost before its request's task ran
        closes the returned awaitable unrun, which must not leave the step undone and the id
        pending for good (the socket fuzz found that: the timeout scan skips a pending id, so its
        transaction stayed open and its partitions' last stable offset stuck).
        """
        if bounded and result.records and (refused := self._txn_log_refused(result.records)) is not None:
            storage_refused(refused)
            return answer(dataclasses.replace(
                result, error=ErrorCode.not_coordinator, producer_id=-1, producer_epoch=-1, records=[], markers=[],
                partition_errors=dict.fromkeys(result.partition_errors, ErrorCode.not_coordinator)))
        step = self.start_step(transactional_id, result)
        return answer(result) if step is None else self._answer_after(step, result, answer)

    def _txn_log_refused(self, records: list[tuple[bytes, bytes | None]]) -> DiskFullError | None:
        return self._write_refused(self._txn_log(), encoded_bytes(records))

    @staticmethod
    def _write_refused(plog: Any, size: int) -> DiskFullError | None:
        """Why ``size`` bytes a client's request adds to ``plog`` may not be written now (None: they
        may): they would eat into ``log_dir_min_free_bytes``."""
        refused = plog.dir_state.client_write_refused(plog.directory, size)
        return None if refused is None else DiskFullError(f"{plog.name}: {refused}")

    def group_store_refused(self, group_id: str, size: int) -> DiskFullError | None:
        """Why a group record of ``size`` bytes a client's request would add (a JoinGroup's, a
        leader's SyncGroup's) may not be stored now in the group's offsets partition (None: it may).

        Membership records are written after the state change they image, so they are refused
        before it: a leader's SyncGroup (the group's Stable record, up to ``message.max.bytes``) by
        the group coordinator through ``store_refused``, and a JoinGroup by its handler, because
        every record a group writes later without asking (becoming Empty, a static member
        replaced) follows a JoinGroup let in. A client creating groups in a loop would otherwise
        fill the disk and stop the broker. A refusal is logged (once a minute: ``storage_refused``)."""
        topic, partition = self.offsets_partition_for(group_id)
        plog = self.broker.logs.get_partition(topic, partition)
        assert plog is not None
        refused = self._write_refused(plog, rb.HEADER_SIZE + 20 + size)
        if refused is not None:
            storage_refused(refused)
        return refused

    @staticmethod
    async def _answer_after(step: asyncio.Task[None], result: TxnResult, answer: Callable[[TxnResult], T]) -> T:
        await asyncio.shield(step)
        return answer(result)

    def start_step(self, transactional_id: str, result: TxnResult) -> asyncio.Task[None] | None:
        """Carry out a step in a task of its own on the running loop (the timeout scan's, or a client's
        under :meth:`answer_when_durable`); None if the step changes nothing. The id is pending until
        the step is done. A failure is the broker's as well as any awaiting client's: a disk that
        refuses takes the log directory offline, anything else is logged (the step's records, if
        written, are replayed at the next start, as after a crash)."""
        if not result.records and not result.markers:
            return None
        self.txn.pending.add(transactional_id)
        task = asyncio.ensure_future(self._apply_durably(transactional_id, result))
        self._steps.add(task)
        task.add_done_callback(self._step_done)
        return task

    def _step_done(self, task: asyncio.Task[None]) -> None:
        self._steps.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, fileio.StorageOfflineError):
            self.broker.storage_failed(exc)
        elif exc is not None:
            log.error("a transaction step failed", exc_info=exc)

    async def _apply_durably(self, transactional_id: str, result: TxnResult) -> None:
        try:
            if result.records:
                for markers in result.markers:
                    if markers.commit:
                        await self._partitions_durable(markers.partitions)
                txn_log = self._append_txn_records(result.records, defer_sync=True)
                if result.durable:
                    await self.broker.durable(txn_log, txn_log.log_end_offset)
                self._replay_txn_records(result.records)
            for markers in result.markers:
                self._write_markers(markers, defer_sync=True)
                await self._partitions_durable(markers.partitions)
                done = self.txn.markers_written(markers.transactional_id, markers.producer_id,
                                                markers.producer_epoch, markers.commit)
                if done.records:  # Complete*: not fsynced (if lost, the Prepare* is completed again)
                    self._append_txn_records(done.records, defer_sync=True)
                    self._replay_txn_records(done.records)
        finally:
            self.txn.pending.discard(transactional_id)

    async def _partitions_durable(self, partitions: Any) -> None:
        """Every one of ``partitions`` durable up to its end now; their fsyncs run side by side."""
        logs = [plog for tp in sorted(partitions) if (plog := self.broker.logs.get_partition(*tp)) is not None]
        await asyncio.gather(*(self.broker.durable(plog, plog.log_end_offset) for plog in logs))

    def _complete(self, markers: Any) -> None:
        """Second phase: markers everywhere, durable, then the Complete* record."""
        self._write_markers(markers)
        self._sync_partitions(markers.partitions)
        self.apply_txn_result(self.txn.markers_written(
            markers.transactional_id, markers.producer_id, markers.producer_epoch, markers.commit))

    def _sync_partitions(self, partitions: Any) -> None:
        for topic, partition in sorted(partitions):
            plog = self.broker.logs.get_partition(topic, partition)
            if plog is not None:
                plog.sync()

    def _write_markers(self, markers: Any, *, defer_sync: bool = False) -> None:
        """Append the COMMIT/ABORT marker to every partition of the transaction.

        Never raises because of what a partition holds: a partition that refuses the coordinator's
        marker (a higher producer epoch there, written by someone who is not this transaction's
        producer) cannot hold data of this transaction at this epoch, so it is skipped with a
        warning, as Kafka's marker channel gives up on a partition answering INVALID_PRODUCER_EPOCH,
        rather than leave the transaction in Prepare* and its other partitions' LSO stuck.
        """
        now = self.broker.clock.now_ms()
        control = rb.CONTROL_COMMIT if markers.commit else rb.CONTROL_ABORT
        for topic, partition in sorted(markers.partitions):
            plog = self.broker.logs.get_partition(topic, partition)
            if plog is None:  # deleted since it joined the transaction
                continue
            batch = rb.build_control_batch(control, producer_id=markers.producer_id,
                                           producer_epoch=markers.producer_epoch,
                                           coordinator_epoch=markers.coordinator_epoch, timestamp_ms=now)
            try:
                plog.append(batch, origin=AppendOrigin.COORDINATOR, defer_sync=defer_sync)
            except ProducerStateError as exc:
                log.warning("%s-%d refused the %s marker of transaction %r (producer %d, epoch %d): %s; "
                            "skipping that partition", topic, partition, "COMMIT" if markers.commit else "ABORT",
                            markers.transactional_id, markers.producer_id, markers.producer_epoch, exc)
                continue
            self.on_marker(topic, partition, markers.producer_id, markers.commit)
            self.broker.notify_append((topic, partition))

    def write_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                     coordinator_epoch: int, commit: bool) -> ErrorCode | Awaitable[ErrorCode]:
        """A marker asked for by a client (WriteTxnMarkers: ``oncelog transactions abort``, Kafka's
        admin abortTransaction). Markers are the coordinator's to write, so a client gets less:

        - COMMIT: never (CLUSTER_AUTHORIZATION_FAILED); only the coordinator may commit.
        - ABORT of a transaction the coordinator tracks as Ongoing on that partition, at its epoch:
          the coordinator aborts the WHOLE transaction (epoch bump, markers on every partition),
          never one partition alone (which would tear it when the producer then commits). On the
          event loop the abort's steps run off it, as a client's EndTxn does (an awaitable of the
          code is returned, ready once they are durable).
          In PrepareCommit/PrepareAbort: CONCURRENT_TRANSACTIONS (it is being completed).
        - ABORT of a hanging transaction (open in the partition, unknown to the coordinator): only
          at the exact producer epoch of the open transaction, so a guessed epoch cannot fence a
          live producer in that partition; otherwise INVALID_PRODUCER_EPOCH / INVALID_TXN_STATE.
        """
        plog = self.broker.logs.get_partition(topic, partition)
        if plog is None:
            return ErrorCode.unknown_topic_or_partition
        if commit:
            return ErrorCode.cluster_authorization_failed
        tid = self.txn.transactional_id_of(producer_id)
        meta = self.txn.state_of(tid) if tid is not None else None
        if meta is not None and (topic, partition) in meta.topic_partitions and \
                meta.state.value in ("Ongoing", "PrepareCommit", "PrepareAbort"):
            if producer_epoch != meta.producer_epoch:
                return ErrorCode.invalid_producer_epoch
            if meta.state.value != "Ongoing":
                return ErrorCode.concurrent_transactions
            result = self.txn.abort_transaction(meta.transactional_id)
            if not _loop_running():
                self.apply_txn_result(result)
                return result.error
            return self.answer_when_durable(meta.transactional_id, result, lambda r: r.error)
        entry = plog.producer_state.producers.get(producer_id)
        if entry is None or entry.current_txn_first_offset is None:
            return ErrorCode.invalid_txn_state
        if producer_epoch != entry.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        batch = rb.build_control_batch(rb.CONTROL_ABORT, producer_id=producer_id,
                                       producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch,
                                       timestamp_ms=self.broker.clock.now_ms())
        try:
            plog.append(batch, origin=AppendOrigin.COORDINATOR)
        except ProducerStateError as exc:
            return ErrorCode(exc.error_code)
        log.warning("aborted the hanging transaction of producer %d (epoch %d) in %s-%d on a client's request",
                    producer_id, producer_epoch, topic, partition)
        self.on_marker(topic, partition, producer_id, False)
        self.broker.notify_append((topic, partition))
        return ErrorCode.none

    def on_marker(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """Pending transactional offsets resolve when the marker lands in the offsets partition."""
        if topic == CONSUMER_OFFSETS_TOPIC:
            self.groups.replay_control(producer_id, commit)

    # --- groups -----------------------------------------------------------------------------------
    def apply_group_records(self, group_id: str, records: list[tuple[bytes, bytes | None]], *,
                            bounded: bool = False) -> AnsweredWhenDurable | None:
        """Append to the group's offsets partition, then replay (records, then replay).

        ``bounded``: records a client's request adds (OffsetCommit), refused with DiskFullError,
        nothing appended or replayed, when they would eat into ``log_dir_min_free_bytes``
        (``PartitionLog.append``): a client committing offsets in a loop must not fill the disk.

        Returns what the answer must wait for: None, or, when the partition's appends must be
        durable before they are acknowledged (flush_every_append, flush.messages) and an event loop
        runs, an ``AnsweredWhenDurable`` of that fsync (already asked for, made off the loop:
        ``Broker.durable``, group commit); it is no coroutine, so one never awaited (its client gone)
        leaves nothing behind. Outside a loop the append fsyncs itself, as before."""
        topic, partition = self.offsets_partition_for(group_id)
        plog = self.broker.logs.get_partition(topic, partition)
        assert plog is not None
        base, wait = self._append_offsets(plog, encode_batch(records, self.broker.clock.now_ms()), bounded=bounded)
        for i, (key, value) in enumerate(records):
            self.groups.replay(key, value, record_offset=base + i)
        return wait

    def _append_offsets(self, plog: Any, batch: bytes, *, bounded: bool = False
                        ) -> tuple[int, AnsweredWhenDurable | None]:
        """Append ``batch`` to an offsets partition; the offset its first record got (the replay
        orders commits by it) and what its answer must wait for (see :meth:`apply_group_records`).
        Raises what ``PartitionLog.append`` raises, having appended nothing (DiskFullError only when
        ``bounded``)."""
        running = _loop_running()
        appended = plog.append(batch, origin=AppendOrigin.COORDINATOR, defer_sync=running, bounded=bounded)
        if not running or plog.synced_end >= plog.log_end_offset or not plog.must_sync:
            return appended.base_offset, None
        return appended.base_offset, AnsweredWhenDurable.after_appends(self.broker, [(plog, plog.log_end_offset)],
                                                                       None)

    @staticmethod
    def _in_background(wait: Awaitable[None] | None) -> None:
        """Fsyncs nobody answers after (the group timers): started, not awaited; a failure has
        already taken the log directory offline (``Broker.durable``), so it is only collected."""
        if wait is not None:
            asyncio.ensure_future(wait).add_done_callback(_collect)

    def apply_txn_offset_records(self, group_id: str, producer_id: int, producer_epoch: int,
                                 records: list[tuple[bytes, bytes | None]]
                                 ) -> tuple[ErrorCode, AnsweredWhenDurable | None]:
        """TxnOffsetCommit: the records join the producer's transaction in the offsets partition.
        Returns the error (the partition refused the batch; NOT_COORDINATOR, as Kafka answers a
        storage error here, when it would eat into ``log_dir_min_free_bytes``) or NONE, and what
        the answer must wait for, as :meth:`apply_group_records` returns."""
        topic, partition = self.offsets_partition_for(group_id)
        plog = self.broker.logs.get_partition(topic, partition)
        assert plog is not None
        batch = encode_batch(records, self.broker.clock.now_ms(), producer_id=producer_id,
                             producer_epoch=producer_epoch, transactional=True)
        try:
            base, wait = self._append_offsets(plog, batch, bounded=True)
        except ProducerStateError as exc:
            return ErrorCode(exc.error_code), None
        except DiskFullError as exc:
            storage_refused(exc)
            return ErrorCode.not_coordinator, None
        for i, (key, value) in enumerate(records):
            self.groups.replay(key, value, producer_id, transactional=True, record_offset=base + i)
        return ErrorCode.none, wait

    def apply_records_by_group(self, records: list[tuple[bytes, bytes | None]]) -> AnsweredWhenDurable | None:
        """Append records of possibly several groups, each to its group's offsets partition; what
        their answer must wait for (see :meth:`apply_group_records`)."""
        by_group: dict[str, list[tuple[bytes, bytes | None]]] = {}
        for key, value in records:
            kind, ident, _ = decode_offset_record(key, value)
            by_group.setdefault(ident[0] if kind == "offset" else ident, []).append((key, value))
        waits = [w for group_id, recs in by_group.items() if (w := self.apply_group_records(group_id, recs))]
        return AnsweredWhenDurable(self.broker, [d for w in waits for d in w.durability], None) if waits else None

    def flush_group_records(self) -> AnsweredWhenDurable | None:
        """Persist membership changes (completed rebalances, groups becoming empty); what the
        answer must wait for, as :meth:`apply_group_records` returns."""
        return self.apply_records_by_group(self.groups.take_records())

    def tick_groups(self) -> int | None:
        """Run the group timers; returns when the next one is due as a wall-clock reading (ms), or
        None: ``GroupCoordinator.next_timer_ms``, the wall clock at this tick plus the monotonic
        time still to go, so ``returned - clock.now_ms()`` right away is the time to sleep."""
        self._in_background(self.apply_records_by_group(self.groups.tick()))
        return self.groups.next_timer_ms

    def on_topic_deleted(self, topic: str) -> AnsweredWhenDurable | None:
        """Remove every group's offsets of the deleted ``topic`` (records, then replay); what the
        DeleteTopics answer waits for. If the broker stops first, :meth:`load` removes them."""
        return self.apply_records_by_group(self.groups.on_topics_deleted({topic}))

    def expire_offsets(self) -> None:
        self._in_background(self.apply_records_by_group(self.groups.expire_offsets()))

    # --- keeping internal logs bounded -------------------------------------------------------------
    def checkpoint_internal_logs(self, min_bytes: int) -> int:
        """Bound each internal partition: rewrite its live state at the end, then drop the prefix.

        For a partition whose log holds at least ``max(min_bytes, 2 * its last checkpoint)`` bytes:
        roll to a new segment, append the coordinator's :meth:`snapshot_records` for that partition
        (the newest record per live key: what Kafka's log cleaner would keep), fsync, then move the
        log start to ``min(checkpoint start, last stable offset)`` and delete the segments below.

        Invariants: replaying the log from its new start rebuilds the same coordinator state (the
        checkpoint holds every live key; records between an earlier cut and the checkpoint are
        older and overwritten by it; tombstoned keys are absent; a committed offset's record carries
        the offset of the record that committed it, so a pending transactional offset kept below
        the checkpoint still loses to a newer regular commit and wins over an older one when its
        transaction commits, as Kafka orders them); the checkpoint is durable before
        anything is deleted, so a crash at any step leaves a log that replays to the same state;
        an open transaction's records (pending offsets) are never cut, and while one pins more than
        half of the log the partition is left alone (nothing could be dropped). Runs without awaiting, so no
        request interleaves with the rewrite. Returns how many partitions were checkpointed.

        A checkpoint writes as much as the live state, so it keeps ``log_dir_min_free_bytes`` as a
        client's write does: one that would eat into it is put off (the log is left as it is, and
        tried again at the next call), and one the disk cuts short is refused, its written part
        only re-asserting live values (replay gives the same state), instead of taking the log
        directory offline. Before, a client's live offsets larger than the space kept made every
        checkpoint fail once the disk reached the bound: the broker stopped, and again after each
        restart.
        """
        # A pending step's records may be in the log but not yet replayed: a snapshot taken now
        # would put the older state after them, so the transaction log waits for the next call.
        parts: list[tuple[Any, Any]] = [] if self.txn.pending else [(self._txn_log(), self.txn.snapshot_records)]
        n_offsets = self.broker.logs.topics()[CONSUMER_OFFSETS_TOPIC].num_partitions
        for p in range(n_offsets):
            def owned(p: int = p) -> list[tuple[bytes, bytes | None]]:
                return self.groups.snapshot_records(lambda gid: self.offsets_partition_for(gid)[1] == p)

            parts.append((self.broker.logs.get_partition(CONSUMER_OFFSETS_TOPIC, p), owned))
        done = 0
        for plog, snapshot in parts:
            if plog is None or plog.size_in_bytes < max(min_bytes, 2 * self._checkpoint_bytes.get(plog.name, 0)):
                continue
            first, end = plog.log_start_offset, plog.log_end_offset
            if plog.last_stable_offset - first < (end - first) // 2:
                continue  # an open transaction pins most of the log: a checkpoint would only add bytes
            now = self.broker.clock.now_ms()
            before = plog.size_in_bytes
            records = snapshot()
            if (refused := self._write_refused(plog, encoded_bytes(records, CHECKPOINT_BATCH_RECORDS))) is not None:
                storage_refused(DiskFullError(f"checkpoint put off: {refused}"))
                continue
            if plog.active.size > 0:
                plog.roll(now)
            start = plog.log_end_offset
            try:
                for i in range(0, len(records), CHECKPOINT_BATCH_RECORDS):
                    plog.append(encode_batch(records[i:i + CHECKPOINT_BATCH_RECORDS], now),
                                origin=AppendOrigin.COORDINATOR, bounded=True)
            except DiskFullError as exc:  # the disk filled since the check: a part re-asserts live values
                storage_refused(DiskFullError(f"checkpoint put off: {exc}"))
                continue
            plog.flush()
            cut = min(start, plog.last_stable_offset)
            plog.delete_records(cut)
            self._checkpoint_bytes[plog.name] = plog.active.size
            done += 1
            log.info("%s: checkpointed %d live record(s) at offset %d; log start now %d, %d -> %d bytes",
                     plog.name, len(records), start, plog.log_start_offset, before, plog.size_in_bytes)
        return done

    def expire_transactions(self) -> None:
        """The timeout scan (a timer): abort each transaction open past its timeout, tombstone each
        expired transactional id. In the broker (an event loop running) each step runs as a
        client's does, off the loop (:meth:`start_step`), so a scan that aborts many transactions
        never holds the loop in their fsyncs; called outside a loop (tests that drive the
        coordinator directly) the steps run here, fsyncs included. This timer also reports, once a
        minute at most, what the bounds on transactional ids and groups did since."""
        before = self.txn.expired_early
        steps = self.txn.expire_steps(self.broker.clock.now_ms())
        if self.txn.expired_early > before:
            once_a_minute("transactional ids", log, "%d idle transactional id(s) expired early to keep "
                          "transactional_id_max_entries (%d); %d since start", self.txn.expired_early - before,
                          self.txn.transactional_id_max_entries, self.txn.expired_early)
        refused = self.groups.membership.groups_refused  # the group bound's refusals, reported on this timer
        if refused > self._groups_refused_reported and once_a_minute(
                "groups", log, "%d request(s) for new groups refused with COORDINATOR_NOT_AVAILABLE: %d groups are "
                "kept (group_max_count)", refused - self._groups_refused_reported, len(self.groups.groups)):
            self._groups_refused_reported = refused
        if not _loop_running():
            for _, result in steps:
                self.apply_txn_result(result)
            return
        for tid, result in steps:
            self.start_step(tid, result)
