"""A writable file system over a store, with no FUSE in it: what `lmz mount --writable` serves,
and what tests drive directly.

The namespace lives in memory, loaded from the catalog (models, files, and the writable-mount
tables of store/fscatalog.py) and kept in step with it:

- The root holds models (directories); a directory that is no model's root and holds none
  (`run1` above `run1/step-1000`) is a plain name in the tree. mkdir there creates a model, rmdir
  of an empty model removes it as `lmz rm` does; files, symlinks and other entries live inside
  models only (EPERM at the root).
- Every change of the namespace or of metadata (mkdir, rmdir, unlink, rename, symlink, chmod,
  chown, utimes, xattrs) is one catalog transaction under the store's WriterLock before the
  call returns: durable when it returns.
- A file's bytes are written to the spool (fsmodel/spool.py) and committed to the store
  (store/fscommit.py, the `lmz add` machinery) on the last close, on commit_idle(), and at
  unmount. A file's spool record is written (without fsync) when it gets its spool file and when
  it is renamed, and each write or truncate appends to its journal, so that what write() accepted
  survives a kill of the daemon; fsync makes it durable against a power loss too. A mount
  commits every spool record it finds (replay).

Errors are OSError with the errno the caller passes on (ENOENT, EEXIST, ENOTEMPTY, EXDEV...).
Thread-safe: in-memory state under one lock; changes to the store serialised by a second one
(and the store's WriterLock), so the event loop can answer lookups while a commit runs.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lmzfs.fsmodel.catalogsync import CatalogSync, open_catalog
from lmzfs.fsmodel.entries import Entries
from lmzfs.fsmodel.filedata import FileData
from lmzfs.fsmodel.journal import FileState
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INODE, Attributes, Node, StatFs
from lmzfs.fsmodel.nodes import fs_error as _error
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.spool import Spool, SpoolRecord, boot_id
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.fsmodel.xattrs import XATTR_NAMESPACE, XATTR_VALUE_MAX, Xattrs
from lmzfs.hostresources import usable_cpus
from lmzfs.store.fscatalog import EntryMeta, forget_spool_commits, spool_commits
from lmzfs.store.fscommit import FileContent, commit_file
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock

__all__ = ["Attributes", "Filesystem", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "ROOT_INODE", "StatFs", "XATTR_NAMESPACE",
           "XATTR_VALUE_MAX"]

log = logging.getLogger(__name__)

@dataclass
class Handle:
    node: Node
    append: bool
    writable: bool
    changed: bool = False       # the file changed through this handle since its last flush


@dataclass(frozen=True)
class ReplayedState:
    """A spooled file as a mount replays it, and how many journal entries that includes."""
    state: FileState
    journal_entries: int


class Filesystem:
    def __init__(self, store_dir: Path, *, cache_bytes: int = 64 << 20, workers: int | None = None,
                 uid: int | None = None, gid: int | None = None, chunk_size: int | None = None):
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
        from lmzfs.chunker import CHUNK_SIZE
        self._chunk_size = chunk_size or CHUNK_SIZE
        self._stored = StoredFiles(self.store, cache_bytes)
        self.source = self._stored.source
        self._workers = workers or usable_cpus()
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="lmz-encode")
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        self._ns = Namespace(self._uid, self._gid)
        self.root = self._ns.root
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._sync = CatalogSync(self.store, self.catalog, self._ns)
        self._records = SpoolRecords(self.spool, self._ns, self._stored)
        self._entries = Entries(self._sync, self._ns, self._records)
        self._xattrs = Xattrs(self._sync, self._ns)
        try:
            self.replayed = self._replay()
        except BaseException:
            self.close()            # what was replayed stays committed; the rest stays in the spool
            raise

    # -- loading and following the catalog -------------------------------------------------------
    def refresh(self) -> bool:
        """Follow changes another process committed (lmz add, rm, gc); True if there were any."""
        return self._sync.refresh()

    def write_catalog_copy(self) -> bool:
        """Copy the catalog beside it if one is due (the daemon: every few seconds); True if written."""
        return self._sync.write_catalog_copy()

    # -- queries ---------------------------------------------------------------------------------
    @staticmethod
    def attributes(node: Node) -> Attributes:
        return node.attributes()

    def __len__(self) -> int:
        """Inodes known (in the tree, or unlinked but still open or known to the kernel)."""
        return len(self._ns)

    def model_count(self) -> int:
        return self._ns.model_count()

    def generation(self) -> int:
        """Changes whenever another process commits to the catalog (what the service status follows)."""
        return self._sync.seen_version

    def lookup(self, parent: int, name: str) -> Attributes:
        return self._ns.lookup(parent, name)

    def remember(self, inode: int) -> None:
        """The kernel got a reference other than by lookup (an entry of readdirplus)."""
        self._ns.remember(inode)

    def forget(self, inode: int, count: int) -> None:
        self._ns.forget(inode, count)

    def getattr(self, inode: int) -> Attributes:
        return self._ns.getattr(inode)

    def readdir(self, inode: int) -> list[tuple[str, Attributes]]:
        return self._ns.readdir(inode)

    def readlink(self, inode: int) -> bytes:
        return self._ns.readlink(inode)

    def statfs(self) -> StatFs:
        st = os.statvfs(self.store.root)
        with self._ns.lock:
            files = len(self._ns.inodes)
        return StatFs(st.f_frsize, st.f_blocks, st.f_bavail, files)

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
        if fh is not None and size is not None and fh in self._handles:
            self._handles[fh].changed = True
        now = time.time_ns()
        if size is not None:
            if node.kind != "file":
                raise _error(errno.EISDIR if node.kind == "dir" else errno.EINVAL)
            data = self._data(node)
            try:
                if size != data.size:
                    data.truncate(size)
                    node.mtime_ns = now
            finally:
                self._release_data(node)
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

    def _release_data(self, node: Node) -> None:
        with self._ns.lock:
            node.opens -= 1
            last = node.opens == 0
        if not last:
            return
        if node.data is not None and node.data.dirty and node.linked:
            self.commit(node)
        with self._ns.lock:
            # an unlinked file's bytes go with its last close; a commit that failed keeps them
            if node.opens == 0 and node.data is not None and (not node.data.dirty or not node.linked):
                self._ns.close_later(node)
            self._ns.maybe_drop(node)
        self._ns.close_deferred()

    def create(self, parent: int, name: str, mode: int, uid: int, gid: int, flags: int) -> tuple[int, Attributes]:
        self._ns.check_name(name)
        with self._ns.lock:
            directory = self._ns.dir(parent)
            self._ns.in_model(directory)
            existing = directory.children.get(name)
            if existing is not None:
                if flags & os.O_EXCL:
                    raise _error(errno.EEXIST)
                node = existing
                node.lookups += 1
            else:
                now = time.time_ns()
                meta = EntryMeta("file", stat.S_IMODE(mode), uid, gid, now, now, now)
                node = self._ns.new_node("file", name, directory, meta)
                node.data = self._records.new_data(node, None, 0)
                node.data.dirty = True                # a new file is committed even if empty
                directory.children[name] = node
                directory.touch(now)
                node.lookups += 1
                existing = None
        if existing is None:
            with node.data.lock:                      # its record: the new name survives a kill
                node.data.ensure_spool_file()
        fh = self.open(node.inode, flags & ~os.O_CREAT & ~os.O_EXCL)
        return fh, self.getattr(node.inode)

    def open(self, inode: int, flags: int) -> int:
        node = self._ns.node(inode)
        if node.kind == "dir":
            raise _error(errno.EISDIR)
        if node.kind != "file":
            raise _error(errno.ELOOP)
        data = self._data(node)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        changed = writable and data.dirty and node.file_id is None       # a new file: committed even if empty
        if flags & os.O_TRUNC and writable and data.size:
            data.truncate(0)
            node.mtime_ns = node.ctime_ns = time.time_ns()
            changed = True
        with self._ns.lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = Handle(node, bool(flags & os.O_APPEND), writable, changed)
            return fh

    def _handle(self, fh: int) -> Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise _error(errno.EBADF)
        return handle

    def read(self, fh: int, offset: int, length: int) -> bytes:
        handle = self._handle(fh)
        return handle.node.data.read(offset, length)

    def write(self, fh: int, offset: int, data: bytes) -> int:
        handle = self._handle(fh)
        if not handle.writable:
            raise _error(errno.EBADF)
        node = handle.node
        with node.data.lock:
            if handle.append:
                offset = node.data.size
            n = node.data.write(offset, data)
        handle.changed = True
        node.mtime_ns = node.ctime_ns = time.time_ns()
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

    def flush(self, fh: int) -> None:
        """A close of a descriptor (close(2) waits for it): what changed through it is committed."""
        handle = self._handle(fh)
        if handle.changed:
            handle.changed = False
            self.commit(handle.node)

    def release(self, fh: int) -> None:
        with self._ns.lock:
            handle = self._handles.pop(fh, None)
        if handle is not None:
            self._release_data(handle.node)

    def fsync(self, fh: int) -> None:
        """The file's bytes and metadata are durable when this returns (in the spool or the store)."""
        node = self._handle(fh).node
        with node.data.lock:
            if node.data.dirty and node.linked:
                self._records.record(node)

    # -- commits ---------------------------------------------------------------------------------
    def commit(self, node: Node) -> bool:
        """Store the node's bytes (if it has uncommitted ones); True if it committed."""
        data = node.data
        if data is None or not data.dirty:
            return False
        # The store lock before the file's: a removal holding the store lock may close the file's data.
        with self._sync.changing(), data.lock:
            if not data.dirty or node.data is not data:
                return False
            with self._ns.lock:
                if not node.linked:
                    return False
                where = self._ns.where(node)
                meta = node.meta()
                replaces = node.file_id
            if where is None:
                return False
            spool_id = data.spool_file.spool_id if data.spool_file is not None and data.spool_file.recorded \
                else None
            content = FileContent(data.as_file(), lambda length, offset: data.read(offset, length), data.size)
            done = commit_file(self.store, self.catalog, self._pool, self._workers, model=where[0],
                               path=where[1], content=content, meta=meta, replaces=replaces,
                               spool_id=spool_id, chunk_size=self._chunk_size)
            for warning in done.warnings:
                log.info("%s/%s: %s", where[0], where[1], warning)
            with self._ns.lock:
                node.file_id = done.file_id
                node.size = done.size
            # the record's id stays in fs_spool_commits until a mount finds the record gone (_replay)
            data.rebase(self._stored.reader(node.file_id), done.size)
            return True

    def commit_idle(self, idle_seconds: float) -> int:
        """Commit files unchanged for idle_seconds; how many were committed."""
        now = time.monotonic()
        with self._ns.lock:
            nodes = [n for n in self._ns.inodes.values()
                     if n.data is not None and n.data.dirty and n.linked and now - n.data.last_change >= idle_seconds]
        done = 0
        for node in nodes:
            try:
                done += self.commit(node)
            except OSError as exc:
                log.error("committing %s: %s", "/".join(self._ns.path_parts(node)), exc)
        return done

    def _replay(self) -> int:
        """Commit every spool record a previous mount left: what its writes and fsyncs accepted."""
        records = self.spool.records()
        for path in self.spool.leftover_data():
            log.info("keeping %s: a spool file with no record to replay", path)
        with self._sync.lock:
            committed = spool_commits(self.catalog.db)
        done = 0
        for record in records:
            if record.spool_id in committed:
                self.spool.remove(record.spool_id)         # committed before the mount ended
                continue
            replayed = self._replayed_state(record)
            if replayed is None:
                continue
            try:
                node = self._node_for_record(record)
            except StoreError as exc:
                log.error("%s", exc)
                continue
            spool_file = self.spool.reopen(record, replayed.journal_entries)
            base = self._stored.reader(node.file_id)
            state = replayed.state
            node.data = self._records.new_data(node, base, state.size, spool_file=spool_file,
                                       base_len=state.base_len if base is not None else 0, ranges=state.ranges)
            node.apply_meta(record.meta)
            if self.commit(node):
                done += 1
            elif node.data is not None and node.data.dirty:
                with node.data.lock:
                    self._records.note(node, spool_file)            # a record of this boot for what it holds
            with self._ns.lock:
                if node.opens == 0 and node.data is not None and not node.data.dirty:
                    self._ns.close_later(node)
            self._ns.close_deferred()
        # ids of records now gone: removed durably first, so no record can come back to meet no row
        with self._sync.lock:
            self.spool.sync_removals()
            gone = committed - self.spool.record_ids()
            if gone:
                with WriterLock(self.store.lock), self.catalog.transaction() as db:
                    forget_spool_commits(db, gone)
        return done

    def _replayed_state(self, record: SpoolRecord) -> ReplayedState | None:
        """What a record and its journal say the file is, and how many journal entries that
        includes; None if nothing of it can be trusted (the record is set aside)."""
        journal = self.spool.read_journal(record)
        recorded = FileState(record.size, record.base_len, record.ranges)
        where = f"{record.model}/{record.path}"
        if record.boot_id and record.boot_id == boot_id():
            # the daemon ended, the machine did not: the page cache holds every byte and entry
            if journal.damage is not None:
                log.warning("%s: replaying %d journal entries; the rest cannot be trusted (%s)",
                            where, len(journal.entries), journal.damage)
            return ReplayedState(recorded.after(journal.entries), journal.total)
        if not record.durable:
            aside = self.spool.set_aside(record.spool_id)
            log.error("%s: written without fsync before the machine restarted, so its bytes may not be on "
                      "disk; not replayed, kept as %s", where, aside)
            return None
        if journal.entries or journal.damage is not None:
            log.warning("%s: replaying it as of its last fsync; %d later journal entries are dropped (written "
                        "without fsync before the machine restarted)", where, len(journal.entries))
        return ReplayedState(recorded, record.journal_entries)

    def _node_for_record(self, record: SpoolRecord) -> Node:
        with self._ns.lock:
            if record.file_id is not None:
                for node in self._ns.inodes.values():
                    if node.file_id == record.file_id:
                        stored_sha = self._stored.sha256(record.file_id)
                        if stored_sha is not None and stored_sha == record.base_sha256:
                            return node
                        raise StoreError(f"spool record {record.spool_id} changes a version of {record.model}/"
                                         f"{record.path} that is no longer stored; it is kept in {self.spool.dir}")
            # a new file (or its stored version is gone): recreate it where the record puts it
            directory = self.root
            parts = record.model.split("/") + record.path.split("/")
            for part in parts[:-1]:
                child = directory.children.get(part)
                if child is None:
                    child = self._ns.new_node("dir", part, directory)
                    directory.children[part] = child
                directory = child
            if self._ns.where(directory) is None:
                raise StoreError(f"spool record {record.spool_id}: model {record.model!r} is gone; it is kept "
                                 f"in {self.spool.dir}")
            node = directory.children.get(parts[-1])
            if node is None or node.kind != "file":
                node = self._ns.new_node("file", parts[-1], directory, record.meta)
                directory.children[parts[-1]] = node
            return node

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Commit what is uncommitted (what cannot be is kept in the spool), and release the store."""
        if self._sync.closed:
            return
        with self._ns.lock:
            nodes = [n for n in self._ns.inodes.values() if n.data is not None]
        for node in nodes:
            if node.data is not None and node.data.dirty and node.linked:
                try:
                    with node.data.lock:
                        self._records.record(node)          # durable first, whatever the commit does
                    self.commit(node)
                except (OSError, StoreError) as exc:
                    log.error("%s stays in the spool: %s", "/".join(self._ns.path_parts(node)), exc)
        self._sync.set_closed()
        for node in nodes:
            if node.data is not None:
                node.data.close(keep_spool=node.data.dirty and node.linked)
                node.data = None
        self._pool.shutdown(wait=True)
        self._stored.close()
        try:
            self._sync.close()                  # writes the catalog's copy if one is due
        finally:
            self.spool.unlock()
