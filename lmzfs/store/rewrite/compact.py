"""`lmz rewrite compact`: repack the live chunks of every pack with enough dead bytes into new
packs, drop the rows of chunks nothing uses (as `lmz gc` does), and delete the packs left empty.

Where gc copies a pack only when it must (a pack in use whose garbage is not at its tail; it
truncates or deletes otherwise), compact rewrites every pack whose dead share is above a
threshold (or every pack, with --all), in the order the store's files use their chunks, so that
a file's chunks lie together in few packs. Payloads are copied as they are: nothing is decoded.

Atomic as every pass (rewrite.py): the copies are fsync'd, one transaction moves the rows and
drops the dead ones, and only then are the old packs unlinked; a reader that holds one keeps its
descriptor, which outlives the unlink. Killed before the commit, the new packs hold nothing the
catalog names; after it, the old packs do not: either way the next compact deletes them.
"""
from __future__ import annotations

import time

from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.chunkrows import (ChunkMove, add_refs, chunk_locations, delete_chunks,
                                          move_payload)
from lmzfs.store.catalog.modelrows import chunks_in_file_order
# gc's own rule for what is garbage (cascading down chains), so that compact and gc agree on it
from lmzfs.store.gc import dead_chunks, set_aside_guard
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.packbackend import LocalPacks
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER, ChunkLocation
from lmzfs.store.rewrite.run import Progress, RewriteResult, measure, packs_on_disk, writing
from lmzfs.store.write.session import PackSession

DEFAULT_MIN_DEAD = 0.10     # rewrite a pack once more than this share of its bytes is dead
UNLINK_GRACE_SECONDS = 1.0  # between the commit and unlinking old packs, while readers have packs open


def _locality_order(db, wanted: dict[bytes, ChunkLocation]) -> list[bytes]:
    """The wanted chunks in the order the store's files first use them (model, path, offset);
    the rest (references only) after, in their pack order."""
    order: list[bytes] = []
    seen: set[bytes] = set()
    for cid in chunks_in_file_order(db):
        if cid in wanted and cid not in seen:
            seen.add(cid)
            order.append(cid)
    rest = sorted((cid for cid in wanted if cid not in seen), key=lambda c: (wanted[c].pack, wanted[c].offset))
    return order + rest


def compact_store(store: StorePaths, *, min_dead: float = DEFAULT_MIN_DEAD, everything: bool = False,
                  progress: Progress | None = None) -> RewriteResult:
    """Rewrite every pack whose dead bytes are more than `min_dead` of it (every pack with
    `everything`); delete packs nothing lives in; drop the rows of unused chunks."""
    if not 0.0 <= min_dead < 1.0:
        raise StoreError(f"the dead share of a pack to rewrite must be at least 0% and below 100% "
                         f"(not {100 * min_dead:g}%)")
    started = time.monotonic()
    with writing(store) as catalog:
        result = RewriteResult("compact", measure(store, catalog), measure(store, catalog))
        _compact(store, catalog, min_dead, everything, progress, result)
        result.after = measure(store, catalog)
    result.seconds = time.monotonic() - started
    return result


def _compact(store: StorePaths, catalog: Catalog, min_dead: float, everything: bool,
             progress: Progress | None, result: RewriteResult) -> None:
    db = catalog.db
    on_disk = packs_on_disk(store)
    dead, lost = dead_chunks(db)
    guard = set_aside_guard(store, db, dead)
    if guard is not None:       # what a set-aside damaged catalog names stays, as gc keeps it
        dead, lost = dead_chunks(db, keep=guard.chunks)
        on_disk = {pid: size for pid, size in on_disk.items() if not guard.keeps(pid)}
        result.notes.append(f"left {'every pack' if guard.everything else f'{len(guard.packs)} pack(s)'} as they "
                            f"are: {', '.join(f.name for f in guard.files)} still names records in them "
                            f"(`lmz gc --forget-set-aside` lets them go)")
    rows = {cid: loc for cid, loc in chunk_locations(db).items() if cid not in dead}
    live_bytes: dict[int, int] = {}
    for loc in rows.values():
        live_bytes[loc.pack] = live_bytes.get(loc.pack, len(PACK_HEADER)) + RECORD_HEADER.size + loc.length
    delete = sorted(pid for pid in on_disk if pid not in live_bytes)
    rewrite = sorted(pid for pid, size in on_disk.items() if pid in live_bytes and
                     (everything or size - live_bytes[pid] > min_dead * size))
    result.chunks_examined = len(rows)
    if not (delete or rewrite or dead):
        return
    copied = set(rewrite)
    moving = {cid: loc for cid, loc in rows.items() if loc.pack in copied}
    need = sum(live_bytes[pid] for pid in rewrite)
    free = LocalPacks(store).free_bytes()
    if need > free:
        raise StoreError(f"compact needs {need} bytes free for the live chunks it copies, and "
                         f"{free} are; nothing changed (free some space, or raise --min-dead)")
    last, _ = catalog.pack_ids()
    changes: list[ChunkMove] = []
    total = sum(rows[cid].length for cid in moving)
    done = 0
    with PackSession(store, catalog, fresh_packs=True) as session:
        order = _locality_order(db, moving)
        for cid, new in zip(order, session.copy_records(((cid, rows[cid]) for cid in order), "compact")):
            changes.append(ChunkMove(cid, rows[cid], new))
            done += rows[cid].length
            if progress:
                progress(done, total)

        def record(tx) -> None:
            _move_rows(tx, changes)
            delete_chunks(tx, dead)
            add_refs(tx, {b: -n for b, n in lost.items()})
            if not session.appended and (last in delete or last in rewrite):
                Catalog.record_pack_ids(tx, None, 0)
        session.commit(record)
    # The committed catalog names nothing in these packs any more. A reader that read a file's
    # extents just before the commit opens their packs a moment later: with readers about, give
    # it that moment (after it, its descriptors keep the unlinked packs readable).
    if (delete or rewrite) and session.backend.in_use():
        time.sleep(UNLINK_GRACE_SECONDS)
    for pid in delete + rewrite:
        session.backend.remove(pid)
    session.backend.sync_listing()
    result.chunks_changed = len(changes)
    result.chunks_dropped = len(dead)
    result.packs_written = len(session.packs_written)
    result.packs_deleted = len(delete) + len(rewrite)


def _move_rows(tx, changes: list[ChunkMove]) -> None:
    """A moved payload keeps its codec: only the location changes."""
    for c in changes:
        if not move_payload(tx, c):
            raise StoreError(f"compact stopped and nothing changed: chunk {c.chunk_id.hex()[:16]} is no longer "
                             f"where it was read; run `lmz verify`")
