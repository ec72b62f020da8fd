"""Commit one file of a writable mount to the store: chunked, hashed, deduplicated and encoded by
the same code as `lmz add` (add.encode_file), then published in one catalog transaction that
replaces the file's previous version (its references dropped) or adds it.

A checkpoint is paired with a stored model as `lmz add` pairs it (delta_plan.choose_base: tensors
of the same name, dtype and shape), and that model's paired chunks are recoded as deltas against
it in the same transaction; their old payloads stay in the packs for `lmz gc`, since the mount
itself keeps the packs open (gc.reclaim_packs leaves packs in use alone).

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
from lmzfs.store.add import (DEFAULT_CHAIN_DEPTH, AddResult, FileChain, RecodedBefore, encode_file, file_tensors, insert_new_chunks,
                             insert_tensors, record_recoded)
from lmzfs.store.catalog import Catalog
from lmzfs.store.chainrecode import ChainRecoder
from lmzfs.store.delta_plan import choose_base
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
    recoded_chunks: int = 0            # chunks of the base model now coded as deltas against this file


@dataclass(frozen=True)
class FileContent:
    """The bytes to commit, as the container parser (a file object) and the chunker (pread) read them."""
    file: BinaryIO
    pread: Callable[[int, int], bytes]      # (length, offset) -> bytes
    size: int


def commit_file(store: StorePaths, catalog: Catalog, pool: ThreadPoolExecutor, workers: int, *, model: str, path: str,
                content: FileContent, meta: EntryMeta, replaces: int | None, spool_id: str | None,
                chunk_size: int = CHUNK_SIZE, chain_depth: int = DEFAULT_CHAIN_DEPTH) -> CommittedFile:
    """Store `content` as `model`/`path` (replacing stored file `replaces`, if given) and its
    metadata; `pool` (of `workers` threads) encodes; `spool_id`: the spool record this commit makes
    redundant (fs_spool_commits); `chain_depth`: as `lmz add`'s, the most references a read follows."""
    shown = f"{model}/{path}"
    result = AddResult(shown)
    writer = PackWriter(store, *catalog.pack_ids())
    index = choose_base(catalog, model, file_tensors(path, shown, content.file, content.size), None)
    recoder = ChainRecoder(store, catalog, writer, pool, chain_depth, False) if index is not None else None
    try:
        new: dict = {}
        plan = encode_file(content.file, content.pread, content.size, shown, catalog, writer, pool,
                           2 * workers + 2, fast=False, segments=True, chunk_size=chunk_size, new=new,
                           result=result, progress=lambda done: None,
                           chain=FileChain(index, recoder, path) if recoder is not None else None)
        recoded: dict = {}
        if recoder is not None:
            recoder.drain(0)
            recoded = recoder.rows
            result.warnings.extend(recoder.warnings)
        writer.sync()
        before = RecodedBefore.of(catalog, recoded)
        try:
            with catalog.transaction() as db:
                file_id = _publish(db, model, path, plan, new, meta, replaces, writer)
                refs: dict[bytes, int] = {}
                record_recoded(db, recoded, before, refs)
                db.executemany("UPDATE chunks SET refs = refs + ? WHERE id = ?",
                               [(n, cid) for cid, n in refs.items() if n])
                if spool_id is not None:
                    db.execute("INSERT OR IGNORE INTO fs_spool_commits VALUES (?)", (spool_id,))
        except sqlite3.Error as exc:
            raise StoreError(f"could not record {model}/{path} in the catalog ({exc}); its bytes stay in "
                             f"the spool") from exc
    except BaseException:
        writer.discard(catalog.payload_end)    # nothing was committed: a full disk gets no fuller
        raise
    finally:
        if recoder is not None:
            recoder.close()
        writer.close()
    return CommittedFile(file_id, plan.size, plan.sha256, result.new_chunks, result.reused_chunks,
                         result.new_payload_bytes, tuple(result.warnings), len(recoded))


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
