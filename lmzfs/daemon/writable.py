"""The FUSE request handlers of `lmz mount --writable`: a thin adapter from pyfuse3 to the
writable file system model (lmzfs/fsmodel/filesystem.py), where everything the calls mean lives.

Queries of the in-memory namespace (lookup, getattr, readdir, readlink, xattrs) are answered on
the trio thread. Everything that may wait (a catalog transaction under the store's WriterLock,
reading stored chunks, a commit that chunks and encodes a file) runs in a worker thread under a
CapacityLimiter; a write runs on the loop when its file is not being committed, as it only
appends to the spool. Refused: hard links (EPERM), device files, FIFOs and sockets (EPERM),
RENAME_EXCHANGE (EINVAL), fallocate (the kernel answers EOPNOTSUPP: no handler), and files or
symlinks at the top level, where only models (directories) live (EPERM).
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat

import pyfuse3
import trio

from lmzfs.daemon.handlers import MountLifecycle, OpenDirs, entry_attributes, fuse_errors, reply_entries
from lmzfs.fsmodel.filesystem import NAME_MAX, Attributes, Filesystem
from lmzfs.fsmodel.nowait import WouldBlock, must_not_wait
from lmzfs.hostresources import usable_cpus
from lmzfs.store.layout import StoreError

log = logging.getLogger(__name__)

ENTRY_TIMEOUT = 1.0             # short: `lmz add` and `lmz rm` change the tree from outside
ATTR_TIMEOUT = 1.0
IDLE_COMMIT_SECONDS = 5.0       # a file written to and then left alone this long is committed
TICK_SECONDS = 1.0
FREE_INODES = 1 << 20           # statfs: inodes are not counted on the store's file system
CATALOG_COPY_TICKS = 5          # the catalog's copy (for `lmz verify --repair`) follows within this many ticks


# What a writer does wrong (ENOENT, EEXIST, ENOTEMPTY ...) is the writer's to hear, not the log's.
_fuse_errors = fuse_errors(logs=lambda exc: False)


def _name(raw: bytes) -> str:
    if len(raw) > NAME_MAX:                     # before any lookup: ENAMETOOLONG, never ENOENT
        raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise pyfuse3.FUSEError(errno.EILSEQ) from None


class WritableOperations(MountLifecycle, pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: Filesystem, *, workers: int | None = None):
        super().__init__()
        self.fs = fs
        self._limiter = trio.CapacityLimiter(workers or usable_cpus())
        self._dirs = OpenDirs()                 # of [(name, Attributes)]

    # -- what mount.py's loop asks of any operations object ---------------------------------------
    @property
    def tree(self) -> Filesystem:
        return self.fs          # what the mount's log line counts

    async def refresh_periodically(self, interval: float = TICK_SECONDS) -> None:
        """Follow other processes' changes, commit files left idle, reclaim dead pack bytes."""
        ticks = 0
        while True:
            await trio.sleep(interval)
            ticks += 1
            try:
                await trio.to_thread.run_sync(self.fs.refresh, limiter=self._limiter)
                await trio.to_thread.run_sync(self.fs.commit_idle, IDLE_COMMIT_SECONDS, limiter=self._limiter)
                await trio.to_thread.run_sync(self.fs.reclaim, limiter=self._limiter)
                if ticks % CATALOG_COPY_TICKS == 0:
                    await trio.to_thread.run_sync(self.fs.write_catalog_copy, limiter=self._limiter)
            except (OSError, StoreError) as exc:
                log.error("background commit: %s", exc)

    def close_all(self) -> None:
        self.fs.close()

    async def _thread(self, call, *args):
        return await trio.to_thread.run_sync(functools.partial(call, *args), limiter=self._limiter)

    async def _here(self, call, *args):
        """The call on the event loop (no hop to a worker thread), unless a lock it needs is held
        (fsmodel/nowait.py): then, nothing changed, in a worker thread, where it may wait."""
        try:
            with must_not_wait():
                return call(*args)
        except WouldBlock:
            return await self._thread(call, *args)

    # -- attributes ------------------------------------------------------------------------------
    @staticmethod
    def _entry(a: Attributes) -> pyfuse3.EntryAttributes:
        return entry_attributes(a, ENTRY_TIMEOUT, ATTR_TIMEOUT)

    @_fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        return self._entry(self.fs.lookup(parent_inode, _name(name)))

    async def forget(self, inode_list):
        for inode, count in inode_list:
            self.fs.forget(inode, count)

    @_fuse_errors
    async def getattr(self, inode, ctx=None):
        return self._entry(self.fs.getattr(inode))

    @_fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        changes = {}
        if fields.update_mode:
            changes["mode"] = attr.st_mode
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_size:
            changes["size"] = attr.st_size
            if fh is not None:
                changes["fh"] = fh
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        call = functools.partial(self.fs.setattr, inode, **changes)
        # a size change may wait for the file's commit; chmod, chown and utimes seldom wait
        return self._entry(await (self._thread(call) if "size" in changes else self._here(call)))

    # -- the namespace ---------------------------------------------------------------------------
    @_fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._entry(await self._here(self.fs.mkdir, parent_inode, _name(name), mode, ctx.uid, ctx.gid))

    @_fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        await self._here(self.fs.rmdir, parent_inode, _name(name))

    @_fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        await self._here(self.fs.unlink, parent_inode, _name(name))

    @_fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        await self._here(self.fs.rename, parent_inode_old, _name(name_old), parent_inode_new,
                           _name(name_new), flags)

    @_fuse_errors
    async def symlink(self, parent_inode, name, target, ctx):
        return self._entry(await self._here(self.fs.symlink, parent_inode, _name(name), target,
                                              ctx.uid, ctx.gid))

    @_fuse_errors
    async def readlink(self, inode, ctx):
        return self.fs.readlink(inode)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)        # hard links are not supported (docs/writable.md)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)        # regular files, directories and symlinks only

    # -- directories -----------------------------------------------------------------------------
    @_fuse_errors
    async def opendir(self, inode, ctx):
        entries = [(os.fsencode(name), attrs) for name, attrs in self.fs.readdir(inode, dots=True)]
        return self._dirs.open(entries)

    @_fuse_errors
    async def readdir(self, fh, start_id, token):
        # readdirplus hands the kernel a reference (not for the dot entries: the kernel skips them)
        reply_entries(token, self._dirs[fh], start_id, self._entry, lambda attrs: self.fs.remember(attrs.inode))

    async def releasedir(self, fh):
        self._dirs.release(fh)

    @_fuse_errors
    async def fsyncdir(self, fh, datasync):
        await self._thread(self.fs.sync)             # the catalog's WAL: every change so far

    # -- files -----------------------------------------------------------------------------------
    @_fuse_errors
    async def open(self, inode, flags, ctx):
        await self.opens_allowed()
        fh = await self._here(self.fs.open, inode, flags)      # in a thread if it may wait
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)

    @_fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        await self.opens_allowed()
        if not stat.S_ISREG(mode) and stat.S_IFMT(mode):
            raise pyfuse3.FUSEError(errno.EPERM)
        fh, attrs = await self._here(self.fs.create, parent_inode, _name(name), mode, ctx.uid, ctx.gid, flags)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False), self._entry(attrs)

    @_fuse_errors
    async def read(self, fh, off, size):
        return await self._thread(self.fs.read, fh, off, size)

    @_fuse_errors
    async def write(self, fh, off, buf):
        written = self.fs.try_write(fh, off, buf)
        if written is None:                          # the file is being committed: wait in a thread
            written = await self._thread(self.fs.write, fh, off, buf)
        return written

    # No flush handler: close(2) of a descriptor (of a dup, or in a child that execs with
    # close-on-exec descriptors, as of the last) has nothing to wait for, since writes go to the
    # spool as they come and the release (below) commits. pyfuse3 answers ENOSYS, and the kernel
    # then sends no FLUSH again for this mount: two requests fewer for every file rsync writes.

    @_fuse_errors
    async def release(self, fh):
        # the kernel does not wait for this reply; with background commits it only queues a commit
        await self._here(self.fs.release, fh)

    @_fuse_errors
    async def fsync(self, fh, datasync):
        await self._thread(self.fs.fsync, fh)

    # -- extended attributes ---------------------------------------------------------------------
    @_fuse_errors
    async def getxattr(self, inode, name, ctx):
        return self.fs.getxattr(inode, name)

    @_fuse_errors
    async def listxattr(self, inode, ctx):
        return self.fs.listxattr(inode)

    @_fuse_errors
    async def setxattr(self, inode, name, value, ctx):
        await self._thread(self.fs.setxattr, inode, name, value)

    @_fuse_errors
    async def removexattr(self, inode, name, ctx):
        await self._thread(self.fs.removexattr, inode, name)

    # -- the file system as a whole --------------------------------------------------------------
    @_fuse_errors
    async def statfs(self, ctx):
        s = self.fs.statfs()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = s.block_size
        data.f_blocks = s.blocks
        data.f_bfree = s.blocks_free
        data.f_bavail = s.blocks_available
        data.f_ffree = data.f_favail = FREE_INODES
        data.f_files = s.files + FREE_INODES        # used: the inodes this mount knows
        data.f_namemax = s.name_max
        return data
