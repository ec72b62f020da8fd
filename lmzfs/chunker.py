"""Cuts a parsed file into chunks: never across a segment boundary, so identical tensors in
different files and models produce identical chunks and are stored once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from lmzfs.codecs.base import ChunkHint
from lmzfs.formats.segments import FileLayout

CHUNK_SIZE = 1 << 20     # plain bytes; a multiple of every element size, and small enough for random access


@dataclass(frozen=True)
class ChunkPlan:
    offset: int
    length: int
    hint: ChunkHint


def plan_chunks(layout: FileLayout, chunk_size: int = CHUNK_SIZE) -> Iterator[ChunkPlan]:
    for seg in layout.segments:
        hint = ChunkHint(seg.dtype, seg.itemsize) if seg.kind == "tensor" else ChunkHint()
        step = chunk_size
        if seg.itemsize > 1:
            step -= chunk_size % seg.itemsize
        pos = seg.offset
        while pos < seg.end:
            n = min(step, seg.end - pos)
            yield ChunkPlan(pos, n, hint)
            pos += n
