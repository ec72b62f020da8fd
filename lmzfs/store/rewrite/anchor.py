"""`lmz rewrite anchor MODEL`: store every delta chunk of MODEL alone again (with the best codec
for it alone, however much larger), so that no read of MODEL needs another chunk and removing any
other model can never cost it a byte.

The references it leaves lose one count each and, once nothing else needs them, are dead space
for `lmz rewrite compact` (or `lmz gc`). A chunk of MODEL that other chunks are coded against
keeps its plain bytes and so serves them as before: its own payload may change, theirs do not.
"""
from __future__ import annotations

import time

from lmzfs.codecs import encode_chunk
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.rewrite.run import (Progress, Recoding, RecodeJob, RewriteResult, measure, recode_chunks,
                                 store_reader, writing)
from lmzfs.store.rewrite.scan import chunks_of, scan_models


def alone(job: RecodeJob, plain: bytes, ref: bytes | None) -> Recoding:
    chunk = job.chunk
    got = encode_chunk(plain, chunk.hint, fast=chunk.hostile, thorough=not chunk.hostile)
    return Recoding(got.payload, got.codec)


def anchor_store(store: StorePaths, model: str, *, progress: Progress | None = None,
                 workers: int | None = None) -> RewriteResult:
    started = time.monotonic()
    with writing(store) as catalog:
        if catalog.model(model) is None:
            raise StoreError(f"no model named {model!r} (see `lmz ls`)")
        result = RewriteResult("anchor", measure(store, catalog), measure(store, catalog))
        with store_reader(store) as source:
            chunks = chunks_of(scan_models(catalog, source, {model}))
            jobs = [RecodeJob(c) for c in chunks.values() if c.extent.base is not None]
            recode_chunks(store, catalog, source, jobs, alone, result, progress, workers)
        result.after = measure(store, catalog)
    result.seconds = time.monotonic() - started
    return result
