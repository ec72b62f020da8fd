"""Reading a remote store's pointer and snapshots: what push publishes over, and what a host
mounts. A snapshot's catalog is written into the host's cache directory (catalogs/), checked
against the pointer's SHA-256 and the manifest's, and opened read-only from there; a cached one
is used again without a fetch, and the newest lets a host start while the engine is down."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from lmzfs.store.remote.format import (POINTER_KEY, Manifest, Pointer, RemoteFormatError, decode_snapshot,
                                       snapshot_manifest)
from lmzfs.store.remote.objects import ObjectStore, RemoteMissing

KEEP_CATALOGS = 3          # catalogs kept in a host's cache directory


@dataclass(frozen=True)
class PointerState:
    pointer: Pointer | None     # None: nothing pushed yet
    etag: str | None


@dataclass(frozen=True)
class OpenedSnapshot:
    pointer: Pointer
    manifest: Manifest
    catalog: Path               # the snapshot's catalog, a file in the cache directory


def read_pointer(objects: ObjectStore) -> PointerState:
    try:
        raw, etag = objects.get_if_changed(POINTER_KEY, None)
    except RemoteMissing:
        return PointerState(None, None)
    return PointerState(Pointer.decode(raw, f"{objects.url}/{POINTER_KEY}"), etag)


def poll_pointer(objects: ObjectStore, etag: str | None) -> PointerState | None:
    """The pointer if it changed since `etag` (one conditional GET), else None."""
    try:
        got = objects.get_if_changed(POINTER_KEY, etag)
    except RemoteMissing:
        return PointerState(None, None) if etag is not None else None
    if got is None:
        return None
    return PointerState(Pointer.decode(got[0], f"{objects.url}/{POINTER_KEY}"), got[1])


def fetch_snapshot(objects: ObjectStore, pointer: Pointer) -> tuple[Manifest, bytes]:
    where = f"{objects.url}/{pointer.snapshot}"
    raw = objects.get(pointer.snapshot)
    if len(raw) != pointer.size or hashlib.sha256(raw).hexdigest() != pointer.sha256:
        raise RemoteFormatError(f"{where}: the snapshot does not match the pointer's checksum")
    return decode_snapshot(raw, where)


def read_manifest(objects: ObjectStore, key: str) -> Manifest:
    """A snapshot's manifest alone (a ranged GET of its head), for prune."""
    head = bytes(objects.get_range(key, 0, min(objects.head(key).size, 1 << 20)))
    try:
        return snapshot_manifest(head, f"{objects.url}/{key}")[0]
    except RemoteFormatError:
        return snapshot_manifest(objects.get(key), f"{objects.url}/{key}")[0]


def open_snapshot(objects: ObjectStore, pointer: Pointer, cache_dir: Path) -> OpenedSnapshot:
    """The snapshot's catalog as a file under cache_dir/catalogs (fetched unless already there)."""
    folder = cache_dir / "catalogs"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{pointer.generation:012d}-{pointer.sha256[:16]}"
    path, meta = folder / f"{name}.sqlite", folder / f"{name}.manifest"
    if path.exists() and meta.exists():
        try:
            manifest = Manifest.from_json(meta.read_bytes(), str(meta))
            if manifest.catalog_bytes == path.stat().st_size:
                _mark_latest(folder, pointer)
                return OpenedSnapshot(pointer, manifest, path)
        except (RemoteFormatError, OSError):
            pass
    manifest, catalog = fetch_snapshot(objects, pointer)
    _write(path, catalog)
    _write(meta, manifest.to_json())
    _mark_latest(folder, pointer)
    _trim(folder, keep=name)
    return OpenedSnapshot(pointer, manifest, path)


def _mark_latest(folder: Path, pointer: Pointer) -> None:
    """`latest` names the snapshot opened last (what a host starting offline serves), whatever its
    generation: a remote emptied and pushed again starts over at generation 1."""
    encoded = pointer.encode()
    try:
        if (folder / "latest").read_bytes() == encoded:
            return
    except OSError:
        pass
    _write(folder / "latest", encoded)


def cached_snapshot(cache_dir: Path) -> OpenedSnapshot | None:
    """The newest snapshot this cache directory holds, for a host starting while the engine is down."""
    folder = cache_dir / "catalogs"
    try:
        pointer = Pointer.decode((folder / "latest").read_bytes(), str(folder / "latest"))
        name = f"{pointer.generation:012d}-{pointer.sha256[:16]}"
        manifest = Manifest.from_json((folder / f"{name}.manifest").read_bytes(), name)
        path = folder / f"{name}.sqlite"
        if path.stat().st_size != manifest.catalog_bytes or \
                hashlib.sha256(path.read_bytes()).hexdigest() != manifest.catalog_sha256:
            return None
        return OpenedSnapshot(pointer, manifest, path)
    except (OSError, RemoteFormatError):
        return None


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _trim(folder: Path, keep: str) -> None:
    """Keep `keep` (the catalog just written) and the most recently written others, KEEP_CATALOGS in
    all; by write time, not generation, so a catalog just written is never the one trimmed. An open
    catalog stays readable after its unlink."""
    written = []
    for p in folder.glob("*.sqlite"):
        name = p.name[:-len(".sqlite")]
        if name != keep:
            try:
                written.append((p.stat().st_mtime_ns, name))
            except OSError:
                pass
    for _, old in sorted(written)[:max(0, len(written) - (KEEP_CATALOGS - 1))]:
        for p in folder.glob(f"{old}.*"):
            p.unlink(missing_ok=True)
