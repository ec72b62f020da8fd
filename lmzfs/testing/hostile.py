"""Hostile inputs: a check that codec payloads are refused with CodecError, quickly, without
allocating much, and legal container files whose tensor counts are hostile.

The bounds are generous (a decoder that loops or allocates what a header claims fails them by
orders of magnitude), so that a busy machine does not make the check flaky.
"""
from __future__ import annotations

import struct
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lmzfs.codecs import CodecError, decode_chunk


@contextmanager
def within_bounds(what: str, *, seconds: float, peak_bytes: int) -> Iterator[None]:
    """The block finishes within ``seconds``, its Python allocations peaking below ``peak_bytes``
    (AssertionError naming ``what`` otherwise)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    assert elapsed < seconds, f"{what} took {elapsed:.2f} s"
    assert peak < peak_bytes, f"{what} allocated {peak} bytes"


def assert_rejected_quickly_and_small(payload: bytes, size: int, *, seconds: float, peak_bytes: int) -> None:
    """decode_chunk(payload, size) raises CodecError within ``seconds``, its Python allocations
    peaking below ``peak_bytes``."""
    with within_bounds(f"refusing a hostile {len(payload)}-byte payload", seconds=seconds, peak_bytes=peak_bytes):
        try:
            decode_chunk(payload, size)
        except CodecError:
            pass
        else:
            raise AssertionError(f"a hostile {len(payload)}-byte payload was decoded, not refused")


def many_tensor_safetensors(path: Path, tensors: int, tensor_bytes: int = 1) -> Path:
    """A legal safetensors file of ``tensors`` U8 tensors of ``tensor_bytes`` each, back to back:
    a header that costs a naive parser far more than the file's size."""
    entries = ",".join(f'"t{i:07d}":{{"dtype":"U8","shape":[{tensor_bytes}],"data_offsets":[{i * tensor_bytes},'
                       f'{(i + 1) * tensor_bytes}]}}' for i in range(tensors))
    header = ("{" + entries + "}").encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.write(bytes(range(256)) * (tensors * tensor_bytes // 256) + bytes(tensors * tensor_bytes % 256))
    return path


def many_tensor_gguf(path: Path, tensors: int, name_bytes: int = 40, elements: int = 1) -> Path:
    """A legal GGUF v3 file of ``tensors`` F32 tensors of ``elements`` each (zero-dimension ones
    when that is 1), every one at its own aligned offset."""
    dims = struct.pack("<I", 0) if elements == 1 else struct.pack("<IQ", 1, elements)
    stride = -(-4 * elements // 32) * 32
    infos = b"".join(struct.pack("<Q", name_bytes) + f"t{i:0{name_bytes - 1}d}".encode() + dims
                     + struct.pack("<IQ", 0, stride * i) for i in range(tensors))
    head = b"GGUF" + struct.pack("<IQQ", 3, tensors, 0) + infos
    with open(path, "wb") as f:
        f.write(head + bytes(-len(head) % 32))
        f.write(bytes(stride * tensors))
    return path
