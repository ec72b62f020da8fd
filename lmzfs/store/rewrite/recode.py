"""`lmz rewrite recode [MODEL]`: code the chunks (of MODEL, or of every model) again with the
best codecs this lmzfs has, and keep a new payload only where it is smaller.

A store added with `--fast`, or by an older lmzfs, gets what `lmz add` would store today. The
chunk boundaries stay (a chunk's id is its plain bytes), so `--chunk-size` has no say; nor has
`--fast`: recoding is for the smallest store. A chunk coded in parts (`add
--segments`) is coded in segments again, as its add asked for random reads. A file whose header
was malformed keeps the quick codecs its add gave it.

The chunks a writable mount's commits left for its idle recode (`fs_text_chunks`) that the pass
tried are no longer named there.

A delta chunk is coded both alone and against its reference, and keeps the smaller; it never
gains a reference it did not have (`lmz rewrite delta` does that), so no chain grows or loops.
"""
from __future__ import annotations

import time

from lmzfs.codecs.floatsplit import FloatSplitCodec
from lmzfs.store.catalog.fsrows import forget_text_chunks, named_text_chunks
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.rewrite.run import (Progress, Recoding, RecodeJob, RewriteResult, measure, recode_chunks,
                                 store_reader, writing)
from lmzfs.store.rewrite.scan import StoredChunk, chunks_of, scan_models
from lmzfs.store.write.policy import EncodePolicy


def _in_parts(codec: str) -> bool:
    """Code the chunk in parts (the default) unless its add coded it whole (`add --no-segments`):
    floatsplit on a chunk that floatseg would have cut."""
    return codec != FloatSplitCodec.name


def smallest(job: RecodeJob, plain: bytes, ref: bytes | None) -> Recoding | None:
    """The chunk's smallest payload, alone or against the reference it has, if smaller than now."""
    chunk = job.chunk
    got = EncodePolicy(segments=_in_parts(chunk.extent.codec)).smaller(plain, chunk.hint, ref, chunk.hostile)
    best = Recoding(got.encoded.payload, got.encoded.codec, job.reference if got.against else None)
    return best if len(best.payload) < chunk.extent.location.length else None


def with_references(chunks: dict[bytes, StoredChunk]) -> dict[bytes, StoredChunk]:
    """These chunks and every chunk their chains reach (a reference whose own model was removed
    lives on for its dependants), each reference with the hint of the chunk that needs it."""
    out = dict(chunks)
    for c in chunks.values():
        for ref in c.extent.chain()[1:]:
            if ref.chunk_id not in out:
                out[ref.chunk_id] = StoredChunk(ref, c.hint, c.hostile)
    return out


def recode_store(store: StorePaths, model: str | None = None, *, progress: Progress | None = None,
                 workers: int | None = None) -> RewriteResult:
    started = time.monotonic()
    with writing(store) as catalog:
        if model is not None and catalog.model(model) is None:
            raise StoreError(f"no model named {model!r} (see `lmz ls`)")
        result = RewriteResult("recode", measure(store, catalog), measure(store, catalog))
        with store_reader(store) as source:
            chunks = chunks_of(scan_models(catalog, source, None if model is None else {model}))
            if model is None:
                chunks = with_references(chunks)
            jobs = [RecodeJob(c, c.extent.base) for c in chunks.values() if c.extent.size]
            recode_chunks(store, catalog, source, jobs, smallest, result, progress, workers)
        named = set(named_text_chunks(catalog.db))
        tried = [c for c in chunks if c in named]
        if tried:           # a writable mount's idle recode need not try these again (fsmodel/recodetext.py)
            with catalog.transaction() as tx:
                forget_text_chunks(tx, tried)
        result.after = measure(store, catalog)
    result.seconds = time.monotonic() - started
    return result
