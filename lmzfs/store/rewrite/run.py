"""What the offline rewrite passes (`lmz rewrite compact|recode|delta|anchor`) share: the writer
lock and catalog they run under, the measure of a store's bytes before and after, and the
atomic switch of chunk rows to new payloads.

A pass never touches a plain byte, only how chunks are stored: a chunk's id is its plain bytes.
Order of durability, as for `lmz add`: every new payload is appended to a pack and fsync'd first;
then ONE catalog transaction points the chunks' rows at them (each UPDATE guarded by the row's old
location, so a row that is not as the pass read it stops the pass with nothing changed). A pass
killed before that commit leaves the previous state and, in the packs, dead bytes that the next
`lmz rewrite compact` or `lmz gc` reclaims; killed after it, the new state. Each new payload is
decoded and checked against the chunk's SHA-256 id before it is appended, so a codec fault can
cost a pass its saving but never a served byte.

Readers keep reading throughout: a file opened before the commit reads the old payloads, which
stay in their packs (and a pack unlinked by compact stays readable through the descriptor its
reader holds); a file opened after reads the new ones.
"""
from __future__ import annotations

import hashlib
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from lmzfs.codecs import CodecError, decode_chunk
from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.catalog.chunkrows import RowChange, add_ref, switch_payload
from lmzfs.store.catalog.stats import live_payload_bytes
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.packbackend import LocalPacks
from lmzfs.store.rewrite.scan import StoredChunk
from lmzfs.store.write.session import PackSession

Progress = Callable[[int, int], None]     # (bytes done, bytes total)

# Decoded chunks the pass's own reader keeps: a reference several chunks are coded against is
# decoded once while they are recoded one after another.
READ_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class StoreBytes:
    payload: int     # payload bytes of the live chunks (refs > 0), as the catalog records them
    packs: int       # bytes of the pack files on disk, live and dead


@dataclass
class RewriteResult:
    name: str                           # the pass: "compact", "recode", "delta", "anchor"
    before: StoreBytes
    after: StoreBytes
    chunks_examined: int = 0
    chunks_changed: int = 0             # rows pointed at a new payload (compact: moved)
    chunks_dropped: int = 0             # compact: rows of chunks nothing uses any more
    packs_written: int = 0
    packs_deleted: int = 0
    base: str | None = None             # delta: the model the chunks were coded against
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def packs_on_disk(store: StorePaths) -> dict[int, int]:
    """pack id -> its size in bytes, for every pack file in the store."""
    return LocalPacks(store).list_packs()


def measure(store: StorePaths, catalog: Catalog) -> StoreBytes:
    return StoreBytes(live_payload_bytes(catalog.db), sum(packs_on_disk(store).values()))


@contextmanager
def writing(store: StorePaths) -> Iterator[Catalog]:
    """The store's catalog, opened for writing under the writer lock, for the length of a pass."""
    store.check_format()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        try:
            yield catalog
        except sqlite3.Error as exc:
            # e.g. a full disk: the transaction rolled back, so the store is as it was
            raise StoreError(f"the rewrite could not be recorded in the catalog ({exc}); nothing "
                             f"changed") from exc
        finally:
            catalog.close()


@contextmanager
def store_reader(store: StorePaths) -> Iterator[ChunkSource]:
    """The pass's own reader of chunks: a small cache, every read checked as the mount's are."""
    source = ChunkSource(LocalPacks(store), READ_CACHE_BYTES)
    try:
        yield source
    finally:
        source.close()


def plain_bytes(source: ChunkSource, extent: Extent) -> bytes:
    """A chunk's plain bytes, checked as every read is; a damaged chunk stops the pass."""
    try:
        return source.chunk_bytes(extent)
    except CorruptChunk as exc:
        raise StoreError(f"the rewrite stopped and nothing changed: {exc.strerror}; run `lmz verify`") from exc


@dataclass(frozen=True)
class Recoding:
    """A pass's new payload for a chunk."""
    payload: bytes
    codec: str
    base: Extent | None = None          # the chunk it is coded against; None: coded alone


@dataclass(frozen=True)
class RecodeJob:
    chunk: StoredChunk
    reference: Extent | None = None     # a chunk the pass may code it against


# What a pass makes of one chunk: its plain bytes and, if the job names a reference, the
# reference's plain bytes in; a new payload out, or None to leave the chunk as it is.
Encode = Callable[[RecodeJob, bytes, bytes | None], Recoding | None]


def _checked(job: RecodeJob, encode: Encode, source: ChunkSource) -> tuple[RecodeJob, Recoding | None]:
    e = job.chunk.extent
    plain = plain_bytes(source, e)
    ref = plain_bytes(source, job.reference) if job.reference is not None else None
    got = encode(job, plain, ref)
    if got is not None:
        if got.base is not None and got.base is not job.reference:
            raise AssertionError("a pass coded a chunk against a reference its job does not name")
        fault = decode_fault(got.payload, e, ref if got.base is not None else None)
        if fault is not None:
            raise StoreError(f"the rewrite stopped and nothing changed: chunk {e.chunk_id.hex()[:16]} "
                             f"recoded with {got.codec} {fault}")
    return job, got


def decode_fault(payload: bytes, e: Extent, ref: bytes | None = None) -> str | None:
    """Why a new payload for chunk `e` (coded against the plain bytes `ref`, if given) must not
    replace its old one: it does not decode, or not to the bytes of the chunk's SHA-256 id; None
    if it is sound. Every payload a rewrite or a writable mount's recode switches to passes it."""
    try:
        back = decode_chunk(payload, e.size, ref=ref)
    except CodecError as exc:
        return f"does not decode ({exc})"
    if hashlib.sha256(back).digest() != e.chunk_id:
        return "does not decode to its bytes"
    return None


def recode_chunks(store: StorePaths, catalog: Catalog, source: ChunkSource, jobs: list[RecodeJob],
                  encode: Encode, result: RewriteResult, progress: Progress | None = None,
                  workers: int | None = None) -> None:
    """Run `encode` on every job (in parallel), append the payloads it returns, make them durable,
    then switch the chunks' rows to them in one transaction."""
    total = sum(j.chunk.extent.size for j in jobs)
    done = 0
    changes: list[RowChange] = []
    with PackSession(store, catalog, workers=workers, name="lmz-rewrite") as session:

        def land(_, got: tuple[RecodeJob, Recoding | None]) -> None:
            nonlocal done
            job, recoding = got
            e = job.chunk.extent
            result.chunks_examined += 1
            done += e.size
            if progress:
                progress(done, total)
            if recoding is None:
                return
            loc = session.append(e.chunk_id, recoding.payload)
            changes.append(RowChange(e.chunk_id, e.location, loc, recoding.codec,
                                     None if e.base is None else e.base.chunk_id,
                                     None if recoding.base is None else recoding.base.chunk_id))

        window = session.window(land)
        try:
            for job in jobs:
                window.submit(None, _checked, job, encode, source)
            window.drain()
        finally:
            window.cancel()
        if not session.appended:
            return
        session.commit(lambda tx: switch_rows(tx, changes))
        result.chunks_changed = len(changes)
        result.packs_written = len({c.new.pack for c in changes})


def switch_rows(tx: sqlite3.Connection, changes: list[RowChange]) -> None:
    """Inside a write transaction: point each chunk at its new payload and reference, refusing
    (and so rolling back) if some row is no longer as the pass read it. A reference counts the
    chunks coded against it (chunks.refs): the old one loses one, the new one gains one."""
    refs: dict[bytes, int] = {}
    for c in changes:
        if not switch_payload(tx, c):
            raise StoreError(f"the rewrite stopped and nothing changed: chunk {c.chunk_id.hex()[:16]} "
                             f"is no longer as it was read; run `lmz verify`")
        if c.old_base != c.new_base:
            for base, step in ((c.old_base, -1), (c.new_base, 1)):
                if base is not None:
                    refs[base] = refs.get(base, 0) + step
    for base, step in refs.items():
        if step and not add_ref(tx, base, step):
            raise StoreError(f"the rewrite stopped and nothing changed: reference chunk {base.hex()[:16]} "
                             f"is not in the catalog; run `lmz verify`")
