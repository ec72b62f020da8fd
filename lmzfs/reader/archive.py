"""The random-access reader (the ArchiveIndex layer): files of a store as objects with pread()."""
from __future__ import annotations

import bisect
import threading
from pathlib import Path

from lmzfs.reader.api import CorruptChunk, FileEntry, StoreTotals
from lmzfs.reader.cache import ChunkCache
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.chunkread import read_chunk
from lmzfs.store.layout import StorePaths
from lmzfs.store.packfds import PackDescriptors

DEFAULT_CACHE_BYTES = 256 << 20


class Archive:
    """Thread-safe: the catalog connection is used under a lock, chunk reads run in parallel."""

    def __init__(self, store_dir: Path, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.store = StorePaths(Path(store_dir))
        self.store.check_format()
        self._catalog = Catalog(self.store.catalog, readonly=True)
        self._lock = threading.Lock()
        self.cache = ChunkCache(cache_bytes)
        self.packs = PackDescriptors(self.store)

    def generation(self) -> int:
        with self._lock:
            return self._catalog.data_version()

    def files(self) -> list[FileEntry]:
        with self._lock:
            storage = self._catalog.file_storage()
            return [FileEntry(r.model, r.path, r.size, r.mtime, r.sha256, *storage.get(r.id, (0, "")), r.id)
                    for r in self._catalog.files()]

    def entry(self, model: str, path: str) -> FileEntry:
        for e in self.files():
            if e.model == model and e.path == path:
                return e
        raise FileNotFoundError(f"{model}/{path}: no such file in the store")

    def totals(self) -> StoreTotals:
        with self._lock:
            logical, files = self._catalog.total_logical()
        stored = sum(p.stat().st_size for p in self.store.packs.glob("pack-*.lmzp"))
        stored += sum(p.stat().st_size for p in self.store.root.glob("catalog.sqlite*"))
        return StoreTotals(logical, stored, files)

    def open(self, entry: FileEntry) -> "FileReader":
        with self._lock:
            row = self._catalog.file_by_id(entry.file_id)
            if row is None or (row.model, row.path) != (entry.model, entry.path):
                raise FileNotFoundError(f"{entry.model}/{entry.path}: no longer in the store")
            extents = self._catalog.extents(entry.file_id)
        return FileReader(self, f"{row.model}/{row.path}", row.size, extents)

    def close(self) -> None:
        self.packs.close()
        self.cache.clear()
        self._catalog.close()


class FileReader:
    def __init__(self, archive: Archive, label: str, size: int, extents: list[Extent]):
        self.label = label
        self.size = size
        self._archive = archive
        self._extents = extents
        self._starts = [e.offset for e in extents]
        covered = sum(e.size for e in extents)
        if covered != size or any(a.offset + a.size != b.offset for a, b in zip(extents, extents[1:])):
            raise CorruptChunk(f"{label}: catalog extents do not tile the file")
        self._fds = archive.packs.acquire({e.location.pack for e in extents})

    def _chunk(self, e: Extent) -> bytes:
        return self._archive.cache.get(e.chunk_id, lambda: read_chunk(self._fds[e.location.pack], e))

    def pread(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(self.size, offset + length)
        if offset >= end:
            return b""
        i = bisect.bisect_right(self._starts, offset) - 1
        parts = []
        pos = offset
        while pos < end:
            e = self._extents[i]
            try:
                data = self._chunk(e)
            except CorruptChunk as exc:
                raise CorruptChunk(f"{self.label} at offset {e.offset}: {exc.strerror}") from None
            lo = pos - e.offset
            hi = min(e.size, end - e.offset)
            parts.append(data[lo:hi] if (lo, hi) != (0, e.size) else data)
            pos = e.offset + hi
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self._fds is not None:
            self._archive.packs.release(self._fds)
            self._fds = None

    def __enter__(self) -> "FileReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
