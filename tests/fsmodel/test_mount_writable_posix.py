"""The writable mount's POSIX surface as programs meet it, through the kernel: the refusals
docs/writable.md lists, names over NAME_MAX, `.` and `..`, statfs, st_blocks of sparse files,
shared writable mmap, unlinked open files, and readers of a file while it is written (every mount
is unmounted, even on failure)."""
from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import random
import subprocess
from pathlib import Path

import pytest

from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted, wait_committed, wait_for

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
    assert errno_of(os.open, model, os.O_TMPFILE | os.O_RDWR, 0o600) == errno.EOPNOTSUPP
    assert sorted(p.name for p in model.iterdir()) == ["b", "c"]


def test_every_call_on_a_name_over_255_bytes_is_enametoolong_and_255_bytes_work(model):
    (model / "a").write_bytes(b"a")
    for long in ("n" * 256, "\u00e9" * 128, "x" * 1000):          # 256, 256 and 1000 bytes
        path = model / long
        calls = [os.stat, os.lstat, os.unlink, os.rmdir, os.mkdir, os.readlink, lambda p: os.chmod(p, 0o600),
                 lambda p: os.truncate(p, 0), lambda p: os.utime(p, (1, 1)), lambda p: os.open(p, os.O_RDONLY),
                 lambda p: os.open(p, os.O_WRONLY | os.O_CREAT, 0o644), lambda p: os.rename(p, model / "b"),
                 lambda p: os.rename(model / "a", p), lambda p: os.symlink("a", p),
                 lambda p: os.getxattr(p, "user.x"), lambda p: os.setxattr(p, "user.x", b"1")]
        assert [errno_of(call, path) for call in calls] == [errno.ENAMETOOLONG] * len(calls), long[:4]
    longest = model / ("m" * 255)
    longest.write_bytes(b"255 bytes is the most")
    os.chmod(longest, 0o600)
    os.truncate(longest, 9)
    assert (longest.read_bytes(), longest.stat().st_mode & 0o777) == (b"255 bytes", 0o600)
    os.unlink(longest)
    assert sorted(os.listdir(model)) == ["a"]


def ls_all(path: Path) -> list[tuple[str, int]]:
    """(name, inode) of every entry getdents(2) gives, in its order (ls -f: unsorted, all)."""
    out = subprocess.run(["ls", "-f", "-i", "-1", str(path)], check=True, capture_output=True, text=True).stdout
    return [(line.split(maxsplit=1)[1], int(line.split(maxsplit=1)[0])) for line in out.splitlines()]


def test_readdir_lists_dot_and_dotdot_first_with_their_inodes_then_the_entries(model):
    (model / "sub").mkdir()
    (model / "sub" / "f").write_bytes(b"f")
    (model / "z").write_bytes(b"z")
    for _ in range(3):                  # listed again and again: the kernel's references stay right
        assert ls_all(model / "sub") == [(".", (model / "sub").stat().st_ino), ("..", model.stat().st_ino),
                                         ("f", (model / "sub" / "f").stat().st_ino)]
        assert [name for name, _ in ls_all(model)] == [".", "..", "sub", "z"]
        assert [name for name, _ in ls_all(model.parent)] == [".", "..", "m"]
    assert sorted(os.listdir(model)) == ["sub", "z"]
    subprocess.run(["rm", "-r", str(model / "sub")], check=True)
    assert ls_all(model)[2:] == [("z", (model / "z").stat().st_ino)]


def test_statfs_gives_the_store_file_systems_blocks_free_and_available_apart(model, store):
    mine, theirs = os.statvfs(model), os.statvfs(store)
    assert (mine.f_frsize, mine.f_bsize, mine.f_blocks, mine.f_namemax) == (
        theirs.f_frsize, theirs.f_frsize, theirs.f_blocks, 255)
    # free and available come from one statvfs of the store's file system: the blocks reserved
    # for root (free, not available) are the same in both
    assert mine.f_bfree - mine.f_bavail == theirs.f_bfree - theirs.f_bavail
    assert abs(mine.f_bfree - theirs.f_bfree) * theirs.f_frsize < 64 << 20
    assert mine.f_blocks >= mine.f_bfree >= mine.f_bavail
    (model / "a").write_bytes(b"1")
    (model / "b").mkdir()
    after = os.statvfs(model)
    assert after.f_files - after.f_ffree == mine.f_files - mine.f_ffree + 2     # inodes used: 2 more
    assert after.f_ffree == after.f_favail == mine.f_ffree


def test_a_sparse_files_holes_take_no_blocks_written_committed_and_after_a_remount(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    head, middle = os.urandom(4096), os.urandom(4096)
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        fd = os.open(mnt / "m" / "sparse", os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, head, 0)
        os.pwrite(fd, middle, 64 << 20)
        os.ftruncate(fd, 128 << 20)
        assert (os.fstat(fd).st_size, os.fstat(fd).st_blocks) == (128 << 20, 16)   # 8 KiB written
        os.close(fd)
        (mnt / "m" / "dense").write_bytes(os.urandom(10_000))
        wait_committed(store)
        # stored: the two 1 MiB chunks that hold data; the other 126 are zeros, a hole (the kernel
        # asks again once its cached attributes expire, within a second)
        wait_for(lambda: (mnt / "m" / "sparse").stat().st_blocks == 2 * (1 << 20) // 512, 5, "st_blocks")
        assert (mnt / "m" / "dense").stat().st_blocks == 20
        fd = os.open(mnt / "m" / "sparse", os.O_RDWR)
        os.pwrite(fd, b"x" * 512, 100 << 20)            # into a stored hole, uncommitted
        assert os.fstat(fd).st_blocks == 2 * (1 << 20) // 512 + 1
        os.ftruncate(fd, 32 << 20)                      # cuts off the second chunk of data
        assert os.fstat(fd).st_blocks == (1 << 20) // 512
        os.close(fd)
        wait_committed(store)
    with mounted(mnt, store, "--writable"):
        st = (mnt / "m" / "sparse").stat()
        assert (st.st_size, st.st_blocks) == (32 << 20, (1 << 20) // 512)
        with open(mnt / "m" / "sparse", "rb") as f:
            assert f.read(4096) == head and f.read() == bytes((32 << 20) - 4096)
        assert (mnt / "m" / "dense").stat().st_blocks == 20


def test_a_shared_writable_mmap_changes_the_file_and_is_stored(model, store):
    data = bytearray(os.urandom(3 * mmap.PAGESIZE))
    (model / "mapped.bin").write_bytes(data)
    with open(model / "mapped.bin", "r+b") as f, mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED) as mapped:
        mapped[mmap.PAGESIZE + 10:mmap.PAGESIZE + 20] = b"0123456789"
        data[mmap.PAGESIZE + 10:mmap.PAGESIZE + 20] = b"0123456789"
        mapped.flush()
    assert (model / "mapped.bin").read_bytes() == bytes(data)
    wait_committed(store)
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


def test_closing_a_dup_or_a_childs_inherited_descriptor_commits_nothing_and_the_last_close_does(model, store):
    data = bytearray(os.urandom(8 << 20))
    (model / "big.bin").write_bytes(data)
    wait_committed(store)
    stored = stored_sha256(store, "big.bin")
    fd = os.open(model / "big.bin", os.O_RDWR)         # close-on-exec, as Python opens it
    try:
        for i in range(5):
            os.pwrite(fd, b"%d" % i, i * 1000)
            data[i * 1000] = ord(b"%d" % i)
            os.close(os.dup(fd))                        # a flush of the same open file
            subprocess.run(["true"], check=True)        # the child's exec closes its copy: a flush
            subprocess.run(["true"], check=True, pass_fds=(fd,))    # its exit closes it: a flush
        # none of those flushes committed (a commit reads all 8 MiB back): the store holds the old
        # bytes, the spool the new ones, and every read sees them
        assert stored_sha256(store, "big.bin") == stored
        assert os.pread(fd, 4001, 0) == bytes(data[:4001])
        os.fsync(fd)                                    # durable in the spool, not committed
        assert stored_sha256(store, "big.bin") == stored
    finally:
        os.close(fd)                                    # the last close commits, after it returns
    wait_committed(store)
    assert stored_sha256(store, "big.bin") == hashlib.sha256(data).hexdigest()
    assert (model / "big.bin").read_bytes() == bytes(data)
