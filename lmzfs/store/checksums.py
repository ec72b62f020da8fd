"""`lmz verify --record-checksums`: give the chunks stored before lmzfs kept read checksums
(catalog version 1) their XXH3-128, so that reads stop paying for SHA-256.

Each checksum is computed from plain bytes that were first checked against the chunk's SHA-256
id, so a checksum is never recorded for damaged bytes. It runs under the writer lock (an add
waits) and commits every few hundred chunks: a killed run keeps what it recorded, and the next
run goes on from there. Mounts pick the checksums up for files they open afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import xxhash

from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.chunkrows import fill_checksums, unchecked_chunks
from lmzfs.store.read.chunkread import read_chunk
from lmzfs.store.layout import StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.read.packfds import PackDescriptors

BATCH = 256       # chunks per catalog transaction


@dataclass
class ChecksumReport:
    recorded: int = 0
    bytes: int = 0
    damaged: list[str] = field(default_factory=list)    # "chunk <id prefix>: reason"


def record_checksums(store: StorePaths, progress: Callable[[int, int], None] | None = None) -> ChecksumReport:
    store.check_format()
    report = ChecksumReport()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)        # a version 1 catalog is upgraded here
        packs = PackDescriptors(store)
        fds: dict[int, int] = {}
        try:
            extents = unchecked_chunks(catalog.db)
            total = sum(e.size for e in extents)
            pending: dict[bytes, bytes] = {}        # chunk id -> its XXH3-128
            for extent in extents:
                cid, size, pack = extent.chunk_id, extent.size, extent.location.pack
                try:
                    if pack not in fds:
                        fds.update(packs.acquire({pack}))
                    plain = read_chunk(fds[pack], extent, check_id=True)
                except CorruptChunk as exc:
                    report.damaged.append(f"chunk {cid.hex()[:16]}: {exc.strerror}")
                    continue
                pending[cid] = xxhash.xxh3_128_digest(plain)
                report.bytes += size
                if len(pending) >= BATCH:
                    report.recorded += _commit(catalog, pending)
                if progress:
                    progress(report.bytes, total)
            report.recorded += _commit(catalog, pending)
        finally:
            packs.close()
            catalog.close()
    return report


def _commit(catalog: Catalog, pending: dict[bytes, bytes]) -> int:
    with catalog.transaction() as db:
        fill_checksums(db, pending)
    n = len(pending)
    pending.clear()
    return n
