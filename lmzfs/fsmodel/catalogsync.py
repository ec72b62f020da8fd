"""The catalog as a writable mount changes it: one change at a time (a lock in this process, the
store's WriterLock across processes), each made on the catalog as it is now, so the tree first
follows what other processes (lmz add, rm, gc) committed.

Group commit: each change is one transaction, committed to the WAL without an fsync of its own
(synchronous=NORMAL), so a kill of the daemon loses none of it (the WAL is in the page cache of
the store's file system). A thread fsyncs the WAL SYNC_DELAY after a change (every change made
meanwhile rides on that one fsync), and sync() does it at once: at every fsync and fdatasync
of a file, fsyncdir, and unmount. A power loss loses at most the changes of the last moments
before it, never the ones an fsync covered, and leaves the catalog consistent (SQLite's WAL)."""
from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import fs_error
from lmzfs.fsmodel.nowait import WouldBlock, may_wait, take
from lmzfs.fsmodel.reconcile import reload
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.fsrows import ensure_fs_schema
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock

log = logging.getLogger(__name__)


SYNC_DELAY = 0.01          # the WAL is fsync'd this soon after a change (and at once by sync())
LET_IN_SECONDS = 0.5       # a commit in parts waits at most this long for the changes waiting between them


def open_catalog(store: StorePaths) -> Catalog:
    """The store's catalog, with the writable mount's tables, committing in groups (WalSyncer)."""
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        catalog.copy_after_commit = False      # CatalogSync.write_catalog_copy() writes them
        try:
            ensure_fs_schema(catalog.db)
            catalog.group_commit()
        except BaseException:
            catalog.close()
            raise
    return catalog


class WalSyncer:
    """Makes the catalog's commits durable in groups: changed() after a commit, sync() for a
    caller that needs every commit so far durable before it returns."""

    def __init__(self, catalog: Catalog, delay: float = SYNC_DELAY):
        self._catalog = catalog
        self._delay = delay
        self._cv = threading.Condition()
        self._changed = self._synced = 0        # changes counted, and covered by an fsync
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="lmz-wal-sync", daemon=True)
        self._thread.start()

    def changed(self) -> None:
        with self._cv:
            self._changed += 1
            self._cv.notify()

    def sync(self) -> None:
        """Every change committed so far is durable when this returns."""
        with self._cv:
            target = self._changed
            if target == self._synced:
                return
        self._catalog.sync_wal()
        with self._cv:
            self._synced = max(self._synced, target)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._changed == self._synced and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
            time.sleep(self._delay)             # the changes of the next moments join this fsync
            try:
                self.sync()
            except OSError as exc:
                log.error("fsync of the catalog's WAL: %s", exc)
                time.sleep(1.0)

    def stop(self) -> None:
        """No background fsync from now on (the caller syncs one last time)."""
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join()


def _full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class CatalogSync:
    def __init__(self, store: StorePaths, catalog: Catalog, ns: Namespace):
        self.store, self.catalog = store, catalog
        self._ns = ns
        self.lock = threading.RLock()          # changes to the store, one at a time
        self.closed = False
        self.wal = WalSyncer(catalog)
        self.last_change = 0.0          # when the latest change was made (monotonic): busy(), changing()
        self._waiting = 0               # namespace changes waiting in a thread for the lock
        self._waiters = threading.Condition()
        with self.lock:
            self.seen_version = catalog.data_version()
            reload(ns, catalog)

    def refresh(self) -> bool:
        """Follow changes another process committed; True if there were any."""
        if not self.lock.acquire(blocking=False):
            return False                # a change of ours is running; it looks before it writes
        try:
            return self._follow_others()
        finally:
            self._ns.close_deferred()
            self.lock.release()

    def write_catalog_copy(self) -> bool:
        """Copy the catalog beside it if a commit since the last copy is not in one (catalog/copies.py);
        every commit would cost a copy of the whole catalog, so the mount writes one now and then
        (the daemon: every few seconds) and at close. True if one was written."""
        with self.lock:
            if not self.catalog.copy_due or self.closed:
                return False
            with WriterLock(self.store.lock):
                self.catalog.write_copy(final=False)
                self.seen_version = self.catalog.data_version()
            return not self.catalog.copy_due

    def _follow_others(self) -> bool:
        version = self.catalog.data_version()
        if version == self.seen_version:
            return False
        self.seen_version = version
        reload(self._ns, self.catalog)
        return True

    @contextmanager
    def changing(self, *, namespace: bool = True) -> Iterator:
        """One change to the store: ours alone (in this process and across processes), made on
        the catalog as it is now. `namespace`: a change a caller waits for (mkdir, rename ...),
        not a commit's or a reclaim's (last_change says when the latest was)."""
        with self._turn(namespace):
            if self.closed:
                raise fs_error(errno.EROFS, "the file system is closing")
            with ExitStack() as stack:
                try:
                    stack.enter_context(WriterLock(self.store.lock, wait=may_wait()))
                except StoreError:
                    if may_wait():
                        raise
                    raise WouldBlock from None      # another process writes: wait in a thread
                self._follow_others()
                try:
                    yield
                except StoreError as exc:
                    log.error("%s", exc)
                    cause = exc.__cause__
                    code = cause.errno if isinstance(cause, OSError) and cause.errno else errno.EIO
                    if isinstance(cause, sqlite3.Error) and _full(cause):
                        code = errno.ENOSPC
                    raise fs_error(code, str(exc)) from None
                except sqlite3.Error as exc:
                    log.error("catalog: %s", exc)
                    raise fs_error(errno.ENOSPC if _full(exc) else errno.EIO, str(exc)) from None
                finally:
                    if namespace:
                        self.last_change = time.monotonic()
                    self.wal.changed()
                    # our own commits do not move data_version; a copy written meanwhile might
                    self.seen_version = self.catalog.data_version()
                    self._ns.close_deferred()

    @contextmanager
    def _turn(self, namespace: bool) -> Iterator:
        """The lock held (as nowait.holding); a namespace change that waits for it (in a thread)
        is counted while it waits, so that a commit in parts lets it in (let_changes_in)."""
        counted = namespace and may_wait()
        if counted:
            with self._waiters:
                self._waiting += 1
        try:
            take(self.lock)
        finally:
            if counted:
                with self._waiters:
                    self._waiting -= 1
                    self._waiters.notify_all()
        try:
            yield
        finally:
            self.lock.release()

    def changes_waiting(self) -> int:
        """How many namespace changes wait for the lock now."""
        with self._waiters:
            return self._waiting

    def let_changes_in(self, longest: float = LET_IN_SECONDS) -> None:
        """Between two parts of a commit (the lock not held): until the namespace changes that
        wait for the lock have it, or `longest` passed."""
        end = time.monotonic() + longest
        with self._waiters:
            while self._waiting > 0:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._waiters.wait(left)

    def busy(self) -> None:
        """A caller changed something (created, wrote, renamed a file, set its metadata): commits
        wait for a lull (wait_quiet)."""
        self.last_change = time.monotonic()

    def wait_quiet(self, quiet: float, longest: float, until: Callable[[], bool] | None = None) -> None:
        """Until no change was made for `quiet` seconds, or `longest` passed, or `until()`: the
        commits a burst of changes (rsync, tar, a build writing many files) queues wait for its
        end, so that their work does not slow it down."""
        end = time.monotonic() + longest
        while not self.closed and not (until is not None and until()):
            now = time.monotonic()
            left = min(self.last_change + quiet, end) - now
            if left <= 0:
                return
            time.sleep(min(left, quiet))

    def set_closed(self) -> None:
        """No change starts from now on."""
        with self.lock:
            self.closed = True

    def sync(self) -> None:
        """Every change committed so far is durable when this returns (fsync, fsyncdir)."""
        self.wal.sync()

    def close(self) -> None:
        self.wal.stop()
        try:
            self.wal.sync()
            with WriterLock(self.store.lock):
                self.catalog.close()                # writes the catalog's copy if one is due
        except StoreError as exc:
            log.error("%s", exc)
