"""An in-memory stand-in for ``lmzfs.reader.archive.Archive``, for testing the layers above it.

It follows the contract in ``lmzfs/reader/api.py``: ``generation()`` changes whenever a model is
added or removed, ``open()`` raises FileNotFoundError for a file that is gone, a reader opened
before its model was removed keeps reading, and ``pread`` raises CorruptChunk (never wrong bytes)
over a range that ``corrupt()`` marked as damaged.

A real mount runs in its own process, so a FakeArchive can also be saved to a directory
(``save``) and served from there by the daemon through ``open_saved`` (its ``archive_factory``);
the saved copy is re-read whenever it is saved again, so tests can add and remove models while
the file system is mounted.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lmzfs.reader.api import CorruptChunk, FileEntry, StoreTotals

DEFAULT_MTIME = 1_700_000_000.0
SAVED_DIR = "fake-archive"          # under the store directory
MANIFEST = "manifest.json"


@dataclass(eq=False)
class _FakeFile:
    entry: FileEntry
    data: bytes
    # Offsets marked damaged; shared with open readers so damage shows up in them too.
    corrupt_offsets: set[int] = field(default_factory=set)
    cheap: bool = False            # pread_nowait() serves it, as it would chunks cheap to decode


class FakeFileReader:
    """Reads one file's bytes; holds the file itself, so removal of its model does not affect it."""

    def __init__(self, fake_file: _FakeFile, on_close):
        self._file = fake_file
        self._on_close = on_close
        self.size = fake_file.entry.size
        self.closed = False
        self.idle_offered = False      # whether the latest pread_nowait call had idle

    def pread(self, offset: int, length: int) -> bytes:
        if self.closed:
            raise ValueError("pread on a closed FakeFileReader")
        if offset < 0 or length < 0:
            raise ValueError(f"negative offset or length: {offset}, {length}")
        end = min(offset + length, self.size)
        for bad in self._file.corrupt_offsets:
            if offset <= bad < end:
                entry = self._file.entry
                raise CorruptChunk(f"{entry.model}/{entry.path}: damaged chunk at offset {bad}")
        return self._file.data[offset:end]

    def pread_nowait(self, offset: int, length: int, *, idle: bool = False) -> bytes | None:
        """The fake keeps no decoded-chunk cache: every read takes the pread() path, except that
        a file added with cheap=True is read (and its damage raised) here, and with idle any
        file is (its reads count as lone misses)."""
        self.idle_offered = idle
        return self.pread(offset, length) if self._file.cheap or idle else None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()


class FakeArchive:
    def __init__(self) -> None:
        self.stream_active = False
        self._files: dict[tuple[str, str], _FakeFile] = {}
        self._generation = 0
        self._next_file_id = 1
        self._lock = threading.Lock()    # readers are closed from worker threads too
        self.open_readers = 0            # lets tests check that every handle was released
        self.closed = False

    # -- building the fake store ------------------------------------------------------------

    def add(self, model: str, path: str, data: bytes, mtime: float = DEFAULT_MTIME,
            codecs: str = "zstd", cheap: bool = False) -> FileEntry:
        """Add (or replace) one file of a model; cheap: serve it as chunks cheap to decode."""
        data = bytes(data)
        entry = FileEntry(
            model=model, path=path, size=len(data), mtime=float(mtime),
            sha256=hashlib.sha256(data).hexdigest(), stored_bytes=len(data), codecs=codecs,
            file_id=self._next_file_id,
        )
        self._next_file_id += 1
        self._files[(model, path)] = _FakeFile(entry, data, cheap=cheap)
        self._generation += 1
        return entry

    def remove(self, model: str) -> None:
        """Remove every file of a model; KeyError if there is no such model."""
        keys = [key for key in self._files if key[0] == model]
        if not keys:
            raise KeyError(model)
        for key in keys:
            del self._files[key]
        self._generation += 1

    def corrupt(self, model: str, path: str, offset: int) -> None:
        """From now on, a pread whose range covers *offset* of this file raises CorruptChunk."""
        fake_file = self._files[(model, path)]
        if not 0 <= offset < fake_file.entry.size:
            raise ValueError(f"offset {offset} outside {model}/{path}")
        fake_file.corrupt_offsets.add(offset)

    # -- the Archive surface ----------------------------------------------------------------

    def streaming(self) -> bool:
        """The fake reads nothing ahead; a test sets stream_active to stand for a sequential reader."""
        return self.stream_active

    def generation(self) -> int:
        return self._generation

    def files(self) -> list[FileEntry]:
        return [f.entry for f in self._files.values()]

    def totals(self) -> StoreTotals:
        files = list(self._files.values())
        distinct = {f.entry.sha256: f.entry.stored_bytes for f in files}   # dedup by content
        return StoreTotals(
            logical_bytes=sum(f.entry.size for f in files),
            stored_bytes=sum(distinct.values()),
            files=len(files),
        )

    def open(self, entry: FileEntry) -> FakeFileReader:
        fake_file = self._files.get((entry.model, entry.path))
        if fake_file is None or fake_file.entry.file_id != entry.file_id:
            raise FileNotFoundError(f"{entry.model}/{entry.path} is no longer in the store")
        with self._lock:
            self.open_readers += 1
        return FakeFileReader(fake_file, self._reader_closed)

    def close(self) -> None:
        self.closed = True

    def _reader_closed(self) -> None:
        with self._lock:
            self.open_readers -= 1

    # -- saving, for a daemon in another process ----------------------------------------------

    def save(self, store_dir: Path) -> None:
        """Write this archive under *store_dir*; a daemon serving it via ``open_saved`` picks up
        the new contents at its next generation check."""
        root = Path(store_dir) / SAVED_DIR
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        manifest = []
        for f in self._files.values():
            blob = root / "blobs" / f.entry.sha256
            if not blob.exists():
                blob.write_bytes(f.data)
            manifest.append({
                "model": f.entry.model, "path": f.entry.path, "mtime": f.entry.mtime,
                "codecs": f.entry.codecs, "sha256": f.entry.sha256,
                "corrupt_offsets": sorted(f.corrupt_offsets), "cheap": f.cheap,
            })
        # Written to a temporary name and renamed, so a reader never sees half a manifest.
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".manifest.")
        with os.fdopen(fd, "w") as out:
            json.dump(manifest, out)
        os.replace(tmp, root / MANIFEST)

    def _load_saved(self, root: Path) -> None:
        manifest = json.loads((root / MANIFEST).read_text())
        self._files = {}
        for item in manifest:
            entry = self.add(item["model"], item["path"], (root / "blobs" / item["sha256"]).read_bytes(),
                             mtime=item["mtime"], codecs=item["codecs"], cheap=item.get("cheap", False))
            self._files[(entry.model, entry.path)].corrupt_offsets.update(item["corrupt_offsets"])


class SavedFakeArchive(FakeArchive):
    """A FakeArchive read from a directory written by ``FakeArchive.save``, re-read when saved again."""

    def __init__(self, store_dir: Path):
        super().__init__()
        self._root = Path(store_dir) / SAVED_DIR
        self._seen = None
        if not (self._root / MANIFEST).exists():
            raise FileNotFoundError(f"no saved fake archive under {store_dir}")
        self.generation()

    def generation(self) -> int:
        # A save replaces the manifest by rename, so a new inode number means new contents.
        st = os.stat(self._root / MANIFEST)
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            self._load_saved(self._root)
            self._seen = seen
        return self._generation


def open_saved(store_dir: Path, cache_bytes: int = 0, workers: int | None = None) -> SavedFakeArchive:
    """An ``archive_factory`` for the daemon: serve the FakeArchive saved under *store_dir*."""
    return SavedFakeArchive(store_dir)
