"""The checksums of a spool's data (STORE/spool/ID.data): no byte of it is served, committed or
replayed unchecked.

ID.data is cut into blocks of BLOCK bytes at the file's own offsets. Each block that holds any of
the file's spooled bytes has a sum: XXH3-64 over, for each held range inside the block in order,
its start and end (u64 little-endian) and its bytes. Only held bytes count, so a write or a
truncate the replay drops (a damaged journal, a restart of the machine) changes no sum of the
bytes it keeps, and the sum binds each byte to its offset. A write journals the new sums of the
blocks it touches before it writes (journal.py), a truncate the sum of the block it cuts; the
record (spool.py) keeps every block's sum. Reads check the blocks they take bytes from: a
mismatch is CorruptChunk (EIO), never the bytes.

At replay `settle` decides what a record and its journal leave: the last write may have been
journaled and not (or not wholly) written when the daemon was killed, so its entries are kept
only as far as their blocks match; a block that matches nothing is damaged, and stays so (EIO).
"""
from __future__ import annotations

import os
import struct

import xxhash

from lmzfs.errors import CorruptChunk
from lmzfs.fsmodel.ranges import ByteRanges

BLOCK = 1 << 16
_POS = struct.Struct("<QQ")


def cut_sums(sums: dict[int, int], size: int, cut_sum: int | None) -> dict[int, int]:
    """The sums after a truncate to `size`: blocks past it go, the block it cuts gets `cut_sum`."""
    out = {k: v for k, v in sums.items() if k * BLOCK < size}
    k = size // BLOCK
    if size % BLOCK and k in out and cut_sum is not None:
        out[k] = cut_sum
    return out


def held(ranges: ByteRanges, k: int) -> list[tuple[int, int]]:
    """The held ranges inside block k."""
    return ranges.within(k * BLOCK, (k + 1) * BLOCK)


def with_range(pieces: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """`pieces` (sorted, disjoint, not touching) with [lo, hi) added, merged as ByteRanges merges."""
    r = ByteRanges(pieces)
    r.add(lo, hi)
    return r.as_list()


def block_sum(block: bytes, k: int, pieces: list[tuple[int, int]]) -> int:
    """The sum of block k's held `pieces`, `block` being its BLOCK bytes."""
    h = xxhash.xxh3_64()
    base = k * BLOCK
    for start, end in pieces:
        h.update(_POS.pack(start, end))
        h.update(block[start - base:end - base])
    return h.intdigest()


def read_blocks(fd: int, first: int, count: int) -> bytes:
    """Blocks first..first+count-1 of ID.data, holes and what lies past its end as zeros."""
    want = count * BLOCK
    data = os.pread(fd, want, first * BLOCK)
    return data if len(data) == want else data + bytes(want - len(data))


def check_block(block: bytes, k: int, ranges: ByteRanges, sums: dict[int, int], where: str) -> None:
    """CorruptChunk unless block k's held bytes have their sum."""
    expected = sums.get(k)
    if expected is None or block_sum(block, k, held(ranges, k)) != expected:
        raise CorruptChunk(f"{where}: bytes {k * BLOCK}-{(k + 1) * BLOCK} of the spool's data are damaged "
                           f"(their checksum does not match)")


def sums_of(fd: int, ranges: ByteRanges) -> dict[int, int]:
    """Every held block's sum as ID.data stands (for a spool of a version without sums)."""
    blocks = sorted({k for start, end in ranges.as_list() for k in range(start // BLOCK, (end - 1) // BLOCK + 1)})
    return {k: block_sum(read_blocks(fd, k, 1), k, held(ranges, k)) for k in blocks}


def settle(fd: int, recorded, applied: list, dropped: list):
    """What a checked record (FileState `recorded`) and the journal entries after it leave.
    `applied`: the entries the replay applies; `dropped`: later whole entries it drops (their
    blocks' sums may still vouch for a block the dropped writes changed). Returns the state, how
    many of `applied` it keeps, and the blocks that match no sum (damaged)."""
    t = len(applied)
    while t > 0 and not applied[t - 1].first:
        t -= 1
    t = max(0, t - 1) if t else 0
    prior = recorded.after(applied[:t])
    tail = applied[t:]
    cache: dict[int, bytes] = {}

    def block(k: int) -> bytes:
        if k not in cache:
            cache[k] = read_blocks(fd, k, 1)
        return cache[k]

    def matches(state, blocks) -> bool:
        ranges = ByteRanges(state.ranges)
        return all(block_sum(block(k), k, held(ranges, k)) == state.sums[k] for k in blocks if k in state.sums)

    def unwritten(state, entries) -> bool:
        """Each entry's bytes that `state` does not hold read as the hole they were before it."""
        ranges = ByteRanges(state.ranges)
        for e in entries:
            k = e.offset // BLOCK
            for piece in ranges.pieces(e.offset, e.offset + e.length):
                if not piece.inside and block(k)[piece.start - k * BLOCK:piece.end - k * BLOCK].count(0) \
                        != piece.end - piece.start:
                    return False
        return True

    touched = {e.offset // BLOCK for e in tail if e.kind == 1}
    kept = len(tail)
    if tail and not matches(prior.after(tail), touched):
        # the last write was journaled, then killed before (all of) its bytes were written: what
        # it did not write is as it was (the blocks it leaves match; what no block held is a hole)
        for i in range(len(tail) - 1, -1, -1):
            state = prior.after(tail[:i])
            if matches(state, touched) and unwritten(state, [e for e in tail[i:] if e.kind == 1]):
                kept = i
                break
    final = prior.after(tail[:kept])
    ranges = ByteRanges(final.ranges)
    sums = dict(final.sums)
    bad = []
    for k in sorted(sums):
        pieces = held(ranges, k)
        if block_sum(block(k), k, pieces) == sums[k]:
            continue
        run = final
        for e in dropped:
            run = run.after([e])
            if e.kind == 1 and e.offset // BLOCK == k:
                later = held(ByteRanges(run.ranges), k)
                if _covers(later, pieces) and block_sum(block(k), k, later) == e.sum:
                    sums[k] = block_sum(block(k), k, pieces)
                    break
        else:
            bad.append(k)
    return type(final)(final.size, final.base_len, final.ranges, sums), t + kept, bad


def _covers(outer: list[tuple[int, int]], inner: list[tuple[int, int]]) -> bool:
    r = ByteRanges(outer)
    return all(all(p.inside for p in r.pieces(s, e)) for s, e in inner)
