"""`lmz pack`: one model file into one single-file archive, streaming, with bounded memory.

The source is read chunk by chunk with pread (not mmap, whose pages would count as the
process's resident memory), each chunk is encoded by the store's codecs in a thread pool, and
the records are written in order to a temporary file that is published only when complete.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from lmzfs.chunker import ChunkPlan, plan_chunks
from lmzfs.codecs import EncodedChunk, decode_chunk, encode_chunk
from lmzfs.codecs.base import ChunkHint
from lmzfs.formats import parse_file

from .errors import SingleFileError, SourceChanged
from .format import MAX_CHUNK_BYTES, MAX_PAYLOAD_OVERHEAD, Header, RecordHeader, Trailer, crc32
from .publish import PendingOutput, check_destination, check_source, published
from .report import CodecUse, PackReport, write_report
from .window import ordered_map

Progress = Callable[[int, int], None]     # (plain bytes done, plain bytes total)


def pack_file(src: str | os.PathLike, dest: str | os.PathLike, *, overwrite: bool = False,
              report: str | os.PathLike | None = None, progress: Progress | None = None,
              workers: int | None = None) -> PackReport:
    """Pack ``src`` into the single-file archive ``dest``; write the JSON report to ``report`` if given.

    Raises UsageError (missing source, ``dest`` exists without ``overwrite``), SourceChanged, or
    SingleFileError; on any failure ``dest`` is untouched and no temporary file is left.
    """
    src, dest = Path(src), Path(dest)
    check_source(src, regular=True)
    check_destination(dest, overwrite, report)
    started = time.monotonic()
    result = PackReport(str(src), str(dest))
    with open(src, "rb") as f:
        before = os.fstat(f.fileno())
        layout = parse_file(src)
        if layout.size != before.st_size:
            raise SourceChanged(f"{src} changed size while being packed")
        result.format, result.plain_bytes = layout.format, layout.size
        with published(dest, overwrite) as out:
            _write_archive(f.fileno(), plan_chunks(layout), layout.size, out, result, progress, workers)
            after = os.fstat(f.fileno())
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                raise SourceChanged(f"{src} changed while being packed; pack it again when it is stable")
    result.seconds = time.monotonic() - started
    if report is not None:
        write_report(report, result)
    return result


def _write_archive(fd: int, plans: Iterator[ChunkPlan], size: int, out: PendingOutput, result: PackReport,
                   progress: Progress | None, workers: int | None) -> None:
    whole = hashlib.sha256()
    written = out.file.write(Header(size).pack())
    payload_bytes = done = 0

    def jobs():
        # Runs in this thread, in order: the whole-file hash sees the bytes in file order.
        pos = 0
        for cp in plans:
            if cp.offset != pos or not 0 < cp.length <= MAX_CHUNK_BYTES:
                raise SingleFileError(f"internal error: chunk plan ({cp.offset}, {cp.length}) does not continue "
                                      f"at {pos} within {MAX_CHUNK_BYTES} bytes")
            data = _pread_exact(fd, cp.length, cp.offset)
            whole.update(data)
            pos += cp.length
            yield (data, cp.hint, cp.offset), cp.length
        if pos != size:
            raise SingleFileError(f"internal error: chunk plans end at {pos}, the file has {size} bytes")

    for plain_len, plain_crc, enc in ordered_map(_encode_checked, jobs(), workers=workers):
        written += out.file.write(RecordHeader(plain_len, len(enc.payload), plain_crc).pack())
        written += out.file.write(enc.payload)
        payload_bytes += len(enc.payload)
        use = result.codecs.setdefault(enc.codec, CodecUse())
        use.chunks += 1
        use.plain_bytes += plain_len
        use.payload_bytes += len(enc.payload)
        result.chunks += 1
        done += plain_len
        if progress:
            progress(done, size)
    result.sha256 = whole.hexdigest()
    written += out.file.write(Trailer(result.chunks, size, payload_bytes, whole.digest()).pack())
    result.archive_bytes = written


def _encode_checked(data: bytes, hint: ChunkHint, offset: int) -> tuple[int, int, EncodedChunk]:
    """Encode one chunk and decode it again: a codec bug fails the pack, not a later unpack."""
    enc = encode_chunk(data, hint)
    if len(enc.payload) > len(data) + MAX_PAYLOAD_OVERHEAD or decode_chunk(enc.payload, len(data)) != data:
        raise SingleFileError(f"internal error: codec {enc.codec} did not round-trip the chunk at offset {offset}")
    return len(data), crc32(data), enc


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    while len(data) < n:    # short reads are legal; an empty one means the file shrank
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            raise SourceChanged(f"source shrank while being packed (no bytes at offset {offset + len(data)})")
        data += more
    return data
