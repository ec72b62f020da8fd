"""A writable mount reclaims the dead bytes of the versions its commits replace, by itself, while
files stay open (fsmodel/reclaim.py; every mount is unmounted, even on failure)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from lmzfs.admin.verify import verify_store
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted, wait_committed, wait_for

FLOOR = 1 << 20


def stored_payload(store: Path) -> int:
    """Payload bytes of the chunks the store's files reference (what `lmz stats` calls stored)."""
    from lmzfs.store.catalog import Catalog
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return sum(u.stored_bytes for u in catalog.usage())
    finally:
        catalog.close()


def pack_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "packs").iterdir())


def test_a_file_rewritten_60_times_leaves_the_store_under_3x_its_live_bytes_and_open_files_read_on(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(47)
    kept, gone = os.urandom(3 << 20), os.urandom(1 << 20)
    data = bytearray(os.urandom(1 << 20))
    # a small chunk cache: the open files read their chunks from the packs, rewritten meanwhile
    with mounted(mnt, store, "--writable", "--reclaim-floor", str(FLOOR), "--cache-bytes", str(1 << 20)) as fs:
        (mnt / "m").mkdir()
        (mnt / "m" / "kept.bin").write_bytes(kept)
        (mnt / "m" / "gone.bin").write_bytes(gone)
        (mnt / "m" / "f.bin").write_bytes(data)
        wait_committed(store)
        kept_fd = os.open(mnt / "m" / "kept.bin", os.O_RDONLY)
        gone_fd = os.open(mnt / "m" / "gone.bin", os.O_RDONLY)
        try:
            os.unlink(mnt / "m" / "gone.bin")           # its chunks are dead; its descriptor reads on
            written = 0
            for i in range(60):
                fd = os.open(mnt / "m" / "f.bin", os.O_RDWR)
                try:
                    offset = rng.randrange(len(data))
                    piece = os.urandom(rng.randint(1, 200_000))
                    os.pwrite(fd, piece, offset)
                    data[offset:offset + len(piece)] = piece
                    if i % 10 == 9:
                        os.ftruncate(fd, len(data) - 1000)
                        del data[len(data) - 1000:]
                finally:
                    os.close(fd)                        # commits the whole file again
                written += len(data)
                if i % 20 == 19:
                    assert os.pread(kept_fd, len(kept), 0) == kept
                    assert os.pread(gone_fd, len(gone), 0) == gone
            wait_committed(store)
            live = len(kept) + len(data)
            assert written > 15 * live                      # committed, all but the last version dead
            # the mount reclaims at most every 2 s: the rewrites may all be done before its first run
            wait_for(lambda: "reclaimed " in fs.log(), 20, "a reclaim while mounted")
            wait_for(lambda: pack_bytes(store) < 3 * live + FLOOR, 20, "the packs' reclaimed size")
            assert os.pread(kept_fd, len(kept), 0) == kept
            assert os.pread(gone_fd, len(gone), 0) == gone
        finally:
            os.close(kept_fd)
            os.close(gone_fd)
        assert (mnt / "m" / "f.bin").read_bytes() == bytes(data)
        assert (mnt / "m" / "kept.bin").read_bytes() == kept
        assert sorted(os.listdir(mnt / "m")) == ["f.bin", "kept.bin"]
    assert pack_bytes(store) < 3 * live + FLOOR
    report = verify_store(StorePaths(store))
    assert report.ok and report.files == 2
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "f.bin").read_bytes() == bytes(data)
    run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "gc"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert verify_store(StorePaths(store)).ok


def test_100_appends_to_a_10_mb_log_leave_the_packs_within_one_and_a_half_times_its_bytes_without_gc(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(100)
    log = bytearray(rng.randbytes(10_000_000))
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        (mnt / "m" / "log").write_bytes(log)
        for _ in range(100):
            line = rng.randbytes(1000) + b"\n"
            with open(mnt / "m" / "log", "ab") as f:     # each close commits the file
                f.write(line)
            log += line
        wait_committed(store)
        wait_for(lambda: pack_bytes(store) <= 1.5 * len(log), 30, "the packs within 1.5x the live bytes")
        assert (mnt / "m" / "log").read_bytes() == bytes(log)
    assert verify_store(StorePaths(store)).ok


def test_2000_random_writes_truncates_and_reopens_of_one_file_leave_the_packs_within_its_live_bytes_and_a_half(
        tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(2000)
    data = bytearray(rng.randbytes(700_000))
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        f = mnt / "m" / "f.bin"
        f.write_bytes(data)
        fd = os.open(f, os.O_RDWR)
        try:
            for _ in range(2000):
                r = rng.random()
                if r < 0.6:
                    at, piece = rng.randrange(len(data) + 1), rng.randbytes(rng.randint(1, 8192))
                    os.pwrite(fd, piece, at)
                    data[at:at + len(piece)] = piece
                elif r < 0.8:
                    n = rng.randint(500_000, 900_000)
                    os.ftruncate(fd, n)
                    data = data[:n] + bytes(max(0, n - len(data)))
                else:
                    os.close(fd)                        # the last close commits the file
                    fd = os.open(f, os.O_RDWR)
        finally:
            os.close(fd)
        wait_committed(store)
        live = stored_payload(store)
        wait_for(lambda: pack_bytes(store) <= 1.5 * live, 30, "the packs within 1.5x the live payload")
        assert f.read_bytes() == bytes(data)
    assert verify_store(StorePaths(store)).ok
