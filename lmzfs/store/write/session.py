"""The one way anything is written to a store's packs: a pack session.

`lmz add`, a writable mount's commit, every rewrite pass, the chain recoder and gc all append
through a PackSession, which owns the pack appender, the worker pool and the encode window, the
encode policy, and the order of durability every writer keeps:

    append (any number of records) -> seal (fsync) -> ONE catalog transaction -> done
                                   \\-> on any failure before the commit: cut what was appended

A process killed before the commit leaves only bytes no catalog names, which `lmz gc` reclaims; a
write that fails (a full disk, a file changed under an add, Ctrl-C) leaves the packs as it found
them. The caller holds the store's WriterLock and the catalog open for writing.

    with PackSession(store, catalog) as session:
        loc = session.append(chunk_id, payload)
        session.commit(lambda tx: ...)       # the rows that name what was appended
"""
from __future__ import annotations

import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, TypeVar

from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.packbackend import LocalPacks, PackAppender
from lmzfs.store.packs import ChunkLocation, PackDamaged, read_payload
from lmzfs.store.write.policy import EncodePolicy
from lmzfs.killpoints import reached
from lmzfs.workpool import OrderedWindow, default_workers, window_limit, worker_pool

T = TypeVar("T")


class PackSession:
    """One writer's packs, pool and commit. `fresh_packs`: append only to packs made by this
    session, with ids above every pack on disk (gc and compact, which copy records out of the
    packs they then delete); else continue the pack the last commit appended to."""

    def __init__(self, store: StorePaths, catalog: Catalog, *, policy: EncodePolicy = EncodePolicy(),
                 workers: int | None = None, pool: ThreadPoolExecutor | None = None, fresh_packs: bool = False,
                 name: str = "lmz-encode"):
        self.store = store
        self.catalog = catalog
        self.policy = policy
        self.backend = LocalPacks(store)
        self.workers = workers or default_workers()
        self.committed = False
        self._pool = pool
        self._own_pool = pool is None
        self._pool_name = name
        self._fresh = fresh_packs
        self._appender: PackAppender | None = None

    # -- encoding ---------------------------------------------------------------------------
    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = worker_pool(self.workers, self._pool_name)
        return self._pool

    @property
    def limit(self) -> int:
        """Jobs a window keeps in flight."""
        return window_limit(self.workers)

    def window(self, land: Callable[[Any, T], None]) -> OrderedWindow[T]:
        """A window of jobs on this session's pool, landed in order on the caller's thread."""
        return OrderedWindow(self.pool, self.limit, land)

    # -- appending --------------------------------------------------------------------------
    def append(self, chunk_id: bytes, payload: bytes | memoryview) -> ChunkLocation:
        """Append one record; the catalog names it only once `commit` has run."""
        if self._appender is None:
            last, next_new = self.catalog.pack_ids()
            if self._fresh:
                self._appender = self.backend.appender(None, max([next_new, *(p + 1 for p in self.backend.list_packs())]))
            else:
                self._appender = self.backend.appender(last, next_new)
        return self._appender.append(chunk_id, payload)

    def copy_records(self, chunks: Iterable[tuple[bytes, ChunkLocation]], what: str) -> Iterator[ChunkLocation]:
        """Append each chunk's payload as it lies in its pack now (checked against its record
        header, never decoded): the new locations, in order. A damaged record stops the copy
        (`what` names the operation in the message) with nothing committed."""
        fds: dict[int, int] = {}
        try:
            for cid, old in chunks:
                fd = fds.get(old.pack)
                if fd is None:
                    fd = fds[old.pack] = self.backend.open_read(old.pack)
                try:
                    payload = read_payload(fd, cid, old)
                except PackDamaged as exc:
                    raise StoreError(f"{what} stopped and nothing changed: {exc}; run `lmz verify`") from exc
                yield self.append(cid, payload)
        finally:
            for fd in fds.values():
                os.close(fd)

    @property
    def packs_written(self) -> list[int]:
        """The packs this session appended to (or made), in order."""
        return list(self._appender.touched) if self._appender is not None else []

    @property
    def appended(self) -> bool:
        return self._appender is not None

    # -- committing -------------------------------------------------------------------------
    def commit(self, record: Callable[[sqlite3.Connection], T], *, free_copies: bool = False) -> T:
        """Make every appended record durable, then run `record` in one catalog transaction (which
        also remembers the pack to continue and the pack id high-water mark). `free_copies`: on a
        full disk, drop the catalog's copies and try once more (gc, which must commit to free)."""
        if self._appender is not None:
            self._appender.seal()
        reached("session-sealed")
        out: list[T] = []

        def body(tx: sqlite3.Connection) -> None:
            out.append(record(tx))
            if self._appender is not None:
                Catalog.record_pack_ids(tx, self._appender.pack_id, max(self._appender.touched))
            reached("session-commit")

        if free_copies:
            self.catalog.write_or_free_copies(body)
        else:
            with self.catalog.transaction() as tx:
                body(tx)
        self.committed = True
        reached("session-committed")
        return out[0]

    def close(self, failed: bool = False) -> None:
        """Close the appender (cutting what it appended if `failed` before a commit) and the pool
        this session made."""
        try:
            if self._appender is not None:
                if failed and not self.committed:
                    # nothing of this write was committed: what it appended goes, so that a failed
                    # write (a full disk above all) leaves the store's disk use as it found it
                    self._appender.discard(self.catalog.payload_end)
                self._appender.close()
        finally:
            if self._own_pool and self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def __enter__(self) -> "PackSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
