"""A new small file's bytes kept in its spool record (version 4, `inline`): no ID.data and no
ID.log until the file outgrows INLINE_MAX or is fsync'd (fsmodel/spool.py, docs/format.md).

Each write or truncate of such a file changes its bytes in memory and rewrites its record in
place before it returns (one write of at most a page, as every record not yet durable is), so
a kill of the daemon finds the change whole or not at all, and a small file costs one spool
file, made once and removed once, where a journaled one costs three."""
from __future__ import annotations

import errno
import os
from dataclasses import replace

from lmzfs.fsmodel.ranges import ByteRanges
from lmzfs.fsmodel.spoolsums import sums_of


class InlineBytes:
    """What SpoolFile does while its `inline` bytes are the file's (a mixin: its fields live there)."""

    def _inline_change(self, offset: int, data: bytes, end: int) -> int:
        """A write of `data` at `offset` (or, with no data, a truncate to `end`) of an inline file:
        its record is rewritten with the new bytes before this returns (one pwrite in place), so a
        kill of the daemon finds the write whole or (were it killed before) not at all."""
        before, ranges_before = bytes(self.inline), self.ranges.as_list()
        if data:
            if end > len(self.inline):
                self.inline.extend(bytes(end - len(self.inline)))
            self.inline[offset:end] = data
            self.ranges.add(offset, end)
        else:
            del self.inline[end:]
            self.inline.extend(bytes(end - len(self.inline)))
            self.ranges.cut(end)
        try:
            if self.recorded and self.last is not None:
                self.note(replace(self.last, size=len(self.inline), ranges=self.ranges.as_list()))
        except BaseException:
            self.inline[:] = before
            self.ranges = ByteRanges(ranges_before)
            raise
        return len(data)

    def _spill(self) -> None:
        """The inline file outgrows its record (or is fsync'd): its bytes go to a new ID.data with
        a journal, then the record is rewritten to name them (a kill before that finds the inline
        record, the file as it stood)."""
        fd, journal = self.spool.data_files(self.spool_id, exclusive=False)
        try:
            if self.inline:
                if os.pwrite(fd, bytes(self.inline), 0) != len(self.inline):
                    raise OSError(errno.ENOSPC, "short write of the spool's data")
            sums = sums_of(fd, self.ranges)
        except BaseException:
            self._drop_spilled(fd, journal)
            raise
        inline, self.inline = self.inline, None
        self.fd, self.journal, self.sums = fd, journal, sums
        try:
            if self.recorded and self.last is not None:
                self.note(self.last)
        except BaseException:
            self.inline, self.fd, self.journal, self.sums = inline, -1, None, {}
            self._drop_spilled(fd, journal)
            raise

    def _drop_spilled(self, fd: int, journal: JournalWriter) -> None:
        os.close(fd)
        os.close(journal.fd)
        self.spool.closed_files()
        self.spool.remove(self.spool_id, files_only=True)
