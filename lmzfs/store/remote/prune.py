"""`lmz push --prune`: delete what no recent snapshot names.

A snapshot is kept while it is the current one or younger than the grace period (default one
hour: a host polling every 30 s has long moved on from a snapshot by then, and a file it opened
under an older one keeps its packs that long). Every pack object (and its index) that a kept
snapshot names is kept; any other pack object older than the grace period goes, and so does any
snapshot not kept. Objects younger than the grace period are never deleted, so a push running
meanwhile (whose uploads no snapshot names yet) loses nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from lmzfs.store.remote.format import index_key, parse_pack_key, parse_snapshot_key
from lmzfs.store.remote.objects import ObjectStore, RemoteError
from lmzfs.store.remote.snapshots import read_manifest, read_pointer

DEFAULT_GRACE_S = 3600.0


@dataclass
class PruneResult:
    snapshots_kept: int = 0     # the newest one and those younger than the grace period
    snapshots_deleted: int = 0
    objects_deleted: int = 0    # pack and index objects no kept snapshot names
    bytes_deleted: int = 0


def prune(objects: ObjectStore, grace_s: float = DEFAULT_GRACE_S, now: float | None = None) -> PruneResult:
    state = read_pointer(objects)
    if state.pointer is None:
        raise RemoteError(f"{objects.url}: nothing has been pushed there yet; nothing to prune")
    now = time.time() if now is None else now
    cutoff = now - grace_s
    result = PruneResult()
    kept_packs: set[str] = set()
    doomed = []
    for info in objects.list("snapshots/"):
        if parse_snapshot_key(info.key) is None:
            continue                            # not ours: left alone
        if info.key == state.pointer.snapshot or info.modified > cutoff:
            manifest = read_manifest(objects, info.key)
            kept_packs.update(p.key for p in manifest.packs.values())
            result.snapshots_kept += 1
        else:
            doomed.append(info)
            result.snapshots_deleted += 1
    kept = kept_packs | {index_key(k) for k in kept_packs}
    for info in objects.list("packs/"):
        if parse_pack_key(info.key) is None or info.key in kept or info.modified > cutoff:
            continue
        doomed.append(info)
    # packs first, snapshots last: a prune killed half way leaves snapshots whose packs may be
    # gone, but only snapshots no host should still be reading
    doomed.sort(key=lambda i: i.key.startswith("snapshots/"))
    for i in range(0, len(doomed), 500):
        batch = doomed[i:i + 500]
        objects.delete([o.key for o in batch])
        result.objects_deleted += sum(1 for o in batch if not o.key.startswith("snapshots/"))
        result.bytes_deleted += sum(o.size for o in batch)
    return result
