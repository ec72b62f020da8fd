"""The on-disk cache of ranges fetched from a remote store, bounded by bytes.

A pack object is cached in blocks of BLOCK_BYTES (the last one shorter), all of an object's
blocks in one file, each at its own offset in the object (docs/format.md, "Host cache"):

    ROOT/objects/HH/HASH     HASH: the first 32 hex digits of the SHA-256 of the object's key

The file opens with a 64-byte header (the object's size, checked by a checksum of its own) and a
table of one 32-byte slot per block (its length, the order it was written in, its XXH3-128);
the blocks follow, from the first 4 KiB boundary past the table, where a block missing is a hole.
A block's bytes are written first and its slot after them, so a killed process leaves a block
whole or absent; one that is damaged anyway (a flipped bit on disk, a file cut short, a power
loss between the two writes) fails its check when read, is dropped and fetched again: never
served. Read back, a cached object is one file the kernel reads ahead as it reads a pack file,
and one pread() a block: one file per block cost a warm read an open and a close per MiB and
the kernel's read-ahead across blocks. Objects are immutable (their keys are never reused), so a
cached block never goes stale. The least recently used blocks go first once the cache passes its
capacity, their space freed by punching a hole (where the filesystem cannot, the whole object
goes). One process owns a cache directory at a time (a lock file); another gets CacheBusy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import xxhash

BLOCK_BYTES = 1 << 20
VERSION = 1
_MAGIC = b"LMZOBJC\x00"
# magic, version, block bytes, object size, blocks, data offset, key digest; then XXH3-128 of those 48 bytes
_HEAD = struct.Struct("<8sIIQII16s")
_HEAD_BYTES = 64
_SLOT = struct.Struct("<IIQ16s")        # length, state (1: present), write order, XXH3-128 of the bytes
_PRESENT = 1
_PAGE = 4096
MAX_OPEN_FILES = 128                   # object files kept open at once (least recently used closed)
DIR_MODE, FILE_MODE = 0o700, 0o600
log = logging.getLogger(__name__)


class CacheBusy(OSError):
    """Another process owns the cache directory."""


@dataclass
class BlockCacheStats:
    hits: int = 0
    misses: int = 0
    damaged: int = 0         # blocks that failed their check and were fetched again
    evicted: int = 0
    write_errors: int = 0    # blocks that could not be written (a full disk): served, not kept


@dataclass(frozen=True)
class ObjectLayout:
    """Where an object's blocks lie in its cache file."""
    size: int               # the object's bytes
    blocks: int
    data_offset: int        # block b starts at data_offset + b * BLOCK_BYTES

    @classmethod
    def of(cls, size: int) -> "ObjectLayout":
        blocks = -(-size // BLOCK_BYTES)
        return cls(size, blocks, -(-(_HEAD_BYTES + blocks * _SLOT.size) // _PAGE) * _PAGE)

    def block_len(self, block: int) -> int:
        return min(BLOCK_BYTES, self.size - block * BLOCK_BYTES)

    def block_at(self, block: int) -> int:
        return self.data_offset + block * BLOCK_BYTES

    @staticmethod
    def slot_at(block: int) -> int:
        return _HEAD_BYTES + block * _SLOT.size


@dataclass(frozen=True)
class CachedBlock:
    """A block the cache holds, as its object file says (where a test finds the bytes to damage)."""
    path: Path
    block: int
    offset: int             # where its bytes start in the file
    length: int


def _header(layout: ObjectLayout, key_digest: bytes) -> bytes:
    head = _HEAD.pack(_MAGIC, VERSION, BLOCK_BYTES, layout.size, layout.blocks, layout.data_offset, key_digest)
    return (head + xxhash.xxh3_128_digest(head)).ljust(_HEAD_BYTES, b"\0")


def _parse_header(raw: bytes) -> tuple[ObjectLayout, bytes] | None:
    """The layout and key digest of a sound header of this version, else None."""
    if len(raw) < _HEAD_BYTES or raw[:8] != _MAGIC:
        return None
    head = raw[:_HEAD.size]
    if xxhash.xxh3_128_digest(head) != raw[_HEAD.size:_HEAD.size + 16]:
        return None
    _, version, block_bytes, size, blocks, data_offset, key_digest = _HEAD.unpack(head)
    layout = ObjectLayout.of(size)
    if version != VERSION or block_bytes != BLOCK_BYTES or (blocks, data_offset) != (layout.blocks, layout.data_offset):
        return None
    return layout, key_digest


@dataclass(frozen=True)
class Slot:
    block: int
    length: int             # as the slot says (a sound one: the block's length in the object)
    order: int              # when it was written (nanoseconds since the epoch): least recent first out
    digest: bytes           # XXH3-128 of the block's bytes


@dataclass(frozen=True)
class ObjectFile:
    layout: ObjectLayout
    key_digest: bytes       # the first 16 bytes of the SHA-256 of the object's key (its file's name)
    present: list[Slot]


def read_object_file(path: Path) -> ObjectFile | None:
    """What an object file's header and table say, or None if its header is not a sound one of
    this version."""
    try:
        with open(path, "rb") as f:
            parsed = _parse_header(f.read(_HEAD_BYTES))
            if parsed is None:
                return None
            layout, key_digest = parsed
            table = f.read(layout.blocks * _SLOT.size)
    except OSError:
        return None
    present = []
    for block in range(len(table) // _SLOT.size):
        length, state, order, digest = _SLOT.unpack_from(table, block * _SLOT.size)
        if state == _PRESENT:
            present.append(Slot(block, length, order, digest))
    return ObjectFile(layout, key_digest, present)


def cached_blocks(root: Path) -> list[CachedBlock]:
    """Every block the cache directory's object files say they hold, in file and block order."""
    out = []
    for path in sorted((Path(root) / "objects").glob("*/*")):
        found = read_object_file(path)
        if found is not None:
            out += [CachedBlock(path, s.block, found.layout.block_at(s.block), s.length) for s in found.present]
    return out


def disk_bytes(root: Path) -> int:
    """Bytes the cache's object files take on disk (holes excluded)."""
    objects = Path(root) / "objects"
    return sum(p.stat().st_blocks * 512 for p in objects.rglob("*") if p.is_file()) if objects.is_dir() else 0


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the file's bytes [offset, offset + length) on disk (they read as zeros); OSError if the
    filesystem cannot (EOPNOTSUPP)."""
    if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class _ObjectFile:
    """An open object file; closed once no thread uses it and it has left the open set."""
    __slots__ = ("stem", "layout", "fd", "users", "retired")

    def __init__(self, stem: str, layout: ObjectLayout, fd: int):
        self.stem, self.layout, self.fd = stem, layout, fd
        self.users = 0
        self.retired = False


class BlockCache:
    def __init__(self, root: Path, capacity: int):
        self.root = Path(root)
        self.capacity = capacity
        self.stats = BlockCacheStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[tuple[str, int], bytes] = OrderedDict()   # (stem, block) -> XXH3-128, LRU first
        self._layouts: dict[str, ObjectLayout] = {}       # objects with a file on disk
        self._present: dict[str, int] = {}                # stem -> blocks in the index
        self._open: OrderedDict[str, _ObjectFile] = OrderedDict()
        self._made: dict[str, int] = {}                   # stem -> which file of it (one more each time made)
        self._bytes = 0
        self._punch = True
        self._objects_dir = self.root / "objects"
        self.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        self._owner = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._owner)
            raise CacheBusy(f"the cache {self.root} is in use by another lmz process") from None
        # a cache of an earlier version (one file per block): dropped whole, it is only a cache
        if (self.root / "blocks").is_dir():
            log.info("%s: dropping the cache of an earlier release (one file per block)", self.root)
            shutil.rmtree(self.root / "blocks", ignore_errors=True)
        self._objects_dir.mkdir(exist_ok=True, mode=DIR_MODE)
        self._load()

    def _load(self) -> None:
        found = []
        for path in self._objects_dir.glob("*/*"):
            read = read_object_file(path)
            if read is None or path.parent.name != path.name[:2] or read.key_digest.hex() != path.name:
                path.unlink(missing_ok=True)        # not a sound object file of this version
                continue
            layout = read.layout
            stem = f"{path.parent.name}/{path.name}"
            self._layouts[stem] = layout
            self._bytes += layout.data_offset
            self._present[stem] = 0
            found += [(s.order, stem, s.block, s.digest) for s in read.present
                      if s.length == layout.block_len(s.block)]
        for _, stem, block, digest in sorted(found):
            self._index[(stem, block)] = digest
            self._present[stem] += 1
            self._bytes += self._layouts[stem].block_len(block)
        with self._lock:
            for stem in [s for s, n in self._present.items() if n == 0]:
                self._remove_object_locked(stem)
            self._evict_locked()

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _stem(key: str) -> str:
        h = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{h[:2]}/{h}"

    def _path(self, stem: str) -> Path:
        return self._objects_dir / stem

    # -- open files ---------------------------------------------------------------------------------
    def _acquire_locked(self, stem: str) -> _ObjectFile:
        """The object's open file, one more user counted; OSError if it cannot be opened."""
        f = self._open.get(stem)
        if f is None:
            fd = os.open(self._path(stem), os.O_RDWR | os.O_CLOEXEC)
            f = self._open[stem] = _ObjectFile(stem, self._layouts[stem], fd)
            while len(self._open) > MAX_OPEN_FILES:
                self._retire_locked(next(iter(self._open)))
        else:
            self._open.move_to_end(stem)
        f.users += 1
        return f

    def _release(self, f: _ObjectFile) -> None:
        with self._lock:
            f.users -= 1
            if f.retired and f.users == 0:
                os.close(f.fd)

    def _retire_locked(self, stem: str) -> None:
        f = self._open.pop(stem, None)
        if f is not None:
            f.retired = True
            if f.users == 0:
                os.close(f.fd)

    def _create_locked(self, stem: str, layout: ObjectLayout) -> None:
        """A new object file with its header and an empty table (an existing one of another size,
        which a key never has, is replaced)."""
        if self._layouts.get(stem) == layout:
            return
        if stem in self._layouts:
            self._remove_object_locked(stem)
        path = self._path(stem)
        path.parent.mkdir(exist_ok=True, mode=DIR_MODE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            _pwrite_all(fd, _header(layout, bytes.fromhex(stem[3:])), 0)
            os.ftruncate(fd, layout.data_offset)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._layouts[stem] = layout
        self._present[stem] = 0
        self._made[stem] = self._made.get(stem, 0) + 1
        self._bytes += layout.data_offset
        self._open[stem] = _ObjectFile(stem, layout, fd)
        while len(self._open) > MAX_OPEN_FILES:
            self._retire_locked(next(iter(self._open)))

    def _remove_object_locked(self, stem: str) -> int:
        """Forget the object and delete its file; how many of its blocks the index held."""
        dropped = 0
        layout = self._layouts[stem]
        for block in range(layout.blocks):
            if self._index.pop((stem, block), None) is not None:
                self._bytes -= layout.block_len(block)
                dropped += 1
        self._retire_locked(stem)
        self._bytes -= self._layouts.pop(stem).data_offset
        self._present.pop(stem, None)
        self._path(stem).unlink(missing_ok=True)
        return dropped

    # -- the cache ----------------------------------------------------------------------------------
    def contains(self, key: str, block: int) -> bool:
        with self._lock:
            return (self._stem(key), block) in self._index

    def get(self, key: str, size: int, block: int) -> bytes | None:
        """The block's bytes if cached whole and sound, else None (a damaged one is dropped)."""
        stem = self._stem(key)
        k = (stem, block)
        with self._lock:
            digest = self._index.get(k)
            if digest is None or self._layouts[stem].size != size:
                self.stats.misses += 1
                return None
            self._index.move_to_end(k)
            length = self._layouts[stem].block_len(block)
            try:
                f = self._acquire_locked(stem)
            except OSError:
                f = None
        raw = b""
        if f is not None:
            try:
                raw = os.pread(f.fd, length, f.layout.block_at(block))
            except OSError:
                pass
            finally:
                self._release(f)
        if len(raw) == length and xxhash.xxh3_128_digest(raw) == digest:
            self.stats.hits += 1
            return raw
        self.stats.damaged += 1
        with self._lock:
            self._drop_locked(k)
        return None

    def put(self, key: str, size: int, block: int, data: bytes) -> None:
        """Keep the object's block (its bytes, then its slot); a write that fails (a full disk)
        is counted and the block is not kept."""
        if self.capacity <= 0:
            return
        stem = self._stem(key)
        k = (stem, block)
        layout = ObjectLayout.of(size)
        if not 0 <= block < layout.blocks or len(data) != layout.block_len(block):
            raise ValueError(f"block {block} of {len(data)} bytes is not one of an object of {size}")
        digest = xxhash.xxh3_128_digest(data)
        f = None
        try:
            with self._lock:
                self._create_locked(stem, layout)
                made = self._made.get(stem)
                f = self._acquire_locked(stem)
            _pwrite_all(f.fd, data, layout.block_at(block))
            _pwrite_all(f.fd, _SLOT.pack(len(data), _PRESENT, time.time_ns(), digest), layout.slot_at(block))
        except OSError:
            self.stats.write_errors += 1
            if f is not None:           # what of the block was written before the disk filled: freed
                try:
                    punch_hole(f.fd, layout.block_at(block), len(data))
                except OSError:
                    pass
            with self._lock:
                if stem in self._layouts and self._present.get(stem) == 0 and k not in self._index:
                    self._remove_object_locked(stem)
            return
        finally:
            if f is not None:
                self._release(f)
        with self._lock:
            if stem not in self._layouts or self._made.get(stem) != made:
                return              # the object was evicted whole meanwhile: written into a file since removed
            if k not in self._index:
                self._present[stem] += 1
                self._bytes += len(data)
            self._index[k] = digest
            self._index.move_to_end(k)
            self._evict_locked()

    def _drop_locked(self, k: tuple[str, int]) -> int:
        """Forget the block and free its space: its slot cleared, its bytes a hole. Where the
        hole cannot be punched, the object's whole file goes. How many blocks were dropped."""
        stem, block = k
        if self._index.pop(k, None) is None:
            return 0
        self._bytes -= self._layouts[stem].block_len(block)
        self._present[stem] -= 1
        if self._present[stem] == 0:
            self._remove_object_locked(stem)
            return 1
        layout = self._layouts[stem]
        try:
            f = self._acquire_locked(stem)
        except OSError:
            return 1 + self._remove_object_locked(stem)
        try:
            _pwrite_all(f.fd, bytes(_SLOT.size), layout.slot_at(block))
            if self._punch:
                punch_hole(f.fd, layout.block_at(block), layout.block_len(block))
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                self._punch = False
            return 1 + self._remove_object_locked(stem)     # space not freed otherwise: the whole object goes
        finally:
            f.users -= 1
            if f.retired and f.users == 0:
                os.close(f.fd)
        return 1

    def _evict_locked(self) -> None:
        while self._bytes > self.capacity and self._index:
            k = next(iter(self._index))
            self.stats.evicted += self._drop_locked(k) if self._punch else self._remove_object_locked(k[0])

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._index)

    def close(self) -> None:
        with self._lock:
            for stem in list(self._open):
                self._retire_locked(stem)
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None


def _pwrite_all(fd: int, data, offset: int) -> None:
    """Write every byte of data at offset, however short each write comes back."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no byte written")
        view, offset = view[n:], offset + n

