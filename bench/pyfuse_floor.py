"""The floor of a pyfuse3 + trio file system on this host: an in-memory file system whose handlers
do next to nothing (a dict updated, no spool, no catalog, nothing durable), mounted with the
writable mount's options (default_permissions), so that the everyday rows can show what any
daemon built on pyfuse3 and trio (as lmzfs's is) costs per request here, beside ext4 and the
writable mount. Not a file system to keep anything in: the bench only times programs in it.

Run by the project's Python (it needs pyfuse3 and trio):  pyfuse_floor.py MOUNTPOINT
It serves until unmounted (fusermount3 -u MOUNTPOINT).
"""
from __future__ import annotations

import errno
import stat
import sys
import time

import pyfuse3
import trio

TIMEOUT = 1.0                   # entry and attribute timeouts, as the writable mount's


class Node:
    __slots__ = ("inode", "mode", "uid", "gid", "data", "children", "target", "atime_ns", "mtime_ns", "ctime_ns")

    def __init__(self, inode: int, mode: int, uid: int, gid: int):
        self.inode, self.mode, self.uid, self.gid = inode, mode, uid, gid
        self.data, self.children, self.target = bytearray(), {}, b""
        self.atime_ns = self.mtime_ns = self.ctime_ns = time.time_ns()


class FloorFS(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self):
        super().__init__()
        self.nodes = {pyfuse3.ROOT_INODE: Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, 0, 0)}
        self.next_inode = pyfuse3.ROOT_INODE + 1

    def _new(self, parent: int, name: bytes, mode: int, ctx) -> Node:
        node = Node(self.next_inode, mode, ctx.uid, ctx.gid)
        self.next_inode += 1
        self.nodes[node.inode] = node
        self.nodes[parent].children[name] = node.inode
        return node

    def _entry(self, n: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino, a.st_mode, a.st_uid, a.st_gid = n.inode, n.mode, n.uid, n.gid
        a.st_nlink = 2 if stat.S_ISDIR(n.mode) else 1
        a.st_size = len(n.target) if stat.S_ISLNK(n.mode) else len(n.data)
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = n.atime_ns, n.mtime_ns, n.ctime_ns
        a.st_blksize, a.st_blocks = 4096, (a.st_size + 511) // 512
        a.entry_timeout = a.attr_timeout = TIMEOUT
        return a

    def _child(self, parent: int, name: bytes) -> Node:
        inode = self.nodes[parent].children.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.nodes[inode]

    async def lookup(self, parent_inode, name, ctx=None):
        return self._entry(self._child(parent_inode, name))

    async def getattr(self, inode, ctx=None):
        return self._entry(self.nodes[inode])

    async def setattr(self, inode, attr, fields, fh, ctx):
        n = self.nodes[inode]
        if fields.update_mode:
            n.mode = stat.S_IFMT(n.mode) | stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            n.uid = attr.st_uid
        if fields.update_gid:
            n.gid = attr.st_gid
        if fields.update_size:
            del n.data[attr.st_size:]
            n.data.extend(bytes(attr.st_size - len(n.data)))
        if fields.update_atime:
            n.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            n.mtime_ns = attr.st_mtime_ns
        n.ctime_ns = time.time_ns()
        return self._entry(n)

    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._entry(self._new(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode), ctx))

    async def create(self, parent_inode, name, mode, flags, ctx):
        n = self._new(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode), ctx)
        return pyfuse3.FileInfo(fh=n.inode), self._entry(n)

    async def symlink(self, parent_inode, name, target, ctx):
        n = self._new(parent_inode, name, stat.S_IFLNK | 0o777, ctx)
        n.target = target
        return self._entry(n)

    async def readlink(self, inode, ctx):
        return self.nodes[inode].target

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh, off, size):
        return bytes(memoryview(self.nodes[fh].data)[off:off + size])     # one copy

    async def write(self, fh, off, buf):
        data = self.nodes[fh].data
        if len(data) < off:
            data.extend(bytes(off - len(data)))
        data[off:off + len(buf)] = buf
        return len(buf)

    async def release(self, fh):
        pass

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        inode = self.nodes[parent_inode_old].children.pop(name_old)
        self.nodes[parent_inode_new].children[name_new] = inode

    async def unlink(self, parent_inode, name, ctx):
        del self.nodes[parent_inode].children[name]

    async def rmdir(self, parent_inode, name, ctx):
        del self.nodes[parent_inode].children[name]

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        entries = sorted(self.nodes[fh].children.items())
        for i, (name, inode) in enumerate(entries[start_id:], start_id):
            if not pyfuse3.readdir_reply(token, name, self._entry(self.nodes[inode]), i + 1):
                break

    async def releasedir(self, fh):
        pass

    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 30
        s.f_files = s.f_ffree = s.f_favail = 1 << 20
        s.f_namemax = 255
        return s


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: pyfuse_floor.py MOUNTPOINT", file=sys.stderr)
        return 2
    pyfuse3.init(FloorFS(), argv[0], {"fsname=pyfuse3-floor", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
