"""A read-only, seekable binary file over anything that reads by offset, for the code that wants an
open file (the container parsers): a stored file read through the chunk source, a writable
mount's file through its spool and stored version."""
from __future__ import annotations

import io


class PreadIO(io.RawIOBase):
    """Subclasses say how large the bytes are (`size`) and read them by offset (`pread`)."""

    _pos = 0

    @property
    def size(self) -> int:
        raise NotImplementedError

    def pread(self, offset: int, length: int) -> bytes:
        """Up to `length` bytes from `offset`; fewer only at the end."""
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        chunk = self.pread(self._pos, len(buffer))
        buffer[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)
