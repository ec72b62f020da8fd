"""safetensors: 8-byte little-endian header length N, N bytes of JSON, then the data area.

The header is untrusted: every length and offset is checked against the file before use, so a
hostile header raises FormatError (and the file is stored as opaque bytes) instead of allocating
or reading out of bounds.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

from .bounds import tensor_limit, too_many
from .segments import FileLayout, FormatError, Segment

MAX_HEADER = 100 << 20   # the reference implementation refuses larger headers too
VALUES_PER_TENSOR = 16    # JSON values a tensor entry may take: its keys, up to a dozen dims, offsets
FREE_VALUES = 4096        # for __metadata__
_SCAN_BLOCK = 8 << 20

# Element sizes in bytes. Sub-byte dtypes (F4, F6_*) are absent on purpose: they are accepted
# with itemsize 0 and no length check, like any dtype we do not know.
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    itemsize: int


def _ints(values: object, count: int | None = None) -> bool:
    """Whether ``values`` is a list of non-negative ints (of ``count`` of them, if given). The
    type test is exact: JSON true/false decode to bool, an int subclass; they are not dims."""
    return (type(values) is list and (count is None or len(values) == count)
            and all(type(v) is int for v in values) and min(values, default=0) >= 0)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup!r}")
    return d


def _read_header(path: str, f: BinaryIO, size: int) -> tuple[int, dict]:
    if size < 8:
        raise FormatError(path, f"file of {size} bytes is shorter than the 8-byte header length")
    f.seek(0)
    raw = f.read(8)
    if len(raw) != 8:
        raise FormatError(path, "could not read the 8-byte header length")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER:
        raise FormatError(path, f"header length {n} exceeds the limit of {MAX_HEADER} bytes")
    if 8 + n > size:
        raise FormatError(path, f"header length {n} runs past the end of the {size}-byte file")
    text = f.read(n)
    if len(text) != n:
        raise FormatError(path, f"header truncated: read {len(text)} of {n} bytes")
    _check_structure(path, text, size - 8 - n)
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(path, f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FormatError(path, f"header is a JSON {type(header).__name__}, not an object")
    return n, header


def _check_structure(path: str, text: bytes, data_size: int) -> None:
    """Refuse, before decoding anything, a header with more objects or values than the data area
    can justify: what json.loads would build is bounded by the braces and commas outside strings."""
    objects_allowed = tensor_limit(data_size) + 2          # the header itself and __metadata__
    values_allowed = VALUES_PER_TENSOR * tensor_limit(data_size) + FREE_VALUES
    objects, values = text.count(b"{"), text.count(b",")
    if objects <= objects_allowed and values <= values_allowed:
        return
    objects, values = _outside_strings(text)    # braces and commas inside strings build nothing
    if objects > objects_allowed:
        raise FormatError(path, too_many(objects - 2, data_size, "tensor entries"))
    if values > values_allowed:
        raise FormatError(path, f"header holds {values} JSON values, more than the {values_allowed} its "
                                f"{data_size}-byte data area allows")


def _outside_strings(text: bytes) -> tuple[int, int]:
    """The braces and commas of ``text`` outside JSON strings, counted in blocks with numpy so that
    neither time nor memory depends on how many strings there are. Escape pairs are blanked
    first (left to right, as JSON reads them), so every quote left opens or closes a string. In
    text that is not JSON anyway the counts may be off, which cannot matter: it will not parse."""
    import numpy as np
    blank = text.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    objects = values = 0
    inside = 0                                   # quotes seen so far, mod 2
    for at in range(0, len(blank), _SCAN_BLOCK):
        a = np.frombuffer(blank, np.uint8, min(_SCAN_BLOCK, len(blank) - at), at)
        quotes = np.cumsum(a == ord('"'), dtype=np.uint8)   # parity survives the wrap at 256
        outside = ((quotes + inside) & 1) == 0   # a closing quote itself counts as inside
        objects += int(np.count_nonzero(outside & (a == ord("{"))))
        values += int(np.count_nonzero(outside & (a == ord(","))))
        inside = (inside + int(quotes[-1])) & 1
    return objects, values


def _check_metadata(path: str, meta: object) -> None:
    if not isinstance(meta, dict):
        raise FormatError(path, "__metadata__ is not an object")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise FormatError(path, f"__metadata__ value for {k!r} is not a string")


def _tensor(path: str, name: str, info: object, data_size: int) -> _Tensor:
    if not isinstance(info, dict):
        raise FormatError(path, f"tensor {name!r} entry is not an object")
    dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not dtype:
        raise FormatError(path, f"tensor {name!r} has no string dtype")
    if not _ints(shape):
        raise FormatError(path, f"tensor {name!r} shape {shape!r} is not a list of non-negative ints")
    if not (type(offs) is list and len(offs) == 2 and all(type(o) is int for o in offs)):
        raise FormatError(path, f"tensor {name!r} data_offsets {offs!r} is not a pair of ints")
    begin, end = offs
    if not 0 <= begin <= end <= data_size:
        raise FormatError(path, f"tensor {name!r} data_offsets [{begin}, {end}] exceed the data area "
                                f"of {data_size} bytes")
    dtype = dtype.upper()
    itemsize = ITEMSIZE.get(dtype, 0)
    if itemsize:
        want = math.prod(shape) * itemsize
        if want != end - begin:
            raise FormatError(path, f"tensor {name!r} of shape {shape} and dtype {dtype} needs {want} "
                                    f"bytes but data_offsets span {end - begin}")
    return _Tensor(name, dtype, tuple(shape), begin, end, itemsize)


def parse_safetensors(path: str, f: BinaryIO, size: int) -> FileLayout:
    """Split a safetensors file into header, tensor and padding segments tiling [0, size)."""
    n, header = _read_header(path, f, size)
    base = 8 + n
    data_size = size - base
    why = too_many(len(header) - ("__metadata__" in header), data_size)
    if why:
        raise FormatError(path, why)
    tensors: list[_Tensor] = []
    for name, info in header.items():
        if name == "__metadata__":
            _check_metadata(path, info)
            continue
        t = _tensor(path, name, info, data_size)
        if t.end > t.begin:   # zero-length tensors own no bytes, so no segment
            tensors.append(t)
    tensors.sort(key=lambda t: (t.begin, t.end))

    segs = [Segment(0, base, "header")]
    pos = 0   # relative to the data area
    prev: _Tensor | None = None
    for t in tensors:
        if t.begin < pos:
            assert prev is not None
            raise FormatError(path, f"tensors {prev.name!r} [{prev.begin}, {prev.end}] and {t.name!r} "
                                    f"[{t.begin}, {t.end}] overlap")
        if t.begin > pos:
            segs.append(Segment(base + pos, t.begin - pos, "padding"))
        segs.append(Segment(base + t.begin, t.end - t.begin, "tensor", t.name, t.dtype, t.shape,
                            t.itemsize))
        pos, prev = t.end, t
    if pos < data_size:
        segs.append(Segment(base + pos, data_size - pos, "padding"))
    return FileLayout("safetensors", size, tuple(segs))
