"""ONNX models (`.onnx`): the main graph's initializers, read from the protobuf wire format.

An ONNX file is a ModelProto with no magic number, so a file is taken for one by its name and by
a parse that holds: every field of the message and of ModelProto.graph (field 7) is well formed,
and each of the graph's initializers (GraphProto field 5, a TensorProto) is walked. An
initializer's data becomes a tensor segment when it lies in the file as the tensor's
little-endian elements: raw_data (field 9), or packed float_data (4) or double_data (10) of a
FLOAT or DOUBLE tensor, and holds exactly its dims' worth of its data type. Everything else
(nodes, names, dims, int32_data and int64_data, which hold varints, tensors of types without a
fixed width, and data kept in an external file) stays header bytes, stored exactly as they are.

Bounds, as for the other containers (lmzfs.formats.bounds): at most MAX_FIELDS protobuf fields
are walked, names are at most MAX_NAME bytes, dims at most MAX_RANK, and initializers within
tensor_limit of the file's size; past them, or on a malformed message, FormatError (the file is
then stored as opaque bytes).
"""
from __future__ import annotations

from typing import BinaryIO, Iterator

from .bounds import MAX_METADATA_ITEMS, too_many
from .segments import FileLayout, FormatError, Segment

MAX_FIELDS = MAX_METADATA_ITEMS     # protobuf fields walked in all (nodes are skipped whole)
MAX_NAME = 4096
MAX_RANK = 64

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_GRAPH, _INITIALIZER = 7, 5                                  # ModelProto.graph, GraphProto.initializer
_DIMS, _DATA_TYPE, _SEGMENT, _FLOAT_DATA, _NAME, _RAW_DATA, _DOUBLE_DATA, _DATA_LOCATION = 1, 2, 3, 4, 8, 9, 10, 14
_EXTERNAL = 1

# TensorProto.DataType -> (dtype as the codecs spell it, bytes per element); types without a
# fixed width (STRING, complex, 4-bit) are left as header bytes
DTYPES = {1: ("F32", 4), 2: ("U8", 1), 3: ("I8", 1), 4: ("U16", 2), 5: ("I16", 2), 6: ("I32", 4),
          7: ("I64", 8), 9: ("BOOL", 1), 10: ("F16", 2), 11: ("F64", 8), 12: ("U32", 4), 13: ("U64", 8),
          16: ("BF16", 2), 17: ("F8_E4M3", 1), 19: ("F8_E5M2", 1)}


def looks_like_onnx(name: str, head: bytes) -> bool:
    """An .onnx name and a first byte that starts a protobuf field (field number >= 1, a wire
    type ModelProto uses): the parse decides the rest."""
    return name.lower().endswith(".onnx") and len(head) > 0 and head[0] >= 0x08 and head[0] & 7 in (_VARINT, _LEN)


class _Wire:
    """Protobuf fields read from a file at absolute offsets, counted against MAX_FIELDS."""

    def __init__(self, path: str, f: BinaryIO, size: int):
        self.path, self.f, self.size = path, f, size
        self.walked = 0

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
            if self.walked > MAX_FIELDS:
                raise FormatError(self.path, f"more than {MAX_FIELDS} protobuf fields")
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


def parse_onnx(path: str, f: BinaryIO, size: int) -> FileLayout:
    wire = _Wire(path, f, size)
    graphs = [(a, b) for number, w, a, b in wire.fields(0, size) if number == _GRAPH and w == _LEN]
    if len(graphs) != 1:
        raise FormatError(path, f"expected one graph, found {len(graphs)}")
    tensors: list[Segment] = []
    initializers = 0
    for number, w, a, b in wire.fields(*graphs[0]):
        if number == _INITIALIZER and w == _LEN:
            initializers += 1
            why = too_many(initializers, size, "initializers")
            if why:
                raise FormatError(path, why)
            t = _tensor(wire, a, b)
            if t is not None:
                tensors.append(t)
    tensors.sort(key=lambda s: s.offset)
    segments: list[Segment] = []
    pos = 0
    for t in tensors:
        if t.offset > pos:
            segments.append(Segment(pos, t.offset - pos, "header"))
        segments.append(t)
        pos = t.end
    if pos < size:
        segments.append(Segment(pos, size - pos, "header"))
    return FileLayout("onnx", size, tuple(segments))


def _tensor(wire: _Wire, start: int, end: int) -> Segment | None:
    """The data segment of one TensorProto, or None where its data is not its elements in place."""
    dims: list[int] = []
    dtype_id = 0
    name = ""
    data: dict[int, tuple[int, int]] = {}
    external = False
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
            if b - a > MAX_NAME:
                raise FormatError(wire.path, f"a tensor name of {b - a} bytes at offset {a} (at most {MAX_NAME})")
            name = wire.read(a, b - a).decode("utf-8", errors="replace")
        elif number in (_RAW_DATA, _FLOAT_DATA, _DOUBLE_DATA) and w == _LEN and b > a:
            data[number] = (a, b)
        elif number == _DATA_LOCATION and w == _VARINT:
            external = a == _EXTERNAL
        elif number == _SEGMENT:
            return None                 # one part of a tensor split across several TensorProtos
    if external or dtype_id not in DTYPES or len(dims) > MAX_RANK or len(data) != 1:
        return None
    dtype, itemsize = DTYPES[dtype_id]
    (field, (a, b)), = data.items()
    if (field == _FLOAT_DATA and dtype != "F32") or (field == _DOUBLE_DATA and dtype != "F64"):
        return None
    numel = 1
    for d in dims:
        numel *= d
    if numel * itemsize != b - a:
        return None
    return Segment(a, b - a, "tensor", name, dtype, tuple(dims), itemsize)
