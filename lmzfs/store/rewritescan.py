"""What the rewrite passes learn about stored files: each file's container layout, parsed again
through the store from its plain bytes as `lmz add` parsed the source, and so each chunk's hint
(dtype, element size, shape, offset in its tensor) and each tensor's chunks.

A chunk's boundaries never change after its add, so the hint is not re-planned: it is read off
the segment the chunk lies in, as the chunker derived it.
"""
from __future__ import annotations

import bisect
import io
from dataclasses import dataclass, replace

from lmzfs.chunker import BLOCK_BYTES
from lmzfs.codecs.base import ChunkHint
from lmzfs.formats import parse_open_file
from lmzfs.formats.segments import FileLayout, Segment
from lmzfs.reader.archive import Archive
from lmzfs.reader.filereader import FileReader
from lmzfs.store.catalog import Extent


@dataclass(frozen=True)
class StoredChunk:
    extent: Extent       # the chunk's row (its offset: where the first file scanned has it)
    hint: ChunkHint      # what the chunker knew about its bytes
    hostile: bool        # its file's header was malformed: add gave it the quick codecs only


@dataclass(frozen=True)
class TensorChunks:
    """One tensor of a stored file and the chunks that hold it, by offset inside the tensor."""
    name: str
    dtype: str | None
    shape: tuple[int, ...] | None
    length: int
    chunks: tuple[tuple[int, Extent], ...]


@dataclass(frozen=True)
class StoredFile:
    model: str
    path: str
    format: str
    extents: tuple[Extent, ...]
    tensors: tuple[TensorChunks, ...]
    hints: tuple[ChunkHint, ...]      # one per extent
    hostile: bool


class _StoredBytes(io.RawIOBase):
    """A stored file as a seekable binary file, read through its FileReader (for the parsers)."""

    def __init__(self, reader: FileReader):
        self._reader = reader
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._reader.size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf) -> int:
        n = max(0, min(len(buf), self._reader.size - self._pos))
        if n:
            buf[:n] = self._reader.pread(self._pos, n)
            self._pos += n
        return n


def hint_of(layout: FileLayout, starts: list[int], offset: int, size: int) -> ChunkHint:
    """The hint the chunker gave the chunk at [offset, offset + size) of a file with this layout
    (`starts`: the segments' offsets); a chunk that lies in no one segment gets none."""
    i = bisect.bisect_right(starts, offset) - 1
    if i < 0:
        return ChunkHint()
    seg: Segment = layout.segments[i]
    if offset + size > seg.end or seg.kind != "tensor":
        return ChunkHint()
    block = BLOCK_BYTES.get(seg.dtype or "", 0) if seg.itemsize == 0 else 0
    hint = ChunkHint(seg.dtype, seg.itemsize, block, seg.shape)
    return replace(hint, offset=offset - seg.offset) if hint.dtype else hint


def scan_file(archive: Archive, entry) -> StoredFile:
    """Parse one stored file's container through the store and pair its chunks with its tensors."""
    with archive.open(entry) as reader:
        extents = reader.extents
        layout = parse_open_file(f"{entry.model}/{entry.path}", io.BufferedReader(_StoredBytes(reader), 1 << 16),
                                 entry.size)
    starts = [s.offset for s in layout.segments]
    hints = tuple(hint_of(layout, starts, e.offset, e.size) for e in extents)
    tensors = []
    ext_starts = [e.offset for e in extents]
    for seg in layout.segments:
        if seg.kind != "tensor" or seg.name is None:
            continue
        inside = []
        for e in extents[bisect.bisect_left(ext_starts, seg.offset):]:
            if e.offset + e.size > seg.end:
                break
            inside.append((e.offset - seg.offset, e))
        tensors.append(TensorChunks(seg.name, seg.dtype, seg.shape, seg.length, tuple(inside)))
    return StoredFile(entry.model, entry.path, layout.format, tuple(extents), tuple(tensors), hints,
                      layout.error is not None)


def scan_models(archive: Archive, models: set[str] | None) -> list[StoredFile]:
    """Every file of these models (None: of every model), in model and path order."""
    return [scan_file(archive, e) for e in sorted(archive.files(), key=lambda e: (e.model, e.path))
            if models is None or e.model in models]


def chunks_of(files: list[StoredFile]) -> dict[bytes, StoredChunk]:
    """Each distinct chunk of these files once, with the first typed hint any of them gives it."""
    out: dict[bytes, StoredChunk] = {}
    for f in files:
        for e, hint in zip(f.extents, f.hints):
            seen = out.get(e.chunk_id)
            if seen is None or (seen.hint.dtype is None and hint.dtype is not None):
                out[e.chunk_id] = StoredChunk(e, hint, f.hostile)
    return out
