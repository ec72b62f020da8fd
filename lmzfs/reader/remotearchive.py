"""An Archive over a remote store (lmzfs/store/remote/): the current snapshot's catalog, its packs
read by ranged GETs through the on-disk block cache, and a poll of the remote's pointer.

A newer snapshot, once the poll sees it, becomes what files() lists and open() opens; a file opened
before keeps the chunks its snapshot named (pack ids are stable, and prune leaves a replaced
snapshot's packs for its grace period). An engine that does not answer leaves the mount serving
the snapshot it has, from what the cache holds; a read that needs the engine then fails with EIO
within the request timeout, and reads resume by themselves once it answers again.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lmzfs.reader.api import StoreTotals
from lmzfs.reader.archive import DEFAULT_CACHE_BYTES, Archive
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError
from lmzfs.store.remote.blockcache import BlockCache, CacheBusy
from lmzfs.store.remote.fetch import RangeFetcher
from lmzfs.store.remote.objects import DEFAULT_TIMEOUT_S, ObjectStore, RemoteError, RemoteURL, RemoteUnavailable
from lmzfs.store.remote.packs import RemotePacks
from lmzfs.store.remote.snapshots import (OpenedSnapshot, cached_snapshot, open_snapshot, poll_pointer,
                                          read_pointer)

log = logging.getLogger(__name__)

DEFAULT_DISK_CACHE = 20 << 30       # bytes of fetched ranges kept on disk
DEFAULT_POLL_S = 30.0


def default_cache_dir(url: RemoteURL) -> Path:
    import os
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lmzfs" / "remote" / url.cache_name()


@dataclass(frozen=True)
class RemoteOptions:
    """How a host reads a remote store (the flags of `lmz mount --remote`, or the config's keys)."""
    url: str
    cache_dir: Path | None = None
    disk_cache_bytes: int = DEFAULT_DISK_CACHE
    poll_s: float = DEFAULT_POLL_S          # 0: never poll (one-shot commands)
    timeout_s: float = DEFAULT_TIMEOUT_S
    endpoint: str | None = None


class RemoteArchive(Archive):
    def __init__(self, options: RemoteOptions, cache_bytes: int = DEFAULT_CACHE_BYTES, workers: int | None = None,
                 check_ids: bool = False):
        self.options = options
        self.url = RemoteURL.parse(options.url)
        self.objects = ObjectStore(self.url, endpoint=options.endpoint, timeout=options.timeout_s)
        cache_dir = Path(options.cache_dir) if options.cache_dir else default_cache_dir(self.url)
        self._private: Path | None = None
        try:
            self.blocks = BlockCache(cache_dir, options.disk_cache_bytes)
        except CacheBusy:       # a mount owns it: a one-shot command reads through a cache of its own
            self._private = Path(tempfile.mkdtemp(prefix="lmz-remote-"))
            cache_dir = self._private
            self.blocks = BlockCache(cache_dir, min(options.disk_cache_bytes, 1 << 30))
        self.cache_dir = cache_dir
        self.state = "ok"
        self.last_poll: float | None = None
        snap, self._etag = self._first_snapshot()
        self._current = snap
        self._generation = 1
        self.packs = RemotePacks(RangeFetcher(self.objects, self.blocks), snap.manifest.packs)
        self._copy_on_damage = False
        self._start(Catalog(snap.catalog, readonly=True), self.packs, cache_bytes, workers, check_ids)
        self._stop = threading.Event()
        self._poller = None
        if options.poll_s > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="lmz-remote-poll", daemon=True)
            self._poller.start()

    # -- snapshots --------------------------------------------------------------------------------
    def _first_snapshot(self) -> tuple[OpenedSnapshot, str | None]:
        try:
            state = read_pointer(self.objects)
        except RemoteUnavailable as exc:
            cached = cached_snapshot(self.cache_dir)
            if cached is None:
                raise StoreError(f"{exc} (and no snapshot of it is cached in {self.cache_dir})") from None
            log.warning("%s; serving generation %d from the cache until it answers", exc, cached.pointer.generation)
            self.state = f"unreachable: {exc}"
            return cached, None
        if state.pointer is None:
            raise StoreError(f"{self.url}: no lmzfs store there yet (lmz push {self.url} on the ingest host)")
        return open_snapshot(self.objects, state.pointer, self.cache_dir), state.etag

    def refresh(self) -> bool:
        """Poll the pointer once; take a newer snapshot if there is one. True if it changed."""
        self.last_poll = time.time()
        try:
            state = poll_pointer(self.objects, self._etag)
            if state is None:
                self._mark_ok()
                return False
            if state.pointer is None:
                log.error("%s: the pointer is gone; serving generation %d", self.url, self._current.pointer.generation)
                return False
            if state.pointer.sha256 == self._current.pointer.sha256:
                self._etag = state.etag
                self._mark_ok()
                return False
            snap = open_snapshot(self.objects, state.pointer, self.cache_dir)
            catalog = Catalog(snap.catalog, readonly=True)
        except (RemoteError, StoreError) as exc:
            if self.state == "ok":
                log.error("%s; serving generation %d meanwhile", exc, self._current.pointer.generation)
            self.state = f"unreachable: {exc}"
            return False
        self.packs.learn(snap.manifest.packs)
        with self._lock:
            old, self._catalog = self._catalog, catalog
            self._current, self._etag = snap, state.etag
            self._generation += 1
        old.close()
        self._mark_ok()
        log.info("%s: now serving generation %d", self.url, snap.pointer.generation)
        return True

    def _mark_ok(self) -> None:
        if self.state != "ok":
            log.info("%s answers again", self.url)
        self.state = "ok"

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.options.poll_s):
            try:
                self.refresh()
            except Exception:           # noqa: BLE001 -- the poll must outlive anything one round meets
                log.exception("polling %s", self.url)

    # -- the Archive contract ---------------------------------------------------------------------
    def generation(self) -> int:
        return self._generation

    @property
    def current_snapshot(self) -> OpenedSnapshot:
        return self._current

    def catalog_for_listing(self) -> Catalog:
        """The current snapshot's catalog, for a one-shot listing (`lmz ls --remote`; not polled)."""
        return self._catalog

    def totals(self) -> StoreTotals:
        with self._lock:
            logical, files = self._catalog.total_logical()
        return StoreTotals(logical, sum(p.size for p in self._current.manifest.packs.values()), files)

    def stats_snapshot(self) -> dict:
        out = super().stats_snapshot()
        b = self.blocks.stats
        out["remote"] = {
            "url": str(self.url), "state": self.state, "generation": self._current.pointer.generation,
            "last_poll": self.last_poll, "poll_s": self.options.poll_s,
            "fetch": self.packs.fetcher.stats.snapshot(),
            "disk_cache": {"dir": str(self.cache_dir), "capacity_bytes": self.blocks.capacity,
                           "bytes": self.blocks.size_bytes, "hits": b.hits, "misses": b.misses,
                           "damaged": b.damaged, "evicted": b.evicted, "write_errors": b.write_errors},
        }
        return out

    def close(self) -> None:
        self._stop.set()
        super().close()
        self.blocks.close()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
