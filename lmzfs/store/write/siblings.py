"""Deltas between the files of one `lmz add`: two releases of a model in one directory.

A directory often holds several checkpoints or releases of one network side by side
(`model-v1.safetensors`, `model-v2.safetensors`). Across models, store/chains/recode.py pairs
tensors; within one add, this pairs a later file's tensor chunks with the same tensor's chunks
in an earlier file of the same add (same name, dtype and shape, same offset inside it, same
length), the most recent earlier file first. Each such chunk is coded alone and against its
reference, and keeps the smaller; a chunk coded against a reference counts as one more step of
that reference's chain, and no chain grows past the depth cap.

The reference's plain bytes are read again from the earlier file (a descriptor the add keeps)
and checked against the reference chunk's SHA-256 before use: a file changed since it was read
gives no delta, never a wrong one.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from lmzfs.codecs import EncodedChunk
from lmzfs.codecs.base import ChunkHint
from lmzfs.store.chains.plan import TensorKey
from lmzfs.store.write.policy import EncodePolicy

# Earlier files whose descriptors an add keeps for re-reading references; past it the oldest
# file's tensors stop being offered (a directory of many shards rarely repeats a tensor).
MAX_OPEN_FILES = 32


@dataclass(frozen=True)
class SiblingRef:
    """A chunk of an earlier file of this add: where its plain bytes lie in that file."""
    chunk_id: bytes
    fd: int
    offset: int
    length: int


@dataclass(frozen=True)
class CodedChunk:
    """A new chunk's payload and the chunk it is coded against (None: coded alone)."""
    encoded: EncodedChunk
    base: bytes | None = None
    alone_bytes: int = 0        # with a base: the payload's length coded alone


@dataclass
class SiblingTotals:
    chunks: int = 0             # chunks coded as deltas against an earlier file's
    bytes_alone: int = 0        # their payload bytes coded alone
    bytes_after: int = 0        # and as deltas


@dataclass
class SiblingIndex:
    """The tensor chunks of the files this add has stored so far; used from the add's main thread."""
    cap: int
    totals: SiblingTotals = field(default_factory=SiblingTotals)
    _chunks: dict[TensorKey, dict[int, SiblingRef]] = field(default_factory=dict)   # offset in the tensor
    _depth: dict[bytes, int] = field(default_factory=dict)
    _files: list[tuple[int, list[TensorKey]]] = field(default_factory=list)         # (fd, its tensors)

    def pairs(self, tensors: list) -> dict[int, SiblingRef]:
        """Plain offset in the file being added -> the earlier file's chunk at the same place of
        the same tensor, for those whose chain may grow by one."""
        out: dict[int, SiblingRef] = {}
        for t in tensors:
            for at, ref in self._chunks.get((t.name, t.dtype, t.shape), {}).items():
                if self._depth[ref.chunk_id] < self.cap:
                    out[t.offset + at] = ref
        return out

    def record(self, fd: int, tensors: list, extents: list[tuple[int, bytes]], stored: list) -> None:
        """A file this add has stored: its tensors' chunks among `extents` ((plain offset, chunk
        id), in order) that the add stores anew (`stored`: those chunks' records, with their
        chunk_id, plain size and base)."""
        if not tensors:
            return
        sizes = {c.chunk_id: c.size for c in stored}
        for c in stored:
            self._depth.setdefault(c.chunk_id, 0 if c.base is None else self._depth.get(c.base, 0) + 1)
        keep = os.dup(fd)
        keys = [(t.name, t.dtype, t.shape) for t in tensors]
        self._files.append((keep, keys))
        starts = {off: cid for off, cid in extents}
        for key, t in zip(keys, tensors):
            found = {}
            pos = t.offset
            while pos < t.offset + t.size and pos in starts and starts[pos] in sizes:
                cid = starts[pos]
                found[pos - t.offset] = SiblingRef(cid, keep, pos, sizes[cid])
                pos += sizes[cid]
            if found:
                self._chunks[key] = found
        if len(self._files) > MAX_OPEN_FILES:
            old, keys = self._files.pop(0)
            for k in keys:
                if k in self._chunks and next(iter(self._chunks[k].values())).fd == old:
                    del self._chunks[k]
            os.close(old)

    def landed(self, coded: CodedChunk) -> None:
        if coded.base is not None:
            self.totals.chunks += 1
            self.totals.bytes_alone += coded.alone_bytes
            self.totals.bytes_after += len(coded.encoded.payload)

    def close(self) -> None:
        for fd, _ in self._files:
            os.close(fd)
        self._files.clear()
        self._chunks.clear()


def encode_alone(policy: EncodePolicy, data: bytes, hint: ChunkHint, hostile: bool = False) -> CodedChunk:
    return CodedChunk(policy.alone(data, hint, hostile))


def encode_against(policy: EncodePolicy, data: bytes, hint: ChunkHint, ref: SiblingRef,
                   hostile: bool = False) -> CodedChunk:
    """The smaller of `data` coded alone and coded against `ref`'s plain bytes (read back from
    its file and checked against its id)."""
    plain = os.pread(ref.fd, ref.length, ref.offset)
    if len(plain) != ref.length or hashlib.sha256(plain).digest() != ref.chunk_id:
        return encode_alone(policy, data, hint, hostile)
    got = policy.smaller(data, hint, plain, hostile)
    return CodedChunk(got.encoded, ref.chunk_id if got.against else None, got.alone_bytes)
