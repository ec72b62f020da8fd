"""The writable mount's FUSE handlers called directly (no mount) over a real Filesystem."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.fsmodel.nowait import WouldBlock, must_not_wait
from lmzfs.testing.fspaths import PathDriver


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
