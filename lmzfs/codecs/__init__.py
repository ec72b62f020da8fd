"""Chunk codecs: a registry by stable id, the self-describing payload header, encode/decode.

Every stored chunk is one *payload* (format described in docs/format.md)::

    b"LC" | version (1 byte, = 1) | codec id (1 byte) | plain size (varint)
          | params length (varint) | params | body (to the end of the payload)

``encode_chunk`` measures the candidate codecs for a chunk and keeps the smallest payload;
``decode_chunk`` never guesses: it dispatches on the recorded codec id and checks every field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..chunker import ChunkHint
from .base import VARINT_MAX_BYTES, Buffer, Codec, CodecError, DeltaCodec, PartDecoder, get_varint, put_varint
from .blockdelta import BlockDeltaCodec
from .bytegroup import ELEMENT_SIZES, BytegroupCodec
from .entropy import EntropyCodec, every_trial, order0_bytes
from .floatseg import SEGMENT_LOG, FloatSegCodec
from .floatsplit import FORMAT_OF, FloatSplitCodec
from .ggufblocks import TYPE_OF, GgufBlocksCodec
from .raw import RawCodec
from .strings import StringsCodec
from .strings import DTYPE as STRINGS_DTYPE
from .ulpdelta import UlpDeltaCodec
from .xordelta import XorZstdCodec
from .zstd import DEFAULT_LEVEL, ZstdCodec

__all__ = [
    "MAGIC", "FORMAT_VERSION", "REGISTRY", "Codec", "CodecError", "ChunkHint", "EncodedChunk",
    "PayloadHeader", "DELTA_CODECS", "by_name", "encode_chunk", "decode_chunk", "decode_chunk_segments", "decode_segments_from", "PayloadParts", "payload_parts_from",
    "parse_payload", "encode_with", "encode_delta_chunk", "needs_reference", "encode_delta_with", "SEGMENT_BYTES",
]

MAGIC = b"LC"
FORMAT_VERSION = 1

REGISTRY: dict[int, Codec] = {c.id: c for c in (RawCodec(), ZstdCodec(), BytegroupCodec(), FloatSplitCodec(),
                                                 EntropyCodec(), GgufBlocksCodec(), FloatSegCodec(),
                                                 XorZstdCodec(), UlpDeltaCodec(), BlockDeltaCodec(),
                                                 StringsCodec())}
# The delta codecs (Codec.reference): encode_delta_chunk tries them, encode_chunk never does.
DELTA_CODECS: tuple[DeltaCodec, ...] = tuple(c for c in REGISTRY.values() if c.reference)
_BY_NAME: dict[str, Codec] = {c.name: c for c in REGISTRY.values()}
assert len(_BY_NAME) == len(REGISTRY) and all(0 <= i <= 255 for i in REGISTRY)

# Ties between equally small payloads go to the codec that decodes fastest.
_DECODE_COST = {RawCodec.id: 0, ZstdCodec.id: 1, BytegroupCodec.id: 2, FloatSplitCodec.id: 3,
                FloatSegCodec.id: 3, GgufBlocksCodec.id: 3, EntropyCodec.id: 4, XorZstdCodec.id: 2,
                UlpDeltaCodec.id: 4, BlockDeltaCodec.id: 4, StringsCodec.id: 2}
# zstd at this level is also tried when level-DEFAULT already halves a chunk (text, metadata).
TEXT_LEVEL = 19
# tANS coders are only tried on chunks at least this long (below it their tables cost more).
MIN_ENTROPY_SIZE = 256
# Float chunks longer than this are coded in segments of it (floatseg), which a reader can decode
# one at a time: a random small read that misses the cache decodes a quarter of a 1 MiB chunk,
# not all of it. encode_chunk(segments=False) (`lmz add --no-segments`) codes them whole
# (floatsplit): a whole chunk then decodes as one stream, a little faster (docs/results.md).
SEGMENT_BYTES = 1 << SEGMENT_LOG


def by_name(name: str) -> Codec:
    """The registered codec called ``name`` ("raw", "zstd", "bytegroup", "floatsplit", ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown codec {name!r}; known: {', '.join(_BY_NAME)}") from None


@dataclass(frozen=True)
class EncodedChunk:
    payload: bytes
    codec: str  # name of the codec recorded in the payload


@dataclass(frozen=True)
class PayloadHeader:
    version: int
    codec_id: int
    size: int             # plain size recorded in the header
    params: memoryview
    body: memoryview


def _header(codec_id: int, size: int, params: bytes) -> bytes:
    return MAGIC + bytes((FORMAT_VERSION, codec_id)) + put_varint(size) + put_varint(len(params)) + params


def _as_bytes_view(data: Buffer) -> memoryview:
    mv = memoryview(data)
    if mv.ndim != 1 or mv.format != "B" or mv.itemsize != 1:
        mv = mv.cast("B")  # raises TypeError for non-contiguous buffers
    return mv


def encode_with(codec: Codec | str, data: Buffer, hint: ChunkHint = ChunkHint()) -> bytes:
    """The payload of ``data`` under one given codec (no choice made); mainly for tests/fixtures."""
    if isinstance(codec, str):
        codec = by_name(codec)
    mv = _as_bytes_view(data)
    params, body = codec.encode(mv, hint)
    return _header(codec.id, len(mv), params) + body


def candidates(hint: ChunkHint, size: int, level: int = DEFAULT_LEVEL, fast: bool = False,
               segments: bool = True) -> list[Codec]:
    """The codecs encode_chunk tries for a chunk of ``size`` bytes with this hint; ``fast`` leaves
    out the entropy-coded ones (floatsplit, ggufblocks, entropy), which decode several times slower;
    ``segments`` codes float chunks over SEGMENT_BYTES with floatseg, else floatsplit."""
    if not size:
        return []
    dtype = (hint.dtype or "").upper()
    if dtype == STRINGS_DTYPE:
        # on tokenizer arrays zstd of the strings without their lengths beats zstd of the whole
        # chunk at any level, and the slow level it would go on to try costs many times as long
        return [REGISTRY[StringsCodec.id]]
    out: list[Codec] = [ZstdCodec(level) if level != DEFAULT_LEVEL else REGISTRY[ZstdCodec.id]]
    if hint.itemsize in ELEMENT_SIZES and size >= hint.itemsize:
        out.append(REGISTRY[BytegroupCodec.id])
    if size >= MIN_ENTROPY_SIZE and not fast:
        if dtype in FORMAT_OF:
            out.append(REGISTRY[FloatSegCodec.id if segments and size > SEGMENT_BYTES else FloatSplitCodec.id])
        elif dtype in TYPE_OF:
            out.append(REGISTRY[GgufBlocksCodec.id])
        else:
            out.append(REGISTRY[EntropyCodec.id])
    return out


def _order0_bytes(mv: memoryview) -> float:
    """The order-0 entropy of the bytes, in bytes: about what the entropy codec can reach."""
    return order0_bytes(np.frombuffer(mv, dtype=np.uint8), 256)


# The TEXT_LEVEL trial is left out where it is estimated to come out more than this factor above
# the best payload so far: its gain over the default level is measured on the first
# TEXT_SAMPLE_BYTES of the chunk and applied to the whole. On int8 weights the slow level runs
# at a few MB/s, so a larger slice costs more than the rest of the chunk's trials together, and
# on the corpus this slice's gain is within a few points of the whole chunk's (the slack and the
# entropy coder's lead cover it). Chunks under TEXT_SAMPLE_MIN always try it.
TEXT_SLACK = 1.02
TEXT_SAMPLE_BYTES = 32 << 10
TEXT_SAMPLE_MIN = 64 << 10


def _text_level_may_win(mv: memoryview, hint: ChunkHint, level: int, default_len: int, best_len: int) -> bool:
    """Whether zstd at TEXT_LEVEL may beat best_len, given the length at ``level``: on text
    and metadata (where zstd is the best coding) always; on weights that an entropy coder
    already codes well below zstd (int8 tables with many zeros), only if a slice says so. The
    slow level costs many times the other trials together there."""
    if default_len <= best_len * TEXT_SLACK or len(mv) < TEXT_SAMPLE_MIN:
        return True
    part = mv[:TEXT_SAMPLE_BYTES]
    gain = len(ZstdCodec(TEXT_LEVEL).encode(part, hint)[1]) / max(1, len(ZstdCodec(level).encode(part, hint)[1]))
    return default_len * gain <= best_len * TEXT_SLACK


# On typed chunks of at least ZSTD_SAMPLE_MIN bytes that an entropy coder also codes, the entropy
# coder is tried first, then bytegroup and whole-chunk zstd, each only where it may win: its
# size is estimated from two ZSTD_SAMPLE_BYTES slices (at a quarter and three quarters of the
# chunk, on element boundaries), and the trial is left out when that estimate exceeds the best
# payload by more than ZSTD_SLACK (for zstd, also unless it may come near halving the chunk,
# where the slow level would be tried after it, see TEXT_LEVEL). The slices' estimate is 0.78 to
# 1.03 of the whole chunk's coding on the corpus, lower where repeats lie further apart than a
# slice; on no corpus chunk of this kind does either beat the entropy coders' payload (bytegroup
# comes within 0.2% at best), and this slack leaves out the zstd trial on K-quant chunks, where
# zstd comes within a few percent of ggufblocks (tests/test_encode_speed_choice.py bounds what
# the estimates cost against trying everything).
ZSTD_SAMPLE_MIN = 256 << 10
ZSTD_SAMPLE_BYTES = 64 << 10
ZSTD_SLACK = 1.015
ZSTD_HALVING = 0.55     # estimated zstd size over the chunk's at or under which it is tried anyway
_ENTROPY_CODED = (FloatSegCodec.id, FloatSplitCodec.id, GgufBlocksCodec.id, EntropyCodec.id)
_SAMPLED = (BytegroupCodec.id, ZstdCodec.id)     # tried last, on slices first, in this order


def _may_win(codec: Codec, mv: memoryview, hint: ChunkHint, best_len: int) -> bool:
    size = len(mv)
    k = hint.itemsize if codec.id == BytegroupCodec.id else 1
    coded = 0
    for a in (size // 4, 3 * size // 4):
        a -= a % k
        params, body = codec.encode(mv[a:a + ZSTD_SAMPLE_BYTES], hint)
        coded += len(params) + len(body)
    estimate = coded * size / (2 * ZSTD_SAMPLE_BYTES)
    return estimate <= best_len * ZSTD_SLACK or (codec.id == ZstdCodec.id and estimate <= size * ZSTD_HALVING)


def encode_chunk(data: Buffer, hint: ChunkHint = ChunkHint(), *, level: int = DEFAULT_LEVEL,
                 fast: bool = False, segments: bool = True, thorough: bool = True,
                 exhaustive: bool = False) -> EncodedChunk:
    """Encode one chunk with whichever codec gives the smallest payload.

    Candidates (see ``candidates``): zstd always; bytegroup for element sizes 2, 4 and 8;
    floatsplit for float dtypes (floatseg above SEGMENT_BYTES unless ``segments`` is False), ggufblocks for GGUF
    block-quantised dtypes and entropy for everything else, on chunks of at least MIN_ENTROPY_SIZE bytes; zstd at TEXT_LEVEL when the
    default level already halves the chunk; raw whenever nothing beats it. ``level`` is the zstd
    level (an encoder setting, not recorded). ``exhaustive``: no trial is left out on an
    estimate (here or in the codecs' coded streams), the yardstick the estimates are tested
    against; slower, never the default.
    """
    if exhaustive:
        with every_trial():
            return _encode_chunk(data, hint, level, fast, segments, thorough, True)
    return _encode_chunk(data, hint, level, fast, segments, thorough, False)


def _encode_chunk(data: Buffer, hint: ChunkHint, level: int, fast: bool, segments: bool, thorough: bool,
                  exhaustive: bool) -> EncodedChunk:
    mv = _as_bytes_view(data)
    size = len(mv)
    best_id, best_params, best_body = RawCodec.id, b"", None
    best_len = len(_header(RawCodec.id, size, b"")) + size
    text_trial = 0      # the zstd candidate's payload length, where it halves the chunk
    tried = candidates(hint, size, level, fast, segments)
    sampled = not exhaustive and size >= ZSTD_SAMPLE_MIN and bool(hint.dtype) and \
        any(c.id in _ENTROPY_CODED for c in tried)
    if sampled:
        tried = [c for c in tried if c.id not in _SAMPLED] + \
            sorted((c for c in tried if c.id in _SAMPLED), key=lambda c: _SAMPLED.index(c.id))
    for codec in tried:
        if codec.id == EntropyCodec.id and not exhaustive and _order0_bytes(mv) * 0.97 + 64 >= best_len:
            continue    # order-0 coding cannot win (zstd found repeats): skip its time and memory
        if sampled and codec.id in _SAMPLED and not _may_win(codec, mv, hint, best_len):
            continue
        params, body = codec.encode(mv, hint)
        n = len(_header(codec.id, size, params)) + len(body)
        if n < best_len or (n == best_len and _DECODE_COST[codec.id] < _DECODE_COST[best_id]):
            best_id, best_params, best_body, best_len = codec.id, params, body, n
        # --fast keeps the slow level for what has no tensor dtype (headers, metadata, opaque
        # files): on int8 tensors it costs many times the rest of a fast add
        if thorough and codec.id == ZstdCodec.id and len(body) * 2 <= size and level < TEXT_LEVEL and \
                not (fast and hint.dtype):
            text_trial = n
    # Last, once every other candidate has been measured: the slow level only where it may win.
    if text_trial and (exhaustive or _text_level_may_win(mv, hint, level, text_trial, best_len)):
        body = ZstdCodec(TEXT_LEVEL).encode(mv, hint)[1]
        n = len(_header(ZstdCodec.id, size, b"")) + len(body)
        if n < best_len or (n == best_len and _DECODE_COST[ZstdCodec.id] < _DECODE_COST[best_id]):
            best_id, best_params, best_body, best_len = ZstdCodec.id, b"", body, n
    if best_body is None:
        best_body = mv.tobytes()
    payload = _header(best_id, size, best_params) + best_body
    return EncodedChunk(payload, REGISTRY[best_id].name)


def encode_delta_with(codec: DeltaCodec | str, data: Buffer, ref: Buffer, hint: ChunkHint = ChunkHint()) -> bytes:
    """The payload of ``data`` coded against ``ref`` under one given delta codec; for tests/fixtures."""
    if isinstance(codec, str):
        codec = by_name(codec)
    mv, rv = _as_bytes_view(data), _as_bytes_view(ref)
    got = codec.encode_delta(mv, rv, hint)
    if got is None:
        raise ValueError(f"{codec.name} does not code {hint.dtype or 'untyped'} chunks")
    return _header(codec.id, len(mv), got[0]) + got[1]


def encode_delta_chunk(data: Buffer, ref: Buffer, hint: ChunkHint = ChunkHint()) -> EncodedChunk | None:
    """The smallest payload of ``data`` coded against ``ref`` (the plain bytes of another chunk of
    the same size) under any delta codec that applies to the hint, or None if none applies.
    Whether the delta is worth keeping (smaller than the chunk coded alone) is the caller's call."""
    mv, rv = _as_bytes_view(data), _as_bytes_view(ref)
    if len(mv) != len(rv):
        raise ValueError(f"reference of {len(rv)} bytes for a chunk of {len(mv)}")
    best: tuple[int, int, bytes] | None = None
    for codec in DELTA_CODECS:
        got = codec.encode_delta(mv, rv, hint)
        if got is None:
            continue
        payload = _header(codec.id, len(mv), got[0]) + got[1]
        if best is None or len(payload) < best[0] or \
                (len(payload) == best[0] and _DECODE_COST[codec.id] < _DECODE_COST[best[1]]):
            best = (len(payload), codec.id, payload)
    return None if best is None else EncodedChunk(best[2], REGISTRY[best[1]].name)


def needs_reference(payload: Buffer) -> bool:
    """Whether a payload is coded against a reference chunk (its codec is a delta codec)."""
    return REGISTRY[parse_payload(payload).codec_id].reference


def parse_payload(payload: Buffer) -> PayloadHeader:
    """Split a payload into its header fields, params and body; CodecError if malformed."""
    mv = _as_bytes_view(payload)
    version, codec_id, size, pos, plen = _header_fields(mv)
    if pos + plen > len(mv):
        raise CodecError(f"truncated payload: params length {plen} runs past the end")
    return PayloadHeader(version, codec_id, size, mv[pos:pos + plen], mv[pos + plen:])


def _header_fields(mv: memoryview) -> tuple[int, int, int, int, int]:
    """(version, codec id, plain size, params offset, params length) of a payload or its start."""
    if len(mv) < 4:
        raise CodecError(f"truncated payload: {len(mv)} bytes, the fixed header alone is 4")
    if mv[:2] != MAGIC:
        raise CodecError(f"bad payload magic {bytes(mv[:2])!r}, expected {MAGIC!r}")
    version, codec_id = mv[2], mv[3]
    if version != FORMAT_VERSION:
        raise CodecError(f"unsupported payload format version {version} (this build reads {FORMAT_VERSION})")
    if codec_id not in REGISTRY:
        raise CodecError(f"unknown codec id {codec_id}")
    size, pos = get_varint(mv, 4, "plain size")
    plen, pos = get_varint(mv, pos, "params length")
    return version, codec_id, size, pos, plen


def decode_chunk(payload: Buffer, size: int, *, hash_checked: bool = False, copy: bool = True,
                 ref: Buffer | None = None) -> Buffer:
    """Decode a payload that must hold exactly ``size`` plain bytes, or raise CodecError.

    ref: the plain bytes of the reference chunk, for a payload of a delta codec, which needs it;
    a payload of any other codec given one, or a delta payload given none, is refused (the store
    and the payload disagree about what the chunk is).

    hash_checked=True: the caller checks a hash of the result (the store's SHA-256, a single-file
    record's CRC-32), so the codecs skip their own CRC-32 of it (a fifth of a float chunk's decode).
    copy=False: the result may be a byte-format memoryview of the codec's own array instead of
    bytes (Codec.decode_buffer); with copy (the default) it is always bytes.
    """
    h = parse_payload(payload)
    if h.size != size:
        raise CodecError(f"payload records plain size {h.size}, expected {size}")
    codec = REGISTRY[h.codec_id]
    if codec.reference != (ref is not None):
        raise CodecError(f"{codec.name} payload {'needs a' if codec.reference else 'takes no'} reference chunk")
    if codec.reference:
        out = codec.decode_delta(h.params, h.body, size, _as_bytes_view(ref), check=not hash_checked)
    else:
        out = (codec.decode if copy else codec.decode_buffer)(h.params, h.body, size, check=not hash_checked)
    if len(out) != size:  # codecs check this themselves; this is the last line of defence
        raise CodecError(f"{codec.name} decoded {len(out)} bytes, expected {size}")
    return out


def decode_chunk_segments(payload: Buffer, size: int, lo: int, hi: int) -> list[tuple[int, bytes]] | None:
    """For a chunk whose codec decodes in segments (floatseg): (start, plain bytes) of each
    segment that plain bytes [lo, hi) touch, each checked against its CRC-32; None for others."""
    mv = _as_bytes_view(payload)
    return decode_segments_from(lambda a, n: mv[a:a + n], len(mv), size, lo, hi)


# What decode_segments_from reads first: the header and params (floatseg's are under 1 KiB).
SEGMENT_HEAD_BYTES = 4096


@dataclass(frozen=True)
class PayloadParts:
    """A payload's part decoder and where its body starts in the payload: what a reader keeps
    to decode more parts of the chunk later without reading and parsing its params again."""
    decoder: PartDecoder
    body_at: int

    @property
    def nbytes(self) -> int:
        return self.decoder.nbytes

    def decode_from(self, read: Callable[[int, int], Buffer], lo: int, hi: int) -> list[tuple[int, bytes]]:
        """The parts [lo, hi) touches, reading payload bytes through read(start, n)."""
        return self.decoder.decode_from(lambda a, n: read(self.body_at + a, n), lo, hi)


def payload_parts_from(read: Callable[[int, int], Buffer], length: int, size: int,
                       *, head: int = SEGMENT_HEAD_BYTES) -> PayloadParts | None:
    """The part decoder of a payload of `length` bytes that read(start, n) returns parts of (n
    bytes, fewer only where the payload is truncated), reading its header and params only;
    None for codecs that decode whole chunks only."""
    first = _as_bytes_view(read(0, min(length, max(head, 4 + 2 * VARINT_MAX_BYTES))))   # the header's varints
    _, codec_id, psize, pos, plen = _header_fields(first)
    codec = REGISTRY[codec_id]
    if not codec.part_bytes:
        return None
    if psize != size:
        raise CodecError(f"payload records plain size {psize}, expected {size}")
    if pos + plen > length:
        raise CodecError(f"truncated payload: params length {plen} runs past the end")
    if pos + plen > len(first):
        first = _as_bytes_view(read(0, pos + plen))
    if len(first) < pos + plen:
        raise CodecError("truncated payload: params cut short")
    body = pos + plen
    return PayloadParts(codec.part_decoder(first[pos:body], length - body, size), body)


def decode_segments_from(read: Callable[[int, int], Buffer], length: int, size: int, lo: int, hi: int,
                         *, head: int = SEGMENT_HEAD_BYTES) -> list[tuple[int, bytes]] | None:
    """decode_chunk_segments for a payload of `length` bytes that read(start, n) returns parts
    of (n bytes, fewer only where the payload is truncated): it reads the header and params,
    then only the body bytes of the segments [lo, hi) touch (a quarter of a 1 MiB chunk's, for
    a small read), not the whole payload. None for codecs without segments."""
    parts = payload_parts_from(read, length, size, head=head)
    return None if parts is None else parts.decode_from(read, lo, hi)
