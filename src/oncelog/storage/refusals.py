"""A request refused for want of room (disk space under ``log_dir_min_free_bytes``, or file
descriptors), logged at most once a minute: a client that keeps trying would flood the log, and
the first warning says all an operator needs. One limit for every kind (a produce, an offset
commit, a checkpoint or a cleaning put off): the broker's handlers and the log cleaner share it."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("oncelog.storage")
_last_logged = [-60.0]  # time.monotonic() of the last warning


def storage_refused(exc: BaseException) -> None:
    """Log ``exc`` (a DiskFullError or SegmentRollRefusedError) unless one was logged in the last minute."""
    now = time.monotonic()
    if now - _last_logged[0] >= 60:
        _last_logged[0] = now
        log.warning("%s", exc)
