"""`lmz push REMOTE`: upload what the remote lacks, then publish a snapshot of the catalog.

Order, so that a push killed at any point leaves the previous snapshot serving:
  1. the catalog is copied (SQLite's backup API) under the writer lock, and every pack holding a
     chunk the remote lacks is opened then, so a gc afterwards cannot take its bytes away;
  2. those chunks' records are uploaded as new pack objects (multipart uploads under keys with a
     new random token, two objects at a time), each followed by its record index (create-only); an upload a killed push left whole
     (its index written) is found by the next push and used instead of uploading again;
  3. the copy is rewritten to name the remote's packs and uploaded as a snapshot object;
  4. the pointer (CURRENT) is switched to it with a conditional PUT (If-Match the pointer read at
     the start, or create-only on an empty remote): of two pushes over the same snapshot one
     publishes, the other stops with RemoteConflict and is simply run again.
What a remote holds is decided by chunk id, so a push moves only chunks that are new, whatever
gc, compact or rewrite passes did to the local packs meanwhile.
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from lmzfs.killpoints import reached
from lmzfs.store.catalog.remoterows import ChunkPlace, chunk_places, copy_catalog, live_chunks, relocate
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.packs import PACK_HEADER, RECORD_HEADER, RECORD_MAGIC, ChunkLocation, read_payload
from lmzfs.store.read.packfds import PackDescriptors
from lmzfs.store.remote.format import (POINTER_KEY, IndexedRecord, Manifest, Pointer, RemoteFormatError,
                                       RemotePack, decode_index, encode_index, encode_snapshot, index_key,
                                       new_token, pack_key, parse_pack_key, snapshot_key)
from lmzfs.store.remote.objects import ObjectStore, RemoteConflict, RemoteError
from lmzfs.store.remote.scratch import push_scratch
from lmzfs.store.remote.snapshots import fetch_snapshot, read_pointer

PACK_OBJECT_BYTES = 256 << 20      # a new pack object is closed past this size
PARALLEL_OBJECTS = 2               # pack objects uploaded at once
PARTS_IN_FLIGHT = 4                # multipart parts in flight per object
PART_BYTES = 16 << 20


@dataclass
class PushResult:
    remote: str
    generation: int                # the snapshot serving now
    published: bool                # False: the remote already had this catalog and every chunk
    chunks_uploaded: int = 0
    bytes_uploaded: int = 0
    objects_uploaded: int = 0
    objects_reused: int = 0        # whole uploads a killed push left, used instead of uploading
    chunks_total: int = 0
    stored_bytes: int = 0          # payload bytes the snapshot names
    seconds: float = 0.0


@dataclass
class _Upload:
    pack_id: int
    key: str
    chunks: list[ChunkPlace]


def push(store: StorePaths, objects: ObjectStore, progress: Callable[[int, int], None] | None = None) -> PushResult:
    if not objects.url.writable:
        raise StoreError(f"{objects.url}: an http(s) remote is read-only; push to its s3:// URL")
    store.check_format()
    t0 = time.monotonic()
    state = read_pointer(objects)
    with push_scratch() as tmp:
        remote_places, manifest = _remote_state(objects, state.pointer, Path(tmp) / "remote.sqlite")
        orphans = _orphans(objects, manifest)
        leases = PackDescriptors(store)
        try:
            snap = Path(tmp) / "snapshot.sqlite"
            with WriterLock(store.lock):
                copy_catalog(store.catalog, snap)
                live = live_chunks(snap)
                missing, adopted = _missing(live, remote_places, orphans, manifest)
                fds = leases.acquire({c.pack for c in missing}) if missing else {}
            uploads = _plan(missing, manifest)
            total = sum(c.length + RECORD_HEADER.size for c in missing)
            result = PushResult(str(objects.url), manifest.generation, False, chunks_total=len(live),
                                objects_reused=adopted)
            sent = _Sent(progress, total)
            with ThreadPoolExecutor(PARALLEL_OBJECTS, thread_name_prefix="lmz-push") as pool:
                for up, records in zip(uploads, pool.map(lambda u: _upload(objects, u, fds, sent), uploads)):
                    size = len(PACK_HEADER) + sum(RECORD_HEADER.size + r.length for r in records)
                    manifest.packs[up.pack_id] = RemotePack(up.key, size)
                    for r in records:
                        remote_places[r.chunk_id] = ChunkPlace(r.chunk_id, up.pack_id, r.offset, r.length,
                                                               r.codec, r.base)
                    result.chunks_uploaded += len(records)
                    result.objects_uploaded += 1
            result.bytes_uploaded = sent.done
        finally:
            leases.close()
        needed = {remote_places[c.chunk_id].pack for c in live}
        relocate(snap, {c.chunk_id: (remote_places[c.chunk_id].pack, remote_places[c.chunk_id].offset)
                        for c in live})
        catalog = snap.read_bytes()
        result.stored_bytes = sum(remote_places[c.chunk_id].length for c in live)
        if state.pointer is not None and not uploads and _same_catalog(manifest, catalog, needed):
            result.seconds = time.monotonic() - t0
            return result                   # nothing new: the current snapshot says it all
        generation = manifest.generation + 1
        new = Manifest(generation, time.time(), manifest.next_pack,
                       {pid: p for pid, p in manifest.packs.items() if pid in needed},
                       parent=state.pointer.snapshot if state.pointer else None)
        body = encode_snapshot(new, catalog)
        key = snapshot_key(generation, new_token())
        objects.put(key, body, create=True)
        reached("push-snapshot")
        pointer = Pointer(generation, key, hashlib.sha256(body).hexdigest(), len(body), time.time())
        try:
            if state.pointer is None:
                objects.put(POINTER_KEY, pointer.encode(), create=True)
            else:
                objects.put(POINTER_KEY, pointer.encode(), if_match=state.etag)
        except RemoteConflict:
            raise RemoteConflict(f"{objects.url}: another push published a snapshot while this one ran; run "
                                 f"lmz push again (what this one uploaded is used, not uploaded again)") from None
        reached("push-published")
        result.generation, result.published = generation, True
        result.seconds = time.monotonic() - t0
        return result


def _remote_state(objects: ObjectStore, pointer: Pointer | None, scratch: Path) -> tuple[dict, Manifest]:
    """(where the current snapshot says each chunk lies, its manifest), or empty for a new remote."""
    if pointer is None:
        return {}, Manifest(0, 0.0, 1)
    manifest, catalog = fetch_snapshot(objects, pointer)
    scratch.write_bytes(catalog)
    places = chunk_places(scratch)
    scratch.unlink()
    return places, manifest


@dataclass
class _Orphans:
    """Pack objects a killed push left whole (the object and its index), which no snapshot names."""
    packs: dict[int, RemotePack]
    records: dict[bytes, list[ChunkPlace]]


def _orphans(objects: ObjectStore, manifest: Manifest) -> _Orphans:
    """Find them (and move manifest.next_pack above every id in use under packs/)."""
    listing = {o.key: o for o in objects.list("packs/")}
    named = {p.key for p in manifest.packs.values()}
    found = _Orphans({}, {})
    for key, info in sorted(listing.items()):
        parsed = parse_pack_key(key)
        if parsed is None:
            continue
        manifest.next_pack = max(manifest.next_pack, parsed[0] + 1)
        if parsed[2] != "lmzp" or key in named or index_key(key) not in listing or parsed[0] in manifest.packs:
            continue
        try:
            size, records = decode_index(objects.get(index_key(key)), f"{objects.url}/{index_key(key)}")
        except (RemoteFormatError, RemoteError):
            continue                        # a damaged or vanished index: the pack is left to prune
        if size != info.size:
            continue
        found.packs[parsed[0]] = RemotePack(key, size)
        for r in records:
            found.records.setdefault(r.chunk_id, []).append(
                ChunkPlace(r.chunk_id, parsed[0], r.offset, r.length, r.codec, r.base))
    return found


def _missing(live: list[ChunkPlace], places: dict[bytes, ChunkPlace], orphans: _Orphans,
             manifest: Manifest) -> tuple[list[ChunkPlace], int]:
    """(the live chunks the remote lacks, how many orphan pack objects serve the others). A chunk is
    on the remote when it is there by id with the same payload: one recoded since (a delta against
    a newer model, `lmz rewrite recode`) has another payload, and moves again. Updates places."""
    missing, used = [], set()
    for c in live:
        have = places.get(c.chunk_id)
        if have is not None and have.same_payload(c):
            continue
        left = next((o for o in orphans.records.get(c.chunk_id, ()) if o.same_payload(c)), None)
        if left is not None:
            places[c.chunk_id] = left
            used.add(left.pack)
        else:
            missing.append(c)
    for pid in used:
        manifest.packs[pid] = orphans.packs[pid]
    return missing, len(used)


def _plan(missing: list[ChunkPlace], manifest: Manifest) -> list[_Upload]:
    """Pack objects of one model's chunks each (in local pack order, which is the order its files
    were added in), so that a host's read-ahead along one model never fetches another's bytes,
    and a removed model's objects are wholly dead for prune."""
    uploads: list[_Upload] = []
    size, model = PACK_OBJECT_BYTES, object()
    for c in missing:
        if size + RECORD_HEADER.size + c.length > PACK_OBJECT_BYTES or c.model != model:
            pid = manifest.next_pack
            manifest.next_pack += 1
            uploads.append(_Upload(pid, pack_key(pid, new_token()), []))
            size, model = len(PACK_HEADER), c.model
        uploads[-1].chunks.append(c)
        size += RECORD_HEADER.size + c.length
    return uploads


class _Sent:
    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def add(self, n: int) -> None:
        self.done += n              # from two threads: a progress figure, not a count anything relies on
        if self.progress:
            self.progress(self.done, self.total)


def _upload(objects: ObjectStore, up: _Upload, fds: dict, sent: _Sent) -> list[IndexedRecord]:
    records: list[IndexedRecord] = []

    def body() -> Iterator[bytes]:
        offset = len(PACK_HEADER)
        yield PACK_HEADER
        for c in up.chunks:
            payload = read_payload(fds[c.pack], c.chunk_id, ChunkLocation(c.pack, c.offset, c.length))
            yield RECORD_HEADER.pack(RECORD_MAGIC, c.chunk_id, c.length) + payload
            records.append(IndexedRecord(c.chunk_id, offset + RECORD_HEADER.size, c.length, c.codec, c.base))
            offset += RECORD_HEADER.size + c.length
            sent.add(RECORD_HEADER.size + c.length)
            reached("push-record")

    # Multipart (PARTS_IN_FLIGHT parts of PART_BYTES at once, never the whole object in memory), so
    # not create-only: S3 takes no condition on a multipart upload, and none is needed, the key's
    # token being new. A push killed mid-object leaves an unfinished multipart upload, no object.
    objects.put(up.key, body(), part_bytes=PART_BYTES, parallel=PARTS_IN_FLIGHT)
    reached("push-data")
    size = len(PACK_HEADER) + sum(RECORD_HEADER.size + r.length for r in records)
    objects.put(index_key(up.key), encode_index(size, records), create=True)
    reached("push-object")
    return records


def _same_catalog(manifest: Manifest, catalog: bytes, needed: set[int]) -> bool:
    return hashlib.sha256(catalog).hexdigest() == manifest.catalog_sha256 and needed <= set(manifest.packs)
