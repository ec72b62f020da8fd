"""A check for hostile payloads: refused with CodecError, quickly, without allocating much.

The bounds are generous (a decoder that loops or allocates what a header claims fails them by
orders of magnitude), so that a busy machine does not make the check flaky.
"""
from __future__ import annotations

import time
import tracemalloc

from lmzfs.codecs import CodecError, decode_chunk


def assert_rejected_quickly_and_small(payload: bytes, size: int, *, seconds: float, peak_bytes: int) -> None:
    """decode_chunk(payload, size) raises CodecError within ``seconds``, its Python allocations
    peaking below ``peak_bytes``."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        try:
            decode_chunk(payload, size)
        except CodecError:
            pass
        else:
            raise AssertionError(f"a hostile {len(payload)}-byte payload was decoded, not refused")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    assert elapsed < seconds, f"refusing a hostile {len(payload)}-byte payload took {elapsed:.2f} s"
    assert peak < peak_bytes, f"a hostile {len(payload)}-byte payload allocated {peak} bytes"
