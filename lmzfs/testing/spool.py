"""A writable mount's spool as tests look at it and damage it: its files, and its records wherever
they live (their own ID.json, or a slot of records.slots: fsmodel/spoolslots.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from lmzfs.fsmodel.spool import SPOOL_DIR, SpoolRecord
from lmzfs.fsmodel.spoolslots import SLOT_BYTES, SLOTS_FILE, used_slot_numbers


def spool_dir(store: Path) -> Path:
    return Path(store) / SPOOL_DIR


def _used_slots(store: Path) -> list[int]:
    return used_slot_numbers(spool_dir(store) / SLOTS_FILE)


def spool_listing(store: Path) -> list[str]:
    """The spool's file names, sorted, the slot file shown as one `records.slots:K` per used slot
    (a slot file with none used is not listed)."""
    names = [n for n in os.listdir(spool_dir(store)) if n != SLOTS_FILE]
    names += [f"{SLOTS_FILE}:{k}" for k in _used_slots(store)]
    return sorted(names)


@dataclass(frozen=True)
class RecordPlace:
    """Where one record lives: its own file, or slot `slot` of the slot file."""
    path: Path
    slot: int | None

    def read(self) -> bytes:
        data = self.path.read_bytes()
        if self.slot is None:
            return data
        return data[self.slot * SLOT_BYTES:(self.slot + 1) * SLOT_BYTES].rstrip(b" \0")

    def write(self, data: bytes) -> None:
        """Replace the record's bytes as a hand edit would (a slot: its page, padded)."""
        if self.slot is None:
            self.path.write_bytes(data)
            return
        assert len(data) <= SLOT_BYTES
        with open(self.path, "r+b") as f:
            f.seek(self.slot * SLOT_BYTES)
            f.write(data.ljust(SLOT_BYTES, b" "))

    def offset(self) -> int:
        """Where the record's bytes start in self.path."""
        return 0 if self.slot is None else self.slot * SLOT_BYTES

    def record(self) -> SpoolRecord:
        return SpoolRecord.from_json(self.read(), self.path)

    def edit(self, **changes) -> None:
        """Change fields of the record as a hand edit would, its checksum made to match."""
        self.write(replace(self.record(), **changes).to_json())


def record_places(store: Path) -> list[RecordPlace]:
    """Every record of the spool: the ID.json files, then the used slots."""
    spool = spool_dir(store)
    places = [RecordPlace(p, None) for p in sorted(spool.glob("*.json"))]
    return places + [RecordPlace(spool / SLOTS_FILE, k) for k in _used_slots(store)]


def the_record(store: Path) -> RecordPlace:
    """The spool's one record (a test that made one file)."""
    (place,) = record_places(store)
    return place
