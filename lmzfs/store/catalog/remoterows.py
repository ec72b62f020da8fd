"""The catalog rows a remote store's snapshot is made of (store/remote/push.py): the chunks a
snapshot needs, where a snapshot's catalog says each lies, and the snapshot's own catalog, a copy
of the local one whose chunks name the remote's packs."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from lmzfs.store.catalog.db import catalog_error, readonly_uri


@dataclass(frozen=True)
class ChunkPlace:
    chunk_id: bytes
    pack: int
    offset: int          # of the payload
    length: int
    codec: str = ""
    base: bytes | None = None    # the chunk its payload is coded against, if any
    model: int | None = None     # the first model (by id) whose files name it; None: only a base

    def same_payload(self, other: "ChunkPlace") -> bool:
        """Whether `other` describes the same payload of this chunk: a chunk recoded since (a delta
        against a newer model, `lmz rewrite recode`) has the same id but another payload."""
        return (self.length, self.codec, self.base) == (other.length, other.codec, other.base)


def _base(db: sqlite3.Connection) -> str:
    """The base column, or NULL in a catalog older than version 3 (which has none)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    return "base" if "base" in columns else "NULL"


def copy_catalog(src: Path, dest: Path) -> None:
    """A consistent copy of the committed catalog at `src` (SQLite's backup API from a read-only
    connection), as a plain rollback-journal file at `dest`."""
    try:
        source = sqlite3.connect(readonly_uri(src), uri=True, isolation_level=None)
        try:
            target = sqlite3.connect(dest, isolation_level=None)
            try:
                source.backup(target)
                target.execute("PRAGMA journal_mode=DELETE")
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise catalog_error(src, exc) from None


def live_chunks(path: Path) -> list[ChunkPlace]:
    """Every chunk the catalog at `path` needs (named by a file, or the base of one that is), with
    the first model that names it, grouped by that model and in pack order within it: what a
    snapshot of it must find on the remote."""
    db = sqlite3.connect(readonly_uri(path), uri=True)
    try:
        owner = dict(db.execute("SELECT e.chunk, MIN(f.model) FROM extents e JOIN files f ON f.id = e.file "
                                "GROUP BY e.chunk"))
        rows = [ChunkPlace(cid, pack, off, n, codec, base, owner.get(cid)) for cid, pack, off, n, codec, base in
                db.execute(f"SELECT id, pack, offset, length, codec, {_base(db)} FROM chunks WHERE refs > 0 "
                           "ORDER BY pack, offset")]
        return sorted(rows, key=lambda c: (c.model is None, c.model or 0))      # stable: pack order kept
    except sqlite3.Error as exc:
        raise catalog_error(path, exc) from None
    finally:
        db.close()


def relocate(path: Path, places: dict[bytes, tuple[int, int]]) -> None:
    """Make the catalog copy at `path` name the remote's packs: each live chunk's (pack, offset)
    becomes places[id] (its payload length is the same bytes'), chunks nothing needs are dropped,
    and the file is compacted. KeyError if a live chunk has no place."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        ids = [row[0] for row in db.execute("SELECT id FROM chunks WHERE refs > 0")]
        db.executemany("UPDATE chunks SET pack = ?, offset = ? WHERE id = ?",
                       ((*places[cid], cid) for cid in ids))
        db.execute("DELETE FROM chunks WHERE refs <= 0")
        db.execute("DELETE FROM meta WHERE key IN ('last_pack', 'pack_high')")
        db.execute("COMMIT")
        db.execute("VACUUM")
    except sqlite3.Error as exc:
        raise catalog_error(path, exc) from None
    finally:
        db.close()


def chunk_places(path: Path) -> dict[bytes, ChunkPlace]:
    """Where the snapshot catalog at `path` says each chunk lies."""
    db = sqlite3.connect(readonly_uri(path), uri=True)
    try:
        return {row[0]: ChunkPlace(*row) for row in
                db.execute(f"SELECT id, pack, offset, length, codec, {_base(db)} FROM chunks")}
    except sqlite3.Error as exc:
        raise catalog_error(path, exc) from None
    finally:
        db.close()
