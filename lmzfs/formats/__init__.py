"""Container parsers: split a model file into segments (header, tensors, padding) tiling it exactly.

parse_file never refuses a file: anything unrecognised, or a recognised container whose header is
malformed or hostile, or declares more tensors than its bytes justify (lmzfs.formats.bounds),
comes back as one opaque segment (with the reason in FileLayout.error). Its layouts have runs of
small tensors coalesced into one segment; the parse_* functions give every tensor its own.
"""
from __future__ import annotations

import os
import struct
from typing import BinaryIO

from .bounds import coalesce
from .gguf import parse_gguf
from .onnx import ExternalRef, external_data_layout, external_refs, looks_like_onnx, parse_onnx
from .safetensors import parse_safetensors
from .segments import FileLayout, FormatError, Segment, opaque_layout
from .torchzip import NotTorchZip, parse_torch_zip

__all__ = ["ExternalRef", "FileLayout", "FormatError", "Segment", "external_refs", "opaque_layout", "parse_file",
           "parse_open_file", "parse_gguf", "parse_onnx", "parse_safetensors", "parse_torch_zip"]


def _detect(head: bytes):
    if head.startswith(b"GGUF"):
        return parse_gguf
    if head.startswith(b"PK\x03\x04"):
        return parse_torch_zip   # raises NotTorchZip when there is no data.pkl entry
    # safetensors has no magic: a JSON object right after the 8-byte length is the signature.
    # The length itself is not required to be plausible here, so that a file with a corrupt
    # length is reported as a broken safetensors file rather than silently as unknown data.
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack_from("<Q", head)[0] > 0:
        return parse_safetensors
    return None


def parse_file(path: str | os.PathLike) -> FileLayout:
    """Open path, detect its container format by magic bytes and return its layout."""
    p = os.fspath(path)
    with open(p, "rb") as f:
        return parse_open_file(p, f, os.fstat(f.fileno()).st_size)


def parse_open_file(name: str, f: BinaryIO, size: int, named_by: list[ExternalRef] | None = None) -> FileLayout:
    """The layout of the ``size`` bytes of the open file ``f``, read through f alone; ``name`` is
    what messages call it. ``named_by``: the initializers an ONNX model of the same directory keeps
    in this file (its external data), which cut a file of no known format into those tensors."""
    p = name
    f.seek(0)
    head = f.read(16)
    parser = _detect(head)
    if parser is None and looks_like_onnx(name, head):     # ONNX has no magic: its name and a parse
        parser = parse_onnx
    if parser is None:
        return _opaque_or_named(p, size, named_by)
    try:
        layout = parser(p, f, size)
    except NotTorchZip:
        return _opaque_or_named(p, size, named_by)
    except FormatError as exc:
        return opaque_layout(size, error=str(exc))
    return _finished(p, layout)


def _opaque_or_named(p: str, size: int, named_by: list[ExternalRef] | None) -> FileLayout:
    return _finished(p, external_data_layout(size, named_by)) if named_by else opaque_layout(size)


def _finished(p: str, layout: FileLayout) -> FileLayout:
    layout = FileLayout(layout.format, layout.size, tuple(coalesce(list(layout.segments))), layout.error)
    try:
        layout.check_tiling()
    except AssertionError as exc:   # a parser bug must not make a file unstorable
        return opaque_layout(layout.size, error=f"internal error: {p}: {exc}")
    return layout
