"""Text chunks coded smaller once a writable mount is idle.

A commit codes chunks by COMMIT_POLICY (store/write/policy.py): as `lmz add` does, but without
the trial of zstd's slow level on a chunk that the default level already halves (text, JSON,
source code), which would cost a commit of a tree of text files several times its other work.
The commit names those chunks in the catalog, in its own transaction (fs_text_chunks), and
here (CommittedFile.text_chunks); a mount starts with the ones earlier mounts left. Once no
change was made for IDLE_SECONDS (nor a file read), a thread codes them again as `lmz add` would (the slow level
where it may win), at most BATCH_BYTES of plain bytes at a time, outside the store's lock. Each
new payload is decoded and checked against the chunk's SHA-256 id; then, under the lock, in one
transaction, the chunks whose payloads came out smaller are switched to them (appended and made
durable first), each switch guarded by the location it was read at, and the batch's rows of
fs_text_chunks are deleted: as `lmz rewrite recode` switches payloads (store/rewrite/run.py), so
a kill at any point leaves the old payloads and their rows, or the new ones and none. A chunk
moved meanwhile (by a reclaim, or another process) keeps its row for a later batch; one no
longer stored loses it. The old payloads are dead bytes the mount reclaims (reclaim.py). A
change or a read made while a batch is coded stops it: its chunks wait for the next lull.
"""
from __future__ import annotations

import itertools
import logging
import sqlite3
import threading
import time
from typing import Callable

from lmzfs.codecs.base import ChunkHint
from lmzfs.errors import CorruptChunk
from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.store.catalog import Extent
from lmzfs.store.catalog.chunkrows import RowChange
from lmzfs.store.catalog.fsrows import forget_text_chunks, named_text_chunks
from lmzfs.store.layout import StoreError
from lmzfs.store.rewrite.run import decode_fault, switch_rows
from lmzfs.store.write.policy import EncodePolicy
from lmzfs.store.write.session import PackSession

log = logging.getLogger(__name__)

IDLE_SECONDS = 2.0              # no change for this long: the chunks commits named are coded again
BATCH_BYTES = 4 << 20           # plain bytes coded per batch (one hold of the store's lock)
PENDING_MAX = 1 << 20           # chunk ids remembered at most (the oldest are let go)
LOOK_AT = 4096                  # chunk ids a batch looks up at most
_POLICY = EncodePolicy()        # what `lmz add` would have coded them with


class TextRecoder:
    def __init__(self, sync: CatalogSync, stored: StoredFiles, *, idle_seconds: float = IDLE_SECONDS,
                 last_read: Callable[[], float] = lambda: 0.0):
        """`last_read`: when a file was last read (monotonic): reads, too, keep the recode waiting
        (a mount serving a model is not slowed by it)."""
        self._sync, self._stored = sync, stored
        self._last_read = last_read
        self.idle_seconds = idle_seconds
        with sync.lock:                             # named by commits of earlier mounts too
            self._pending: dict[bytes, None] = dict.fromkeys(named_text_chunks(sync.catalog.db))
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._busy = threading.Lock()              # one batch at a time
        self.recoded = 0                            # chunks switched to a smaller payload
        self.saved = 0                              # payload bytes that saved
        self.after_recode: Callable[[], object] | None = None   # called after a batch switched any

    def add(self, chunk_ids) -> None:
        """Chunks a commit coded without the slow zstd level (CommittedFile.text_chunks)."""
        with self._cv:
            for cid in chunk_ids:
                self._pending[cid] = None
            while len(self._pending) > PENDING_MAX:
                del self._pending[next(iter(self._pending))]
            if self._pending:
                self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._pending)

    # -- one batch -------------------------------------------------------------------------------
    def run_once(self, budget: int = BATCH_BYTES) -> int:
        """Code up to `budget` plain bytes of the named chunks again and switch those that came
        out smaller; how many were switched. A change made meanwhile stops the batch (the chunks
        it did not code wait for the next one)."""
        with self._busy:
            started = self._last_activity()
            with self._cv:
                ids = list(itertools.islice(self._pending, LOOK_AT))
            extents = self._stored.chunk_extents(ids)
            settled = [cid for cid in ids if cid not in extents or extents[cid].base is not None]  # gone, or a delta
            batch, size = [], 0
            for cid in ids:
                e = extents.get(cid)
                if e is None or e.base is not None:
                    continue
                if size >= budget:
                    break
                batch.append(e)
                size += e.size
            coded: list[tuple[Extent, bytes, str]] = []
            for e in batch:
                if self._last_activity() != started or self._stopping:
                    break
                settled.append(e.chunk_id)
                got = self._smaller(e)
                if got is not None:
                    coded.append((e, *got))
            with self._cv:
                for cid in settled:
                    self._pending.pop(cid, None)
            switched = self._settle(settled, coded) if settled else 0
        if switched and self.after_recode is not None:
            self.after_recode()
        return switched

    def _smaller(self, e: Extent) -> tuple[bytes, str] | None:
        """(payload, codec) of the chunk coded as `lmz add` codes it, if smaller than its payload
        now and checked to decode to its bytes; None otherwise (a damaged chunk is logged)."""
        try:
            plain = self._stored.source.chunk_bytes(e)
        except (CorruptChunk, OSError) as exc:
            log.error("recoding chunk %s: %s", e.chunk_id.hex()[:16], exc)
            return None
        got = _POLICY.alone(plain, ChunkHint())
        if len(got.payload) >= e.location.length:
            return None
        fault = decode_fault(got.payload, e)
        if fault is not None:
            log.error("recoding chunk %s: %s %s; it is left as it is", e.chunk_id.hex()[:16], got.codec, fault)
            return None
        return got.payload, got.codec

    def _settle(self, settled: list[bytes], coded: list[tuple[Extent, bytes, str]]) -> int:
        """Under the store's lock, in one transaction: the coded chunks whose rows are as they were
        read switched to their new payloads (appended and made durable first), and the settled
        chunks' fs_text_chunks rows deleted (but for a chunk moved meanwhile: it waits for the
        next batch); how many were switched."""
        try:
            with self._sync.changing(namespace=False):
                catalog = self._sync.catalog
                now = catalog.chunk_extents([e.chunk_id for e, _, _ in coded]) if coded else {}
                still = [(e, p, c) for e, p, c in coded
                         if (n := now.get(e.chunk_id)) is not None and n.location == e.location and n.base is None]
                moved = {e.chunk_id for e, _, _ in coded} - {e.chunk_id for e, _, _ in still}
                done = [cid for cid in settled if cid not in moved]
                changes: list[RowChange] = []
                if still:
                    with PackSession(self._sync.store, catalog) as session:
                        changes = [RowChange(e.chunk_id, e.location, session.append(e.chunk_id, payload), codec)
                                   for e, payload, codec in still]

                        def record(tx: sqlite3.Connection) -> None:
                            switch_rows(tx, changes)
                            forget_text_chunks(tx, done)
                        session.commit(record)
                else:
                    with catalog.transaction() as tx:
                        forget_text_chunks(tx, done)
        except (OSError, StoreError, sqlite3.Error) as exc:
            log.error("recoding %d text chunks: %s; they keep their payloads", len(coded), exc)
            return 0
        if moved:
            self.add(moved)
        self.recoded += len(changes)
        self.saved += sum(e.location.length - c.new.length for (e, _, _), c in zip(still, changes))
        return len(changes)

    # -- in the background -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lmz-recode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
            if not self._wait_idle():
                return
            try:
                self.run_once()
            except Exception:                   # a bug must not stop the mount
                log.exception("recoding text chunks")
                with self._cv:
                    self._cv.wait(self.idle_seconds)

    def _last_activity(self) -> float:
        """When the mount was last used: a change (create, write, rename, metadata) or a read."""
        return max(self._sync.last_change, self._last_read())

    def _wait_idle(self) -> bool:
        """Until no change was made for idle_seconds (True), or stop() (False)."""
        with self._cv:
            while not self._stopping:
                left = self._last_activity() + self.idle_seconds - time.monotonic()
                if left <= 0:
                    return True
                self._cv.wait(left)
            return False

    def stop(self) -> None:
        """No batch starts from now on; one under way stops at its next chunk."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
