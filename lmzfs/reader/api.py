"""The random-access reader's public surface, as the daemon and the CLI see it.

The implementation lives in lmzfs/reader/archive.py and filereader.py, over the store's chunk
source (lmzfs/store/read/chunksource.py); a small in-memory double
for tests of the layers above lives in lmzfs/testing/fake_archive.py. Both follow this contract:

- ``Archive.generation()`` is cheap and changes whenever a model is added or removed.
- ``Archive.files()`` lists every file of every model at the current generation.
- ``Archive.open(entry)`` returns a FileReader; it raises FileNotFoundError if the file is gone.
  A reader opened before its model was removed keeps reading until it is closed.
- ``FileReader.pread(offset, length)`` returns exactly the original bytes (short only at EOF).
  It may be called from several threads at once. Every decoded chunk is checked against its id
  before any byte of it is returned; a chunk that fails the check or cannot be read raises
  CorruptChunk, an OSError with errno EIO, never wrong bytes.
- ``FileReader.pread_nowait(offset, length, idle=False)`` returns the same bytes as pread()
  when they can be had without waiting for another thread (every chunk cached, or one missing
  chunk that its codec says is cheap to decode; with idle, a lone read's one missing chunk of
  any cost), else None; an event loop may call it directly. It may raise CorruptChunk.
- A store the archive cannot read (a damaged catalog) raises StoreError, whose message is one
  line meant for the operator (e.g. "catalog ... is damaged: run lmz verify --repair").
- ``Archive.streaming()`` is cheap and tells whether any open file is being read ahead of a
  sequential reader (whose reads a long decode on the event loop would hold up).
"""
from __future__ import annotations

from dataclasses import dataclass

from lmzfs.errors import CorruptChunk
from lmzfs.store.layout import StoreError

__all__ = ["CorruptChunk", "FileEntry", "StoreError", "StoreTotals"]


@dataclass(frozen=True)
class FileEntry:
    model: str          # "minilm" or "run1/step-1000"
    path: str           # path inside the model, "/"-separated, no leading slash
    size: int           # logical (plain) size in bytes
    mtime: float        # the original file's mtime, seconds since the epoch
    sha256: str         # hex digest of the whole plain file
    stored_bytes: int   # encoded payload bytes of the distinct chunks this file references
    codecs: str         # the names of the codecs its chunks use, comma-separated
    file_id: int


@dataclass(frozen=True)
class StoreTotals:
    logical_bytes: int  # sum of file sizes over all models
    stored_bytes: int   # bytes used on disk by packs and catalog
    files: int
