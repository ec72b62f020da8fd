"""`lmz gc`: reclaim the bytes of removed models and of adds that never committed.

Live records are copied out of every pack that holds dead bytes into a new pack (new id, never
reused), which is fsync'd before one catalog transaction points the chunks at it; only then are
the old packs unlinked. A killed gc therefore leaves either the old state or the new one, plus
an unreferenced pack that the next gc removes. Readers that still hold an old pack open keep
reading it: the descriptor outlives the unlink.

What is collected: every chunk with no reference (chunks.refs, which counts extents and the
delta chunks coded against it), and, cascading in the same transaction, a reference whose every
dependant is collected with it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths, fsync_dir
from lmzfs.store.lock import WriterLock
from lmzfs.store.packfds import packs_in_use
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER, ChunkLocation, PackDamaged, PackWriter, read_payload

_PACK_NAME = re.compile(r"pack-(\d{8})\.lmzp$")


@dataclass
class GcResult:
    chunks_dropped: int = 0
    packs_rewritten: int = 0
    packs_deleted: int = 0
    packs_truncated: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after


def _packs_on_disk(store: StorePaths) -> dict[int, int]:
    out = {}
    for p in store.packs.iterdir():
        m = _PACK_NAME.match(p.name)
        if m:
            out[int(m.group(1))] = p.stat().st_size
    return out


def collect_garbage(store: StorePaths) -> GcResult:
    store.check_format()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        try:
            return _collect(store, catalog)
        finally:
            catalog.close()


def _dead_chunks(db) -> tuple[set[bytes], dict[bytes, int]]:
    """(the chunks to collect, references each surviving base loses with them): chunks with no
    reference, then each base all of whose references are among them, and so on down the chain."""
    dead = {cid for (cid,) in db.execute("SELECT id FROM chunks WHERE refs <= 0")}
    lost: dict[bytes, int] = {}
    todo = list(dead)
    while todo:
        cid = todo.pop()
        row = db.execute("SELECT c.base, b.refs FROM chunks c JOIN chunks b ON b.id = c.base WHERE c.id = ?",
                         (cid,)).fetchone()
        if row is None or row[0] in dead:
            continue
        base, refs = row
        lost[base] = lost.get(base, 0) + 1
        if refs - lost[base] <= 0:
            dead.add(base)
            todo.append(base)
    return dead, {b: n for b, n in lost.items() if b not in dead}


def _collect(store: StorePaths, catalog: Catalog) -> GcResult:
    result = GcResult()
    on_disk = _packs_on_disk(store)
    result.bytes_before = sum(on_disk.values())
    db = catalog.db
    dead, lost = _dead_chunks(db)
    db.execute("CREATE TEMP TABLE IF NOT EXISTS gc_dead (id BLOB PRIMARY KEY) WITHOUT ROWID")
    db.execute("DELETE FROM gc_dead")
    db.executemany("INSERT INTO gc_dead VALUES (?)", [(cid,) for cid in dead])
    live = {pid: (n, used, end) for pid, n, used, end in db.execute(
        "SELECT pack, COUNT(*), SUM(length), MAX(offset + length) FROM chunks "
        "WHERE id NOT IN (SELECT id FROM gc_dead) GROUP BY pack")}
    result.chunks_dropped = len(dead)
    # Three remedies, cheapest first. A pack whose live records lie back to back from its header
    # has garbage only at its tail (an add that failed or was killed, dropped chunks appended
    # last): it is truncated in place, which works even on a full disk, unless a reader has the
    # packs open (it may still read the tail: packfds.py). A pack with no live record is
    # deleted. Any other pack has garbage between its live records (dropped chunks, the old
    # payloads of recoded chunks, an interrupted add that a later one appended after) and is
    # rewritten into a new pack.
    truncate: dict[int, int] = {}
    delete: list[int] = []
    rewrite: list[int] = []
    in_use = packs_in_use(store)
    for pid, size in sorted(on_disk.items()):
        n, used, end = live.get(pid, (0, 0, 0))
        if n == 0:
            delete.append(pid)
        elif end == len(PACK_HEADER) + n * RECORD_HEADER.size + used:
            if size > end and in_use:
                rewrite.append(pid)
            elif size > end:
                truncate[pid] = end
        else:
            rewrite.append(pid)
    if not (truncate or delete or rewrite or result.chunks_dropped):
        result.bytes_after = result.bytes_before
        return result

    last, next_new = catalog.pack_ids()
    writer: PackWriter | None = None
    moves: list[tuple[int, int, int, bytes]] = []
    try:
        for pid in rewrite:
            rows = db.execute("SELECT id, offset, length FROM chunks WHERE pack = ? AND id NOT IN "
                              "(SELECT id FROM gc_dead) ORDER BY offset", (pid,)).fetchall()
            fd = os.open(store.pack(pid), os.O_RDONLY)
            try:
                for cid, off, length in rows:
                    try:
                        payload = read_payload(fd, cid, ChunkLocation(pid, off, length))
                    except PackDamaged as exc:
                        raise StoreError(f"gc stopped, nothing changed: {exc}; run `lmz verify`") from exc
                    if writer is None:
                        writer = PackWriter(store, None, max(next_new, max(on_disk) + 1))
                    loc = writer.append(cid, payload)
                    moves.append((loc.pack, loc.offset, loc.length, cid))
            finally:
                os.close(fd)
        if writer is not None:
            writer.sync()
        def record(tx) -> None:
            tx.executemany("UPDATE chunks SET pack = ?, offset = ?, length = ? WHERE id = ?", moves)
            tx.execute("DELETE FROM chunks WHERE id IN (SELECT id FROM gc_dead)")
            tx.executemany("UPDATE chunks SET refs = refs - ? WHERE id = ?", [(n, b) for b, n in lost.items()])
            if writer is not None:
                Catalog.record_pack_ids(tx, writer.pack_id, max(writer.touched))
            elif last in delete or last in rewrite:
                Catalog.record_pack_ids(tx, None, 0)
        catalog.write_or_free_copies(record)
    finally:
        if writer is not None:
            writer.close()
    # The catalog no longer points into any of these bytes.
    for pid, end in truncate.items():
        fd = os.open(store.pack(pid), os.O_RDWR)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
    for pid in delete + rewrite:
        os.unlink(store.pack(pid))
    fsync_dir(store.packs)
    result.packs_deleted = len(delete) + len(rewrite)
    result.packs_truncated = len(truncate)
    result.packs_rewritten = len(writer.touched) if writer is not None else 0
    result.bytes_after = sum(_packs_on_disk(store).values())
    return result
