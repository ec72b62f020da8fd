"""The tree in step with the catalog: what the catalog holds (models, files, and the writable-mount
tables of store/catalog/fsrows.py), read into the namespace at open and after another process committed.
Nodes that still stand keep their inode numbers; files not yet committed keep their place."""
from __future__ import annotations

from lmzfs.fsmodel.holes import HOLE_MIN, ZERO_RATIO, Holes, holes_of, is_zero_chunk
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, Node
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.fsrows import EntryMeta, extents_of_chunks, load_entries, load_xattrs, small_coded_chunks

# path parts -> (kind, {"model", "meta", "file_id", "size", "holes", "xattrs"}); () is the root
Wanted = dict[tuple[str, ...], tuple[str, dict]]


def reload(ns: Namespace, catalog: Catalog) -> None:
    wanted = wanted_tree(catalog, ns.uid, ns.gid)
    with ns.lock:
        _reconcile(ns, ns.root, (), wanted, _names_below(wanted))


def _parts(model: str, path: str) -> tuple[str, ...]:
    return tuple(model.split("/")) + (tuple(path.split("/")) if path else ())


def wanted_tree(catalog: Catalog, uid: int, gid: int) -> Wanted:
    db = catalog.db
    wanted: Wanted = {(): ("dir", {})}

    def ensure_dirs(parts: tuple[str, ...], model: str | None = None) -> None:
        for depth in range(1, len(parts) + 1):
            key = parts[:depth]
            kind, info = wanted.setdefault(key, ("dir", {}))
            if kind != "dir":
                return
        if model is not None:
            wanted[parts][1]["model"] = model

    for m in catalog.models():
        parts = tuple(m.name.split("/"))
        ensure_dirs(parts, m.name)
        secs = int(m.added * 1e9)
        wanted[parts][1].setdefault("meta", EntryMeta("dir", DEFAULT_DIR_MODE, uid, gid, secs, secs, secs))
    holes = stored_holes(catalog)
    for f in catalog.files():
        parts = _parts(f.model, f.path)
        ensure_dirs(parts[:-1])
        nanos = int(f.mtime * 1e9)
        wanted[parts] = ("file", {"file_id": f.id, "size": f.size, "holes": holes.get(f.id, ()),
                                  "meta": EntryMeta("file", DEFAULT_FILE_MODE, uid, gid, nanos, nanos, nanos)})
    for row in load_entries(db):
        parts = _parts(row.model, row.path)
        if row.meta.kind == "file":
            if parts in wanted and wanted[parts][0] == "file":
                wanted[parts][1]["meta"] = row.meta
            continue
        if row.meta.kind == "dir":
            ensure_dirs(parts)
        else:
            ensure_dirs(parts[:-1])
            wanted[parts] = ("symlink", {})
        if wanted.get(parts, ("", {}))[0] == row.meta.kind:
            wanted[parts][1]["meta"] = row.meta
    for x in load_xattrs(db):
        parts = _parts(x.model, x.path)
        if parts in wanted:
            wanted[parts][1].setdefault("xattrs", {})[bytes(x.name)] = bytes(x.value)
    return wanted


def stored_holes(catalog: Catalog) -> dict[int, Holes]:
    """file id -> its holes, of every stored file that has any (fsmodel/holes.py)."""
    zeros = [cid for cid, size in small_coded_chunks(catalog.db, HOLE_MIN, ZERO_RATIO) if is_zero_chunk(cid, size)]
    if not zeros:
        return {}
    by_file: dict[int, list[tuple[int, int, bytes]]] = {}
    for file_id, offset, size, cid in extents_of_chunks(catalog.db, zeros):
        by_file.setdefault(file_id, []).append((offset, size, cid))
    return {file_id: holes_of(sorted(rows)) for file_id, rows in by_file.items()}


def _names_below(wanted: Wanted) -> dict[tuple[str, ...], set[str]]:
    below: dict[tuple[str, ...], set[str]] = {}
    for key in wanted:
        if key:
            below.setdefault(key[:-1], set()).add(key[-1])
    return below


def _reconcile(ns: Namespace, directory: Node, parts: tuple[str, ...], wanted: Wanted,
               below: dict[tuple[str, ...], set[str]]) -> None:
    info = wanted[parts][1]
    directory.model = info.get("model")
    if "meta" in info:
        directory.apply_meta(info["meta"])
    directory.xattrs = dict(info.get("xattrs", {}))
    names = below.get(parts, set())
    for name in list(directory.children):
        child = directory.children[name]
        if name in names:
            kind, cinfo = wanted[parts + (name,)]
            if child.kind == kind and (kind != "file" or child.file_id == cinfo.get("file_id")):
                continue
        elif child.kind == "file" and child.file_id is None:
            continue                    # not committed yet: the catalog cannot know it
        ns.detach(child)
    for name in sorted(names):
        kind, cinfo = wanted[parts + (name,)]
        child = directory.children.get(name)
        if child is None:
            child = ns.new_node(kind, name, directory, cinfo.get("meta"), file_id=cinfo.get("file_id"),
                                size=cinfo.get("size", 0), holes=cinfo.get("holes", ()))
            directory.children[name] = child
        elif kind == "file" and child.data is None:
            child.size = cinfo["size"]
        if kind == "dir":
            _reconcile(ns, child, parts + (name,), wanted, below)
        else:
            if "meta" in cinfo and child.data is None:
                child.apply_meta(cinfo["meta"])
            child.xattrs = dict(cinfo.get("xattrs", {}))
