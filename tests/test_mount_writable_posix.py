"""The writable mount's POSIX surface as programs meet it, through the kernel: the refusals
docs/writable.md lists, statfs, shared writable mmap, unlinked open files, and readers of a file
while it is written (every mount is unmounted, even on failure)."""
from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import random
from pathlib import Path

import pytest

from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100
libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old: Path, new: Path, flags: int) -> int:
    """0, or the errno of renameat2(2)."""
    done = libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), ctypes.c_uint(flags))
    return 0 if done == 0 else ctypes.get_errno()


def fallocate(fd: int, length: int) -> int:
    """0, or the errno of fallocate(2) (posix_fallocate would emulate it by writing zeros)."""
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return 0 if libc.fallocate(fd, 0, 0, length) == 0 else ctypes.get_errno()


def stored_sha256(store: Path, path: str) -> str | None:
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return next((f.sha256 for f in catalog.files() if f.path == path), None)
    finally:
        catalog.close()


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as caught:
        call(*args)
    return caught.value.errno


@pytest.fixture
def store(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def model(tmp_path, store):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        yield mnt / "m"
    assert verify_store(StorePaths(store)).ok


def test_hard_links_fifos_fallocate_and_rename_exchange_get_their_documented_errors(model):
    (model / "a").write_bytes(b"first")
    (model / "b").write_bytes(b"second")
    assert errno_of(os.link, model / "a", model / "hard") == errno.EPERM
    assert errno_of(os.mkfifo, model / "fifo") == errno.EPERM
    fd = os.open(model / "a", os.O_RDWR)
    try:
        assert fallocate(fd, 1 << 20) == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert renameat2(model / "a", model / "b", RENAME_EXCHANGE) == errno.EINVAL
    assert renameat2(model / "a", model / "b", RENAME_NOREPLACE) == errno.EEXIST
    assert renameat2(model / "a", model / "c", RENAME_NOREPLACE) == 0
    assert sorted(p.name for p in model.iterdir()) == ["b", "c"]
    assert (model / "c").read_bytes() == b"first" and (model / "b").read_bytes() == b"second"
    assert errno_of(os.setxattr, model / "b", "trusted.x", b"1") == errno.EOPNOTSUPP


def test_statfs_reports_the_file_system_that_holds_the_store(model, store):
    mine, theirs = os.statvfs(model), os.statvfs(store)
    assert (mine.f_frsize, mine.f_blocks, mine.f_namemax) == (theirs.f_frsize, theirs.f_blocks, 255)
    assert abs(mine.f_bavail - theirs.f_bavail) * theirs.f_frsize < 64 << 20


def test_a_shared_writable_mmap_changes_the_file_and_is_stored(model, store):
    data = bytearray(os.urandom(3 * mmap.PAGESIZE))
    (model / "mapped.bin").write_bytes(data)
    with open(model / "mapped.bin", "r+b") as f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED) as mapped:
        mapped[mmap.PAGESIZE + 10:mmap.PAGESIZE + 20] = b"0123456789"
        data[mmap.PAGESIZE + 10:mmap.PAGESIZE + 20] = b"0123456789"
        mapped.flush()
    assert (model / "mapped.bin").read_bytes() == bytes(data)
    with open(model / "mapped.bin", "rb") as f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ) as mapped:
        assert mapped[:] == bytes(data)
    assert stored_sha256(store, "mapped.bin") == hashlib.sha256(data).hexdigest()


def test_an_unlinked_open_file_is_read_and_written_through_its_descriptor_then_gone(model):
    fd = os.open(model / "scratch", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"before unlink ")
        os.unlink(model / "scratch")
        assert not (model / "scratch").exists()
        os.write(fd, b"after unlink")
        assert os.pread(fd, 100, 0) == b"before unlink after unlink"
        assert os.fstat(fd).st_size == 26
    finally:
        os.close(fd)
    assert list(model.iterdir()) == []


def test_a_reader_sees_every_write_of_another_descriptor_as_soon_as_it_returns(model):
    rng = random.Random(27)
    expected = bytearray(os.urandom(1 << 20))
    (model / "live.bin").write_bytes(expected)         # stored: later reads mix the store and the spool
    writer = os.open(model / "live.bin", os.O_WRONLY)
    reader = os.open(model / "live.bin", os.O_RDONLY)
    try:
        for _ in range(40):
            offset = rng.randrange(len(expected) + 4096)
            piece = os.urandom(rng.randint(1, 70_000))
            os.pwrite(writer, piece, offset)
            if offset > len(expected):
                expected += bytes(offset - len(expected))
            expected[offset:offset + len(piece)] = piece
            start = rng.randrange(len(expected))
            assert os.pread(reader, 200_000, start) == bytes(expected[start:start + 200_000])
        os.close(writer)                                # commits; the reader goes on with the stored bytes
        writer = -1
        assert os.pread(reader, len(expected) + 1, 0) == bytes(expected)
    finally:
        if writer >= 0:
            os.close(writer)
        os.close(reader)
    assert (model / "live.bin").read_bytes() == bytes(expected)
