"""The SQLite catalog: models, their files, each file's extents, and the chunks they point at.

Writers hold the store's WriterLock and change the catalog only in single transactions, so a
model appears whole or not at all. Readers open their own connection and never block writers
(WAL mode). A version 1 catalog (no read checksums) is read as it is and upgraded to version 2
the first time it is opened for writing.

Every committed write transaction bumps meta's generation and leaves a copy of the catalog beside
it (catalogcopies.py). Any SQLite error, or a row whose values have the wrong types, surfaces from
this class as one StoreError: CatalogDamaged when the file itself is damaged, so that every
command reports it in one line and points at `lmz verify --repair`.
"""
from __future__ import annotations

import functools
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmzfs.store.catalogcopies import (content_digest, generation_of, list_copies, mark_copy_due, recorded_digest,
                                       write_copy)
from lmzfs.store.layout import FILE_MODE, StoreError
from lmzfs.store.packs import ChunkLocation

CATALOG_VERSION = 2
READABLE_VERSIONS = ("1", "2")  # 1: chunks have no xxh3 column; their reads are checked by SHA-256

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    added REAL NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    model INTEGER NOT NULL REFERENCES models(id),
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime REAL NOT NULL,
    sha256 TEXT NOT NULL,
    format TEXT NOT NULL,
    UNIQUE (model, path)
);
CREATE TABLE IF NOT EXISTS chunks (
    id BLOB PRIMARY KEY,          -- SHA-256 of the plain bytes
    size INTEGER NOT NULL,        -- plain size
    codec TEXT NOT NULL,
    pack INTEGER NOT NULL,
    offset INTEGER NOT NULL,      -- of the payload inside the pack
    length INTEGER NOT NULL,      -- payload length
    refs INTEGER NOT NULL,        -- extents pointing here; 0 = garbage until `lmz gc`
    xxh3 BLOB                     -- XXH3-128 of the plain bytes (16 bytes), what reads check; NULL: SHA-256
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS extents (
    file INTEGER NOT NULL REFERENCES files(id),
    seq INTEGER NOT NULL,
    offset INTEGER NOT NULL,      -- in the plain file
    chunk BLOB NOT NULL REFERENCES chunks(id),
    PRIMARY KEY (file, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunks_by_pack ON chunks(pack);
"""
TABLES = {"meta", "models", "files", "chunks", "extents"}


class CatalogDamaged(StoreError):
    """The catalog file is damaged or is not a catalog: `lmz verify --repair` restores a copy."""

    def __init__(self, path: Path, detail: str):
        detail = " ".join(detail.split())      # SQLite's reports span lines; this error is one
        super().__init__(f"catalog {path} is damaged: run lmz verify --repair ({detail})")
        self.path = path
        self.detail = detail


# SQLite result codes that mean the bytes of the file are wrong, not that it is busy or the disk full.
_DAMAGE_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_FORMAT}
# A catalog whose schema page is damaged loses tables or columns: our fixed queries then fail so.
_DAMAGE_MESSAGES = ("no such table", "no such column", "malformed", "not a database")


def catalog_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """The one-line StoreError for an SQLite failure on the catalog at `path`."""
    text = str(exc)
    if getattr(exc, "sqlite_errorcode", None) in _DAMAGE_CODES or any(m in text for m in _DAMAGE_MESSAGES):
        return CatalogDamaged(path, text)
    return StoreError(f"catalog {path} cannot be used: {text}")


def _guarded(method):
    """Turn an SQLite error, or a value of the wrong type in a row, into a one-line StoreError."""
    @functools.wraps(method)
    def guarded(self: "Catalog", *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise catalog_error(self.path, exc) from exc
        except (TypeError, ValueError) as exc:
            raise CatalogDamaged(self.path, f"a row holds a value of the wrong type: {exc}") from exc
    return guarded


def _typed(row: tuple, types: tuple) -> tuple:
    for value, want in zip(row, types):
        if not isinstance(value, want) or isinstance(value, bool):
            raise TypeError(f"{value!r} where {want} belongs")
    return row


_NUM = (int, float)
_MODEL_TYPES = (int, str, _NUM, str)
_FILE_TYPES = (int, str, str, int, _NUM, str, str)
_EXTENT_TYPES = (int, int, bytes, str, int, int, int, (bytes, type(None)))


@dataclass(frozen=True)
class ModelRow:
    id: int
    name: str
    added: float
    source: str


@dataclass(frozen=True)
class FileRow:
    id: int
    model: str
    path: str
    size: int
    mtime: float
    sha256: str
    format: str


@dataclass(frozen=True)
class Extent:
    offset: int          # in the plain file
    size: int            # plain size of the chunk
    chunk_id: bytes
    codec: str
    location: ChunkLocation
    xxh3: bytes | None = None    # XXH3-128 of the plain bytes; None: reads check the SHA-256 id


@dataclass(frozen=True)
class ModelUsage:
    name: str
    files: int
    logical_bytes: int
    stored_bytes: int    # payload bytes of the distinct chunks the model references

    @property
    def saved_pct(self) -> float:
        return 100.0 * (1 - self.stored_bytes / self.logical_bytes) if self.logical_bytes else 0.0


class Catalog:
    """A connection to the catalog with the queries the store, the reader and the CLI need."""

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = path
        self.copy_due = False       # a commit whose copy is not written yet
        # False: commits leave their copy to the caller's write_copy (a writable mount, whose
        # many small commits would each copy the whole catalog, writes one every few seconds)
        self.copy_after_commit = True
        if not path.exists() and list_copies(path):
            raise CatalogDamaged(path, "it is missing")
        if readonly and not path.exists():
            raise StoreError(f"catalog {path} is missing")
        if not readonly:
            # SQLite would create the file by the umask (0644); its -wal and -shm files copy the
            # catalog's mode, so creating it 0600 here keeps all three the owner's.
            try:
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
            except OSError as exc:
                raise StoreError(f"catalog {path} cannot be opened: {exc.strerror or exc}") from None
        uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
        self.db = None
        try:
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA busy_timeout=30000")
            if not readonly:
                self._open_for_writing()
            self.version, self.has_xxh3 = self._schema_state()
        except sqlite3.Error as exc:
            if self.db is not None:
                self.db.close()
            raise catalog_error(path, exc) from exc
        except CatalogDamaged:
            self.db.close()
            raise
        if self.version is None:
            self.db.close()
            raise CatalogDamaged(path, "it has no catalog_version marker")
        if self.version not in READABLE_VERSIONS:
            self.db.close()
            raise StoreError(f"catalog {path}: version {self.version} is not supported "
                             f"(this lmzfs reads versions {', '.join(READABLE_VERSIONS)})")
        if self.has_xxh3 != (self.version != "1"):
            self.db.close()
            raise CatalogDamaged(path, f"version {self.version} {'has' if self.has_xxh3 else 'lacks'} "
                                       f"the chunks.xxh3 column")

    def _open_for_writing(self) -> None:
        """Create the schema in a new catalog; in an existing one, refuse to write into a damaged
        file (every write would build on it), and upgrade version 1."""
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and list_copies(self.path):       # truncated to nothing: not a new store
            raise CatalogDamaged(self.path, "it is empty, and copies of it lie beside it")
        self.db.execute("PRAGMA journal_mode=WAL")      # writes to the file: only once it is known sound
        self.db.execute("PRAGMA synchronous=FULL")
        if not tables:
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('catalog_version', ?)", (str(CATALOG_VERSION),))
            return
        if not TABLES <= tables:
            raise CatalogDamaged(self.path, f"tables {', '.join(sorted(TABLES - tables))} are missing")
        problems = [r[0] for r in self.db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise CatalogDamaged(self.path, f"quick_check: {problems[0]}")
        self._check_against_copy()
        self.db.executescript(SCHEMA)       # adds what a catalog written by an older lmzfs lacks
        if self._version() == "1":
            self._upgrade_from_1()

    def _check_against_copy(self) -> None:
        """A write would build on (and its copy carry on) a value flipped inside a row, which no
        integrity check sees: refuse if the content differs from its copy of the same generation."""
        generation = generation_of(self.db)
        for copy in list_copies(self.path):
            if copy.generation == generation:
                recorded = recorded_digest(copy.path)
                if recorded is not None and recorded != content_digest(self.db):
                    raise CatalogDamaged(self.path, f"its content differs from its copy {copy.path.name}")
                return

    def _schema_state(self) -> tuple[str | None, bool]:
        """(catalog version, whether chunks have the xxh3 column), read in one snapshot so that an
        upgrade committing meanwhile cannot make them disagree."""
        self.db.execute("BEGIN")
        try:
            return self._version(), any(r[1] == "xxh3" for r in self.db.execute("PRAGMA table_info(chunks)"))
        finally:
            self.db.execute("COMMIT")

    def _version(self) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key='catalog_version'").fetchone()
        return row[0] if row else None

    def _upgrade_from_1(self) -> None:
        """Version 1 to 2: chunks get their read checksum column, empty (their reads keep checking
        the SHA-256 id until `lmz verify --record-checksums` or an add of the same content fills it in)."""
        with self.transaction() as db:
            if self._version() == "1":         # another writer may have upgraded it meanwhile
                db.execute("ALTER TABLE chunks ADD COLUMN xxh3 BLOB")
                db.execute("UPDATE meta SET value = ? WHERE key = 'catalog_version'", (str(CATALOG_VERSION),))

    def write_copy(self, *, final: bool) -> None:
        """Copy the committed catalog beside it (after a commit, under the writer lock). A copy that
        cannot be written now (a full disk) is tried again at close(); `final`: the last try,
        whose failure is reported."""
        try:
            write_copy(self.db, self.path)
            self.copy_due = False
        except (OSError, sqlite3.Error) as exc:
            if final:
                raise StoreError(f"the change is committed, but no copy of the catalog could be written "
                                 f"beside it ({exc}); free some space and run `lmz verify --repair`") from exc

    def close(self) -> None:
        try:
            if self.copy_due:
                self.write_copy(final=True)
        finally:
            self.db.close()

    def transaction(self) -> "_Transaction":
        return _Transaction(self)

    def write_or_free_copies(self, write: Callable[[sqlite3.Connection], None]) -> None:
        """Run `write` in a transaction; if the disk is full, remove the catalog's copies and run it
        once more. For gc, which must commit to free space: the catalog checked clean when it was
        opened for writing, and a fresh copy follows the commit."""
        try:
            with self.transaction() as db:
                write(db)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_FULL or not list_copies(self.path):
                raise
            for copy in list_copies(self.path):
                copy.path.unlink(missing_ok=True)
            with self.transaction() as db:
                write(db)

    @_guarded
    def data_version(self) -> int:
        """Changes whenever another connection commits (SQLite's own counter); cheap to poll."""
        return self.db.execute("PRAGMA data_version").fetchone()[0]

    # -- models and files -------------------------------------------------------------------
    @_guarded
    def models(self) -> list[ModelRow]:
        return [ModelRow(*_typed(r, _MODEL_TYPES))
                for r in self.db.execute("SELECT id, name, added, source FROM models ORDER BY name")]

    @_guarded
    def model(self, name: str) -> ModelRow | None:
        r = self.db.execute("SELECT id, name, added, source FROM models WHERE name=?", (name,)).fetchone()
        return ModelRow(*_typed(r, _MODEL_TYPES)) if r else None

    @_guarded
    def files(self, model: str | None = None) -> list[FileRow]:
        q = ("SELECT f.id, m.name, f.path, f.size, f.mtime, f.sha256, f.format "
             "FROM files f JOIN models m ON m.id = f.model")
        rows = self.db.execute(q + " WHERE m.name=? ORDER BY f.path", (model,)) if model is not None \
            else self.db.execute(q + " ORDER BY m.name, f.path")
        return [FileRow(*_typed(r, _FILE_TYPES)) for r in rows]

    @_guarded
    def file_by_id(self, file_id: int) -> FileRow | None:
        r = self.db.execute("SELECT f.id, m.name, f.path, f.size, f.mtime, f.sha256, f.format FROM files f "
                            "JOIN models m ON m.id = f.model WHERE f.id=?", (file_id,)).fetchone()
        return FileRow(*_typed(r, _FILE_TYPES)) if r else None

    @_guarded
    def extents(self, file_id: int) -> list[Extent]:
        if not self.has_xxh3:       # a version 1 catalog that a writer may have upgraded since
            self.has_xxh3 = self._schema_state()[1]
        rows = self.db.execute(
            f"SELECT e.offset, c.size, c.id, c.codec, c.pack, c.offset, c.length, {'c.xxh3' if self.has_xxh3 else 'NULL'} "
            "FROM extents e JOIN chunks c ON c.id = e.chunk WHERE e.file=? ORDER BY e.seq", (file_id,))
        return [Extent(o, s, cid, codec, ChunkLocation(p, po, pl), x)
                for o, s, cid, codec, p, po, pl, x in (_typed(r, _EXTENT_TYPES) for r in rows)]

    @_guarded
    def file_storage(self) -> dict[int, tuple[int, str]]:
        """file id -> (payload bytes of its distinct chunks, comma-separated codec names)."""
        out: dict[int, tuple[int, str]] = {}
        rows = self.db.execute(
            "SELECT file, SUM(length), GROUP_CONCAT(codec) FROM "
            "(SELECT DISTINCT e.file, c.id, c.length, c.codec FROM extents e JOIN chunks c ON c.id = e.chunk) "
            "GROUP BY file")
        for fid, stored, codecs in rows:
            out[fid] = (stored or 0, ",".join(sorted(set((codecs or "").split(",")) - {""})))
        return out

    @_guarded
    def usage(self) -> list[ModelUsage]:
        logical = {n: (c, s) for n, c, s in self.db.execute(
            "SELECT m.name, COUNT(f.id), COALESCE(SUM(f.size), 0) FROM models m "
            "LEFT JOIN files f ON f.model = m.id GROUP BY m.id")}
        stored = dict(self.db.execute(
            "SELECT name, SUM(length) FROM (SELECT DISTINCT m.name, c.id, c.length FROM models m "
            "JOIN files f ON f.model = m.id JOIN extents e ON e.file = f.id JOIN chunks c ON c.id = e.chunk) "
            "GROUP BY name"))
        return [ModelUsage(n, c, s, stored.get(n) or 0) for n, (c, s) in sorted(logical.items())]

    @_guarded
    def file_charges(self, model: str) -> dict[str, int]:
        """Per file of a model, payload bytes of the chunks it is the first (in path order) to use.

        A file whose every chunk already serves an earlier file of the model costs nothing."""
        seen: set[bytes] = set()
        out: dict[str, int] = {}
        for f in self.files(model):
            cost = 0
            for cid, length in self.db.execute(
                    "SELECT c.id, c.length FROM extents e JOIN chunks c ON c.id = e.chunk WHERE e.file=?", (f.id,)):
                if cid not in seen:
                    seen.add(cid)
                    cost += length
            out[f.path] = cost
        return out

    # -- chunks -----------------------------------------------------------------------------
    @_guarded
    def has_chunk(self, chunk_id: bytes) -> bool:
        return self.db.execute("SELECT 1 FROM chunks WHERE id=?", (chunk_id,)).fetchone() is not None

    @_guarded
    def chunk_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]

    @_guarded
    def chunks_checked_by_id(self) -> int:
        """Chunks stored without a read checksum: their reads check the SHA-256 id instead."""
        if not self.has_xxh3:
            return self.chunk_count()
        return self.db.execute("SELECT COUNT(*) FROM chunks WHERE xxh3 IS NULL").fetchone()[0]

    @_guarded
    def pack_ids(self) -> tuple[int | None, int]:
        """(the pack adds append to, or None; one above the highest pack id ever committed)."""
        meta = dict(self.db.execute("SELECT key, value FROM meta WHERE key IN ('last_pack', 'pack_high')"))
        last = int(meta["last_pack"]) if "last_pack" in meta else None
        return last, int(meta.get("pack_high", 0)) + 1

    @staticmethod
    def record_pack_ids(db: sqlite3.Connection, last: int | None, high: int) -> None:
        """Inside a write transaction: remember the append target and the id high-water mark."""
        if last is None:
            db.execute("DELETE FROM meta WHERE key = 'last_pack'")
        else:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('last_pack', ?)", (str(last),))
        db.execute("INSERT OR REPLACE INTO meta VALUES ('pack_high', "
                   "MAX(?, COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'pack_high'), 0)))",
                   (high,))

    @_guarded
    def total_logical(self) -> tuple[int, int]:
        return self.db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM files").fetchone()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception. A commit bumps the catalog's
    generation and then writes a copy of the committed catalog beside it."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.db = catalog.db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type:
            self.db.execute("ROLLBACK")
            return
        try:
            mark_copy_due(self.catalog.path)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('generation', "
                            "CAST(COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'generation'), 0) + 1 AS TEXT))")
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        self.catalog.copy_due = True
        if self.catalog.copy_after_commit:
            self.catalog.write_copy(final=False)
