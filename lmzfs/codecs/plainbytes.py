"""A decoded buffer (a codec's array, as Codec.decode_buffer returns it) as a bytes object.

One copy either way; with the compiled extension it is made with Python's lock released for
large buffers (lmzfs/codecs/_tanscopy.c says why), else by memoryview.tobytes().
"""
from __future__ import annotations

from . import kernels
from .base import Buffer


def to_bytes(buf: Buffer) -> bytes:
    """The buffer's bytes; bytes come back as they are. C-contiguous buffers only."""
    if isinstance(buf, bytes):
        return buf
    loop = kernels.compiled()
    if loop is not None:
        return loop.copy_bytes(buf)
    with memoryview(buf) as mv:
        return mv.tobytes()
