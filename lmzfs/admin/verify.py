"""`lmz verify`: decode every chunk, check every chunk's SHA-256 id and read checksum and every
whole-file SHA-256, and name each damaged file. Read-only: it takes no lock and runs beside a
mount or an add.

Every decode is checked against the chunk's id, and a chunk is served again (to another file that
shares it, or to the delta chunks coded against it) only from this run's own cache of chunks it
decoded and checked, so nothing is taken on trust from before the run. The cache is what keeps a
chain's cost linear: without it a base is decoded again for every chunk that needs it, down the
chain. While the chains' chunks fit it, each stored chunk is decoded exactly once; past that, a
base pushed out (least recently used) before its last dependant is read is decoded again."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

from lmzfs.errors import CorruptChunk
from lmzfs.reader.archive import Archive
from lmzfs.store.catalog import Catalog, CatalogDamaged
from lmzfs.store.catalog.check import diagnose
from lmzfs.store.layout import StoreError, StorePaths


@dataclass(frozen=True)
class Damage:
    model: str
    path: str
    reason: str


# Decoded chunks a verify keeps (least recently used out first); a mount's cache is separate.
VERIFY_CACHE_BYTES = 256 << 20


@dataclass
class VerifyReport:
    files: int = 0
    bytes: int = 0
    chunks_decoded: int = 0             # decodes this run did (a chunk decoded twice counts twice)
    damaged: list[Damage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged


def verify_store(store: StorePaths, model: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 cache_bytes: int = VERIFY_CACHE_BYTES) -> VerifyReport:
    store.check_format()
    verdict = diagnose(store, check_packs=False)
    if not verdict.sound:
        raise CatalogDamaged(store.catalog, verdict.problem)
    catalog = Catalog(store.catalog, readonly=True)
    try:
        if model is not None and catalog.model(model) is None:
            raise StoreError(f"no model named {model!r} (see `lmz ls`)")
    finally:
        catalog.close()
    # Each decode is checked against the chunk's SHA-256 id as well as the read checksum the mount
    # checks; the cache holds only what this run decoded and checked.
    archive = Archive(store.root, cache_bytes=cache_bytes, workers=0, check_ids=True)
    try:
        return verify_archive(archive, model, progress)
    finally:
        archive.close()


def verify_remote(options, model: str | None = None, progress: Callable[[int, int], None] | None = None,
                  cache_bytes: int = VERIFY_CACHE_BYTES) -> VerifyReport:
    """`lmz verify --remote`: every chunk of the remote's current snapshot fetched (through this
    host's cache, whose blocks are checked too) and checked as verify_store checks a local one."""
    from lmzfs.reader.remotearchive import RemoteArchive
    archive = RemoteArchive(options, cache_bytes=cache_bytes, workers=0, check_ids=True)
    try:
        if model is not None and not any(e.model == model for e in archive.files()):
            raise StoreError(f"no model named {model!r} in {archive.url} (see `lmz ls --remote`)")
        return verify_archive(archive, model, progress)
    finally:
        archive.close()


def verify_archive(archive: Archive, model: str | None, progress: Callable[[int, int], None] | None) -> VerifyReport:
    report = VerifyReport()
    entries = [e for e in archive.files() if model is None or e.model == model]
    total = sum(e.size for e in entries)
    for entry in entries:
        report.files += 1
        try:
            with archive.open(entry) as reader:
                whole = hashlib.sha256()
                for off in range(0, entry.size, 1 << 22):
                    block = reader.pread(off, 1 << 22)
                    whole.update(block)
                    report.bytes += len(block)
                    if progress:
                        progress(report.bytes, total)
            if whole.hexdigest() != entry.sha256:
                report.damaged.append(Damage(entry.model, entry.path, "whole-file SHA-256 differs from the catalog"))
        except CorruptChunk as exc:
            report.damaged.append(Damage(entry.model, entry.path, exc.strerror))
        except FileNotFoundError:
            continue    # removed while we were verifying
    report.chunks_decoded = archive.counters.chunks_decoded
    return report
