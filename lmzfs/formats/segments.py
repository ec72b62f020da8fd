"""What a container parser produces: segments that tile a file exactly."""
from __future__ import annotations

from dataclasses import dataclass, field

# The dtype of a header segment that is a run of length-prefixed strings (each a little-endian
# u64 length and that many bytes): a GGUF metadata array of strings, such as a tokenizer's.
STRINGS = "STRINGS"


class FormatError(ValueError):
    """A container header is malformed or hostile. The file is then stored as opaque bytes."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Segment:
    """One contiguous byte range of a file.

    kind is "header" (container metadata), "tensor" (one tensor's data), "padding" (alignment
    bytes between tensors) or "opaque" (anything else). Tensor segments carry name, dtype (the
    container's own spelling normalised to upper case: "F32", "BF16", "F16", "I8", "Q4_1", ...),
    shape, and the element size in bytes when the dtype has one (0 for block-quantised types).
    A header segment may carry dtype STRINGS (a run of length-prefixed strings), with ``cuts``:
    file offsets inside it where a string starts, at which a chunk may end.
    """

    offset: int
    length: int
    kind: str
    name: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    itemsize: int = 0
    cuts: tuple[int, ...] = ()

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class FileLayout:
    """A file's format and its segments in offset order, covering [0, size) with no gap or overlap."""

    format: str                    # "safetensors" | "gguf" | "pytorch-zip" | "onnx" | "onnx-external-data" | "opaque"
    size: int
    segments: tuple[Segment, ...]
    error: str | None = field(default=None)   # why a recognised container fell back to opaque

    def check_tiling(self) -> None:
        pos = 0
        for s in self.segments:
            if s.offset != pos or s.length <= 0:
                raise AssertionError(f"segment {s} does not continue at {pos}")
            pos = s.end
        if pos != self.size:
            raise AssertionError(f"segments end at {pos}, file size is {self.size}")


def opaque_layout(size: int, error: str | None = None) -> FileLayout:
    segs = (Segment(0, size, "opaque"),) if size else ()
    return FileLayout("opaque", size, segs, error)
