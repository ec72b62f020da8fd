"""Errors shared by several layers."""
from __future__ import annotations

import errno


class CorruptChunk(OSError):
    """Stored bytes failed verification or could not be read; the mount answers EIO, never wrong bytes."""

    def __init__(self, message: str):
        super().__init__(errno.EIO, message)
