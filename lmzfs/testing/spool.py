"""A writable mount's spool as tests look at it and damage it: its files, and its records wherever
they live (their own ID.json, a slot of records.slots: fsmodel/spoolslots.py, or a slot pair of
records.pairs: fsmodel/spoolpairs.py)."""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from lmzfs.fsmodel.spool import SPOOL_DIR, SpoolRecord
from lmzfs.fsmodel.spoolpairs import (HALF_BYTES, HALF_HEAD_BYTES, PAIRS_FILE, half_offset, pack_half, parse_half,
                                      used_pair_slots)
from lmzfs.fsmodel.spoolslots import SLOT_BYTES, SLOTS_FILE, used_slot_numbers


def spool_dir(store: Path) -> Path:
    return Path(store) / SPOOL_DIR


def _used_slots(store: Path) -> list[int]:
    return used_slot_numbers(spool_dir(store) / SLOTS_FILE)


def _used_pairs(store: Path) -> list[int]:
    return used_pair_slots(spool_dir(store) / PAIRS_FILE)


def spool_listing(store: Path) -> list[str]:
    """The spool's file names, sorted, the slot file shown as one `records.slots:K` per used slot
    and the pair file as one `records.pairs:K` per used pair (a file with none used is not listed)."""
    names = [n for n in os.listdir(spool_dir(store)) if n not in (SLOTS_FILE, PAIRS_FILE)]
    names += [f"{SLOTS_FILE}:{k}" for k in _used_slots(store)]
    names += [f"{PAIRS_FILE}:{k}" for k in _used_pairs(store)]
    return sorted(names)


@dataclass(frozen=True)
class RecordPlace:
    """Where one record lives: its own file, slot `slot` of the slot file, or (`pair`) the newer
    half of slot `slot` of the pair file."""
    path: Path
    slot: int | None
    pair: bool = False

    def _newer_half(self) -> tuple[int, object]:
        with open(self.path, "rb") as f:
            halves = []
            for h in (0, 1):
                f.seek(half_offset(self.slot, h))
                halves.append(parse_half(f.read(HALF_BYTES)))
        h = max((0, 1), key=lambda k: (halves[k].data is not None, halves[k].seq))
        return h, halves[h]

    def read(self) -> bytes:
        if self.pair:
            return self._newer_half()[1].data
        data = self.path.read_bytes()
        if self.slot is None:
            return data
        return data[self.slot * SLOT_BYTES:(self.slot + 1) * SLOT_BYTES].rstrip(b" \0")

    def write(self, data: bytes) -> None:
        """Replace the record's bytes as a hand edit would (a slot: its page, padded; a pair: its
        newer half, its check made to match)."""
        if self.slot is None:
            self.path.write_bytes(data)
            return
        if self.pair:
            h, half = self._newer_half()
            with open(self.path, "r+b") as f:
                f.seek(half_offset(self.slot, h))
                f.write(pack_half(half.seq, half.spool_id or "", data))
            return
        assert len(data) <= SLOT_BYTES
        with open(self.path, "r+b") as f:
            f.seek(self.slot * SLOT_BYTES)
            f.write(data.ljust(SLOT_BYTES, b" "))

    def offset(self) -> int:
        """Where the record's bytes start in self.path."""
        if self.pair:
            return half_offset(self.slot, self._newer_half()[0]) + HALF_HEAD_BYTES
        return 0 if self.slot is None else self.slot * SLOT_BYTES

    def record(self) -> SpoolRecord:
        return SpoolRecord.from_json(self.read(), self.path)

    def edit(self, **changes) -> None:
        """Change fields of the record as a hand edit would, its checksum made to match."""
        self.write(replace(self.record(), **changes).to_json())


def rewrite_header(path: Path, *, version: int | None = None, unit: int | None = None) -> bytes:
    """Give a spool record file (records.slots, records.pairs: spoolslots.HeadedRecordFile) another
    version or slot/half size in its header, its CRC made to match; its bytes as they now are."""
    data = bytearray(path.read_bytes())
    magic, old_version, old_unit = struct.unpack_from("<4sII", data)
    head = struct.pack("<4sII", magic, old_version if version is None else version,
                       old_unit if unit is None else unit)
    data[:16] = head + struct.pack("<I", zlib.crc32(head))
    path.write_bytes(bytes(data))
    return bytes(data)


def record_places(store: Path) -> list[RecordPlace]:
    """Every record of the spool: the ID.json files, then the used slots, then the used pairs."""
    spool = spool_dir(store)
    places = [RecordPlace(p, None) for p in sorted(spool.glob("*.json"))]
    return places + [RecordPlace(spool / SLOTS_FILE, k) for k in _used_slots(store)] + \
        [RecordPlace(spool / PAIRS_FILE, k, pair=True) for k in _used_pairs(store)]


def the_record(store: Path) -> RecordPlace:
    """The spool's one record (a test that made one file)."""
    (place,) = record_places(store)
    return place
