"""The stored versions of a writable mount's files: a read-only catalog connection (used under a
lock) and the store's chunk source, of which a file's stored bytes are read (a FileReader).

Not lmzfs.reader's Archive.open: it finds a file by an entry (model, path, id) that it checks
against the catalog, where the mount has only the id (its tree may name the path differently
while a rename is being stored), and a lookup by id first costs one more query per open."""
from __future__ import annotations

import errno
import threading

from lmzfs.fsmodel.holes import HOLE_MIN, ZERO_RATIO, Holes, holes_of
from lmzfs.fsmodel.nodes import fs_error
from lmzfs.store.catalog.chunkrows import referenced_payload
from lmzfs.store.catalog.fsrows import small_coded_extents
from lmzfs.reader.filereader import FileReader
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.packbackend import LocalPacks
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.layout import StorePaths


class StoredFiles:
    def __init__(self, store: StorePaths, cache_bytes: int):
        self._reads = Catalog(store.catalog, readonly=True)
        self._lock = threading.Lock()
        self.source = ChunkSource(LocalPacks(store), cache_bytes)

    def sha256(self, file_id: int) -> str | None:
        """The stored version's SHA-256; None if it is no longer stored."""
        with self._lock:
            row = self._reads.file_by_id(file_id)
        return row.sha256 if row is not None else None

    def holes(self, file_id: int | None) -> Holes:
        """The stored version's holes (its runs of chunks of zeros)."""
        if file_id is None:
            return ()
        with self._lock:
            rows = small_coded_extents(self._reads.db, file_id, HOLE_MIN, ZERO_RATIO)
        return holes_of(rows)

    def referenced_payload(self) -> tuple[int, int]:
        """(chunks something references, their payload bytes), as the catalog is committed now."""
        with self._lock:
            return referenced_payload(self._reads.db)

    def reader(self, file_id: int | None) -> FileReader | None:
        """The stored version's bytes (None: a file never stored)."""
        if file_id is None:
            return None
        with self._lock:
            row = self._reads.file_by_id(file_id)
            if row is None:
                raise fs_error(errno.ENOENT, "the file was removed from the store")
            extents = self._reads.extents(file_id)
        return FileReader(self.source, None, f"{row.model}/{row.path}", row.size, extents)

    def chunk_extents(self, chunk_ids: list[bytes]) -> dict[bytes, Extent]:
        """The named chunks the store holds now (as committed), their references resolved."""
        with self._lock:
            return self._reads.chunk_extents(chunk_ids)

    def close(self) -> None:
        self.source.close()
        self._reads.close()
