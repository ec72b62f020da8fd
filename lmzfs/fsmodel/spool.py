"""The spool: where a writable mount keeps written bytes until they are committed to the store.

STORE/spool/ holds, per file with uncommitted writes, ``ID.data`` (a sparse file at the same
offsets as the file itself: the bytes written, holes elsewhere) and, once the file has been
fsync'd, ``ID.json`` (a SpoolRecord: which file, which ranges of ID.data hold its bytes, its size
and metadata). fsync writes ID.data's bytes durably and then replaces ID.json durably (write,
fsync, rename, fsync the directory), so a record never names bytes that are not on disk.

A record stays until the file's commit to the store is durable; the commit's catalog
transaction names the record's ID (fs_spool_commits), so a mount that finds a record whose ID the
catalog names knows it is committed and only then removes the spool's files. Nothing else
removes a record: a mount replays every record it finds (docs/operations.md).

``mount.lock`` is held (flock) by the one writable mount of the store.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lmzfs.store.fscatalog import EntryMeta
from lmzfs.store.layout import DIR_MODE, FILE_MODE, StoreError, fsync_dir

SPOOL_DIR = "spool"
RECORD_VERSION = 1
MOUNT_LOCK = "mount.lock"


@dataclass(frozen=True)
class SpoolRecord:
    """What a spooled file is: enough to commit it after a crash."""
    spool_id: str
    model: str
    path: str                          # inside the model, at the last fsync or rename
    file_id: int | None                # the stored file it changes (None: a new file)
    base_sha256: str | None            # that stored file's content the ranges apply to
    base_len: int                      # bytes of the stored file still visible (after truncates)
    size: int
    ranges: list[tuple[int, int]]      # where ID.data holds the file's bytes
    meta: EntryMeta
    version: int = RECORD_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, source: Path) -> "SpoolRecord":
        try:
            raw = json.loads(data)
            if raw.get("version") != RECORD_VERSION:
                raise StoreError(f"spool record {source}: version {raw.get('version')!r} is not supported")
            raw["meta"] = EntryMeta(**raw["meta"])
            raw["ranges"] = [tuple(r) for r in raw["ranges"]]
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreError(f"spool record {source} is damaged ({exc}); it is kept, move it away to mount") from None


@dataclass
class SpoolFile:
    """ID.data of one file: the bytes written to it, at the file's own offsets."""
    spool: "Spool"
    spool_id: str
    fd: int
    recorded: bool = False             # ID.json exists
    closed: bool = field(default=False)

    def pwrite(self, data: bytes, offset: int) -> int:
        return os.pwrite(self.fd, data, offset)

    def pread(self, length: int, offset: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) < length:             # a hole at the end of a sparse file reads short
            data += bytes(length - len(data))
        return data

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def record(self, record: SpoolRecord) -> None:
        """Make the bytes and the record durable, in that order."""
        os.fsync(self.fd)
        self.spool.write_record(record)
        self.recorded = True

    def forget_record(self) -> None:
        """The record no longer stands (the file was unlinked): a crash must not bring it back."""
        if self.recorded:
            self.spool.remove_record(self.spool_id)
            self.recorded = False

    def release(self) -> None:
        """Close, keeping ID.data and ID.json for the next mount to commit."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def close(self) -> None:
        """Close and remove ID.data (and ID.json): the file's bytes are committed or unwanted."""
        if self.closed:
            return
        self.closed = True
        os.close(self.fd)
        self.spool.remove(self.spool_id)


class Spool:
    def __init__(self, store_root: Path):
        self.dir = Path(store_root) / SPOOL_DIR
        try:
            self.dir.mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the spool {self.dir}: {exc.strerror}") from None
        self._lock_fd: int | None = None

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

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- files ---------------------------------------------------------------------------------
    def new_file(self) -> SpoolFile:
        spool_id = uuid.uuid4().hex
        try:
            fd = os.open(self._data(spool_id), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise OSError(exc.errno or errno.EIO, f"cannot create a spool file: {exc.strerror}") from None
        return SpoolFile(self, spool_id, fd)

    def reopen(self, record: SpoolRecord) -> SpoolFile:
        """The data file of a record found at mount."""
        try:
            fd = os.open(self._data(record.spool_id), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"spool record {record.spool_id} names bytes that are missing; it is kept") from None
        return SpoolFile(self, record.spool_id, fd, recorded=True)

    def records(self) -> list[SpoolRecord]:
        out = []
        for path in sorted(self.dir.glob("*.json")):
            out.append(SpoolRecord.from_json(path.read_bytes(), path))
        return out

    def write_record(self, record: SpoolRecord) -> None:
        final = self._record(record.spool_id)
        tmp = final.with_suffix(".json-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            data = record.to_json()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write of a spool record")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        fsync_dir(self.dir)

    def remove_record(self, spool_id: str) -> None:
        self._record(spool_id).unlink(missing_ok=True)
        fsync_dir(self.dir)

    def remove(self, spool_id: str) -> None:
        """Remove the record first: a data file without a record is never replayed."""
        record = self._record(spool_id)
        if record.exists():
            record.unlink()
            fsync_dir(self.dir)
        self._data(spool_id).unlink(missing_ok=True)

    def leftover_data(self) -> list[Path]:
        """Data files with no record: written, never fsync'd, and not committed before a crash."""
        recorded = {p.stem for p in self.dir.glob("*.json")}
        return [p for p in self.dir.glob("*.data") if p.stem not in recorded]

    def _data(self, spool_id: str) -> Path:
        return self.dir / f"{spool_id}.data"

    def _record(self, spool_id: str) -> Path:
        return self.dir / f"{spool_id}.json"
