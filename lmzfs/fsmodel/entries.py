"""Changes of a writable mount's namespace and metadata (mkdir, rmdir, unlink, rename, symlink,
chmod, chown, utimes): each is one catalog transaction under the store's WriterLock
(catalogsync.py), then the same change of the tree in memory (namespace.py); durable when the
call returns.

mkdir at the root or above models creates a model; rmdir of an empty model removes it as `lmz rm`
does; a rename of a model, or of a directory above models, renames the models.
"""
from __future__ import annotations

import errno
import stat
import time

from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import RENAME_EXCHANGE, Attributes, Node, fs_error
from lmzfs.fsmodel.nowait import holding
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.store.catalog.fsrows import (EntryMeta, delete_entry, delete_model, delete_model_named,
                                        model_id, model_names, models_by_id, move_subtree, put_entry, remove_file_row,
                                        remove_subtree, rename_model)
from lmzfs.store.catalog.modelrows import insert_model
from lmzfs.store.layout import StoreError
from lmzfs.store.names import RESERVED_TOP, validate_model_name


def _valid_model_name(model: str) -> None:
    try:
        validate_model_name(model)
    except StoreError as exc:
        raise fs_error(errno.EINVAL, str(exc)) from None


class Entries:
    def __init__(self, sync: CatalogSync, ns: Namespace, records: SpoolRecords):
        self._sync, self._ns, self._records = sync, ns, records

    # -- storing ---------------------------------------------------------------------------------
    def _store_dir_meta(self, db, directory: Node) -> None:
        where = self._ns.where(directory)
        if where is not None:
            put_entry(db, model_id(db, where[0]), where[1], directory.meta())

    @staticmethod
    def _remove_stored(db, node: Node, mid: int, path: str) -> None:
        if node.file_id is not None:
            remove_file_row(db, node.file_id)
            node.file_id = None
        delete_entry(db, mid, path)

    def _new_entry_dir(self, parent: int, name: str, *, in_model: bool) -> tuple[Node, tuple[str, str] | None]:
        """The directory where a new entry `name` is to be made (EEXIST if one is there), and where
        it is (None: at the root or above models, EPERM if `in_model`). Called inside changing()."""
        with self._ns.lock:
            directory = self._ns.free_name_in(parent, name)
            return directory, self._ns.in_model(directory) if in_model else self._ns.where(directory)

    def _add_entry(self, directory: Node, where: tuple[str, str], name: str, meta: EntryMeta) -> Attributes:
        """One transaction: the entry `name` in `directory` (at `where`), and the directory's new
        times; then the new entry joins the tree."""
        with self._sync.catalog.transaction() as db:
            put_entry(db, model_id(db, where[0]), self._ns.join(where[1], name), meta)
            directory.touch(meta.mtime_ns)
            self._store_dir_meta(db, directory)
        return self._attach(directory, name, meta)

    def _attach(self, directory: Node, name: str, meta: EntryMeta, **kw) -> Attributes:
        with self._ns.lock:
            return self._ns.attach(directory, meta.kind, name, meta, **kw).attributes()

    # -- directories, symlinks -------------------------------------------------------------------
    def mkdir(self, parent: int, name: str, mode: int, uid: int, gid: int) -> Attributes:
        self._ns.check_name(name)
        with self._sync.changing():
            directory, where = self._new_entry_dir(parent, name, in_model=False)
            now = time.time_ns()
            meta = EntryMeta("dir", stat.S_IMODE(mode), uid, gid, now, now, now)
            if where is not None:
                return self._add_entry(directory, where, name, meta)
            model = "/".join(self._ns.path_parts(directory) + [name])
            self._create_model(model, meta)
            return self._attach(directory, name, meta, model=model)

    def _create_model(self, model: str, meta: EntryMeta) -> None:
        _valid_model_name(model)
        if model.split("/")[0] in RESERVED_TOP:
            raise fs_error(errno.EINVAL)
        with self._sync.catalog.transaction() as db:
            for other in model_names(db):
                if other == model or other.startswith(model + "/") or model.startswith(other + "/"):
                    raise fs_error(errno.EEXIST, f"model {other!r} is in the way")
            mid = insert_model(db, model, meta.mtime_ns / 1e9, "writable mount")
            put_entry(db, mid, "", meta)

    def symlink(self, parent: int, name: str, target: bytes, uid: int, gid: int) -> Attributes:
        self._ns.check_name(name)
        with self._sync.changing():
            directory, where = self._new_entry_dir(parent, name, in_model=True)
            now = time.time_ns()
            meta = EntryMeta("symlink", 0o777, uid, gid, now, now, now, bytes(target))
            return self._add_entry(directory, where, name, meta)

    def rmdir(self, parent: int, name: str) -> None:
        with self._sync.changing():
            with self._ns.lock:
                directory = self._ns.dir(parent)
                node = self._ns.child(directory, name)
                if node.kind != "dir":
                    raise fs_error(errno.ENOTDIR)
                if node.children:
                    raise fs_error(errno.ENOTEMPTY)
                where = self._ns.where(node)
            now = time.time_ns()
            if node.model is not None:
                with self._sync.catalog.transaction() as db:
                    mid = model_id(db, node.model)
                    remove_subtree(db, mid, "")
                    delete_model(db, mid)
            elif where is not None:
                with self._sync.catalog.transaction() as db:
                    delete_entry(db, model_id(db, where[0]), where[1])
                    directory.touch(now)
                    self._store_dir_meta(db, directory)
            with self._ns.lock:
                directory.touch(now)
                self._ns.detach(node)

    # -- removing and renaming -------------------------------------------------------------------
    def unlink(self, parent: int, name: str) -> None:
        with self._sync.changing():
            with self._ns.lock:
                directory = self._ns.dir(parent)
                node = self._ns.child(directory, name)
                if node.kind == "dir":
                    raise fs_error(errno.EISDIR)
                model, path = self._ns.in_model(directory)
            now = time.time_ns()
            directory.touch(now)
            # A file never committed has nothing in the catalog to remove (its directory's times
            # are stored with the next change): unlinking it needs no disk space, which is what
            # frees a full disk of the spool's bytes.
            if node.kind != "file" or node.file_id is not None or node.xattrs:
                with self._sync.catalog.transaction() as db:
                    self._remove_stored(db, node, model_id(db, model), self._ns.join(path, name))
                    self._store_dir_meta(db, directory)
            with self._ns.lock:
                node.change(ctime_ns=now)
                self._ns.detach(node)

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int = 0) -> None:
        self._ns.check_name(new_name)
        if flags & RENAME_EXCHANGE:
            raise fs_error(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        if self._rename_unstored(parent, name, new_parent, new_name, flags):
            return
        with self._sync.changing():
            with self._ns.lock:
                nodes = self._ns.rename_nodes(parent, name, new_parent, new_name, flags)
                if nodes is None:
                    return
                source_dir, target_dir, node, victim = nodes
                old_where, new_dir_where = self._ns.where(node), self._ns.where(target_dir)
            now = time.time_ns()
            if node.model is not None or (old_where is None and node.kind == "dir"):
                self._rename_models(node, target_dir, new_name, victim, new_dir_where)
            else:
                if old_where is None or new_dir_where is None:
                    raise fs_error(errno.EXDEV, "entries move between models or to the top level by copying")
                new_path = self._ns.join(new_dir_where[1], new_name)
                with self._sync.catalog.transaction() as db:
                    old_mid, new_mid = model_id(db, old_where[0]), model_id(db, new_dir_where[0])
                    if victim is not None:
                        if victim.kind == "dir":
                            remove_subtree(db, new_mid, new_path)
                        else:
                            self._remove_stored(db, victim, new_mid, new_path)
                    move_subtree(db, old_mid, old_where[1], new_mid, new_path)
                    node.change(ctime_ns=now)
                    node.renamed_or_set_ns = now
                    source_dir.touch(now)
                    target_dir.touch(now)
                    self._store_dir_meta(db, source_dir)
                    self._store_dir_meta(db, target_dir)
                    if node.kind != "file" or node.file_id is not None:
                        put_entry(db, new_mid, new_path, node.meta())
            self._ns.move(node, source_dir, target_dir, new_name, victim, now)
            self._records.note_below(node)

    def _rename_unstored(self, parent: int, name: str, new_parent: int, new_name: str, flags: int) -> bool:
        """A rename of a file never committed (no row in the catalog: no version, no xattrs) to a
        free name inside a model, as rsync renames each temporary file it wrote: the tree in
        memory and the file's spool record change, the catalog does not, so the rename waits for
        no commit of other files (the directories' new times are stored with their next change
        recorded in the catalog, as after a create). It holds the file's lock, so no commit of the
        file is under way: one that took the old name would store it there. False (nothing done):
        any other rename, made in a catalog transaction."""
        ns = self._ns
        with ns.lock:
            node = ns.dir(parent).children.get(name)
            data = node.data if node is not None and node.kind == "file" else None
        if data is None or node.file_id is not None:
            return False
        with holding(data.lock):
            with ns.lock:
                nodes = ns.rename_nodes(parent, name, new_parent, new_name, flags)
                if nodes is None:
                    return True
                source_dir, target_dir, moved, victim = nodes
                if (moved is not node or victim is not None or node.data is not data or node.file_id is not None
                        or node.xattrs or ns.where(node) is None or ns.where(target_dir) is None):
                    return False
                now = time.time_ns()
                node.change(ctime_ns=now)
                node.renamed_or_set_ns = now
                ns.move(node, source_dir, target_dir, new_name, None, now)
            self._sync.last_change = time.monotonic()       # a large file's commit waits for a lull
            self._records.note_below(node)
        return True

    def _rename_models(self, node: Node, target_dir: Node, new_name: str, victim: Node | None,
                       new_dir_where) -> None:
        """Rename a model, or a directory above models: the models' names change."""
        if new_dir_where is not None:
            raise fs_error(errno.EXDEV, "a model cannot move inside another model")
        old_prefix = "/".join(self._ns.path_parts(node))
        new_prefix = "/".join(self._ns.path_parts(target_dir) + [new_name])
        with self._sync.catalog.transaction() as db:
            if victim is not None:
                if victim.model is not None:
                    delete_model_named(db, victim.model)
            for mid, model in models_by_id(db):
                if model == old_prefix or model.startswith(old_prefix + "/"):
                    renamed = new_prefix + model[len(old_prefix):]
                    _valid_model_name(renamed)
                    rename_model(db, mid, renamed)
        self._ns.rename_models(node, old_prefix, new_prefix)

    # -- metadata --------------------------------------------------------------------------------
    def set_meta(self, node: Node, now: int, *, mode: int | None, uid: int | None, gid: int | None,
                 atime_ns: int | None, mtime_ns: int | None) -> None:
        """chmod, chown, utimes (setattr but for the size); `now`: the change's ctime."""
        with self._ns.lock:
            given = {"mode": None if mode is None else stat.S_IMODE(mode), "uid": uid, "gid": gid,
                     "atime_ns": atime_ns, "mtime_ns": mtime_ns}
            node.change(**{k: v for k, v in given.items() if v is not None}, ctime_ns=now)
            node.renamed_or_set_ns = now
            where = self._ns.where(node) if node.linked else None
            stored = node.kind != "file" or node.file_id is not None
        if (mode, uid, gid, atime_ns, mtime_ns) == (None,) * 5:
            return
        if where is not None and stored:
            with self._sync.changing():
                with self._sync.catalog.transaction() as db:
                    put_entry(db, model_id(db, where[0]), where[1], node.meta())
        # a replay applies the record's metadata: it must not bring back the old one
        self._records.note_again(node)
