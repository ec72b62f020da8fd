"""A real mount of a real store in a subprocess: what any program reading the files sees."""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import time
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import xattr

from lmzfs.daemon.mount import is_mount_point
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.testing.mount import mounted, unmount_and_stop
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model

pytestmark = pytest.mark.mount

FILES = ("model.safetensors", "model.gguf", "sub/copy-of-model.safetensors", "tokenizer.json")


@pytest.fixture(scope="module")
def real_store(tmp_path_factory, model_dir) -> Path:
    store = tmp_path_factory.mktemp("mounted") / "store"
    add_model(StorePaths(store), model_dir, "real")
    return store


@pytest.fixture
def served(real_store, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, real_store) as fs:
        yield fs.mountpoint / "real"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def test_every_served_file_has_the_original_sha256_size_mtime_and_a_read_only_mode(served, model_dir):
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == sorted(FILES)
    for rel in FILES:
        orig, got = model_dir / rel, served / rel
        assert sha256_file(got) == sha256_file(orig)
        st, ost = got.stat(), orig.stat()
        assert st.st_size == ost.st_size
        assert int(st.st_mtime) == int(ost.st_mtime)
        assert st.st_mode & 0o777 == 0o444
    assert served.stat().st_mode & 0o777 == 0o555


def test_2000_random_preads_and_an_mmap_of_each_file_equal_the_original(served, model_dir):
    rng = random.Random(2000)
    for rel in FILES:
        original = (model_dir / rel).read_bytes()
        fd = os.open(served / rel, os.O_RDONLY)
        try:
            for _ in range(500):
                off = rng.randrange(0, len(original) + 100)
                n = rng.choice([1, 3, 4096, 65536, 131072, 1 << 20, 5 << 20])
                assert os.pread(fd, n, off) == original[off:off + n]
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                assert hashlib.sha256(m).digest() == hashlib.sha256(original).digest()
                for _ in range(50):
                    off = rng.randrange(0, len(original))
                    assert m[off:off + 4096] == original[off:off + 4096]
        finally:
            os.close(fd)


def test_safetensors_and_gguf_give_the_same_tensors_through_the_mount(served, model_dir):
    from gguf import GGUFReader
    from safetensors import safe_open
    with safe_open(served / "model.safetensors", "np") as a, safe_open(model_dir / "model.safetensors", "np") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for k in a.keys():
            x, y = a.get_tensor(k), b.get_tensor(k)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    ra, rb = GGUFReader(served / "model.gguf"), GGUFReader(model_dir / "model.gguf")
    assert [t.name for t in ra.tensors] == [t.name for t in rb.tensors]
    for ta, tb in zip(ra.tensors, rb.tensors):
        assert ta.tensor_type == tb.tensor_type and np.array_equal(ta.data, tb.data)
    assert {f.name for f in ra.fields.values()} == {f.name for f in rb.fields.values()}
    del ra, rb      # they hold mmaps of the served file


def test_8_concurrent_reader_threads_get_exact_bytes(served, model_dir):
    originals = {rel: (model_dir / rel).read_bytes() for rel in FILES}
    errors: list[str] = []

    def reader(i: int) -> None:
        rng = random.Random(i)
        rel = FILES[i % len(FILES)]
        data = originals[rel]
        with open(served / rel, "rb", buffering=0) as f:
            for _ in range(150):
                off = rng.randrange(0, len(data))
                n = rng.choice([4096, 131072, 1 << 20])
                f.seek(off)
                if f.read(n) != data[off:off + n]:
                    errors.append(f"thread {i}: {rel} at {off}+{n}")
            f.seek(0)
            if hashlib.sha256(f.read()).digest() != hashlib.sha256(data).digest():
                errors.append(f"thread {i}: {rel} whole file")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_xattrs_name_the_hash_stored_bytes_and_codec(served, model_dir):
    attrs = xattr.xattr(str(served / "model.safetensors"))
    assert set(attrs.list()) >= {"user.lmz.sha256", "user.lmz.stored_bytes", "user.lmz.codec"}
    assert attrs.get("user.lmz.sha256").decode() == sha256_file(model_dir / "model.safetensors")
    stored = int(attrs.get("user.lmz.stored_bytes"))
    assert 0 < stored < (model_dir / "model.safetensors").stat().st_size
    assert attrs.get("user.lmz.codec").decode()


def test_writes_are_refused_with_erofs(served):
    for action in (lambda: open(served / "model.gguf", "r+b"), lambda: open(served / "new", "wb"),
                   lambda: (served / "d").mkdir(), lambda: (served / "tokenizer.json").unlink(),
                   lambda: os.truncate(served / "model.gguf", 0)):
        with pytest.raises(OSError) as info:
            action()
        assert info.value.errno == errno.EROFS


def small_dir(path: Path, payload: bytes) -> Path:
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(payload)
    return path


def test_models_added_and_removed_while_mounted_appear_and_disappear(tmp_path, model_dir):
    store = StorePaths(tmp_path / "store")
    a = small_dir(tmp_path / "a", os.urandom(3 << 20))
    add_model(store, a, "first")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root) as fs:
        root = fs.mountpoint
        assert os.listdir(root) == ["first"]
        b = small_dir(tmp_path / "b", os.urandom(2 << 20))
        add_model(store, b, "fam/second")
        assert _eventually(lambda: (root / "fam" / "second" / "weights.bin").exists())
        assert (root / "fam" / "second" / "weights.bin").read_bytes() == (b / "weights.bin").read_bytes()
        with open(root / "first" / "weights.bin", "rb") as still_open:
            remove_models(store, ["first"])
            assert _eventually(lambda: not (root / "first").exists())
            assert still_open.read() == (a / "weights.bin").read_bytes()
        assert sorted(os.listdir(root)) == ["fam"]


def _eventually(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.mark.allow_log_warnings
def test_a_flipped_byte_is_eio_through_the_mount_and_other_files_still_read(tmp_path):
    store = StorePaths(tmp_path / "store")
    a = small_model(tmp_path / "a", seed=11)
    b = small_model(tmp_path / "b", seed=12)
    add_model(store, a, "a")
    add_model(store, b, "b")
    bad = flip_byte_in_chunk_of(store, "a", "model.safetensors")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root) as fs:
        fd = os.open(fs.mountpoint / "a" / "model.safetensors", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as info:
                os.pread(fd, 4096, bad)
            assert info.value.errno == errno.EIO
            assert os.pread(fd, 64, 0) == (a / "model.safetensors").read_bytes()[:64]
        finally:
            os.close(fd)
        assert (fs.mountpoint / "b" / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
        assert (fs.mountpoint / "a" / "config.json").read_bytes() == (a / "config.json").read_bytes()
        assert "a/model.safetensors" in fs.log()


def lmz(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmzfs", *args], capture_output=True, text=True, timeout=60, **kw)


def test_lmz_mount_returns_with_the_mount_live_and_lmz_umount_leaves_nothing_mounted(real_store, tmp_path, model_dir):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = lmz("--store", str(real_store), "mount", str(mnt))
        assert r.returncode == 0, r.stderr
        assert is_mount_point(mnt)
        assert sha256_file(mnt / "real" / "model.gguf") == sha256_file(model_dir / "model.gguf")
        r = lmz("umount", str(mnt))
        assert r.returncode == 0, r.stderr
        assert not is_mount_point(mnt)
    finally:
        unmount_and_stop(mnt)
    assert not is_mount_point(mnt)


def test_mounting_over_a_non_empty_or_mounted_dir_or_without_a_store_is_a_clear_error(real_store, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    r = lmz("--store", str(real_store), "mount", str(full))
    assert r.returncode == 2 and "not empty" in r.stderr and "Traceback" not in r.stderr
    r = lmz("--store", str(tmp_path / "nostore"), "mount", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, real_store):
        r = lmz("--store", str(real_store), "mount", str(mnt))
        assert r.returncode == 2 and "already" in r.stderr and "Traceback" not in r.stderr


def test_a_store_on_a_read_only_file_system_is_served_listed_and_verified(tmp_path, tmpfs, monkeypatch):
    runtime = tmp_path / "run"         # where the mount logs, its store being read-only
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    disk = tmpfs("16m")
    src = small_model(tmp_path / "src", seed=50, mib=2)
    store = disk / "store"
    add_model(StorePaths(store), src, "m")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)     # read-only media, say
    want = (src / "model.safetensors").read_bytes()
    r = lmz("--store", str(store), "ls")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[0] == "m", r.stderr
    assert lmz("--store", str(store), "verify").returncode == 0
    assert subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "cat", "m/model.safetensors"],
                          capture_output=True, check=True).stdout == want
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = lmz("--store", str(store), "mount", str(mnt))      # logs beside the store if it may
        assert r.returncode == 0, r.stderr
        assert (mnt / "m" / "model.safetensors").read_bytes() == want
        (log,) = runtime.glob(f"lmzfs-{os.getuid()}-*-mount.log")
        assert "serving" in log.read_text()
        assert lmz("umount", str(mnt)).returncode == 0
    finally:
        unmount_and_stop(mnt)
    r = lmz("--store", str(store), "rm", "m")
    assert (r.returncode, r.stderr) == (2, f"lmz: cannot write to the store: {store}/lock: Read-only file system\n")


def test_the_stats_file_counts_what_was_served_and_is_hidden_from_listings(served, model_dir):
    import json
    root = served.parent
    assert os.listdir(root) == ["real"]
    data = (served / "tokenizer.json").read_bytes()
    assert data == (model_dir / "tokenizer.json").read_bytes()
    stats = json.loads((root / ".lmzfs" / "stats.json").read_bytes())
    assert stats["reader"]["bytes_served"] >= len(data)
    assert stats["reader"]["corrupt_chunks"] == 0
    from lmzfs.hostresources import default_cache_size
    assert stats["cache"]["capacity_bytes"] == default_cache_size()     # sized for this host by default


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may widen a mount's read-ahead window")
def test_a_reader_that_opens_as_soon_as_the_mountpoint_appears_gets_reads_of_up_to_1_mib(real_store, tmp_path, model_dir):
    # The mountpoint appears before the daemon widens the window, and the kernel gives a file the
    # window it finds when its open is answered: the daemon holds opens until it has widened it.
    import json
    from lmzfs.testing.mount import daemon_command
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(daemon_command(mnt, real_store), stdin=devnull)
    try:
        deadline = time.monotonic() + 30
        while not is_mount_point(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not mount"
            time.sleep(0.001)
        with open(mnt / "real" / "model.gguf", "rb") as f:      # at once, as an impatient reader would
            data = f.read()
        assert data == (model_dir / "model.gguf").read_bytes()
        stats = json.loads((mnt / ".lmzfs" / "stats.json").read_bytes())["daemon"]
        requests = stats["reads_inline"] + stats["reads_threaded"]
        assert requests <= len(data) // (512 << 10)     # 128 KiB requests would be 8x as many
        device = os.stat(mnt).st_dev
        knob = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
        assert knob.read_text().strip() == "1024"
    finally:
        unmount_and_stop(mnt, proc)
    assert not is_mount_point(mnt)


def test_sigterm_during_heavy_reads_unmounts_cleanly_and_no_reader_gets_wrong_bytes(real_store, tmp_path, model_dir):
    import signal
    originals = {rel: (model_dir / rel).read_bytes() for rel in ("model.safetensors", "model.gguf")}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    wrong: list[str] = []
    failures: list[int] = []
    stop = threading.Event()

    def reader(i: int, root: Path) -> None:
        rng = random.Random(i)
        rel = list(originals)[i % 2]
        data = originals[rel]
        while not stop.is_set():
            try:
                with open(root / "real" / rel, "rb", buffering=0) as f:
                    off = rng.randrange(0, len(data))
                    f.seek(off)
                    got = f.read(1 << 20)
                if got != data[off:off + len(got)] or (not got and off < len(data)):
                    wrong.append(f"{rel} at {off}")
            except OSError as exc:
                failures.append(exc.errno)
                time.sleep(0.01)

    with mounted(mnt, real_store, "--cache-bytes", str(8 << 20)) as fs:
        threads = [threading.Thread(target=reader, args=(i, fs.mountpoint)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        fs.process.send_signal(signal.SIGTERM)
        assert fs.process.wait(timeout=20) == 0, fs.log()
        assert not is_mount_point(mnt)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
    assert wrong == []
    assert failures, "the readers should have seen the mount go away"
