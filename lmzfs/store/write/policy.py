"""How a writer codes a chunk: the one place the encode options are decided, and the one rule
for a chunk that has a reference: code it alone and against the reference, keep the smaller.

`lmz add` (default or `--fast`, with or without segments), a writable mount's commit, the chain
recoder and `lmz rewrite recode` all ask an EncodePolicy. A chunk of a file whose header was
malformed or hostile gets the quick codecs only, whatever the policy: an input crafted to be
slow to store gets no slow search.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping

from lmzfs.codecs import EncodedChunk, encode_chunk, encode_delta_chunk
from lmzfs.codecs.base import ChunkHint
from lmzfs.codecs.zstd import ZstdCodec


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
    # zstd's slow level (codecs/selection.TEXT_LEVEL) tried where the default level halves a chunk
    # (text, metadata): a few percent smaller, at many times the CPU. A writable mount's commits
    # leave it out (COMMIT_POLICY); `lmz rewrite recode` tries it on what they stored.
    slow_text: bool = True

    def options(self, hostile: bool = False) -> dict:
        return dict(fast=self.fast or hostile, segments=self.segments, thorough=self.slow_text and not hostile)

    def left_for_slow_text(self, codec: str, length: int, size: int) -> bool:
        """Whether a chunk this policy coded with `codec` to `length` bytes of payload (`size`
        plain) is one the slow zstd level it left out may make smaller: zstd halved it."""
        return not self.slow_text and codec == ZstdCodec.name and 2 * length <= size

    def alone(self, data, hint: ChunkHint, hostile: bool = False) -> EncodedChunk:
        return encode_chunk(data, hint, **self.options(hostile))

    def ready(self, chunk_id: bytes, hint: ChunkHint, hostile: bool = False) -> EncodedChunk | None:
        """The chunk (SHA-256 `chunk_id`) as alone() codes it, if that is already at hand."""
        return None

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


@dataclass(frozen=True)
class PreEncoded(EncodePolicy):
    """An EncodePolicy that first looks a chunk up among those it already coded alone (`coded`,
    by SHA-256 of the bytes, hint and hostility: write/encodefile.pre_encode), so that the slow
    part of a commit runs before the store's lock is taken and the commit under it only looks
    the payloads up. A chunk not found (its file changed meanwhile) is coded as ever."""
    coded: Mapping[tuple, EncodedChunk] = field(default_factory=dict, compare=False, hash=False)

    def ready(self, chunk_id: bytes, hint: ChunkHint, hostile: bool = False) -> EncodedChunk | None:
        return self.coded.get((chunk_id, hint, hostile))

    def alone(self, data, hint: ChunkHint, hostile: bool = False) -> EncodedChunk:
        coded = self.coded.get((hashlib.sha256(data).digest(), hint, hostile)) if self.coded else None
        return coded if coded is not None else super().alone(data, hint, hostile)


# How a writable mount's commits code (fsmodel/commit.py): as `lmz add` does, but for the slow
# zstd level on text (docs/writable.md, "How commits code").
COMMIT_POLICY = EncodePolicy(slow_text=False)
