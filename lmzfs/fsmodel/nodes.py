"""What the writable file system is made of (a Node per inode) and what its calls return: the
types every part of lmzfs/fsmodel shares, and the OSError they all raise."""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from lmzfs.fsmodel.filedata import FileData
from lmzfs.store.catalog.fsrows import EntryMeta

ROOT_INODE = 1
NAME_MAX = 255
DEFAULT_DIR_MODE = 0o755
DEFAULT_FILE_MODE = 0o644
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
TYPE_BITS = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "symlink": stat.S_IFLNK}


def fs_error(code: int, what: str = "") -> OSError:
    """The error a call fails with: its errno is what the caller passes on (ENOENT, EEXIST ...)."""
    return OSError(code, os.strerror(code) + (f": {what}" if what else ""))


def found(value, code: int = errno.ENOENT):
    """What a table's `get` gave, or the error `code` where it gave None (no such inode, name...)."""
    if value is None:
        raise fs_error(code)
    return value


@dataclass(frozen=True)
class Attributes:
    inode: int
    mode: int                 # type and permission bits
    nlink: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int


@dataclass(eq=False)
class Node:
    inode: int
    kind: str                                    # "dir", "file" or "symlink"
    name: str
    parent: "Node | None"
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: bytes | None = None                  # a symlink's
    children: dict[str, "Node"] = field(default_factory=dict)
    model: str | None = None                     # a model's root directory: the model's name
    file_id: int | None = None                   # the stored version of a file
    size: int = 0                                # of a file with no FileData
    data: FileData | None = None                 # a file that is open or has uncommitted bytes
    opens: int = 0
    lookups: int = 0
    linked: bool = True
    xattrs: dict[bytes, bytes] = field(default_factory=dict)

    def meta(self) -> EntryMeta:
        return EntryMeta(self.kind, self.mode, self.uid, self.gid, self.atime_ns, self.mtime_ns, self.ctime_ns,
                         self.target)

    def touch(self, now: int) -> None:
        """A directory's entries changed."""
        self.mtime_ns = self.ctime_ns = now

    def apply_meta(self, meta: EntryMeta) -> None:
        self.mode, self.uid, self.gid = meta.mode, meta.uid, meta.gid
        self.atime_ns, self.mtime_ns, self.ctime_ns = meta.atime_ns, meta.mtime_ns, meta.ctime_ns
        if self.kind == "symlink":
            self.target = meta.target

    @property
    def current_size(self) -> int:
        if self.kind == "symlink":
            return len(self.target or b"")
        return self.data.size if self.data is not None else self.size

    @property
    def uncommitted(self) -> bool:
        """Bytes written since the stored version, of a file still in the tree."""
        return self.data is not None and self.data.dirty and self.linked

    def attributes(self) -> Attributes:
        nlink = 0 if not self.linked else (
            2 + sum(1 for c in self.children.values() if c.kind == "dir") if self.kind == "dir" else 1)
        return Attributes(self.inode, TYPE_BITS[self.kind] | self.mode, nlink, self.uid, self.gid,
                          self.current_size, self.atime_ns, self.mtime_ns, self.ctime_ns)


@dataclass(frozen=True)
class StatFs:
    block_size: int
    blocks: int
    blocks_free: int
    files: int
    name_max: int = NAME_MAX
