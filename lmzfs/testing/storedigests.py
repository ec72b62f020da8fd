"""What a store serves, as SHA-256 digests per file: for tests that check that a change to how
bytes are stored (a chain, a rewrite pass, a kill -9) changed no served byte."""
from __future__ import annotations

import hashlib

from lmzfs.reader.archive import Archive
from lmzfs.store.layout import StorePaths


def archive_digests(archive) -> dict[str, str]:
    """"MODEL/PATH" -> SHA-256 of every file an open archive (local or remote) serves, read in
    4 MiB pieces."""
    out = {}
    for e in archive.files():
        h = hashlib.sha256()
        with archive.open(e) as r:
            for off in range(0, e.size, 1 << 22):
                h.update(r.pread(off, 1 << 22))
        out[f"{e.model}/{e.path}"] = h.hexdigest()
    return out


def served_digests(store: StorePaths, *, cache_bytes: int | None = None) -> dict[str, str]:
    """"MODEL/PATH" -> SHA-256 of every stored file, read back through a fresh reader of the store
    (cache_bytes=0: every chunk decoded afresh, none taken from a cache)."""
    archive = Archive(store.root, workers=0) if cache_bytes is None else \
        Archive(store.root, cache_bytes=cache_bytes, workers=0)
    try:
        return archive_digests(archive)
    finally:
        archive.close()
