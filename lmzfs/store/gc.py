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

from dataclasses import dataclass

from lmzfs.store.catalog import Catalog, chunkrows, salvage
from lmzfs.store.catalog.check import index_packs
from lmzfs.store.catalog.chunkrows import ChunkMove, PackUse
from lmzfs.store.layout import StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.packbackend import LocalPacks
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER
from lmzfs.store.write.session import PackSession


@dataclass
class GcResult:
    chunks_dropped: int = 0     # catalog rows of chunks no file referenced any more
    packs_rewritten: int = 0    # packs whose live records were copied into new packs
    packs_deleted: int = 0      # packs holding no live record
    packs_truncated: int = 0    # packs whose dead records all lay at their end
    bytes_before: int = 0       # the packs' bytes on disk before the run
    bytes_after: int = 0        # ... and after it
    left_for_gc: int = 0        # reclaim_packs: dead bytes left because a reader had the packs open
    set_aside: tuple[str, ...] = ()   # damaged catalogs set aside by repair, whose chunks were kept
    packs_kept: int = 0         # packs left as they are because a set-aside catalog names records in them

    @property
    def reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after


def collect_garbage(store: StorePaths, *, forget_set_aside: bool = False) -> GcResult:
    """`forget_set_aside`: first remove the damaged catalogs `lmz verify --repair` set aside, so
    that what only they name is reclaimed too."""
    store.check_format()
    with WriterLock(store.lock):
        if forget_set_aside:
            salvage.forget_set_aside(store.catalog)
        catalog = Catalog(store.catalog)
        try:
            return _collect(store, catalog)
        finally:
            catalog.close()


def set_aside_guard(store: StorePaths, db, dead: set[bytes]) -> salvage.SetAsideGuard | None:
    """What the set-aside damaged catalogs beside the store's still name, that gc (and compact)
    must keep: their chunks among `dead`, and every pack holding a record of a chunk the live
    catalog does not keep (None: no catalog is set aside)."""
    if not salvage.set_aside_files(store.catalog):
        return None
    live = set(chunkrows.chunk_locations(db)) - dead
    return salvage.set_aside_guard(store.catalog, index_packs(store).records, live)


def dead_chunks(db, keep: frozenset[bytes] = frozenset()) -> tuple[set[bytes], dict[bytes, int]]:
    """(the chunks to collect, references each surviving base loses with them): chunks with no
    reference, then each base all of whose references are among them, and so on down the chain;
    none of `keep` (a base a kept chunk is coded against is then kept too)."""
    dead = chunkrows.unreferenced(db) - keep
    lost: dict[bytes, int] = {}
    todo = list(dead)
    while todo:
        cid = todo.pop()
        row = chunkrows.base_refs(db, cid)
        if row is None or row.base in dead:
            continue
        base, refs = row.base, row.refs
        lost[base] = lost.get(base, 0) + 1
        if refs - lost[base] <= 0 and base not in keep:
            dead.add(base)
            todo.append(base)
    return dead, {b: n for b, n in lost.items() if b not in dead}


@dataclass
class _Marked:
    """What marking the dead chunks found: the packs gc may act on, what stays live in each, and
    the set-aside catalogs' guard (None: none)."""
    on_disk: dict[int, int]
    live: dict
    dead: set
    lost: dict
    guard: object


def _mark(store: StorePaths, catalog: Catalog) -> _Marked:
    """Mark every chunk nothing references as dead (inside the caller's transaction)."""
    on_disk = LocalPacks(store).list_packs()
    db = catalog.db
    dead, lost = dead_chunks(db)
    guard = set_aside_guard(store, db, dead)
    if guard is not None:
        # a chunk a set-aside catalog names stays, row and record, with what it references
        dead, lost = dead_chunks(db, keep=guard.chunks)
        on_disk = {pid: size for pid, size in on_disk.items() if not guard.keeps(pid)}
    chunkrows.mark_dead(db, dead)
    return _Marked(on_disk, _live(chunkrows.unmarked_pack_use(db)), dead, lost, guard)


def _collect(store: StorePaths, catalog: Catalog) -> GcResult:
    m = _mark(store, catalog)
    on_disk, live, dead, lost, guard = m.on_disk, m.live, m.dead, m.lost, m.guard
    result = _remedy(store, catalog, on_disk, live, len(dead), lost, LocalPacks(store).in_use())
    if guard is not None:
        result.set_aside = tuple(f.name for f in guard.files)
        result.packs_kept = len(LocalPacks(store).list_packs()) if guard.everything else len(guard.packs)
    return result


def reclaim_dead(store: StorePaths, catalog: Catalog, *, pack_dead_fraction: float,
                 max_copy_bytes: int) -> GcResult:
    """`lmz gc` from inside a writer that holds the store's WriterLock and `catalog` open for
    writing, and keeps packs open (a writable mount, between its commits): every chunk nothing
    references is dropped, and the packs at least `pack_dead_fraction` dead, most dead first,
    are rewritten or deleted, their live records copied (at most `max_copy_bytes` of them, but
    always one pack's). The dead records of the packs left are reclaimed when they qualify.

    A pack is never cut in place (this process's readers may hold it: an open file unlinked
    still reads its dropped chunks through the pack descriptors it holds, which outlive the
    unlink). Crash-safe as gc is."""
    m = _mark(store, catalog)
    on_disk, live, dead, lost = m.on_disk, m.live, m.dead, m.lost
    chosen: dict[int, int] = {}
    copied = 0
    by_dead = sorted(on_disk.items(), key=lambda item: live.get(item[0], _Live()).bytes / max(item[1], 1))
    for pid, size in by_dead:
        kept = live.get(pid, _Live()).bytes
        if size - kept < pack_dead_fraction * size or (chosen and copied + kept > max_copy_bytes):
            break
        chosen[pid] = size
        copied += kept
    return _remedy(store, catalog, chosen, live, len(dead), lost, True)


def reclaim_packs(store: StorePaths, catalog: Catalog, pack_ids: set[int]) -> GcResult:
    """Drop the dead bytes of just these packs (old payloads of recoded chunks, say) with gc's
    remedies, for a writer that holds the store's WriterLock and `catalog` open for writing and
    has committed: `lmz add` after it recoded a base, and the rewrite passes.

    The cost is that of the packs named: their live records are copied (or the pack is cut or
    deleted), nothing else in the store is read. Chunks with no reference are not collected
    (that is `lmz gc`'s). While a reader has the packs open (LocalPacks.in_use) nothing is done, since
    an unlinked pack keeps its space until the reader lets go: the result's `left_for_gc` says how
    many bytes `lmz gc` will reclaim. Crash-safe as gc is: a kill at any point leaves the state
    before or after, plus a pack no catalog names, which the next gc removes."""
    on_disk = {pid: size for pid, size in LocalPacks(store).list_packs().items() if pid in pack_ids}
    result = GcResult(bytes_before=sum(on_disk.values()), bytes_after=sum(on_disk.values()))
    if not on_disk:
        return result
    db = catalog.db
    live = _live(chunkrows.pack_use(db, on_disk))
    if LocalPacks(store).in_use():
        result.left_for_gc = sum(max(0, size - live.get(pid, _Live()).bytes) for pid, size in on_disk.items())
        return result
    chunkrows.mark_dead(db, set())
    return _remedy(store, catalog, on_disk, live, 0, {}, False)


@dataclass(frozen=True)
class _Live:
    """A pack's live records: how many, their payload bytes, where the last one ends."""
    n: int = 0
    used: int = 0
    end: int = 0

    @property
    def bytes(self) -> int:
        """What the pack would hold with no garbage."""
        return len(PACK_HEADER) + self.n * RECORD_HEADER.size + self.used if self.n else 0


def _live(use: dict[int, PackUse]) -> dict[int, _Live]:
    return {pid: _Live(u.chunks, u.payload, u.end) for pid, u in use.items()}


def _remedy(store: StorePaths, catalog: Catalog, on_disk: dict[int, int], live: dict[int, _Live], dropped: int,
            lost: dict[bytes, int], in_use: bool) -> GcResult:
    """Cut, delete or rewrite each pack of `on_disk` (id -> size) so that it holds only its live
    records (`live`; the chunks chunkrows.mark_dead marked are dropped), in one transaction."""
    db = catalog.db
    result = GcResult(chunks_dropped=dropped, bytes_before=sum(on_disk.values()))
    # Three remedies, cheapest first. A pack whose live records lie back to back from its header
    # has garbage only at its tail (an add that failed or was killed, dropped chunks appended
    # last): it is truncated in place, which works even on a full disk, unless a reader has the
    # packs open (it may still read the tail: read/packfds.py). A pack with no live record is
    # deleted. Any other pack has garbage between its live records (dropped chunks, the old
    # payloads of recoded chunks, an interrupted add that a later one appended after) and is
    # rewritten into a new pack.
    truncate: dict[int, int] = {}
    delete: list[int] = []
    rewrite: list[int] = []
    for pid, size in sorted(on_disk.items()):
        pack = live.get(pid, _Live())
        if pack.n == 0:
            delete.append(pid)
        elif pack.end == pack.bytes:
            if size > pack.end and in_use:
                rewrite.append(pid)
            elif size > pack.end:
                truncate[pid] = pack.end
        else:
            rewrite.append(pid)
    if not (truncate or delete or rewrite or result.chunks_dropped):
        result.bytes_after = result.bytes_before
        return result

    last, _ = catalog.pack_ids()
    moves: list[ChunkMove] = []
    with PackSession(store, catalog, fresh_packs=True) as session:
        for pid in rewrite:
            rows = list(chunkrows.unmarked_in_pack(db, pid).items())
            for (cid, old), loc in zip(rows, session.copy_records(rows, "gc")):
                moves.append(ChunkMove(cid, old, loc))

        def record(tx) -> None:
            chunkrows.relocate(tx, moves)
            chunkrows.delete_marked(tx)
            chunkrows.add_refs(tx, {b: -n for b, n in lost.items()})
            if not session.appended and (last in delete or last in rewrite):
                Catalog.record_pack_ids(tx, None, 0)
        # Bytes no catalog row names (what a killed add appended) go without a transaction: on a
        # full disk a commit may find no room for its log, and these frees are what makes room.
        if moves or result.chunks_dropped or lost or last in delete or last in rewrite:
            session.commit(record, free_copies=True)
    backend = session.backend
    # The catalog no longer points into any of these bytes.
    for pid, end in truncate.items():
        backend.truncate(pid, end)
    for pid in delete + rewrite:
        backend.remove(pid)
    backend.sync_listing()
    result.packs_deleted = len(delete) + len(rewrite)
    result.packs_truncated = len(truncate)
    written = session.packs_written
    result.packs_rewritten = len(written)
    result.bytes_after = sum(size for pid, size in backend.list_packs().items() if pid in on_disk or pid in written)
    return result
