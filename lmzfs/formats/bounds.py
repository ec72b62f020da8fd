"""How much structure a container may claim, scaled by the bytes it actually has.

A legal header can still describe millions of one-byte or empty tensors in a small file: every
one of them would cost Python objects, a chunk, catalog rows and the daemon's memory. So a file
may have at most one tensor (or zip entry) per BYTES_PER_TENSOR bytes of payload, plus
FREE_TENSORS for tiny files, and never more than MAX_TENSORS; past that the parsers raise
FormatError and the file is stored as opaque bytes, whole and exact, with a warning.

Tensors that do own bytes but fewer than SMALL_TENSOR are not given a segment each: a run of
them becomes one segment (coalesce), so a file's segments, and the chunks cut from them, are
bounded by its size rather than by its tensor count.
"""
from __future__ import annotations

from .segments import Segment

BYTES_PER_TENSOR = 64
FREE_TENSORS = 1024
MAX_TENSORS = 1 << 16               # tens of thousands is already a large MoE checkpoint in one file
MAX_METADATA_ENTRIES = 1 << 16      # GGUF key-value pairs; models carry tens
MAX_METADATA_ITEMS = 1 << 22        # GGUF string and array elements walked one by one (vocabularies)
SMALL_TENSOR = 64 << 10             # the smallest chunk `lmz add --chunk-size` allows


def tensor_limit(payload_bytes: int) -> int:
    """The most tensors (or zip entries) a file with ``payload_bytes`` of payload may declare."""
    return min(MAX_TENSORS, FREE_TENSORS + max(0, payload_bytes) // BYTES_PER_TENSOR)


def too_many(count: int, payload_bytes: int, what: str = "tensors") -> str | None:
    """Why ``count`` is past the limit for this payload, or None when it is within it."""
    limit = tensor_limit(payload_bytes)
    if count <= limit:
        return None
    return (f"{count} {what} exceed the limit of {limit} for {payload_bytes} bytes of payload (one per "
            f"{BYTES_PER_TENSOR} bytes, at most {MAX_TENSORS})")


def segment_limit(size: int) -> int:
    """The most segments a file of ``size`` bytes is cut into once small tensors are coalesced."""
    return FREE_TENSORS + size // SMALL_TENSOR


def coalesce(segments: list[Segment]) -> list[Segment]:
    """``segments`` with each run of two or more adjacent small tensors (under SMALL_TENSOR) of one
    dtype merged into one tensor segment of that dtype, so the codecs still see what it holds. Should
    that leave more segments than segment_limit (small tensors of alternating dtypes, with padding
    or, in a zip, local headers between them), runs of every small segment after a small tensor
    are merged instead, with no dtype. A lone small tensor stays as it is."""
    size = segments[-1].end - segments[0].offset if segments else 0
    out = _merge_runs(segments, mixed=False)
    return out if len(out) <= segment_limit(size) else _merge_runs(segments, mixed=True)


def _merge_runs(segments: list[Segment], mixed: bool) -> list[Segment]:
    out: list[Segment] = []
    run: list[Segment] = []

    def flush() -> None:
        # padding or a header after the run's last tensor belongs to whatever follows, not to the run
        tail: list[Segment] = []
        while run and run[-1].kind != "tensor":
            tail.insert(0, run.pop())
        if len(run) == 1:
            out.append(run[0])
        elif run:
            first = run[0]
            length = run[-1].end - first.offset
            if len({(s.kind, s.dtype, s.itemsize) for s in run}) == 1:
                out.append(Segment(first.offset, length, "tensor", None, first.dtype, None, first.itemsize))
            else:
                out.append(Segment(first.offset, length, "tensor"))
        out.extend(tail)
        run.clear()

    for s in segments:
        small = s.length < SMALL_TENSOR and (s.kind == "tensor" or (mixed and s.kind == "header" and bool(run)))
        if small and run and not mixed and (s.dtype, s.itemsize) != (run[0].dtype, run[0].itemsize):
            flush()
        if small or (mixed and s.kind == "padding" and run):
            run.append(s)
        else:
            flush()
            out.append(s)
    flush()
    return out
