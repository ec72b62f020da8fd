"""What each container's header says beyond its segments: every tensor (including zero-size ones,
which own no bytes and so no segment), metadata, alignment, zip entries and their pickles.

These run after lmzfs.formats.parse_file accepted the file, so the header is already known to
be well-formed and bounded; they re-read it only to report on it.
"""
from __future__ import annotations

import json
import lzma
import math
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field

from lmzfs.formats import FileLayout, FormatError, parse_onnx
# The GGUF parser's bounded reader and field decoders, reused rather than duplicated: they are
# what makes walking an untrusted header safe.
from lmzfs.formats.gguf import _INT_FORMAT, _STRING, MAX_HEADER_REGION, _read_alignment, _Reader, _skip_value, \
    _tensor_info
from lmzfs.formats.safetensors import ITEMSIZE

from lmzfs.singlefile.errors import InvalidArchive
from lmzfs.singlefile.format import HEADER_SIZE as ARCHIVE_HEADER_SIZE
from lmzfs.singlefile.format import MAGIC as ARCHIVE_MAGIC
from lmzfs.singlefile.format import Header as ArchiveHeader

from lmzfs.formats.torchzip import zip_entry_count

from .pickles import MAX_PICKLE_BYTES, OpcodeBudget, PickleScan, scan_pickle, scan_pickle_stream

_GGUF_SHOWN_KEYS = ("general.architecture", "general.name", "general.file_type", "general.quantization_version")
_MAX_SHOWN_STRING = 200
# Where a bare pickle (protocol 0 and 1 have no PROTO opcode to recognise them by) is expected:
# torch.save's legacy format, pickle and joblib dumps.
_PICKLE_SUFFIXES = (".bin", ".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib")
_PROTO = 0x80


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    elements: int | None      # None when the container does not say (PyTorch storages)
    nbytes: int


@dataclass
class ContainerInfo:
    tensors: list[TensorInfo] = field(default_factory=list)
    details: dict = field(default_factory=dict)       # format-specific, JSON-ready
    issues: list[str] = field(default_factory=list)   # loadable by us, but worth knowing
    pickles: list[PickleScan] = field(default_factory=list)
    unsafe_entries: list[str] = field(default_factory=list)   # zip members an extractor would write elsewhere


def safetensors_info(path: str, layout: FileLayout) -> ContainerInfo:
    info = ContainerInfo()
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {})
    for name, t in header.items():
        begin, end = t["data_offsets"]
        dtype = t["dtype"].upper()
        info.tensors.append(TensorInfo(name, dtype, math.prod(t["shape"]), end - begin))
    info.details = {"header_json_bytes": n, "metadata_keys": len(meta),
                    "unsized_dtypes": sorted({t.dtype for t in info.tensors if t.dtype not in ITEMSIZE})}
    gaps = [s for s in layout.segments if s.kind == "padding"]
    if gaps:
        info.issues.append(f"{sum(s.length for s in gaps)} bytes in {len(gaps)} gap(s) of the data area belong to "
                           f"no tensor; the reference safetensors loader refuses such files")
    return info


def onnx_info(path: str, layout: FileLayout) -> ContainerInfo:
    """The initializers whose data lies in the file as their elements (the others are header
    bytes to every reader of ours: varint-packed values, external data)."""
    with open(path, "rb") as f:
        full = parse_onnx(path, f, layout.size)       # every tensor, small ones not merged
    info = ContainerInfo()
    for s in full.segments:
        if s.kind == "tensor":
            info.tensors.append(TensorInfo(s.name or "", s.dtype or "", math.prod(s.shape or ()), s.length))
    return info


def gguf_info(path: str, layout: FileLayout) -> ContainerInfo:
    info = ContainerInfo()
    with open(path, "rb") as f:
        r = _Reader(path, f, min(layout.size, MAX_HEADER_REGION))
        r.take(4, "magic")
        version, n_tensors, n_kv = r.u32("version"), r.u64("tensor count"), r.u64("metadata kv count")
        alignment, shown = 32, {}
        for i in range(n_kv):
            key = r.string(f"metadata key {i}")
            vtype = r.u32(f"value type of {key!r}")
            if key == "general.alignment":
                alignment = shown[key] = _read_alignment(r, vtype)
            elif key in _GGUF_SHOWN_KEYS and vtype == _STRING:
                shown[key] = r.string(f"value of {key!r}")[:_MAX_SHOWN_STRING]
            elif key in _GGUF_SHOWN_KEYS and vtype in _INT_FORMAT:
                fmt = _INT_FORMAT[vtype]
                (shown[key],) = struct.unpack(fmt, r.take(struct.calcsize(fmt), key))
            else:
                _skip_value(r, vtype, key)
        for i in range(n_tensors):
            t = _tensor_info(r, layout.size, i)
            info.tensors.append(TensorInfo(t.name, t.gtype.name, math.prod(t.shape), t.nbytes))
    info.details = {"version": version, "metadata_kvs": n_kv, "alignment": alignment, "metadata": shown}
    stray = [s for s in layout.segments if s.kind == "padding" and s.length >= alignment]
    if stray:
        info.issues.append(f"{len(stray)} run(s) of padding, {sum(s.length for s in stray)} bytes, are longer than "
                           f"the alignment of {alignment}: bytes no tensor uses")
    return info


def zip_info(path: str, layout: FileLayout) -> ContainerInfo:
    """Entries and pickle imports of a zip (a PyTorch checkpoint, or a broken one)."""
    info = ContainerInfo()
    budget = OpcodeBudget()
    try:
        with zipfile.ZipFile(path) as z:
            entries = z.infolist()
            info.details = {"entries": [{"name": e.filename, "size": e.file_size, "stored_size": e.compress_size,
                                         "method": "stored" if e.compress_type == zipfile.ZIP_STORED else
                                         f"compressed ({e.compress_type})"} for e in entries]}
            info.unsafe_entries = [e.orig_filename for e in entries if unsafe_member_name(e.orig_filename)]
            for e in entries:
                if e.filename.endswith(".pkl"):
                    info.pickles.append(_scan_entry(z, e, budget))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        info.issues.append(f"zip structure unreadable: {exc}")
    storages = [s for s in layout.segments if s.kind == "tensor"]
    info.tensors = [TensorInfo(s.name or "?", "storage", None, s.length) for s in storages]
    return info


def unsafe_member_name(name: str) -> bool:
    """Whether extracting a zip member of this name could write outside the directory extracted
    into: an absolute path, a drive letter, a backslash (a separator on Windows) or a '..' part."""
    return (name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":")
            or ".." in name.split("/"))


def _scan_entry(z: zipfile.ZipFile, e: zipfile.ZipInfo, budget: OpcodeBudget) -> PickleScan:
    if e.file_size > MAX_PICKLE_BYTES:
        return PickleScan(e.filename, e.file_size, error=f"{e.file_size} bytes, more than the {MAX_PICKLE_BYTES} "
                                                         f"this scanner reads")
    try:
        with z.open(e) as f:
            data = f.read(MAX_PICKLE_BYTES + 1)   # never trust file_size to bound a decompressor
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error,
            lzma.LZMAError) as exc:          # a damaged compressed entry: its decompressor's own error
        return PickleScan(e.filename, e.file_size, error=f"cannot read the entry: {exc}")
    return scan_pickle(data, e.filename, budget)


def raw_pickle_info(path: str, head: bytes) -> ContainerInfo | None:
    """The pickles of a file that is one (a legacy torch.save file, a .pkl), scanned like those
    inside a zip; None when the file is not a pickle. A PROTO opcode at the start makes it one
    whatever its name; with a pickle's file name, so does a first pickle of protocol 0 or 1 that
    parses to its STOP or names an import before it breaks."""
    proto = len(head) >= 2 and head[0] == _PROTO and 2 <= head[1] <= 5
    if not proto and not path.lower().endswith(_PICKLE_SUFFIXES):
        return None
    with open(path, "rb") as f:
        data = f.read(MAX_PICKLE_BYTES)
    scan = scan_pickle_stream(data, os.path.basename(path))
    if not proto and scan.error and not scan.imports:
        return None
    scan.size = os.path.getsize(path)
    return ContainerInfo(details={"pickle": True}, pickles=[scan])


def container_info(path: str, layout: FileLayout, head: bytes) -> ContainerInfo:
    try:
        if layout.format == "safetensors":
            return safetensors_info(path, layout)
        if layout.format == "gguf":
            return gguf_info(path, layout)
        if layout.format == "onnx":
            return onnx_info(path, layout)
    except (FormatError, ValueError, KeyError, OSError) as exc:   # the file changed since parse_file
        return ContainerInfo(issues=[f"header could not be re-read: {exc}"])
    if head.startswith(b"PK\x03\x04"):
        try:
            with open(path, "rb") as f:
                zip_entry_count(path, f, layout.size)   # bounded, before zipfile reads every entry
        except FormatError as exc:
            return ContainerInfo(issues=[f"zip directory not read: {exc.reason}"])
        return zip_info(path, layout)
    if head.startswith(ARCHIVE_MAGIC):
        return _archive_info(path)
    if layout.format == "opaque":
        return raw_pickle_info(path, head) or ContainerInfo()
    return ContainerInfo()


def _archive_info(path: str) -> ContainerInfo:
    with open(path, "rb") as f:
        raw = f.read(ARCHIVE_HEADER_SIZE)
    try:
        size = ArchiveHeader.unpack(raw).plain_size
    except InvalidArchive as exc:
        return ContainerInfo(issues=[f"lmz single-file archive with a bad header: {exc}"])
    return ContainerInfo(details={"lmz_archive_plain_size": size},
                         issues=[f"an lmz single-file archive of a {size}-byte file; `lmz unpack` restores it"])
