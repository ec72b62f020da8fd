"""Space comes back while a writable mount runs: each commit of a changed file stores its new
chunks, and the chunks of the version it replaced lose their references; `lmz gc` would reclaim
them, but a file rewritten again and again would otherwise fill the disk before anyone runs it.

After commits (the mount's, or another process's: `lmz rm`), at most every few seconds, and
after a commit once the mount's commits appended half the floor since the last look, the mount
compares the packs' bytes on disk with the payload bytes of the chunks something references
(through its read-only catalog connection, holding no lock). Once the dead bytes pass both a
floor and a fraction of the packs' bytes, it runs gc's remedies itself (store/gc.py,
reclaim_dead) under the store's lock, as one change: chunks nothing references are dropped and
the packs that are mostly dead are rewritten through a pack session, their live records copied,
the old packs unlinked. Open files keep reading: their pack descriptors outlive the unlink, and
no pack is cut in place.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time

from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.store.gc import GcResult, reclaim_dead
from lmzfs.store.layout import StoreError
from lmzfs.store.packbackend import LocalPacks
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER

log = logging.getLogger(__name__)

RECLAIM_FLOOR = 256 << 10           # dead bytes below this are left for later (or `lmz gc`)
RECLAIM_FRACTION = 0.2              # ... and below this fraction of the packs' bytes
PACK_DEAD_FRACTION = 1 / 3          # a pack is rewritten once this much of it is dead
LOOK_AFTER_APPENDED = 16 << 20      # commits that appended this much bring the next look forward
MAX_COPY_BYTES = 256 << 20          # live bytes one run copies at most (beyond its first pack)
CHECK_SECONDS = 2.0                 # the dead bytes are counted at most this often


class Reclaimer:
    def __init__(self, sync: CatalogSync, stored: StoredFiles, *, floor: int = RECLAIM_FLOOR,
                 fraction: float = RECLAIM_FRACTION):
        self._sync, self._stored = sync, stored
        self.floor, self.fraction = floor, fraction
        self._seen: tuple[int, int] | None = None
        self._checked = 0.0
        self._left = 0                  # dead bytes the last run could not reclaim
        self._appended = 0              # what the mount's commits had appended at the last look
        self._running = threading.Lock()  # one look at a time (the daemon's tick, a release's commit)

    def dead_bytes(self) -> tuple[int, int]:
        """(bytes of the packs on disk, of those what no referenced chunk holds)."""
        packs = LocalPacks(self._sync.store).list_packs()
        on_disk = sum(packs.values())
        chunks, payload = self._stored.referenced_payload()
        return on_disk, max(0, on_disk - payload - chunks * RECORD_HEADER.size - len(packs) * len(PACK_HEADER))

    def maybe_reclaim(self, commits: int, appended: int) -> GcResult | None:
        """Reclaim dead pack bytes if there are enough of them; `commits`, `appended`: the mount's
        commits so far and the payload bytes they appended (nothing changed since the last look:
        nothing to do). Logs what it did or why it failed."""
        if not self._running.acquire(blocking=False):
            return None
        try:
            return self._maybe_reclaim(commits, appended)
        finally:
            self._running.release()

    def _maybe_reclaim(self, commits: int, appended: int) -> GcResult | None:
        seen = (commits, self._sync.seen_version)
        now = time.monotonic()
        grown = appended - self._appended >= LOOK_AFTER_APPENDED
        if seen == self._seen or (now - self._checked < CHECK_SECONDS and not grown) or self._sync.closed:
            return None
        self._checked, self._seen, self._appended = now, seen, appended
        try:
            if not self._due():
                return None
            with self._sync.changing():
                if not self._due():                     # what another writer did meanwhile counts
                    return None
                dead = self.dead_bytes()[1]
                result = reclaim_dead(self._sync.store, self._sync.catalog, pack_dead_fraction=PACK_DEAD_FRACTION,
                                      max_copy_bytes=MAX_COPY_BYTES)
                self._left = self.dead_bytes()[1]
        except (OSError, StoreError, sqlite3.Error) as exc:
            log.error("reclaiming dead pack bytes: %s", exc)
            return None
        log.info("reclaimed %d of %d dead pack bytes (%d chunks dropped, %d packs rewritten, %d removed)",
                 dead - self._left, dead, result.chunks_dropped, result.packs_rewritten, result.packs_deleted)
        return result

    def _due(self) -> bool:
        on_disk, dead = self.dead_bytes()
        self._left = min(self._left, dead)              # `lmz gc` may have run meanwhile
        return dead - self._left >= max(self.floor, self.fraction * on_disk)
