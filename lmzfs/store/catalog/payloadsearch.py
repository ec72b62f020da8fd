"""Where each chunk of a restored catalog copy lies now, for `lmz verify --repair`.

A copy may be older than the payloads in the packs: since it was written an add may have recoded
chunks as deltas, a rewrite pass may have given them new payloads (alone again, against their
reference, or against another chunk), and gc or compact may have moved or dropped the old ones.
A chunk's id is its plain bytes, so whichever payload decodes to bytes with that SHA-256 serves
it; what the catalog must learn is that payload's place, codec and reference.

Three sources say where a chunk's payload may be, tried newest first: the damaged catalog's own
row for the chunk (as far as its file still reads), each record of the chunk in the packs (the
highest pack, then the furthest offset first: packs and records are only ever appended), and the
copy's row. A payload's header names its codec; a delta payload needs its reference, which only
a catalog row can name (the damaged catalog's or the copy's). A chunk whose copy row names a record
that is there, and which no newer row contradicts, is taken as it is without decoding, as before
chains: a record never changes once written. Every other answer is decoded and checked against
the chunk's id before it is taken, so nothing the damaged file says is trusted.

A delta payload may be coded against a chunk the copy does not hold at all (the newest model of a
chain, added after the copy: its add recoded its base against it). If the damaged catalog still
names that reference and its payload decodes to its id, it is brought back as a chunk row, kept
as a reference: the models it belonged to are not in the copy, but the older ones read again.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import xxhash

from lmzfs.codecs import REGISTRY, Codec, CodecError, decode_chunk, parse_payload
from lmzfs.store.catalog.check import PackIndex
from lmzfs.store.catalog.chunkrows import Recode
from lmzfs.store.catalog.salvage import SalvagedModel, scratch_open
from lmzfs.store.layout import StorePaths
from lmzfs.store.packs import ChunkLocation, PackDamaged, read_payload
from lmzfs.store.catalog.uri import READ_ERRORS

# Plain bytes of decoded chunks kept while searching (references of the chunks still to place).
_PLAIN_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class RowsRead:
    """Chunk rows of a catalog file, and each chunk's plain size."""
    rows: dict[bytes, Recode] = field(default_factory=dict)
    sizes: dict[bytes, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BroughtBack:
    """A chunk the restored copy does not hold that a chunk of it is coded against (a reference
    made since the copy, named by the damaged catalog): its row is to be inserted."""
    size: int
    row: Recode
    xxh3: bytes


@dataclass(frozen=True)
class Placement:
    changed: dict[bytes, Recode]        # chunk -> the payload that now serves it, where the copy's row does not
    lost: set[bytes]                    # chunks no payload of which decodes to their bytes
    brought_back: dict[bytes, BroughtBack]
    recovered: list[SalvagedModel] = field(default_factory=list)    # salvaged models the packs bear out


def location_of(row: Recode) -> ChunkLocation:
    return ChunkLocation(row.pack, row.offset, row.length)


def _rows(db: sqlite3.Connection) -> Iterator[tuple[bytes, int, Recode]]:
    """(id, plain size, payload row) of each chunk row; stops at the first that cannot be read."""
    has_base = "base" in {r[1] for r in db.execute("PRAGMA table_info(chunks)")}
    for cid, size, codec, pack, offset, length, base in db.execute(
            f"SELECT id, size, codec, pack, offset, length, {'base' if has_base else 'NULL'} FROM chunks"):
        if isinstance(cid, bytes) and len(cid) == 32 and isinstance(codec, str) and \
                all(isinstance(v, int) for v in (size, pack, offset, length)) and \
                (base is None or isinstance(base, bytes) and len(base) == 32):
            yield cid, size, Recode(cid, codec, pack, offset, length, base)


def salvage_chunk_rows(path: Path | None) -> RowsRead:
    """The chunk rows a damaged catalog file still yields, read until the first error; rows
    whose values have the wrong types are skipped. Nothing here is trusted: each is decoded
    and checked before it is used. The file (with its -wal) is read from a scratch copy, so that
    nothing SQLite writes when it opens one lands beside the damaged file kept for inspection."""
    out = RowsRead()
    if path is None or not path.exists():
        return out
    with scratch_open(path) as db:
        if db is None:
            return out
        try:
            for cid, size, row in _rows(db):
                out.rows[cid], out.sizes[cid] = row, size
        except READ_ERRORS:
            pass        # what was read before the damage stands
    return out


class _Search:
    def __init__(self, store: StorePaths, restored: RowsRead, salvaged: RowsRead, index: PackIndex):
        self.store = store
        self.rows = restored.rows
        # a chunk only the damaged catalog names has its size from there (checked by the decode)
        self.sizes = {**salvaged.sizes, **restored.sizes}
        self.salvaged = salvaged.rows
        self.index = index
        self.placed: dict[bytes, Recode] = {}
        self.lost: set[bytes] = set()
        self._busy: set[bytes] = set()          # chunks being placed (a reference loop is no answer)
        self._plain: OrderedDict[bytes, bytes] = OrderedDict()
        self._plain_bytes = 0
        self._fds: dict[int, int] = {}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)

    def trusted(self, cid: bytes) -> bool:
        """The copy's row names a record in its pack and no newer row says otherwise."""
        row = self.rows.get(cid)
        newer = self.salvaged.get(cid)
        return row is not None and location_of(row) in self.index.records.get(cid, ()) and \
            (newer is None or newer == row)

    def place(self, cid: bytes) -> Recode | None:
        if cid in self.placed:
            return self.placed[cid]
        if cid not in self.sizes:
            self._size_from_records(cid)
        if cid in self.lost or cid in self._busy or cid not in self.sizes:
            return None
        self._busy.add(cid)
        try:
            if self.trusted(cid):
                self.placed[cid] = self.rows[cid]
                return self.placed[cid]
            for candidate in self._candidates(cid):
                plain = self._decode(candidate)
                if plain is not None:
                    self.placed[cid] = candidate
                    self._keep(cid, plain)
                    return candidate
            self.lost.add(cid)
            return None
        finally:
            self._busy.discard(cid)

    def _candidates(self, cid: bytes) -> list[Recode]:
        """Rows that may serve the chunk, newest source first; the codec of a pack record is read
        off its payload, the reference of a delta one from the rows that name one."""
        row, newer = self.rows.get(cid), self.salvaged.get(cid)
        bases = [b for b in dict.fromkeys([r.base for r in (newer, row) if r is not None]) if b is not None]
        out: list[Recode] = [] if newer is None else [newer]
        for loc in sorted(self.index.records.get(cid, ()), key=lambda l: (l.pack, l.offset), reverse=True):
            codec = self._codec_of(cid, loc)
            if codec is None:
                continue
            out.extend(Recode(cid, codec.name, loc.pack, loc.offset, loc.length, b)
                       for b in (bases if codec.reference else [None]))
        if row is not None:
            out.append(row)
        return list(dict.fromkeys(out))

    def _size_from_records(self, cid: bytes) -> None:
        """A chunk no catalog row gives a size: the plain size its payloads' headers record
        (checked, like everything here, by the decode against its id)."""
        for loc in self.index.records.get(cid, ()):
            payload = self._payload(cid, loc)
            try:
                size = parse_payload(payload).size if payload is not None else None
            except CodecError:
                continue
            if size is not None:
                self.sizes[cid] = size
                return

    def bears_out(self, model: SalvagedModel) -> bool:
        """Every file of the model tiles with chunks that decode from the packs, and its bytes so
        assembled have the SHA-256 its row records."""
        for f in model.files:
            whole = hashlib.sha256()
            end = 0
            for offset, cid in f.extents:
                plain = self.plain(cid) if offset == end and self.place(cid) is not None else None
                if plain is None:
                    return False
                whole.update(plain)
                end += len(plain)
            if end != f.size or whole.hexdigest() != f.sha256:
                return False
        return True

    def _fd(self, pack: int) -> int:
        if pack not in self._fds:
            self._fds[pack] = os.open(self.store.pack(pack), os.O_RDONLY)
        return self._fds[pack]

    def _payload(self, cid: bytes, loc: ChunkLocation) -> memoryview | None:
        try:
            return read_payload(self._fd(loc.pack), cid, loc)
        except (OSError, PackDamaged):
            return None

    def _codec_of(self, cid: bytes, loc: ChunkLocation) -> Codec | None:
        payload = self._payload(cid, loc)
        if payload is None:
            return None
        try:
            return REGISTRY[parse_payload(payload).codec_id]
        except (CodecError, KeyError):
            return None

    def _decode(self, row: Recode) -> bytes | None:
        """The chunk's plain bytes through this row, if they are the bytes of its id."""
        cid, size = row.chunk_id, self.sizes[row.chunk_id]
        payload = self._payload(cid, location_of(row))
        if payload is None:
            return None
        ref = None
        if row.base is not None:
            if self.sizes.get(row.base) != size or self.place(row.base) is None:
                return None
            ref = self.plain(row.base)
            if ref is None:
                return None
        try:
            plain = bytes(decode_chunk(payload, size, hash_checked=True, ref=ref))
        except (CodecError, ValueError):
            return None
        return plain if hashlib.sha256(plain).digest() == cid else None

    def plain(self, cid: bytes) -> bytes | None:
        """A placed chunk's plain bytes (decoded again if they were let go)."""
        if cid in self._plain:
            self._plain.move_to_end(cid)
            return self._plain[cid]
        row = self.placed.get(cid)
        plain = None if row is None else self._decode(row)
        if plain is not None:
            self._keep(cid, plain)
        return plain

    def _keep(self, cid: bytes, plain: bytes) -> None:
        self._plain[cid] = plain
        self._plain_bytes += len(plain)
        while self._plain_bytes > _PLAIN_CACHE_BYTES and len(self._plain) > 1:
            _, old = self._plain.popitem(last=False)
            self._plain_bytes -= len(old)


def place_chunks(store: StorePaths, db: sqlite3.Connection, salvaged: RowsRead, index: PackIndex,
                 models: list[SalvagedModel] = ()) -> Placement:
    """For every chunk row of `db` (the restored copy), the payload that serves it now, and the
    references it needs that the copy does not hold; and of the salvaged `models` (not in the
    copy), those the packs bear out, with the chunks they need brought back."""
    restored = RowsRead()
    for cid, size, row in _rows(db):
        restored.rows[cid], restored.sizes[cid] = row, size
    rows = restored.rows
    search = _Search(store, restored, salvaged, index)
    try:
        for cid in sorted(rows):
            search.place(cid)
        recovered = [m for m in models if search.bears_out(m)]
        back = {}
        for cid in sorted(search.placed.keys() - rows.keys()):
            plain = search.plain(cid)
            if plain is not None:
                back[cid] = BroughtBack(search.sizes[cid], search.placed[cid], xxhash.xxh3_128_digest(plain))
    finally:
        search.close()
    changed = {cid: row for cid, row in search.placed.items() if cid in rows and row != rows[cid]}
    return Placement(changed, set(rows.keys() - search.placed.keys()), back, recovered)
