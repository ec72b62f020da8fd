"""The FUSE request handlers: a thin, read-only adapter from pyfuse3 to the archive.

Everything here runs on the trio thread except ``FileReader.pread``, which runs in worker
threads (bounded by a CapacityLimiter) because decoding chunks is CPU and disk work, and the
archive's ``open``, which may wait as long (a remote store's pack header is fetched on the first
open of each pack). The other archive calls (generation, files, totals) are short and stay on
the trio thread; the archive reads its catalog under a lock of its own, so an open on a thread
never meets them half way. Opens and releases (which wait for the file's read-ahead in flight)
take trio's own thread limiter, not the decoders': they wait more than they compute.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import time
from dataclasses import dataclass

import pyfuse3
import trio

from lmzfs.daemon.handlers import MountLifecycle, OpenDirs, entry_attributes, fuse_errors, reply_entries
from lmzfs.daemon.readtrace import ReadTrace, counted
from lmzfs.daemon.tree import DirectoryTree, Removal
from lmzfs.fsmodel.nodes import Node
from lmzfs.hostresources import usable_cpus
from lmzfs.reader.api import CorruptChunk, FileEntry, StoreError

log = logging.getLogger(__name__)

BLOCK_SIZE = 4096                 # statfs block size
DIR_TIMEOUT = 1.0                 # short, so models added or removed show up within a second
FILE_TIMEOUT = 60.0               # a file inode's attributes never change (see tree.py)
FILE_ENTRY_TIMEOUT = 10.0         # removals are also pushed to the kernel by invalidation
# a read of another open file this recently means someone else is reading: a lone miss then goes
# to a thread rather than hold up the event loop (LmzOperations._alone)
OTHER_READS_SECONDS = 0.05
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

XATTR_SHA256 = b"user.lmz.sha256"
XATTR_STORED_BYTES = b"user.lmz.stored_bytes"
XATTR_CODEC = b"user.lmz.codec"
XATTRS = (XATTR_SHA256, XATTR_STORED_BYTES, XATTR_CODEC)


# A chunk that fails its check has been logged by the reader, naming the chunk and the file; a
# name over 255 bytes is the caller's mistake, not the mount's.
_fuse_errors = fuse_errors(logs=lambda exc: not isinstance(exc, CorruptChunk) and exc.errno != errno.ENAMETOOLONG)


def _read_only(handler):
    @functools.wraps(handler)
    async def refuse(*args, **kwargs):
        raise pyfuse3.FUSEError(errno.EROFS)
    return refuse


@dataclass
class _OpenFile:
    entry: FileEntry | None        # None for the daemon's own /.lmzfs files
    reader: object                 # a FileReader


class _BytesReader:
    """A reader over bytes the daemon generated (the /.lmzfs files)."""

    def __init__(self, data: bytes):
        self.size = len(data)
        self._data = data

    def pread(self, offset: int, length: int) -> bytes:
        return self._data[offset:offset + length]

    def pread_nowait(self, offset: int, length: int, *, idle: bool = False) -> bytes:
        return self.pread(offset, length)

    def close(self) -> None:
        pass


@dataclass
class _OpenDir:
    inode: int
    entries: list[tuple[bytes, Node]]    # snapshot, so offsets stay valid across refreshes


class LmzOperations(MountLifecycle, pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, archive, *, workers: int | None = None):
        super().__init__()
        self._archive = archive
        self._uid, self._gid = os.getuid(), os.getgid()
        self._tree = DirectoryTree(self._uid, self._gid)
        self._limiter = trio.CapacityLimiter(workers or usable_cpus())
        self._files: dict[int, _OpenFile] = {}
        self._dirs = OpenDirs()                 # of _OpenDir
        self._next_fh = 1
        self._totals = None                 # (generation, StoreTotals)
        self._counters = {"reads_inline": 0, "reads_threaded": 0}
        self._recent_reads: dict[int, float] = {}   # fh -> monotonic time of its latest read, if recent
        self._refresh_failure: str | None = None     # the latest refresh's error, logged once
        self._trace = ReadTrace.from_environment()  # LMZ_TRACE_READS: a line per read (readtrace.py)
        self._refresh()

    @property
    def tree(self) -> DirectoryTree:
        return self._tree

    # -- keeping the tree current ---------------------------------------------------------------

    def _refresh(self) -> None:
        try:
            removals = self._tree.refresh(self._archive)
        except StoreError as exc:
            # Keep serving the tree we have; the next request or tick tries again (said once).
            if str(exc) != self._refresh_failure:
                self._refresh_failure = str(exc)
                log.error("could not refresh the model list, serving the one it had: %s", exc)
            return
        except Exception:
            log.exception("could not refresh the model list")
            return
        self._refresh_failure = None
        if removals:
            self._invalidate(removals)

    def _invalidate(self, removals: list[Removal]) -> None:
        for removal in removals:
            log.info("removed from the store: %s", removal.name)
            if not self._mounted or self._tree.lookup_count(removal.inode) == 0:
                continue       # the kernel holds no dentry for it: nothing to invalidate
            # Files are also marked deleted (nlink 0). Directories are only dropped from the
            # dentry cache: marking a directory deleted fails while something inside is open.
            deleted = 0 if removal.is_dir else removal.inode
            pyfuse3.invalidate_entry_async(removal.parent, os.fsencode(removal.name),
                                           deleted=deleted, ignore_enoent=True)

    async def refresh_periodically(self, interval: float = 1.0) -> None:
        """Background task: pick up models added or removed while nobody is looking."""
        while True:
            await trio.sleep(interval)
            self._refresh()

    # -- attributes -------------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        node = self._tree.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        timeouts = (FILE_ENTRY_TIMEOUT, FILE_TIMEOUT) if node.kind == "file" else (DIR_TIMEOUT, DIR_TIMEOUT)
        return entry_attributes(node.attributes(), *timeouts)

    @_fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        self._refresh()
        node = self._tree.lookup(parent_inode, os.fsdecode(name))
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)    # not cached, so a new model shows at once
        self._tree.remember(node)
        return self._attributes(node)

    async def forget(self, inode_list):
        for inode, count in inode_list:
            self._tree.forget(inode, count)

    @_fuse_errors
    async def getattr(self, inode, ctx=None):
        node = self._node(inode)
        if node.kind == "dir":
            self._refresh()
            node = self._node(inode)
        return self._attributes(node)

    @_fuse_errors
    async def readlink(self, inode, ctx=None):
        node = self._node(inode)
        if node.kind != "symlink":
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.target

    # -- directories ----------------------------------------------------------------------------

    def _snapshot(self, inode: int) -> list[tuple[bytes, Node]]:
        return [(os.fsencode(child.name), child) for child in self._tree.children(inode)]

    @_fuse_errors
    async def opendir(self, inode, ctx=None):
        self._refresh()
        if self._node(inode).kind != "dir":
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return self._dirs.open(_OpenDir(inode, self._snapshot(inode)))

    @_fuse_errors
    async def readdir(self, fh, start_id, token):
        handle = self._dirs[fh]
        if start_id == 0:               # a fresh listing (or rewinddir): take a new snapshot
            self._refresh()
            handle.entries = self._snapshot(handle.inode)
        reply_entries(token, handle.entries, start_id, self._attributes, self._tree.remember)

    @_fuse_errors
    async def releasedir(self, fh):
        self._dirs.release(fh)

    # -- files ----------------------------------------------------------------------------------

    def _new_fh(self) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        return fh

    @_fuse_errors
    async def open(self, inode, flags, ctx=None):
        await self.opens_allowed()
        if flags & WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self._node(inode)
        if node.kind == "dir":
            raise pyfuse3.FUSEError(errno.EISDIR)
        served = self._tree.served(node)
        if served.data is not None:      # a ref of the /.hf view: fixed bytes
            fh = self._new_fh()
            self._files[fh] = _OpenFile(None, _BytesReader(served.data))
            return pyfuse3.FileInfo(fh=fh, direct_io=True)
        if served.virtual is not None:
            fh = self._new_fh()
            self._files[fh] = _OpenFile(None, _BytesReader(self._virtual_content(served.virtual)))
            return pyfuse3.FileInfo(fh=fh, direct_io=True)    # generated anew at each open
        # The handle holds its own reader, so the file keeps working if its model is removed.
        # Opening may wait (the catalog's rows; a remote store's pack header, fetched on the first
        # open of each pack): on a thread, so that the other requests are answered meanwhile.
        try:
            reader = await trio.to_thread.run_sync(self._archive.open, served.entry)
        except FileNotFoundError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None   # its model was removed meanwhile
        fh = self._new_fh()
        self._files[fh] = _OpenFile(served.entry, reader)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_fuse_errors
    async def read(self, fh, off, size):
        handle = self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        # What is decoded already, or cheap to decode, is served right here: a thread hop costs
        # more. So is a lone read's miss while nothing else is being read (see _alone).
        if self._trace is not None and handle.entry is not None:
            return await self._traced_read(fh, handle, off, size)
        try:
            data = handle.reader.pread_nowait(off, size, idle=self._alone(fh))
            if data is not None:
                self._counters["reads_inline"] += 1
                return data
            self._counters["reads_threaded"] += 1
            return await trio.to_thread.run_sync(handle.reader.pread, off, size, limiter=self._limiter)
        except CorruptChunk as exc:
            entry = handle.entry
            log.error("corrupt data in model %s file %s, read at offset %d length %d: %s",
                      entry.model, entry.path, off, size, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    async def _traced_read(self, fh: int, handle: _OpenFile, off: int, size: int) -> bytes:
        """read() as it is without a trace, with a line in the trace for the request."""
        arrived = self._trace.now()
        try:
            nowait = functools.partial(handle.reader.pread_nowait, idle=self._alone(fh))
            data, decoded, waits = counted(nowait, off, size)
            how = "inline"
            if data is None:
                how = "thread"
                data, decoded2, waits2 = await trio.to_thread.run_sync(counted, handle.reader.pread, off, size,
                                                                       limiter=self._limiter)
                decoded, waits = decoded + decoded2, waits + waits2
        except CorruptChunk as exc:
            entry = handle.entry
            log.error("corrupt data in model %s file %s, read at offset %d length %d: %s",
                      entry.model, entry.path, off, size, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        self._counters["reads_inline" if how == "inline" else "reads_threaded"] += 1
        self._trace.record(arrived, fh, f"{handle.entry.model}/{handle.entry.path}", off, size, len(data), how,
                           decoded, waits)
        return data

    def _alone(self, fh: int) -> bool:
        """Whether a read of fh is the only reading going on: no read waits in a thread, no other
        open file was read in the last OTHER_READS_SECONDS and no sequential stream is active.
        A lone miss is then decoded on the event loop rather than handed to a thread and back
        (two wake-ups of a sleeping thread, a sizeable part of a miss: docs/results.md), as
        nobody else's read can be held up meanwhile; with other readers about, the thread keeps
        the loop free for them."""
        now = time.monotonic()
        recent = self._recent_reads
        recent[fh] = now
        if len(recent) > 1:
            for other, at in list(recent.items()):
                if now - at >= OTHER_READS_SECONDS:
                    del recent[other]
        return len(recent) == 1 and not self._limiter.borrowed_tokens and not self._archive.streaming()

    # No flush handler: nothing is ever buffered for writing. pyfuse3 answers ENOSYS, and the
    # kernel then sends no FLUSH again for this mount (one request fewer per close).

    @_fuse_errors
    async def release(self, fh):
        handle = self._files.pop(fh, None)
        self._recent_reads.pop(fh, None)
        if handle is not None:
            # closing waits for the file's read-ahead running now (a decode; with a remote store,
            # perhaps a fetch): on a thread, so that the other requests are answered meanwhile
            await trio.to_thread.run_sync(handle.reader.close)

    def _virtual_content(self, kind: str) -> bytes:
        if kind != "stats":
            raise pyfuse3.FUSEError(errno.ENOENT)
        snapshot = getattr(self._archive, "stats_snapshot", None)
        doc = {"version": 1, "pid": os.getpid(), "open_files": len(self._files),
               "daemon": dict(self._counters), **(snapshot() if snapshot else {})}
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    def close_all(self) -> None:
        """Close every open reader and the archive; called once the main loop has ended."""
        for handle in self._files.values():
            try:
                handle.reader.close()
            except Exception:
                log.exception("closing a reader of %s", handle.entry or "a /.lmzfs file")
        self._files.clear()
        self._dirs.clear()
        self._archive.close()
        if self._trace is not None:
            self._trace.close()

    # -- extended attributes --------------------------------------------------------------------

    @_fuse_errors
    async def getxattr(self, inode, name, ctx=None):
        entry = self._stored_entry(inode)
        if entry is not None:
            if name == XATTR_SHA256:
                return entry.sha256.encode()
            if name == XATTR_STORED_BYTES:
                return str(entry.stored_bytes).encode()
            if name == XATTR_CODEC:
                return entry.codecs.encode()
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @_fuse_errors
    async def listxattr(self, inode, ctx=None):
        return list(XATTRS) if self._stored_entry(inode) is not None else []

    def _stored_entry(self, inode: int) -> FileEntry | None:
        """The stored file an inode serves, if it serves one."""
        served = self._tree.served(self._node(inode))
        return None if served is None else served.entry

    # -- the file system as a whole -------------------------------------------------------------

    @_fuse_errors
    async def statfs(self, ctx=None):
        generation = self._archive.generation()
        if self._totals is None or self._totals[0] != generation:
            self._totals = (generation, self._archive.totals())
        totals = self._totals[1]
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = BLOCK_SIZE
        data.f_blocks = (totals.logical_bytes + BLOCK_SIZE - 1) // BLOCK_SIZE
        data.f_bfree = data.f_bavail = 0           # read-only: nothing can be written
        data.f_files = totals.files
        data.f_ffree = data.f_favail = 0
        data.f_namemax = 255
        return data


# Everything that would change something answers EROFS.
for _op in ("setattr", "write", "create", "mknod", "mkdir", "unlink", "rmdir", "rename", "link", "symlink",
            "setxattr", "removexattr"):
    setattr(LmzOperations, _op, _read_only(getattr(pyfuse3.Operations, _op)))
del _op
