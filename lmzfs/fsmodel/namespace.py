"""The writable mount's tree in memory: inodes, names, lookups, directory entries and the rules of
rename(2), with no catalog in it (reconcile.py loads it, entries.py stores its changes).

The root holds models (directories); a directory that is no model's root and holds none (`run1`
above `run1/step-1000`) is a plain name in the tree. Files, symlinks and other entries live
inside models only (EPERM at the root).

One lock (an RLock) over all of it. A node that leaves the tree lives on while it is open or the
kernel knows its inode (lookups); its data is closed only once the lock is released
(close_deferred), as a commit holds its file's lock while it takes this one.
"""
from __future__ import annotations

import errno
import threading
import time
from dataclasses import replace
from typing import Iterator

from lmzfs.fsmodel.filedata import FileData
from lmzfs.fsmodel.nodes import (DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, NAME_MAX, RENAME_NOREPLACE, ROOT_INODE,
                                 Attributes, Node, found, fs_error)
from lmzfs.store.catalog.fsrows import EntryMeta


def check_length(name: str) -> None:
    """A name over NAME_MAX bytes is ENAMETOOLONG wherever it is looked up or made, never ENOENT."""
    if len(name) > NAME_MAX // 4 and len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise fs_error(errno.ENAMETOOLONG)


class Namespace:
    def __init__(self, uid: int, gid: int):
        self.uid, self.gid = uid, gid          # of what the catalog has no metadata for
        self.lock = threading.RLock()
        self.inodes: dict[int, Node] = {}
        self._next_inode = ROOT_INODE + 1
        self._to_close: list[FileData] = []
        now = time.time_ns()
        self.root = Node(ROOT_INODE, "", None, EntryMeta("dir", DEFAULT_DIR_MODE, uid, gid, now, now, now))
        self.root.parent = self.root
        self.inodes[ROOT_INODE] = self.root

    def __len__(self) -> int:
        return len(self.inodes)

    def new_node(self, kind: str, name: str, parent: Node, meta: EntryMeta | None = None, **kw) -> Node:
        now = time.time_ns()
        if meta is None:
            mode = DEFAULT_DIR_MODE if kind == "dir" else DEFAULT_FILE_MODE
            meta = EntryMeta(kind, mode, self.uid, self.gid, now, now, now)
        node = Node(self._next_inode, name, parent, meta if meta.kind == kind else replace(meta, kind=kind), **kw)
        self._next_inode += 1
        self.inodes[node.inode] = node
        return node

    # -- where things are ------------------------------------------------------------------------
    def node(self, inode: int) -> Node:
        return found(self.inodes.get(inode))

    def dir(self, inode: int) -> Node:
        node = self.node(inode)
        if node.kind != "dir":
            raise fs_error(errno.ENOTDIR)
        if not node.linked:
            raise fs_error(errno.ENOENT)
        return node

    @staticmethod
    def child(directory: Node, name: str) -> Node:
        check_length(name)
        return found(directory.children.get(name))

    @staticmethod
    def where(node: Node) -> tuple[str, str] | None:
        """(model, path inside it) of a node in a model; None at the root and above models."""
        parts: list[str] = []
        while node.model is None:
            if node.parent is node or node.parent is None:
                return None
            parts.append(node.name)
            node = node.parent
        return node.model, "/".join(reversed(parts))

    @staticmethod
    def path_parts(node: Node) -> list[str]:
        parts = []
        while node.parent is not node and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return list(reversed(parts))

    def in_model(self, directory: Node) -> tuple[str, str]:
        where = self.where(directory)
        if where is None:
            raise fs_error(errno.EPERM, "only directories (models) at the top of a writable mount")
        return where

    @staticmethod
    def join(path: str, name: str) -> str:
        return f"{path}/{name}" if path else name

    @staticmethod
    def check_name(name: str) -> None:
        check_length(name)
        if "/" in name or name in ("", ".", ".."):
            raise fs_error(errno.EINVAL)
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise fs_error(errno.EILSEQ, "names are stored as UTF-8") from None

    @staticmethod
    def models_below(node: Node) -> Iterator[Node]:
        """The models at or below a node that is a model or above models."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.model is not None:
                yield n
            else:
                stack.extend(c for c in n.children.values() if c.kind == "dir")

    # -- queries ---------------------------------------------------------------------------------
    def model_count(self) -> int:
        with self.lock:
            return sum(1 for _ in self.models_below(self.root))

    def lookup(self, parent: int, name: str) -> Attributes:
        check_length(name)
        with self.lock:
            directory = self.dir(parent)
            if name == ".":
                node = directory
            elif name == "..":
                node = directory.parent
            else:
                node = directory.children.get(name)
            if node is None:
                raise fs_error(errno.ENOENT)
            node.lookups += 1
            return node.attributes()

    def remember(self, inode: int) -> None:
        with self.lock:
            node = self.inodes.get(inode)
            if node is not None:
                node.lookups += 1

    def remember_node(self, node: Node) -> None:
        """The kernel got a reference to a node it was handed earlier (an entry of a listing), which
        may have left the tree and been dropped since: it is kept again, as a node that left the
        tree, until the kernel forgets it."""
        with self.lock:
            if self.inodes.get(node.inode) is not node:
                node.linked = False
                self.inodes[node.inode] = node
            node.lookups += 1

    def forget(self, inode: int, count: int) -> None:
        with self.lock:
            node = self.inodes.get(inode)
            if node is not None:
                node.lookups = max(0, node.lookups - count)
                self.maybe_drop(node)
        self.close_deferred()

    def getattr(self, inode: int) -> Attributes:
        with self.lock:
            return self.node(inode).attributes()

    def readdir(self, inode: int, *, dots: bool = False) -> list[tuple[str, Attributes]]:
        """The directory's entries by name; with `dots`, `.` and `..` (the root's is itself) first."""
        with self.lock:
            directory = self.dir(inode)
            entries = [(name, directory.children[name].attributes()) for name in sorted(directory.children)]
            if dots:
                entries[:0] = [(".", directory.attributes()), ("..", directory.parent.attributes())]
            return entries

    def readlink(self, inode: int) -> bytes:
        node = self.node(inode)
        if node.kind != "symlink":
            raise fs_error(errno.EINVAL)
        return node.target or b""

    def nodes_with_data(self) -> list[Node]:
        with self.lock:
            return [n for n in self.inodes.values() if n.data is not None]

    # -- new entries -----------------------------------------------------------------------------
    def free_name_in(self, parent: int, name: str) -> Node:
        """The directory `parent`, where a new entry `name` is to be made (EEXIST if one is there).
        Called under the lock."""
        directory = self.dir(parent)
        if name in directory.children:
            raise fs_error(errno.EEXIST)
        return directory

    def attach(self, directory: Node, kind: str, name: str, meta: EntryMeta, **kw) -> Node:
        """A new node joins the tree, known to the kernel (one lookup). Called under the lock."""
        node = self.new_node(kind, name, directory, meta, **kw)
        directory.children[name] = node
        directory.touch(meta.mtime_ns)
        node.lookups += 1
        return node

    # -- renames ---------------------------------------------------------------------------------
    def rename_nodes(self, parent: int, name: str, new_parent: int, new_name: str,
                     flags: int) -> tuple[Node, Node, Node, Node | None] | None:
        """(source directory, target directory, node, the node it replaces) of a rename as rename(2)
        allows it, or None for a rename of a name to itself. Called under the lock."""
        source_dir, target_dir = self.dir(parent), self.dir(new_parent)
        node = self.child(source_dir, name)
        if source_dir is target_dir and name == new_name:
            return None
        ancestor = target_dir
        while True:
            if ancestor is node:
                raise fs_error(errno.EINVAL, "a directory cannot move into itself")
            if ancestor.parent is ancestor:
                break
            ancestor = ancestor.parent
        victim = target_dir.children.get(new_name)
        if victim is not None:
            if flags & RENAME_NOREPLACE:
                raise fs_error(errno.EEXIST)
            if node.kind == "dir" and victim.kind != "dir":
                raise fs_error(errno.ENOTDIR)
            if node.kind != "dir" and victim.kind == "dir":
                raise fs_error(errno.EISDIR)
            if victim.kind == "dir" and victim.children:
                raise fs_error(errno.ENOTEMPTY)
        return source_dir, target_dir, node, victim

    def move(self, node: Node, source_dir: Node, target_dir: Node, new_name: str, victim: Node | None,
             now: int) -> None:
        """The tree's side of a rename the catalog has stored."""
        with self.lock:
            if victim is not None:
                self.detach(victim)
            del source_dir.children[node.name]
            node.name, node.parent = new_name, target_dir
            target_dir.children[new_name] = node
            source_dir.touch(now)
            target_dir.touch(now)

    def rename_models(self, node: Node, old_prefix: str, new_prefix: str) -> None:
        with self.lock:
            for n in self.models_below(node):
                n.model = new_prefix + n.model[len(old_prefix):]

    # -- leaving the tree ------------------------------------------------------------------------
    def detach(self, node: Node) -> None:
        """The node left the tree (removed here or by another process): it lives on while open or known."""
        if node.parent is not None and node.parent.children.get(node.name) is node:
            del node.parent.children[node.name]
        node.linked = False
        for child in list(node.children.values()):
            self.detach(child)
        if node.data is not None and node.data.spool_file is not None:
            node.data.spool_file.forget_record()
        self.maybe_drop(node)

    def maybe_drop(self, node: Node) -> None:
        if node.linked or node.opens or node.inode == ROOT_INODE:
            return
        # No name and no open file reach its data any more (the kernel's remaining lookups hold
        # only the inode number), so its spool's bytes go now: an unlink frees a full disk at
        # once, not whenever the kernel forgets the inode.
        self.close_later(node)
        if node.lookups == 0:
            self.inodes.pop(node.inode, None)

    def close_later(self, node: Node) -> None:
        """Under the lock: the node's data is to be closed, by close_deferred. A file's lock is
        never taken while the namespace lock is held (a commit holds its file's lock and then takes
        the namespace lock), so the close waits until the namespace lock is released."""
        if node.data is not None:
            self._to_close.append(node.data)
            node.data = None

    def close_deferred(self) -> None:
        while True:
            with self.lock:
                if not self._to_close:
                    return
                data = self._to_close.pop()
            data.close()
