"""The models a damaged catalog file still yields, for `lmz verify --repair` to merge beside the
copy it restores.

A copy is older than the catalog it copies when the damage struck before the newest commit's copy
was written, or when the same page is damaged in the catalog and in its newest copy: the models
added since then are named only by the damaged file (or a newer, damaged copy). What such a file
still yields of a model (its row, its files' rows, their extents and tensors) is read here, model
by model, so that damage elsewhere in the file costs nothing it does not touch. Nothing read here
is trusted: repair takes a model back only when every chunk its extents name decodes from the
packs and every file's bytes, so assembled, have the SHA-256 its row records.
"""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from lmzfs.store.catalog.db import TensorRow
from lmzfs.store.catalog.modelrows import ExtentRow, NewFile, insert_extents, insert_file, insert_tensors
from lmzfs.store.catalog.uri import READ_ERRORS


@dataclass(frozen=True)
class SalvagedTensor:
    name: str
    dtype: str
    shape: str
    offset: int
    size: int


@dataclass
class SalvagedFile:
    path: str
    size: int
    mtime: float
    sha256: str
    format: str
    extents: list[tuple[int, bytes]] = field(default_factory=list)     # (plain offset, chunk id), in order
    tensors: list[SalvagedTensor] = field(default_factory=list)


@dataclass
class SalvagedModel:
    model_id: int
    name: str
    added: float
    source: str
    files: list[SalvagedFile] = field(default_factory=list)

    def chunks(self) -> set[bytes]:
        return {cid for f in self.files for _, cid in f.extents}


def tolerant_text(raw: bytes) -> str | bytes:
    """A damaged catalog's text as str where it is UTF-8, else its bytes, so that one damaged value
    fails the type check of its row (which is then left out) instead of every read of the file."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


# A scratch copy's folder, made beside the file it copies (in the store: on the disk that holds
# the catalog, not on a /tmp that may be too small for it); repair_catalog removes any that a
# process killed while salvaging left.
SCRATCH_PREFIX = ".salvage-"


def remove_scratch(folder: Path) -> None:
    """The scratch folders salvages killed before their end left in `folder` (called with the
    store's lock held: no salvage of this store runs meanwhile)."""
    for scratch in folder.glob(SCRATCH_PREFIX + "*"):
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def scratch_open(path: Path) -> Iterator[sqlite3.Connection | None]:
    """The file (with its -wal) opened from a scratch copy, so that nothing SQLite writes when it
    opens one lands beside a damaged file kept for inspection; None if it cannot be opened."""
    try:
        made = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=path.parent)
    except OSError:
        yield None
        return
    with made as scratch:
        copy = Path(scratch) / "catalog.sqlite"
        try:
            shutil.copyfile(path, copy)
            wal = path.with_name(path.name + "-wal")
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            db = sqlite3.connect(copy, isolation_level=None)
            db.text_factory = tolerant_text
        except (OSError, *READ_ERRORS):
            yield None
            return
        try:
            yield db
        finally:
            db.close()


def salvage_models(path: Path | None, *, skip_ids: set[int]) -> list[SalvagedModel]:
    """Every model of the file whose id is not in `skip_ids` (the restored copy's models: a model
    of the same id is the same model, whatever name damage gave it) and whose rows all read, with
    values of the types the schema gives them. A model whose rows cannot all be read is left out."""
    if path is None or not path.exists():
        return []
    with scratch_open(path) as db:
        if db is None:
            return []
        try:
            heads = db.execute("SELECT id, name, added, source FROM models").fetchall()
        except READ_ERRORS:
            return []
        out = []
        for row in heads:
            if not _typed(row, (int, str, (int, float), str)) or row[0] in skip_ids:
                continue
            try:
                model = _model(db, SalvagedModel(*row))
            except READ_ERRORS:
                continue
            if model is not None:
                out.append(model)
        return out


def _model(db: sqlite3.Connection, model: SalvagedModel) -> SalvagedModel | None:
    # NOT INDEXED: an index page may be the damaged one while the table's own pages still read
    files = db.execute("SELECT id, path, size, mtime, sha256, format FROM files NOT INDEXED WHERE model = ? "
                       "ORDER BY path",
                       (model.model_id,)).fetchall()
    has_tensors = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tensors'").fetchone()
    for fid, *rest in files:
        if not _typed((fid, *rest), (int, str, int, (int, float), str, str)):
            return None
        f = SalvagedFile(*rest)
        for row in db.execute("SELECT offset, chunk FROM extents NOT INDEXED WHERE file = ? ORDER BY seq", (fid,)):
            if not _typed(row, (int, bytes)) or len(row[1]) != 32:
                return None
            f.extents.append((row[0], row[1]))
        if has_tensors:
            try:        # what chain pairing reads: a model comes back without them if they are damaged
                for row in db.execute("SELECT name, dtype, shape, offset, size FROM tensors NOT INDEXED "
                                      "WHERE file = ?", (fid,)):
                    if _typed(row, (str, str, str, int, int)):
                        f.tensors.append(SalvagedTensor(*row))
            except READ_ERRORS:
                f.tensors.clear()
        model.files.append(f)
    return model


def _typed(row: tuple, types: tuple) -> bool:
    return len(row) == len(types) and all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(row, types))


def insert_recovered(tx: sqlite3.Connection, model: SalvagedModel) -> None:
    """Inside repair's transaction: a recovered model's rows, under its old id (no model of the
    restored copy has it). Chunk rows and reference counts are the caller's."""
    tx.execute("INSERT INTO models (id, name, added, source) VALUES (?,?,?,?)",
               (model.model_id, model.name, model.added, model.source))
    for f in model.files:
        fid = insert_file(tx, NewFile(model.model_id, f.path, f.size, f.mtime, f.sha256, f.format))
        insert_extents(tx, (ExtentRow(fid, i, off, cid) for i, (off, cid) in enumerate(f.extents)))
        insert_tensors(tx, (TensorRow(fid, t.name, t.dtype, t.shape, t.offset, t.size) for t in f.tensors))


@dataclass(frozen=True)
class SetAsideGuard:
    """What the damaged catalogs that `lmz verify --repair` set aside still name: gc and compact
    keep these chunks and leave these packs as they are until a human lets them go
    (`lmz gc --forget-set-aside`), since a model they name may yet be brought back from them."""
    files: tuple[Path, ...]
    chunks: frozenset[bytes]
    packs: frozenset[int]
    everything: bool = False        # a file that yields nothing readable: every pack is kept

    def keeps(self, pack_id: int) -> bool:
        return self.everything or pack_id in self.packs


def set_aside_files(catalog: Path) -> list[Path]:
    return sorted(p for p in catalog.parent.glob(catalog.name + ".damaged-*") if not p.name.endswith("-wal"))


def named_chunks(path: Path) -> set[bytes] | None:
    """Every chunk id a set-aside catalog still names, in its chunk rows or its extents; None if
    neither can be read at all."""
    with scratch_open(path) as db:
        if db is None:
            return None
        found: set[bytes] = set()
        readable = False
        for query in ("SELECT id FROM chunks NOT INDEXED", "SELECT chunk FROM extents NOT INDEXED"):
            try:
                for (cid,) in db.execute(query):
                    readable = True
                    if isinstance(cid, bytes) and len(cid) == 32:
                        found.add(cid)
            except READ_ERRORS:
                pass        # what was read before the damage stands
        return found if readable else None


def set_aside_guard(catalog: Path, records: dict[bytes, list], live: set[bytes]) -> SetAsideGuard | None:
    """The guard for the set-aside files beside `catalog` (None: there are none). `records`: each
    chunk id's records in the packs (check.index_packs); `live`: the chunks the live catalog
    keeps, whose records need no guard."""
    files = set_aside_files(catalog)
    if not files:
        return None
    chunks: set[bytes] = set()
    everything = False
    for f in files:
        named = named_chunks(f)
        if named is None:
            everything = True
        else:
            chunks |= named
    chunks -= live
    packs = {loc.pack for cid in chunks for loc in records.get(cid, ())}
    return SetAsideGuard(tuple(files), frozenset(chunks), frozenset(packs), everything)


def forget_set_aside(catalog: Path) -> list[Path]:
    """Remove the set-aside damaged catalogs (a human has looked, or given them up)."""
    files = set_aside_files(catalog)
    for f in files:
        f.with_name(f.name + "-wal").unlink(missing_ok=True)
        f.unlink()
    return files
