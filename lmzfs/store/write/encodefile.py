"""One file into a pack session: parse, chunk, hash, deduplicate and encode, in a bounded window.

What `lmz add` does to each file of a model and what a writable mount does to a file it commits.
Chunks already stored (or appended earlier in the same session) are reused; new ones are coded
on the session's pool by its encode policy and appended in order. The rows that make them
visible are the caller's commit's (the insert_* helpers, inside its transaction).
"""
from __future__ import annotations

import hashlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from concurrent.futures import Executor, Future
from typing import BinaryIO, Callable

import xxhash

from lmzfs.chunker import ChunkSizes, plan_chunks
from lmzfs.formats import ExternalRef, parse_open_file
from lmzfs.store.catalog import Catalog, TensorRow, chunkrows
from lmzfs.store.catalog.chunkrows import NewChunk     # also named here by the mount's commit
from lmzfs.store.catalog.modelrows import ExtentRow, insert_extents, insert_tensors
from lmzfs.store.chains.plan import BaseIndex, NewTensor
from lmzfs.store.chains.recode import ChainRecoder
from lmzfs.store.layout import StoreError
from lmzfs.codecs import EncodedChunk
from lmzfs.store.write.policy import EncodePolicy
from lmzfs.store.write.session import PackSession
from lmzfs.store.write.siblings import CodedChunk, SiblingIndex, encode_against, encode_alone


@dataclass
class EncodeTotals:
    """What a session's encoding did, over every file it encoded."""
    files: int = 0
    logical_bytes: int = 0          # the files' own bytes
    new_chunks: int = 0             # chunks the store did not hold, written by this session
    new_payload_bytes: int = 0      # their encoded bytes
    reused_chunks: int = 0          # chunks the store held before this add
    repeated_chunks: int = 0        # chunks that occur more than once in what is being added
    warnings: list[str] = field(default_factory=list)   # files stored as opaque bytes, and why


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: str           # dimensions, comma-separated
    offset: int          # of its data in the file
    size: int


def tensors_of(layout) -> list[Tensor]:
    """The named, typed tensors of a parsed file, as the catalog's tensors table keeps them."""
    return [Tensor(seg.name, seg.dtype, ",".join(str(d) for d in seg.shape or ()), seg.offset, seg.length)
            for seg in layout.segments if seg.kind == "tensor" and seg.name is not None and seg.dtype]


@dataclass
class FilePlan:
    rel: str
    size: int
    mtime: float
    sha256: str
    format: str
    extents: list[tuple[int, bytes]] = field(default_factory=list)   # (plain offset, chunk id)
    checks: dict[bytes, bytes] = field(default_factory=dict)    # chunk id -> XXH3-128, of reused chunks
    tensors: list[Tensor] = field(default_factory=list)
    hashes: dict[int, object] = field(default_factory=dict)     # offset -> SHA-256 state of the bytes before it


@dataclass(frozen=True)
class Unchanged:
    """What a file's previous version lets an encode skip (a writable mount's commit of a file it
    changed in places): the chunks whose bytes it knows unchanged, taken by offset, length and id
    without being read, and a SHA-256 state of the file's first `hashed` bytes (also unchanged)
    that the whole-file hash resumes from. The bytes after `hashed` are read for the hash."""
    chunks: dict[int, tuple[int, bytes]]       # offset -> (length, chunk id)
    hashed: int
    hasher: object | None                       # SHA-256 of bytes [0, hashed); None when hashed == 0


@dataclass(frozen=True)
class FileContent:
    """The bytes to encode, as the container parser (a file object) and the chunker (pread) read
    them. Read with pread, not mmap: a file cut short under an mmap kills the process with
    SIGBUS, where a short read is an error that names the file."""
    file: BinaryIO
    pread: Callable[[int, int], bytes]      # (length, offset) -> bytes
    size: int


@dataclass(frozen=True)
class FileChain:
    """What pairs a file's tensors with the base model's chunks, and recodes those as deltas."""
    index: BaseIndex
    recoder: ChainRecoder
    rel: str            # the file's path in the model, which pairs it with the base's file


def file_tensors(rel: str, shown: str, f: BinaryIO, size: int,
                 named_by: list[ExternalRef] | None = None) -> list[NewTensor]:
    """The tensors of one file (`rel` in its model), from its header alone (or from the ONNX
    model that keeps its external data there, `named_by`); none if it is malformed."""
    layout = parse_open_file(shown, f, size, named_by)
    if layout.error is not None:
        return []
    return [NewTensor(rel, (t.name, t.dtype, t.shape), t.offset, t.size) for t in tensors_of(layout)]


def pre_encode(policy: EncodePolicy, pool: Executor, files: list[tuple[FileContent, str]],
               sizes: ChunkSizes) -> dict[tuple, EncodedChunk]:
    """Each chunk of `files` ((content, shown) pairs) coded alone by `policy`, on `pool`, keyed as
    PreEncoded looks them up: what a commit may do before it takes the store's lock (it touches
    no catalog and no pack). A file that cannot be read is left out: its commit finds out."""
    jobs: dict[tuple, Future] = {}
    for content, shown in files:
        try:
            layout = parse_open_file(shown, content.file, content.size)
            hostile = layout.error is not None
            for cp in plan_chunks(layout, sizes):
                data = content.pread(cp.length, cp.offset)
                if len(data) != cp.length:
                    break
                key = (hashlib.sha256(data).digest(), cp.hint, hostile)
                if key not in jobs:
                    jobs[key] = pool.submit(policy.alone, data, cp.hint, hostile)
        except (OSError, StoreError):
            continue
    return {key: job.result() for key, job in jobs.items()}


class FileEncoder:
    """Encodes files into one session; `new` holds the chunks it appended, for the commit."""

    def __init__(self, session: PackSession, sizes: ChunkSizes, totals: EncodeTotals | None = None):
        self.session = session
        self.sizes = sizes
        self.totals = totals if totals is not None else EncodeTotals()
        self.new: dict[bytes, NewChunk] = {}

    def encode(self, content: FileContent, shown: str, *, progress: Callable[[int], None] | None = None,
               chain: FileChain | None = None, siblings: SiblingIndex | None = None,
               named_by: list[ExternalRef] | None = None, unchanged: Unchanged | None = None,
               hash_every: int = 0) -> FilePlan:
        """Parse, chunk, hash and encode `content`. With `chain`, the base's paired chunks are
        offered to its recoder; with `siblings`, chunks that pair with an earlier file of the same
        session are coded against it where that is smaller (and this file's are recorded for the
        files after it); `named_by`: the initializers an ONNX model keeps in this file (external
        data); `unchanged`: what need not be read again (not with `chain` or `siblings`);
        `hash_every`: keep the whole-file hash's state in the plan's `hashes` at chunk ends this
        far apart (and at the end), for a later encode's `unchanged`. The plan's rel and mtime
        are the caller's to set."""
        session, catalog, totals, new = self.session, self.session.catalog, self.totals, self.new
        layout = parse_open_file(shown, content.file, content.size, named_by)
        # A header that is malformed or claims more than the file holds buys its bytes the quick
        # codecs only (EncodePolicy): an input crafted to be slow to store gets no slow search.
        hostile = layout.error is not None
        if hostile:
            totals.warnings.append(f"{layout.error}; stored as opaque bytes")
        plan = FilePlan("", content.size, 0.0, "", layout.format, tensors=[] if hostile else tensors_of(layout))
        pairs = chain.index.pairs(catalog, chain.rel, [NewTensor(chain.rel, (t.name, t.dtype, t.shape), t.offset, t.size)
                                                       for t in plan.tensors]) if chain is not None else {}
        earlier = siblings.pairs(plan.tensors) if siblings is not None and not hostile else {}
        if chain is not None or siblings is not None:
            unchanged = None
        whole = hashlib.sha256() if unchanged is None or unchanged.hasher is None else unchanged.hasher.copy()
        hashed = 0 if unchanged is None or unchanged.hasher is None else unchanged.hashed
        kept_at = hashed
        stored_here: list[bytes] = []

        def hash_to(end: int, data: bytes | None, at: int) -> None:
            """Feed the whole-file hash up to `end` (`data`: the bytes from `at`, if read)."""
            nonlocal hashed, kept_at
            if end <= hashed:
                return
            if data is None or at > hashed:
                data, at = content.pread(end - hashed, hashed), hashed
                if len(data) != end - at:
                    raise StoreError(f"{shown} was cut short while being added; nothing was added, "
                                     "try again when it is stable")
            whole.update(memoryview(data)[hashed - at:end - at])
            hashed = end
            if hash_every and (end - kept_at >= hash_every or end == content.size):
                plan.hashes[end] = whole.copy()
                kept_at = end

        def land(tag: tuple[bytes, int, bytes], coded: CodedChunk) -> None:
            cid, size, check = tag
            loc = session.append(cid, coded.encoded.payload)
            new[cid] = NewChunk(cid, size, coded.encoded.codec, loc.pack, loc.offset, loc.length, check, coded.base)
            stored_here.append(cid)
            totals.new_payload_bytes += loc.length
            if siblings is not None:
                siblings.landed(coded)

        window = session.window(land)
        pending: set[bytes] = set()
        try:
            for cp in plan_chunks(layout, self.sizes):
                known = unchanged.chunks.get(cp.offset) if unchanged is not None else None
                if known is not None and known[0] == cp.length and catalog.has_chunk(known[1]):
                    hash_to(cp.offset + cp.length, None, 0)      # reads only what the hash has not seen
                    plan.extents.append((cp.offset, known[1]))
                    totals.reused_chunks += 1
                    continue
                data = content.pread(cp.length, cp.offset)
                if len(data) != cp.length:
                    raise StoreError(f"{shown} was cut short while being added; nothing was added, "
                                     "try again when it is stable")
                if cp.offset > hashed:
                    hash_to(cp.offset, None, 0)
                hash_to(cp.offset + cp.length, data, cp.offset)
                cid = hashlib.sha256(data).digest()
                check = xxhash.xxh3_128_digest(data)
                plan.extents.append((cp.offset, cid))
                offered = False
                if chain is not None:
                    chain.recoder.saw(cid)
                    paired = pairs.get(cp.offset)
                    offered = paired is not None and paired.size == cp.length
                    if offered:
                        chain.recoder.offer(cid, data, cp.hint, paired)
                        chain.recoder.drain(session.limit)
                if cid in new or cid in pending:
                    totals.repeated_chunks += 1
                elif catalog.has_chunk(cid):
                    totals.reused_chunks += 1
                    plan.checks[cid] = check    # fills in the checksum of a chunk stored without one
                else:
                    pending.add(cid)
                    totals.new_chunks += 1
                    # a chunk offered to the cross-model chain stays coded alone (its recoder counts on it)
                    ref = None if offered else earlier.get(cp.offset)
                    ready = session.policy.ready(cid, cp.hint, hostile) if ref is None else None
                    if ready is not None:       # coded ahead (a mount's group commit): no job to run
                        window.put((cid, cp.length, check), CodedChunk(ready))
                    elif ref is not None and ref.length == cp.length:
                        window.submit((cid, cp.length, check), encode_against, session.policy, data, cp.hint, ref,
                                      hostile)
                    else:
                        window.submit((cid, cp.length, check), encode_alone, session.policy, data, cp.hint, hostile)
                del data
                if progress is not None:
                    progress(cp.offset + cp.length)
            window.drain()
            hash_to(content.size, None, 0)
        finally:
            window.cancel()
        if siblings is not None and not hostile:
            siblings.record(content.file.fileno(), plan.tensors, plan.extents, [new[c] for c in stored_here])
        plan.sha256 = whole.hexdigest()
        totals.files += 1
        totals.logical_bytes += plan.size
        return plan


def insert_new_chunks(db: sqlite3.Connection, plans: list[FilePlan], new: dict[bytes, NewChunk]) -> None:
    """Inside a write transaction: record the chunks a FileEncoder appended (no extent refers to
    them yet; a base counts the chunks coded against it) and the read checksums of reused
    chunks stored without one."""
    chunkrows.insert_chunks(db, new.values())
    # a base's refs count the chunks coded against it, as its extents do
    chunkrows.add_refs(db, Counter(c.base for c in new.values() if c.base))
    checks: dict[bytes, bytes] = {}
    for p in plans:
        for cid, check in p.checks.items():
            checks.setdefault(cid, check)       # the first, as the guarded UPDATE keeps it
    chunkrows.fill_checksums(db, checks)


def insert_file_rows(db: sqlite3.Connection, file_id: int, plan: FilePlan) -> dict[bytes, int]:
    """Inside a write transaction: a stored file's extents and tensors rows (what chain pairing
    reads); returns the references its extents add to each chunk, for the caller to apply."""
    insert_extents(db, (ExtentRow(file_id, i, off, cid) for i, (off, cid) in enumerate(plan.extents)))
    insert_tensors(db, (TensorRow(file_id, t.name, t.dtype, t.shape, t.offset, t.size) for t in plan.tensors))
    refs: dict[bytes, int] = {}
    for _, cid in plan.extents:
        refs[cid] = refs.get(cid, 0) + 1
    return refs
