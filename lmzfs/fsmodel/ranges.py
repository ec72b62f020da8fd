"""A set of byte ranges: which parts of a file the spool holds."""
from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    start: int
    end: int
    inside: bool      # the range lies in the set


class ByteRanges:
    """Disjoint, sorted, non-touching [start, end) ranges."""

    def __init__(self, ranges: list[tuple[int, int]] | None = None):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0                  # bytes in the set
        for start, end in ranges or ():
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        # every range that overlaps or touches [start, end) merges into it
        lo = bisect.bisect_left(self._ends, start)
        hi = bisect.bisect_right(self._starts, end)
        if lo < hi:
            self.total -= sum(self._ends[lo:hi]) - sum(self._starts[lo:hi])
            start = min(start, self._starts[lo])
            end = max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]
        self.total += end - start

    def cut(self, size: int) -> None:
        """Drop everything at or past `size`."""
        self.total -= self.beyond(size)
        i = bisect.bisect_left(self._ends, size + 1)
        del self._starts[i + 1:], self._ends[i + 1:]
        if i < len(self._starts):
            if self._starts[i] >= size:
                del self._starts[i], self._ends[i]
            else:
                self._ends[i] = size

    def beyond(self, pos: int) -> int:
        """Bytes of the set at or past `pos`, counting the ranges on the shorter side of it."""
        i = bisect.bisect_right(self._ends, pos)            # the first range that ends past pos
        n = len(self._starts)
        if n - i <= i:
            return sum(self._ends[i:]) - sum(self._starts[i:]) - (max(0, pos - self._starts[i]) if i < n else 0)
        below = sum(self._ends[:i]) - sum(self._starts[:i]) + (max(0, pos - self._starts[i]) if i < n else 0)
        return self.total - below

    def pieces(self, start: int, end: int) -> list[Piece]:
        """[start, end) cut where the set begins or ends, each piece saying whether it is inside."""
        out: list[Piece] = []
        pos = start
        i = bisect.bisect_right(self._ends, start)
        while pos < end:
            if i < len(self._starts) and self._starts[i] <= pos:
                stop = min(end, self._ends[i])
                out.append(Piece(pos, stop, True))
                i += 1
            else:
                stop = min(end, self._starts[i]) if i < len(self._starts) else end
                out.append(Piece(pos, stop, False))
            pos = stop
        return out

    def within(self, start: int, end: int) -> list[tuple[int, int]]:
        """The set's ranges inside [start, end), clipped to it."""
        out = []
        i = bisect.bisect_right(self._ends, start)
        starts, ends = self._starts, self._ends
        while i < len(starts) and starts[i] < end:
            out.append((max(starts[i], start), min(ends[i], end)))
            i += 1
        return out

    def as_list(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    def __bool__(self) -> bool:
        return bool(self._starts)
