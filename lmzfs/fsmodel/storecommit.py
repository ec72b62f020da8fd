"""Commit one file of a writable mount to the store: chunked, hashed, deduplicated and encoded by
the same code as `lmz add` (write/encodefile.py), then published in one catalog transaction that
replaces the file's previous version (its references dropped) or adds it.

A checkpoint is paired with a stored model as `lmz add` pairs it (delta_plan.choose_base: tensors
of the same name, dtype and shape), and that model's paired chunks are recoded as deltas against
it in the same transaction; their old payloads stay in the packs (gc.reclaim_packs leaves packs
in use alone) until the mount reclaims dead bytes (fsmodel/reclaim.py).

Chunks a write did not touch hash to chunks already stored and are reused, not encoded again:
a write into the middle of a large stored file encodes only the chunks it touched (the chunk
plan depends on the container's header, which such a write leaves alone). The caller holds the
store's WriterLock. It writes through a pack session, as an add does.
"""
from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lmzfs.chunker import ChunkSizes
from lmzfs.store.catalog.fsrows import (EntryMeta, model_id, note_text_chunks, put_entry, record_spool_commit,
                                       replace_file_row)
from lmzfs.store.catalog.modelrows import NewFile
from lmzfs.store.add import DEFAULT_CHAIN_DEPTH
from lmzfs.store.chains.plan import choose_base
from lmzfs.store.chains.recode import ChainRecoder, RecodedBefore, record_recoded
from lmzfs.store.catalog import Catalog, failure_words
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.catalog.chunkrows import add_refs
from lmzfs.store.write.encodefile import (FileChain, FileContent, FileEncoder, FilePlan, NewChunk, Unchanged,
                                          file_tensors, insert_file_rows, insert_new_chunks, pre_encode)
from lmzfs.store.write.policy import EncodePolicy, PreEncoded
from lmzfs.store.write.session import PackSession

__all__ = ["CommittedFile", "FileContent", "FileToCommit", "commit_file", "commit_files", "pre_encode_files"]


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
    extents: tuple[tuple[int, bytes], ...] = ()          # (offset, chunk id), for a later commit's Unchanged
    hashes: dict[int, object] = field(default_factory=dict)   # offset -> SHA-256 state of the bytes before
    text_chunks: tuple[bytes, ...] = ()    # chunks it appended that zstd's slow level may make smaller


@dataclass(frozen=True)
class FileToCommit:
    model: str
    path: str
    content: FileContent
    meta: EntryMeta
    replaces: int | None
    spool_id: str | None


def commit_files(store: StorePaths, catalog: Catalog, pool: ThreadPoolExecutor, workers: int,
                 files: list[FileToCommit], sizes: ChunkSizes,
                 policy: EncodePolicy = EncodePolicy()) -> list[CommittedFile | None]:
    """Store many (small) files in one pack session and ONE catalog transaction (group commit):
    each as commit_file would, but a file whose tensors pair it with a stored model (chain
    recoding) is left out (None: the caller commits it alone). `policy`: a PreEncoded one holds
    chunks the caller coded before it took the store's lock (pre_encode)."""
    with PackSession(store, catalog, policy=policy, pool=pool, workers=workers) as session:
        encoder = FileEncoder(session, sizes)
        plans: list[tuple[FileToCommit, FilePlan, tuple]] = []
        for f in files:
            shown = f"{f.model}/{f.path}"
            if choose_base(catalog, f.model, file_tensors(f.path, shown, f.content.file, f.content.size), None):
                continue
            t = encoder.totals
            before = (t.new_chunks, t.reused_chunks + t.repeated_chunks, t.new_payload_bytes, len(t.warnings))
            plans.append((f, encoder.encode(f.content, shown), before))
        if not plans:
            return [None] * len(files)

        text = left_for_slow_text(encoder.new, policy)

        def record(tx: sqlite3.Connection) -> list[int]:
            insert_new_chunks(tx, [p for _, p, _ in plans], encoder.new)
            note_text_chunks(tx, text)
            ids = []
            for f, plan, _ in plans:
                ids.append(_publish_file(tx, f.model, f.path, plan, f.meta, f.replaces))
                if f.spool_id is not None:
                    record_spool_commit(tx, f.spool_id)
            return ids

        ids = _committed(session, record, f"{len(plans)} files", "their")
    t = encoder.totals
    ends = [b for _, _, b in plans[1:]] + [(t.new_chunks, t.reused_chunks + t.repeated_chunks, t.new_payload_bytes,
                                             len(t.warnings))]
    done = iter(CommittedFile(file_id, plan.size, plan.sha256, end[0] - before[0], end[1] - before[1],
                              end[2] - before[2], tuple(t.warnings[before[3]:end[3]]),
                              text_chunks=tuple(dict.fromkeys(c for _, c in plan.extents if c in text)))
                for file_id, (_, plan, before), end in zip(ids, plans, ends))
    picked = {id(f) for f, _, _ in plans}
    return [next(done) if id(f) in picked else None for f in files]


def pre_encode_files(pool: ThreadPoolExecutor, files: list[FileToCommit], sizes: ChunkSizes,
                     policy: EncodePolicy = EncodePolicy()) -> PreEncoded:
    """The chunks of `files` coded by `policy` before the store's lock is taken (commit_files then
    only looks them up): the policy to pass it."""
    return PreEncoded(policy.fast, policy.segments, policy.slow_text,
                      pre_encode(policy, pool, [(f.content, f"{f.model}/{f.path}") for f in files], sizes))


def commit_file(store: StorePaths, catalog: Catalog, pool: ThreadPoolExecutor, workers: int, *, model: str, path: str,
                content: FileContent, meta: EntryMeta, replaces: int | None, spool_id: str | None,
                sizes: ChunkSizes, chain_depth: int = DEFAULT_CHAIN_DEPTH,
                unchanged: Unchanged | None = None, hash_every: int = 0,
                policy: EncodePolicy = EncodePolicy()) -> CommittedFile:
    """Store `content` as `model`/`path` (replacing stored file `replaces`, if given) and its
    metadata; `pool` (of `workers` threads) encodes; `spool_id`: the spool record this commit makes
    redundant (fs_spool_commits); `chain_depth`: as `lmz add`'s, the most references a read follows;
    `unchanged`, `hash_every`: what FileEncoder.encode need not read again, and how often it keeps
    the whole-file hash's state (in the result's `hashes`) for the next commit's `unchanged`;
    `policy`: a PreEncoded one holds chunks the caller coded before it took the lock."""
    shown = f"{model}/{path}"
    index = choose_base(catalog, model, file_tensors(path, shown, content.file, content.size), None)
    with PackSession(store, catalog, policy=policy, pool=pool, workers=workers) as session:
        encoder = FileEncoder(session, sizes)
        recoder = ChainRecoder(session, chain_depth) if index is not None else None
        try:
            plan = encoder.encode(content, shown, chain=FileChain(index, recoder, path) if recoder is not None else None,
                                  unchanged=unchanged, hash_every=hash_every)
            recoded: dict = {}
            if recoder is not None:
                recoder.drain(0)
                recoded = recoder.rows
                encoder.totals.warnings.extend(recoder.warnings)
        finally:
            if recoder is not None:
                recoder.close()
        before = RecodedBefore.of(catalog, recoded)
        text = left_for_slow_text(encoder.new, policy)

        def record(tx: sqlite3.Connection) -> int:
            file_id = _publish(tx, model, path, plan, encoder.new, meta, replaces)
            refs: dict[bytes, int] = {}
            record_recoded(tx, recoded, before, refs)
            add_refs(tx, refs)
            note_text_chunks(tx, text)
            if spool_id is not None:
                record_spool_commit(tx, spool_id)
            return file_id

        file_id = _committed(session, record, f"{model}/{path}", "its")
    t = encoder.totals
    return CommittedFile(file_id, plan.size, plan.sha256, t.new_chunks, t.reused_chunks + t.repeated_chunks,
                         t.new_payload_bytes, tuple(t.warnings), len(recoded), tuple(plan.extents), plan.hashes,
                         tuple(text))


def left_for_slow_text(new: dict[bytes, NewChunk], policy: EncodePolicy) -> set[bytes]:
    """Of the chunks a commit appended, those zstd's slow level may make smaller: coded by zstd
    at its default level to half their size or less (text), by a policy that left the slow level
    out (COMMIT_POLICY). The commit names them in fs_text_chunks; a writable mount tries the slow
    level on them once it is idle (fsmodel/recodetext.py)."""
    return {cid for cid, n in new.items() if n.base is None and policy.left_for_slow_text(n.codec, n.length, n.size)}


def _publish(db: sqlite3.Connection, model: str, path: str, plan: FilePlan, new: dict[bytes, NewChunk],
             meta: EntryMeta, replaces: int | None) -> int:
    insert_new_chunks(db, [plan], new)
    return _publish_file(db, model, path, plan, meta, replaces)


def _publish_file(db: sqlite3.Connection, model: str, path: str, plan: FilePlan, meta: EntryMeta,
                  replaces: int | None) -> int:
    mid = model_id(db, model)
    file_id = replace_file_row(db, NewFile(mid, path, plan.size, meta.mtime_ns / 1e9, plan.sha256, plan.format),
                               replaces)
    # extents, and tensors so that a later `lmz add` can pair a checkpoint with this file
    add_refs(db, insert_file_rows(db, file_id, plan))
    put_entry(db, mid, path, meta)
    return file_id


def _committed(session, record, what: str, whose: str):
    """The session's commit with `record` as its transaction; a catalog error is one line saying
    that the bytes stay in the spool."""
    try:
        return session.commit(record)
    except sqlite3.Error as exc:
        raise StoreError(f"could not record {what} in the catalog ({failure_words(session.catalog.path, exc)}); "
                         f"{whose} bytes stay in the spool") from exc
