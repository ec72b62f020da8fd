"""How a writer codes a chunk: the one place the encode options are decided, and the one rule
for a chunk that has a reference: code it alone and against the reference, keep the smaller.

`lmz add` (default or `--fast`, with or without segments), a writable mount's commit, the chain
recoder and `lmz rewrite recode` all ask an EncodePolicy. A chunk of a file whose header was
malformed or hostile gets the quick codecs only, whatever the policy: an input crafted to be
slow to store gets no slow search.
"""
from __future__ import annotations

from dataclasses import dataclass

from lmzfs.codecs import EncodedChunk, encode_chunk, encode_delta_chunk
from lmzfs.codecs.base import ChunkHint


@dataclass(frozen=True)
class Coded:
    """A chunk's payload, and whether it is coded against the reference it was offered."""
    encoded: EncodedChunk
    against: bool = False
    alone_bytes: int = 0        # with a reference: the payload's length coded alone


@dataclass(frozen=True)
class EncodePolicy:
    fast: bool = False          # zstd and byte grouping only: a little larger, decodes faster
    segments: bool = True       # float chunks in separately decodable segments (floatseg)

    def options(self, hostile: bool = False) -> dict:
        return dict(fast=self.fast or hostile, segments=self.segments, thorough=not hostile)

    def alone(self, data, hint: ChunkHint, hostile: bool = False) -> EncodedChunk:
        return encode_chunk(data, hint, **self.options(hostile))

    def smaller(self, data, hint: ChunkHint, ref: bytes | None, hostile: bool = False) -> Coded:
        """`data` coded alone, or against `ref` (another chunk's plain bytes of the same length)
        where that is strictly smaller."""
        alone = self.alone(data, hint, hostile)
        if ref is None:
            return Coded(alone)
        delta = encode_delta_chunk(data, ref, hint)
        if delta is None or len(delta.payload) >= len(alone.payload):
            return Coded(alone)
        return Coded(delta, True, len(alone.payload))
