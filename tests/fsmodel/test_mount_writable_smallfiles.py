"""Many small files through a real writable mount (issue 47): a new file's few bytes live in its
spool record alone (version 4, inline) until they outgrow it, rsync's renames of its temporary
files wait for no commit, and a kill -9 of the daemon in the middle of it all loses no file whose
close returned. Every mount is unmounted, even on failure."""
from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

from lmzfs.admin.verify import verify_store
from lmzfs.fsmodel.spoolrecord import INLINE_MAX
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted
from lmzfs.testing.spool import record_places


def _spool(store: Path) -> Path:
    return StorePaths(store).root / "spool"


def _kill(fs) -> None:
    fs.process.kill()
    fs.process.wait()


def _sizes(rng: random.Random) -> int:
    """Sizes either side of what a record holds inline, and some empty."""
    return rng.choice([0, 1, 100, INLINE_MAX - 1, INLINE_MAX, INLINE_MAX + 1, rng.randint(1, 3 * INLINE_MAX)])


def test_kill_9_while_small_files_are_created_keeps_every_file_whose_close_returned(tmp_path):
    """A writer creates small files (some renamed into place as rsync does, some chmod'ed) while
    the daemon is killed at a random moment; after a remount every file whose close (and rename)
    returned holds exactly its bytes and mode, and verify is clean. Three rounds, three kills."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    rng = random.Random(47)
    done: dict[str, tuple[bytes, int]] = {}
    for round_ in range(3):
        with mounted(mnt, store, "--writable") as fs:
            model = mnt / "m"
            if round_ == 0:
                model.mkdir()
            for rel, (data, mode) in done.items():
                assert (model / rel).read_bytes() == data, f"round {round_}: {rel}"
                assert (model / rel).stat().st_mode & 0o777 == mode, f"round {round_}: {rel}"
            plan = [(f"r{round_}-{i:04d}", os.urandom(_sizes(rng)), rng.random()) for i in range(3000)]

            def write_all() -> None:
                try:
                    for name, data, how in plan:
                        if how < 0.4:               # as rsync: a temporary name, then renamed into place
                            tmp = model / f".{name}.tmp"
                            tmp.write_bytes(data)
                            os.chmod(tmp, 0o640)
                            os.rename(tmp, model / name)
                            done[name] = (data, 0o640)
                        else:
                            (model / name).write_bytes(data)
                            done[name] = (data, 0o644)
                except OSError:
                    pass                            # the daemon is gone

            writer = threading.Thread(target=write_all)
            writer.start()
            time.sleep(rng.uniform(0.3, 1.5))
            _kill(fs)
            writer.join()
    with mounted(mnt, store, "--writable"):
        names = {n for n in os.listdir(mnt / "m") if not n.startswith(".")}
        assert set(done) <= names
        for rel, (data, mode) in done.items():
            assert (mnt / "m" / rel).read_bytes() == data, rel
            assert (mnt / "m" / rel).stat().st_mode & 0o777 == mode, rel
    assert verify_store(StorePaths(store)).ok
    assert len(done) > 100          # the kills came while files were being made, not before


def test_kill_9_during_rsync_keeps_every_file_rsync_renamed_into_place_whole(tmp_path):
    """rsync -a of a tree of small files into the mount, the daemon killed halfway: after a
    remount every file under its final name is byte-identical to its source (rsync renames a
    file into place only once it is written whole), and a second rsync completes the copy."""
    source = tmp_path / "src"
    rng = random.Random(7)
    for d in range(8):
        (source / f"d{d}").mkdir(parents=True)
        for i in range(300):
            (source / f"d{d}" / f"f{i}.txt").write_bytes(os.urandom(_sizes(rng)))
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "m").mkdir()
        rsync = subprocess.Popen(["rsync", "-a", f"{source}/", str(mnt / "m" / "copy")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(1 for _ in (mnt / "m").rglob("f*.txt")) < 600:
            time.sleep(0.05)
        _kill(fs)
        rsync.wait()
    with mounted(mnt, store, "--writable"):
        copy = mnt / "m" / "copy"
        placed = [p for p in copy.rglob("*") if p.is_file() and not p.name.startswith(".")]
        assert len(placed) >= 600
        for path in placed:
            assert path.read_bytes() == (source / path.relative_to(copy)).read_bytes(), path
        subprocess.run(["rsync", "-a", "--delete", f"{source}/", str(copy)], check=True)
        for path in source.rglob("*"):
            if path.is_file():
                assert (copy / path.relative_to(source)).read_bytes() == path.read_bytes(), path
    assert verify_store(StorePaths(store)).ok


def test_a_spool_of_the_previous_version_and_an_inline_one_replay_after_a_kill(tmp_path):
    """Two files kept open and killed with the daemon: a small one, whose record holds its bytes
    (version 4, no ID.data), and a larger one, whose record is rewritten as the previous version
    (3) wrote it; the next mount replays and commits both byte for byte."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    small, large = b"a few bytes, inline", os.urandom(INLINE_MAX * 5 + 7)
    with mounted(mnt, store, "--writable") as fs:
        (mnt / "m").mkdir()
        fds = []
        for name, data in (("small", small), ("large", large)):
            fd = os.open(mnt / "m" / name, os.O_CREAT | os.O_WRONLY)
            os.write(fd, data)
            fds.append(fd)
        _kill(fs)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    records = {}
    for place in record_places(store):
        record = place.record()
        records[record.path] = (place, record)
    assert sorted(records) == ["large", "small"]
    place, record = records["small"]
    assert record.version == 4 and record.inline == small
    assert not (_spool(store) / f"{record.spool_id}.data").exists()
    place, record = records["large"]
    assert record.inline is None and (_spool(store) / f"{record.spool_id}.data").exists()
    place.write(replace(record, version=3).to_json())
    assert "inline" not in json.loads(place.read()) and json.loads(place.read())["version"] == 3
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "small").read_bytes() == small
        assert (mnt / "m" / "large").read_bytes() == large
    assert record_places(store) == []
    assert verify_store(StorePaths(store)).ok


def test_a_small_file_outgrowing_its_record_reads_back_every_byte_written(tmp_path):
    """Writes at offsets (holes between), a truncate, and writes past what a record holds: the
    file reads back the same before and after its commit, and after a remount."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    expected = bytearray()
    with mounted(mnt, store, "--writable"):
        (mnt / "m").mkdir()
        fd = os.open(mnt / "m" / "grows", os.O_CREAT | os.O_RDWR)
        try:
            for offset, piece in ((0, b"head"), (100, b"after a hole"), (104, None), (300, None),
                                  (INLINE_MAX - 3, b"across the edge"), (5, b"inside"), (50, None), (60, b"zzz")):
                if piece is None:                   # a truncate: down, or up (zeros)
                    os.ftruncate(fd, offset)
                    expected = expected[:offset] + bytes(max(0, offset - len(expected)))
                else:
                    os.pwrite(fd, piece, offset)
                    expected[len(expected):] = bytes(max(0, offset - len(expected)))
                    expected[offset:offset + len(piece)] = piece
                assert os.pread(fd, len(expected) + 10, 0) == bytes(expected), (offset, piece)
        finally:
            os.close(fd)
        assert (mnt / "m" / "grows").read_bytes() == bytes(expected)
    with mounted(mnt, store, "--writable"):
        assert (mnt / "m" / "grows").read_bytes() == bytes(expected)
