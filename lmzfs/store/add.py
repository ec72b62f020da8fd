"""`lmz add`: pack a model directory (or one file) into the store, atomically.

Order of durability: chunk payloads are appended to packs and fsync'd first; only then does one
catalog transaction make the model, its files, extents and new chunks visible. An add that fails
before that commit (a full disk, a file that changed under it) cuts what it appended; a process
killed before it leaves only dead bytes at the end of a pack, which `lmz gc` reclaims.

Checkpoint chains: unless told not to (`--no-delta`), an add picks a stored model to pair with
(`--base`, or store/delta_plan.py's choice), stores the new model's chunks coded alone and recodes
the base's paired chunks as deltas against them (store/chainrecode.py) in the same transaction:
the newest checkpoint reads at full speed, older ones through their chain. After the commit the
recoded chunks' old payloads are dropped from the packs that held them (gc.reclaim_packs).
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import sqlite3
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable

import xxhash

from lmzfs.chunker import CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, plan_chunks
from lmzfs.formats import ExternalRef, FormatError, external_refs, parse_open_file
from lmzfs.store.catalog import Catalog
from lmzfs.store.chainrecode import ChainRecoder, RecodeTotals
from lmzfs.store.delta_plan import BaseChoice, BaseIndex, NewTensor, choose_base
from lmzfs.store.gc import GcResult, reclaim_packs
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.names import validate_model_name
from lmzfs.store.packs import PackWriter
from lmzfs.store.siblings import SiblingIndex, SiblingTotals, encode_against, encode_alone
from lmzfs.store.sources import SourceFile, SourceTree

Progress = Callable[[int, int], None]     # (bytes done, bytes total)


@dataclass
class AddResult:
    name: str
    files: int = 0
    logical_bytes: int = 0
    new_chunks: int = 0
    new_payload_bytes: int = 0
    reused_chunks: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)   # files stored as opaque bytes, and why
    base: BaseChoice | None = None          # the model paired with, if any
    delta: bool = True                      # False: --no-delta
    recoded: RecodeTotals = field(default_factory=RecodeTotals)
    siblings: SiblingTotals = field(default_factory=SiblingTotals)  # deltas between this add's files
    reclaimed: GcResult | None = None      # the recode's dead payloads dropped after the commit


@dataclass
class _NewChunk:
    chunk_id: bytes
    size: int
    codec: str
    pack: int
    offset: int
    length: int
    xxh3: bytes           # XXH3-128 of the plain bytes: what reads check
    base: bytes | None = None   # the chunk of this add it is coded against (store/siblings.py)


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: str           # dimensions, comma-separated
    offset: int          # of its data in the file
    size: int


def tensors_of(layout) -> list[_Tensor]:
    """The named, typed tensors of a parsed file, as the catalog's tensors table keeps them."""
    return [_Tensor(seg.name, seg.dtype, ",".join(str(d) for d in seg.shape or ()), seg.offset, seg.length)
            for seg in layout.segments if seg.kind == "tensor" and seg.name is not None and seg.dtype]


@dataclass
class _FilePlan:
    rel: str
    size: int
    mtime: float
    sha256: str
    format: str
    extents: list[tuple[int, bytes]] = field(default_factory=list)   # (plain offset, chunk id)
    checks: dict[bytes, bytes] = field(default_factory=dict)    # chunk id -> XXH3-128, of reused chunks
    tensors: list[_Tensor] = field(default_factory=list)


def default_model_name(source: Path) -> str:
    real = Path(os.path.realpath(source))     # never raises, even on a symlink loop
    return real.name if real.is_dir() else real.stem


def check_name_free(catalog: Catalog, name: str) -> None:
    for m in catalog.models():
        if m.name == name:
            raise StoreError(f"model {name!r} already exists (`lmz rm {name}` first, or choose --name)")
        if m.name.startswith(name + "/") or name.startswith(m.name + "/"):
            raise StoreError(f"model {name!r} would nest with existing model {m.name!r}; pick a sibling name")


# How many references a read of a chunk follows at most, unless the config's chain_depth says otherwise.
DEFAULT_CHAIN_DEPTH = 4         # lmzfs/config.py keeps the same default


def add_model(store: StorePaths, source: Path, name: str | None = None, *,
              progress: Progress | None = None, workers: int | None = None, fast: bool = False,
              chunk_size: int | None = None, segments: bool = True, base: str | None = None,
              delta: bool = True, chain_depth: int = DEFAULT_CHAIN_DEPTH) -> AddResult:
    """Add SOURCE as model NAME.

    By default every chunk gets the smallest of all codecs, the entropy-coded ones (floatsplit,
    ggufblocks, entropy) included: the smallest store. ``fast`` keeps to zstd and byte grouping:
    a store a few points larger whose chunks decode faster (docs/results.md).

    ``chunk_size``: plain bytes per chunk, MIN_CHUNK_SIZE to MAX_CHUNK_SIZE (default CHUNK_SIZE).
    Smaller chunks make a cache miss cheaper (a 4 KiB random read decodes a whole chunk) and
    sequential reads a little slower; chunks cut at different sizes do not deduplicate.

    ``segments``: float chunks over 256 KiB are coded in segments (floatseg) that a lone small
    read decodes alone, so a random read's miss costs a quarter of a chunk's decode; False codes
    them whole (floatsplit), which decodes a little faster front to back.

    ``base``: the stored model to pair with (else one is chosen, if any qualifies); ``delta``
    False stores the model without touching any other; ``chain_depth``: the most references a
    read of any chunk may follow."""
    chunk_size = CHUNK_SIZE if chunk_size is None else chunk_size
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise StoreError(f"chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE} bytes")
    if base is not None and not delta:
        raise StoreError("--base and --no-delta contradict each other")
    name = validate_model_name(default_model_name(source) if name is None else name)
    with SourceTree(source) as tree:
        return _add_tree(store, tree, name, progress, workers, fast, chunk_size, segments,
                         _Chains(base, delta, chain_depth))


@dataclass(frozen=True)
class _Chains:
    base: str | None
    delta: bool
    depth: int


def external_data(tree: SourceTree) -> dict[str, list[ExternalRef]]:
    """File (rel) -> the initializers that the tree's ONNX models keep in it: a model over 2 GB
    keeps its weights in files beside it, named relative to its own directory. A location that
    names no file of the tree (absolute, leading out of it, missing) is left out, as is a model
    whose header is malformed (it is stored as opaque bytes)."""
    present = {src.rel for src in tree.files}
    out: dict[str, list[ExternalRef]] = {}
    for src in tree.files:
        if not src.rel.lower().endswith(".onnx"):
            continue
        with open(tree.open(src), "rb") as f:
            try:
                refs = external_refs(src.shown, f, os.fstat(f.fileno()).st_size)
            except FormatError:
                continue
        for r in refs:
            if r.location.startswith("/") or "\\" in r.location:
                continue
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(src.rel), r.location))
            if rel in present and rel != src.rel:
                out.setdefault(rel, []).append(r)
    return out


def _new_tensors(tree: SourceTree, named: dict[str, list[ExternalRef]]) -> list[NewTensor]:
    """The tensors of the files to add, from their headers alone (a first, cheap pass)."""
    out = []
    for src in tree.files:
        with open(tree.open(src), "rb") as f:
            out.extend(file_tensors(src.rel, src.shown, f, os.fstat(f.fileno()).st_size, named.get(src.rel)))
    return out


def file_tensors(rel: str, shown: str, f: BinaryIO, size: int,
                 named_by: list[ExternalRef] | None = None) -> list[NewTensor]:
    """The tensors of one file (`rel` in its model), from its header alone (or from the ONNX
    model that keeps its external data there, `named_by`); none if it is malformed."""
    layout = parse_open_file(shown, f, size, named_by)
    if layout.error is not None:
        return []
    return [NewTensor(rel, (t.name, t.dtype, t.shape), t.offset, t.size) for t in tensors_of(layout)]


def _add_tree(store: StorePaths, tree: SourceTree, name: str, progress: Progress | None, workers: int | None,
              fast: bool, chunk_size: int, segments: bool, chains: _Chains) -> AddResult:
    sources = tree.files
    store.create()
    store.check_format()
    started = time.monotonic()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        try:
            check_name_free(catalog, name)
            result = AddResult(name, delta=chains.delta)
            named = external_data(tree)
            index = choose_base(catalog, name, _new_tensors(tree, named), chains.base) if chains.delta else None
            result.base = index.choice if index is not None else None
            total = sum(s.size for s in sources)
            writer = PackWriter(store, *catalog.pack_ids())
            try:
                new: dict[bytes, _NewChunk] = {}
                plans: list[_FilePlan] = []
                done = 0
                workers = workers or os.cpu_count() or 2
                siblings = SiblingIndex(chains.depth) if chains.delta else None
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    recoder = ChainRecoder(store, catalog, writer, pool, chains.depth, fast) if index else None
                    try:
                        for src in sources:
                            plan = _add_file(tree, src, catalog, writer, pool, 2 * workers + 2, fast, segments,
                                             chunk_size, new, result, lambda n: progress and progress(done + n, total),
                                             index, recoder, siblings, named.get(src.rel))
                            done += plan.size
                            plans.append(plan)
                        if recoder is not None:
                            recoder.drain(0)
                            result.recoded = recoder.totals
                            result.warnings.extend(recoder.warnings)
                    finally:
                        if recoder is not None:
                            recoder.close()
                        if siblings is not None:
                            result.siblings = siblings.totals
                            siblings.close()
                writer.sync()
                try:
                    old_packs = _commit(catalog, name, str(tree.resolved), plans, new, writer,
                                        recoder.rows if recoder is not None else {})
                except sqlite3.Error as exc:
                    # e.g. a full disk: the transaction rolled back, so nothing of this add is
                    # visible, and its pack bytes are cut below
                    raise StoreError(f"could not record {name!r} in the catalog ({exc}); nothing was "
                                     f"added") from exc
            except BaseException:
                # nothing of this add was committed: what it appended goes, so that a failed add
                # (a full disk above all) leaves the store's disk use as it found it
                writer.discard(catalog.payload_end)
                raise
            finally:
                writer.close()
            if old_packs:
                _reclaim(store, catalog, old_packs, result)
        finally:
            catalog.close()
    result.seconds = time.monotonic() - started
    return result


def _add_file(tree: SourceTree, src: SourceFile, catalog: Catalog, writer: PackWriter, pool: ThreadPoolExecutor,
              limit: int, fast: bool, segments: bool, chunk_size: int, new: dict[bytes, _NewChunk],
              result: AddResult, progress: Callable[[int], None], index: BaseIndex | None,
              recoder: ChainRecoder | None, siblings: SiblingIndex | None,
              named_by: list[ExternalRef] | None) -> _FilePlan:
    # The one descriptor the walk's file is read through: parsing, hashing and chunking alike.
    with open(tree.open(src), "rb") as f:
        before = os.fstat(f.fileno())
        # Read with pread, not mmap: a file cut short under an mmap kills the process with SIGBUS,
        # where a short read is an error that names the file.
        plan = encode_file(f, lambda length, offset: os.pread(f.fileno(), length, offset), before.st_size,
                           src.shown, catalog, writer, pool, limit, fast=fast, segments=segments,
                           chunk_size=chunk_size, new=new, result=result, progress=progress,
                           chain=FileChain(index, recoder, src.rel) if index is not None else None,
                           siblings=siblings, named_by=named_by)
        plan.rel, plan.mtime = src.rel, before.st_mtime
        after = os.fstat(f.fileno())
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise StoreError(f"{src.shown} changed while being added; nothing was added, try again when it is stable")
    return plan


@dataclass(frozen=True)
class FileChain:
    """What pairs a file's tensors with the base model's chunks, and recodes those as deltas."""
    index: BaseIndex
    recoder: ChainRecoder
    rel: str            # the file's path in the model, which pairs it with the base's file


def encode_file(f: BinaryIO, pread: Callable[[int, int], bytes], size: int, shown: str, catalog: Catalog,
                writer: PackWriter, pool: ThreadPoolExecutor, limit: int, *, fast: bool, segments: bool,
                chunk_size: int, new: dict[bytes, _NewChunk], result: AddResult,
                progress: Callable[[int], None], chain: FileChain | None = None,
                siblings: SiblingIndex | None = None, named_by: list[ExternalRef] | None = None) -> _FilePlan:
    """Parse, chunk, hash and encode the `size` bytes that `f` (for the container parser) and
    `pread(length, offset)` read: what `lmz add` does to one file, and what a writable mount does
    to a file it commits. Chunks already stored (or in `new`) are reused; new ones are appended
    to `writer` and recorded in `new`; with `chain`, the base's paired chunks are offered to its
    recoder; with `siblings`, chunks that pair with an earlier file of the same add are coded
    against it where that is smaller (and this file's are recorded for the files after it);
    `named_by`: the initializers an ONNX model of the add keeps in this file (external data).
    The plan's rel and mtime are the caller's to set."""
    layout = parse_open_file(shown, f, size, named_by)
    # A header that is malformed or claims more than the file holds buys its bytes the quick
    # codecs only: an input crafted to be slow to store gets no slow search.
    hostile = layout.error is not None
    if hostile:
        result.warnings.append(f"{layout.error}; stored as opaque bytes")
    plan = _FilePlan("", size, 0.0, "", layout.format, tensors=[] if hostile else tensors_of(layout))
    pairs = chain.index.pairs(catalog, chain.rel, [NewTensor(chain.rel, (t.name, t.dtype, t.shape), t.offset, t.size)
                                                   for t in plan.tensors]) if chain is not None else {}
    earlier = siblings.pairs(plan.tensors) if siblings is not None and not hostile else {}
    whole = hashlib.sha256()
    window: deque[tuple[bytes, int, Future]] = deque()
    stored_here: list[bytes] = []

    def drain(keep: int) -> None:
        while len(window) > keep:
            cid, size, check, fut = window.popleft()
            coded = fut.result()
            loc = writer.append(cid, coded.encoded.payload)
            new[cid] = _NewChunk(cid, size, coded.encoded.codec, loc.pack, loc.offset, loc.length, check, coded.base)
            stored_here.append(cid)
            result.new_payload_bytes += loc.length
            if siblings is not None:
                siblings.landed(coded)

    pending: set[bytes] = set()
    for cp in plan_chunks(layout, chunk_size):
        data = pread(cp.length, cp.offset)
        if len(data) != cp.length:
            raise StoreError(f"{shown} was cut short while being added; nothing was added, "
                             "try again when it is stable")
        whole.update(data)
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
                chain.recoder.drain(limit)
        if cid in new or cid in pending:
            result.reused_chunks += 1
        elif catalog.has_chunk(cid):
            result.reused_chunks += 1
            plan.checks[cid] = check    # fills in the checksum of a chunk stored without one
        else:
            pending.add(cid)
            result.new_chunks += 1
            options = dict(fast=fast or hostile, segments=segments, thorough=not hostile)
            # a chunk offered to the cross-model chain stays coded alone (its recoder counts on it)
            ref = None if offered else earlier.get(cp.offset)
            if ref is not None and ref.length == cp.length:
                job = pool.submit(encode_against, data, cp.hint, ref, **options)
            else:
                job = pool.submit(encode_alone, data, cp.hint, **options)
            window.append((cid, cp.length, check, job))
            drain(limit)
        del data
        progress(cp.offset + cp.length)
    drain(0)
    if siblings is not None and not hostile:
        siblings.record(f.fileno(), plan.tensors, plan.extents, [new[c] for c in stored_here])
    plan.sha256 = whole.hexdigest()
    result.files += 1
    result.logical_bytes += plan.size
    return plan


def insert_new_chunks(db: sqlite3.Connection, plans: list[_FilePlan], new: dict[bytes, _NewChunk]) -> None:
    """Inside a write transaction: record the chunks encode_file appended (no extent refers to
    them yet; a base counts the chunks coded against it) and the read checksums of reused
    chunks stored without one."""
    db.executemany("INSERT INTO chunks (id, size, codec, pack, offset, length, refs, xxh3, base) "
                   "VALUES (?,?,?,?,?,?,0,?,?)",
                   [(c.chunk_id, c.size, c.codec, c.pack, c.offset, c.length, c.xxh3, c.base) for c in new.values()])
    # a base's refs count the chunks coded against it, as its extents do
    db.executemany("UPDATE chunks SET refs = refs + 1 WHERE id = ?", [(c.base,) for c in new.values() if c.base])
    db.executemany("UPDATE chunks SET xxh3 = ? WHERE id = ? AND xxh3 IS NULL",
                   [(check, cid) for p in plans for cid, check in p.checks.items()])


def insert_tensors(db: sqlite3.Connection, file_id: int, plan: _FilePlan) -> None:
    """Inside a write transaction: the tensors table rows of a stored file (what chain pairing reads)."""
    db.executemany("INSERT OR IGNORE INTO tensors (file, name, dtype, shape, offset, size) VALUES (?,?,?,?,?,?)",
                   [(file_id, t.name, t.dtype, t.shape, t.offset, t.size) for t in plan.tensors])


def _reclaim(store: StorePaths, catalog: Catalog, packs: set[int], result: AddResult) -> None:
    """After the commit: the old payloads of recoded chunks are dead, so the user would see the
    store grow by the whole new model; drop them now from the packs that held them."""
    try:
        result.reclaimed = reclaim_packs(store, catalog, packs)
    except (StoreError, OSError, sqlite3.Error) as exc:
        result.warnings.append(f"the model was added, but the space its recode freed was not reclaimed ({exc}); "
                               f"`lmz gc` reclaims it")


def _commit(catalog: Catalog, name: str, source: str, plans: list[_FilePlan],
            new: dict[bytes, _NewChunk], writer: PackWriter, recoded: dict) -> set[int]:
    """Make the model visible in one transaction; returns the packs that held the recoded
    chunks' payloads before (their bytes there are dead from now on)."""
    before = RecodedBefore.of(catalog, recoded)
    with catalog.transaction() as db:
        insert_new_chunks(db, plans, new)
        model_id = db.execute("INSERT INTO models (name, added, source) VALUES (?,?,?)",
                              (name, time.time(), source)).lastrowid
        refs: dict[bytes, int] = {}
        for p in plans:
            file_id = db.execute("INSERT INTO files (model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?)",
                                 (model_id, p.rel, p.size, p.mtime, p.sha256, p.format)).lastrowid
            db.executemany("INSERT INTO extents (file, seq, offset, chunk) VALUES (?,?,?,?)",
                           [(file_id, i, off, cid) for i, (off, cid) in enumerate(p.extents)])
            insert_tensors(db, file_id, p)
            for _, cid in p.extents:
                refs[cid] = refs.get(cid, 0) + 1
        record_recoded(db, recoded, before, refs)
        db.executemany("UPDATE chunks SET refs = refs + ? WHERE id = ?", [(n, cid) for cid, n in refs.items() if n])
        Catalog.record_pack_ids(db, writer.pack_id, max(writer.touched))
    return before.packs


@dataclass(frozen=True)
class RecodedBefore:
    """What the catalog said of the recoded chunks before the commit that records their recode."""
    bases: dict[bytes, bytes | None]       # chunk -> the base it was coded against
    packs: set[int]                        # the packs that held their payloads

    @classmethod
    def of(cls, catalog: Catalog, recoded: dict) -> "RecodedBefore":
        packs: set[int] = set()
        for cid in recoded:
            row = catalog.db.execute("SELECT pack FROM chunks WHERE id = ?", (cid,)).fetchone()
            if row is not None:
                packs.add(row[0])
        return cls({cid: catalog.chunk_base(cid) for cid in recoded}, packs)


def record_recoded(db: sqlite3.Connection, recoded: dict, before: RecodedBefore, refs: dict[bytes, int]) -> None:
    """Inside a write transaction: the recoded chunks' new payloads and bases; `refs` gains the
    reference changes (a base's refs count the chunks coded against it) for the caller to apply."""
    db.executemany("UPDATE chunks SET codec = ?, pack = ?, offset = ?, length = ?, base = ? WHERE id = ?",
                   [(r.codec, r.pack, r.offset, r.length, r.base, r.chunk_id) for r in recoded.values()])
    for cid, r in recoded.items():
        if r.base is not None:
            refs[r.base] = refs.get(r.base, 0) + 1
        if before.bases[cid] is not None:
            refs[before.bases[cid]] = refs.get(before.bases[cid], 0) - 1
