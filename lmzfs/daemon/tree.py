"""The directory tree the daemon serves, built from ``archive.files()``; no FUSE in here.

Layout: the root holds one directory per model ("run1/step-1000" nests as run1/step-1000/), and
each model directory holds the model's files under their own subdirectories.

Inode numbers are stable: a directory keeps its number for as long as its path exists, and a file
keeps its number for as long as its path holds the same content (same sha256, size and mtime).
A path that disappears, or a file whose content changes, gets a fresh number, and numbers are
never reused during the daemon's life. The files are opened with ``keep_cache``, so the kernel's
page cache is tied to an inode number: a number must never stand for different bytes.

Beside the models, the hidden directory /.hf holds the store in the Hugging Face hub cache's
layout (lmzfs/reader/hfview.py builds it): blobs are file nodes over the models' entries, refs are
small generated files, snapshot files are symlinks into blobs/.

Nodes that left the tree but are still known to the kernel (lookup count above zero, e.g. an open
file of a removed model) are kept as "retired" until the kernel forgets them, so getattr on them
still answers; they report nlink 0, like an unlinked file.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from lmzfs.reader.api import FileEntry, StoreError
from lmzfs.reader.hfview import TOP as HF_TOP
from lmzfs.reader.hfview import ViewItem, hub_items

log = logging.getLogger(__name__)

ROOT_INODE = 1     # what FUSE calls the root (pyfuse3.ROOT_INODE)
VIRTUAL_DIR = ".lmzfs"
VIRTUAL_FILES = {"stats.json": "stats"}


@dataclass(eq=False)
class Node:
    inode: int
    name: str                          # last path component ("" for the root)
    parent: int                        # parent's inode; the root is its own parent
    path: str                          # full path below the mountpoint, "" for the root
    entry: FileEntry | None = None     # None for a directory
    children: dict[str, Node] = field(default_factory=dict)
    mtime: float = 0.0
    retired: bool = False              # no longer in the tree, kept while the kernel knows it
    virtual: str | None = None         # a file the daemon generates ("stats"), not a stored one
    hidden: bool = False               # found by lookup, left out of listings (/.lmzfs, /.hf)
    target: str | None = None          # a symlink's target (the /.hf view's snapshot files)
    data: bytes | None = None          # a generated file's fixed bytes (the /.hf view's refs)

    @property
    def is_dir(self) -> bool:
        return self.entry is None and self.virtual is None and self.target is None

    @property
    def is_symlink(self) -> bool:
        return self.target is not None

    @property
    def size(self) -> int:
        if self.target is not None:
            return len(self.target.encode())
        if self.data is not None:
            return len(self.data)
        return 0 if self.entry is None else self.entry.size

    @property
    def nlink(self) -> int:
        if self.retired:
            return 0
        if self.is_dir:
            return 2 + sum(1 for child in self.children.values() if child.is_dir and not child.hidden)
        return 1


@dataclass(frozen=True)
class Removal:
    """A name that left the tree; the kernel may still have it cached."""
    parent: int
    name: str
    inode: int
    is_dir: bool


def _components(entry: FileEntry) -> list[str] | None:
    parts = entry.model.split("/") + entry.path.split("/")
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    return parts


class DirectoryTree:
    def __init__(self) -> None:
        self._created = time.time()          # mtime of an empty root
        self._next_inode = ROOT_INODE + 1
        self._keys: dict[tuple, int] = {}    # identity key of each live node -> its inode
        self._live: dict[int, Node] = {}
        self._retired: dict[int, Node] = {}
        self._lookups: Counter[int] = Counter()
        self.generation: object = None       # archive generation the tree was built from
        self.hf_failure: str | None = None   # why the /.hf view is left out, if it is
        self.rebuild([])

    # -- building ---------------------------------------------------------------------------

    def refresh(self, archive) -> list[Removal] | None:
        """Rebuild from *archive* if its generation changed; None if nothing changed, else the
        names that disappeared (topmost ones only: a removed directory stands for its subtree)."""
        generation = archive.generation()
        if generation == self.generation:
            return None
        # Read the generation before the files: if the store changes in between, the next
        # refresh sees a newer generation and rebuilds again.
        files = archive.files()
        revisions = []
        hf_revisions = getattr(archive, "hf_revisions", None)
        if hf_revisions is not None:
            try:
                revisions = hf_revisions()
                self.hf_failure = None
            except StoreError as exc:       # e.g. tables of a newer version: serve the models alone
                if str(exc) != self.hf_failure:
                    log.error("the .hf view is left out: %s", exc)
                self.hf_failure = str(exc)
        removals = self.rebuild(files, hub_items(revisions, files) if revisions else [])
        self.generation = generation
        return removals

    def rebuild(self, files: list[FileEntry], view: list[ViewItem] = ()) -> list[Removal]:
        old_keys, old_live = self._keys, self._live
        self._keys, self._live = {}, {}
        root = Node(ROOT_INODE, "", ROOT_INODE, "", mtime=self._created)
        self._keys[("dir", "")] = ROOT_INODE
        self._live[ROOT_INODE] = root

        def inode_for(key: tuple) -> int:
            inode = old_keys.get(key)
            if inode is None:
                inode = self._next_inode
                self._next_inode += 1
            self._keys[key] = inode
            return inode

        # Sorted, so that when two entries claim the same path the same one wins every time.
        for entry in sorted(files, key=lambda e: (e.model, e.path)):
            parts = _components(entry)
            if parts is None:
                log.warning("skipping %r/%r: not a valid path", entry.model, entry.path)
                continue
            directory = self._make_directories(root, parts[:-1], inode_for)
            if directory is None:
                log.warning("skipping %s/%s: a file is in the way of its directory", entry.model, entry.path)
                continue
            name, path = parts[-1], "/".join(parts)
            if name in directory.children:
                log.warning("skipping %s/%s: %s already exists", entry.model, entry.path, path)
                continue
            key = ("file", path, entry.sha256, entry.size, entry.mtime)
            node = Node(inode_for(key), name, directory.inode, path, entry=entry, mtime=entry.mtime)
            directory.children[name] = node
            self._live[node.inode] = node

        self._add_hf_view(root, view, inode_for)
        self._set_directory_mtimes(root)
        self._add_virtual_files(root, inode_for)
        return self._retire_removed(old_live)

    def _add_hf_view(self, root: Node, view: list[ViewItem], inode_for) -> None:
        # /.hf is reserved like /.lmzfs (model names may not start with it) and hidden from
        # listings of the root; it is there once some model has a Hugging Face origin.
        if not view:
            return
        if HF_TOP in root.children:
            log.warning("a model named %s is in the way of the .hf view; it is left out", HF_TOP)
            return
        for item in view:
            parts = item.path.split("/")
            directory = self._make_directories(root, parts[:-1], inode_for)
            if directory is None or parts[-1] in directory.children:
                log.warning("skipping %s in the .hf view: something is in the way", item.path)
                continue
            if item.entry is not None:
                e = item.entry
                key = ("file", item.path, e.sha256, e.size, e.mtime)
            else:
                key = ("hf", item.path, item.target, item.data)
            node = Node(inode_for(key), parts[-1], directory.inode, item.path, entry=item.entry, mtime=item.mtime,
                        virtual="data" if item.data is not None else None, target=item.target, data=item.data)
            directory.children[node.name] = node
            self._live[node.inode] = node
        root.children[HF_TOP].hidden = True
    def _add_virtual_files(self, root: Node, inode_for) -> None:
        # /.lmzfs/ is reserved (model names may not start with it): the mount's own files. It is
        # hidden from listings, so a listing of the root is exactly the models.
        meta = self._make_directories(root, [VIRTUAL_DIR], inode_for)
        meta.mtime, meta.hidden = self._created, True
        for name, kind in VIRTUAL_FILES.items():
            path = f"{VIRTUAL_DIR}/{name}"
            node = Node(inode_for(("virtual", path)), name, meta.inode, path, mtime=self._created, virtual=kind)
            meta.children[name] = node
            self._live[node.inode] = node

    def _make_directories(self, root: Node, names: list[str], inode_for) -> Node | None:
        """The directory at root/names..., created as needed; None if a file is in the way."""
        directory = root
        for depth, name in enumerate(names, start=1):
            child = directory.children.get(name)
            if child is None:
                path = "/".join(names[:depth])
                child = Node(inode_for(("dir", path)), name, directory.inode, path)
                directory.children[name] = child
                self._live[child.inode] = child
            elif not child.is_dir:
                return None
            directory = child
        return directory

    def _set_directory_mtimes(self, node: Node) -> float:
        # A directory shows the newest mtime below it: deterministic, and it moves when models
        # are added, which is what `ls -lt` users expect.
        if node.is_dir and node.children:
            node.mtime = max(self._set_directory_mtimes(child) for child in node.children.values())
        return node.mtime

    def _retire_removed(self, old_live: dict[int, Node]) -> list[Removal]:
        removals = []
        for inode, node in old_live.items():
            if inode in self._live:
                continue
            node.retired = True
            if self._lookups[inode] > 0:
                self._retired[inode] = node
            # Only the topmost removed name needs invalidating; the kernel drops the subtree.
            if node.parent in self._live:
                removals.append(Removal(node.parent, node.name, inode, node.is_dir))
        return removals

    # -- queries ----------------------------------------------------------------------------

    def get(self, inode: int) -> Node | None:
        """The node with this inode, live or retired."""
        return self._live.get(inode) or self._retired.get(inode)

    def lookup(self, parent_inode: int, name: str) -> Node | None:
        parent = self._live.get(parent_inode)
        if parent is None or not parent.is_dir:
            return None
        if name == ".":
            return parent
        if name == "..":
            return self._live.get(parent.parent)
        return parent.children.get(name)

    def children(self, inode: int) -> list[Node]:
        """A directory's entries sorted by name; empty for a retired or unknown directory."""
        node = self._live.get(inode)
        if node is None or not node.is_dir:
            return []
        return [node.children[name] for name in sorted(node.children) if not node.children[name].hidden]

    def lookup_count(self, inode: int) -> int:
        return self._lookups[inode]

    def __len__(self) -> int:
        return len(self._live)

    # -- the kernel's references ------------------------------------------------------------

    def remember(self, node: Node) -> None:
        """The kernel got a reference to *node* (lookup, or an entry of readdirplus)."""
        self._lookups[node.inode] += 1
        if node.inode not in self._live:
            node.retired = True
            self._retired[node.inode] = node

    def forget(self, inode: int, count: int) -> None:
        left = self._lookups[inode] - count
        if left > 0:
            self._lookups[inode] = left
            return
        del self._lookups[inode]
        self._retired.pop(inode, None)
