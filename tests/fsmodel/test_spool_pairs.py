"""Spool records in the slot pairs of records.pairs (fsmodel/spoolpairs.py): a new file of up to
INLINE_MAX bytes, written and not yet committed, costs the spool half a slot of one file, not an
ID.data, an ID.log and a record of its own; a kill finds the newer half whole or the record as
it stood before that write, a pair wins over a slot of the same file (a record moves from its
slot to a pair, never back), and what a pair file says it does not know is refused."""
from __future__ import annotations

import logging
import struct
import zlib
from pathlib import Path

import pytest

from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.fsmodel.spool import pending_records
from lmzfs.fsmodel.spoolpairs import HALF_BYTES, HEADER_BYTES, PAIRS_FILE, half_offset, parse_half
from lmzfs.fsmodel.spoolrecord import INLINE_MAX
from lmzfs.fsmodel.spoolslots import SLOT_BYTES, SLOTS_FILE
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.testing.fspaths import PathDriver
from lmzfs.testing.spool import record_places, rewrite_header, spool_listing
from tests.fsmodel.test_spool_slots import kill_writer

FILES = 12


def open_fs(store: Path) -> Filesystem:
    return Filesystem(store, cache_bytes=16 << 20, workers=2)


def body_of(i: int) -> bytes:
    """4,097 to INLINE_MAX bytes: too large for a slot's page, small enough to stay inline."""
    size = 4097 + i * (INLINE_MAX - 4097) // (FILES - 1)
    return bytes((i * 7 + k * 13) % 251 for k in range(size))


_MANY_OPEN = f"""
    from tests.fsmodel.test_spool_pairs import body_of
    p.mkdir("m")
    held = []
    for i in range({FILES}):
        fh = p.open(f"m/f{{i}}", os.O_CREAT | os.O_WRONLY)
        fs.write(fh, 0, body_of(i))
        held.append(fh)                # kept open: nothing is committed before the kill
    p.rename("m/f3", "m/renamed")
"""


def _spool(store: Path) -> Path:
    return StorePaths(store).root / "spool"


def _halves(store: Path, slot: int):
    data = (_spool(store) / PAIRS_FILE).read_bytes()
    return [parse_half(data[half_offset(slot, h):half_offset(slot, h) + HALF_BYTES]) for h in (0, 1)]


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_files_of_up_to_inline_max_killed_uncommitted_live_in_pairs_and_replay_byte_for_byte(store_dir, caplog):
    kill_writer(_MANY_OPEN, store_dir)
    # no ID.data, ID.log or ID.json: one pair each in one file
    assert spool_listing(StorePaths(store_dir).root) == \
        ["mount.lock"] + sorted(f"{PAIRS_FILE}:{k}" for k in range(FILES))
    assert sorted(p.record().path for p in record_places(store_dir)) == \
        sorted(["renamed"] + [f"f{i}" for i in range(FILES) if i != 3])
    assert pending_records(store_dir) == FILES
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == FILES
        p = PathDriver(fs)
        for i in range(FILES):
            assert p.read_file("m/renamed" if i == 3 else f"m/f{i}") == body_of(i)
    finally:
        fs.close()
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]
    assert (_spool(store_dir) / PAIRS_FILE).stat().st_size == HEADER_BYTES      # cut back
    assert _errors(caplog) == []


_REWRITTEN = """
    p.mkdir("m")
    fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"first " * 2000)
    fs.write(fh, 0, b"SECOND")
"""


def test_a_newer_half_cut_short_by_a_kill_leaves_the_record_as_it_stood_before_that_write(store_dir, caplog):
    kill_writer(_REWRITTEN, store_dir)
    first, second = sorted(_halves(store_dir, 0), key=lambda h: h.seq)
    assert first.data is not None and second.data is not None and second.seq > first.seq
    newer = half_offset(0, _halves(store_dir, 0).index(second))
    # as a kill after the first page of the newer half's write leaves it: its other pages as they were
    path = _spool(store_dir) / PAIRS_FILE
    data = bytearray(path.read_bytes())
    data[newer + 4096:newer + HALF_BYTES] = bytes(HALF_BYTES - 4096)
    path.write_bytes(bytes(data))
    fs = open_fs(store_dir)
    try:
        assert PathDriver(fs).read_file("m/f") == b"first " * 2000
    finally:
        fs.close()
    assert _errors(caplog) == []


def _slot_file_with(store: Path, record: bytes) -> None:
    head = struct.pack("<4sII", b"LMZS", 1, SLOT_BYTES)
    header = (head + struct.pack("<I", zlib.crc32(head))).ljust(SLOT_BYTES, b"\0")
    (_spool(store) / SLOTS_FILE).write_bytes(header + record.ljust(SLOT_BYTES, b" "))


@pytest.mark.parametrize("pair_whole", [True, False])
def test_a_record_in_both_a_slot_and_a_pair_replays_the_pair_unless_its_write_was_cut_short(store_dir, caplog,
                                                                                           pair_whole):
    kill_writer("""
        p.mkdir("m")
        fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
        fs.write(fh, 0, b"grown past a page " * 400)
    """, store_dir)
    (place,) = record_places(store_dir)
    assert place.pair
    from dataclasses import replace
    older = replace(place.record(), inline=b"small, in its slot", size=18, ranges=[(0, 18)])
    # as a kill between writing the record to its pair and freeing its slot leaves it
    _slot_file_with(store_dir, older.to_json())
    if not pair_whole:                 # ... or during the pair's write, after its first page
        path = _spool(store_dir) / PAIRS_FILE
        data = bytearray(path.read_bytes())
        data[half_offset(0, 0) + 4096:half_offset(0, 1)] = bytes(HALF_BYTES - 4096)
        path.write_bytes(bytes(data))
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/f") == (b"grown past a page " * 400 if pair_whole else b"small, in its slot")
    finally:
        fs.close()
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]
    assert _errors(caplog) == []


@pytest.mark.allow_log_warnings
def test_a_damaged_pair_with_no_other_record_is_set_aside_and_logged_not_replayed(store_dir, caplog):
    kill_writer(_REWRITTEN, store_dir)
    path = _spool(store_dir) / PAIRS_FILE
    data = bytearray(path.read_bytes())
    for h in (0, 1):
        data[half_offset(0, h) + 100] ^= 0xFF       # a flipped bit in each half's JSON
    path.write_bytes(bytes(data))
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 0
    finally:
        fs.close()
    assert (_spool(store_dir) / "pair-0.json-untrusted").exists()
    assert any("is not replayed, kept as" in m and "pair-0.json-untrusted" in m for m in _errors(caplog))


@pytest.mark.parametrize("field, value", [("version", 2), ("half size", 65536)])
def test_a_pair_file_of_an_unknown_version_or_half_size_is_refused_and_kept(store_dir, field, value):
    kill_writer(_MANY_OPEN, store_dir)
    path = _spool(store_dir) / PAIRS_FILE
    data = rewrite_header(path, **{"version" if field == "version" else "unit": value})
    with pytest.raises(StoreError, match="is not supported"):
        open_fs(store_dir)
    assert path.read_bytes() == data
