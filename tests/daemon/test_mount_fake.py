"""A real FUSE mount, in a subprocess, serving a FakeArchive."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import xattr

from lmzfs.daemon.mount import is_mount_point, mount, umount
from lmzfs.testing.fake_archive import FakeArchive, open_saved
from lmzfs.testing.mount import FAKE_ARCHIVE_FACTORY, daemon_command, mounted, unmount_and_stop

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                       reason="needs /dev/fuse and fusermount3"),
]

BIG = random.Random(7).randbytes(5 * 1024 * 1024)
FILES = {
    ("minilm", "model.safetensors"): BIG,
    ("minilm", "tokenizer/vocab.txt"): b"[PAD]\n[UNK]\n[CLS]\n",
    ("run1/step-1000", "config.json"): b'{"hidden_size": 384}\n',
    ("run1/step-1000", "empty.bin"): b"",
}
BIG_PATH = "minilm/model.safetensors"


def make_fake() -> FakeArchive:
    fake = FakeArchive()
    for (model, path), data in FILES.items():
        fake.add(model, path, data, codecs="bytegroup,zstd")
    return fake


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "mnt").mkdir()
    return tmp_path / "mnt", tmp_path / "store"


@pytest.fixture
def served(dirs):
    mountpoint, store = dirs
    with mounted(mountpoint, store, fake=make_fake()) as fs:
        yield fs


def in_proc_mounts(mountpoint: Path) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == str(mountpoint) for line in mounts)


def run_daemon(mountpoint, store, *args) -> subprocess.CompletedProcess:
    return subprocess.run(daemon_command(mountpoint, store, "--archive-factory", FAKE_ARCHIVE_FACTORY, *args),
                          capture_output=True, text=True, timeout=60)


def test_every_file_is_served_byte_for_byte(served):
    root = served.mountpoint
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert found == sorted(f"{model}/{path}" for model, path in FILES)
    for (model, path), data in FILES.items():
        served_file = root / model / path
        assert hashlib.sha256(served_file.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
        assert served_file.stat().st_size == len(data)
        assert oct(served_file.stat().st_mode & 0o777) == oct(0o444)
    assert oct((root / "run1").stat().st_mode & 0o777) == oct(0o555)


def test_random_preads(served):
    rng = random.Random(8)
    fd = os.open(served.mountpoint / BIG_PATH, os.O_RDONLY)
    try:
        for _ in range(300):
            off = rng.randrange(0, len(BIG) + 100)
            size = rng.choice([1, 4095, 4096, 65536, 1 << 20, rng.randrange(1, 300_000)])
            assert os.pread(fd, size, off) == BIG[off:off + size]
    finally:
        os.close(fd)


def test_mmap_matches(served):
    with open(served.mountpoint / BIG_PATH, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[len(BIG) - 10_000:] == BIG[len(BIG) - 10_000:]
        assert m[12345:999_999] == BIG[12345:999_999]
        assert m[:] == BIG


def test_eight_concurrent_readers(served):
    failures = []

    def reader(seed):
        rng = random.Random(seed)
        try:
            with open(served.mountpoint / BIG_PATH, "rb", buffering=0) as f:
                for _ in range(100):
                    off, size = rng.randrange(len(BIG)), rng.randrange(1, 256 * 1024)
                    if os.pread(f.fileno(), size, off) != BIG[off:off + size]:
                        failures.append((seed, off, size))
        except Exception as exc:          # reported below, not lost in the thread
            failures.append((seed, repr(exc)))

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []


def test_writes_fail_with_erofs(served):
    root = served.mountpoint
    existing = root / "run1/step-1000/config.json"
    attempts = {
        "open for write": lambda: open(existing, "r+b"),
        "truncate": lambda: open(existing, "wb"),
        "touch new file": lambda: (root / "minilm" / "new").touch(),
        "touch existing": lambda: os.utime(existing),
        "mkdir": lambda: (root / "newdir").mkdir(),
        "unlink": lambda: existing.unlink(),
        "rename": lambda: existing.rename(root / "run1/x"),
        "chmod": lambda: existing.chmod(0o644),
        "setxattr": lambda: xattr.setxattr(str(existing), "user.x", b"1"),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS, what
    assert existing.read_bytes() == FILES[("run1/step-1000", "config.json")]


def test_xattrs(served):
    path = str(served.mountpoint / BIG_PATH)
    assert xattr.getxattr(path, "user.lmz.sha256") == hashlib.sha256(BIG).hexdigest().encode()
    assert xattr.getxattr(path, "user.lmz.stored_bytes") == str(len(BIG)).encode()
    assert xattr.getxattr(path, "user.lmz.codec") == b"bytegroup,zstd"
    assert {"user.lmz.sha256", "user.lmz.stored_bytes", "user.lmz.codec"} <= set(xattr.listxattr(path))


def test_statfs(served):
    st = os.statvfs(served.mountpoint)
    assert st.f_bsize == 4096 and st.f_bfree == 0 and st.f_bavail == 0
    assert st.f_blocks == (sum(len(d) for d in FILES.values()) + 4095) // 4096
    assert st.f_files == len(FILES)


def wait_for(condition, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_models_added_and_removed_while_mounted(dirs):
    mountpoint, store = dirs
    fake = make_fake()
    with mounted(mountpoint, store, fake=fake) as fs:
        removed = mountpoint / BIG_PATH
        assert removed.stat().st_size == len(BIG)             # now known to the kernel
        with open(removed, "rb") as still_open:
            fake.add("run1/step-2000", "config.json", b"{}")
            fake.remove("minilm")
            fake.save(store)
            assert wait_for(lambda: (mountpoint / "run1/step-2000/config.json").exists())
            # Well inside the 10 s entry timeout: the daemon told the kernel to forget it.
            assert wait_for(lambda: not removed.exists())
            assert sorted(os.listdir(mountpoint)) == ["run1"]
            assert (mountpoint / "run1/step-2000/config.json").read_bytes() == b"{}"
            assert os.pread(still_open.fileno(), 100_000, 2_000_000) == BIG[2_000_000:2_100_000]
            assert os.fstat(still_open.fileno()).st_size == len(BIG)
        assert " ERROR " not in fs.log() and " WARNING " not in fs.log(), fs.log()


def test_large_directory_lists_completely(dirs):
    mountpoint, store = dirs
    fake = FakeArchive()
    names = [f"shard-{i:05d}-{'x' * 40}.bin" for i in range(3000)]     # many readdir calls
    for name in names:
        fake.add("sharded", name, name.encode())
    with mounted(mountpoint, store, fake=fake):
        assert sorted(os.listdir(mountpoint / "sharded")) == names
        assert (mountpoint / "sharded" / names[-1]).read_bytes() == names[-1].encode()


@pytest.mark.allow_log_warnings
def test_corrupt_range_reads_fail_with_eio(dirs):
    mountpoint, store = dirs
    fake = make_fake()
    fake.corrupt("minilm", "model.safetensors", 3 * 1024 * 1024)
    with mounted(mountpoint, store, fake=fake) as fs:
        with open(mountpoint / BIG_PATH, "rb", buffering=0) as f:
            assert os.pread(f.fileno(), 4096, 0) == BIG[:4096]
            with pytest.raises(OSError) as caught:
                os.pread(f.fileno(), 4096, 3 * 1024 * 1024)
            assert caught.value.errno == errno.EIO
        assert wait_for(lambda: "offset 3145728" in fs.log() or "damaged" in fs.log())
        assert "model.safetensors" in fs.log()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(dirs, signum):
    mountpoint, store = dirs
    with mounted(mountpoint, store, fake=make_fake()) as fs:
        assert (mountpoint / "run1/step-1000/config.json").exists()
        fs.process.send_signal(signum)
        assert fs.process.wait(timeout=15) == 0, fs.log()
        assert not in_proc_mounts(mountpoint)
        assert "Traceback" not in fs.log()


def test_mounted_unmounts_even_when_the_test_fails(dirs):
    mountpoint, store = dirs
    with pytest.raises(RuntimeError, match="test failed"):
        with mounted(mountpoint, store, fake=make_fake()) as fs:
            busy = open(mountpoint / BIG_PATH, "rb")       # makes a plain unmount fail with EBUSY
            raise RuntimeError("test failed")
    with contextlib.suppress(OSError):     # its server is gone: close reports ENOTCONN
        busy.close()
    assert not in_proc_mounts(mountpoint)
    assert fs.process.returncode is not None


def test_mount_errors_are_one_line_with_status_2(dirs, tmp_path):
    mountpoint, store = dirs
    make_fake().save(store)
    not_empty = tmp_path / "full"
    not_empty.mkdir()
    (not_empty / "x").write_text("x")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = {
        not_empty: "not empty",
        tmp_path / "missing": "does not exist",
        a_file: "not a directory",
    }
    for target, message in cases.items():
        result = run_daemon(target, store)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    result = run_daemon(mountpoint, tmp_path / "no-store")
    assert result.returncode == 2 and "lmz add" in result.stderr and "Traceback" not in result.stderr
    assert not is_mount_point(mountpoint)


def test_mounting_on_a_mounted_dir_fails(served):
    store = served.mountpoint.parent / "store"
    foreground = run_daemon(served.mountpoint, store)
    background = subprocess.run(
        [sys.executable, "-m", "lmzfs.daemon", "--store", str(store), "--archive-factory", FAKE_ARCHIVE_FACTORY,
         str(served.mountpoint)], capture_output=True, text=True, timeout=60)
    for result in (foreground, background):
        assert result.returncode == 2, result.stderr
        assert "already a mount point" in result.stderr and result.stderr.count("\n") == 1
    assert (served.mountpoint / "run1").is_dir()                # the first mount is untouched


def test_background_mount_and_umount(dirs, capsys):
    mountpoint, store = dirs
    make_fake().save(store)
    try:
        assert mount(mountpoint, store, foreground=False, allow_other=False, cache_bytes=1 << 20,
                     archive_factory=open_saved) == 0
        assert is_mount_point(mountpoint)        # live as soon as mount() returns
        assert (mountpoint / BIG_PATH).read_bytes() == BIG
        assert mount(mountpoint, store, foreground=False, allow_other=False, cache_bytes=1 << 20,
                     archive_factory=open_saved) == 2
        assert "already a mount point" in capsys.readouterr().err
        assert umount(mountpoint) == 0
        assert not is_mount_point(mountpoint)
        assert umount(mountpoint) == 2 and "not mounted" in capsys.readouterr().err
    finally:
        unmount_and_stop(mountpoint)
    # The server exits once unmounted; the launcher's reaper thread collects it.
    reapers = [t for t in threading.enumerate() if t.name.startswith("lmzfs-daemon-")]
    for t in reapers:
        t.join(timeout=15)
        assert not t.is_alive()
    assert "serving" in (store / "mount.log").read_text()


def test_background_mount_reports_the_servers_error(dirs, capsys):
    mountpoint, store = dirs
    store.mkdir()                                  # a store, but no saved fake in it
    status = mount(mountpoint, store, foreground=False, allow_other=False, cache_bytes=1 << 20,
                   archive_factory=FAKE_ARCHIVE_FACTORY)
    err = capsys.readouterr().err
    assert status == 1 and "cannot open the store" in err and "no saved fake archive" in err
    assert not is_mount_point(mountpoint)


def test_python_m_lmzfs_daemon_help():
    result = subprocess.run([sys.executable, "-m", "lmzfs.daemon", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--foreground" in result.stdout and "--ready-fd" not in result.stdout
