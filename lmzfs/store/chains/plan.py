"""Which stored model a new one is delta-coded with, which chunks pair, and what the chains may become.

Reference selection: a model qualifies when it has tensors of the same name, dtype and shape as
the new model's, covering at least half of the new model's tensor bytes. Of those, one of the
same family (the name up to its last "/": `run1` for `run1/step-400`) is preferred, then the most
recently added. Models stored before catalog version 3 have no tensor rows and never qualify.

Pairing: a chunk of the new model and a chunk of the base pair when they hold the same tensor
(name, dtype, shape) at the same offset within it and have the same size.

Chains: the arrangement keeps the newest model's chunks coded alone and recodes each paired chunk
of the base as a delta against the new model's chunk (ChainGraph checks each such step: no
cycle, no chain deeper than the cap, and which chunks must be re-anchored to stay within it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lmzfs.store.catalog import Catalog, Extent, StoredTensor, TensorRow
from lmzfs.store.layout import StoreError

TensorKey = tuple[str, str, str]      # (name, dtype, shape)
# A model qualifies as a base automatically when its matching tensors cover this share of the
# new model's tensor bytes: below it, most of the new model would pair with nothing.
MIN_MATCHED_SHARE = 0.5


def family(name: str) -> str | None:
    return name.rsplit("/", 1)[0] if "/" in name else None


@dataclass(frozen=True)
class NewTensor:
    path: str            # the file's path inside the new model
    key: TensorKey
    offset: int          # of its data in the file
    size: int


@dataclass(frozen=True)
class BaseChoice:
    model: str
    explicit: bool
    matched_bytes: int    # bytes of the new model's tensors that have a counterpart in it
    tensor_bytes: int     # bytes of all the new model's tensors


@dataclass
class BaseIndex:
    """The base model's tensors by key, and its files' chunks by plain offset (read as needed)."""
    choice: BaseChoice
    tensors: dict[TensorKey, list[StoredTensor]] = field(default_factory=dict)
    _extents: dict[int, dict[int, Extent]] = field(default_factory=dict)

    def pairs(self, catalog: Catalog, path: str, tensors: list[NewTensor]) -> dict[int, Extent]:
        """Plain offset in the new file -> the base's chunk at the same place of the same tensor."""
        out: dict[int, Extent] = {}
        for t in tensors:
            found = self.tensors.get(t.key)
            if not found:
                continue
            row = next((s for s in found if s.path == path), found[0]).tensor
            if row.size != t.size:
                continue
            by_offset = self._extents.get(row.file)
            if by_offset is None:
                by_offset = self._extents[row.file] = {e.offset: e for e in catalog.extents(row.file)}
            pos = row.offset
            while pos < row.offset + row.size and pos in by_offset:
                e = by_offset[pos]
                out[t.offset + (pos - row.offset)] = e
                pos += e.size
        return out


def key_of(row: TensorRow) -> TensorKey:
    return (row.name, row.dtype, row.shape)


def choose_base(catalog: Catalog, name: str, tensors: list[NewTensor], explicit: str | None) -> BaseIndex | None:
    """The base model for a new model NAME with these tensors, or None (none qualifies); with
    `explicit` (`lmz add --base`), that model or a StoreError saying why it cannot be one."""
    total = sum(t.size for t in tensors)
    wanted: dict[TensorKey, int] = {}
    for t in tensors:
        wanted[t.key] = wanted.get(t.key, 0) + t.size
    if explicit is not None:
        row = catalog.model(explicit)
        if row is None:
            raise StoreError(f"no model named {explicit!r} to use as a base (see `lmz ls`); nothing was added")
        rows = catalog.tensors(explicit)
        if not rows:
            raise StoreError(f"model {explicit!r} has no tensor list (it holds no tensors, or was stored before "
                             f"catalog version 3), so it cannot be a base; nothing was added")
        index = _index(rows)
        matched = sum(n for k, n in wanted.items() if k in index)
        if not matched:
            raise StoreError(f"model {explicit!r} has no tensor of the same name, dtype and shape as the new "
                             f"model's, so it cannot be a base; nothing was added (leave out --base to choose one, or "
                             f"--no-delta)")
        return BaseIndex(BaseChoice(explicit, True, matched, total), index)
    if not total:
        return None
    by_model: dict[str, list] = {}
    added: dict[str, float] = {}
    for row in catalog.tensors():
        if row.model != name:
            by_model.setdefault(row.model, []).append(row)
            added[row.model] = row.added
    best: tuple | None = None
    for model, rows in by_model.items():
        index = _index(rows)
        matched = sum(n for k, n in wanted.items() if k in index)
        if matched < MIN_MATCHED_SHARE * total:
            continue
        rank = (family(model) is not None and family(model) == family(name), added[model], model)
        if best is None or rank > best[0]:
            best = (rank, model, matched, index)
    if best is None:
        return None
    return BaseIndex(BaseChoice(best[1], False, best[2], total), best[3])


def _index(rows: list[StoredTensor]) -> dict[TensorKey, list[StoredTensor]]:
    out: dict[TensorKey, list[StoredTensor]] = {}
    for row in rows:
        out.setdefault(key_of(row.tensor), []).append(row)
    return out


class ChainGraph:
    """The chunks' references as the catalog has them, with this add's changes laid over them.

    A chunk's depth is how many references a read of it follows (0: coded alone). Chunks this
    add creates are coded alone and have no dependants."""

    def __init__(self, catalog: Catalog, cap: int):
        self.catalog = catalog
        self.cap = cap
        self._base: dict[bytes, bytes | None] = {}           # overlay: chunk -> its new base
        self._stored: dict[bytes, bytes | None] = {}         # catalog's base, looked up once
        self._dependants: dict[bytes, set[bytes]] = {}       # catalog's dependants, once each

    def base_of(self, cid: bytes) -> bytes | None:
        if cid in self._base:
            return self._base[cid]
        if cid not in self._stored:
            self._stored[cid] = self.catalog.chunk_base(cid)
        return self._stored[cid]

    def chain(self, cid: bytes) -> list[bytes]:
        """cid, its base, its base's base, ... (bounded: the catalog's reader refuses longer)."""
        out = [cid]
        while (b := self.base_of(out[-1])) is not None and len(out) <= 64:
            out.append(b)
        return out

    def depth(self, cid: bytes) -> int:
        return len(self.chain(cid)) - 1

    def dependants(self, cid: bytes) -> set[bytes]:
        if cid not in self._dependants:
            self._dependants[cid] = set(self.catalog.dependants(cid))
        stored = {d for d in self._dependants[cid] if self.base_of(d) == cid}
        return stored | {d for d, b in self._base.items() if b == cid}

    def set_base(self, cid: bytes, base: bytes | None) -> None:
        self._base[cid] = base

    def allows(self, cid: bytes, base: bytes) -> bool:
        """Whether cid may be coded against base: no cycle, and cid itself within the cap."""
        return cid not in self.chain(base) and self.depth(base) + 1 <= self.cap

    def over_cap(self, cid: bytes, depth: int) -> list[bytes]:
        """With cid at this depth, the shallowest chunks coded against it (directly or down a chain)
        that would sit deeper than the cap: each is to be re-anchored."""
        out = []
        frontier = [(d, depth + 1) for d in sorted(self.dependants(cid))]
        while frontier:
            d, at = frontier.pop()
            if at > self.cap:
                out.append(d)
            else:
                frontier.extend((x, at + 1) for x in sorted(self.dependants(d)))
        return out
