"""Which codec codes a chunk: encode_chunk measures the candidate codecs for a chunk and keeps
the smallest payload, leaving out trials that estimates say cannot win (docs/results.md)."""
from __future__ import annotations

import logging

import numpy as np

from ..chunker import ChunkHint
from .base import Buffer, Codec
from .bytegroup import ELEMENT_SIZES, BytegroupCodec
from .entropy import EntropyCodec, every_trial, order0_bytes
from .floatseg import SEGMENT_LOG, FloatSegCodec
from .floatsplit import FORMAT_OF, FloatSplitCodec
from .ggufblocks import TYPE_OF, GgufBlocksCodec
from .payload import EncodedChunk, as_bytes_view, header_bytes
from .raw import RawCodec
from .registry import REGISTRY, beats
from .strings import DTYPE as STRINGS_DTYPE
from .strings import StringsCodec
from .zstd import DEFAULT_LEVEL, ZstdCodec

log = logging.getLogger(__name__)

# zstd at this level is also tried when level-DEFAULT already halves a chunk (text, metadata).
TEXT_LEVEL = 19
# tANS coders are only tried on chunks at least this long (below it their tables cost more).
MIN_ENTROPY_SIZE = 256
# Float chunks longer than this are coded in segments of it (floatseg), which a reader can decode
# one at a time: a random small read that misses the cache decodes a quarter of a 1 MiB chunk,
# not all of it. encode_chunk(segments=False) (`lmz add --no-segments`) codes them whole
# (floatsplit): a whole chunk then decodes as one stream, a little faster (docs/results.md).
SEGMENT_BYTES = 1 << SEGMENT_LOG


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
# zstd comes within a few percent of ggufblocks (tests/codecs/test_encode_speed_choice.py bounds what
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
    mv = as_bytes_view(data)
    size = len(mv)
    best_id, best_params, best_body = RawCodec.id, b"", None
    best_len = len(header_bytes(RawCodec.id, size, b"")) + size
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
        try:
            params, body = codec.encode(mv, hint)
        except ValueError as exc:
            # A codec that cannot code this chunk (an encoder's own limit, or a fault in it) does
            # not fail the add: zstd and raw code anything, and what they write is as lossless.
            # Said once per chunk, as it costs compression and means an encoder to fix.
            log.warning("%s could not code a %d-byte %s chunk (%s); it is stored with another codec",
                        codec.name, size, hint.dtype or "untyped", exc)
            continue
        n = len(header_bytes(codec.id, size, params)) + len(body)
        if beats(n, codec.id, best_len, best_id):
            best_id, best_params, best_body, best_len = codec.id, params, body, n
        # --fast keeps the slow level for what has no tensor dtype (headers, metadata, opaque
        # files): on int8 tensors it costs many times the rest of a fast add
        if thorough and codec.id == ZstdCodec.id and len(body) * 2 <= size and level < TEXT_LEVEL and \
                not (fast and hint.dtype):
            text_trial = n
    # Last, once every other candidate has been measured: the slow level only where it may win.
    if text_trial and (exhaustive or _text_level_may_win(mv, hint, level, text_trial, best_len)):
        body = ZstdCodec(TEXT_LEVEL).encode(mv, hint)[1]
        n = len(header_bytes(ZstdCodec.id, size, b"")) + len(body)
        if beats(n, ZstdCodec.id, best_len, best_id):
            best_id, best_params, best_body, best_len = ZstdCodec.id, b"", body, n
    if best_body is None:
        best_body = mv.tobytes()
    payload = header_bytes(best_id, size, best_params) + best_body
    return EncodedChunk(payload, REGISTRY[best_id].name)
