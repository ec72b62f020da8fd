"""Chunk codecs: each stored chunk is one self-describing *payload* that names its codec.

The package's public API, re-exported from the modules that hold it:

* ``registry``: REGISTRY (codecs by stable id), DELTA_CODECS, by_name;
* ``payload``: MAGIC, FORMAT_VERSION, the header (PayloadHeader, parse_payload), encode_with,
  decode_chunk and decoding by parts (decode_chunk_segments, payload_parts_from, ...);
* ``selection``: encode_chunk, which measures the candidate codecs and keeps the smallest
  payload, with its tuning constants (patch those in lmzfs.codecs.selection, not here);
* ``delta``: encode_delta_chunk, encode_delta_with, needs_reference;
* ``base``: the Codec interface, CodecError, varints; ``kernels``: compiled or numpy kernels.

The codecs themselves live one per module (raw, zstd, bytegroup, floatsplit, ...).
"""
from __future__ import annotations

from ..chunker import ChunkHint
from .base import VARINT_MAX_BYTES, Buffer, Codec, CodecError, DeltaCodec, PartDecoder, get_varint, put_varint
from .blockdelta import BlockDeltaCodec
from .bytegroup import ELEMENT_SIZES, BytegroupCodec
from .delta import encode_delta_chunk, encode_delta_with, needs_reference
from .entropy import EntropyCodec, every_trial, order0_bytes
from .floatseg import SEGMENT_LOG, FloatSegCodec
from .floatsplit import FORMAT_OF, FloatSplitCodec
from .ggufblocks import TYPE_OF, GgufBlocksCodec
from .payload import (
    FORMAT_VERSION, MAGIC, SEGMENT_HEAD_BYTES, EncodedChunk, PayloadHeader, PayloadParts, decode_chunk,
    decode_chunk_segments, decode_segments_from, encode_with, parse_payload, payload_parts_from,
)
from .raw import RawCodec
from .registry import DELTA_CODECS, REGISTRY, by_name
from .selection import (
    MIN_ENTROPY_SIZE, SEGMENT_BYTES, TEXT_LEVEL, TEXT_SAMPLE_BYTES, TEXT_SAMPLE_MIN, TEXT_SLACK, ZSTD_HALVING,
    ZSTD_SAMPLE_BYTES, ZSTD_SAMPLE_MIN, ZSTD_SLACK, candidates, encode_chunk,
)
from .strings import DTYPE as STRINGS_DTYPE
from .strings import StringsCodec
from .ulpdelta import UlpDeltaCodec
from .xordelta import XorZstdCodec
from .zstd import DEFAULT_LEVEL, ZstdCodec

__all__ = [
    # the API the rest of lmzfs uses
    "MAGIC", "FORMAT_VERSION", "REGISTRY", "Codec", "CodecError", "ChunkHint", "EncodedChunk",
    "PayloadHeader", "DELTA_CODECS", "by_name", "encode_chunk", "decode_chunk", "decode_chunk_segments",
    "decode_segments_from", "PayloadParts", "payload_parts_from", "parse_payload", "encode_with",
    "encode_delta_chunk", "needs_reference", "encode_delta_with", "SEGMENT_BYTES",
    # the codec interface and the codecs
    "Buffer", "DeltaCodec", "PartDecoder", "VARINT_MAX_BYTES", "get_varint", "put_varint",
    "RawCodec", "ZstdCodec", "BytegroupCodec", "FloatSplitCodec", "EntropyCodec", "GgufBlocksCodec",
    "FloatSegCodec", "XorZstdCodec", "UlpDeltaCodec", "BlockDeltaCodec", "StringsCodec",
    "DEFAULT_LEVEL", "ELEMENT_SIZES", "FORMAT_OF", "TYPE_OF", "SEGMENT_LOG", "STRINGS_DTYPE",
    "every_trial", "order0_bytes", "SEGMENT_HEAD_BYTES",
    # encode_chunk's candidates and tuning (read here; patch them in lmzfs.codecs.selection)
    "candidates", "MIN_ENTROPY_SIZE", "TEXT_LEVEL", "TEXT_SLACK", "TEXT_SAMPLE_BYTES", "TEXT_SAMPLE_MIN",
    "ZSTD_SAMPLE_MIN", "ZSTD_SAMPLE_BYTES", "ZSTD_SLACK", "ZSTD_HALVING",
]
