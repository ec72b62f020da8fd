"""Coding a chunk against a reference chunk (the plain bytes of another chunk of the same size)
under the delta codecs, and telling which payloads need one to decode."""
from __future__ import annotations

from ..chunker import ChunkHint
from .base import Buffer, DeltaCodec
from .payload import EncodedChunk, as_bytes_view, header_bytes, parse_payload
from .registry import DELTA_CODECS, REGISTRY, beats, by_name


def encode_delta_with(codec: DeltaCodec | str, data: Buffer, ref: Buffer, hint: ChunkHint = ChunkHint()) -> bytes:
    """The payload of ``data`` coded against ``ref`` under one given delta codec; for tests/fixtures."""
    if isinstance(codec, str):
        codec = by_name(codec)
    mv, rv = as_bytes_view(data), as_bytes_view(ref)
    got = codec.encode_delta(mv, rv, hint)
    if got is None:
        raise ValueError(f"{codec.name} does not code {hint.dtype or 'untyped'} chunks")
    return header_bytes(codec.id, len(mv), got[0]) + got[1]


def encode_delta_chunk(data: Buffer, ref: Buffer, hint: ChunkHint = ChunkHint()) -> EncodedChunk | None:
    """The smallest payload of ``data`` coded against ``ref`` (the plain bytes of another chunk of
    the same size) under any delta codec that applies to the hint, or None if none applies.
    Whether the delta is worth keeping (smaller than the chunk coded alone) is the caller's call."""
    mv, rv = as_bytes_view(data), as_bytes_view(ref)
    if len(mv) != len(rv):
        raise ValueError(f"reference of {len(rv)} bytes for a chunk of {len(mv)}")
    best: tuple[int, int, bytes] | None = None
    for codec in DELTA_CODECS:
        got = codec.encode_delta(mv, rv, hint)
        if got is None:
            continue
        payload = header_bytes(codec.id, len(mv), got[0]) + got[1]
        if best is None or beats(len(payload), codec.id, best[0], best[1]):
            best = (len(payload), codec.id, payload)
    return None if best is None else EncodedChunk(best[2], REGISTRY[best[1]].name)


def needs_reference(payload: Buffer) -> bool:
    """Whether a payload is coded against a reference chunk (its codec is a delta codec)."""
    return REGISTRY[parse_payload(payload).codec_id].reference
