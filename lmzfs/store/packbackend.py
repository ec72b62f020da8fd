"""Where pack files live: the backend under every pack read and write.

A backend lists packs, reads a range of one, appends records through an appender (append, then
seal to make them durable), and removes or cuts packs that no catalog names any more. The local
packs directory (`LocalPacks`) is the implementation here; an object store is another. The
record format itself (packs.py) is the backend's business no more than the catalog is: a backend
moves bytes, and every reader checks the record header and the chunk's checksum above it.
"""
from __future__ import annotations

import errno
import os
import re
from typing import Callable, Protocol

from lmzfs.killpoints import reached
from lmzfs.store.layout import FILE_MODE, StoreError, StorePaths, fsync_dir
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER, RECORD_MAGIC, ChunkLocation, PackSource, check_pack_header
from lmzfs.store.read.packfds import PackDescriptors, packs_in_use

_PACK_NAME = re.compile(r"pack-(\d{8})\.lmzp$")
MAX_PACK_BYTES = 1 << 30          # a writer starts a new pack past this size


class PackAppender(Protocol):
    """Appends records for one writer; nothing it appends is named by the catalog until the
    writer's commit, and a writer that fails before it discards what it appended."""
    touched: list[int]

    @property
    def pack_id(self) -> int: ...
    def append(self, chunk_id: bytes, payload: bytes | memoryview) -> ChunkLocation: ...
    def seal(self) -> None: ...
    def close(self) -> None: ...
    def discard(self, named_end: Callable[[int], int]) -> bool: ...


class PackHandles(Protocol):
    """The packs readers have open, shared: acquire (open or share), held, release, close."""
    def acquire(self, pack_ids: set[int]) -> dict[int, PackSource]: ...
    def held(self, pack_id: int) -> PackSource | None: ...
    def release(self, fds: dict[int, PackSource]) -> None: ...
    def close(self) -> None: ...
    def __len__(self) -> int: ...


class PackBackend(Protocol):
    """What readers need of a backend is descriptors(); the rest is a writer's (a remote store's
    backend is read-only: store/remote/packs.py)."""
    def descriptors(self) -> PackHandles: ...
    def list_packs(self) -> dict[int, int]: ...
    def read_range(self, pack_id: int, offset: int, length: int) -> bytes: ...
    def appender(self, append_to: int | None, next_new: int) -> PackAppender: ...
    def truncate(self, pack_id: int, size: int) -> None: ...
    def remove(self, pack_id: int) -> None: ...
    def sync_listing(self) -> None: ...
    def in_use(self) -> bool: ...


class LocalPacks:
    """The packs directory of a local store."""

    def __init__(self, store: StorePaths):
        self.store = store

    def list_packs(self) -> dict[int, int]:
        """pack id -> its size in bytes, for every pack file (one removed meanwhile is left out)."""
        out: dict[int, int] = {}
        for p in self.store.packs.iterdir():
            m = _PACK_NAME.match(p.name)
            if m:
                try:
                    out[int(m.group(1))] = p.stat().st_size
                except FileNotFoundError:
                    pass
        return out

    def read_range(self, pack_id: int, offset: int, length: int) -> bytes:
        fd = os.open(self.store.pack(pack_id), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def open_read(self, pack_id: int) -> int:
        """A descriptor of the pack for a writer's own reads (gc, compact); the caller closes it."""
        return os.open(self.store.pack(pack_id), os.O_RDONLY | os.O_CLOEXEC)

    def descriptors(self) -> PackDescriptors:
        """The shared, lease-holding descriptors a reader of chunks keeps (read/packfds.py)."""
        return PackDescriptors(self.store)

    def appender(self, append_to: int | None, next_new: int) -> "LocalPackWriter":
        return LocalPackWriter(self, append_to, next_new)

    def truncate(self, pack_id: int, size: int) -> None:
        fd = os.open(self.store.pack(pack_id), os.O_RDWR)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, pack_id: int) -> None:
        self.store.pack(pack_id).unlink(missing_ok=True)

    def sync_listing(self) -> None:
        """Make removals and creations durable."""
        fsync_dir(self.store.packs)

    def in_use(self) -> bool:
        """Whether some process has the packs open for reading (a mount, `lmz cat`)."""
        return packs_in_use(self.store)

    def free_bytes(self) -> int:
        st = os.statvfs(self.store.packs)
        return st.f_bavail * st.f_frsize


class LocalPackWriter:
    """Appends records to the local packs for one pack session; `seal()` makes everything
    appended so far durable. Made only by LocalPacks.appender, for store/write/session.py."""

    def __init__(self, backend: LocalPacks, append_to: int | None, next_new: int):
        """Append to pack `append_to` if it exists and has room, else create pack `next_new` (or the
        first free id above it: ids are never reused while a committed catalog could name them)."""
        self._backend = backend
        self._paths = paths = backend.store
        self._next_new = next_new
        self._fd: int | None = None
        self._size = 0
        self.touched: list[int] = []
        # pack id -> its size when this writer began appending to it; 0: this writer created it
        self._began: dict[int, int] = {}
        path = paths.pack(append_to) if append_to is not None else None
        if path is not None and path.exists() and path.stat().st_size < MAX_PACK_BYTES:
            fd = os.open(path, os.O_RDWR)
            try:
                check_pack_header(fd, path)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._pack_id, self._size = fd, append_to, os.fstat(fd).st_size
            self.touched.append(append_to)
            self._began[append_to] = self._size
        else:
            self._create()

    def _create(self) -> None:
        pack_id = self._next_new
        while True:
            try:
                fd = os.open(self._paths.pack(pack_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
                break
            except FileExistsError:
                pack_id += 1
            except OSError as exc:
                raise StoreError(f"cannot create pack {pack_id}: {exc.strerror}") from exc
        try:
            if os.write(fd, PACK_HEADER) != len(PACK_HEADER):
                raise OSError(errno.ENOSPC, "short write (disk full?)")
            os.fsync(fd)
            fsync_dir(self._paths.packs)
        except OSError as exc:
            os.close(fd)
            try:
                os.unlink(self._paths.pack(pack_id))      # it holds nothing yet
            except OSError:
                pass
            raise StoreError(f"cannot create pack {pack_id}: {exc.strerror}") from exc
        self._began[pack_id] = 0
        self._fd, self._pack_id, self._size = fd, pack_id, len(PACK_HEADER)
        self._next_new = pack_id + 1
        self.touched.append(pack_id)

    def append(self, chunk_id: bytes, payload: bytes | memoryview) -> ChunkLocation:
        if self._size >= MAX_PACK_BYTES:
            self.seal()
            self.close()
            self._create()
        record = RECORD_HEADER.pack(RECORD_MAGIC, chunk_id, len(payload))
        offset = self._size
        try:
            n = os.pwrite(self._fd, record + payload, offset)
        except OSError as exc:
            raise StoreError(f"cannot write to pack {self._pack_id}: {exc.strerror}") from exc
        if n != len(record) + len(payload):
            raise StoreError(f"short write to pack {self._pack_id} (disk full?)") from OSError(
                errno.ENOSPC, "short write")
        self._size += n
        reached("append")
        return ChunkLocation(self._pack_id, offset + RECORD_HEADER.size, len(payload))

    @property
    def pack_id(self) -> int:
        return self._pack_id

    def seal(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreError(f"cannot make pack {self._pack_id} durable: {exc.strerror}") from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self, named_end: Callable[[int], int]) -> bool:
        """Cut everything this writer appended, for a write that failed before its catalog commit:
        each pack it created is removed, each pack it appended to is cut back to its size before.
        `named_end(pack)` is where the last record the catalog names in that pack ends (0: none);
        if it lies past where this writer began, a commit that reported failure went through, and
        nothing is cut. Returns whether the bytes were cut. It never raises: whatever stops it (a
        catalog it cannot read, an I/O error) leaves the bytes to `lmz gc`, as a killed process
        does, and the caller reports the error that made it discard."""
        self.close()
        try:
            if any(named_end(pack) > start for pack, start in self._began.items()):
                return False
            for pack, start in self._began.items():
                if start == 0:
                    self._backend.remove(pack)
                else:
                    self._backend.truncate(pack, start)
            self._backend.sync_listing()
        except Exception:       # noqa: BLE001 -- see above: the bytes stay for gc
            return False
        self._began.clear()
        return True
