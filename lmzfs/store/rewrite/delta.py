"""`lmz rewrite delta MODEL [--base BASE]`: code a model already stored as deltas against another
(a checkpoint against its predecessor, a fine-tune against its base), chunk by chunk, keeping a
delta only where it is smaller than the chunk's payload now.

Chunks are paired through the files' tensors, parsed again through the store: a tensor of MODEL
is coded against the tensor of BASE with the same name, dtype and shape, chunk by chunk at the
same offset in the tensor and of the same size. A chunk both models share is stored once already
and stays as it is.

No chain may loop or grow past the depth cap (config `chain_depth`, which `lmz add` keeps too;
`--chain-depth` for one pass): a chunk X gets a reference Y only if Y's chain does not reach X, and
Y's depth + 1 + the longest chain below X is within the cap. The check counts every reference a
chunk has before the pass or may get in it, so whichever of the planned deltas prove smaller and
are kept, the chains stay within bounds.

Without --base, the model whose tensors pair with most of MODEL's bytes is chosen; ties go to its
family, then to its predecessor (the model added last before it). The other models' tensors come
from the catalog's tensors table, which `lmz add` fills (as delta_plan pairs by); only a file
without rows there (stored before catalog version 3) is parsed again through the store, so models
stored before pair as well. MODEL's own files are parsed for their chunks' hints (what its add
gave the codecs), which needs their headers only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from lmzfs.codecs import encode_delta_chunk
from lmzfs.store.add import DEFAULT_CHAIN_DEPTH
from lmzfs.store.catalog import MAX_CHAIN_HOPS, Catalog, Extent
from lmzfs.store.catalog.chunkrows import chunk_bases
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.rewrite.run import (Progress, Recoding, RecodeJob, RewriteResult, measure, recode_chunks,
                                 store_reader, writing)
from lmzfs.store.rewrite.scan import StoredChunk, TensorChunks, chunks_of, scan_file, tensors_from_rows


class ChainLimits:
    """The references chunks have or may get during a pass, and what a new one would do to them."""

    def __init__(self, edges: list[tuple[bytes, bytes]], cap: int):
        self.cap = cap
        self._up: dict[bytes, set[bytes]] = {}
        self._down: dict[bytes, set[bytes]] = {}
        for child, base in edges:
            self._link(child, base)

    @classmethod
    def of(cls, catalog: Catalog, cap: int) -> "ChainLimits":
        return cls(list(chunk_bases(catalog.db).items()), cap)

    def _link(self, child: bytes, base: bytes) -> None:
        self._up.setdefault(child, set()).add(base)
        self._down.setdefault(base, set()).add(child)

    def depth(self, cid: bytes) -> int:
        """The most references a read of this chunk can follow."""
        ups = self._up.get(cid)
        return 0 if not ups else 1 + max(self.depth(b) for b in ups)

    def height(self, cid: bytes) -> int:
        """The most references from a chunk coded against this one (through others) down to it."""
        downs = self._down.get(cid)
        return 0 if not downs else 1 + max(self.height(c) for c in downs)

    def reaches(self, start: bytes, target: bytes) -> bool:
        """Whether start's chain (any of its references, and theirs) reaches target."""
        todo, seen = [start], set()
        while todo:
            c = todo.pop()
            if c == target:
                return True
            if c not in seen:
                seen.add(c)
                todo.extend(self._up.get(c, ()))
        return False

    def allows(self, chunk: bytes, base: bytes) -> bool:
        return chunk != base and not self.reaches(base, chunk) and \
            self.depth(base) + 1 + self.height(chunk) <= self.cap

    def add(self, chunk: bytes, base: bytes) -> None:
        self._link(chunk, base)


@dataclass(frozen=True)
class _Pair:
    chunk: Extent
    reference: Extent


def stored_tensors(catalog: Catalog, source: ChunkSource, models: list[str]) -> dict[str, list[TensorChunks]]:
    """Each model's tensors in path and offset order: from the tensors table where a file has rows,
    else parsed from the stored file."""
    out: dict[str, list[TensorChunks]] = {}
    for name in models:
        rows = tensors_from_rows(catalog, name)
        out[name] = [t for f in catalog.files(name)
                     for t in (rows[f.id] if f.id in rows else scan_file(catalog, source, f).tensors)]
    return out


def _same_layout(a: TensorChunks, b: TensorChunks) -> bool:
    return (a.dtype, tuple(a.shape or ()), a.length) == (b.dtype, tuple(b.shape or ()), b.length)


def pair_chunks(model: list[TensorChunks], base: list[TensorChunks]) -> list[_Pair]:
    """Each chunk of MODEL's tensors with the chunk at the same place of BASE's same tensor (the
    same chunk, where both hold the same bytes); a name BASE holds twice pairs with its first."""
    refs: dict[str, TensorChunks] = {}
    for t in base:
        refs.setdefault(t.name, t)
    pairs: list[_Pair] = []
    for t in model:
        r = refs.get(t.name)
        if r is None or not _same_layout(r, t):
            continue
        at = {(off, e.size): e for off, e in r.chunks}
        for off, e in t.chunks:
            ref = at.get((off, e.size))
            if ref is not None:
                pairs.append(_Pair(e, ref))
    return pairs


def choose_base(catalog: Catalog, tensors: dict[str, list[TensorChunks]], model: str,
                limits: ChainLimits) -> str | None:
    """The model whose tensors pair with most of MODEL's bytes (counting only pairs the chains
    allow); ties go to one of the same family (the name up to its last '/'), then to the one
    added last before MODEL (its predecessor in a run), else the first added after it."""
    family = model.rpartition("/")[0]
    added = {m.name: m.added for m in catalog.models()}
    mine = tensors[model]
    best: tuple | None = None
    for name, theirs in tensors.items():
        if name == model:
            continue
        paired = sum(p.chunk.size for p in pair_chunks(mine, theirs) if p.chunk.chunk_id == p.reference.chunk_id
                     or limits.allows(p.chunk.chunk_id, p.reference.chunk_id))
        if paired:
            gap = added.get(name, 0.0) - added.get(model, 0.0)
            key = (paired, name.rpartition("/")[0] == family, gap < 0, -abs(gap))
            if best is None or key > best[0]:
                best = (key, name)
    return None if best is None else best[1]


def smaller_delta(job: RecodeJob, plain: bytes, ref: bytes | None) -> Recoding | None:
    """The chunk coded against its paired reference, if that is smaller than its payload now."""
    got = encode_delta_chunk(plain, ref, job.chunk.hint)
    if got is None or len(got.payload) >= job.chunk.extent.location.length:
        return None
    return Recoding(got.payload, got.codec, job.reference)


def delta_store(store: StorePaths, model: str, base: str | None = None, *, chain_depth: int = DEFAULT_CHAIN_DEPTH,
                progress: Progress | None = None, workers: int | None = None) -> RewriteResult:
    started = time.monotonic()
    with writing(store) as catalog:
        for name in (model, base):
            if name is not None and catalog.model(name) is None:
                raise StoreError(f"no model named {name!r} (see `lmz ls`)")
        if base == model:
            raise StoreError(f"{model!r} cannot be coded against itself; name another model with --base")
        if not 1 <= chain_depth < MAX_CHAIN_HOPS:
            raise StoreError(f"the chain depth must be 1 to {MAX_CHAIN_HOPS - 1}, not {chain_depth}")
        result = RewriteResult("delta", measure(store, catalog), measure(store, catalog))
        with store_reader(store) as source:
            mine = [scan_file(catalog, source, f) for f in catalog.files(model)]
            others = [base] if base is not None else [m.name for m in catalog.models() if m.name != model]
            tensors = stored_tensors(catalog, source, others)
            tensors[model] = [t for f in mine for t in f.tensors]
            limits = ChainLimits.of(catalog, chain_depth)
            base = base if base is not None else choose_base(catalog, tensors, model, limits)
            if base is None:
                raise StoreError(f"no other stored model can be a base for {model!r} (tensors of the same "
                                 f"names, dtypes and shapes, within the chains' depth cap); nothing changed")
            result.base = base
            hints: dict[bytes, StoredChunk] = chunks_of(mine)
            jobs: list[RecodeJob] = []
            planned: set[bytes] = set()
            every = pair_chunks(tensors[model], tensors.get(base, []))
            pairs = [p for p in every if p.chunk.chunk_id != p.reference.chunk_id]   # the same bytes: stored once
            for p in pairs:
                cid = p.chunk.chunk_id
                if cid in planned or not limits.allows(cid, p.reference.chunk_id):
                    continue
                planned.add(cid)
                limits.add(cid, p.reference.chunk_id)
                jobs.append(RecodeJob(hints[cid], p.reference))
            if not every:
                result.notes.append(f"no tensor of {model} pairs with one of {base} (same name, dtype and shape)")
            elif len(jobs) < len({p.chunk.chunk_id for p in pairs}):
                result.notes.append(f"{len({p.chunk.chunk_id for p in pairs}) - len(jobs)} paired chunk(s) left as "
                                    f"they are: coding them against {base} would loop a chain or take it past "
                                    f"the depth cap of {limits.cap}")
            recode_chunks(store, catalog, source, jobs, smaller_delta, result, progress, workers)
        result.after = measure(store, catalog)
    result.seconds = time.monotonic() - started
    return result
