"""Model rows: a stored model, its files, each file's extents and tensors, as a write inserts
them and `lmz rm` removes them.

As in chunkrows, each function runs on the connection it is given (a write transaction's, or the
catalog's own for a read) and lets SQLite's errors through; which rows to write is the caller's.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from lmzfs.store.catalog.db import TensorRow


@dataclass(frozen=True)
class NewFile:
    """A file row to insert (its id is the catalog's to give)."""
    model: int           # the model's id
    path: str
    size: int
    mtime: float
    sha256: str
    format: str


@dataclass(frozen=True, slots=True)
class ExtentRow:
    file: int
    seq: int             # its place among the file's extents
    offset: int          # in the plain file
    chunk: bytes


def insert_model(tx: sqlite3.Connection, name: str, added: float, source: str) -> int:
    """A new model row; returns its id."""
    return tx.execute("INSERT INTO models (name, added, source) VALUES (?,?,?)", (name, added, source)).lastrowid


def insert_file(tx: sqlite3.Connection, f: NewFile) -> int:
    """A new file row; returns its id."""
    return tx.execute("INSERT INTO files (model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?)",
                      (f.model, f.path, f.size, f.mtime, f.sha256, f.format)).lastrowid


def insert_extents(tx: sqlite3.Connection, rows: Iterable[ExtentRow]) -> None:
    tx.executemany("INSERT INTO extents (file, seq, offset, chunk) VALUES (?,?,?,?)",
                   [(e.file, e.seq, e.offset, e.chunk) for e in rows])


def insert_tensors(tx: sqlite3.Connection, rows: Iterable[TensorRow]) -> None:
    """Tensor rows; one at an offset the file already has a row for is left out."""
    tx.executemany("INSERT OR IGNORE INTO tensors (file, name, dtype, shape, offset, size) VALUES (?,?,?,?,?,?)",
                   [(t.file, t.name, t.dtype, t.shape, t.offset, t.size) for t in rows])


def delete_model(tx: sqlite3.Connection, model_id: int) -> int:
    """Remove a model with its files, extents and tensors, taking from each chunk's reference
    count what its extents gave; returns how many files went. The chunks stay (until gc)."""
    tx.execute("CREATE TEMP TABLE IF NOT EXISTS gone(chunk BLOB, n INTEGER)")
    tx.execute("DELETE FROM gone")
    tx.execute("INSERT INTO gone SELECT e.chunk, COUNT(*) FROM extents e JOIN files f ON f.id = e.file "
               "WHERE f.model = ? GROUP BY e.chunk", (model_id,))
    tx.execute("UPDATE chunks SET refs = refs - (SELECT n FROM gone WHERE gone.chunk = chunks.id) "
               "WHERE id IN (SELECT chunk FROM gone)")
    tx.execute("DELETE FROM extents WHERE file IN (SELECT id FROM files WHERE model = ?)", (model_id,))
    tx.execute("DELETE FROM tensors WHERE file IN (SELECT id FROM files WHERE model = ?)", (model_id,))
    removed = tx.execute("DELETE FROM files WHERE model = ?", (model_id,)).rowcount
    tx.execute("DELETE FROM models WHERE id = ?", (model_id,))
    return removed


def chunks_in_file_order(db: sqlite3.Connection) -> Iterator[bytes]:
    """The chunk of every extent, in the order of model name, file path and place in the file
    (a chunk used more than once comes more than once)."""
    for (cid,) in db.execute("SELECT e.chunk FROM extents e JOIN files f ON f.id = e.file "
                             "JOIN models m ON m.id = f.model ORDER BY m.name, f.path, e.seq"):
        yield cid
