"""The random-access reader (the ArchiveIndex layer): a store's files, opened as FileReaders
(lmzfs/reader/filereader.py) that share the store's chunk source and one read-ahead pool."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from lmzfs.counters import ReadCounters
from lmzfs.hostresources import MAX_CACHE, usable_cpus
from lmzfs.reader.api import FileEntry, StoreTotals
from lmzfs.reader.filereader import FileReader
from lmzfs.reader.readahead import Prefetcher
from lmzfs.store.catalog import Catalog, CatalogDamaged
from lmzfs.store.catalog.check import examine
from lmzfs.store.catalog.copies import list_copies
from lmzfs.store.packbackend import LocalPacks, PackBackend
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.layout import StorePaths

__all__ = ["Archive", "DEFAULT_CACHE_BYTES", "FileReader"]

DEFAULT_CACHE_BYTES = MAX_CACHE

log = logging.getLogger(__name__)


class Archive:
    """Thread-safe: the catalog connection is used under a lock, chunk reads run in parallel.

    `workers` threads decode ahead of sequential readers (0 turns read-ahead off; None: one per
    usable CPU). With check_ids, every chunk is also checked against its SHA-256 id, not only
    against its read checksum (`lmz verify`). With copy_on_damage (a running mount), files open
    from the newest clean copy of the catalog once the live file has gone bad (see open)."""

    def __init__(self, store_dir: Path, cache_bytes: int = DEFAULT_CACHE_BYTES, workers: int | None = None,
                 check_ids: bool = False, copy_on_damage: bool = False):
        self.store = StorePaths(Path(store_dir))
        self.store.check_format()
        self._copy_on_damage = copy_on_damage
        self._start(Catalog(self.store.catalog, readonly=True), LocalPacks(self.store), cache_bytes, workers,
                    check_ids)

    def _start(self, catalog: Catalog, packs: PackBackend, cache_bytes: int, workers: int | None,
               check_ids: bool) -> None:
        """Serve `catalog`'s files from `packs` (a local store's, or a remote store's: remotearchive.py)."""
        self._catalog = catalog
        self._snapshot: Catalog | None = None      # the newest clean copy, once the live file went bad
        self._lock = threading.Lock()
        self.counters = ReadCounters()
        self.source = ChunkSource(packs, cache_bytes, check_ids=check_ids, counters=self.counters)
        workers = usable_cpus() if workers is None else workers
        self.prefetcher = Prefetcher(workers, cache_bytes) if workers > 0 else None

    def generation(self) -> int:
        with self._lock:
            return self._catalog.data_version()

    def files(self) -> list[FileEntry]:
        with self._lock:
            storage = self._catalog.file_storage()
            return [FileEntry(r.model, r.path, r.size, r.mtime, r.sha256, *storage.get(r.id, (0, "")), r.id)
                    for r in self._catalog.files()]

    def hf_revisions(self) -> list:
        """The models recorded as Hugging Face hub revisions (store/catalog/hfrows.py), for the
        mount's .hf view; StoreError if their tables are of a version this lmzfs does not know."""
        from lmzfs.store.catalog.hfrows import load_revisions
        with self._lock:
            return load_revisions(self._catalog.db)

    def entry(self, model: str, path: str) -> FileEntry:
        for e in self.files():
            if e.model == model and e.path == path:
                return e
        raise FileNotFoundError(f"{model}/{path}: no such file in the store")

    def totals(self) -> StoreTotals:
        with self._lock:
            logical, files = self._catalog.total_logical()
        return StoreTotals(logical, self.store.disk_bytes(), files)

    def stats_snapshot(self) -> dict:
        """What a running mount reports: reads, decodes, cache and read-ahead, as plain numbers."""
        cache = self.source.cache
        c = cache.stats
        lookups = c.hits + c.misses + c.waits
        return {
            "reader": self.counters.snapshot(),
            "cache": {"capacity_bytes": cache.capacity, "bytes": cache.size_bytes, "peak_bytes": cache.peak_bytes,
                      "hits": c.hits, "misses": c.misses, "waits": c.waits,
                      "hit_rate": round(c.hits / lookups, 4) if lookups else None},
            "open_packs": self.source.open_packs(),
            "readahead": {"enabled": self.prefetcher is not None,
                          "active_streams": self.prefetcher.active_streams() if self.prefetcher else 0},
        }

    def streaming(self) -> bool:
        """Some open file is read ahead of a sequential reader now (its window active)."""
        return self.prefetcher is not None and self.prefetcher.active_streams() > 0

    def open(self, entry: FileEntry) -> FileReader:
        """A reader of the file. With copy_on_damage, if the live catalog file has gone bad, the
        file's rows come from the newest copy of the catalog that checks clean (written after
        every commit), so the tree the mount lists keeps opening; every chunk read is checked as
        always, so a copy that is behind the packs gives EIO, never wrong bytes."""
        with self._lock:
            try:
                row, extents = self._rows_of(self._catalog, entry)
            except CatalogDamaged as exc:
                snapshot = self._snapshot_catalog(exc) if self._copy_on_damage else None
                if snapshot is None:
                    raise
                row, extents = self._rows_of(snapshot, entry)
        return FileReader(self.source, self.prefetcher, f"{row.model}/{row.path}", row.size, extents)

    @staticmethod
    def _rows_of(catalog: Catalog, entry: FileEntry):
        row = catalog.file_by_id(entry.file_id)
        if row is None or (row.model, row.path) != (entry.model, entry.path):
            raise FileNotFoundError(f"{entry.model}/{entry.path}: no longer in the store")
        return row, catalog.extents(entry.file_id)

    def _snapshot_catalog(self, damage: CatalogDamaged) -> Catalog | None:
        """The newest clean copy (opened once, logged once), or None if no copy checks clean."""
        if self._snapshot is None:
            for copy in list_copies(self.store.catalog):
                if examine(copy.path, copy=True).clean:
                    self._snapshot = Catalog(copy.path, readonly=True)
                    log.error("%s; files open from its copy %s until it is repaired", damage, copy.path.name)
                    break
        return self._snapshot

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.source.close()
        self._catalog.close()
        if self._snapshot is not None:
            self._snapshot.close()
