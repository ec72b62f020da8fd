"""ONNX models (`.onnx`): the main graph's initializers, read from the protobuf wire format.

An ONNX file is a ModelProto with no magic number, so a file is taken for one by its name and by
a parse that holds: every field of the message and of ModelProto.graph (field 7) is well formed,
and each of the graph's initializers (GraphProto field 5, a TensorProto) is walked. An
initializer's data becomes a tensor segment when it lies in the file as the tensor's
little-endian elements: raw_data (field 9), or packed float_data (4) or double_data (10) of a
FLOAT or DOUBLE tensor, and holds exactly its dims' worth of its data type. Everything else
(nodes, names, dims, int32_data and int64_data, which hold varints, tensors of types without a
fixed width, and data kept in an external file) stays header bytes, stored exactly as they are.

Models over protobuf's 2 GB keep their initializers in external files (data_location =
EXTERNAL, external_data: location, offset, length). external_refs lists them, and
external_data_layout cuts such a file into those tensors, so that `lmz add` of the model's
directory codes them by dtype too; a reference that leaves the file, overlaps another or
disagrees with its dims is left out, and the bytes it names stay plain bytes.

Bounds, as for the other containers (lmzfs.formats.bounds): at most field_limit(size) protobuf
fields are walked (a real model walks a few thousand: its nodes are skipped whole), names are at most MAX_NAME bytes, dims at most MAX_RANK, and initializers within
tensor_limit of the file's size; past them, or on a malformed message, FormatError (the file is
then stored as opaque bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator

from .bounds import MAX_METADATA_ITEMS, tensor_limit, too_many
from .segments import FileLayout, FormatError, Segment

MAX_FIELDS = MAX_METADATA_ITEMS     # protobuf fields walked in all (nodes are skipped whole)
FREE_FIELDS = 1 << 16
BYTES_PER_FIELD = 16                # past FREE_FIELDS, one field walked per this many bytes of file
MAX_NAME = 4096
MAX_RANK = 64

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_GRAPH, _INITIALIZER = 7, 5                                  # ModelProto.graph, GraphProto.initializer
_DIMS, _DATA_TYPE, _SEGMENT, _FLOAT_DATA, _NAME, _RAW_DATA, _DOUBLE_DATA = 1, 2, 3, 4, 8, 9, 10
_EXTERNAL_DATA, _DATA_LOCATION = 13, 14
_EXTERNAL = 1
_KEY, _VALUE = 1, 2                                          # StringStringEntryProto

# TensorProto.DataType -> (dtype as the codecs spell it, bytes per element); types without a
# fixed width (STRING, complex, 4-bit) are left as header bytes
DTYPES = {1: ("F32", 4), 2: ("U8", 1), 3: ("I8", 1), 4: ("U16", 2), 5: ("I16", 2), 6: ("I32", 4),
          7: ("I64", 8), 9: ("BOOL", 1), 10: ("F16", 2), 11: ("F64", 8), 12: ("U32", 4), 13: ("U64", 8),
          16: ("BF16", 2), 17: ("F8_E4M3", 1), 19: ("F8_E5M2", 1)}


def looks_like_onnx(name: str, head: bytes) -> bool:
    """An .onnx name and a first byte that starts a protobuf field (field number >= 1, a wire
    type ModelProto uses): the parse decides the rest."""
    return name.lower().endswith(".onnx") and len(head) > 0 and head[0] >= 0x08 and head[0] & 7 in (_VARINT, _LEN)


def field_limit(size: int) -> int:
    """The most protobuf fields a file of `size` bytes may make the parser walk: a file of tiny
    fields crafted to be slow to parse is refused after a time that its size bounds."""
    return min(MAX_FIELDS, FREE_FIELDS + size // BYTES_PER_FIELD)


class _Wire:
    """Protobuf fields read from a file at absolute offsets, counted against field_limit."""

    def __init__(self, path: str, f: BinaryIO, size: int):
        self.path, self.f, self.size = path, f, size
        self.walked = 0
        self.limit = field_limit(size)

    def read(self, offset: int, length: int) -> bytes:
        self.f.seek(offset)
        data = self.f.read(length)
        if len(data) != length:
            raise FormatError(self.path, f"truncated at offset {offset}")
        return data

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        raw = self.read(pos, min(10, end - pos)) if pos < end else b""
        value = shift = 0
        for i, b in enumerate(raw):
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value, pos + i + 1
        raise FormatError(self.path, f"truncated or overlong varint at offset {pos}")

    def fields(self, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """(field number, wire type, a, b) of each field of the message in [start, end): a varint's
        value and where it ends; a LEN, I64 or I32 field's value as its byte range [a, b)."""
        pos = start
        while pos < end:
            self.walked += 1
            if self.walked > self.limit:
                raise FormatError(self.path, f"more than {self.limit} protobuf fields for {self.size} bytes")
            key, pos = self.varint(pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise FormatError(self.path, f"protobuf field number 0 at offset {pos}")
            if wire == _VARINT:
                value, pos = self.varint(pos, end)
                yield number, wire, value, pos
                continue
            if wire == _LEN:
                n, pos = self.varint(pos, end)
            elif wire in (_I64, _I32):
                n = 8 if wire == _I64 else 4
            else:
                raise FormatError(self.path, f"protobuf wire type {wire} at offset {pos}")
            if pos + n > end:
                raise FormatError(self.path, f"protobuf field at offset {pos} runs past its message")
            yield number, wire, pos, pos + n
            pos += n


@dataclass(frozen=True)
class ExternalRef:
    """An initializer whose data lies in another file: `location` relative to the model's
    directory, as the model names it; [offset, offset + length) in that file."""
    location: str
    offset: int
    length: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    itemsize: int


@dataclass(frozen=True)
class _Initializer:
    name: str
    dtype: str | None           # None: a data type without a fixed width
    shape: tuple[int, ...] | None   # None: more than MAX_RANK dims
    itemsize: int
    data: tuple[int, int] | None    # in-file elements [a, b)
    external: dict[str, str] | None


def _initializers(wire: _Wire) -> Iterator[_Initializer]:
    graphs = [(a, b) for number, w, a, b in wire.fields(0, wire.size) if number == _GRAPH and w == _LEN]
    if len(graphs) != 1:
        raise FormatError(wire.path, f"expected one graph, found {len(graphs)}")
    count = 0
    for number, w, a, b in wire.fields(*graphs[0]):
        if number == _INITIALIZER and w == _LEN:
            count += 1
            why = too_many(count, wire.size, "initializers")
            if why:
                raise FormatError(wire.path, why)
            t = _initializer(wire, a, b)
            if t is not None:
                yield t


def parse_onnx(path: str, f: BinaryIO, size: int) -> FileLayout:
    tensors = [Segment(t.data[0], t.data[1] - t.data[0], "tensor", t.name, t.dtype, t.shape, t.itemsize)
               for t in _initializers(_Wire(path, f, size)) if t.data is not None and _whole(t, *t.data)]
    tensors.sort(key=lambda s: s.offset)
    return FileLayout("onnx", size, tuple(_tiled(tensors, size)))


def external_refs(path: str, f: BinaryIO, size: int) -> list[ExternalRef]:
    """The initializers of the model in `f` whose data lies in another file (FormatError as
    parse_onnx's)."""
    out = []
    for t in _initializers(_Wire(path, f, size)):
        ext = t.external
        if ext is None or t.dtype is None or t.shape is None or "location" not in ext:
            continue
        try:
            offset = int(ext.get("offset", "0"))
            length = int(ext["length"]) if "length" in ext else _numel(t.shape) * t.itemsize
        except ValueError:
            continue
        if offset >= 0 and length > 0 and _numel(t.shape) * t.itemsize == length:
            out.append(ExternalRef(ext["location"], offset, length, t.name, t.dtype, t.shape, t.itemsize))
    return out


def external_data_layout(size: int, refs: list[ExternalRef]) -> FileLayout:
    """A file of `size` bytes that a model's external data references name, cut into those
    tensors: each reference inside the file and clear of the ones before it (in offset order)
    is a tensor segment; the rest, and what lies between, are plain bytes."""
    tensors: list[Segment] = []
    end = 0
    for r in sorted(refs, key=lambda r: r.offset)[:tensor_limit(size)]:
        if r.offset >= end and r.offset + r.length <= size:
            tensors.append(Segment(r.offset, r.length, "tensor", r.name, r.dtype, r.shape, r.itemsize))
            end = r.offset + r.length
    return FileLayout("onnx-external-data", size, tuple(_tiled(tensors, size, kind="opaque")))


def _tiled(tensors: list[Segment], size: int, kind: str = "header") -> list[Segment]:
    """`tensors` (in offset order, not overlapping) with the bytes around them as `kind` segments."""
    out: list[Segment] = []
    pos = 0
    for t in tensors:
        if t.offset > pos:
            out.append(Segment(pos, t.offset - pos, kind))
        out.append(t)
        pos = t.end
    if pos < size:
        out.append(Segment(pos, size - pos, kind))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _whole(t: _Initializer, a: int, b: int) -> bool:
    """The bytes [a, b) are exactly the tensor's elements."""
    return t.dtype is not None and t.shape is not None and _numel(t.shape) * t.itemsize == b - a


def _initializer(wire: _Wire, start: int, end: int) -> _Initializer | None:
    """One TensorProto: its type, dims, and where its data lies; None where its data is not its
    elements in one place (a segment of a split tensor, varint-packed values, two data fields)."""
    dims: list[int] = []
    dtype_id = 0
    name = ""
    data: dict[int, tuple[int, int]] = {}
    external: dict[str, str] = {}
    location = 0
    for number, w, a, b in wire.fields(start, end):
        if number == _DIMS and w == _VARINT:
            dims.append(a)
        elif number == _DIMS and w == _LEN:
            pos = a
            while pos < b and len(dims) <= MAX_RANK:
                value, pos = wire.varint(pos, b)
                dims.append(value)
        elif number == _DATA_TYPE and w == _VARINT:
            dtype_id = a
        elif number == _NAME and w == _LEN:
            name = _text(wire, a, b, "a tensor name")
        elif number in (_RAW_DATA, _FLOAT_DATA, _DOUBLE_DATA) and w == _LEN and b > a:
            data[number] = (a, b)
        elif number == _EXTERNAL_DATA and w == _LEN and len(external) < 16:
            entry = {n: _text(wire, x, y, "an external data entry") for n, ww, x, y in wire.fields(a, b)
                     if n in (_KEY, _VALUE) and ww == _LEN}
            if _KEY in entry:
                external[entry[_KEY]] = entry.get(_VALUE, "")
        elif number == _DATA_LOCATION and w == _VARINT:
            location = a
        elif number == _SEGMENT:
            return None                 # one part of a tensor split across several TensorProtos
    dtype, itemsize = DTYPES.get(dtype_id, (None, 0))
    shape = tuple(dims) if len(dims) <= MAX_RANK else None
    if location == _EXTERNAL:
        return _Initializer(name, dtype, shape, itemsize, None, external)
    if len(data) != 1:
        return None
    (field, span), = data.items()
    if (field == _FLOAT_DATA and dtype != "F32") or (field == _DOUBLE_DATA and dtype != "F64"):
        return None
    return _Initializer(name, dtype, shape, itemsize, span, None)


def _text(wire: _Wire, a: int, b: int, what: str) -> str:
    if b - a > MAX_NAME:
        raise FormatError(wire.path, f"{what} of {b - a} bytes at offset {a} (at most {MAX_NAME})")
    return wire.read(a, b - a).decode("utf-8", errors="replace")
