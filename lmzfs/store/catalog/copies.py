"""Consistent copies of the catalog, kept beside it so that `lmz verify --repair` can restore one.

After every committed write transaction the writer (still holding the store's WriterLock) copies
the catalog with SQLite's backup API into a temporary file, records in the copy a digest of its
content, fsyncs it and renames it to ``catalog.sqlite.copy-GGGGGGGGGG`` (G: the catalog
generation the copy holds); the newest KEEP_COPIES are kept. A process killed while copying
leaves only the temporary file, which the next copy replaces and repair ignores.

Before each commit the writer creates ``catalog.sqlite.copy-due`` (fsync'd) and removes it once the
copy of that commit is durable: without it, the newest copy holds the last commit, so a repair
that restores it knows that nothing was lost.

The digest covers every row of every table (meta's copy_* keys aside), so a copy checks itself:
a flipped byte that SQLite's integrity check cannot see (a value inside a row) still shows as a
digest that differs from the one recorded.
"""
from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from lmzfs.store.layout import FILE_MODE, fsync_dir, fsync_path
from lmzfs.store.catalog.uri import READ_ERRORS, sqlite_uri

KEEP_COPIES = 3
COPY_PREFIX = ".copy-"
COPY_TMP_SUFFIX = ".copy-tmp"
COPY_DUE_SUFFIX = ".copy-due"
DIGEST_KEY = "copy_digest"
_COPY_NAME = re.compile(r"\.copy-(\d{10})$")

# Tables and the order their rows are digested in (a primary key order, stable across copies).
_DIGESTED = (
    ("meta", "SELECT key, value FROM meta WHERE key NOT LIKE 'copy\\_%' ESCAPE '\\' ORDER BY key"),
    ("models", "SELECT id, name, added, source FROM models ORDER BY id"),
    ("files", "SELECT id, model, path, size, mtime, sha256, format FROM files ORDER BY id"),
    ("chunks", "SELECT * FROM chunks ORDER BY id"),
    ("extents", "SELECT file, seq, offset, chunk FROM extents ORDER BY file, seq"),
    ("tensors", "SELECT file, name, dtype, shape, offset, size FROM tensors ORDER BY file, offset"),
)


@dataclass(frozen=True)
class CatalogCopy:
    path: Path
    generation: int


def content_digest(db: sqlite3.Connection) -> str:
    """SHA-256 over every row of the catalog. Rows are hashed as Python writes their tuples
    (repr keeps 1, 1.0, '1' and b'1' apart), a batch at a time: the per-value loop this replaces
    took most of a copy's time."""
    h = hashlib.sha256()
    present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table, query in _DIGESTED:
        if table == "tensors" and table not in present:     # a catalog before version 3
            continue
        h.update(f"\x00table {table}\x00".encode())
        cursor = db.execute(query)
        while rows := cursor.fetchmany(4096):
            h.update(repr(rows).encode())
    return h.hexdigest()


def generation_of(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return int(row[0]) if row and str(row[0]).isdigit() else 0


def copy_path(catalog: Path, generation: int) -> Path:
    return catalog.with_name(f"{catalog.name}{COPY_PREFIX}{generation:010d}")


def list_copies(catalog: Path) -> list[CatalogCopy]:
    """The copies beside `catalog`, newest (highest generation) first."""
    found = []
    for p in catalog.parent.glob(f"{catalog.name}{COPY_PREFIX}*"):
        m = _COPY_NAME.search(p.name)
        if m and p.name == f"{catalog.name}{COPY_PREFIX}{m.group(1)}":
            found.append(CatalogCopy(p, int(m.group(1))))
    return sorted(found, key=lambda c: -c.generation)


def recorded_digest(copy: Path) -> str | None:
    """The digest a copy recorded of its content when it was written (None: unreadable)."""
    try:
        db = sqlite3.connect(sqlite_uri(copy, read_only=True), uri=True, isolation_level=None)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (DIGEST_KEY,)).fetchone()
            return row[0] if row else None
        finally:
            db.close()
    except READ_ERRORS:
        return None


def due_marker(catalog: Path) -> Path:
    return catalog.with_name(catalog.name + COPY_DUE_SUFFIX)


def mark_copy_due(catalog: Path) -> None:
    """Before a commit: say durably that a commit may be newer than the newest copy."""
    marker = due_marker(catalog)
    if marker.exists():
        return
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(catalog.parent)


def write_copy(db: sqlite3.Connection, catalog: Path) -> CatalogCopy:
    """Copy the committed catalog that `db` is connected to; call outside any transaction, under
    the writer lock. Old copies beyond KEEP_COPIES are removed once the new one is durable."""
    generation = generation_of(db)
    tmp = catalog.with_name(catalog.name + COPY_TMP_SUFFIX)
    tmp.unlink(missing_ok=True)
    try:
        _write_tmp(db, tmp)
    except BaseException:
        # a copy that failed (a full disk) leaves no file behind, not even an empty one
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)
        raise
    final = copy_path(catalog, generation)
    os.replace(tmp, final)
    fsync_dir(catalog.parent)
    for old in list_copies(catalog)[KEEP_COPIES:]:
        old.path.unlink(missing_ok=True)
    due_marker(catalog).unlink(missing_ok=True)
    return CatalogCopy(final, generation)


def _write_tmp(db: sqlite3.Connection, tmp: Path) -> None:
    """The copy, written to `tmp` and fsync'd."""
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))   # the owner's, as the catalog
    dest = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.backup(dest)
        # A copy is a plain rollback-journal file: reading it read-only needs no -wal or -shm beside it.
        dest.execute("PRAGMA journal_mode=DELETE")
        dest.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (DIGEST_KEY, content_digest(dest)))
    finally:
        dest.close()
    fsync_path(tmp)
