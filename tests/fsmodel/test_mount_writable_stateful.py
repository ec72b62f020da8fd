"""Random operation sequences on a writable mount and on a plain directory must agree: every call
succeeds on both or fails on both with the same errno, reads return the same bytes, and the trees
end identical.

The default run is sized to take about 20 seconds; LMZ_RW_OPS=5000 runs at least 5,000 operations
(docs/writable.md, "Testing the writable mount").
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from lmzfs.store.layout import StorePaths
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted

STEPS = 50
OPS = int(os.environ.get("LMZ_RW_OPS", "600"))

DIRS = ["d0", "d1", "d0/s"]
FILES = ["f0", "f1", "f2", "d0/f0", "d0/f1", "d1/f0", "d0/s/f0"]
NAMES = DIRS + FILES


def outcome(call, *args):
    """("ok", result) or ("error", errno): what both sides must agree on."""
    try:
        return "ok", call(*args)
    except OSError as exc:
        return "error", exc.errno


def snapshot(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[str((Path(dirpath) / name).relative_to(root))] = "dir"
        for name in filenames:
            path = Path(dirpath) / name
            data = path.read_bytes()
            out[str(path.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


class MountAgreesWithADirectory(RuleBasedStateMachine):
    mountpoint: Path
    counter = 0
    operations = 0

    def __init__(self):
        super().__init__()
        cls = type(self)
        cls.counter += 1
        self.model = cls.mountpoint / f"run{cls.counter}"
        os.mkdir(self.model)
        self.reference = Path(tempfile.mkdtemp(prefix="lmz-rw-reference-"))
        self.fds: list[tuple[int, int, str]] = []     # (fd on the mount, fd on the reference, path)

    def both(self, call, rel: str, *args):
        a = outcome(call, str(self.model / rel), *args)
        b = outcome(call, str(self.reference / rel), *args)
        assert a[0] == b[0] and (a[0] == "ok" or a[1] == b[1]), f"{call.__name__}({rel}): mount {a}, directory {b}"
        return a, b

    @rule(name=st.sampled_from(DIRS))
    def mkdir(self, name):
        self.both(os.mkdir, name)

    @rule(name=st.sampled_from(DIRS))
    def rmdir(self, name):
        self.both(os.rmdir, name)

    @rule(name=st.sampled_from(FILES), trunc=st.booleans(), append=st.booleans())
    def open_file(self, name, trunc, append):
        if len(self.fds) >= 6:
            return
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if trunc else 0) | (os.O_APPEND if append else 0)
        a, b = self.both(os.open, name, flags, 0o644)
        if a[0] == "ok":
            self.fds.append((a[1], b[1], name))

    @precondition(lambda self: self.fds)
    @rule(index=st.integers(0, 5), offset=st.one_of(st.integers(0, 300_000), st.integers(1_000_000, 2_200_000)),
          size=st.integers(1, 70_000), seed=st.integers(0, 255))
    def write(self, index, offset, size, seed):
        fd_a, fd_b, _ = self.fds[index % len(self.fds)]
        data = bytes((seed + i * 7) % 256 for i in range(min(size, 512))) * (size // 512 + 1)
        data = data[:size]
        assert os.pwrite(fd_a, data, offset) == os.pwrite(fd_b, data, offset)

    @precondition(lambda self: self.fds)
    @rule(index=st.integers(0, 5), offset=st.integers(0, 2_300_000), size=st.integers(1, 200_000))
    def read(self, index, offset, size):
        fd_a, fd_b, name = self.fds[index % len(self.fds)]
        assert os.pread(fd_a, size, offset) == os.pread(fd_b, size, offset), name

    @precondition(lambda self: self.fds)
    @rule(index=st.integers(0, 5), size=st.one_of(st.integers(0, 100_000), st.integers(900_000, 2_200_000)))
    def ftruncate(self, index, size):
        fd_a, fd_b, _ = self.fds[index % len(self.fds)]
        os.ftruncate(fd_a, size)
        os.ftruncate(fd_b, size)

    @precondition(lambda self: self.fds)
    @rule(index=st.integers(0, 5))
    def fsync(self, index):
        fd_a, fd_b, _ = self.fds[index % len(self.fds)]
        os.fsync(fd_a)
        os.fsync(fd_b)

    @precondition(lambda self: self.fds)
    @rule(index=st.integers(0, 5))
    def close(self, index):
        fd_a, fd_b, _ = self.fds.pop(index % len(self.fds))
        os.close(fd_a)
        os.close(fd_b)

    @rule(name=st.sampled_from(FILES), size=st.integers(0, 50_000))
    def truncate_by_path(self, name, size):
        self.both(os.truncate, name, size)

    @rule(old=st.sampled_from(NAMES), new=st.sampled_from(NAMES))
    def rename(self, old, new):
        a = outcome(os.rename, str(self.model / old), str(self.model / new))
        b = outcome(os.rename, str(self.reference / old), str(self.reference / new))
        assert a[0] == b[0] and (a[0] == "ok" or a[1] == b[1]), f"rename({old}, {new}): mount {a}, directory {b}"

    @rule(name=st.sampled_from(FILES))
    def unlink(self, name):
        self.both(os.unlink, name)

    @rule(name=st.sampled_from(FILES))
    def read_whole_file(self, name):
        a, b = self.both(lambda p: Path(p).read_bytes(), name)
        assert a == b, name

    @invariant()
    def listings_agree(self):
        type(self).operations += 1
        for rel in [""] + DIRS:
            a = outcome(lambda p: sorted(os.listdir(p)), str(self.model / rel))
            b = outcome(lambda p: sorted(os.listdir(p)), str(self.reference / rel))
            assert a == b, rel

    def teardown(self):
        try:
            for fd_a, fd_b, _ in self.fds:
                os.close(fd_a)
                os.close(fd_b)
            assert snapshot(self.model) == snapshot(self.reference)
        finally:
            shutil.rmtree(self.reference, ignore_errors=True)
            shutil.rmtree(self.model)


def test_random_operations_on_the_mount_and_on_a_directory_agree(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable"):
        MountAgreesWithADirectory.mountpoint = mnt
        run_state_machine_as_test(MountAgreesWithADirectory, settings=settings(
            max_examples=OPS * 6 // (5 * STEPS) + 1, stateful_step_count=STEPS, deadline=None,
            suppress_health_check=list(HealthCheck), derandomize="LMZ_RW_OPS" not in os.environ))
        print(f"{MountAgreesWithADirectory.operations} operations in {MountAgreesWithADirectory.counter} sequences")
        if "LMZ_RW_OPS" in os.environ:
            assert MountAgreesWithADirectory.operations >= OPS
    assert verify_store(StorePaths(store)).ok
