"""Where a model came from on the Hugging Face hub: its repo id, commit and refs, and the blob name
of each file, so that the mount can serve the store in the hub cache's layout (lmzfs/reader/hfview.py).

Two tables beside the catalog's own (docs/format.md, "Hugging Face tables, hf version 1"),
created by the first add that records an origin and marked by meta's `hf_version`:

- hf_revisions: one row per model that stands for a revision of a hub repo.
- hf_blobs: the blob name of a model's file as the cache named it (git SHA-1 of a small file,
  SHA-256 of an LFS file); a file without a row is named by its SHA-256.

A trigger removes a model's rows when its models row goes (`lmz rm`), so nothing older needs to
know these tables. A reader that finds an hf_version it does not know refuses the view (the
models are served as before).
"""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass, field

from lmzfs.store.layout import StoreError

HF_VERSION = 1
READABLE_HF_VERSIONS = ("1",)
REPO_TYPES = ("model", "dataset", "space")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
BLOB_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
REPO_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
REF_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")

HF_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS hf_revisions (
    model INTEGER PRIMARY KEY REFERENCES models(id),
    repo_type TEXT NOT NULL,      -- 'model', 'dataset' or 'space'
    repo_id TEXT NOT NULL,        -- 'ORG/NAME'
    commit_hash TEXT NOT NULL,    -- 40 lower-case hex digits: the snapshot's directory name
    refs TEXT NOT NULL            -- JSON list of the refs that point at it ('main', 'pr/1')
)""",
    """CREATE TABLE IF NOT EXISTS hf_blobs (
    model INTEGER NOT NULL REFERENCES models(id),
    path TEXT NOT NULL,           -- the file's path inside the model
    blob TEXT NOT NULL,           -- its blob name in the cache (40 or 64 lower-case hex digits)
    PRIMARY KEY (model, path)
) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS hf_rows_of_removed_model AFTER DELETE ON models BEGIN
    DELETE FROM hf_revisions WHERE model = OLD.id;
    DELETE FROM hf_blobs WHERE model = OLD.id;
END""",
)


@dataclass(frozen=True)
class HfOrigin:
    """What an add records: ``commit_hash`` None derives one from the model's files."""
    repo_id: str
    commit_hash: str | None = None
    refs: tuple[str, ...] = ("main",)
    blobs: dict[str, str] = field(default_factory=dict)      # path in the model -> blob name
    repo_type: str = "model"


@dataclass(frozen=True)
class HfRevisionRow:
    model: str
    model_id: int
    repo_type: str
    repo_id: str
    commit_hash: str
    refs: tuple[str, ...]
    blobs: dict[str, str]


def check_origin(origin: HfOrigin) -> None:
    if origin.repo_type not in REPO_TYPES:
        raise StoreError(f"unknown Hugging Face repo type {origin.repo_type!r}")
    if not REPO_ID_RE.fullmatch(origin.repo_id) or ".." in origin.repo_id or "--" in origin.repo_id:
        raise StoreError(f"{origin.repo_id!r} is not a Hugging Face repo id (ORG/NAME)")
    if origin.commit_hash is not None and not COMMIT_RE.fullmatch(origin.commit_hash):
        raise StoreError(f"{origin.commit_hash!r} is not a commit hash (40 lower-case hex digits)")
    for ref in origin.refs:
        if not REF_RE.fullmatch(ref) or ".." in ref:
            raise StoreError(f"{ref!r} is not a usable ref name")
    for path, blob in origin.blobs.items():
        if not BLOB_RE.fullmatch(blob):
            raise StoreError(f"{path}: {blob!r} is not a blob name")


def _hf_version(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'hf_version'").fetchone()
    return None if row is None else row[0]


def _refuse_unknown(version: str | None) -> None:
    if version is not None and version not in READABLE_HF_VERSIONS:
        raise StoreError(f"the store's Hugging Face tables are version {version}; this lmzfs knows "
                         f"versions {', '.join(READABLE_HF_VERSIONS)}")


def derived_commit(tx: sqlite3.Connection, model_id: int) -> str:
    """A stable commit name for a model that came from no hub snapshot: the SHA-1 of its paths and
    their SHA-256s, so the same files give the same snapshot directory."""
    h = hashlib.sha1(b"lmzfs model\0")
    for path, sha in tx.execute("SELECT path, sha256 FROM files WHERE model = ? ORDER BY path", (model_id,)):
        h.update(f"{path}\0{sha}\n".encode())
    return h.hexdigest()


def record_origin(tx: sqlite3.Connection, model_id: int, origin: HfOrigin) -> None:
    """Inside a write transaction: create the tables if need be and record ORIGIN for the model,
    replacing what it had; a ref it claims leaves any other revision of the same repo."""
    check_origin(origin)
    version = _hf_version(tx)
    _refuse_unknown(version)
    if version is None:
        for statement in HF_SCHEMA:
            tx.execute(statement)
        tx.execute("INSERT OR IGNORE INTO meta VALUES ('hf_version', ?)", (str(HF_VERSION),))
    commit = origin.commit_hash or derived_commit(tx, model_id)
    for other, refs in tx.execute("SELECT model, refs FROM hf_revisions WHERE repo_type = ? AND repo_id = ? "
                                  "AND model != ?", (origin.repo_type, origin.repo_id, model_id)).fetchall():
        kept = [r for r in json.loads(refs) if r not in origin.refs]
        tx.execute("UPDATE hf_revisions SET refs = ? WHERE model = ?", (json.dumps(kept), other))
    tx.execute("INSERT OR REPLACE INTO hf_revisions (model, repo_type, repo_id, commit_hash, refs) VALUES (?,?,?,?,?)",
               (model_id, origin.repo_type, origin.repo_id, commit, json.dumps(list(origin.refs))))
    tx.execute("DELETE FROM hf_blobs WHERE model = ?", (model_id,))
    tx.executemany("INSERT INTO hf_blobs (model, path, blob) VALUES (?,?,?)",
                   [(model_id, path, blob) for path, blob in sorted(origin.blobs.items())])


def model_id_of(tx: sqlite3.Connection, name: str) -> int | None:
    row = tx.execute("SELECT id FROM models WHERE name = ?", (name,)).fetchone()
    return None if row is None else row[0]


def load_revisions(db: sqlite3.Connection) -> list[HfRevisionRow]:
    """Every recorded revision, oldest model first; [] in a catalog without the tables."""
    version = _hf_version(db)
    if version is None:
        return []
    _refuse_unknown(version)
    blobs: dict[int, dict[str, str]] = {}
    for model, path, blob in db.execute("SELECT model, path, blob FROM hf_blobs"):
        blobs.setdefault(model, {})[path] = blob
    out = []
    for model_id, name, repo_type, repo_id, commit, refs in db.execute(
            "SELECT r.model, m.name, r.repo_type, r.repo_id, r.commit_hash, r.refs FROM hf_revisions r "
            "JOIN models m ON m.id = r.model ORDER BY r.model"):
        try:
            refs = tuple(json.loads(refs))
        except ValueError:
            raise StoreError(f"catalog: the Hugging Face refs of {name} are not JSON") from None
        row = HfRevisionRow(name, model_id, repo_type, repo_id, commit, refs, blobs.get(model_id, {}))
        check_origin(HfOrigin(repo_id, commit, refs, row.blobs, repo_type))
        out.append(row)
    return out
