"""`lmz verify --repair`: put back a sound catalog when the live one is damaged or missing.

Under the writer lock: judge the live catalog (catalogcheck.diagnose); if it is not sound, rename
it (with its -wal) to ``catalog.sqlite.damaged-TIMESTAMP`` for inspection, install the newest copy
that checks clean, and re-derive from the packs what the copy cannot know: where each chunk lies
now (a gc since the copy moved records), how many extents use it. A model the copy does not hold
(added after it was written) is taken back from the rows the damaged catalog, or a newer damaged
copy, still yields (catalog/salvage.py), when every chunk its extents name decodes from the packs
and every file so assembled has the SHA-256 its row records. A model is reported lost, by name,
only when no copy and no surviving row can bring it back. A second run finds a sound catalog and
changes nothing.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmzfs.store.catalog import Catalog, free_if_full
from lmzfs.store.catalog.check import PackIndex, broken_models, diagnose, index_packs
from lmzfs.store.catalog.copies import DIGEST_KEY, due_marker, write_copy
from lmzfs.store.layout import FILE_MODE, StoreError, StorePaths, fsync_dir, fsync_path
from lmzfs.store.lock import WriterLock
from lmzfs.store.names import validate_model_name
from lmzfs.store.catalog.payloadsearch import place_chunks, salvage_chunk_rows
from lmzfs.store.catalog.salvage import (SalvagedModel, insert_recovered, remove_scratch, salvage_models,
                                         tolerant_text)
from lmzfs.store.catalog.uri import READ_ERRORS, sqlite_uri


@dataclass
class RepairReport:
    problem: str | None = None          # what was wrong with the live catalog; None: it was sound
    restored_from: Path | None = None
    damaged_kept: Path | None = None
    relocated_chunks: int = 0
    lost_models: list[str] = field(default_factory=list)      # named, but not recoverable
    recovered_models: list[str] = field(default_factory=list)  # only a damaged file named them; taken back
    unnamed_losses: bool = False        # the damaged catalog's model list could not be read
    copy_written: bool = False          # a sound catalog that had no copy of its generation got one

    @property
    def recovered(self) -> bool:
        return not self.lost_models and not self.unnamed_losses


def repair_catalog(store: StorePaths) -> RepairReport:
    store.check_format()
    with WriterLock(store.lock):
        remove_scratch(store.root)
        verdict = diagnose(store)
        report = RepairReport(verdict.problem)
        if verdict.sound:
            if not any(check.clean and check.generation == verdict.live.generation for _, check in verdict.copies):
                _write_copy_of_live(store)
                report.copy_written = True
            return report
        clean = [(c, check) for c, check in verdict.copies if check.clean]
        if not clean:
            raise StoreError(f"catalog {store.catalog} is damaged ({verdict.problem}) and no copy of it checks "
                             f"clean ({len(verdict.copies)} found); it is left as it is")
        names_before = _salvage_model_names(store.catalog)
        copy, _ = clean[0]
        newer_copies = [c.path for c, _ in verdict.copies if c.generation > copy.generation]
        # Nothing can be newer than this copy if it is the newest one there is and no commit was
        # left without its copy; else name what the damaged catalog and newer copies still yield.
        complete = copy.generation == verdict.copies[0][0].generation and not due_marker(store.catalog).exists()
        for newer, _ in verdict.copies:
            if newer.generation > copy.generation:
                names = _salvage_model_names(newer.path)
                if names is not None:
                    names_before = (names_before or set()) | names
        # the copy is written out in full before the damaged file is moved: a full disk stops the
        # repair with the store as it was, never without a catalog
        staged = _stage(copy.path, store)
        report.damaged_kept = _set_aside(store)
        report.restored_from = copy.path
        os.replace(staged, store.catalog)
        fsync_dir(store.root)
        try:
            _rederive(store, report, None if complete else newer_copies)
        except StoreError as exc:       # e.g. a disk that the restored file filled
            kept = f" (the damaged file is kept as {report.damaged_kept.name})" if report.damaged_kept else ""
            raise StoreError(f"restored the catalog from {copy.path.name}{kept}, but could not bring it up "
                             f"to date with the packs: {exc}; run `lmz verify --repair` again") from exc
        if complete:
            pass        # the restored copy holds the last commit: a name only the damaged file yields is damage
        elif names_before is None:
            report.unnamed_losses = True
        else:
            catalog = Catalog(store.catalog, readonly=True)
            try:
                now = {m.name for m in catalog.models()}
            finally:
                catalog.close()
            report.lost_models = sorted(set(report.lost_models) | (names_before - now))
        return report


def _write_copy_of_live(store: StorePaths) -> None:
    db = sqlite3.connect(store.catalog, isolation_level=None)
    try:
        write_copy(db, store.catalog)
    finally:
        db.close()


def _salvage_model_names(path: Path) -> set[str] | None:
    """The model names a damaged catalog still yields, or None if its model list is unreadable."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(sqlite_uri(path, read_only=True), uri=True, isolation_level=None)
        db.text_factory = tolerant_text
        try:
            return {r[0] for r in db.execute("SELECT name FROM models") if isinstance(r[0], str)}
        finally:
            db.close()
    except READ_ERRORS:
        return None


def _set_aside(store: StorePaths) -> Path | None:
    """Rename the damaged catalog (and its write-ahead log) out of the way; None if it is missing."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = store.catalog.with_name(f"{store.catalog.name}.damaged-{stamp}")
    n = 1
    while kept.exists():
        n += 1
        kept = store.catalog.with_name(f"{store.catalog.name}.damaged-{stamp}-{n}")
    moved = None
    if store.catalog.exists():
        os.replace(store.catalog, kept)
        moved = kept
    wal = store.catalog.with_name(store.catalog.name + "-wal")
    if wal.exists() and wal.stat().st_size:     # frames not yet checkpointed belong to the damaged file
        os.replace(wal, kept.with_name(kept.name + "-wal"))
    wal.unlink(missing_ok=True)
    store.catalog.with_name(store.catalog.name + "-shm").unlink(missing_ok=True)
    fsync_dir(store.root)
    return moved


def _stage(copy: Path, store: StorePaths) -> Path:
    """The copy, written out in full (fsync'd) beside the catalog, ready to be renamed over it."""
    tmp = store.catalog.with_name(store.catalog.name + ".restore-tmp")
    try:
        for suffix in ("-journal", "-wal", "-shm"):    # a killed repair's: they belong to no file now
            tmp.with_name(tmp.name + suffix).unlink(missing_ok=True)
        shutil.copyfile(copy, tmp)
        os.chmod(tmp, FILE_MODE)            # the owner's alone, as every store file
        # in WAL mode before it is renamed: switching it there afterwards writes through a rollback
        # journal, which a kill would leave hot beside the catalog, where no read-only open can
        # roll it back and every command would stop
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
        finally:
            db.close()
        fsync_path(tmp)
    except (OSError, sqlite3.Error) as exc:
        tmp.unlink(missing_ok=True)
        free = free_if_full(store.catalog)
        full = "" if free is None else f" (the disk holding the store is full: {free} bytes free)"
        raise StoreError(f"could not write out copy {copy.name} to restore the catalog: "
                         f"{getattr(exc, 'strerror', None) or exc}{full}; nothing was changed") from exc
    return tmp


def _rederive(store: StorePaths, report: RepairReport, newer_copies: list[Path] | None) -> None:
    """Point chunk rows at the payloads that serve them now (payloadsearch: the copy may be older
    than a recode, a rewrite or a gc), take back the models that only the damaged catalog (or a
    newer, damaged copy) still names where the packs bear them out, drop models no pack can
    serve, recount references, and commit (which writes a copy of the repaired catalog)."""
    catalog = Catalog(store.catalog)        # upgrades a copy of a version 1 catalog
    try:
        index = index_packs(store)
        present = {m.name: m.id for m in catalog.models()}
        salvaged: dict[int, SalvagedModel] = {}
        if newer_copies is not None:
            for source in ([report.damaged_kept] if report.damaged_kept else []) + newer_copies:
                for m in salvage_models(source, skip_ids=set(present.values())):
                    if m.name not in present and _valid_name(m.name):
                        salvaged.setdefault(m.model_id, m)
        placement = place_chunks(store, catalog.db, salvage_chunk_rows(report.damaged_kept), index,
                                 list(salvaged.values()))
        report.relocated_chunks = len(placement.changed)
        report.recovered_models = sorted(m.name for m in placement.recovered)
        report.lost_models = sorted(m for m in broken_models(catalog.db, placement.lost) if not m.startswith("("))
        with catalog.transaction() as db:
            db.executemany("UPDATE chunks SET codec = ?, pack = ?, offset = ?, length = ? WHERE id = ?",
                           [(r.codec, r.pack, r.offset, r.length, cid)
                            for cid, r in placement.changed.items()])
            if catalog.has_base:
                db.executemany("UPDATE chunks SET base = ? WHERE id = ?",
                               [(r.base, cid) for cid, r in placement.changed.items()])
            # references made since the copy, which its chunks now decode against, and the
            # chunks of the models taken back (refs below)
            db.executemany("INSERT INTO chunks (id, size, codec, pack, offset, length, refs, xxh3, base) "
                           "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                           [(cid, b.size, b.row.codec, b.row.pack, b.row.offset, b.row.length, b.xxh3,
                             b.row.base if catalog.has_base else None)
                            for cid, b in placement.brought_back.items()
                            if catalog.has_base or b.row.base is None])
            for model in placement.recovered:
                insert_recovered(db, model)
            for name in report.lost_models:
                row = db.execute("SELECT id FROM models WHERE name = ?", (name,)).fetchone()
                db.execute("DELETE FROM extents WHERE file IN (SELECT id FROM files WHERE model = ?)", (row[0],))
                db.execute("DELETE FROM files WHERE model = ?", (row[0],))
                db.execute("DELETE FROM models WHERE id = ?", (row[0],))
            db.execute("DELETE FROM files WHERE model NOT IN (SELECT id FROM models)")
            db.execute("DELETE FROM extents WHERE file NOT IN (SELECT id FROM files)")
            _recount_refs(db, catalog.has_base)
            db.execute("DELETE FROM meta WHERE key = ?", (DIGEST_KEY,))
            if index.packs:
                # ids of packs on disk are taken, whatever the copy remembers
                Catalog.record_pack_ids(db, *_last_pack(db, index))
    finally:
        catalog.close()


def _valid_name(name: str) -> bool:
    try:
        validate_model_name(name)
    except StoreError:
        return False
    return True


def _recount_refs(db: sqlite3.Connection, has_base: bool) -> None:
    """A chunk's refs: the extents that use it plus the chunks coded against it (docs/format.md),
    so that gc never collects a reference while a dependant needs it."""
    dependants = "(SELECT COUNT(*) FROM chunks d WHERE d.base = chunks.id)" if has_base else "0"
    db.execute(f"UPDATE chunks SET refs = (SELECT COUNT(*) FROM extents WHERE chunk = chunks.id) + {dependants}")


def _last_pack(db: sqlite3.Connection, index: PackIndex) -> tuple[int | None, int]:
    row = db.execute("SELECT value FROM meta WHERE key = 'last_pack'").fetchone()
    last = int(row[0]) if row and row[0].isdigit() and int(row[0]) in index.packs else None
    return last, max(index.packs)

