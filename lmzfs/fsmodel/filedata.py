"""The bytes of one file as a writable mount sees them: its stored version with the spool in front.

A FileData is the stored file (a FileReader, or nothing for a new file) of which the first
`base_len` bytes still show, overlaid by the ranges written since its last commit (kept in a
SpoolFile at the file's own offsets); whatever lies beyond both reads as zeros (a sparse file,
or a file grown by truncate). Reads of a range ask the spool for what it holds and the store's
chunk source for the rest: the unflushed data is one more source in front of the store.

Two locks per file. `lock`: a commit holds it while it reads the file's bytes, so writes and
truncates of the file wait for the commit (writes to other files do not). `_view`: held for the
moment a read, a write or a truncate takes, so that a read sees each write whole; reads take it
alone, so a read is never blocked for a commit's duration: it is served from the spool and the
stored version as they stand, the bytes the commit is storing.
"""
from __future__ import annotations

import io
import threading
import time
from typing import Callable

from lmzfs.fsmodel.journal import COMPACT_ENTRIES
from lmzfs.fsmodel.ranges import ByteRanges
from lmzfs.fsmodel.spool import Spool, SpoolFile
from lmzfs.preadio import PreadIO


class FileData:
    def __init__(self, spool: Spool, base, size: int, *, spool_file: SpoolFile | None = None,
                 base_len: int | None = None,
                 on_new_spool_file: Callable[[SpoolFile], None] | None = None,
                 on_long_journal: Callable[[SpoolFile], None] | None = None):
        """`base`: the stored version (anything with pread(offset, length) and close()), or None.
        `on_new_spool_file`: called with a new spool file before anything is written to it (it
        writes the file's spool record, so that a replay knows whose bytes follow).
        `on_long_journal`: called once the spool's journal reaches COMPACT_ENTRIES entries (it
        folds them into a new record), so that a file kept open and busy keeps a bounded journal."""
        self.lock = threading.RLock()
        self._view = threading.RLock()
        self._spool = spool
        self.base = base
        self.base_len = size if base_len is None else base_len
        self.size = size
        self.spool_file = spool_file
        self._on_new_spool_file = on_new_spool_file
        self._on_long_journal = on_long_journal
        self.dirty = spool_file is not None       # changed since the stored version
        self.last_change = time.monotonic()

    @property
    def ranges(self) -> ByteRanges:
        """Where the spool holds the file's bytes (its spool file keeps them, with their sums)."""
        return self.spool_file.ranges if self.spool_file is not None else _NO_RANGES

    # -- reading ---------------------------------------------------------------------------------
    def read(self, offset: int, length: int) -> bytes:
        with self._view:
            end = min(self.size, offset + length)
            if offset >= end:
                return b""
            out = []
            for piece in self.ranges.pieces(offset, end):
                n = piece.end - piece.start
                if piece.inside:
                    out.append(self.spool_file.pread(n, piece.start))
                    continue
                stored_end = min(piece.end, self.base_len)
                if piece.start < stored_end and self.base is not None:
                    data = self.base.pread(piece.start, stored_end - piece.start)
                    if len(data) != stored_end - piece.start:
                        raise OSError(5, "the stored file is shorter than the catalog says")
                    out.append(data)
                    n -= stored_end - piece.start
                if n > 0:
                    out.append(bytes(n))
            return b"".join(out)

    def as_file(self) -> io.BufferedReader:
        """A read-only file object over the current bytes (for the container parser)."""
        return io.BufferedReader(_RawView(self), buffer_size=1 << 16)

    # -- changing --------------------------------------------------------------------------------
    def ensure_spool_file(self) -> SpoolFile:
        with self.lock, self._view:
            return self._ensure_spool_file()

    def _ensure_spool_file(self) -> SpoolFile:
        if self.spool_file is None:
            # a new file's bytes live in its record while they are few (spoolrecord.INLINE_MAX)
            spool_file = self._spool.new_file(inline=self.base is None and self.size == 0)
            if self._on_new_spool_file is not None:
                try:
                    self._on_new_spool_file(spool_file)
                except BaseException:
                    spool_file.close()
                    raise
            self.spool_file = spool_file
        return self.spool_file

    def _changed(self) -> None:
        self.dirty = True
        self.last_change = time.monotonic()

    def write(self, offset: int, data: bytes) -> int:
        with self.lock, self._view:
            if not data:
                return 0
            spool_file = self._ensure_spool_file()
            n = spool_file.pwrite(data, offset)
            self.size = max(self.size, offset + n)
            self._changed()
            self._bound_journal(spool_file)
            return n

    def _bound_journal(self, spool_file: SpoolFile) -> None:
        journal = spool_file.journal
        if journal is not None and journal.entries >= COMPACT_ENTRIES and self._on_long_journal is not None:
            self._on_long_journal(spool_file)

    def truncate(self, size: int) -> None:
        with self.lock, self._view:
            if size == self.size:
                return
            # the spool's journal says what the truncate did, so a replay after a kill does it too
            spool_file = self._ensure_spool_file()
            # growing: bytes of the stored version past base_len are gone; the spool's holes read as zeros
            spool_file.truncate(size)
            if size < self.size:
                self.base_len = min(self.base_len, size)
            self.size = size
            self._changed()
            self._bound_journal(spool_file)

    # -- after a commit --------------------------------------------------------------------------
    def rebase(self, base, size: int) -> SpoolFile | None:
        """The file's bytes are now stored as `base`: the spool's ranges are no longer needed. The
        spool file they were in is returned, for the caller to close (which removes it)."""
        with self.lock, self._view:
            if self.base is not None:
                self.base.close()
            self.base, self.base_len, self.size = base, size, size
            spent, self.spool_file = self.spool_file, None
            self.dirty = False
            return spent

    def close(self, *, keep_spool: bool = False) -> None:
        """Release the stored version and (unless `keep_spool`: bytes the next mount commits) the spool."""
        with self.lock, self._view:
            if self.base is not None:
                self.base.close()
                self.base = None
            if self.spool_file is not None and not keep_spool:
                self.spool_file.close()
            elif self.spool_file is not None:
                self.spool_file.release()
            self.spool_file = None


_NO_RANGES = ByteRanges()


class _RawView(PreadIO):
    def __init__(self, data: FileData):
        self._data = data

    @property
    def size(self) -> int:
        return self._data.size

    def pread(self, offset: int, length: int) -> bytes:
        return self._data.read(offset, length)
