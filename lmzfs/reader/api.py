"""The random-access reader's public surface, as the daemon and the CLI see it.

The implementation lives in lmzfs/reader/archive.py and filereader.py; a small in-memory double
for tests of the layers above lives in lmzfs/testing/fake_archive.py. Both follow this contract:

- ``Archive.generation()`` is cheap and changes whenever a model is added or removed.
- ``Archive.files()`` lists every file of every model at the current generation.
- ``Archive.open(entry)`` returns a FileReader; it raises FileNotFoundError if the file is gone.
  A reader opened before its model was removed keeps reading until it is closed.
- ``FileReader.pread(offset, length)`` returns exactly the original bytes (short only at EOF).
  It may be called from several threads at once. Every decoded chunk is checked against its id
  before any byte of it is returned; a chunk that fails the check or cannot be read raises
  CorruptChunk, an OSError with errno EIO, never wrong bytes.
- ``FileReader.pread_cached(offset, length, decode_quick=False)`` returns the same bytes as
  pread() when they can be served without decoding (every chunk already cached), else None; it
  never waits for another thread, so an event loop may call it directly. With decode_quick it
  may also decode one small chunk of a fast codec itself (well under a millisecond), and with
  decode_lone the one chunk a lone read (one that does not continue the previous read) misses,
  of any codec (1-2 ms for 1 MiB of BF16); it may then raise CorruptChunk as pread() does.
- ``Archive.streaming()`` is cheap and tells whether any open file is being read ahead of a
  sequential reader (whose reads a long decode on the event loop would hold up).
"""
from __future__ import annotations

from dataclasses import dataclass

from lmzfs.errors import CorruptChunk

__all__ = ["CorruptChunk", "FileEntry", "StoreTotals"]


@dataclass(frozen=True)
class FileEntry:
    model: str          # "minilm" or "run1/step-1000"
    path: str           # path inside the model, "/"-separated, no leading slash
    size: int           # logical (plain) size in bytes
    mtime: float        # the original file's mtime, seconds since the epoch
    sha256: str         # hex digest of the whole plain file
    stored_bytes: int   # encoded payload bytes of the distinct chunks this file references
    codecs: str         # comma-separated codec names used by its chunks, e.g. "bytegroup,zstd"
    file_id: int


@dataclass(frozen=True)
class StoreTotals:
    logical_bytes: int  # sum of file sizes over all models
    stored_bytes: int   # bytes used on disk by packs and catalog
    files: int
