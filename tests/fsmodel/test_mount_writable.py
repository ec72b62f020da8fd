"""`lmz mount --writable` through a real FUSE mount (every mount is unmounted, even on failure)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted, wait_committed, wait_for
from lmzfs.testing.spool import spool_listing


def usage(store: Path) -> dict[str, tuple[int, int, int]]:
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return {u.name: (u.files, u.logical_bytes, u.stored_bytes) for u in catalog.usage()}
    finally:
        catalog.close()


def tree_of(root: Path) -> dict[str, object]:
    """Every entry below root: a file's bytes, a symlink's target, a directory as None, with modes."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", oct(st.st_mode & 0o7777))
            else:
                out[rel] = ("file", oct(st.st_mode & 0o7777), hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def test_cp_of_a_safetensors_model_stores_as_lmz_add_does_reads_back_and_rm_r_removes_it(
        tmp_path, minilm_path):
    source = tmp_path / "src"
    source.mkdir()
    shutil.copyfile(minilm_path, source / "model.safetensors")
    (source / "config.json").write_text(json.dumps({"hidden_size": 384, "layers": 6}))
    reference = tmp_path / "reference-store"
    add_model(StorePaths(reference), source, "minilm")
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable"):
        (mnt / "minilm").mkdir()
        subprocess.run(["cp", "-r", f"{source}/.", str(mnt / "minilm")], check=True)
        wait_committed(store)           # each file commits as cp closes it, cp not waiting
        # the header's JSON, coded quickly by the commit, is coded as `lmz add` codes it once the
        # mount is idle (fsmodel/recodetext.py)
        wait_for(lambda: usage(store) == usage(reference), 60, "the store as lmz add stores the model")
        assert (mnt / "minilm" / "model.safetensors").read_bytes() == minilm_path.read_bytes()
        assert sorted(os.listdir(mnt / "minilm")) == ["config.json", "model.safetensors"]
        subprocess.run(["rm", "-r", str(mnt / "minilm")], check=True)
        assert os.listdir(mnt) == []
    assert usage(store) == {}
    assert verify_store(StorePaths(store)).ok


def test_ordinary_files_directories_symlinks_and_modes_round_trip_across_a_remount(tmp_path):
    source = tmp_path / "src"
    (source / "pkg" / "sub").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "pkg" / "mod.py").write_text("def f():\n    return 1\n" * 200)
    (source / "pkg" / "sub" / "data.json").write_text(json.dumps({"k": list(range(1000))}))
    (source / "run.log").write_bytes(os.urandom(3000) + b"\n" * 5000)
    (source / "pkg" / "mod.py").chmod(0o600)
    (source / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "script.sh").chmod(0o755)
    os.symlink("pkg/mod.py", source / "link")
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable"):
        (mnt / "proj").mkdir()
        subprocess.run(["cp", "-a", f"{source}/.", str(mnt / "proj")], check=True)
        assert tree_of(mnt / "proj") == tree_of(source)
    with mounted(mnt, store, "--writable"):
        assert tree_of(mnt / "proj") == tree_of(source)
        assert (mnt / "proj" / "script.sh").stat().st_mtime_ns == (source / "script.sh").stat().st_mtime_ns
    with mounted(mnt, store):              # the read-only mount serves the files as stored
        assert (mnt / "proj" / "pkg" / "mod.py").read_bytes() == (source / "pkg" / "mod.py").read_bytes()
    assert verify_store(StorePaths(store)).ok


def test_a_second_writable_mount_of_the_store_is_refused_in_one_line(tmp_path):
    store, mnt, other = tmp_path / "store", tmp_path / "mnt", tmp_path / "other"
    mnt.mkdir()
    other.mkdir()
    with mounted(mnt, store, "--writable"):
        run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "mount", "--writable",
                              str(other)], capture_output=True, text=True)
        assert run.returncode == 2
        assert run.stderr.strip().splitlines() == [
            f"lmz: the store {store} is already mounted writable by another process "
            f"(one writable mount per store; unmount it first)"]
        assert not os.path.ismount(other)


def test_lmz_add_while_a_writable_mount_runs_shows_its_model_and_both_stay_consistent(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    source = tmp_path / "src"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(200_000))
    with mounted(mnt, store, "--writable"):
        (mnt / "mine").mkdir()
        (mnt / "mine" / "a.txt").write_text("written through the mount")
        run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "add", str(source),
                              "--name", "added"], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        for _ in range(100):
            if (mnt / "added").exists():
                break
            import time
            time.sleep(0.05)
        assert (mnt / "added" / "weights.bin").read_bytes() == (source / "weights.bin").read_bytes()
        (mnt / "mine" / "b.txt").write_text("after the add")
    assert sorted(usage(store)) == ["added", "mine"]
    assert verify_store(StorePaths(store)).ok


def test_kill_9_of_the_daemon_after_writes_fsyncd_or_not_loses_nothing_written(tmp_path):
    """At several random points: write random files (some rewritten in the middle, truncated or
    renamed), fsync each or not, kill -9 the daemon, remount: every byte write() accepted is
    there under its last name and verify is clean."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(27)
    expected: dict[str, bytes] = {}
    synced_rounds = unsynced_rounds = 0
    for round_ in range(int(os.environ.get("LMZ_RW_KILLS", "4"))):
        sync = round_ % 2 == 0 if round_ < 2 else rng.random() < 0.5
        synced_rounds += sync
        unsynced_rounds += not sync
        with mounted(mnt, store, "--writable") as fs:
            model = mnt / "ckpt"
            if round_ == 0:
                model.mkdir()
            assert sorted(os.listdir(model)) == sorted(expected), f"round {round_}"
            for rel, data in expected.items():
                assert (model / rel).read_bytes() == data, f"round {round_}: {rel}"
            for i in range(rng.randint(1, 4)):
                rel = f"f{rng.randrange(6)}.bin"
                data = bytearray(expected.get(rel, b""))
                fd = os.open(model / rel, os.O_RDWR | os.O_CREAT)
                try:
                    offset = rng.randrange(len(data) + 1)
                    piece = os.urandom(rng.randint(1, 300_000))
                    os.pwrite(fd, piece, offset)
                    data[offset:offset + len(piece)] = piece
                    if rng.random() < 0.3:
                        size = rng.randrange(len(data) + 1)
                        os.ftruncate(fd, size)
                        data = data[:size]
                    if sync:
                        os.fsync(fd)
                    expected[rel] = bytes(data)
                    if rng.random() < 0.3:
                        new_rel = f"f{rng.randrange(6)}.bin"
                        os.rename(model / rel, model / new_rel)
                        expected[new_rel] = expected.pop(rel)
                    if rng.random() < 0.5:          # killed with the file still open
                        fs.process.kill()
                        fs.process.wait()
                        break
                finally:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if fs.process.poll() is None:
                fs.process.kill()
                fs.process.wait()
    with mounted(mnt, store, "--writable"):
        assert sorted(os.listdir(mnt / "ckpt")) == sorted(expected)
        for rel, data in expected.items():
            assert (mnt / "ckpt" / rel).read_bytes() == data
    report = verify_store(StorePaths(store))
    assert report.ok and report.files == len(expected)
    assert synced_rounds and unsynced_rounds


def test_kill_9_after_writes_never_fsyncd_keeps_new_overwritten_truncated_renamed_and_appended_files(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    stored = os.urandom(1 << 20)
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        for name, data in (("stored", stored), ("shrunk", stored), ("log", b"line 1\n"), ("old", b"x")):
            (mnt / "m" / name).write_bytes(data)
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "m" / "new").write_bytes(b"new " * 50_000)
        fds = [os.open(mnt / "m" / name, flags) for name, flags in (
            ("stored", os.O_RDWR), ("shrunk", os.O_WRONLY), ("log", os.O_WRONLY | os.O_APPEND),
            ("old", os.O_WRONLY | os.O_TRUNC), ("fresh", os.O_WRONLY | os.O_CREAT))]
        os.pwrite(fds[0], b"MIDDLE", 500_000)
        os.ftruncate(fds[1], 123_456)
        os.write(fds[2], b"line 2\n")
        os.write(fds[3], b"rewritten then renamed")
        os.write(fds[4], b"a new file never closed")
        os.rename(mnt / "m" / "old", mnt / "m" / "renamed")
        fs.process.kill()               # all but "new" still open: none committed, none fsync'd
        fs.process.wait()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass                    # the daemon is gone
    changed = stored[:500_000] + b"MIDDLE" + stored[500_006:]
    with mounted(mnt, store, "--writable"):
        assert sorted(os.listdir(mnt / "m")) == ["fresh", "log", "new", "renamed", "shrunk", "stored"]
        assert (mnt / "m" / "fresh").read_bytes() == b"a new file never closed"
        assert (mnt / "m" / "stored").read_bytes() == changed
        assert (mnt / "m" / "shrunk").read_bytes() == stored[:123_456]
        assert (mnt / "m" / "log").read_bytes() == b"line 1\nline 2\n"
        assert (mnt / "m" / "renamed").read_bytes() == b"rewritten then renamed"
        assert (mnt / "m" / "new").read_bytes() == b"new " * 50_000
    assert verify_store(StorePaths(store)).ok
    run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "verify"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture
def small_filesystem(tmpfs) -> Path:
    return tmpfs("24m", "small")


def test_a_full_disk_gives_enospc_to_the_writer_loses_nothing_fsyncd_and_reads_go_on(small_filesystem, tmp_path):
    store, mnt = small_filesystem / "store", tmp_path / "mnt"
    mnt.mkdir()
    kept = os.urandom(2 << 20)
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "ck").mkdir()
        with open(mnt / "ck" / "kept.bin", "wb") as f:
            f.write(kept)
            f.flush()
            os.fsync(f.fileno())
        wait_committed(store)
        packed = sum(p.stat().st_size for p in (store / "packs").iterdir())
        fd = os.open(mnt / "ck" / "filler.bin", os.O_CREAT | os.O_WRONLY)
        with pytest.raises(OSError) as full:
            for _ in range(64):
                os.write(fd, os.urandom(1 << 20))
        assert full.value.errno == errno.ENOSPC
        os.close(fd)                         # returns at once; the commit it starts cannot be written
        wait_for(lambda: "committing ck/filler.bin: [Errno 28]" in fs.log(), what="the failed commit's log line")
        # the failed commit cut what it had appended: the packs hold what they held before
        assert sum(p.stat().st_size for p in (store / "packs").iterdir()) == packed
        assert (mnt / "ck" / "kept.bin").read_bytes() == kept
        os.unlink(mnt / "ck" / "filler.bin")  # frees the spool's bytes
        (mnt / "ck" / "after.txt").write_text("space again")
    with mounted(mnt, store, "--writable"):
        assert sorted(os.listdir(mnt / "ck")) == ["after.txt", "kept.bin"]
        assert (mnt / "ck" / "kept.bin").read_bytes() == kept
    assert verify_store(StorePaths(store)).ok


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as caught:
        call(*args)
    return caught.value.errno


def empty_files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file() and p.stat().st_size == 0)


def test_a_catalog_copy_that_finds_the_disk_full_leaves_no_empty_file_behind(tmpfs, tmp_path):
    import time
    from lmzfs.testing.smalldisk import fill
    disk = tmpfs("16m", "small")
    store, mnt = disk / "store", tmp_path / "mnt"
    mnt.mkdir()
    due = store / "catalog.sqlite.copy-due"
    with mounted(mnt, store, "--writable"):
        for attempt in range(5):
            (mnt / f"m{attempt}").mkdir()           # a change: a copy of the catalog is due
            filler = fill(disk)
            if due.exists():
                break
            filler.unlink()                         # the copy was written before the disk filled
        time.sleep(6)                               # the mount tries a copy every 5 s, and fails
        assert due.exists()
        assert empty_files(store) == ["catalog.sqlite.copy-due", "lock"]     # mount.lock names the boot
        filler.unlink()
        wait_for(lambda: not due.exists(), 15, "the catalog's copy")
        assert empty_files(store) == ["lock"]
        assert len(list(store.glob("catalog.sqlite.copy-[0-9]*"))) >= 1


def test_an_fsync_that_finds_the_disk_full_fails_and_leaves_no_empty_spool_record(tmpfs, tmp_path):
    from lmzfs.testing.smalldisk import fill
    disk = tmpfs("16m", "small")
    store, mnt = disk / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        fd = os.open(mnt / "m" / "a.bin", os.O_CREAT | os.O_WRONLY)
        try:
            os.write(fd, b"spooled " * 10_000)
            filler = fill(disk)
            assert errno_of(os.fsync, fd) == errno.ENOSPC
            assert [p.name for p in (store / "spool").iterdir() if p.suffix != ".data" and p.stat().st_size == 0] \
                == []                               # mount.lock holds the boot id of the mount
            filler.unlink()
            os.fsync(fd)
        finally:
            os.close(fd)
        wait_committed(store)
        assert spool_listing(store) == ["mount.lock"]
        assert (mnt / "m" / "a.bin").read_bytes() == b"spooled " * 10_000


def test_several_writers_on_different_files_and_lmz_gc_meanwhile_keep_every_byte(tmp_path):
    import threading
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    contents = {f"w{i}.bin": os.urandom(300_000 + i * 1000) for i in range(4)}
    errors: list[BaseException] = []

    def writer(name: str, data: bytes) -> None:
        try:
            for round_ in range(3):             # rewritten: each round leaves garbage for gc
                with open(mnt / "m" / name, "wb") as f:
                    for off in range(0, len(data), 64 << 10):
                        f.write(data[off:off + (64 << 10)] if round_ == 2 else os.urandom(64 << 10))
        except BaseException as exc:
            errors.append(exc)

    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        threads = [threading.Thread(target=writer, args=item) for item in contents.items()]
        for t in threads:
            t.start()
        gcs = 0
        while any(t.is_alive() for t in threads) or gcs == 0:
            run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "gc"],
                                 capture_output=True, text=True)
            assert run.returncode == 0, run.stderr
            gcs += 1
        for t in threads:
            t.join()
        assert errors == []
        for name, data in contents.items():
            assert (mnt / "m" / name).read_bytes() == data
    assert verify_store(StorePaths(store)).ok


def test_kill_9_during_commits_leaves_the_store_consistent_and_every_fsyncd_file_whole(tmp_path):
    """The daemon killed while close() commits fsync'd files: after a remount each file is whole
    (committed before the kill, or replayed from the spool), verify is clean and gc works."""
    import threading
    import time
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(2027)
    expected: dict[str, bytes] = {}
    for round_ in range(3):
        with mounted(mnt, store, "--writable") as fs:
            if round_ == 0:
                (mnt / "m").mkdir()
            for rel, data in expected.items():
                assert (mnt / "m" / rel).read_bytes() == data
            fds = []
            for i in range(3):
                rel = f"r{round_}-{i}.bin"
                data = os.urandom(rng.randint(1 << 20, 3 << 20))
                fd = os.open(mnt / "m" / rel, os.O_CREAT | os.O_WRONLY)
                os.write(fd, data)
                os.fsync(fd)
                expected[rel] = data
                fds.append(fd)

            def close_all() -> None:
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass            # the daemon is gone

            closer = threading.Thread(target=close_all)
            closer.start()
            time.sleep(rng.uniform(0.0, 0.4))
            fs.process.kill()
            fs.process.wait()
            closer.join()
    with mounted(mnt, store, "--writable"):
        for rel, data in expected.items():
            assert (mnt / "m" / rel).read_bytes() == data
    assert verify_store(StorePaths(store)).ok
    run = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), "gc"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert verify_store(StorePaths(store)).ok


def test_a_burst_of_files_into_a_mount_held_to_a_shells_1024_descriptors_loses_none(tmp_path):
    # each file written and not yet committed holds two descriptors of the spool: the burst's
    # commits must not all wait for its end
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    block = os.urandom(30000)
    files = {f"f{i:03d}.bin": i.to_bytes(4, "little") + block for i in range(700)}
    with mounted(mnt, store, "--writable", open_files=1024):
        (mnt / "m").mkdir()
        for name, data in files.items():
            (mnt / "m" / name).write_bytes(data)
        assert {name: (mnt / "m" / name).read_bytes() == data for name, data in files.items()} == \
            {name: True for name in files}
    with mounted(mnt, store, "--writable"):
        assert sorted(os.listdir(mnt / "m")) == sorted(files)
        assert all((mnt / "m" / name).read_bytes() == data for name, data in files.items())
    assert verify_store(StorePaths(store)).ok


def test_files_a_program_keeps_open_hold_up_no_create_however_many_descriptors_they_hold(tmp_path):
    # 400 files of 30 KB written and kept open hold 800 of the daemon's 1,024 descriptors: no
    # commit can free them, so a create must not wait for one (as it does during a burst)
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    block = os.urandom(30000)
    with mounted(mnt, store, "--writable", open_files=1024):
        (mnt / "m").mkdir()
        fds, longest = [], 0.0
        try:
            for i in range(400):
                started = time.monotonic()
                fd = os.open(mnt / "m" / f"open{i:03d}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
                longest = max(longest, time.monotonic() - started)
                fds.append(fd)
                os.write(fd, i.to_bytes(4, "little") + block)
            started = time.monotonic()
            (mnt / "m" / "one.txt").write_bytes(b"one more")
            longest = max(longest, time.monotonic() - started)
            # a create that waited for commits would have waited until the idle commit (5 s)
            # took some of these files, or the descriptor wait (10 s) ended
            assert longest < 3.0
        finally:
            for fd in fds:
                os.close(fd)
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "one.txt").read_bytes() == b"one more"
        assert all((mnt / "m" / f"open{i:03d}.bin").read_bytes() == i.to_bytes(4, "little") + block
                   for i in range(400))
    assert verify_store(StorePaths(store)).ok
