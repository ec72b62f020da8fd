"""The writable mount's part of the catalog: what a file system holds beyond the models' files.

`lmz add` stores files; a file system also has directories (empty ones too), symlinks, each
entry's mode, owner and times, and user.* extended attributes. They live in two tables of their
own beside the version 2 schema (docs/format.md, "Writable mount tables, fs version 1"), created
the first time a writable mount opens the store and marked by meta's `fs_version`:

- fs_entries: one row per directory, symlink or file (kind), keyed by (model id, path inside the
  model; "" is the model's own directory). A file's bytes stay in files/extents; its row here only
  holds its metadata. A file or directory with no row (stored by `lmz add`) reads as the defaults.
- fs_xattrs: user.* attributes, keyed by (model id, path, name).
- fs_spool_commits: the spool records (lmzfs/fsmodel/spool.py) whose files are committed, named
  in the commit's own transaction so that a crash before the record is removed cannot commit
  it twice.

A trigger removes both tables' rows of a model when its models row goes (`lmz rm`), so nothing
that predates these tables needs to know them. Readers that do not know the tables ignore them
(the read-only mount shows the models' files as before); a writable mount refuses an fs_version
it does not know.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from lmzfs.store.catalog.modelrows import NewFile, insert_file
from lmzfs.store.layout import StoreError

FS_VERSION = 2
READABLE_FS_VERSIONS = ("1", "2")     # 1: without fs_text_chunks (a writable mount adds it)

FS_SCHEMA = """
CREATE TABLE IF NOT EXISTS fs_entries (
    model INTEGER NOT NULL REFERENCES models(id),
    path TEXT NOT NULL,           -- inside the model, "/"-separated; "" is the model's directory
    kind TEXT NOT NULL,           -- 'dir', 'file' or 'symlink'
    mode INTEGER NOT NULL,        -- permission bits (S_IMODE)
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    target BLOB,                  -- a symlink's target; NULL otherwise
    PRIMARY KEY (model, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_xattrs (
    model INTEGER NOT NULL REFERENCES models(id),
    path TEXT NOT NULL,
    name BLOB NOT NULL,           -- "user.*"
    value BLOB NOT NULL,
    PRIMARY KEY (model, path, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_spool_commits (
    spool TEXT PRIMARY KEY        -- a spool record whose file this catalog holds committed
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_text_chunks (
    id BLOB PRIMARY KEY           -- a chunk a commit coded without zstd's slow level (recodetext.py)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS fs_rows_of_removed_model AFTER DELETE ON models BEGIN
    DELETE FROM fs_entries WHERE model = OLD.id;
    DELETE FROM fs_xattrs WHERE model = OLD.id;
END;
"""

KINDS = ("dir", "file", "symlink")


@dataclass(frozen=True)
class EntryMeta:
    """What fs_entries holds of one entry."""
    kind: str
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: bytes | None = None


@dataclass(frozen=True)
class EntryRow:
    """A row of the mount's tables: the entry it belongs to, by model and path inside it."""
    model: str
    path: str


@dataclass(frozen=True)
class FsEntryRow(EntryRow):
    meta: EntryMeta


@dataclass(frozen=True)
class XattrRow(EntryRow):
    name: bytes
    value: bytes


def ensure_fs_schema(db: sqlite3.Connection) -> None:
    """Create the tables (a catalog without them gets them, marked fs_version 2; one of version 1
    gets the table version 2 adds); refuse an fs_version this code does not know. Call outside a
    transaction, under the writer lock."""
    row = db.execute("SELECT value FROM meta WHERE key = 'fs_version'").fetchone()
    if row is not None and row[0] not in READABLE_FS_VERSIONS:
        raise StoreError(f"the store's writable-mount tables are version {row[0]}; this lmzfs knows "
                         f"versions {', '.join(READABLE_FS_VERSIONS)}")
    if row is None or row[0] != str(FS_VERSION):
        db.execute("BEGIN IMMEDIATE")     # not executescript, which commits on its own
        try:
            for statement in _statements(FS_SCHEMA):
                db.execute(statement)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('fs_version', ?)", (str(FS_VERSION),))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


def _statements(script: str) -> list[str]:
    """The statements of a script (triggers hold semicolons inside BEGIN ... END)."""
    out, current = [], ""
    for line in script.splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out


def has_fs_tables(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fs_entries'").fetchone() is not None


def load_entries(db: sqlite3.Connection) -> list[FsEntryRow]:
    if not has_fs_tables(db):
        return []
    rows = db.execute("SELECT m.name, e.path, e.kind, e.mode, e.uid, e.gid, e.atime_ns, e.mtime_ns, e.ctime_ns, "
                      "e.target FROM fs_entries e JOIN models m ON m.id = e.model ORDER BY m.name, e.path")
    out = []
    for name, path, kind, *rest in rows:
        if kind not in KINDS:
            raise StoreError(f"catalog: entry {name}/{path} has the unknown kind {kind!r}")
        out.append(FsEntryRow(name, path, EntryMeta(kind, *rest)))
    return out


def load_xattrs(db: sqlite3.Connection) -> list[XattrRow]:
    if not has_fs_tables(db):
        return []
    return [XattrRow(*r) for r in db.execute(
        "SELECT m.name, x.path, x.name, x.value FROM fs_xattrs x JOIN models m ON m.id = x.model")]


# -- inside a write transaction ---------------------------------------------------------------

def model_id(db: sqlite3.Connection, name: str) -> int:
    row = db.execute("SELECT id FROM models WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise StoreError(f"model {name!r} is no longer in the store")
    return row[0]


def put_entry(db: sqlite3.Connection, model: int, path: str, meta: EntryMeta) -> None:
    db.execute("INSERT OR REPLACE INTO fs_entries VALUES (?,?,?,?,?,?,?,?,?,?)",
               (model, path, meta.kind, meta.mode, meta.uid, meta.gid, meta.atime_ns, meta.mtime_ns,
                meta.ctime_ns, meta.target))


def note_text_chunks(db: sqlite3.Connection, chunk_ids) -> None:
    """Inside a commit's transaction: chunks it coded without zstd's slow level (fs_text_chunks)."""
    db.executemany("INSERT OR IGNORE INTO fs_text_chunks VALUES (?)", [(c,) for c in chunk_ids])


def forget_text_chunks(db: sqlite3.Connection, chunk_ids) -> None:
    db.executemany("DELETE FROM fs_text_chunks WHERE id = ?", [(c,) for c in chunk_ids])


def named_text_chunks(db: sqlite3.Connection) -> list[bytes]:
    """The chunks fs_text_chunks names (a commit coded them without zstd's slow level); none in a
    catalog without the table (no writable mount of fs version 2 opened it)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fs_text_chunks'").fetchone() is None:
        return []
    return [bytes(r[0]) for r in db.execute("SELECT id FROM fs_text_chunks")]


def delete_entry(db: sqlite3.Connection, model: int, path: str) -> None:
    db.execute("DELETE FROM fs_entries WHERE model = ? AND path = ?", (model, path))
    db.execute("DELETE FROM fs_xattrs WHERE model = ? AND path = ?", (model, path))


def put_xattr(db: sqlite3.Connection, model: int, path: str, name: bytes, value: bytes) -> None:
    db.execute("INSERT OR REPLACE INTO fs_xattrs VALUES (?,?,?,?)", (model, path, name, value))


def delete_xattr(db: sqlite3.Connection, model: int, path: str, name: bytes) -> None:
    db.execute("DELETE FROM fs_xattrs WHERE model = ? AND path = ? AND name = ?", (model, path, name))


def _below(path: str) -> tuple[str, tuple]:
    """A WHERE clause for `path` and everything under it (no LIKE: names may hold % and _)."""
    if path == "":
        return "1", ()
    return "(path = ? OR substr(path, 1, ?) = ?)", (path, len(path) + 1, path + "/")


def move_subtree(db: sqlite3.Connection, model: int, old: str, new_model: int, new: str) -> None:
    """Rename `old` (a file or a directory and everything below it) to `new`, in fs_entries,
    fs_xattrs and files alike."""
    where, args = _below(old)
    cut = len(old) + 1
    for table in ("fs_entries", "fs_xattrs", "files"):
        db.execute(f"UPDATE {table} SET model = ?, path = ? || substr(path, ?) WHERE model = ? AND {where}",
                   (new_model, new, cut, model, *args))


def remove_file_row(db: sqlite3.Connection, file_id: int) -> None:
    """Drop a stored file: its extents' references, its extents and tensors, its files row."""
    db.execute("UPDATE chunks SET refs = refs - (SELECT COUNT(*) FROM extents e WHERE e.file = ? AND e.chunk = chunks.id) "
               "WHERE id IN (SELECT chunk FROM extents WHERE file = ?)", (file_id, file_id))
    db.execute("DELETE FROM extents WHERE file = ?", (file_id,))
    db.execute("DELETE FROM tensors WHERE file = ?", (file_id,))
    db.execute("DELETE FROM files WHERE id = ?", (file_id,))


def replace_file_row(db: sqlite3.Connection, f: NewFile, replaces: int | None) -> int:
    """Inside a commit's transaction: a committed file's row, replacing stored file `replaces`
    (keeping its id) or, failing that, whatever file the model holds at that path (an earlier
    commit can have stored one meanwhile; an `lmz add` cannot). Returns the file's id."""
    if replaces is not None and db.execute("SELECT 1 FROM files WHERE id = ?", (replaces,)).fetchone():
        remove_file_row(db, replaces)
        db.execute("INSERT INTO files (id, model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?,?)",
                   (replaces, f.model, f.path, f.size, f.mtime, f.sha256, f.format))
        return replaces
    old = db.execute("SELECT id FROM files WHERE model = ? AND path = ?", (f.model, f.path)).fetchone()
    if old is not None:
        remove_file_row(db, old[0])
    return insert_file(db, f)


def files_below(db: sqlite3.Connection, model: int, path: str) -> list[int]:
    where, args = _below(path)
    return [r[0] for r in db.execute(f"SELECT id FROM files WHERE model = ? AND {where}", (model, *args))]


def remove_subtree(db: sqlite3.Connection, model: int, path: str) -> None:
    """Remove `path` and everything below it: files (with their references), entries, xattrs."""
    for file_id in files_below(db, model, path):
        remove_file_row(db, file_id)
    where, args = _below(path)
    db.execute(f"DELETE FROM fs_entries WHERE model = ? AND {where}", (model, *args))
    db.execute(f"DELETE FROM fs_xattrs WHERE model = ? AND {where}", (model, *args))


def spool_committed(db: sqlite3.Connection, spool_id: str) -> bool:
    if not has_fs_tables(db):
        return False
    return db.execute("SELECT 1 FROM fs_spool_commits WHERE spool = ?", (spool_id,)).fetchone() is not None


def forget_spool_commit(db: sqlite3.Connection, spool_id: str) -> None:
    db.execute("DELETE FROM fs_spool_commits WHERE spool = ?", (spool_id,))


def spool_commits(db: sqlite3.Connection) -> set[str]:
    """Every spool record id a commit named (fs_spool_commits)."""
    if not has_fs_tables(db):
        return set()
    return {row[0] for row in db.execute("SELECT spool FROM fs_spool_commits")}


def forget_spool_commits(db: sqlite3.Connection, spool_ids: set[str]) -> None:
    db.executemany("DELETE FROM fs_spool_commits WHERE spool = ?", [(s,) for s in sorted(spool_ids)])


# -- models, as a writable mount makes, renames and removes them ------------------------------------
def model_names(db: sqlite3.Connection) -> list[str]:
    return [name for (name,) in db.execute("SELECT name FROM models")]


def models_by_id(db: sqlite3.Connection) -> list[tuple[int, str]]:
    """(id, name) of every model."""
    return db.execute("SELECT id, name FROM models").fetchall()


def rename_model(db: sqlite3.Connection, model: int, name: str) -> None:
    db.execute("UPDATE models SET name = ? WHERE id = ?", (name, model))


def delete_model(db: sqlite3.Connection, model: int) -> None:
    """Its fs rows go with it (a trigger); its files are the caller's to remove first."""
    db.execute("DELETE FROM models WHERE id = ?", (model,))


def delete_model_named(db: sqlite3.Connection, name: str) -> None:
    db.execute("DELETE FROM models WHERE name = ?", (name,))


def record_spool_commit(db: sqlite3.Connection, spool_id: str) -> None:
    """Inside a commit's transaction: the spool record it makes redundant."""
    db.execute("INSERT OR IGNORE INTO fs_spool_commits VALUES (?)", (spool_id,))


# -- what may be a file's holes (fsmodel/holes.py): chunks that coded to almost nothing ----------
def small_coded_extents(db: sqlite3.Connection, file_id: int, min_size: int,
                        ratio: int) -> list[tuple[int, int, bytes]]:
    """(offset, plain size, chunk id) of the file's extents whose chunk is at least `min_size`
    bytes and coded `ratio` times smaller or more."""
    return db.execute("SELECT e.offset, c.size, c.id FROM extents e JOIN chunks c ON c.id = e.chunk "
                      "WHERE e.file = ? AND c.size >= ? AND c.length * ? <= c.size ORDER BY e.seq",
                      (file_id, min_size, ratio)).fetchall()


def small_coded_chunks(db: sqlite3.Connection, min_size: int, ratio: int) -> list[tuple[bytes, int]]:
    """(id, plain size) of every chunk of at least `min_size` bytes coded `ratio` times smaller or more."""
    return db.execute("SELECT id, size FROM chunks WHERE size >= ? AND length * ? <= size",
                      (min_size, ratio)).fetchall()


def extents_of_chunks(db: sqlite3.Connection, chunk_ids: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    """(file, offset, plain size, chunk id) of every extent of these chunks."""
    out: list[tuple[int, int, int, bytes]] = []
    for start in range(0, len(chunk_ids), 500):
        batch = chunk_ids[start:start + 500]
        out += db.execute("SELECT e.file, e.offset, c.size, c.id FROM extents e JOIN chunks c ON c.id = e.chunk "
                          f"WHERE e.chunk IN ({','.join('?' * len(batch))})", batch).fetchall()
    return out
