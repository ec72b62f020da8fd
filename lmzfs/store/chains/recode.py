"""Recoding a base model's chunks as deltas against a new model's, inside that model's `lmz add`.

Users mostly read the newest checkpoint, so the newest stays coded alone and each paired chunk
of its base is recoded as a delta against the new model's chunk (the base's plain bytes, read
through a ChunkSource, coded against the new chunk's, which the add holds in hand). A recode is
kept only when its payload is smaller than the chunk's payload now. When the step would make a
chain deeper than the cap, the chunks that would sit too deep are re-anchored in the same step:
each becomes a delta against the new model's chunk, or is coded alone, whichever is smaller.

Nothing here writes the catalog's rows before the commit: payloads go to the add's pack session
(sealed with the rest before the commit) and the changes are written in the add's one
transaction (`record_recoded`), so a process killed before it leaves the catalog as it was and
the payloads as dead pack bytes.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace

from lmzfs.codecs import EncodedChunk, encode_delta_chunk
from lmzfs.codecs.base import ChunkHint
from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.catalog.chunkrows import Recode, chunk_pack, record_payloads
from lmzfs.store.chains.plan import ChainGraph
from lmzfs.store.read.chunksource import ChunkSource
from lmzfs.store.write.session import PackSession

# Decoded chunks of the base kept while recoding (a base chunk is read once; its own chain's
# references are what this holds).
_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class _Reanchor:
    payload: EncodedChunk
    against_new: bool         # a delta against the new model's chunk; False: coded alone


@dataclass(frozen=True)
class _Outcome:
    """What a recode job measured: the base chunk's delta against the new one (None: not smaller
    than its payload now, or no delta codec applies), and for each chunk to re-anchor the smaller
    of its delta against the new chunk and its coding alone."""
    delta: EncodedChunk | None
    reanchors: dict[bytes, _Reanchor]
    damaged: str | None = None


@dataclass(frozen=True)
class _Job:
    new_id: bytes             # the new model's chunk
    paired: Extent            # the stored chunk to recode against it
    reanchor: list[Extent]    # chunks that would then sit too deep


@dataclass
class RecodeTotals:
    chunks: int = 0            # base chunks recoded as deltas against the new model's
    bytes_before: int = 0      # their payload bytes before
    bytes_after: int = 0       # and after
    reanchored: int = 0        # chunks re-anchored to keep chains within the cap
    reanchor_before: int = 0
    reanchor_after: int = 0


class ChainRecoder:
    """Used by one add, from its main thread; the encoding runs on the add's pool."""

    def __init__(self, session: PackSession, depth_cap: int):
        self.catalog = session.catalog
        self.graph = ChainGraph(self.catalog, depth_cap)
        self.totals = RecodeTotals()
        self.warnings: list[str] = []
        self._session = session
        # the base's chunks keep the segmented coding a default add gives them
        self._policy = replace(session.policy, segments=True)
        self._source = ChunkSource(session.backend, _CACHE_BYTES)
        self._claimed: set[bytes] = set()         # base chunks a job was started for
        self._new: set[bytes] = set()             # chunks of the new model seen so far: never recoded
        self._window = session.window(self._land)
        self.rows: dict[bytes, Recode] = {}       # chunk -> its final new row

    def saw(self, chunk_id: bytes) -> None:
        """A chunk of the new model (new or already stored): it stays as it is."""
        self._new.add(chunk_id)

    def offer(self, new_id: bytes, data: bytes, hint: ChunkHint, paired: Extent) -> None:
        """The new model's chunk `new_id` (plain `data`) pairs with the stored chunk `paired`."""
        b = paired.chunk_id
        if b == new_id or b in self._claimed or b in self._new or self.graph.base_of(b) == new_id \
                or not self.graph.allows(b, new_id):
            # (already coded against it: a writable mount's commit of a file after a small write
            # offers every chunk again, the unchanged ones included)
            return
        self._claimed.add(b)
        deep = self.graph.over_cap(b, self.graph.depth(new_id) + 1)
        found = self.catalog.chunk_extents(deep) if deep else {}
        reanchor = [found[z] for z in deep if z in found and found[z].size == len(data)]
        if len(reanchor) != len(deep):
            return
        self._window.submit(_Job(new_id, paired, reanchor), self._measure, paired, reanchor, data, hint)

    def drain(self, keep: int) -> None:
        """Land finished jobs, oldest first, until at most `keep` are outstanding."""
        self._window.drain(keep)

    def close(self) -> None:
        self._window.cancel()
        self._source.close()

    # -- on the pool ------------------------------------------------------------------------------
    def _plain(self, e: Extent) -> bytes:
        return self._source.chunk_bytes(e)

    def _measure(self, paired: Extent, reanchor: list[Extent], data: bytes, hint: ChunkHint) -> _Outcome:
        try:
            delta = encode_delta_chunk(self._plain(paired), data, hint)
            if delta is None or len(delta.payload) >= paired.location.length:
                return _Outcome(None, {})
            out: dict[bytes, _Reanchor] = {}
            for z in reanchor:
                got = self._policy.smaller(self._plain(z), hint, data)
                out[z.chunk_id] = _Reanchor(got.encoded, got.against)
            return _Outcome(delta, out)
        except CorruptChunk as exc:
            return _Outcome(None, {}, exc.strerror)

    # -- back on the add's thread -----------------------------------------------------------------
    def _land(self, job: _Job, got: _Outcome) -> None:
        new_id, paired, b = job.new_id, job.paired, job.paired.chunk_id
        if got.damaged is not None:
            self.warnings.append(f"a stored chunk could not be read, so it was left as it is ({got.damaged}); "
                                 f"run `lmz verify`")
            return
        if got.delta is None or b in self._new or not self.graph.allows(b, new_id):
            return
        depth = self.graph.depth(new_id) + 1
        if set(self.graph.over_cap(b, depth)) != got.reanchors.keys():
            return          # the chains under it changed since the job started: leave it as it is
        for z, r in got.reanchors.items():
            if self.graph.over_cap(z, depth if r.against_new else 0):
                return      # a re-anchored chunk's own dependants would still sit too deep
        self._put(b, got.delta, new_id)
        self.totals.chunks += 1
        self.totals.bytes_before += paired.location.length
        self.totals.bytes_after += len(got.delta.payload)
        for z in job.reanchor:
            r = got.reanchors[z.chunk_id]
            self._put(z.chunk_id, r.payload, new_id if r.against_new else None)
            self.totals.reanchored += 1
            self.totals.reanchor_before += z.location.length
            self.totals.reanchor_after += len(r.payload.payload)

    def _put(self, chunk_id: bytes, enc: EncodedChunk, base: bytes | None) -> None:
        loc = self._session.append(chunk_id, enc.payload)
        self.graph.set_base(chunk_id, base)
        self.rows[chunk_id] = Recode(chunk_id, enc.codec, loc.pack, loc.offset, loc.length, base)


@dataclass(frozen=True)
class RecodedBefore:
    """What the catalog said of the recoded chunks before the commit that records their recode."""
    bases: dict[bytes, bytes | None]       # chunk -> the base it was coded against
    packs: set[int]                        # the packs that held their payloads

    @classmethod
    def of(cls, catalog: Catalog, recoded: dict[bytes, Recode]) -> "RecodedBefore":
        packs: set[int] = set()
        for cid in recoded:
            pack = chunk_pack(catalog.db, cid)
            if pack is not None:
                packs.add(pack)
        return cls({cid: catalog.chunk_base(cid) for cid in recoded}, packs)


def record_recoded(db: sqlite3.Connection, recoded: dict[bytes, Recode], before: RecodedBefore,
                   refs: dict[bytes, int]) -> None:
    """Inside a write transaction: the recoded chunks' new payloads and bases; `refs` gains the
    reference changes (a base's refs count the chunks coded against it) for the caller to apply."""
    record_payloads(db, recoded.values())
    for cid, r in recoded.items():
        if r.base is not None:
            refs[r.base] = refs.get(r.base, 0) + 1
        if before.bases[cid] is not None:
            refs[before.bases[cid]] = refs.get(before.bases[cid], 0) - 1
