"""The random-access reader (the ArchiveIndex layer): a store's files, opened as FileReaders
(lmzfs/reader/filereader.py) that share one cache, one read-ahead pool and one decoder."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from lmzfs.hostresources import MAX_CACHE, usable_cpus
from lmzfs.reader.api import FileEntry, StoreTotals
from lmzfs.reader.cache import ChunkCache
from lmzfs.reader.decodepool import WORKERS_PER_CPU, ProcessDecoder
from lmzfs.reader.filereader import QUICK_BYTES, FileReader
from lmzfs.reader.readahead import Prefetcher
from lmzfs.reader.stats import ReaderStats
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths
from lmzfs.store.packfds import PackDescriptors

__all__ = ["Archive", "DEFAULT_CACHE_BYTES", "FileReader", "QUICK_BYTES", "default_workers"]

DEFAULT_CACHE_BYTES = MAX_CACHE


def default_workers(decoder: str) -> int:
    """Workers when none are set: a decode thread per usable CPU, or WORKERS_PER_CPU processes."""
    return usable_cpus() * (WORKERS_PER_CPU if decoder == "process" else 1)


class Archive:
    """Thread-safe: the catalog connection is used under a lock, chunk reads run in parallel.

    `workers` threads decode ahead of sequential readers (0 turns read-ahead off; None: one per
    usable CPU). With decoder="process", chunks are decoded in that many worker processes instead
    of in the calling threads (see decodepool.py for why; None: WORKERS_PER_CPU per usable CPU). With check_ids, every chunk is also checked
    against its SHA-256 id, not only against its read checksum (`lmz verify`)."""

    def __init__(self, store_dir: Path, cache_bytes: int = DEFAULT_CACHE_BYTES, workers: int | None = None,
                 decoder: str = "thread", check_ids: bool = False):
        self.store = StorePaths(Path(store_dir))
        self.check_ids = check_ids
        self.store.check_format()
        self._catalog = Catalog(self.store.catalog, readonly=True)
        self._lock = threading.Lock()
        self.cache = ChunkCache(cache_bytes)
        self.packs = PackDescriptors(self.store)
        self.stats = ReaderStats()
        workers = default_workers(decoder) if workers is None else workers
        self.prefetcher = Prefetcher(workers, cache_bytes) if workers > 0 else None
        # copies lone reads' chunks into the cache after the reads are answered (FileReader._lent)
        self._settler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmz-settle")
        if decoder not in ("thread", "process") or (check_ids and decoder != "thread"):
            raise ValueError(f"decoder must be 'thread' or 'process' (check_ids: 'thread'), not {decoder!r}")
        self.decoder = None
        try:
            self.decoder = ProcessDecoder(max(1, workers)) if decoder == "process" else None
        except BaseException:       # a worker that cannot start: close what is open, then say why
            self.close()
            raise

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

    def stats_snapshot(self) -> dict:
        """What a running mount reports: reads, decodes, cache and read-ahead, as plain numbers."""
        reader = self.stats.snapshot()
        c = self.cache.stats
        lookups = c.hits + c.misses + c.waits
        return {
            "reader": reader,
            "cache": {"capacity_bytes": self.cache.capacity, "bytes": self.cache.size_bytes, "hits": c.hits,
                      "misses": c.misses, "waits": c.waits,
                      "hit_rate": round(c.hits / lookups, 4) if lookups else None},
            "decoder": "process" if self.decoder is not None else "thread",
            "readahead": {"enabled": self.prefetcher is not None,
                          "active_streams": self.prefetcher.active_streams() if self.prefetcher else 0},
        }

    def streaming(self) -> bool:
        """Some open file is read ahead of a sequential reader now (its window active)."""
        return self.prefetcher is not None and self.prefetcher.active_streams() > 0

    def open(self, entry: FileEntry) -> FileReader:
        with self._lock:
            row = self._catalog.file_by_id(entry.file_id)
            if row is None or (row.model, row.path) != (entry.model, entry.path):
                raise FileNotFoundError(f"{entry.model}/{entry.path}: no longer in the store")
            extents = self._catalog.extents(entry.file_id)
        return FileReader(self, f"{row.model}/{row.path}", row.size, extents)

    def settle_later(self, settle: Callable[[], None]) -> None:
        """Run a lent chunk's settle (ChunkCache.lend) on the settle thread, or here once closing."""
        try:
            self._settler.submit(settle)
        except RuntimeError:        # shut down: nobody waits long for a closing archive
            settle()

    def wait_settled(self) -> None:
        """Return once every lent chunk handed to settle_later so far is in the cache (for tests
        and stats that count cached bytes: the settle thread runs its work in order)."""
        try:
            self._settler.submit(lambda: None).result()
        except RuntimeError:
            pass

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self._settler.shutdown(wait=True)       # threads may wait for the chunks it settles
        if self.decoder is not None:
            self.decoder.close()
        self.packs.close()
        self.cache.clear()
        self._catalog.close()
