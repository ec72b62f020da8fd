"""Predict what the store's codecs would save on a file, from a sample of its chunks.

Chunks are planned exactly as `lmz add` / `lmz pack` plan them and grouped by what they hold (a
dtype, or header / padding / opaque bytes). In each group, about ``sample_bytes`` worth of chunks
is encoded with the real codecs: the chunks under evenly spaced byte positions of the group, so
every byte has the same chance of being sampled and the mean payload-to-plain ratio over the
positions estimates the group's ratio without favouring small or large chunks. A group no larger
than the sample is encoded entirely, so its prediction is exact.
"""
from __future__ import annotations

import bisect
import itertools
import math
import os
from dataclasses import dataclass

from lmzfs.chunker import ChunkPlan, plan_chunks
from lmzfs.codecs import encode_chunk
from lmzfs.formats import FileLayout, Segment
from lmzfs.workpool import default_workers, worker_pool

SAMPLE_BYTES = 8 << 20


@dataclass
class GroupPrediction:
    group: str                # dtype ("F32", "Q4_1"), "storage" (untyped tensor data), "header", "padding", "opaque"
    bytes: int = 0
    chunks: int = 0
    sampled_bytes: int = 0
    predicted_stored_bytes: int = 0

    @property
    def saved_pct(self) -> float:
        return 100.0 * (1 - self.predicted_stored_bytes / self.bytes) if self.bytes else 0.0

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "chunks": self.chunks, "sampled_bytes": self.sampled_bytes,
                "predicted_stored_bytes": self.predicted_stored_bytes, "saved_pct": round(self.saved_pct, 3)}


def group_of(seg: Segment) -> str:
    if seg.kind == "tensor":
        return seg.dtype or "storage"
    return seg.kind


def predict(path: str | os.PathLike, layout: FileLayout, sample_bytes: int = SAMPLE_BYTES,
            workers: int | None = None) -> list[GroupPrediction]:
    """One prediction per group, largest group first."""
    thorough = layout.error is None       # as `lmz add` codes a file whose header it refused
    by_group: dict[str, list[Segment]] = {}
    for seg in layout.segments:
        by_group.setdefault(group_of(seg), []).append(seg)
    out = []
    with open(path, "rb") as f, worker_pool(workers or min(default_workers(), 8), "lmz-inspect") as pool:
        for name, segs in by_group.items():
            # The chunker only walks the segments it is given, so this plans one group's chunks
            # with the same cuts and hints as planning the whole file would.
            plans = list(plan_chunks(FileLayout(layout.format, layout.size, tuple(segs))))
            g = GroupPrediction(name, sum(p.length for p in plans), len(plans))
            if g.bytes <= sample_bytes:
                sizes = pool.map(lambda p: _payload_size(f.fileno(), p, thorough), plans)
                g.sampled_bytes, g.predicted_stored_bytes = g.bytes, sum(sizes)
            else:
                picks = _byte_spread(plans, g.bytes, sample_bytes)
                unique = sorted(set(picks))
                sizes = dict(zip(unique, pool.map(lambda i: _payload_size(f.fileno(), plans[i], thorough), unique)))
                g.sampled_bytes = sum(plans[i].length for i in unique)
                mean_ratio = sum(sizes[i] / plans[i].length for i in picks) / len(picks)
                g.predicted_stored_bytes = round(g.bytes * mean_ratio)
            out.append(g)
    out.sort(key=lambda g: -g.bytes)
    return out


def _byte_spread(plans: list[ChunkPlan], total: int, sample_bytes: int) -> list[int]:
    """Indices of the chunks under evenly spaced byte positions (with repeats), about
    ``sample_bytes`` of distinct chunks in all; deterministic."""
    # A byte position lands in a chunk of length l with probability l / total, so the expected
    # size of a picked chunk is sum(l^2) / total; that many positions give about sample_bytes.
    picked_chunk_mean = sum(p.length * p.length for p in plans) / total
    k = max(1, math.ceil(sample_bytes / picked_chunk_mean))
    ends = list(itertools.accumulate(p.length for p in plans))
    return [bisect.bisect_right(ends, (i + 0.5) * total / k) for i in range(k)]


def _payload_size(fd: int, p: ChunkPlan, thorough: bool) -> int:
    data = os.pread(fd, p.length, p.offset)
    return len(encode_chunk(data, p.hint, fast=not thorough, thorough=thorough).payload)
