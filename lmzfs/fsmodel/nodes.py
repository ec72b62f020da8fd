"""What the writable file system is made of (a Node per inode) and what its calls return: the
types every part of lmzfs/fsmodel shares, and the OSError they all raise."""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field, replace

from lmzfs.fsmodel.filedata import FileData
from lmzfs.fsmodel.holes import Holes, blocks, data_bytes
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
    blocks: int = 0           # st_blocks: 512-byte units of data (a sparse file's holes take none)


class Children(dict):
    """A directory's entries by name, counting those that are directories as they come and go, so
    that a directory's link count (2 + its subdirectories) costs nothing to give: the kernel asks
    for the attributes of a directory after every entry made in it. An entry's kind never changes."""
    __slots__ = ("dirs",)

    def __init__(self):
        super().__init__()
        self.dirs = 0

    def __setitem__(self, name: str, node: "Node") -> None:
        old = dict.get(self, name)
        if old is not None and old.kind == "dir":
            self.dirs -= 1
        dict.__setitem__(self, name, node)
        if node.kind == "dir":
            self.dirs += 1

    def __delitem__(self, name: str) -> None:
        node = dict.pop(self, name)
        if node.kind == "dir":
            self.dirs -= 1

    def pop(self, name: str, *default):
        if name not in self:
            return dict.pop(self, name, *default)
        node = self[name]
        del self[name]
        return node

    def _refused(self, *args, **kwargs):
        raise TypeError("a directory's entries change one at a time (Children counts its directories)")

    update = setdefault = popitem = clear = __ior__ = _refused


@dataclass(eq=False, slots=True)
class Node:
    inode: int
    name: str
    parent: "Node | None"
    entry: EntryMeta                             # its kind, owner, mode and times (fs_entries' row)
    children: Children = field(default_factory=Children)
    model: str | None = None                     # a model's root directory: the model's name
    file_id: int | None = None                   # the stored version of a file
    size: int = 0                                # of a file with no FileData
    holes: Holes = ()                            # of the stored version (fsmodel/holes.py)
    data: FileData | None = None                 # a file that is open or has uncommitted bytes
    opens: int = 0
    lookups: int = 0
    linked: bool = True
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    renamed_or_set_ns: int = 0                   # when a rename, chmod, chown or utimes last changed it (time_ns)

    @property
    def kind(self) -> str:
        """"dir", "file" or "symlink"."""
        return self.entry.kind

    @property
    def target(self) -> bytes | None:
        """A symlink's."""
        return self.entry.target

    def meta(self) -> EntryMeta:
        return self.entry

    def change(self, **fields) -> None:
        """Some of its metadata changed (chmod, utimes, a write's mtime...)."""
        self.entry = replace(self.entry, **fields)

    def touch(self, now: int) -> None:
        """Its content changed: a directory's entries, a file's bytes."""
        self.change(mtime_ns=now, ctime_ns=now)

    def apply_meta(self, meta: EntryMeta) -> None:
        """Take a recorded entry's metadata; the kind stays, and the target of all but a symlink."""
        self.entry = replace(meta, kind=self.kind, target=meta.target if self.kind == "symlink" else self.target)

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
            2 + self.children.dirs if self.kind == "dir" else 1)
        e = self.entry
        size = self.current_size
        return Attributes(self.inode, TYPE_BITS[e.kind] | e.mode, nlink, e.uid, e.gid, size,
                          e.atime_ns, e.mtime_ns, e.ctime_ns,
                          blocks(self.data_bytes() if e.kind == "file" else size))

    def data_bytes(self) -> int:
        """Bytes of a file that hold data (its holes left out)."""
        data = self.data
        if data is None:
            return data_bytes(self.size, self.size, self.holes)
        return data_bytes(data.size, data.base_len, self.holes, data.ranges)


@dataclass(frozen=True)
class StatFs:
    block_size: int
    blocks: int
    blocks_free: int          # free on the store's file system
    blocks_available: int     # of those, what an unprivileged writer may use
    files: int
    name_max: int = NAME_MAX
