"""Open pack file descriptors shared by readers.

A descriptor stays valid after `lmz gc` unlinks its pack, so a reader that opened a file before
a gc keeps reading the bytes it was promised; descriptors are released when no reader holds them.
A pack is never cut short under a reader either: every PackDescriptors holds a shared flock(2)
on the packs directory for as long as it is open, and gc truncates a pack in place only when it
can take that lock exclusively (packs_in_use); otherwise it copies the pack's live records into
a new pack, as for any other pack with garbage, and unlinks the old one.
"""
from __future__ import annotations

import fcntl
import os
import threading

from lmzfs.errors import CorruptChunk
from lmzfs.store.layout import StorePaths
from lmzfs.store.packs import PackDamaged, check_pack_header


class PackDescriptors:
    def __init__(self, store: StorePaths):
        self._store = store
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}
        self._holders: dict[int, int] = {}
        self._lease: int | None = None
        try:
            self._lease = os.open(store.packs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fcntl.flock(self._lease, fcntl.LOCK_SH)
        except OSError:             # no packs yet (an empty store): nothing to protect
            if self._lease is not None:
                os.close(self._lease)
            self._lease = None

    def acquire(self, pack_ids: set[int]) -> dict[int, int]:
        """Open (or share) descriptors for these packs; pair with release()."""
        out: dict[int, int] = {}
        with self._lock:
            try:
                for pid in sorted(pack_ids):
                    fd = self._fds.get(pid)
                    if fd is None:
                        path = self._store.pack(pid)
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                        try:
                            check_pack_header(fd, path)
                        except PackDamaged:
                            os.close(fd)
                            raise
                        self._fds[pid] = fd
                    self._holders[pid] = self._holders.get(pid, 0) + 1
                    out[pid] = fd
            except (OSError, PackDamaged) as exc:
                self._release_locked(out)
                raise CorruptChunk(f"cannot open pack: {exc}") from exc
        return out

    def held(self, pack_id: int) -> int | None:
        """The descriptor of a pack some holder holds, or None."""
        with self._lock:
            return self._fds.get(pack_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._fds)

    def release(self, fds: dict[int, int]) -> None:
        with self._lock:
            self._release_locked(fds)

    def _release_locked(self, fds: dict[int, int]) -> None:
        for pid in fds:
            self._holders[pid] -= 1
            if self._holders[pid] == 0:
                del self._holders[pid]
                os.close(self._fds.pop(pid))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._holders.clear()
            if self._lease is not None:
                os.close(self._lease)
                self._lease = None


def packs_in_use(store: StorePaths) -> bool:
    """Whether some process has the store's packs open for reading (a mount, `lmz cat`)."""
    fd = os.open(store.packs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)                # closing drops the lock if it was taken
    return False
