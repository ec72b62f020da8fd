"""The spool's data is checked (lmzfs/fsmodel/spoolsums.py): a damaged byte of ID.data is never
served, committed or replayed; a kill between a write's journal entry and its bytes loses
nothing that returned; a busy file's journal stays bounded; a spool of the previous version
still replays. Driven through the file system model without FUSE."""
from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from lmzfs.admin.verify import verify_store
from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.fsmodel.journal import COMPACT_ENTRIES, ENTRY_SIZE, HEADER_SIZE
from lmzfs.fsmodel.spoolsums import BLOCK
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.testing.fspaths import PathDriver

PATTERN = bytes(range(251)) * 1100          # 276,100 bytes: five blocks, the last partly held


def open_fs(store: Path) -> Filesystem:
    return Filesystem(store, cache_bytes=16 << 20, workers=2)


def spool_path(store: Path, suffix: str) -> Path:
    (path,) = (StorePaths(store).root / "spool").glob(f"*{suffix}")
    return path


def flip_bit(path: Path, at: int, bit: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << bit)]))


def stored_paths(store: Path) -> set[str]:
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return {f"{f.model}/{f.path}" for f in catalog.files()}
    finally:
        catalog.close()


def kill_writer(body: str, store: Path) -> None:
    """Run `body` with fs (a Filesystem of `store`) and p (its PathDriver) in a child, then kill -9 it."""
    script = textwrap.dedent("""
        import os, signal, sys
        from lmzfs.fsmodel.filesystem import Filesystem
        from lmzfs.testing.fspaths import PathDriver
        fs = Filesystem(sys.argv[1], cache_bytes=1 << 24, workers=1)
        p = PathDriver(fs)
        PATTERN = bytes(range(251)) * 1100
    """) + textwrap.dedent(body) + "os.kill(os.getpid(), signal.SIGKILL)\n"
    run = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()


def test_a_flipped_bit_in_the_spool_data_of_an_open_file_reads_as_eio_never_the_flipped_bytes(store_dir):
    fs = open_fs(store_dir)
    try:
        p = PathDriver(fs)
        p.mkdir("m")
        fh = p.open("m/f", os.O_CREAT | os.O_RDWR)
        assert fs.write(fh, 0, PATTERN) == len(PATTERN)
        assert fs.read(fh, 0, len(PATTERN)) == PATTERN
        flip_bit(spool_path(store_dir, ".data"), 2 * BLOCK + 77)
        with pytest.raises(OSError) as info:
            fs.read(fh, 2 * BLOCK + 70, 16)
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError) as info:
            fs.read(fh, 0, len(PATTERN))
        assert info.value.errno == errno.EIO
        # the blocks the flip did not touch still read exactly
        assert fs.read(fh, 0, 2 * BLOCK) == PATTERN[:2 * BLOCK]
        assert fs.read(fh, 3 * BLOCK, BLOCK) == PATTERN[3 * BLOCK:4 * BLOCK]
        # a write that keeps some of the damaged block's bytes is refused, not laundered into a new sum
        with pytest.raises(OSError) as info:
            fs.write(fh, 2 * BLOCK + 10, b"x")
        assert info.value.errno == errno.EIO
        # one that replaces all of its held bytes heals it
        fs.write(fh, 2 * BLOCK, PATTERN[2 * BLOCK:3 * BLOCK])
        assert fs.read(fh, 0, len(PATTERN)) == PATTERN
        fs.release(fh)
    finally:
        fs.close()
    assert "m/f" in stored_paths(store_dir)


_WRITTEN_THEN_KILLED = """
    p.mkdir("m")
    fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, PATTERN)
    if sys.argv[2] == "fsync":
        fs.fsync(fh)
"""


@pytest.mark.allow_log_warnings
@pytest.mark.parametrize("mode", ["fsync", "no-fsync"])
def test_a_flipped_bit_in_the_spool_data_is_reported_at_replay_never_committed_and_reads_as_eio(
        store_dir, mode, caplog):
    kill_writer(_WRITTEN_THEN_KILLED.replace("sys.argv[2]", repr(mode)), store_dir)
    data = spool_path(store_dir, ".data")
    flip_bit(data, BLOCK + 5)
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 0
        lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
        assert lines == [f"m/f: the spool's data is damaged in 1 block(s) from byte {BLOCK} (their checksums do "
                         f"not match): reads of them fail (EIO), and the file stays in the spool "
                         f"{data.stem}"]
        assert "\n" not in lines[0] and "Traceback" not in caplog.text
        p = PathDriver(fs)
        fh = p.open("m/f", os.O_RDONLY)
        assert fs.read(fh, 0, BLOCK) == PATTERN[:BLOCK]
        with pytest.raises(OSError) as info:
            fs.read(fh, BLOCK, 10)
        assert info.value.errno == errno.EIO
        fs.release(fh)          # its last close tries to commit and cannot: logged, the bytes stay spooled
        assert any("damaged" in r.getMessage() and r.levelname in ("WARNING", "ERROR")
                   for r in caplog.records[len(lines):])
    finally:
        fs.close()
    assert "m/f" not in stored_paths(store_dir)
    assert data.exists() and spool_path(store_dir, ".json").exists()   # kept for whoever can mend it
    assert verify_store(StorePaths(store_dir)).ok


def test_a_write_killed_after_its_journal_entry_before_its_bytes_is_rolled_back_whole(store_dir):
    kill_writer("""
        p.mkdir("m")
        fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
        fs.write(fh, 0, PATTERN[:1000])
        fs.fsync(fh)
        fs.write(fh, 1000, PATTERN[1000:3000])
    """, store_dir)
    # as if the kill came between the last write's journal entry and its pwrite(2)
    os.truncate(spool_path(store_dir, ".data"), 1000)
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/f") == PATTERN[:1000]
    finally:
        fs.close()


def test_the_journal_of_a_file_kept_open_and_busy_stays_bounded_and_replays_exactly(store_dir):
    # a log kept open: appends, now and then an overwrite of its start, an fsync half way
    writes = 2 * COMPACT_ENTRIES + 100
    kill_writer(f"""
        p.mkdir("m")
        fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
        for i in range({writes}):
            fs.write(fh, 100 * i, i.to_bytes(4, "little") * 25)
            if i % 100 == 0:
                fs.write(fh, i % 1000, b"overwritten %d" % i)
            if i == 5000:
                fs.fsync(fh)
    """, store_dir)
    expected = bytearray()
    for i in range(writes):
        expected[100 * i:100 * i + 100] = i.to_bytes(4, "little") * 25
        if i % 100 == 0:
            text = b"overwritten %d" % i
            expected[i % 1000:i % 1000 + len(text)] = text
    log = spool_path(store_dir, ".log")
    assert log.stat().st_size <= HEADER_SIZE + COMPACT_ENTRIES * ENTRY_SIZE
    record = json.loads(spool_path(store_dir, ".json").read_bytes())
    assert record["journal_generation"] == 2 and record["durable"] is True
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/f") == bytes(expected)
    finally:
        fs.close()


def _old_spool(store: Path, spool_id: str, data: bytes, durable: bool) -> None:
    """The spool the previous version (record 2, journal 1, no sums) leaves for one new file:
    its first half in the record's ranges, the rest in one journal entry."""
    spool = StorePaths(store).root / "spool"
    (spool / f"{spool_id}.data").write_bytes(data)
    half = len(data) // 2
    head = struct.pack("<4sI16s4x", b"LMZJ", 1, bytes.fromhex(spool_id))
    log = head + struct.pack("<I", zlib.crc32(head))
    entry = struct.pack("<B3xIQQ4x", 1, 0, half, len(data) - half)
    log += entry + struct.pack("<I", zlib.crc32(entry))
    (spool / f"{spool_id}.log").write_bytes(log)
    meta = {"kind": "file", "mode": 0o644, "uid": os.getuid(), "gid": os.getgid(), "atime_ns": 1, "mtime_ns": 1,
            "ctime_ns": 1, "target": None}
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    record = {"version": 2, "spool_id": spool_id, "model": "m", "path": "old", "file_id": None,
              "base_sha256": None, "base_len": 0, "size": half, "ranges": [[0, half]], "meta": meta,
              "durable": durable, "journal_entries": 0, "boot_id": boot}
    (spool / f"{spool_id}.json").write_text(json.dumps(record))


def test_a_spool_left_by_the_previous_version_replays_unchecked_and_commits(store_dir):
    fs = open_fs(store_dir)
    PathDriver(fs).mkdir("m")
    fs.close()
    _old_spool(store_dir, "0123456789abcdef0123456789abcdef", PATTERN, durable=False)
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/old") == PATTERN
    finally:
        fs.close()
    assert "m/old" in stored_paths(store_dir)
    assert sorted(os.listdir(StorePaths(store_dir).root / "spool")) == ["mount.lock"]


@pytest.mark.allow_log_warnings
def test_a_flipped_bit_in_a_spool_record_refuses_the_mount_and_keeps_the_record(store_dir):
    kill_writer(_WRITTEN_THEN_KILLED.replace("sys.argv[2]", "'fsync'"), store_dir)
    record = spool_path(store_dir, ".json")
    text = record.read_bytes()
    at = text.index(b'"size": ') + len(b'"size": ')
    flip_bit(record, at, 0)                   # a digit of the size: still JSON, another number
    json.loads(record.read_bytes())
    kept = record.read_bytes()
    with pytest.raises(StoreError, match="is damaged \\(its checksum does not match\\)"):
        open_fs(store_dir)
    assert record.read_bytes() == kept


def test_a_spool_killed_while_recorded_again_in_this_version_replays_as_recorded(store_dir):
    # as a mount killed between writing the new record (generation 1) and restarting the
    # journal leaves it: the old journal (a write, then a truncate to 10 bytes) is in the record
    from dataclasses import replace
    from lmzfs.fsmodel.ranges import ByteRanges
    from lmzfs.fsmodel.spool import SpoolRecord
    from lmzfs.fsmodel.spoolsums import sums_of
    fs = open_fs(store_dir)
    PathDriver(fs).mkdir("m")
    fs.close()
    spool_id = "00112233445566778899aabbccddeeff"
    _old_spool(store_dir, spool_id, PATTERN, durable=True)
    spool = StorePaths(store_dir).root / "spool"
    entry = struct.pack("<B3xIQQ4x", 2, 1, 10, 0)
    with open(spool / f"{spool_id}.log", "ab") as f:
        f.write(entry + struct.pack("<I", zlib.crc32(entry)))
    os.truncate(spool / f"{spool_id}.data", 10)
    record_path = spool / f"{spool_id}.json"
    old = SpoolRecord.from_json(record_path.read_bytes(), record_path)
    fd = os.open(spool / f"{spool_id}.data", os.O_RDONLY)
    try:
        sums = sorted(sums_of(fd, ByteRanges([(0, 10)])).items())
    finally:
        os.close(fd)
    record_path.write_bytes(replace(old, version=3, size=10, ranges=[(0, 10)], sums=sums, journal_entries=0,
                                    journal_generation=1).to_json())
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/old") == PATTERN[:10]
    finally:
        fs.close()
