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
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.read.chunkread import read_chunk
from lmzfs.store.layout import StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.read.packfds import PackDescriptors
from lmzfs.store.packs import ChunkLocation

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
            rows = catalog.db.execute("SELECT id, size, codec, pack, offset, length FROM chunks "
                                      "WHERE xxh3 IS NULL AND refs > 0 ORDER BY pack, offset").fetchall()
            total = sum(r[1] for r in rows)
            pending: list[tuple[bytes, bytes]] = []
            for cid, size, codec, pack, offset, length in rows:
                extent = Extent(0, size, cid, codec, ChunkLocation(pack, offset, length))
                try:
                    if pack not in fds:
                        fds.update(packs.acquire({pack}))
                    plain = read_chunk(fds[pack], extent, check_id=True)
                except CorruptChunk as exc:
                    report.damaged.append(f"chunk {cid.hex()[:16]}: {exc.strerror}")
                    continue
                pending.append((xxhash.xxh3_128_digest(plain), cid))
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


def _commit(catalog: Catalog, pending: list[tuple[bytes, bytes]]) -> int:
    with catalog.transaction() as db:
        db.executemany("UPDATE chunks SET xxh3 = ? WHERE id = ? AND xxh3 IS NULL", pending)
    n = len(pending)
    pending.clear()
    return n
