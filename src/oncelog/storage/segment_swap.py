"""Swapping cleaned segments into a partition directory, atomically with respect to crashes.

The cleaner writes each new segment as ``<base>.log.cleaned`` and its three indexes as
``<base>.index.cleaned``, ``<base>.timeindex.cleaned``, ``<base>.txnindex.cleaned``, each file
fsynced. The swap (on the event loop thread) then:

1. fsyncs the directory: the ``.cleaned`` names are durable;
2. writes ``cleaner-swap`` (``write_atomic``: temp, fsync, rename, fsync of the directory) naming,
   for every new segment, its base and the old segments it replaces. **This is the commit point.**
3. renames each ``.cleaned`` file over its final name and unlinks the old segments' files that no
   new segment takes the place of; fsyncs the directory;
4. unlinks ``cleaner-swap``; fsyncs the directory.

Recovery (``recover``, called before a partition's segments are listed): with a ``cleaner-swap``
file, the swap is completed (step 3 is idempotent: a ``.cleaned`` file still there is renamed, one
already renamed is not there any more; the old files are unlinked), then the file is removed. Every
``.cleaned`` file left without one belongs to a cleaning that never committed and is deleted.

So after a crash or a power cut at any write, fsync or rename, the directory holds either the old
segments or the new ones for the whole offset range of a cleaning, never both and never a mix
within one segment. Kafka renames ``.cleaned`` to ``.swap`` files and infers a swap's range from
its content; one manifest written atomically is the same protocol with an explicit commit point
(which also holds when only some of several renames reached the disk).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from oncelog.storage import fileio
from oncelog.storage.log_segment import segment_name

log = logging.getLogger("oncelog.storage")

SWAP_FILE = "cleaner-swap"
CLEANED_SUFFIX = ".cleaned"
SEGMENT_EXTENSIONS = (".log", ".index", ".timeindex", ".txnindex")


@dataclass(frozen=True, slots=True)
class SwapGroup:
    """One new segment (``new_base``) replacing the old segments with ``old_bases``."""

    new_base: int
    old_bases: tuple[int, ...]


def cleaned_path(directory: Path, base: int, ext: str) -> Path:
    return directory / f"{segment_name(base)}{ext}{CLEANED_SUFFIX}"


def final_path(directory: Path, base: int, ext: str) -> Path:
    return directory / f"{segment_name(base)}{ext}"


def commit(directory: Path, groups: list[SwapGroup]) -> None:
    """Steps 1 and 2: after this returns, a restart completes the swap whatever happens."""
    fileio.fs.fsync_dir(directory)
    doc = {"version": 1, "groups": [{"new_base": g.new_base, "old_bases": list(g.old_bases)} for g in groups]}
    fileio.fs.write_atomic(directory / SWAP_FILE, json.dumps(doc).encode())


def apply(directory: Path, groups: list[SwapGroup]) -> None:
    """Steps 3 and 4 (also what recovery runs for a committed swap)."""
    new_bases = {g.new_base for g in groups}
    for g in groups:
        for ext in SEGMENT_EXTENSIONS:
            src = cleaned_path(directory, g.new_base, ext)
            if src.exists():
                fileio.fs.replace(src, final_path(directory, g.new_base, ext))
        for old in g.old_bases:
            if old not in new_bases:
                for ext in SEGMENT_EXTENSIONS:
                    fileio.fs.unlink(final_path(directory, old, ext))
    fileio.fs.fsync_dir(directory)
    fileio.fs.unlink(directory / SWAP_FILE)
    fileio.fs.fsync_dir(directory)


def discard(directory: Path, bases: list[int]) -> None:
    """Remove the ``.cleaned`` files of a cleaning that will not be swapped in (no fsync needed:
    recovery deletes any that a crash brings back)."""
    for base in bases:
        for ext in SEGMENT_EXTENSIONS:
            fileio.fs.unlink(cleaned_path(directory, base, ext))


def recover(directory: Path, partition: str) -> None:
    """Complete a committed swap, roll back an uncommitted one (see the module docstring)."""
    manifest = directory / SWAP_FILE
    raw = fileio.read_file(manifest)
    if raw is not None:
        doc = json.loads(raw)
        groups = [SwapGroup(int(g["new_base"]), tuple(int(b) for b in g["old_bases"])) for g in doc["groups"]]
        log.warning("%s: completing a swap of cleaned segments interrupted by a crash (%d segment(s))",
                    partition, len(groups))
        apply(directory, groups)
    stale = sorted(directory.glob(f"*{CLEANED_SUFFIX}"))
    if stale:
        log.warning("%s: deleting %d file(s) of a cleaning interrupted before its swap", partition, len(stale))
        for p in stale:
            fileio.fs.unlink(p)
        fileio.fs.fsync_dir(directory)
    if (directory / (SWAP_FILE + ".tmp")).exists():
        fileio.fs.unlink(directory / (SWAP_FILE + ".tmp"))
