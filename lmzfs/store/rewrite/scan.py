"""What the rewrite passes learn about stored files: each file's container layout, parsed again
through the store from its plain bytes as `lmz add` parsed the source, and so each chunk's hint
(dtype, element size, shape, offset in its tensor) and each tensor's chunks; or, where the
catalog has the file's tensors table rows (every file `lmz add` stored since catalog version 3
with a tensor in it), each tensor's chunks from those rows without reading the file.

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
from lmzfs.errors import CorruptChunk
from lmzfs.preadio import PreadIO
from lmzfs.store.catalog import Catalog, Extent, FileRow
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.layout import StoreError


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


class _StoredBytes(PreadIO):
    """A stored file read through the chunk source."""

    def __init__(self, source: ChunkSource, extents: tuple[Extent, ...], size: int):
        self._source = source
        self._extents = extents
        self._starts = [e.offset for e in extents]
        self._size = size

    @property
    def size(self) -> int:
        return self._size

    def pread(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self._size)
        pieces = []
        i = bisect.bisect_right(self._starts, offset) - 1
        while offset < end:
            e = self._extents[i]
            piece = self._source.read(e, offset - e.offset, min(end, e.offset + e.size) - e.offset)
            pieces.append(piece)
            offset += len(piece)
            i += 1
        return b"".join(pieces)


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


def scan_file(catalog: Catalog, source: ChunkSource, row: FileRow) -> StoredFile:
    """Parse one stored file's container through the store and pair its chunks with its tensors."""
    extents = tuple(catalog.extents(row.id))
    tiles = sum(e.size for e in extents) == row.size and \
        all(a.offset + a.size == b.offset for a, b in zip(extents, extents[1:]))
    if not tiles:
        raise StoreError(f"{row.model}/{row.path}: its extents do not tile the file; run `lmz verify`")
    hold = source.hold(list(extents))
    try:
        layout = parse_open_file(f"{row.model}/{row.path}",
                                 io.BufferedReader(_StoredBytes(source, extents, row.size), 1 << 16), row.size)
    except CorruptChunk as exc:
        raise StoreError(f"the rewrite stopped and nothing changed: {exc.strerror}; run `lmz verify`") from exc
    finally:
        source.release(hold)
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
    return StoredFile(row.model, row.path, layout.format, extents, tuple(tensors), hints, layout.error is not None)


def scan_models(catalog: Catalog, source: ChunkSource, models: set[str] | None) -> list[StoredFile]:
    """Every file of these models (None: of every model), in model and path order."""
    return [scan_file(catalog, source, f) for f in catalog.files() if models is None or f.model in models]


def chunks_of(files: list[StoredFile]) -> dict[bytes, StoredChunk]:
    """Each distinct chunk of these files once, with the first typed hint any of them gives it."""
    out: dict[bytes, StoredChunk] = {}
    for f in files:
        for e, hint in zip(f.extents, f.hints):
            seen = out.get(e.chunk_id)
            if seen is None or (seen.hint.dtype is None and hint.dtype is not None):
                out[e.chunk_id] = StoredChunk(e, hint, f.hostile)
    return out


def shape_of(text: str) -> tuple[int, ...]:
    """A tensors table shape ("4,8"; "" for a scalar) as the parsers give it."""
    return tuple(int(d) for d in text.split(",")) if text else ()


def tensors_from_rows(catalog: Catalog, model: str) -> dict[int, tuple[TensorChunks, ...]]:
    """file id -> its tensors as the catalog's tensors table lists them, each with the chunks that
    hold it (by offset inside the tensor); a file without rows is absent."""
    by_file: dict[int, list[TensorChunks]] = {}
    extents: dict[int, list[Extent]] = {}
    for stored in catalog.tensors(model):
        row = stored.tensor
        if row.file not in extents:
            extents[row.file] = catalog.extents(row.file)
        es = extents[row.file]
        starts = [e.offset for e in es]
        inside = []
        for e in es[bisect.bisect_left(starts, row.offset):]:
            if e.offset + e.size > row.offset + row.size:
                break
            inside.append((e.offset - row.offset, e))
        by_file.setdefault(row.file, []).append(
            TensorChunks(row.name, row.dtype, shape_of(row.shape), row.size, tuple(inside)))
    return {fid: tuple(ts) for fid, ts in by_file.items()}
