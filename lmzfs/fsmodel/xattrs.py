"""Extended attributes of a writable mount's entries: user.* only, each value up to 64 KiB, stored
in the catalog (fs_xattrs) in one transaction per change; read from the tree in memory."""
from __future__ import annotations

import errno
import time

from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import found, fs_error
from lmzfs.store.catalog.fsrows import delete_xattr, model_id, put_xattr

XATTR_NAMESPACE = b"user."
XATTR_VALUE_MAX = 64 << 10


class Xattrs:
    def __init__(self, sync: CatalogSync, ns: Namespace):
        self._sync, self._ns = sync, ns

    def get(self, inode: int, name: bytes) -> bytes:
        return found(self._ns.node(inode).xattrs.get(name), errno.ENODATA)

    def list(self, inode: int) -> list[bytes]:
        return sorted(self._ns.node(inode).xattrs)

    def set(self, inode: int, name: bytes, value: bytes) -> None:
        if not name.startswith(XATTR_NAMESPACE) or len(name) == len(XATTR_NAMESPACE):
            raise fs_error(errno.EOPNOTSUPP, "only user.* attributes")
        if len(value) > XATTR_VALUE_MAX:
            raise fs_error(errno.E2BIG)
        with self._sync.changing():
            node = self._ns.node(inode)
            where = self._ns.where(node) if node.linked else None
            if where is None and node.linked:
                raise fs_error(errno.EPERM, "attributes live inside models")
            if where is not None:
                with self._sync.catalog.transaction() as db:
                    put_xattr(db, model_id(db, where[0]), where[1], name, value)
            with self._ns.lock:
                node.xattrs[name] = bytes(value)
                node.change(ctime_ns=time.time_ns())

    def remove(self, inode: int, name: bytes) -> None:
        with self._sync.changing():
            node = self._ns.node(inode)
            if name not in node.xattrs:
                raise fs_error(errno.ENODATA)
            where = self._ns.where(node) if node.linked else None
            if where is not None:
                with self._sync.catalog.transaction() as db:
                    delete_xattr(db, model_id(db, where[0]), where[1], name)
            with self._ns.lock:
                del node.xattrs[name]
