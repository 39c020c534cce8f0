"""A request refused for want of room (disk space under ``log_dir_min_free_bytes``, file
descriptors, or a bound on what the coordinators keep), logged at most once a minute per kind: a
client that keeps trying would flood the log, and the first warning says all an operator needs.
Every disk-space refusal (a produce, an offset commit, a checkpoint or a cleaning put off) is one
kind, ``storage_refused``: the broker's handlers and the log cleaner share it."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("oncelog.storage")
_last_logged: dict[str, float] = {}  # per kind: time.monotonic() of the last warning


def once_a_minute(kind: str, logger: logging.Logger, message: str, *args: object) -> bool:
    """Log ``message % args`` as a warning unless one of ``kind`` was logged in the last minute;
    True if it was logged now."""
    now = time.monotonic()
    if now - _last_logged.get(kind, -60.0) < 60:
        return False
    _last_logged[kind] = now
    logger.warning(message, *args)
    return True


def storage_refused(exc: BaseException) -> None:
    """Log ``exc`` (a DiskFullError or SegmentRollRefusedError) unless one was logged in the last minute."""
    once_a_minute("storage", log, "%s", exc)
