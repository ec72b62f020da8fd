"""Chunk rows: the chunks a write appended, their moves to new payloads, their reference counts
(chunks.refs) and read checksums, and what gc and compact drop.

Each function runs its statements on the connection it is given: a write transaction's (`with
catalog.transaction() as tx`) or, for a read, the catalog's own (`catalog.db`). SQLite's errors
pass through as they are. What to write, in what order, and what a refused row means is the
caller's: a guarded UPDATE returns whether it changed the one row it names.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from lmzfs.store.catalog.db import Extent
from lmzfs.store.packs import ChunkLocation


@dataclass
class NewChunk:
    """A chunk a write appended, for its row (inserted with no reference: extents add them)."""
    chunk_id: bytes
    size: int
    codec: str
    pack: int
    offset: int
    length: int
    xxh3: bytes           # XXH3-128 of the plain bytes: what reads check
    base: bytes | None = None   # the chunk of this session it is coded against (write/siblings.py)


@dataclass(frozen=True)
class Recode:
    """A chunk's new payload: where it lies, its codec and its base (None: coded alone)."""
    chunk_id: bytes
    codec: str
    pack: int
    offset: int
    length: int
    base: bytes | None


@dataclass(frozen=True)
class ChunkMove:
    """A payload copied as it is to a new place: only the location changes."""
    chunk_id: bytes
    old: ChunkLocation
    new: ChunkLocation


@dataclass(frozen=True)
class RowChange(ChunkMove):
    """A chunk's switch from the payload a pass read to its new one, coded anew."""
    codec: str
    old_base: bytes | None = None       # the reference it was coded against
    new_base: bytes | None = None       # the one it is coded against now


@dataclass(frozen=True)
class PackUse:
    """The chunk rows of one pack: how many, their payload bytes, where the last one ends."""
    pack: int
    chunks: int
    payload: int
    end: int


@dataclass(frozen=True)
class BaseRefs:
    """A chunk's base and the references the base has."""
    base: bytes
    refs: int


# -- new chunks, references and checksums -----------------------------------------------------
def insert_chunks(tx: sqlite3.Connection, chunks: Iterable[NewChunk]) -> None:
    """Rows for appended chunks, with no reference yet."""
    tx.executemany("INSERT INTO chunks (id, size, codec, pack, offset, length, refs, xxh3, base) "
                   "VALUES (?,?,?,?,?,?,0,?,?)",
                   [(c.chunk_id, c.size, c.codec, c.pack, c.offset, c.length, c.xxh3, c.base) for c in chunks])


def add_refs(tx: sqlite3.Connection, refs: Mapping[bytes, int]) -> None:
    """Add to each chunk's reference count (a negative number takes away); zeros are skipped."""
    tx.executemany("UPDATE chunks SET refs = refs + ? WHERE id = ?", [(n, cid) for cid, n in refs.items() if n])


def add_ref(tx: sqlite3.Connection, chunk_id: bytes, step: int) -> bool:
    """Add `step` to one chunk's reference count; False if no such chunk."""
    return tx.execute("UPDATE chunks SET refs = refs + ? WHERE id = ?", (step, chunk_id)).rowcount == 1


def fill_checksums(tx: sqlite3.Connection, checks: Mapping[bytes, bytes]) -> None:
    """Record chunk id -> XXH3-128 for the chunks stored without one (others keep theirs)."""
    tx.executemany("UPDATE chunks SET xxh3 = ? WHERE id = ? AND xxh3 IS NULL",
                   [(check, cid) for cid, check in checks.items()])


def unchecked_chunks(db: sqlite3.Connection) -> list[Extent]:
    """The referenced chunks stored without a read checksum (offset 0, no base), in pack order."""
    return [Extent(0, size, cid, codec, ChunkLocation(pack, offset, length))
            for cid, size, codec, pack, offset, length in db.execute(
                "SELECT id, size, codec, pack, offset, length FROM chunks "
                "WHERE xxh3 IS NULL AND refs > 0 ORDER BY pack, offset").fetchall()]


# -- payloads ---------------------------------------------------------------------------------
def chunk_pack(db: sqlite3.Connection, chunk_id: bytes) -> int | None:
    """The pack holding the chunk's payload; None if the chunk is not in the catalog."""
    row = db.execute("SELECT pack FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
    return None if row is None else row[0]


def chunk_bases(db: sqlite3.Connection) -> dict[bytes, bytes]:
    """chunk -> the chunk it is coded against, for every chunk coded against one."""
    return dict(db.execute("SELECT id, base FROM chunks WHERE base IS NOT NULL"))


def chunk_locations(db: sqlite3.Connection) -> dict[bytes, ChunkLocation]:
    """Where every chunk's payload lies."""
    return {cid: ChunkLocation(p, o, n) for cid, p, o, n in db.execute("SELECT id, pack, offset, length FROM chunks")}


def record_payloads(tx: sqlite3.Connection, rows: Iterable[Recode]) -> None:
    """Point each chunk at its new payload and base, whatever its row said before."""
    tx.executemany("UPDATE chunks SET codec = ?, pack = ?, offset = ?, length = ?, base = ? WHERE id = ?",
                   [(r.codec, r.pack, r.offset, r.length, r.base, r.chunk_id) for r in rows])


def switch_payload(tx: sqlite3.Connection, c: RowChange) -> bool:
    """Point the chunk at its new payload and base if its row is still as `c.old` and `c.old_base`
    say; False (nothing changed) if it is not."""
    return tx.execute("UPDATE chunks SET codec = ?, pack = ?, offset = ?, length = ?, base = ? "
                      "WHERE id = ? AND pack = ? AND offset = ? AND length = ? AND base IS ?",
                      (c.codec, c.new.pack, c.new.offset, c.new.length, c.new_base,
                       c.chunk_id, c.old.pack, c.old.offset, c.old.length, c.old_base)).rowcount == 1


def move_payload(tx: sqlite3.Connection, m: ChunkMove) -> bool:
    """Move the chunk's payload to `m.new` if its row still names the pack and offset of `m.old`;
    False (nothing changed) if it does not."""
    return tx.execute("UPDATE chunks SET pack = ?, offset = ?, length = ? WHERE id = ? AND pack = ? AND offset = ?",
                      (m.new.pack, m.new.offset, m.new.length, m.chunk_id, m.old.pack, m.old.offset)).rowcount == 1


def relocate(tx: sqlite3.Connection, moves: Iterable[ChunkMove]) -> None:
    """Move payloads to their new places, unguarded (the caller holds the writer lock throughout)."""
    tx.executemany("UPDATE chunks SET pack = ?, offset = ?, length = ? WHERE id = ?",
                   [(m.new.pack, m.new.offset, m.new.length, m.chunk_id) for m in moves])


def delete_chunks(tx: sqlite3.Connection, chunk_ids: Iterable[bytes]) -> None:
    tx.executemany("DELETE FROM chunks WHERE id = ?", [(cid,) for cid in chunk_ids])


# -- garbage ----------------------------------------------------------------------------------
def unreferenced(db: sqlite3.Connection) -> set[bytes]:
    """The chunks nothing references (no extent, no chunk coded against them)."""
    return {cid for (cid,) in db.execute("SELECT id FROM chunks WHERE refs <= 0")}


def referenced_payload(db: sqlite3.Connection) -> tuple[int, int]:
    """(how many chunks something references, their payload bytes)."""
    n, total = db.execute("SELECT COUNT(*), COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()
    return n, total


def base_refs(db: sqlite3.Connection, chunk_id: bytes) -> BaseRefs | None:
    """The chunk's base with its reference count; None for a chunk coded alone (or whose base,
    or itself, is not in the catalog)."""
    row = db.execute("SELECT c.base, b.refs FROM chunks c JOIN chunks b ON b.id = c.base WHERE c.id = ?",
                     (chunk_id,)).fetchone()
    return None if row is None else BaseRefs(*row)


def mark_dead(db: sqlite3.Connection, dead: Iterable[bytes]) -> None:
    """Mark these chunks (and no others) for the queries below that leave marked chunks out, and
    for delete_marked. The marks live in a temp table of this connection."""
    db.execute("CREATE TEMP TABLE IF NOT EXISTS gc_dead (id BLOB PRIMARY KEY) WITHOUT ROWID")
    db.execute("DELETE FROM gc_dead")
    db.executemany("INSERT INTO gc_dead VALUES (?)", [(cid,) for cid in dead])


def delete_marked(tx: sqlite3.Connection) -> None:
    """Drop the rows of the chunks mark_dead marked."""
    tx.execute("DELETE FROM chunks WHERE id IN (SELECT id FROM gc_dead)")


def unmarked_in_pack(db: sqlite3.Connection, pack_id: int) -> dict[bytes, ChunkLocation]:
    """The chunks of one pack that are not marked dead, in the order of their offsets."""
    return {cid: ChunkLocation(pack_id, off, length) for cid, off, length in db.execute(
        "SELECT id, offset, length FROM chunks WHERE pack = ? AND id NOT IN "
        "(SELECT id FROM gc_dead) ORDER BY offset", (pack_id,))}


def _pack_use(db: sqlite3.Connection, where: str, params: Iterable = ()) -> Iterator[PackUse]:
    for pack, n, payload, end in db.execute(
            f"SELECT pack, COUNT(*), SUM(length), MAX(offset + length) FROM chunks {where} GROUP BY pack "
            f"ORDER BY pack", tuple(params)):
        yield PackUse(pack, n, payload, end)


def unmarked_pack_use(db: sqlite3.Connection) -> dict[int, PackUse]:
    """pack -> its chunks that are not marked dead, for every pack that has one."""
    return {u.pack: u for u in _pack_use(db, "WHERE id NOT IN (SELECT id FROM gc_dead)")}


def pack_use(db: sqlite3.Connection, pack_ids: Iterable[int] | None = None) -> dict[int, PackUse]:
    """pack -> its chunks, for these packs (every pack: None) that have any."""
    if pack_ids is None:
        return {u.pack: u for u in _pack_use(db, "")}
    ids = sorted(pack_ids)
    return {u.pack: u for u in _pack_use(db, f"WHERE pack IN ({','.join('?' * len(ids))})", ids)}
