"""The spool: where a writable mount keeps written bytes until they are committed to the store.

STORE/spool/ holds, per file with uncommitted writes, ``ID.data`` (a sparse file at the same
offsets as the file itself: the bytes written, holes elsewhere), ``ID.log`` (its range journal,
journal.py: entries per write or truncate) and ``ID.json`` (a SpoolRecord: which file, which
ranges of ID.data held its bytes when the record was written, the sum of each block of them
(spoolsums.py), its size and metadata, and how many journal entries that state already
includes). No byte of ID.data is served, committed or replayed unless its block's sum matches.

Without fsync the record is written when the file gets its spool file and again when its name
or metadata changes (rename, chmod, utimes); a record of at most a page lives in a slot of
``records.slots`` (spoolslots.py: one pwrite of one page, and no file of its own to make), one
of at most 32 KiB (a new file's bytes held inline) in a slot pair of ``records.pairs``
(spoolpairs.py: written to the half it does not stand in), a larger one is its own ID.json,
rewritten in place while it fits in a page; every write appends a journal entry. None of that is fsync'd, so it costs
page-cache writes only, and a kill of the daemon loses none of it: the page cache belongs to the
kernel. A record written in another boot than the current one may lack its bytes (a power loss),
so replay trusts such a record only if it is durable. fsync writes ID.data and ID.log durably and
then replaces ID.json durably (write, fsync, rename, fsync the directory), so a durable record
never names bytes that are not on disk; from then on every record of that file is durable.

A record stays until the file's commit to the store is durable; the commit's catalog
transaction names the record's ID (fs_spool_commits), so a mount that finds a record whose ID the
catalog names knows it is committed and only then removes the spool's files. Nothing else
removes a record: a mount replays every record it finds (docs/writable.md), or sets aside one
it cannot trust (``ID.json-untrusted``, kept with its files and logged).

``mount.lock`` is held (flock) by the one writable mount of the store.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from lmzfs.fsmodel.journal import TRUNCATE, WRITE, FileState, JournalRead, JournalWriter, read_journal
from lmzfs.fsmodel.spoolinline import InlineBytes
from lmzfs.fsmodel.spoolpairs import PAIRS_FILE, RecordPairs, used_pair_slots
from lmzfs.fsmodel.spoolpairs import RECORD_MAX as PAIR_RECORD_MAX
from lmzfs.fsmodel.spoolslots import SLOT_BYTES, SLOTS_FILE, RecordSlots, used_slots
from lmzfs.fsmodel.spoolrecord import INLINE_MAX, RECORD_VERSION, SpoolRecord, boot_id
from lmzfs.fsmodel.ranges import ByteRanges
from lmzfs.fsmodel.spoolsums import (BLOCK, block_sum, check_block, cut_sums, held, read_blocks, settle, sums_of,
                                     with_range)
from lmzfs.hostresources import open_files_limit
from lmzfs.store.catalog.fsrows import EntryMeta
from lmzfs.store.layout import DIR_MODE, FILE_MODE, StoreError, fsync_dir

SPOOL_DIR = "spool"
log = logging.getLogger(__name__)

MOUNT_LOCK = "mount.lock"
UNTRUSTED_SUFFIX = ".json-untrusted"
DESCRIPTOR_SHARE_SHORT = 2             # descriptors are short once spool files hold 1/this of the limit
IN_PLACE_MAX = 4096                    # a record never durable, this small, is rewritten in place


@dataclass
class SpoolFile(InlineBytes):
    """ID.data and ID.log of one file: the bytes written to it, at the file's own offsets, which
    ranges of them are the file's, each block's sum (spoolsums.py), and what each write and
    truncate did."""
    spool: "Spool"
    spool_id: str
    fd: int                            # -1 while `inline`
    journal: JournalWriter | None      # None while `inline`
    recorded: bool = False             # its record exists (in a slot, or ID.json)
    durable: bool = False              # ID.json was written durably (by fsync): it stays so
    closed: bool = field(default=False)
    ranges: ByteRanges = field(default_factory=ByteRanges)
    sums: dict[int, int] = field(default_factory=dict)
    inline: bytearray | None = None    # a new small file's bytes, kept in its record (no ID.data, ID.log)
    last: SpoolRecord | None = None    # the record last written (what an inline write rewrites)

    def _where(self) -> str:
        return f"spool {self.spool_id}"

    def _old_block(self, k: int) -> bytes:
        """Block k as it stands, its held bytes checked (CorruptChunk if damaged)."""
        block = read_blocks(self.fd, k, 1)
        if held(self.ranges, k):
            check_block(block, k, self.ranges, self.sums, self._where())
        return block

    def pwrite(self, data: bytes, offset: int) -> int:
        """Write `data` at `offset`: the touched blocks' new sums are journaled first, then the
        bytes are written; the ranges and sums follow."""
        if not data:
            return 0
        end = offset + len(data)
        if self.inline is not None:
            if end <= INLINE_MAX:
                return self._inline_change(offset, data, end)
            self._spill()
        entries, new_sums = [], {}
        for k in range(offset // BLOCK, (end - 1) // BLOCK + 1):
            lo, hi = max(offset, k * BLOCK), min(end, (k + 1) * BLOCK)
            old = held(self.ranges, k)
            pieces = with_range(old, lo, hi)
            if any(s < lo or e > hi for s, e in old):        # bytes it keeps: checked, then summed anew
                block = bytearray(self._old_block(k))
            else:
                block = bytearray(BLOCK)
            block[lo - k * BLOCK:hi - k * BLOCK] = data[lo - offset:hi - offset]
            new_sums[k] = block_sum(bytes(block), k, pieces)
            entries.append((WRITE, lo, hi - lo, new_sums[k]))
        mark = self.journal.append(entries)
        try:
            n = os.pwrite(self.fd, data, offset)
        except OSError:
            self.journal.retract(mark)
            raise
        if n != len(data):             # a full disk took part of it: journal what was written
            self.journal.retract(mark)
            if n <= 0:
                raise OSError(errno.ENOSPC, "no space left for the spool's data")
            return self.pwrite(data[:n], offset)
        self.ranges.add(offset, end)
        self.sums.update(new_sums)
        return n

    def pread(self, length: int, offset: int) -> bytes:
        """Held bytes [offset, offset+length), each block they lie in checked first."""
        if length <= 0:
            return b""
        if self.inline is not None:
            return bytes(self.inline[offset:offset + length]).ljust(length, b"\0")
        first, last = offset // BLOCK, (offset + length - 1) // BLOCK
        data = read_blocks(self.fd, first, last - first + 1)
        for k in range(first, last + 1):
            at = (k - first) * BLOCK
            check_block(data[at:at + BLOCK], k, self.ranges, self.sums, self._where())
        at = offset - first * BLOCK
        return data[at:at + length]

    def truncate(self, size: int) -> None:
        if self.inline is not None:
            if size <= INLINE_MAX:
                self._inline_change(size, b"", size)
                return
            self._spill()
        k = size // BLOCK
        cut_sum = 0
        if size % BLOCK and k in self.sums:
            block = self._old_block(k)
            kept = [(s, min(e, size)) for s, e in held(self.ranges, k) if s < size]
            cut_sum = block_sum(block, k, kept)
        mark = self.journal.append([(TRUNCATE, size, 0, cut_sum)])
        try:
            os.ftruncate(self.fd, size)
        except OSError:
            self.journal.retract(mark)
            raise
        self.ranges.cut(size)
        self.sums = cut_sums(self.sums, size, cut_sum)

    def _stamped(self, record: SpoolRecord, durable: bool) -> SpoolRecord:
        journal = self.journal
        return replace(record, durable=durable, journal_entries=journal.entries if journal else 0, boot_id=boot_id(),
                       version=RECORD_VERSION, sums=sorted(self.sums.items()),
                       journal_generation=journal.generation if journal else 0,
                       inline=None if self.inline is None else bytes(self.inline))

    def note(self, record: SpoolRecord) -> None:
        """Write the record as it stands now; durably if an earlier one was (fsync's promise holds).
        A record that fits in a slot (at most a page) is written into its slot of records.slots
        (spoolslots.py: one pwrite of one page, so a kill of the daemon finds it whole, as it
        became or as it was); one that fits in half a slot pair (spoolpairs.py), into the half of
        its pair it does not stand in, and it stays in its pair; a larger one becomes ID.json, and
        stays there."""
        if self.durable:
            self.record(record)
            return
        self.last = record
        stamped = self._stamped(record, False)
        data = stamped.to_json()
        spool = self.spool
        paired = spool.pairs.holds(self.spool_id)
        in_file = self.recorded and not paired and not spool.slots.holds(self.spool_id)   # its own ID.json
        if not in_file and not paired and len(data) <= SLOT_BYTES:
            spool.slots.write(self.spool_id, data)
        elif not in_file and len(data) <= PAIR_RECORD_MAX:
            spool.pairs.write(self.spool_id, data)
            spool.slots.free(self.spool_id)       # after: a kill in between finds both, and the pair wins
        else:
            spool.write_record(stamped, durable=False, fresh=not in_file)
            spool.slots.free(self.spool_id)       # after: a kill in between finds ID.json, which wins
            spool.pairs.free(self.spool_id)
        self.recorded = True

    def record(self, record: SpoolRecord) -> None:
        """Make the bytes, the journal and the record durable, in that order (an inline file's
        bytes first go to ID.data: a durable record never holds them)."""
        if self.inline is not None:
            self.last = None           # no record rewritten by the spill: this one follows
            self._spill()
        self.last = record
        os.fsync(self.fd)
        os.fsync(self.journal.fd)
        self.spool.write_record(self._stamped(record, True), durable=True)   # a durable record is ID.json
        self.spool.slots.free(self.spool_id)     # after: a kill in between finds ID.json, which wins
        self.spool.pairs.free(self.spool_id)
        self.recorded = self.durable = True

    def compact(self, record: SpoolRecord | None) -> None:
        """Fold the journal into a new record (`record`: the file as it stands; None if it has
        none) and start an empty journal of the next generation: the record first, so that a
        kill between the two finds a record that includes every entry of the older journal."""
        journal = self.journal
        if journal is None:            # inline: no journal to fold
            return
        before = journal.entries, journal.generation
        if record is not None:
            journal.entries, journal.generation = 0, before[1] + 1
            try:
                self.note(record)
            except BaseException:
                journal.entries, journal.generation = before
                raise
        journal.restart(before[1] + 1)

    def forget_record(self) -> None:
        """The record no longer stands (the file was unlinked): a crash must not bring it back."""
        if self.recorded:
            self.spool.remove_record(self.spool_id, durable=self.durable)
            self.recorded = False

    def _close_fds(self) -> None:
        self.closed = True
        if self.inline is None:
            os.close(self.fd)
            os.close(self.journal.fd)
            self.spool.closed_files()

    def release(self) -> None:
        """Close, keeping the spool's files for the next mount to commit."""
        if not self.closed:
            self._close_fds()

    def close(self) -> None:
        """Close and remove the spool's files: the file's bytes are committed or unwanted."""
        if self.closed:
            return
        inline = self.inline is not None
        self._close_fds()
        self.spool.remove(self.spool_id, record_only=inline)


@dataclass
class Reopened:
    spool_file: SpoolFile
    state: FileState
    bad_blocks: list[int]              # blocks whose held bytes match no sum: they read as EIO
    refold: bool                       # an older version's record: record it again in this one


class Spool:
    def __init__(self, store_root: Path):
        self.dir = Path(store_root) / SPOOL_DIR
        try:
            self.dir.mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the spool {self.dir}: {exc.strerror}") from None
        self._lock_fd: int | None = None
        self.restarted: bool | None = None     # the machine restarted since the last mount (None: unknown)
        self.slots = RecordSlots(self.dir / SLOTS_FILE)
        self.pairs = RecordPairs(self.dir / PAIRS_FILE)
        self._open_files = 0                   # spool files holding their descriptors (ID.data, ID.log)
        self._room = threading.Condition()

    # -- the one writable mount ----------------------------------------------------------------
    def lock_for_mount(self) -> None:
        fd = os.open(self.dir / MOUNT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"the store {self.dir.parent} is already mounted writable by another process "
                             f"(one writable mount per store; unmount it first)") from None
        self._lock_fd = fd
        # the lock file names the boot of the last mount: the records it left were written then
        try:
            last = os.pread(fd, 128, 0).decode("ascii", "replace").strip()
            self.restarted = (last != boot_id()) if last else None
            now = boot_id().encode()
            if now and last.encode() != now:
                os.ftruncate(fd, 0)
                os.pwrite(fd, now + b"\n", 0)
        except OSError:
            self.restarted = None

    def unlock(self) -> None:
        self.slots.close()
        self.pairs.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- descriptors ---------------------------------------------------------------------------
    def _opened_files(self) -> None:
        with self._room:
            self._open_files += 1

    def closed_files(self) -> None:
        """A spool file closed its two descriptors."""
        with self._room:
            self._open_files -= 1
            self._room.notify_all()

    def descriptors_short(self) -> bool:
        """Spool files hold 1/DESCRIPTOR_SHARE_SHORT of the process's descriptor limit or more
        (two each: a file written and not yet committed keeps its ID.data and ID.log open)."""
        return 2 * self._open_files * DESCRIPTOR_SHARE_SHORT >= open_files_limit()

    def wait_for_descriptors(self, timeout: float) -> bool:
        """Until descriptors are no longer short (commits close their files' spool files), for at
        most `timeout` seconds; False if they still are."""
        with self._room:
            return self._room.wait_for(lambda: not self.descriptors_short(), timeout)

    # -- files ---------------------------------------------------------------------------------
    def new_file(self, *, inline: bool = False) -> SpoolFile:
        """A new spool file; `inline`: of a new file, whose bytes its record holds while they fit
        (INLINE_MAX): no ID.data or ID.log is made unless it outgrows that."""
        spool_id = uuid.uuid4().hex
        if inline:
            return SpoolFile(self, spool_id, -1, None, inline=bytearray())
        fd, journal = self.data_files(spool_id)
        return SpoolFile(self, spool_id, fd, journal)

    def data_files(self, spool_id: str, *, exclusive: bool = True) -> tuple[int, JournalWriter]:
        """ID.data and ID.log made (`exclusive`: new; else emptied), opened."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            fd = os.open(self._data(spool_id), flags, FILE_MODE)
        except OSError as exc:
            raise OSError(exc.errno or errno.EIO, f"cannot create a spool file: {exc.strerror}") from None
        try:
            log_fd = os.open(self._log(spool_id), flags, FILE_MODE)
        except OSError as exc:
            os.close(fd)
            self._data(spool_id).unlink(missing_ok=True)
            raise OSError(exc.errno or errno.EIO, f"cannot create a spool journal: {exc.strerror}") from None
        try:
            journal = JournalWriter(log_fd, spool_id)
        except OSError:
            os.close(fd)
            os.close(log_fd)
            self._data(spool_id).unlink(missing_ok=True)
            self._log(spool_id).unlink(missing_ok=True)
            raise
        self._opened_files()
        return fd, journal

    def read_journal(self, record: SpoolRecord) -> JournalRead:
        """The journal entries past what `record` includes (none for a version 1 record: it has no journal)."""
        if record.version == 1:
            return JournalRead([], 0, None)
        if record.inline is not None:      # an inline record holds the file whole: no journal
            return JournalRead([], record.journal_entries, None)
        path = self._log(record.spool_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return JournalRead([], record.journal_entries, f"{path} is missing")
        return read_journal(data, record.spool_id, record.journal_entries, str(path), record.journal_generation)

    def reopen(self, record: SpoolRecord, applied: list, dropped: list) -> "Reopened":
        """The files of a record found at mount, with the journal's `applied` entries (past the
        record's) and the later whole ones the replay drops: what they leave, checked against the
        blocks' sums (spoolsums.settle). A record of an older version has no sums: its bytes are
        taken as they stand, and it must be recorded again (`refold`) in this version. An inline
        record holds the bytes itself (its checksum vouches for them)."""
        if record.inline is not None:
            spool_file = SpoolFile(self, record.spool_id, -1, None, recorded=True, durable=record.durable,
                                   ranges=ByteRanges(record.ranges),
                                   inline=bytearray(record.inline), last=record)
            return Reopened(spool_file, record.state(), [], refold=False)
        try:
            fd = os.open(self._data(record.spool_id), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"spool record {record.spool_id} names bytes that are missing; it is kept") from None
        try:
            log_fd = os.open(self._log(record.spool_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError:
            os.close(fd)
            raise
        recorded = record.state()
        if recorded.sums is None:
            state = recorded.after(applied)
            sums, bad, entries = sums_of(fd, ByteRanges(state.ranges)), [], record.journal_entries + len(applied)
            # the old journal stays as it is until the new record (generation 1) includes it
            journal = JournalWriter(log_fd, record.spool_id, max(1, entries), 0)
            journal.entries = entries
        else:
            state, kept, bad = settle(fd, recorded, applied, dropped)
            sums, entries = state.sums, record.journal_entries + kept
            journal = JournalWriter.reopen(log_fd, record.spool_id, entries, record.journal_generation)
        self._opened_files()
        spool_file = SpoolFile(self, record.spool_id, fd, journal, recorded=True, durable=record.durable,
                               ranges=ByteRanges(state.ranges), sums=sums)
        return Reopened(spool_file, state, bad, refold=recorded.sums is None)

    def records(self) -> list[SpoolRecord]:
        """Every record: each ID.json, and each used slot of records.slots (an ID.json wins over a
        slot of the same id: it was written after it). A damaged ID.json stops the mount
        (StoreError), unless the machine restarted since the last mount: a record never made
        durable is rewritten in place, and a power loss may tear that write, so it is set aside as
        untrusted (kept, logged), as any record written without fsync before a restart is. A
        damaged slot is set aside so (its id may be unreadable) in either case; one of a version
        this lmzfs does not know stops the mount."""
        out = {}
        for path in sorted(self.dir.glob("*.json")):
            data = path.read_bytes()
            if not data and not self.restarted:
                # made, then killed before its one write: the create it was for never returned
                log.info("removing %s: an empty spool record (the mount was killed as it created a file)", path)
                self.remove(path.stem)
                continue
            try:
                record = SpoolRecord.from_json(data, path)
            except StoreError as exc:
                if not self.restarted or "is damaged" not in str(exc):
                    raise
                aside = self.set_aside(path.stem)
                log.error("%s; the machine restarted since it was written (a power loss may tear a record "
                          "written without fsync), so it is not replayed, kept as %s", str(exc).split(";")[0], aside)
                continue
            out[record.spool_id] = record
        pairs = [(self.pairs, c, *self._parsed(c, PAIRS_FILE)) for c in self.pairs.read()]
        slots = [(self.slots, c, *self._parsed(c, SLOTS_FILE)) for c in self.slots.read()]
        elsewhere = set(out) | {r.spool_id for _, _, r, _ in slots if r is not None}
        damaged, superseded = [], []
        # a pair wins over a slot of the same id: a record moves from its slot to a pair, never back
        for held, content, record, why in pairs + slots:
            if record is None:
                if content.damaged_id in elsewhere:
                    superseded.append((held, content.slot, "a write to it was cut short; the record stands "
                                                           "where it was before"))
                else:
                    damaged.append((held, content, why))
            elif record.spool_id in out:
                superseded.append((held, content.slot, "its record was written again elsewhere"))
            else:
                held.bind(record.spool_id, content.slot)
                out[record.spool_id] = record
        for held, slot, why in superseded:
            log.info("freeing slot %d of %s: %s", slot, held.path, why)
            held.free_slot(slot)
        for held, content, why in damaged:
            kind = "pair" if held is self.pairs else "slot"
            aside = self.dir / f"{kind}-{content.slot}{UNTRUSTED_SUFFIX}"
            _write_durably(aside, content.data)
            held.free_slot(content.slot)
            held.sync()
            cause = (" (the machine restarted since it was written: a power loss may tear a record written "
                     "without fsync)" if self.restarted else "")
            log.error("%s%s; it is not replayed, kept as %s", why, cause, aside)
        return [out[k] for k in sorted(out)]

    def _parsed(self, content, name: str) -> tuple[SpoolRecord | None, str]:
        """A used slot's record, or None and why it cannot be trusted (StoreError for a version
        this lmzfs does not know: refused, kept as it is)."""
        where = self.dir / f"{name}:{content.slot}"
        try:
            record = SpoolRecord.from_json(content.data, where)
        except StoreError as exc:
            if "is not supported" in str(exc):
                raise
            return None, str(exc).split(";")[0]
        if record.durable:             # a durable record is always its own ID.json: this one is not ours
            return None, f"spool record {where} is damaged (durable, in a slot)"
        return record, ""

    def record_ids(self) -> set[str]:
        return {p.stem for p in self.dir.glob("*.json")} | self.slots.ids() | self.pairs.ids()

    def write_record(self, record: SpoolRecord, *, durable: bool = True, fresh: bool = False) -> None:
        """`fresh`: the spool file has no record yet (nothing to rewrite in place)."""
        if not durable and not fresh and self._rewrite(record.spool_id, record.to_json()):
            return
        final = self._record(record.spool_id)
        tmp = final.with_suffix(".json-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            try:
                data = record.to_json()
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write of a spool record")
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)     # a full disk leaves no empty record behind
            raise
        if durable:
            fsync_dir(self.dir)

    def _rewrite(self, spool_id: str, data: bytes) -> bool:
        """Rewrite a record that was never durable in place, if it and the new one fit in a page:
        one pwrite at offset 0 (a kill of the daemon finds it applied whole or not at all, as the
        kernel copies a page at a time), padded with spaces to the old length (JSON ignores
        them), so the file is never cut. False if it cannot be (then write a new file)."""
        try:
            fd = os.open(self._record(spool_id), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            old = os.fstat(fd).st_size
            if not 0 < old <= IN_PLACE_MAX or len(data) > IN_PLACE_MAX:
                return False
            padded = data.ljust(old, b" ")
            if os.pwrite(fd, padded, 0) != len(padded):
                raise OSError(errno.ENOSPC, "short write of a spool record")
        finally:
            os.close(fd)
        return True

    def remove_record(self, spool_id: str, *, durable: bool = True) -> None:
        self.slots.free(spool_id)
        self.pairs.free(spool_id)
        self._record(spool_id).unlink(missing_ok=True)
        if durable:
            self.slots.sync()
            self.pairs.sync()
            fsync_dir(self.dir)

    def remove(self, spool_id: str, *, record_only: bool = False, files_only: bool = False) -> None:
        """Remove the record first: a data file without a record is never replayed. Not fsync'd:
        a record that comes back after a power loss is recognised by its id in fs_spool_commits,
        which a mount forgets only after sync_removals()."""
        if not files_only:             # (the files an inline record's spill made, and failed to name)
            if self.slots.holds(spool_id):
                self.slots.free(spool_id)
            elif self.pairs.holds(spool_id):
                self.pairs.free(spool_id)
            else:
                self._record(spool_id).unlink(missing_ok=True)
        if not record_only:            # (an inline file has no other)
            self._data(spool_id).unlink(missing_ok=True)
            self._log(spool_id).unlink(missing_ok=True)

    def sync_removals(self) -> None:
        """Make every removal so far durable."""
        self.slots.sync()
        self.pairs.sync()
        fsync_dir(self.dir)

    def set_aside(self, spool_id: str) -> Path:
        """A record that cannot be trusted: kept, with its files, where no mount replays it."""
        aside = self.dir / f"{spool_id}{UNTRUSTED_SUFFIX}"
        held = self.slots if self.slots.holds(spool_id) else self.pairs if self.pairs.holds(spool_id) else None
        if held is None:
            os.replace(self._record(spool_id), aside)
        else:                          # a slot's record: written out to its own file, then freed
            _write_durably(aside, held.page(spool_id) or b"")
            held.free(spool_id)
            held.sync()
        fsync_dir(self.dir)
        return aside

    def leftover_data(self) -> list[Path]:
        """Spool files with no record (a mount killed as it made them) or a set-aside one."""
        recorded = self.record_ids()
        return sorted(p for p in self.dir.iterdir()
                      if p.suffix in (".data", ".log") and p.stem not in recorded)

    def _data(self, spool_id: str) -> Path:
        return self.dir / f"{spool_id}.data"

    def _log(self, spool_id: str) -> Path:
        return self.dir / f"{spool_id}.log"

    def _record(self, spool_id: str) -> Path:
        return self.dir / f"{spool_id}.json"


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, f"short write of {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def pending_records(store_root: Path) -> int:
    """How many spool records a store holds (files not yet committed), read without a mount."""
    spool = Path(store_root) / SPOOL_DIR
    return sum(1 for _ in spool.glob("*.json")) + used_slots(spool / SLOTS_FILE) + \
        len(used_pair_slots(spool / PAIRS_FILE))
