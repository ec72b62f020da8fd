"""`lmz rewrite recode [MODEL]`: code the chunks (of MODEL, or of every model) again with the
best codecs this lmzfs has, and keep a new payload only where it is smaller.

A store added with `--fast`, or by an older lmzfs, gets what `lmz add` would store today. The
chunk boundaries stay (a chunk's id is its plain bytes), so `--chunk-size` has no say; nor has
`--fast`: recoding is for the smallest store. A chunk coded in segments (floatseg, `add
--segments`) is coded in segments again, as its add asked for random reads. A file whose header
was malformed keeps the quick codecs its add gave it.
"""
from __future__ import annotations

import time

from lmzfs.codecs import encode_chunk
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.rewrite import (Progress, Recoding, RecodeJob, RewriteResult, measure, recode_chunks,
                                 store_reader, writing)
from lmzfs.store.rewritescan import chunks_of, scan_models


def best_alone(job: RecodeJob, plain: bytes, ref: bytes | None) -> Recoding | None:
    """The chunk's smallest payload coded alone, if smaller than what it has."""
    chunk = job.chunk
    got = encode_chunk(plain, chunk.hint, fast=chunk.hostile, thorough=not chunk.hostile,
                       segments=chunk.extent.codec == "floatseg")
    return Recoding(got.payload, got.codec) if len(got.payload) < chunk.extent.location.length else None


def recode_store(store: StorePaths, model: str | None = None, *, progress: Progress | None = None,
                 workers: int | None = None) -> RewriteResult:
    started = time.monotonic()
    with writing(store) as catalog:
        if model is not None and catalog.model(model) is None:
            raise StoreError(f"no model named {model!r} (see `lmz ls`)")
        result = RewriteResult("recode", measure(store, catalog), measure(store, catalog))
        with store_reader(store) as archive:
            chunks = chunks_of(scan_models(archive, None if model is None else {model}))
            jobs = [RecodeJob(c) for c in chunks.values() if c.extent.size]
            recode_chunks(store, catalog, archive, jobs, best_alone, result, progress, workers)
        result.after = measure(store, catalog)
    result.seconds = time.monotonic() - started
    return result
