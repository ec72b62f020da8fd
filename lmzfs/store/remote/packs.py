"""A remote store's pack objects as the read path's pack backend (store/packbackend.py).

Readers hold pack objects as they hold local pack descriptors; a held pack object reads through
the RangeFetcher (fetched ranges, the on-disk block cache, read-ahead). Pack ids are stable across
snapshots (store/remote/format.py), so the ids of every snapshot a process has opened stay
known: a file opened under an older snapshot keeps reading its packs after a newer one is taken.
The first read of each pack checks its header (a pack of a version this lmzfs does not know is
refused, as a local one is).
"""
from __future__ import annotations

import threading

from lmzfs.errors import CorruptChunk
from lmzfs.store.packs import RECORD_HEADER, PackDamaged, check_pack_header
from lmzfs.store.remote.fetch import RangeFetcher
from lmzfs.store.remote.format import RemotePack
from lmzfs.store.remote.objects import RemoteError


class RemotePackFile:
    """One pack object, read by ranges (short past its end, as pread)."""
    __slots__ = ("key", "size", "_fetcher")

    def __init__(self, key: str, size: int, fetcher: RangeFetcher):
        self.key, self.size, self._fetcher = key, size, fetcher

    def pread(self, length: int, offset: int) -> bytes:
        return self._fetcher.read(self.key, self.size, offset, length)

    def at_hand(self, offset: int, length: int) -> bool:
        """Whether a pread of this range (its record header included) would fetch nothing."""
        return self._fetcher.at_hand(self.key, self.size, max(0, offset - RECORD_HEADER.size), length + RECORD_HEADER.size)


class RemotePacks:
    """The pack backend of a remote store, read-only: descriptors() is all it offers."""

    def __init__(self, fetcher: RangeFetcher, packs: dict[int, RemotePack]):
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self._known: dict[int, RemotePack] = dict(packs)
        self._checked: set[int] = set()
        self._holders: dict[int, int] = {}

    def learn(self, packs: dict[int, RemotePack]) -> None:
        """Add the packs of a newer snapshot (ids already known keep their object)."""
        with self._lock:
            for pid, p in packs.items():
                self._known.setdefault(pid, p)

    def descriptors(self) -> "RemotePacks":
        return self

    def list_packs(self) -> dict[int, int]:
        with self._lock:
            return {pid: p.size for pid, p in self._known.items()}

    # -- the handles readers hold (store/packbackend.py PackHandles) -------------------------------
    def acquire(self, pack_ids: set[int]) -> dict[int, RemotePackFile]:
        out: dict[int, RemotePackFile] = {}
        with self._lock:
            unknown = sorted(pid for pid in pack_ids if pid not in self._known)
            if unknown:
                raise CorruptChunk(f"cannot open pack: pack {unknown[0]} is in no snapshot of the remote store")
            for pid in pack_ids:
                p = self._known[pid]
                out[pid] = RemotePackFile(p.key, p.size, self.fetcher)
            fresh = [pid for pid in pack_ids if pid not in self._checked]
        for pid in fresh:
            try:
                check_pack_header(out[pid], out[pid].key)
            except (PackDamaged, RemoteError, OSError) as exc:
                raise CorruptChunk(f"cannot open pack: {exc}") from exc
        with self._lock:
            self._checked.update(fresh)
            for pid in pack_ids:
                self._holders[pid] = self._holders.get(pid, 0) + 1
        return out

    def held(self, pack_id: int) -> RemotePackFile | None:
        with self._lock:
            p = self._known.get(pack_id) if self._holders.get(pack_id) else None
        return None if p is None else RemotePackFile(p.key, p.size, self.fetcher)

    def release(self, fds: dict[int, RemotePackFile]) -> None:
        with self._lock:
            for pid in fds:
                self._holders[pid] -= 1
                if not self._holders[pid]:
                    del self._holders[pid]

    def __len__(self) -> int:
        with self._lock:
            return len(self._holders)

    def close(self) -> None:
        self.fetcher.close()
