"""ONNX files written from the protobuf wire format (no onnx package), for tests of the parser.

A model holds one graph with a node or two and the given initializers; each initializer's data
is written the way `data` says: "raw" (raw_data, as exporters write it), "float" (packed
float_data), "int32" (packed int32_data: varints), or "external" (data_location = EXTERNAL,
no data in the file; `external` gives location, offset and length). external_data_model writes
a model and the file its initializers' data lies in, as exporters do for models over 2 GB.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# numpy dtype name -> TensorProto.DataType
DATA_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
              "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}


@dataclass(frozen=True)
class Initializer:
    name: str
    array: np.ndarray
    data: str = "raw"           # "raw" | "float" | "int32" | "external"
    data_type: int | None = None    # TensorProto.DataType; default from the array's dtype
    external: tuple[str, int, int] = ("weights.bin", 0, 0)    # location, offset, length


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number: int, payload: bytes | int) -> bytes:
    """One field: a varint (int payload) or a length-delimited one (bytes)."""
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def tensor_proto(t: Initializer) -> bytes:
    a = np.ascontiguousarray(t.array)
    data_type = t.data_type if t.data_type is not None else DATA_TYPES[a.dtype.name]
    out = b"".join(field(1, int(d)) for d in a.shape) + field(2, data_type)
    if t.data == "float":
        out += field(4, a.astype("<f4").tobytes())
    elif t.data == "int32":
        out += field(5, b"".join(varint(int(x) & 0xFFFFFFFFFFFFFFFF) for x in a.ravel()))
    out += field(8, t.name.encode())
    if t.data == "raw":
        out += field(9, a.tobytes())
    elif t.data == "external":
        location, offset, length = t.external
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            out += field(13, field(1, key.encode()) + field(2, value.encode()))
        out += field(14, 1)
    return out


def external_data_model(initializers: list[Initializer], location: str, *, align: int = 64,
                        nodes: int = 2) -> tuple[bytes, bytes]:
    """(the model, the file `location` names): every initializer's data in that file, each at an
    offset aligned to `align`, the model naming where."""
    data = bytearray()
    named = []
    for t in initializers:
        data += bytes(-len(data) % align)
        raw = np.ascontiguousarray(t.array).tobytes()
        named.append(Initializer(t.name, t.array, "external", t.data_type, (location, len(data), len(raw))))
        data += raw
    return onnx_bytes(named, nodes=nodes), bytes(data)


def onnx_bytes(initializers: list[Initializer], *, nodes: int = 2) -> bytes:
    """A ModelProto: ir_version, producer, a graph of `nodes` Identity nodes and the initializers
    (written in the order given), an opset import."""
    graph = b"".join(field(1, field(1, f"in{i}".encode()) + field(2, f"out{i}".encode()) + field(4, b"Identity"))
                     for i in range(nodes))
    graph += field(2, b"test-graph")
    graph += b"".join(field(5, tensor_proto(t)) for t in initializers)
    return field(1, 8) + field(2, b"lmzfs-test") + field(7, graph) + field(8, field(2, 17))
