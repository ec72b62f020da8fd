"""Commit one file of a writable mount to the store: chunked, hashed, deduplicated and encoded by
the same code as `lmz add` (add.encode_file), then published in one catalog transaction that
replaces the file's previous version (its references dropped) or adds it.

Chunks a write did not touch hash to chunks already stored and are reused, not encoded again:
a write into the middle of a large stored file encodes only the chunks it touched (the chunk
plan depends on the container's header, which such a write leaves alone). The caller holds the
store's WriterLock. Pack bytes are fsync'd before the transaction, as in an add.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Callable

from lmzfs.chunker import CHUNK_SIZE
from lmzfs.store.add import AddResult, encode_file, insert_new_chunks, insert_tensors
from lmzfs.store.catalog import Catalog
from lmzfs.store.fscatalog import EntryMeta, model_id, put_entry, remove_file_row
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.packs import PackWriter


@dataclass(frozen=True)
class CommittedFile:
    file_id: int
    size: int
    sha256: str
    new_chunks: int
    reused_chunks: int
    new_payload_bytes: int
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class FileContent:
    """The bytes to commit, as the container parser (a file object) and the chunker (pread) read them."""
    file: BinaryIO
    pread: Callable[[int, int], bytes]      # (length, offset) -> bytes
    size: int


def commit_file(store: StorePaths, catalog: Catalog, pool: ThreadPoolExecutor, workers: int, *, model: str, path: str,
                content: FileContent, meta: EntryMeta, replaces: int | None, spool_id: str | None,
                chunk_size: int = CHUNK_SIZE) -> CommittedFile:
    """Store `content` as `model`/`path` (replacing stored file `replaces`, if given) and its
    metadata; `pool` (of `workers` threads) encodes; `spool_id`: the spool record this commit makes redundant (fs_spool_commits)."""
    result = AddResult(f"{model}/{path}")
    writer = PackWriter(store, *catalog.pack_ids())
    try:
        new: dict = {}
        plan = encode_file(content.file, content.pread, content.size, f"{model}/{path}", catalog, writer, pool,
                           2 * workers + 2, fast=False, segments=False, chunk_size=chunk_size, new=new,
                           result=result, progress=lambda done: None)
        writer.sync()
        try:
            with catalog.transaction() as db:
                file_id = _publish(db, model, path, plan, new, meta, replaces, writer)
                if spool_id is not None:
                    db.execute("INSERT OR IGNORE INTO fs_spool_commits VALUES (?)", (spool_id,))
        except sqlite3.Error as exc:
            raise StoreError(f"could not record {model}/{path} in the catalog ({exc}); its bytes stay in "
                             f"the spool") from exc
    finally:
        writer.close()
    return CommittedFile(file_id, plan.size, plan.sha256, result.new_chunks, result.reused_chunks,
                         result.new_payload_bytes, tuple(result.warnings))


def _publish(db: sqlite3.Connection, model: str, path: str, plan, new: dict, meta: EntryMeta,
             replaces: int | None, writer: PackWriter) -> int:
    insert_new_chunks(db, [plan], new)
    mid = model_id(db, model)
    mtime = meta.mtime_ns / 1e9
    if replaces is not None and db.execute("SELECT 1 FROM files WHERE id = ?", (replaces,)).fetchone():
        remove_file_row(db, replaces)
        db.execute("INSERT INTO files (id, model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?,?)",
                   (replaces, mid, path, plan.size, mtime, plan.sha256, plan.format))
        file_id = replaces
    else:
        # a file stored at this path meanwhile (an `lmz add` cannot make one; an earlier commit can)
        old = db.execute("SELECT id FROM files WHERE model = ? AND path = ?", (mid, path)).fetchone()
        if old is not None:
            remove_file_row(db, old[0])
        file_id = db.execute("INSERT INTO files (model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?)",
                             (mid, path, plan.size, mtime, plan.sha256, plan.format)).lastrowid
    db.executemany("INSERT INTO extents (file, seq, offset, chunk) VALUES (?,?,?,?)",
                   [(file_id, i, off, cid) for i, (off, cid) in enumerate(plan.extents)])
    insert_tensors(db, file_id, plan)    # so a later `lmz add` can pair a checkpoint with this file
    refs: dict[bytes, int] = {}
    for _, cid in plan.extents:
        refs[cid] = refs.get(cid, 0) + 1
    db.executemany("UPDATE chunks SET refs = refs + ? WHERE id = ?", [(n, cid) for cid, n in refs.items()])
    Catalog.record_pack_ids(db, writer.pack_id, max(writer.touched))
    put_entry(db, mid, path, meta)
    return file_id
