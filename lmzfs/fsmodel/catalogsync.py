"""The catalog as a writable mount changes it: one change at a time (a lock in this process, the
store's WriterLock across processes), each made on the catalog as it is now, so the tree first
follows what other processes (lmz add, rm, gc) committed."""
from __future__ import annotations

import errno
import logging
import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterator

from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import fs_error
from lmzfs.fsmodel.reconcile import reload
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.fsrows import ensure_fs_schema
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock

log = logging.getLogger(__name__)


def open_catalog(store: StorePaths) -> Catalog:
    """The store's catalog, with the writable mount's tables."""
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        catalog.copy_after_commit = False      # CatalogSync.write_catalog_copy() writes them
        try:
            ensure_fs_schema(catalog.db)
        except BaseException:
            catalog.close()
            raise
    return catalog


def _full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class CatalogSync:
    def __init__(self, store: StorePaths, catalog: Catalog, ns: Namespace):
        self.store, self.catalog = store, catalog
        self._ns = ns
        self.lock = threading.RLock()          # changes to the store, one at a time
        self.closed = False
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
    def changing(self) -> Iterator:
        """One change to the store: ours alone (in this process and across processes), made on
        the catalog as it is now."""
        with self.lock:
            if self.closed:
                raise fs_error(errno.EROFS, "the file system is closing")
            with WriterLock(self.store.lock):
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
                    # our own commits do not move data_version; a copy written meanwhile might
                    self.seen_version = self.catalog.data_version()
                    self._ns.close_deferred()

    def set_closed(self) -> None:
        """No change starts from now on."""
        with self.lock:
            self.closed = True

    def close(self) -> None:
        try:
            with WriterLock(self.store.lock):
                self.catalog.close()                # writes the catalog's copy if one is due
        except StoreError as exc:
            log.error("%s", exc)
