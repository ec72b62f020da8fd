"""The on-disk cache of ranges fetched from a remote store, bounded by bytes.

A pack object is cached in blocks of BLOCK_BYTES (the last one shorter), one file per block:

    ROOT/blocks/HH/HASH-BBBBBBBB     HASH: SHA-256 of the object's key (32 hex), B: block number

Each file is a 32-byte header (b"LMZBLK1\\0", u32 length, u32 0, XXH3-128 of the bytes) and the
bytes. A block is written to a temporary name and renamed, so a killed process leaves whole
blocks or none; one that is damaged, cut short or of another version anyway (a flipped bit on
disk, a full disk) fails its check when read, is removed and fetched again: never served.
Objects are immutable (their keys are never reused), so a cached block never goes stale.
The least recently used blocks go first once the cache passes its capacity. One process owns
a cache directory at a time (a lock file); another gets CacheBusy.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import xxhash

BLOCK_BYTES = 1 << 20
_HEAD = struct.Struct("<8sII16s")
_MAGIC = b"LMZBLK1\x00"
DIR_MODE, FILE_MODE = 0o700, 0o600


class CacheBusy(OSError):
    """Another process owns the cache directory."""


@dataclass
class BlockCacheStats:
    hits: int = 0
    misses: int = 0
    damaged: int = 0         # blocks that failed their check and were fetched again
    evicted: int = 0
    write_errors: int = 0    # blocks that could not be written (a full disk): served, not kept


class BlockCache:
    def __init__(self, root: Path, capacity: int):
        self.root = Path(root)
        self.capacity = capacity
        self.stats = BlockCacheStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()     # file name -> bytes on disk, LRU first
        self._bytes = 0
        self._blocks_dir = str(self.root / "blocks")
        self._dirs: set[str] = set()          # subdirectories of blocks/ made (or found) so far
        self.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        (self.root / "blocks").mkdir(exist_ok=True, mode=DIR_MODE)
        self._owner = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._owner)
            raise CacheBusy(f"the cache {self.root} is in use by another lmz process") from None
        self._load()

    def _load(self) -> None:
        found = []
        for sub in (self.root / "blocks").iterdir():
            if not sub.is_dir():
                continue
            for p in sub.iterdir():
                if ".tmp" in p.name:
                    p.unlink(missing_ok=True)       # a write a killed process left
                    continue
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime, f"{sub.name}/{p.name}", st.st_size))
        for _, name, size in sorted(found):
            self._index[name] = size
            self._bytes += size
        with self._lock:
            self._evict_locked()

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _stem(key: str) -> str:
        h = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{h[:2]}/{h}"

    def _name(self, key: str, block: int) -> str:
        return f"{self._stem(key)}-{block:08x}"

    def _path(self, name: str) -> str:
        return os.path.join(self._blocks_dir, name)

    def contains(self, key: str, block: int) -> bool:
        with self._lock:
            return self._name(key, block) in self._index

    def advise(self, key: str, blocks: list[int]) -> None:
        """Tell the kernel these blocks will be read soon (POSIX_FADV_WILLNEED: it reads them in
        the background), as its read-ahead does for one long file. Costs a system call or two per
        block, and may wait for the disk's queue: call it off a reader's path."""
        for block in blocks:
            try:
                fd = os.open(self._path(self._name(key, block)), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    def get(self, key: str, block: int, length: int) -> memoryview | None:
        """The block's bytes if cached whole and sound, else None (a damaged one is removed)."""
        name = self._name(key, block)
        with self._lock:
            known = name in self._index
            if known:
                self._index.move_to_end(name)
        if not known:
            self.stats.misses += 1
            return None
        try:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                raw = os.pread(fd, _HEAD.size + length + 1, 0)     # one more: a longer file is damaged too
            finally:
                os.close(fd)
        except OSError:
            raw = b""
        if len(raw) == _HEAD.size + length:
            magic, n, zero, digest = _HEAD.unpack_from(raw)
            data = memoryview(raw)[_HEAD.size:]
            if magic == _MAGIC and n == length and zero == 0 and xxhash.xxh3_128_digest(data) == digest:
                self.stats.hits += 1
                return data          # a view of what was read: no copy
        self.stats.damaged += 1
        self._drop(name)
        return None

    def put(self, key: str, block: int, data: bytes) -> None:
        if self.capacity <= 0:
            return
        name = self._name(key, block)
        path = self.root / "blocks" / name
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
        head = _HEAD.pack(_MAGIC, len(data), 0, xxhash.xxh3_128_digest(data))
        try:
            if name[:2] not in self._dirs:
                path.parent.mkdir(exist_ok=True, mode=DIR_MODE)
                self._dirs.add(name[:2])
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
            try:
                _write_all(fd, [head, data])        # the header and the bytes, without joining them
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            self.stats.write_errors += 1
            self._dirs.discard(name[:2])        # made again next time, should it have gone
            tmp.unlink(missing_ok=True)
            return
        with self._lock:
            size = len(head) + len(data)
            self._bytes += size - self._index.pop(name, 0)
            self._index[name] = size
            self._evict_locked()

    def _drop(self, name: str) -> None:
        with self._lock:
            self._bytes -= self._index.pop(name, 0)
        (self.root / "blocks" / name).unlink(missing_ok=True)

    def _evict_locked(self) -> None:
        while self._bytes > self.capacity and self._index:
            name, size = self._index.popitem(last=False)
            self._bytes -= size
            self.stats.evicted += 1
            try:
                (self.root / "blocks" / name).unlink()
            except OSError:
                pass

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._index)

    def close(self) -> None:
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None


def _write_all(fd: int, parts: list) -> None:
    """Write every byte of the buffers, in order, however short each write comes back."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        n = os.writev(fd, views)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no byte written")
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
