"""GGUF v2/v3 (little-endian): header, metadata KVs, tensor infos, aligned tensor data.

Every count and length in the header is untrusted. The header is read through a bounded,
chunked reader that refuses to go past min(file size, MAX_HEADER_REGION) and checks each length
against the bytes left before reading or looping, so hostile counts fail fast with FormatError
instead of allocating or spinning.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

from .bounds import MAX_METADATA_ENTRIES, MAX_METADATA_ITEMS, too_many
from .segments import STRINGS, FileLayout, FormatError, Segment

MAGIC = b"GGUF"
MAX_HEADER_REGION = 256 << 20
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 8
MAX_ARRAY_DEPTH = 16          # nested arrays deeper than this are hostile, not models
DEFAULT_ALIGNMENT = 32
_CHUNK = 1 << 20
# A top-level metadata array of strings this long or longer (a tokenizer's vocabulary or merges)
# becomes a segment of its own, of dtype STRINGS (codecs/strings.py codes it); shorter ones stay
# in the header around them. The chunker may end a chunk where a string starts at least
# STRINGS_CUT_SPACING past the previous such place.
STRINGS_MIN = 64 << 10
STRINGS_CUT_SPACING = 16 << 10


@dataclass(frozen=True)
class _StringRun:
    start: int               # file offset of the first string's length
    end: int                 # where the last string ends
    cuts: tuple[int, ...]    # string starts inside, about STRINGS_CUT_SPACING apart


@dataclass(frozen=True)
class GGMLType:
    name: str
    block_size: int   # elements per block (1 for plain types)
    type_size: int    # bytes per block


# ggml type id -> layout, from ggml.h / ggml.c type_traits. Ids 4, 5 (Q4_2, Q4_3) were removed
# from ggml, and 31-33 (Q4_0_4_4 ...) are repacked runtime-only types; both stay unknown.
GGML_TYPES: dict[int, GGMLType] = {i: GGMLType(n, b, s) for i, n, b, s in (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98), (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110), (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4),
    (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56), (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
)}

# GGUF metadata value types: id -> (name, fixed size in bytes or 0 for string/array)
_STRING, _ARRAY = 8, 9
_VALUE_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INT_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
# smallest encodings, used to reject counts the remaining bytes could not possibly hold
_MIN_KV = 8 + 4 + 1           # key length, value type, one-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8   # name length, n_dims, type, offset


class _Reader:
    """Sequential reads from f[0, limit), pulled in chunks so small fields cost no syscalls."""

    def __init__(self, path: str, f: BinaryIO, limit: int):
        self.path, self.f, self.limit = path, f, limit
        self.buf = b""
        self.buf_pos = 0      # file offset of buf[0]
        self.pos = 0          # current file offset
        self.items_left = MAX_METADATA_ITEMS   # strings and arrays walked one by one
        f.seek(0)

    def remaining(self) -> int:
        return self.limit - self.pos

    def _fill(self, n: int, what: str) -> None:
        if n > self.remaining():
            raise FormatError(self.path, f"{what} of {n} bytes at offset {self.pos} runs past the end "
                                         f"of the readable header region ({self.limit} bytes)")
        start = self.pos - self.buf_pos
        if self.pos + n <= self.buf_pos + len(self.buf):
            return
        keep = self.buf[start:] if start < len(self.buf) else b""   # skip() may have jumped past buf
        read_from = self.pos + len(keep)
        self.f.seek(read_from)
        more = self.f.read(min(max(n - len(keep), _CHUNK), self.limit - read_from))
        self.buf, self.buf_pos = keep + more, self.pos
        if len(self.buf) < n:
            raise FormatError(self.path, f"file truncated while reading {what} at offset {self.pos}")

    def take(self, n: int, what: str) -> bytes:
        self._fill(n, what)
        i = self.pos - self.buf_pos
        self.pos += n
        return self.buf[i:i + n]

    def skip(self, n: int, what: str) -> None:
        if n > self.remaining():
            raise FormatError(self.path, f"{what} of {n} bytes at offset {self.pos} runs past the end "
                                         f"of the readable header region ({self.limit} bytes)")
        self.pos += n   # the next _fill notices the gap and reads from the new position

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string_len(self, what: str) -> int:
        n = self.u64(f"{what} length")
        if n > self.remaining():
            raise FormatError(self.path, f"{what} length {n} at offset {self.pos - 8} exceeds the "
                                         f"{self.remaining()} bytes left")
        return n

    def spend_items(self, n: int, what: str) -> None:
        self.items_left -= n
        if self.items_left < 0:
            raise FormatError(self.path, f"{what}: the metadata holds more than {MAX_METADATA_ITEMS} strings "
                                         f"and arrays, more than any model's vocabulary")

    def skip_strings(self, count: int, what: str, cuts: list[int] | None = None) -> None:
        """Skip ``count`` length-prefixed strings: the hot loop of a vocabulary array, kept tight.
        With ``cuts``, append to it where a string starts every STRINGS_CUT_SPACING bytes or so."""
        self.spend_items(count, what)
        unpack_len = struct.Struct("<Q").unpack_from
        next_cut = self.pos + STRINGS_CUT_SPACING if cuts is not None else self.limit + 1
        for _ in range(count):
            if self.pos >= next_cut:
                cuts.append(self.pos)
                next_cut = self.pos + STRINGS_CUT_SPACING
            i = self.pos - self.buf_pos
            if i < 0 or i + 8 > len(self.buf):
                self._fill(8, f"{what} length")
                i = self.pos - self.buf_pos
            (n,) = unpack_len(self.buf, i)
            if n > self.limit - self.pos - 8:
                raise FormatError(self.path, f"{what} length {n} at offset {self.pos} exceeds the "
                                             f"{self.limit - self.pos - 8} bytes left")
            self.pos += 8 + n

    def string(self, what: str) -> str:
        raw = self.take(self.string_len(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(self.path, f"{what} at offset {self.pos - len(raw)} is not UTF-8") from None


def _skip_value(r: _Reader, vtype: int, key: str, depth: int = 0, runs: list[_StringRun] | None = None) -> None:
    """Skip one value; a top-level array of strings of STRINGS_MIN bytes or more is added to runs."""
    if vtype in _VALUE_SIZE:
        r.skip(_VALUE_SIZE[vtype], f"value of {key!r}")
    elif vtype == _STRING:
        r.skip(r.string_len(f"string value of {key!r}"), f"string value of {key!r}")
    elif vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise FormatError(r.path, f"metadata {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH}")
        etype = r.u32(f"array element type of {key!r}")
        count = r.u64(f"array count of {key!r}")
        if etype in _VALUE_SIZE:
            nbytes = count * _VALUE_SIZE[etype]
            if nbytes > r.remaining():
                raise FormatError(r.path, f"array {key!r} of {count} elements needs {nbytes} bytes but "
                                          f"only {r.remaining()} are left")
            r.skip(nbytes, f"array {key!r}")
            return
        if etype not in (_STRING, _ARRAY):
            raise FormatError(r.path, f"array {key!r} has unknown element type {etype}")
        least = 8 if etype == _STRING else 12   # a string is at least its length; an array its header
        if count * least > r.remaining():
            raise FormatError(r.path, f"array {key!r} count {count} exceeds what the {r.remaining()} "
                                      f"bytes left could hold")
        if etype == _STRING:
            start, cuts = r.pos, [] if runs is not None else None
            r.skip_strings(count, f"string in array {key!r}", cuts)
            if runs is not None and r.pos - start >= STRINGS_MIN:
                runs.append(_StringRun(start, r.pos, tuple(cuts)))
            return
        r.spend_items(count, f"array {key!r}")
        for _ in range(count):
            _skip_value(r, etype, key, depth + 1)
    else:
        raise FormatError(r.path, f"metadata {key!r} has unknown value type {vtype}")


def _read_alignment(r: _Reader, vtype: int) -> int:
    if vtype not in _INT_FORMAT:
        raise FormatError(r.path, f"general.alignment has non-integer value type {vtype}")
    fmt = _INT_FORMAT[vtype]
    (a,) = struct.unpack(fmt, r.take(struct.calcsize(fmt), "general.alignment"))
    if a < 1 or a > MAX_ALIGNMENT or a & (a - 1):
        raise FormatError(r.path, f"general.alignment {a} is not a power of two in [1, {MAX_ALIGNMENT}]")
    return a


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]   # row-major (numpy) order: GGUF stores ne[0] (innermost) first
    gtype: GGMLType
    offset: int              # relative to the data section
    nbytes: int


def _tensor_info(r: _Reader, size: int, index: int) -> _TensorInfo:
    name = r.string(f"tensor {index} name")
    n_dims = r.u32(f"tensor {name!r} n_dims")
    if n_dims > MAX_DIMS:
        raise FormatError(r.path, f"tensor {name!r} has {n_dims} dimensions, more than {MAX_DIMS}")
    # dims, type and offset in one read: this runs once per tensor, tens of thousands of times
    fields = struct.unpack(f"<{n_dims}QIQ", r.take(8 * n_dims + 12, f"tensor {name!r} dimensions, type and offset"))
    dims, type_id, offset = list(fields[:n_dims]), fields[n_dims], fields[n_dims + 1]
    gtype = GGML_TYPES.get(type_id)
    if gtype is None:
        raise FormatError(r.path, f"tensor {name!r} has unknown ggml type {type_id}")
    n = math.prod(dims)
    row = dims[0] if dims else 1   # ggml quantises along ne[0], whole blocks per row
    if row % gtype.block_size:
        raise FormatError(r.path, f"tensor {name!r} row of {row} elements is not a whole number of "
                                  f"{gtype.name} blocks of {gtype.block_size}")
    nbytes = n // gtype.block_size * gtype.type_size
    if nbytes > size:
        raise FormatError(r.path, f"tensor {name!r} of shape {dims} needs {nbytes} bytes, more than the "
                                  f"{size}-byte file")
    return _TensorInfo(name, tuple(reversed(dims)), gtype, offset, nbytes)


def parse_gguf(path: str, f: BinaryIO, size: int) -> FileLayout:
    """Split a GGUF file into one header segment (incl. alignment padding), tensors and padding.

    Tensor segments carry dtype = ggml type name, itemsize = element size for plain types and 0
    for block-quantised ones, and shape in row-major order (the reverse of GGUF's ne order).
    """
    r = _Reader(path, f, min(size, MAX_HEADER_REGION))
    magic = r.take(4, "magic")
    if magic != MAGIC:
        raise FormatError(path, f"bad magic {magic!r}")
    version = r.u32("version")
    if version == 1:
        raise FormatError(path, "GGUF version 1 (32-bit counts) is not supported")
    if version not in (2, 3):
        hint = " (big-endian file?)" if struct.unpack(">I", struct.pack("<I", version))[0] in (1, 2, 3) else ""
        raise FormatError(path, f"unsupported GGUF version {version}{hint}")
    tensor_count = r.u64("tensor count")
    kv_count = r.u64("metadata kv count")
    if tensor_count * _MIN_TENSOR_INFO + kv_count * _MIN_KV > r.remaining():
        raise FormatError(path, f"{tensor_count} tensors and {kv_count} metadata entries cannot fit in "
                                f"the {r.remaining()} header bytes left")
    check_counts(path, tensor_count, kv_count, size)

    alignment = DEFAULT_ALIGNMENT
    keys: set[str] = set()
    runs: list[_StringRun] = []
    for i in range(kv_count):
        key = r.string(f"metadata key {i}")
        if key in keys:
            raise FormatError(path, f"duplicate metadata key {key!r}")
        keys.add(key)
        vtype = r.u32(f"value type of {key!r}")
        if key == "general.alignment":
            alignment = _read_alignment(r, vtype)
        else:
            _skip_value(r, vtype, key, runs=runs)

    infos: list[_TensorInfo] = []
    names: set[str] = set()
    for i in range(tensor_count):
        t = _tensor_info(r, size, i)
        if t.name in names:
            raise FormatError(path, f"duplicate tensor name {t.name!r}")
        names.add(t.name)
        infos.append(t)

    header_end = r.pos
    data_start = -(-header_end // alignment) * alignment
    why = too_many(tensor_count, size - data_start)    # now that the data section's size is known
    if why:
        raise FormatError(path, why)
    return FileLayout("gguf", size, tuple(_segments(path, size, infos, runs, data_start, alignment)))


def check_counts(path: str, tensor_count: int, kv_count: int, size: int) -> None:
    """Refuse counts past the bounds before any entry is read (the data section's size is not yet
    known: the whole file stands in for it)."""
    if kv_count > MAX_METADATA_ENTRIES:
        raise FormatError(path, f"{kv_count} metadata entries exceed the limit of {MAX_METADATA_ENTRIES}")
    why = too_many(tensor_count, size)
    if why:
        raise FormatError(path, why)


def _header_segments(data_start: int, runs: list[_StringRun]) -> list[Segment]:
    """[0, data_start) as header segments: each string run on its own, the rest around them."""
    segs, pos = [], 0
    for run in runs:
        if run.start > pos:
            segs.append(Segment(pos, run.start - pos, "header"))
        segs.append(Segment(run.start, run.end - run.start, "header", dtype=STRINGS, cuts=run.cuts))
        pos = run.end
    if data_start > pos:
        segs.append(Segment(pos, data_start - pos, "header"))
    return segs


def _segments(path: str, size: int, infos: list[_TensorInfo], runs: list[_StringRun], data_start: int,
              alignment: int) -> list[Segment]:
    tensors = sorted((t for t in infos if t.nbytes), key=lambda t: t.offset)
    if data_start > size:
        if tensors:
            raise FormatError(path, f"data section would start at {data_start}, past the end of the "
                                    f"{size}-byte file")
        data_start = size   # a tensor-less file may omit the final alignment padding
    for t in infos:
        if t.offset % alignment:
            raise FormatError(path, f"tensor {t.name!r} offset {t.offset} is not a multiple of the "
                                    f"alignment {alignment}")
        if data_start + t.offset + t.nbytes > size:
            raise FormatError(path, f"tensor {t.name!r} data [{t.offset}, {t.offset + t.nbytes}) runs "
                                    f"past the data section of {size - data_start} bytes")
    segs = _header_segments(data_start, runs)
    pos = data_start
    prev: _TensorInfo | None = None
    for t in tensors:
        begin = data_start + t.offset
        if begin < pos:
            assert prev is not None
            raise FormatError(path, f"tensors {prev.name!r} and {t.name!r} overlap at offset {begin}")
        if begin > pos:
            segs.append(Segment(pos, begin - pos, "padding"))
        itemsize = t.gtype.type_size if t.gtype.block_size == 1 else 0
        segs.append(Segment(begin, t.nbytes, "tensor", t.name, t.gtype.name, t.shape, itemsize))
        pos, prev = begin + t.nbytes, t
    if pos < size:
        segs.append(Segment(pos, size - pos, "padding"))
    return segs
