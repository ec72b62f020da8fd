"""Cuts a parsed file into chunks: never across a segment boundary, so identical tensors in
different files and models produce identical chunks and are stored once. A segment that names
places to cut (a run of strings) is cut at the last of them that fits a chunk."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Iterator

from lmzfs.formats.gguf import GGML_TYPES
from lmzfs.formats.segments import FileLayout

CHUNK_SIZE = 1 << 20     # plain bytes; a multiple of every element size, and small enough for random access
# Float tensors (FLOAT_DTYPES) of a new store are cut at 4 MiB: their codec (floatseg) decodes
# 256 KiB segments on their own, so a random read of a larger chunk costs about the same, while a
# sequential read builds a quarter of the tables (docs/operations.md, "Stores and reads").
FLOAT_CHUNK_SIZE = 4 << 20
# The dtypes floatsplit and floatseg code (codecs/floatsplit.FORMAT_OF; a test keeps the two equal).
FLOAT_DTYPES = frozenset({"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E4M3FN", "F8E4M3", "F8_E5M2", "F8E5M2"})
# `lmz add --chunk-size` bounds: below 64 KiB per-chunk costs (tables, catalog rows) dominate;
# above 16 MiB a single miss would hold a reader (and the cache budget) for too long
MIN_CHUNK_SIZE, MAX_CHUNK_SIZE = 64 << 10, 16 << 20
# bytes per block of each block-quantised ggml type ("Q4_1" -> 20)
BLOCK_BYTES = {t.name: t.type_size for t in GGML_TYPES.values() if t.block_size > 1}


@dataclass(frozen=True)
class ChunkHint:
    """What the chunker knows about a chunk's bytes; codecs use it to choose a transform.

    dtype is the Segment dtype ("F32", "BF16", "Q4_1", ...) or None for headers and opaque data;
    itemsize is the element size in bytes (0 when unknown or block-quantised); block_bytes is the
    size of one block of a block-quantised dtype (0 otherwise); the chunker cuts such tensors at
    whole blocks. shape is the tensor's shape (row-major) when known; offset is the chunk's byte
    offset within its tensor (so a codec can tell where rows start).
    """

    dtype: str | None = None
    itemsize: int = 0
    block_bytes: int = 0
    shape: tuple[int, ...] | None = None
    offset: int = 0


@dataclass(frozen=True)
class ChunkPlan:
    offset: int
    length: int
    hint: ChunkHint


@dataclass(frozen=True)
class ChunkSizes:
    """Plain bytes per chunk: `floats` for tensors of FLOAT_DTYPES, `other` for every other
    segment (tensors of other dtypes, headers, opaque bytes). A store records the sizes it was
    created with and cuts every file it stores by them, so that the same tensor always makes
    the same chunks (chunks cut at different sizes do not deduplicate)."""

    other: int = CHUNK_SIZE
    floats: int = FLOAT_CHUNK_SIZE

    @classmethod
    def uniform(cls, size: int) -> "ChunkSizes":
        return cls(size, size)

    def for_segment(self, kind: str, dtype: str | None) -> int:
        return self.floats if kind == "tensor" and dtype in FLOAT_DTYPES else self.other


# What a new store records (and `lmz pack`, `lmz inspect` cut by)
NEW_STORE_SIZES = ChunkSizes()
# What a store created before stores recorded their sizes cuts by: every segment at 1 MiB
LEGACY_SIZES = ChunkSizes.uniform(CHUNK_SIZE)


def plan_chunks(layout: FileLayout, sizes: ChunkSizes = NEW_STORE_SIZES) -> Iterator[ChunkPlan]:
    for seg in layout.segments:
        hint = ChunkHint()
        unit = 1
        if seg.kind == "tensor":
            block = BLOCK_BYTES.get(seg.dtype or "", 0) if seg.itemsize == 0 else 0
            hint = ChunkHint(seg.dtype, seg.itemsize, block, seg.shape)
            unit = block or seg.itemsize or 1
        elif seg.dtype:
            hint = ChunkHint(seg.dtype)     # a typed header segment: a run of strings
        chunk_size = sizes.for_segment(seg.kind, seg.dtype)
        step = chunk_size
        if unit > 1 and chunk_size >= unit:
            step -= chunk_size % unit
        pos = seg.offset
        while pos < seg.end:
            n = min(step, seg.end - pos)
            if seg.cuts and pos + n < seg.end:
                i = bisect.bisect_right(seg.cuts, pos + n) - 1
                if i >= 0 and seg.cuts[i] > pos:
                    n = seg.cuts[i] - pos
            yield ChunkPlan(pos, n, replace(hint, offset=pos - seg.offset) if hint.dtype and seg.kind == "tensor" else hint)
            pos += n
