"""The SQLite catalog: models, their files, each file's extents, and the chunks they point at.

Writers hold the store's WriterLock and change the catalog only in single transactions, so a
model appears whole or not at all. Readers open their own connection and never block writers
(WAL mode). A version 1 catalog (no read checksums) or 2 (no chunk references) is read as it is
and upgraded to version 3 the first time it is opened for writing.

Every committed write transaction bumps meta's generation and leaves a copy of the catalog beside
it (catalog/copies.py). Any SQLite error, or a row whose values have the wrong types, surfaces from
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

from lmzfs.chunker import NEW_STORE_SIZES, ChunkSizes
from lmzfs.store.catalog.chunksizes import record_statements, recorded_sizes
from lmzfs.store.catalog.copies import (content_digest, generation_of, list_copies, mark_copy_due, recorded_digest,
                                       write_copy)
from lmzfs.store.layout import FILE_MODE, StoreError
from lmzfs.store.packs import ChunkLocation
from lmzfs.store.catalog.uri import sqlite_uri

CATALOG_VERSION = 3
# 1: chunks have no xxh3 column; their reads are checked by SHA-256. 2: no chunk is coded against
# a reference (no chunks.base column, no tensors table).
READABLE_VERSIONS = ("1", "2", "3")
# How many references a read follows from one chunk before the catalog is judged damaged (a
# cycle, or a chain far past any depth cap a writer keeps): bounds every read's work.
MAX_CHAIN_HOPS = 16

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
    refs INTEGER NOT NULL,        -- extents pointing here + chunks whose base it is; 0 = garbage until `lmz gc`
    xxh3 BLOB,                    -- XXH3-128 of the plain bytes: what reads check; NULL: SHA-256
    base BLOB                     -- id of the chunk a delta payload is coded against; NULL: coded alone
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
# What version 3 adds (a new catalog, or the upgrade from 2), one statement per entry.
SCHEMA_V3 = ("""CREATE TABLE IF NOT EXISTS tensors (
    file INTEGER NOT NULL REFERENCES files(id),
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,          -- the container's dtype, upper case ("BF16", "I8", "Q4_1")
    shape TEXT NOT NULL,          -- dimensions, comma-separated ("4096,1024"; "" for a scalar)
    offset INTEGER NOT NULL,      -- of the tensor's data in the plain file
    size INTEGER NOT NULL,        -- bytes of data
    PRIMARY KEY (file, offset)
) WITHOUT ROWID""",
             "CREATE INDEX IF NOT EXISTS chunks_by_base ON chunks(base)")
TABLES = {"meta", "models", "files", "chunks", "extents"}       # in every version
TABLES_V3 = TABLES | {"tensors"}


def tables_of(version: str | None) -> set[str]:
    """The tables a catalog of this version has."""
    return TABLES_V3 if version == "3" else TABLES


class CatalogDamaged(StoreError):
    """The catalog file is damaged or is not a catalog: `lmz verify --repair` restores a copy."""

    def __init__(self, path: Path, detail: str):
        detail = " ".join(detail.split())      # SQLite's reports span lines; this error is one
        super().__init__(f"catalog {path} is damaged: run lmz verify --repair ({detail})")
        self.path = path
        self.detail = detail


# SQLite result codes (primary, the low byte of an extended one) that mean the bytes of the file
# are wrong, not that it is busy, unreachable or the disk full.
_DAMAGE_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_FORMAT}
# A catalog whose schema page is damaged loses tables or columns: our fixed queries then fail so.
# "Could not decode to UTF-8": a text value whose bytes are not UTF-8, which no writer stores
_DAMAGE_MESSAGES = ("no such table", "no such column", "malformed", "not a database", "Could not decode to UTF-8")
# Free bytes under which a disk counts as full when SQLite fails: a connection's first open
# creates catalog.sqlite-shm (32 KiB, reported as a disk I/O error if it cannot) and commits
# grow catalog.sqlite-wal.
FULL_DISK_BYTES = 1 << 20


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether an SQLite error says that the file's bytes are wrong, rather than that it cannot be
    read now (an I/O error, a full disk, a lock held, no permission)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and (code & 0xFF) in _DAMAGE_CODES) or any(m in str(exc) for m in _DAMAGE_MESSAGES)


def free_if_full(path: Path) -> int | None:
    """The free bytes of the file system holding `path` if they are under FULL_DISK_BYTES (the
    disk is full), else None."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return free if free < FULL_DISK_BYTES else None


def _on_read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _wal_holds_frames(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    try:
        return wal.stat().st_size > 0
    except FileNotFoundError:
        return False


def readonly_uri(path: Path) -> str:
    """The URI a read-only connection opens the catalog at `path` by. The first connection to a
    WAL-mode file creates its -shm and -wal files beside it, which a read-only file system (a
    store shipped on read-only media, a read-only bind mount) does not allow. There, where
    nothing can change the file, it is opened immutable: read as it is, without them. Not if a
    -wal file holds frames (commits a killed writer left to be copied into the file, which only
    SQLite's log reader applies): then the plain URI, whose error catalog_error explains."""
    return sqlite_uri(path, read_only=True, immutable=_on_read_only_fs(path) and not _wal_holds_frames(path))


# The fields of SQLite's 100-byte file header that SQLite itself does not refuse when damaged: a
# file format write version above 2 makes it open the file read-only without a word, so every
# later write fails ("attempt to write a readonly database"); one above 2 for reading, or payload
# fractions other than 64/32/32, make it refuse the file later, at its first read.
_HEADER_FIELDS = ((18, (1, 2), "file format write version"), (19, (1, 2), "file format read version"),
                  (21, (64,), "maximum embedded payload fraction"), (22, (32,), "minimum embedded payload fraction"),
                  (23, (32,), "leaf payload fraction"))


def header_problem(path: Path) -> str | None:
    """One line when a header field SQLite would not refuse at open holds a value it never writes."""
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return None                 # SQLite names these itself ("file is not a database")
    for at, allowed, what in _HEADER_FIELDS:
        if header[at] not in allowed:
            return f"its header's {what} (byte {at}) reads {header[at]}, not {' or '.join(map(str, allowed))}"
    return None


def catalog_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """The one-line StoreError for an SQLite failure on the catalog at `path`."""
    text = str(exc)
    if is_damage(exc):
        return CatalogDamaged(path, text)
    if "readonly database" in text:         # a header SQLite opened read-only without a word?
        try:
            if problem := header_problem(path):
                return CatalogDamaged(path, problem)
        except OSError:
            pass
    if _on_read_only_fs(path):
        if _wal_holds_frames(path):
            text += (f"; the file system holding it is read-only, and {path.name}-wal beside it holds "
                     f"commits not yet in the file: open the store once where it is writable")
    elif (free := free_if_full(path)) is not None:
        text += (f"; the disk holding it is full ({free} bytes free), and SQLite needs room beside the "
                 f"catalog for its -shm and -wal files: free some space on that disk and try again")
    return StoreError(f"catalog {path} cannot be used: {text}")


def failure_words(path: Path, exc: sqlite3.Error) -> str:
    """What went wrong, for a message that says what was not done: SQLite's words, or the
    catalog's damage where that is what they mean."""
    err = catalog_error(path, exc)
    return str(err) if isinstance(err, CatalogDamaged) else str(exc)


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
_EXTENT_TYPES = (int, int, bytes, str, int, int, int, (bytes, type(None)), (bytes, type(None)))
_CHUNK_TYPES = (bytes, int, str, int, int, int, (bytes, type(None)), (bytes, type(None)))


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
    # The chunk whose plain bytes the payload is decoded against (its offset is 0: it is a chunk,
    # not a place in this file); None for a chunk coded alone. Resolved by Catalog.extents.
    base: "Extent | None" = None

    def chain(self) -> list["Extent"]:
        """This chunk, its base, its base's base, ... to the chunk coded alone."""
        out, e = [], self
        while e is not None:
            out.append(e)
            e = e.base
        return out


@dataclass(frozen=True)
class TensorRow:
    """One tensor of a stored file (catalog version 3): what reference selection pairs by."""
    file: int
    name: str
    dtype: str
    shape: str
    offset: int          # of its data in the plain file
    size: int


@dataclass(frozen=True)
class StoredTensor:
    """A tensor row with the model and file it belongs to."""
    model: str
    path: str            # the file's path inside the model
    added: float         # when the model was added
    tensor: TensorRow


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
        uri = readonly_uri(path) if readonly else sqlite_uri(path)
        self.db = None
        try:
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA busy_timeout=30000")
            if not readonly:
                self._open_for_writing()
            self.version, self.has_xxh3, self.has_base = self._schema_state()
        except sqlite3.Error as exc:
            if self.db is not None:
                self.db.close()
            raise catalog_error(path, exc) from exc
        except UnicodeDecodeError as exc:       # its schema's text damaged (sqlite_master)
            if self.db is not None:
                self.db.close()
            raise CatalogDamaged(path, f"its schema holds text that is not UTF-8 ({exc.reason})") from exc
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
        if self.has_base != (self.version == "3"):
            self.db.close()
            raise CatalogDamaged(path, f"version {self.version} {'has' if self.has_base else 'lacks'} "
                                       f"the chunks.base column")

    def _open_for_writing(self) -> None:
        """Create the schema in a new catalog; in an existing one, refuse to write into a damaged
        file (every write would build on it), and upgrade version 1."""
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and list_copies(self.path):       # truncated to nothing: not a new store
            raise CatalogDamaged(self.path, "it is empty, and copies of it lie beside it")
        self.db.execute("PRAGMA journal_mode=WAL")      # writes to the file: only once it is known sound
        self.db.execute("PRAGMA synchronous=FULL")
        if not tables:      # a new store: its schema, version and chunk sizes in one transaction
            self.db.executescript("BEGIN;\n" + SCHEMA + ";\n".join(SCHEMA_V3) + ";\n"
                                  f"INSERT OR IGNORE INTO meta VALUES ('catalog_version', '{CATALOG_VERSION}');\n"
                                  + record_statements(NEW_STORE_SIZES) + "COMMIT;")
            return
        required = tables_of(self._version())
        if not required <= tables:
            raise CatalogDamaged(self.path, f"tables {', '.join(sorted(required - tables))} are missing")
        problems = [r[0] for r in self.db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise CatalogDamaged(self.path, f"quick_check: {problems[0]}")
        self._check_against_copy()
        self.db.executescript(SCHEMA)       # adds what a catalog written by an older lmzfs lacks
        if self._version() == "1":
            self._upgrade_from_1()
        if self._version() == "2":
            self._upgrade_from_2()

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

    def _schema_state(self) -> tuple[str | None, bool, bool]:
        """(catalog version, whether chunks have the xxh3 column, and the base column), read in
        one snapshot so that an upgrade committing meanwhile cannot make them disagree."""
        self.db.execute("BEGIN")
        try:
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(chunks)")}
            return self._version(), "xxh3" in columns, "base" in columns
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
                db.execute("UPDATE meta SET value = '2' WHERE key = 'catalog_version'")

    def _upgrade_from_2(self) -> None:
        """Version 2 to 3: chunks get their reference column (NULL: every chunk stored so far is
        coded alone) and its index, and files their tensors table (empty for files stored before:
        such models are never picked as a base automatically, only with `lmz add --base`)."""
        with self.transaction() as db:
            if self._version() == "2":
                db.execute("ALTER TABLE chunks ADD COLUMN base BLOB")
                for statement in SCHEMA_V3:
                    db.execute(statement)
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

    def group_commit(self) -> None:
        """Commits no longer fsync the WAL each (synchronous=NORMAL): the caller makes them durable
        with sync_wal() (a writable mount: soon after each change, and at every fsync). A commit
        is in the WAL when it returns (a kill of the process loses none); a power loss before the
        next sync_wal() may lose the latest ones, never leaving the catalog inconsistent."""
        self.db.execute("PRAGMA synchronous=NORMAL")

    def sync_wal(self) -> None:
        """Make every commit so far durable: fsync the WAL (SQLite's checkpoints fsync the rest)."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return                      # checkpointed and removed: the database file holds it all
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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

    @_guarded
    def chunk_sizes(self) -> ChunkSizes:
        """The sizes this store cuts files by (catalog/chunksizes.py)."""
        try:
            return recorded_sizes(self.db)
        except ValueError as exc:
            raise CatalogDamaged(self.path, str(exc)) from None

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

    def _refresh_columns(self) -> None:
        """A version 1 or 2 catalog that a writer may have upgraded since this connection opened."""
        if not (self.has_xxh3 and self.has_base):
            _, self.has_xxh3, self.has_base = self._schema_state()

    def _chunk_columns(self) -> str:
        return (f"c.id, c.size, c.codec, c.pack, c.offset, c.length, {'c.xxh3' if self.has_xxh3 else 'NULL'}, "
                f"{'c.base' if self.has_base else 'NULL'}")

    @_guarded
    def extents(self, file_id: int) -> list[Extent]:
        """The file's extents in order, each with its chain of references resolved."""
        self._refresh_columns()
        rows = [_typed(r, _EXTENT_TYPES) for r in self.db.execute(
            f"SELECT e.offset, c.size, c.id, c.codec, c.pack, c.offset, c.length, "
            f"{'c.xxh3' if self.has_xxh3 else 'NULL'}, {'c.base' if self.has_base else 'NULL'} "
            "FROM extents e JOIN chunks c ON c.id = e.chunk WHERE e.file=? ORDER BY e.seq", (file_id,))]
        bases = self._resolve({r[8] for r in rows if r[8] is not None})
        return [Extent(o, s, cid, codec, ChunkLocation(p, po, pl), x, None if b is None else bases[b])
                for o, s, cid, codec, p, po, pl, x, b in rows]

    @_guarded
    def chunk_extents(self, chunk_ids) -> dict[bytes, Extent]:
        """The named chunks that are in the catalog (offset 0), their references resolved."""
        self._refresh_columns()
        return self._resolve(set(chunk_ids), missing_ok=True)

    def _resolve(self, ids: set[bytes], *, missing_ok: bool = False) -> dict[bytes, Extent]:
        """Extents (offset 0) of these chunks and of every chunk on their chains, resolved at most
        MAX_CHAIN_HOPS references deep; a missing reference, a longer chain or a cycle is damage."""
        rows: dict[bytes, tuple] = {}
        want = set(ids)
        for _ in range(MAX_CHAIN_HOPS + 2):
            want -= rows.keys()
            if not want:
                break
            listed = list(want)
            for i in range(0, len(listed), 500):
                part = listed[i:i + 500]
                for r in self.db.execute(f"SELECT {self._chunk_columns()} FROM chunks c WHERE c.id IN "
                                         f"({','.join('?' * len(part))})", part):
                    rows[r[0]] = _typed(r, _CHUNK_TYPES)
            lost = want - rows.keys()
            if lost and not (missing_ok and lost <= ids):
                raise CatalogDamaged(self.path, f"chunk {min(lost).hex()[:16]}, the reference of another, "
                                                f"is not in the catalog")
            want = {rows[c][7] for c in want if c in rows and rows[c][7] is not None}
        else:
            raise CatalogDamaged(self.path, f"a chain of chunk references is longer than {MAX_CHAIN_HOPS}")
        built: dict[bytes, tuple[Extent, int]] = {}     # chunk -> (its extent, references below it)

        def build(cid: bytes) -> Extent:
            chain = [cid]
            while chain[-1] not in built and rows[chain[-1]][7] is not None:
                chain.append(rows[chain[-1]][7])
                if chain[-1] in chain[:-1]:
                    raise CatalogDamaged(self.path, f"chunk {cid.hex()[:16]}'s references form a cycle")
            for c in reversed(chain):
                if c not in built:
                    _, size, codec, pack, off, length, x, b = rows[c]
                    below, hops = (None, 0) if b is None else (built[b][0], built[b][1] + 1)
                    if hops > MAX_CHAIN_HOPS:
                        raise CatalogDamaged(self.path, f"chunk {c.hex()[:16]}'s chain of references is "
                                                        f"longer than {MAX_CHAIN_HOPS}")
                    built[c] = (Extent(0, size, c, codec, ChunkLocation(pack, off, length), x, below), hops)
            return built[cid][0]

        return {c: build(c) for c in ids if c in rows}

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
    def hf_revisions(self) -> dict:
        """Model name -> its Hugging Face origin (hfrows.HfRevisionRow), for the models recorded as
        hub revisions; StoreError if their tables are of a version this lmzfs does not know."""
        from lmzfs.store.catalog.hfrows import load_revisions
        return {r.model: r for r in load_revisions(self.db)}

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

    # -- tensors and chains (version 3) ------------------------------------------------------
    @_guarded
    def tensors(self, model: str | None = None) -> list[StoredTensor]:
        """Every tensor row, or one model's; none before version 3."""
        if not self.has_base and not self._schema_state()[2]:
            return []
        q = ("SELECT m.name, f.path, m.added, t.file, t.name, t.dtype, t.shape, t.offset, t.size FROM tensors t "
             "JOIN files f ON f.id = t.file JOIN models m ON m.id = f.model")
        rows = self.db.execute(q + " WHERE m.name = ? ORDER BY f.path, t.offset", (model,)) if model is not None \
            else self.db.execute(q + " ORDER BY m.name, f.path, t.offset")
        return [StoredTensor(m, p, added, TensorRow(*_typed(r, (int, str, str, str, int, int))))
                for m, p, added, *r in rows]

    @_guarded
    def chunk_base(self, chunk_id: bytes) -> bytes | None:
        """The id of the chunk's base; None for a chunk coded alone or not in the catalog."""
        if not self.has_base:
            return None
        row = self.db.execute("SELECT base FROM chunks WHERE id=?", (chunk_id,)).fetchone()
        return None if row is None else row[0]

    @_guarded
    def dependants(self, chunk_id: bytes) -> list[bytes]:
        """The chunks coded against this one."""
        if not self.has_base:
            return []
        return [r[0] for r in self.db.execute("SELECT id FROM chunks WHERE base=? ORDER BY id", (chunk_id,))]

    @_guarded
    def model_dependencies(self) -> dict[str, list[str | None]]:
        """model -> the models whose chunks its chunks are coded against (None: chunks kept only
        as references, their models removed), sorted; models without references are left out."""
        if not self.has_base:
            return {}
        base_of = dict(self.db.execute("SELECT id, base FROM chunks WHERE base IS NOT NULL"))
        wanted = base_of.keys() | set(base_of.values())
        users: dict[bytes, set[str]] = {}       # chunk -> the models whose files use it
        for cid, name in self.db.execute("SELECT e.chunk, m.name FROM extents e JOIN files f ON f.id = e.file "
                                         "JOIN models m ON m.id = f.model"):   # one pass: no index by chunk
            if cid in wanted:
                users.setdefault(cid, set()).add(name)
        out: dict[str, set[str | None]] = {}
        for cid, base in base_of.items():
            for name in users.get(cid, ()):
                others = users.get(base, set()) - {name}
                if others or not users.get(base):
                    out.setdefault(name, set()).update(others or {None})
        return {n: sorted(deps, key=lambda d: (d is None, d or "")) for n, deps in out.items()}

    # -- chunks -----------------------------------------------------------------------------
    @_guarded
    def has_chunk(self, chunk_id: bytes) -> bool:
        return self.db.execute("SELECT 1 FROM chunks WHERE id=?", (chunk_id,)).fetchone() is not None

    @_guarded
    def payload_end(self, pack_id: int) -> int:
        """Where the last record the catalog names in pack `pack_id` ends (0: it names none)."""
        return self.db.execute("SELECT COALESCE(MAX(offset + length), 0) FROM chunks WHERE pack = ?",
                               (pack_id,)).fetchone()[0]

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
