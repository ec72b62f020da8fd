"""The writable mount's FUSE handlers called directly (no mount) over a real Filesystem."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pyfuse3
import pytest
import trio

from lmzfs.daemon.writable import WritableOperations
from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.fsmodel.nowait import WouldBlock, must_not_wait
from lmzfs.testing.fspaths import PathDriver


def test_flush_is_answered_enosys_so_the_kernel_sends_no_more_and_the_release_still_commits(store_dir: Path):
    fs = Filesystem(store_dir, cache_bytes=16 << 20, workers=2)
    ops = WritableOperations(fs, workers=2)
    try:
        p = PathDriver(fs)
        p.mkdir("m")

        async def main():
            parent = await ops.lookup(pyfuse3.ROOT_INODE, b"m")
            info, _ = await ops.create(parent.st_ino, b"a.txt", 0o100644, os.O_WRONLY, pyfuse3.RequestContext())
            assert await ops.write(info.fh, 0, b"hello") == 5
            with pytest.raises(pyfuse3.FUSEError) as caught:       # the kernel's FLUSH: ENOSYS
                await ops.flush(info.fh)
            assert caught.value.errno == errno.ENOSYS
            await ops.release(info.fh)

        trio.run(main)
        assert p.read_file("m/a.txt") == b"hello"
    finally:
        ops.close_all()
    fs = Filesystem(store_dir, cache_bytes=16 << 20, workers=2)
    try:
        assert PathDriver(fs).read_file("m/a.txt") == b"hello"
    finally:
        fs.close()


def test_a_new_file_opened_with_o_trunc_is_created_on_the_event_loop_and_an_existing_one_waits(store_dir: Path):
    """open(path, "w") and a shell's ">" pass O_TRUNC: a new file has nothing to truncate, so its
    create never waits (it used to hop to a worker thread, after changing the tree, every time)."""
    fs = Filesystem(store_dir, cache_bytes=16 << 20, workers=2)
    try:
        p = PathDriver(fs)
        m = p.mkdir("m").inode
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with must_not_wait():
            fh, attrs = fs.create(m, "new.txt", 0o100644, 0, 0, flags)
            assert attrs.size == 0
            assert fs.write(fh, 0, b"first") == 5
        fs.release(fh)
        with must_not_wait(), pytest.raises(WouldBlock):       # truncating what is there may wait
            fs.create(m, "new.txt", 0o100644, 0, 0, flags)
        assert p.read_file("m/new.txt") == b"first"           # ... and changed nothing
        fh, attrs = fs.create(m, "new.txt", 0o100644, 0, 0, flags)      # in a thread, it truncates
        assert attrs.size == 0
        fs.write(fh, 0, b"second")
        fs.release(fh)
        assert p.read_file("m/new.txt") == b"second"
    finally:
        fs.close()
