"""Open files of a writable mount: handles, and the data (FileData: the stored version with the
spool in front) a file has while it is open or holds uncommitted bytes.

A file's bytes are written to its spool file; each write or truncate appends to its journal, so
that what write() accepted survives a kill of the daemon, and fsync makes it durable against a
power loss too (records.py). A close of a descriptor (flush: one of several a handle may have,
after dup(2) or fork(2), or in a child that execs with close-on-exec descriptors) waits for
nothing. The release of a handle (its last descriptor closed) that changed the file commits it,
and so does the file's last release, which then lets its data go.
"""
from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass

from lmzfs.fsmodel.commit import Committer
from lmzfs.fsmodel.filedata import FileData
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import Attributes, Node, found, fs_error
from lmzfs.fsmodel.nowait import WouldBlock, may_wait
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.store.catalog.fsrows import EntryMeta


@dataclass
class Handle:
    node: Node
    append: bool
    writable: bool
    changed: bool = False       # the file changed through this handle: its release commits it


class Handles:
    def __init__(self, ns: Namespace, stored: StoredFiles, records: SpoolRecords, committer: Committer):
        self._ns, self._stored, self._records, self._committer = ns, stored, records, committer
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self.last_read = 0.0            # when a file was last read (monotonic): the idle recode waits

    def create(self, parent: int, name: str, mode: int, uid: int, gid: int, flags: int) -> tuple[int, Attributes]:
        ns = self._ns
        ns.check_name(name)
        with ns.lock:
            directory = ns.dir(parent)
            ns.in_model(directory)
            existing = directory.children.get(name)
            if existing is not None and not may_wait():
                raise WouldBlock                      # opening an existing file may wait (O_TRUNC)
            if existing is not None:
                if flags & os.O_EXCL:
                    raise fs_error(errno.EEXIST)
                node = existing
                node.lookups += 1
            else:
                now = time.time_ns()
                meta = EntryMeta("file", stat.S_IMODE(mode), uid, gid, now, now, now)
                node = ns.new_node("file", name, directory, meta)
                node.data = self._records.new_data(node, None, 0)
                node.data.dirty = True                # a new file is committed even if empty
                directory.children[name] = node
                directory.touch(now)
                node.lookups += 1
        if existing is None:
            with node.data.lock:                      # its record: the new name survives a kill
                node.data.ensure_spool_file()
            # a new file has nothing to truncate: without O_TRUNC (which open(2) of mode "w" or a
            # shell's ">" passes) its open never waits, so the create is answered where it ran
            flags &= ~os.O_TRUNC
        fh = self.open(node.inode, flags & ~os.O_CREAT & ~os.O_EXCL)
        return fh, ns.getattr(node.inode)

    def open(self, inode: int, flags: int) -> int:
        node = self._ns.node(inode)
        if node.kind == "dir":
            raise fs_error(errno.EISDIR)
        if node.kind != "file":
            raise fs_error(errno.ELOOP)
        if not may_wait() and (node.data is None or flags & os.O_TRUNC):
            raise WouldBlock        # reading the stored version's extents, or a truncate, may wait
        data = self._data(node)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        changed = writable and data.dirty and node.file_id is None       # a new file: committed even if empty
        if flags & os.O_TRUNC and writable and data.size:
            data.truncate(0)
            node.touch(time.time_ns())
            changed = True
        with self._ns.lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = Handle(node, bool(flags & os.O_APPEND), writable, changed)
            return fh

    def _handle(self, fh: int) -> Handle:
        return found(self._handles.get(fh), errno.EBADF)

    def read(self, fh: int, offset: int, length: int) -> bytes:
        handle = self._handle(fh)
        self.last_read = time.monotonic()
        return handle.node.data.read(offset, length)

    def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self._handle(fh)
        if not handle.writable:
            raise fs_error(errno.EBADF)
        node = handle.node
        with node.data.lock:
            if handle.append:
                offset = node.data.size
            n = node.data.write(offset, data)
        handle.changed = True
        node.touch(time.time_ns())
        return n

    def try_write(self, fh: int, offset: int, data: bytes) -> int | None:
        """write(), unless the file is being committed (then None: nothing was written)."""
        lock = self._handle(fh).node.data.lock
        if not lock.acquire(blocking=False):
            return None
        try:
            return self.write(fh, offset, data)
        finally:
            lock.release()

    def release(self, fh: int) -> None:
        """The handle's last descriptor is closed: what changed through it is committed (a commit
        that fails is logged and its bytes stay in the spool, to be committed later). On the
        event loop (fsmodel/nowait.py) only where commits run in the background (then it queues one)."""
        if not self._committer.background and not may_wait():
            raise WouldBlock
        with self._ns.lock:
            handle = self._handles.pop(fh, None)
        if handle is not None:
            self._release_data(handle.node, commit=handle.changed)

    def fsync(self, fh: int) -> None:
        """The file's bytes and metadata are durable when this returns (in the spool or the store)."""
        node = self._handle(fh).node
        with node.data.lock:
            if node.data.dirty and node.linked:
                self._records.record(node)

    def resize(self, node: Node, size: int, fh: int | None, now: int) -> None:
        """A truncate (setattr's size); `fh`: the handle it came through (ftruncate), whose release
        commits it."""
        if fh is not None and fh in self._handles:
            self._handles[fh].changed = True
        if node.kind != "file":
            raise fs_error(errno.EISDIR if node.kind == "dir" else errno.EINVAL)
        data = self._data(node)
        try:
            if size != data.size:
                data.truncate(size)
                node.change(mtime_ns=now)
        finally:
            self._release_data(node)

    def _data(self, node: Node) -> FileData:
        """The node's FileData, made if need be, held (one open) until _release_data."""
        with self._ns.lock:
            node.opens += 1
            if node.data is not None:
                return node.data
        try:
            base = self._stored.reader(node.file_id)
        except BaseException:
            with self._ns.lock:
                node.opens -= 1
            raise
        with self._ns.lock:
            if node.data is None:
                node.data = self._records.new_data(node, base, node.size)
            elif base is not None:
                base.close()
            return node.data

    def _release_data(self, node: Node, *, commit: bool = False) -> None:
        """One open of the node's data ends; the last (or one that `commit`s) commits what is
        uncommitted."""
        ns = self._ns
        with ns.lock:
            node.opens -= 1
            last = node.opens == 0
        if (last or commit) and node.uncommitted:
            self._committer.commit_soon(node)       # queued, in a mount's background
        if not last:
            return
        with ns.lock:
            # an unlinked file's bytes go with its last close; a commit that failed keeps them
            if node.opens == 0 and node.data is not None and (not node.data.dirty or not node.linked):
                ns.close_later(node)
            ns.maybe_drop(node)
        ns.close_deferred()
