"""A writable file system over a store, with no FUSE in it: what `lmz mount --writable` serves,
and what tests drive directly.

The namespace lives in memory, loaded from the catalog (models, files, and the writable-mount
tables of store/catalog/fsrows.py) and kept in step with it:

- The root holds models (directories); a directory that is no model's root and holds none
  (`run1` above `run1/step-1000`) is a plain name in the tree. mkdir there creates a model, rmdir
  of an empty model removes it as `lmz rm` does; files, symlinks and other entries live inside
  models only (EPERM at the root).
- Every change of the namespace or of metadata (mkdir, rmdir, unlink, rename, symlink, chmod,
  chown, utimes, xattrs) is one catalog transaction under the store's WriterLock before the
  call returns: durable when it returns.
- A file's bytes are written to the spool (fsmodel/spool.py) and committed to the store
  (fsmodel/storecommit.py, the `lmz add` machinery) at the release of a handle that changed it
  (its last descriptor closed; close(2) does not wait for it), on commit_idle(), and at
  unmount. A file's spool record is written (without fsync) when it gets its spool file and
  when it is renamed, and each write or truncate appends to its journal, so that what write()
  accepted survives a kill of the daemon; fsync makes it durable against a power loss too. A
  mount commits every spool record it finds (replay).

Errors are OSError with the errno the caller passes on (ENOENT, EEXIST, ENOTEMPTY, EXDEV...).
Thread-safe: in-memory state under one lock; changes to the store serialised by a second one
(and the store's WriterLock), so the event loop can answer lookups while a commit runs.

This class is the facade; the parts live beside it:

    namespace.py    the tree in memory: inodes, names, lookups, the rules of rename(2)
    reconcile.py    the tree loaded from the catalog, and kept in step with other processes
    catalogsync.py  one change to the store at a time, under the store's WriterLock
    entries.py      mkdir, rmdir, unlink, rename, symlink, chmod/chown/utimes, stored
    xattrs.py       user.* extended attributes
    handles.py      open files, their data and spool files
    records.py      spool records: what a replay needs to find spooled bytes a home
    commit.py       when and what is committed to the store
    reclaim.py      the dead bytes of replaced versions reclaimed while mounted
    recodetext.py   text chunks commits coded quickly, coded smaller once the mount is idle
    replay.py       the spool a previous mount left, committed at start-up
    stored.py       the stored versions of files, read through the store's chunk source
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from lmzfs.fsmodel.catalogsync import CatalogSync, open_catalog
from lmzfs.fsmodel.commit import Committer
from lmzfs.fsmodel.entries import Entries
from lmzfs.fsmodel.handles import Handles
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nowait import WouldBlock, may_wait
from lmzfs.fsmodel.nodes import (NAME_MAX, RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INODE, Attributes, Node,
                                 StatFs)
from lmzfs.fsmodel.reclaim import RECLAIM_FLOOR, Reclaimer
from lmzfs.fsmodel.recodetext import TextRecoder
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.replay import Replay
from lmzfs.fsmodel.spool import Spool
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.fsmodel.xattrs import XATTR_NAMESPACE, XATTR_VALUE_MAX, Xattrs
from lmzfs.store.gc import GcResult
from lmzfs.store.layout import StorePaths

DESCRIPTOR_WAIT_SECONDS = 10.0      # a create waits at most this long for commits to free descriptors
DESCRIPTOR_RECHECK_SECONDS = 0.05   # ... looking again this often whether commits are still on their way

__all__ = ["Attributes", "Filesystem", "NAME_MAX", "Node", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "ROOT_INODE",
           "StatFs", "XATTR_NAMESPACE", "XATTR_VALUE_MAX"]


class Filesystem:
    def __init__(self, store_dir: Path, *, cache_bytes: int = 64 << 20, workers: int | None = None,
                 uid: int | None = None, gid: int | None = None,
                 reclaim_floor: int = RECLAIM_FLOOR, background_commits: bool = False):
        """`workers`: threads that encode a commit (None: one per CPU this process may use);
        `reclaim_floor`: dead pack bytes below which reclaim() leaves them (fsmodel/reclaim.py);
        `background_commits`: a release queues its commit for a committer thread, which commits
        small files in groups (commit.py), rather than committing before it returns."""
        self.store = StorePaths(Path(store_dir))
        self.store.create()
        self.store.check_format()
        self.spool = Spool(self.store.root)
        self.spool.lock_for_mount()
        try:
            self.catalog = open_catalog(self.store)
        except BaseException:
            self.spool.unlock()
            raise
        self._stored = StoredFiles(self.store, cache_bytes)
        self.source = self._stored.source
        self._ns = Namespace(os.getuid() if uid is None else uid, os.getgid() if gid is None else gid)
        self.root = self._ns.root
        self._sync = CatalogSync(self.store, self.catalog, self._ns)
        self._records = SpoolRecords(self.spool, self._ns, self._stored)
        self._committer = Committer(self._sync, self._ns, self._stored, self._records, workers=workers,
                                    sizes=self.catalog.chunk_sizes())
        self._handles = Handles(self._ns, self._stored, self._records, self._committer)
        self._entries = Entries(self._sync, self._ns, self._records)
        self._xattrs = Xattrs(self._sync, self._ns)
        self._reclaimer = Reclaimer(self._sync, self._stored, floor=reclaim_floor)
        self._committer.after_commit = self.reclaim
        self._recoder = TextRecoder(self._sync, self._stored, last_read=lambda: self._handles.last_read)
        self._committer.on_text_chunks = self._recoder.add
        self._recoder.after_recode = self.reclaim
        # The calls made for nearly every request go straight to their part, as fast as before the
        # facade (the methods of the same names below say what they do, and serve type checkers).
        self.lookup, self.getattr = self._ns.lookup, self._ns.getattr
        self.remember, self.forget = self._ns.remember, self._ns.forget
        self.read = self._handles.read
        try:
            self.replayed = Replay(self.spool, self._sync, self._ns, self._stored, self._records,
                                   self._committer).run()
        except BaseException:
            self.close()            # what was replayed stays committed; the rest stays in the spool
            raise
        if background_commits:
            self._committer.start_background()
            self._recoder.start()

    # -- following the catalog -------------------------------------------------------------------
    def refresh(self) -> bool:
        """Follow changes another process committed (lmz add, rm, gc); True if there were any."""
        return self._sync.refresh()

    def write_catalog_copy(self) -> bool:
        """Copy the catalog beside it if one is due (the daemon: every few seconds); True if written."""
        return self._sync.write_catalog_copy()

    def generation(self) -> int:
        """Changes whenever another process commits to the catalog (what the service status follows)."""
        return self._sync.seen_version

    # -- queries ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Inodes known (in the tree, or unlinked but still open or known to the kernel)."""
        return len(self._ns)

    @staticmethod
    def attributes(node: Node) -> Attributes:
        return node.attributes()

    def model_count(self) -> int:
        return self._ns.model_count()

    def lookup(self, parent: int, name: str) -> Attributes:
        return self._ns.lookup(parent, name)

    def remember(self, inode: int) -> None:
        """The kernel got a reference other than by lookup (an entry of readdirplus)."""
        self._ns.remember(inode)

    def forget(self, inode: int, count: int) -> None:
        self._ns.forget(inode, count)

    def getattr(self, inode: int) -> Attributes:
        return self._ns.getattr(inode)

    def readdir(self, inode: int, *, dots: bool = False) -> list[tuple[str, Attributes]]:
        """The directory's entries by name; with `dots`, `.` and `..` first."""
        return self._ns.readdir(inode, dots=dots)

    def readlink(self, inode: int) -> bytes:
        return self._ns.readlink(inode)

    def statfs(self) -> StatFs:
        """The store's file system's space (its blocks, free and available apart, as statvfs(2)
        gives them), and the inodes this file system uses."""
        st = os.statvfs(self.store.root)
        with self._ns.lock:
            files = len(self._ns)
        return StatFs(st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, files)

    # -- the namespace and metadata --------------------------------------------------------------
    def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> Attributes:
        return self._entries.mkdir(parent, name, mode, uid, gid)

    def rmdir(self, parent: int, name: str) -> None:
        self._entries.rmdir(parent, name)

    def symlink(self, parent: int, name: str, target: bytes, uid: int, gid: int) -> Attributes:
        return self._entries.symlink(parent, name, target, uid, gid)

    def unlink(self, parent: int, name: str) -> None:
        self._entries.unlink(parent, name)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int = 0) -> None:
        self._entries.rename(parent, name, new_parent, new_name, flags)

    def setattr(self, inode: int, *, mode: int | None = None, uid: int | None = None, gid: int | None = None,
                size: int | None = None, atime_ns: int | None = None, mtime_ns: int | None = None,
                fh: int | None = None) -> Attributes:
        """`fh`: the handle a size change came through (ftruncate), whose flush commits it."""
        node = self._ns.node(inode)
        now = time.time_ns()
        self._sync.busy()
        if size is not None:
            self._handles.resize(node, size, fh, now)
        self._entries.set_meta(node, now, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns)
        return self.getattr(inode)

    def getxattr(self, inode: int, name: bytes) -> bytes:
        return self._xattrs.get(inode, name)

    def listxattr(self, inode: int) -> list[bytes]:
        return self._xattrs.list(inode)

    def setxattr(self, inode: int, name: bytes, value: bytes) -> None:
        self._xattrs.set(inode, name, value)

    def removexattr(self, inode: int, name: bytes) -> None:
        self._xattrs.remove(inode, name)

    # -- files -----------------------------------------------------------------------------------
    def create(self, parent: int, name: str, mode: int, uid: int, gid: int, flags: int) -> tuple[int, Attributes]:
        """A new file (or an existing one opened). While the files written and not yet committed
        hold half the process's descriptors (spool.descriptors_short) and commits are on their way
        that will close some, it waits for them (in a thread: WouldBlock on the event loop), up to
        DESCRIPTOR_WAIT_SECONDS, so that a burst of files slows down rather than failing with
        EMFILE. Files a program keeps open hold theirs until it closes them: nothing to wait for."""
        if self.spool.descriptors_short() and self._committer.catching_up():
            if not may_wait():
                raise WouldBlock
            deadline = time.monotonic() + DESCRIPTOR_WAIT_SECONDS
            while (self.spool.descriptors_short() and self._committer.catching_up()
                   and time.monotonic() < deadline):
                self.spool.wait_for_descriptors(DESCRIPTOR_RECHECK_SECONDS)
        self._sync.busy()
        return self._handles.create(parent, name, mode, uid, gid, flags)

    def open(self, inode: int, flags: int) -> int:
        return self._handles.open(inode, flags)

    def read(self, fh: int, offset: int, length: int) -> bytes:
        return self._handles.read(fh, offset, length)

    def write(self, fh: int, offset: int, data: bytes) -> int:
        self._sync.busy()
        return self._handles.write(fh, offset, data)

    def try_write(self, fh: int, offset: int, data: bytes) -> int | None:
        """write(), unless the file is being committed (then None: nothing was written)."""
        self._sync.busy()
        return self._handles.try_write(fh, offset, data)

    def release(self, fh: int) -> None:
        """A handle's last descriptor is closed: what changed through it is committed (a failure is
        logged, the bytes stay in the spool); the file's last release lets its data go."""
        self._handles.release(fh)

    def fsync(self, fh: int) -> None:
        """The file's bytes and metadata are durable when this returns (in the spool or the store),
        and so is every change of the namespace and metadata made before it."""
        self._handles.fsync(fh)
        self._sync.sync()

    def sync(self) -> None:
        """Every change of the namespace and metadata made so far is durable (fsyncdir)."""
        self._sync.sync()

    # -- commits ---------------------------------------------------------------------------------
    def commit(self, node: Node) -> bool:
        """Store the node's bytes (if it has uncommitted ones); True if it committed."""
        return self._committer.commit(node)

    def commit_idle(self, idle_seconds: float) -> int:
        """Commit files unchanged for idle_seconds; how many were committed."""
        return self._committer.commit_idle(idle_seconds)

    def recode_text(self) -> int:
        """Code the text chunks commits stored at zstd's default level again, as `lmz add` would,
        where smaller (recodetext.py; in the background once the mount is idle): one batch; how
        many chunks were switched."""
        return self._recoder.run_once()

    def text_chunks_pending(self) -> int:
        """Chunks commits named for recode_text that it has not looked at yet."""
        return self._recoder.pending()

    def reclaim(self) -> GcResult | None:
        """After commits: drop what no file references and rewrite the packs mostly dead, if the
        dead bytes pass the floor and a fraction of the packs (fsmodel/reclaim.py); None if not run."""
        return self._reclaimer.maybe_reclaim(self._committer.commits, self._committer.appended)

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Commit what is uncommitted (what cannot be is kept in the spool), and release the store."""
        if self._sync.closed:
            return
        self._recoder.stop()
        nodes = self._ns.nodes_with_data()
        self._committer.commit_all(nodes)
        self._sync.set_closed()
        for node in nodes:
            if node.data is not None:
                node.data.close(keep_spool=node.data.dirty and node.linked)
                node.data = None
        self._committer.shutdown()
        self._stored.close()
        try:
            self._sync.close()                  # writes the catalog's copy if one is due
        finally:
            self.spool.unlock()
