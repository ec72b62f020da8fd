"""The writable mount for everyday work (issue 47): group commit, background and incremental
commits, reads beside a commit. Real mounts (unmounted even when a test fails), real processes
killed, bytes compared exactly; fsmodel-level tests drive the same code without FUSE."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import threading
from pathlib import Path

from lmzfs.admin.verify import verify_store
from lmzfs.fsmodel.filesystem import ROOT_INODE, Filesystem
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted, wait_committed
from lmzfs.testing.spool import RecordPlace, record_places


def stored_sha256(store: Path, model: str, path: str) -> str:
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return next(f.sha256 for f in catalog.files(model) if f.path == path)
    finally:
        catalog.close()


def spool_records(store: Path) -> list[RecordPlace]:
    return record_places(store)


def test_kill_9_after_fsync_keeps_the_fsyncd_bytes_and_every_namespace_change_before_it(tmp_path):
    """Metadata changes are committed in groups (no fsync of their own); an fsync makes them and
    the file durable. The daemon killed right after the fsync returns: the remount has them all."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    data = os.urandom(700_000)
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "run").mkdir()
        (mnt / "run" / "logs").mkdir()
        os.symlink("logs/out.bin", mnt / "run" / "latest")
        fd = os.open(mnt / "run" / "logs" / "out.bin", os.O_WRONLY | os.O_CREAT, 0o640)
        try:
            os.write(fd, data[:300_000])
            os.write(fd, data[300_000:])
            os.fsync(fd)
            fs.process.kill()
            fs.process.wait()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    with mounted(mnt, store, "--writable"):
        assert sorted(os.listdir(mnt / "run")) == ["latest", "logs"]
        assert os.readlink(mnt / "run" / "latest") == "logs/out.bin"
        assert (mnt / "run" / "logs" / "out.bin").read_bytes() == data
        assert (mnt / "run" / "logs" / "out.bin").stat().st_mode & 0o777 == 0o640
    assert verify_store(StorePaths(store)).ok


def test_close_of_a_dup_returns_before_any_commit_and_the_bytes_are_durable_after_fsync(tmp_path):
    """close(dup(fd)) and a child's close-on-exec copy commit nothing (the spool still holds the
    file's record when they return); after fsync a kill -9 loses none of the bytes."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    data = bytearray(os.urandom(3 << 20))
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "m").mkdir()
        (mnt / "m" / "big.bin").write_bytes(bytes(data))
        wait_committed(store)
        fd = os.open(mnt / "m" / "big.bin", os.O_RDWR)
        try:
            for i in range(5):
                os.pwrite(fd, bytes([i]) * 10, 1000 + 4096 * i)
                data[1000 + 4096 * i:1010 + 4096 * i] = bytes([i]) * 10
                os.close(os.dup(fd))
                subprocess.run(["true"], check=True)        # close-on-exec closes its copy
                assert spool_records(store), "a flush committed the file"
            os.fsync(fd)
            fs.process.kill()
            fs.process.wait()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "big.bin").read_bytes() == data
    assert verify_store(StorePaths(store)).ok


def test_appends_commit_what_they_add_and_read_back_byte_exact_across_a_remount(tmp_path):
    """A multi-chunk file appended to (echo >>, O_APPEND writes) and written into, each change
    committed before the next: every version reads back whole, its stored SHA-256 is its bytes'."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(47)
    data = bytearray(rng.randbytes(5 << 20 | 12345))
    with mounted(mnt, store, "--writable"):
        path = mnt / "m" / "app.log"
        (mnt / "m").mkdir()
        path.write_bytes(bytes(data))
        wait_committed(store)
        for i in range(12):
            if i % 4 == 3:                                  # a write into the middle
                offset = rng.randrange(len(data))
                piece = rng.randbytes(rng.randint(1, 70_000))
                fd = os.open(path, os.O_WRONLY)
                os.pwrite(fd, piece, offset)
                os.close(fd)
                data[offset:offset + len(piece)] = piece
            elif i % 2:
                subprocess.run(["sh", "-c", f"echo line {i} >> '{path}'"], check=True)
                data += f"line {i}\n".encode()
            else:
                with open(path, "ab") as f:
                    f.write(rng.randbytes(rng.randint(1, 300_000)))
                data = bytearray(data + Path(path).read_bytes()[len(data):])
            wait_committed(store)
            assert path.read_bytes() == data, f"change {i}"
            assert stored_sha256(store, "m", "app.log") == hashlib.sha256(data).hexdigest(), f"change {i}"
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "app.log").read_bytes() == data
    report = verify_store(StorePaths(store))
    assert report.ok and report.files == 1


def test_reads_of_a_file_while_it_is_committed_return_its_bytes(tmp_path):
    """A large file written and closed: its commit starts; reads meanwhile (random 4 KiB pieces,
    through another descriptor) return exactly the written bytes."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(4)
    data = rng.randbytes(48 << 20)
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        path = mnt / "m" / "fresh.bin"
        with open(path, "wb") as f:
            f.write(data)
        reads = 0
        with open(path, "rb") as f:
            while spool_records(store) or reads < 200:
                offset = rng.randrange(len(data) - 4096)
                assert os.pread(f.fileno(), 4096, offset) == data[offset:offset + 4096], offset
                reads += 1
        wait_committed(store)
        assert path.read_bytes() == data
    assert verify_store(StorePaths(store)).ok


def test_a_read_is_not_held_by_the_lock_a_commit_holds_on_its_file(tmp_path):
    """Without FUSE: while another thread holds the file's lock (as a commit does for its whole
    length), a read of the file returns the right bytes; a write waits for the lock."""
    fs = Filesystem(tmp_path / "store")
    try:
        model = fs.mkdir(ROOT_INODE, "m", 0o755, 0, 0)
        fh, attrs = fs.create(model.inode, "f", 0o644, 0, 0, os.O_RDWR)
        fs.write(fh, 0, b"a" * 100_000)
        node = fs._ns.node(attrs.inode)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with node.data.lock:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            held.wait()
            got: list[bytes] = []
            reader = threading.Thread(target=lambda: got.append(fs.read(fh, 50_000, 10)))
            reader.start()
            reader.join(timeout=60)
            assert got == [b"a" * 10]
        finally:
            release.set()
            holder.join()
        fs.release(fh)
    finally:
        fs.close()


def test_small_files_committed_together_each_read_back_and_are_stored_once(tmp_path):
    """Many small files closed within one window are committed in one transaction: each is
    stored with its own bytes and metadata."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    files = {f"d{i % 7}/f{i}.txt": (f"file {i}\n" * (i % 50 + 1)).encode() for i in range(600)}
    with mounted(mnt, store, "--writable"):
        for rel, data in files.items():
            path = mnt / "m" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        wait_committed(store)
    with mounted(mnt, store, "--writable"):
        for rel, data in files.items():
            assert (mnt / "m" / rel).read_bytes() == data, rel
    for rel, data in list(files.items())[:50]:
        assert stored_sha256(store, "m", rel) == hashlib.sha256(data).hexdigest()
    report = verify_store(StorePaths(store))
    assert report.ok and report.files == len(files)
