"""Drive a fsmodel Filesystem by paths, as a program would a mount (for tests without FUSE)."""
from __future__ import annotations

import os

from lmzfs.fsmodel.filesystem import ROOT_INODE, Attributes, Filesystem


class PathDriver:
    def __init__(self, fs: Filesystem):
        self.fs = fs
        self.uid, self.gid = os.getuid(), os.getgid()

    def _split(self, path: str) -> tuple[int, str]:
        parts = [p for p in path.split("/") if p]
        inode = ROOT_INODE
        for part in parts[:-1]:
            inode = self.fs.lookup(inode, part).inode
        return inode, parts[-1]

    def stat(self, path: str) -> Attributes:
        parts = [p for p in path.split("/") if p]
        if not parts:
            return self.fs.getattr(ROOT_INODE)
        parent, name = self._split(path)
        return self.fs.lookup(parent, name)

    def mkdir(self, path: str, mode: int = 0o755) -> Attributes:
        parent, name = self._split(path)
        return self.fs.mkdir(parent, name, mode, self.uid, self.gid)

    def rmdir(self, path: str) -> None:
        parent, name = self._split(path)
        self.fs.rmdir(parent, name)

    def unlink(self, path: str) -> None:
        parent, name = self._split(path)
        self.fs.unlink(parent, name)

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        p1, n1 = self._split(old)
        p2, n2 = self._split(new)
        self.fs.rename(p1, n1, p2, n2, flags)

    def symlink(self, target: bytes, path: str) -> Attributes:
        parent, name = self._split(path)
        return self.fs.symlink(parent, name, target, self.uid, self.gid)

    def listdir(self, path: str) -> list[str]:
        return [name for name, _ in self.fs.readdir(self.stat(path).inode)]

    def open(self, path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        if flags & os.O_CREAT:
            parent, name = self._split(path)
            return self.fs.create(parent, name, mode, self.uid, self.gid, flags)[0]
        return self.fs.open(self.stat(path).inode, flags)

    def write_file(self, path: str, data: bytes) -> None:
        fh = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.fs.write(fh, 0, data)
        finally:
            self.fs.release(fh)

    def read_file(self, path: str) -> bytes:
        fh = self.open(path)
        try:
            return self.fs.read(fh, 0, self.stat(path).size + 1)
        finally:
            self.fs.release(fh)
