"""`lmz unpack`: a single-file archive back into the original file, checked before it appears.

Records are read in order and decoded in a thread pool with a bounded window; each chunk's CRC
is checked as it is decoded, the whole file's SHA-256 against the trailer at the end. Output goes
to a temporary file beside the destination that is renamed into place only after every check
has passed, so a damaged or hostile archive never leaves a file at the destination.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from lmzfs.codecs import CodecError, decode_chunk

from .errors import InvalidArchive, OutputLimitExceeded
from .format import (HEADER_SIZE, RECORD_HEADER_SIZE, TRAILER_MAGIC, TRAILER_SIZE, Header, RecordHeader, Trailer,
                     crc32, read_exact)
from .publish import PendingOutput, check_destination, check_source, published
from .report import UnpackReport, write_report
from .window import ordered_map

Progress = Callable[[int, int], None]


@dataclass
class _Walk:
    """Totals of the records read so far, checked against the trailer."""
    pos: int = HEADER_SIZE        # archive offset of the next unread byte
    chunks: int = 0
    plain: int = 0
    payload: int = 0


def unpack_file(src: str | os.PathLike, dest: str | os.PathLike, *, max_output_bytes: int,
                overwrite: bool = False, report: str | os.PathLike | None = None,
                progress: Progress | None = None, workers: int | None = None) -> UnpackReport:
    """Unpack the archive ``src`` into ``dest``, refusing to produce more than ``max_output_bytes``.

    Raises InvalidArchive, OutputLimitExceeded or UsageError; on any failure ``dest`` is
    untouched and no temporary file is left.
    """
    if max_output_bytes < 0:
        raise ValueError("max_output_bytes must be >= 0")
    src, dest = Path(src), Path(dest)
    check_source(src, regular=False)
    check_destination(dest, overwrite, report)
    started = time.monotonic()
    result = UnpackReport(str(src), str(dest))
    with open(src, "rb", buffering=1 << 20) as f:
        header = Header.unpack(f.read(HEADER_SIZE))
        if header.plain_size > max_output_bytes:
            raise OutputLimitExceeded(f"{src} unpacks to {header.plain_size} bytes, more than --max-output-bytes "
                                      f"{max_output_bytes}; nothing was written")
        with published(dest, overwrite) as out:
            _unpack_records(f, header, out, max_output_bytes, result, progress, workers)
    result.seconds = time.monotonic() - started
    if report is not None:
        write_report(report, result)
    return result


def _unpack_records(f: BinaryIO, header: Header, out: PendingOutput, limit: int, result: UnpackReport,
                    progress: Progress | None, workers: int | None) -> None:
    walk = _Walk()
    whole = hashlib.sha256()
    written = 0
    for plain in ordered_map(_decode_checked, _records(f, header, walk), workers=workers):
        if written + len(plain) > limit:    # the header check makes this unreachable; kept as a backstop
            raise OutputLimitExceeded(f"output would exceed --max-output-bytes {limit}")
        whole.update(plain)
        out.file.write(plain)
        written += len(plain)
        if progress:
            progress(written, header.plain_size)

    trailer = Trailer.unpack(read_exact(f, TRAILER_SIZE, "trailer", walk.pos), walk.pos)
    expected = (header.plain_size, walk.chunks, walk.payload)
    if (trailer.plain_size, trailer.chunk_count, trailer.payload_bytes) != expected:
        raise InvalidArchive(f"trailer records {trailer.plain_size} bytes in {trailer.chunk_count} chunks with "
                             f"{trailer.payload_bytes} payload bytes; the archive holds {expected[0]} bytes in "
                             f"{expected[1]} chunks with {expected[2]} payload bytes")
    if f.read(1):
        raise InvalidArchive(f"trailing data after the trailer, which ends at offset {walk.pos + TRAILER_SIZE}")
    if whole.digest() != trailer.sha256:
        raise InvalidArchive(f"SHA-256 of the unpacked data {whole.hexdigest()} differs from the recorded "
                             f"{trailer.sha256.hex()}; nothing was written")
    result.archive_bytes = walk.pos + TRAILER_SIZE
    result.plain_bytes = written
    result.chunks = walk.chunks
    result.sha256 = whole.hexdigest()


def _records(f: BinaryIO, header: Header, walk: _Walk):
    """Read record headers and payloads until they add up to the declared size; jobs for decoding."""
    while walk.plain < header.plain_size:
        raw = read_exact(f, RECORD_HEADER_SIZE, f"header of chunk {walk.chunks}", walk.pos)
        if raw.startswith(TRAILER_MAGIC):   # as a plain length it would be over the bound anyway
            raise InvalidArchive(f"the trailer follows chunk {walk.chunks - 1} at plain offset {walk.plain}, but the "
                                 f"header declares {header.plain_size} bytes: chunks do not tile the declared size")
        rec = RecordHeader.unpack(raw, walk.chunks, header.plain_size - walk.plain)
        payload = read_exact(f, rec.payload_length, f"payload of chunk {walk.chunks}", walk.pos + RECORD_HEADER_SIZE)
        yield (payload, rec, walk.chunks, walk.plain), rec.plain_length + rec.payload_length
        walk.pos += RECORD_HEADER_SIZE + rec.payload_length
        walk.chunks += 1
        walk.plain += rec.plain_length
        walk.payload += rec.payload_length


def _decode_checked(payload: bytes, rec: RecordHeader, index: int, offset: int) -> bytes:
    try:
        plain = decode_chunk(payload, rec.plain_length, hash_checked=True)   # the record's CRC-32 below
    except CodecError as exc:
        raise InvalidArchive(f"chunk {index} (plain offset {offset}): {exc}") from None
    if crc32(plain) != rec.plain_crc32:
        raise InvalidArchive(f"chunk {index} (plain offset {offset}): CRC-32 mismatch, the chunk is damaged")
    return plain
